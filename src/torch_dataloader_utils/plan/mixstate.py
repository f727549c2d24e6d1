"""The resume state of a mix: its JSON format, its checks, and merging the ranks' states.

A mixed dataset's state (format ``torch_dataloader_utils.mix``, version 2) holds:

* ``fingerprint``: every source's own fingerprint (files digest and options) and the
  mix's options (names, weights or schedule, ``on_exhausted``, ``source_column``,
  ``batch_size``, ``drop_last``, ``equal_batches``, ``shuffle``, ``shuffle_seed``);
* ``epoch`` of the mix and ``segment``: the pass of it (0, then one more per resume);
* ``start``: where every source stood when the pass started (a
  :class:`~torch_dataloader_utils.plan.mixposition.SourcePosition`:
  the epochs it had begun, each with the segments of the source's own resume state,
  its next whole epoch, and rows already read of the head on every lane);
* ``epoch_start``: where every source stood when the epoch's first pass started (the
  same as ``start`` in pass 0): ``len()`` of a resumed loader is that pass's batches;
* ``at``: where the pass started in the weights' schedule: the ``step`` (a rank's batches
  since the start of training), the ``rows`` (every rank's, together), and the ``stage``
  in force there with its integer ``weights``; ``epoch_at``: the step and rows where the
  epoch's first pass started;
* ``anchor``: the source whose epoch ends the mix's epoch (chosen when the epoch starts);
* ``num_ranks`` and ``lanes`` (ranks x reading processes per rank) of the saving job;
* ``batches``: batches of every lane in the pass;
* ``consumed``: per rank, the batches the loop received from each of its lanes in the
  pass (``{}`` at the start of a pass); ``taken``: for every such count ``n``, the rows of
  every source a lane's first ``n`` batches hold (so what every lane read is known
  without the weights it was read with: a recipe changed at a checkpoint needs it);
* ``removed``: sources a recipe change left out, by name: their fingerprint, where they
  stood (a position, the lanes of the job that read them, and the rows every lane had
  read since, as runs ``[rows, lanes]``), so adding one back resumes it.

Each rank saves its own ``consumed`` and ``taken``; :func:`merge_mixed_states` unites
them (every other field is the same on every rank). Version 1 states (0.7.0) are read
too: the step and rows count from them. Nothing here plans or reads data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch_dataloader_utils.errors import ResumeStateError, StateMismatchError
from torch_dataloader_utils.plan.ledger import merged_steps, parse_steps
from torch_dataloader_utils.plan.state_kind import MIX_FORMAT, not_a_state

__all__ = [
    "MIX_STATE_FORMAT",
    "MIX_STATE_VERSION",
    "RECIPE_OPT_IN",
    "RecipeChange",
    "check_mix_state",
    "is_mix_state",
    "merge_mixed_states",
    "partial_mix_state",
    "recipe_change",
    "saved_sources",
]

MIX_STATE_FORMAT = MIX_FORMAT
"""The ``format`` of a mixed dataset's resume state."""
MIX_STATE_VERSION = 2
"""The version of that format this library writes (it reads 1 and 2)."""
RECIPE_OPT_IN = "allow_recipe_change=True"
"""The keyword of ``create_mixed_dataloader`` that lets a state of another recipe load."""
V1_KEYS = frozenset(
    {
        "format",
        "version",
        "fingerprint",
        "epoch",
        "segment",
        "start",
        "epoch_start",
        "num_ranks",
        "lanes",
        "consumed",
    }
)
STATE_KEYS = V1_KEYS | {"at", "epoch_at", "anchor", "batches", "taken", "removed"}
RECIPE_KEYS = frozenset({"sources", "names", "weights"})
"""Fingerprint keys of the recipe: what ``allow_recipe_change`` lets differ."""
PER_RANK = frozenset({"consumed", "taken"})
"""Fields every rank saves its own of (merged by union)."""


def is_mix_state(state: object) -> bool:
    """Whether ``state`` claims to be the resume state of a mix."""
    return isinstance(state, Mapping) and state.get("format") == MIX_STATE_FORMAT


def partial_mix_state(state: object) -> bool:
    """Whether ``state`` is one rank's (or some ranks') state of a mix in the middle of a pass."""
    if not is_mix_state(state):
        return False
    assert isinstance(state, Mapping)
    consumed, ranks = state.get("consumed"), state.get("num_ranks")
    return isinstance(consumed, Mapping) and bool(consumed) and type(ranks) is int and len(consumed) < ranks


def saved_sources(state: object) -> dict[str, Mapping[str, Any]]:
    """The sources' own fingerprints a mix's state was saved with, by name (removed ones too).

    Read before the state is checked, to adopt the splits the library chose for them; a
    malformed state gives ``{}`` and is left to :func:`check_mix_state` to refuse.
    """
    fingerprint = state.get("fingerprint") if isinstance(state, Mapping) else None
    sources = fingerprint.get("sources") if isinstance(fingerprint, Mapping) else None
    names = fingerprint.get("names") if isinstance(fingerprint, Mapping) else None
    if (
        not isinstance(sources, list)
        or not isinstance(names, list)
        or len(names) != len(sources)
        or not all(isinstance(s, Mapping) for s in sources)
    ):
        return {}
    out: dict[str, Mapping[str, Any]] = {}
    removed = state.get("removed") if isinstance(state, Mapping) else None
    if isinstance(removed, Mapping):
        for name, entry in removed.items():
            own = entry.get("fingerprint") if isinstance(entry, Mapping) else None
            if isinstance(name, str) and isinstance(own, Mapping):
                out[name] = own
    out.update({str(n): s for n, s in zip(names, sources, strict=True)})
    return out


def check_mix_state(state: object, expected: Mapping[str, Any], allow_change: bool = False) -> dict[str, Any]:
    """``state`` as plain JSON of version 2, its shape checked and its fingerprint compared with ``expected``.

    A version 1 state is given the fields it lacks as ``None`` (``at``, ``epoch_at``,
    ``anchor``, ``batches``), ``{}`` (``taken``, ``removed``).

    Raises:
        ResumeStateError: not a state of a mix of a version this library reads, or damaged.
        StateMismatchError: saved for other sources or options (says what changed, and
            names ``allow_recipe_change`` where only the recipe did).
    """
    try:
        plain = json.loads(json.dumps(state))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResumeStateError(
            f"a resume state holds only JSON values; this one does not ({type(exc).__name__}: {exc}); "
            "pass what loader.state_dict() returned"
        ) from exc
    if not is_mix_state(plain):
        raise not_a_state(plain, MIX_STATE_FORMAT)
    parse_steps(plain.get("steps"), "state.steps")  # optional: the training ledger's step count
    version = plain.get("version")
    keys = {1: V1_KEYS, 2: STATE_KEYS}.get(version) if type(version) is int else None
    if keys is None or set(plain) - {"steps"} != keys:
        raise ResumeStateError(
            f"resume state version {version!r} with fields {sorted(plain)} is not a version 1 or "
            f"{MIX_STATE_VERSION} state of a mix; resume with the library version that saved it"
        )
    if version == 1:
        plain.update(at=None, epoch_at=None, anchor=None, batches=None, taken={}, removed={})
    _check_counts(plain)
    if not isinstance(plain["fingerprint"], dict):
        raise ResumeStateError("resume state field state.fingerprint is damaged")
    names = plain["fingerprint"].get("names")
    if (
        not isinstance(names, list)
        or len(plain["start"]) != len(names)
        or len(plain["epoch_start"]) != len(names)
    ):
        raise ResumeStateError(
            "resume state fields state.start and state.epoch_start must hold one position per source of "
            "state.fingerprint.names"
        )
    _compare(plain["fingerprint"], expected, allow_change, plain["removed"])
    return dict(plain)


def _check_counts(plain: dict[str, Any]) -> None:
    for key in ("epoch", "segment", "num_ranks", "lanes"):
        value = plain[key]
        if type(value) is not int or value < (1 if key in ("num_ranks", "lanes") else 0):
            raise ResumeStateError(f"resume state field state.{key}={value!r} is not a valid count")
    if plain["lanes"] % plain["num_ranks"]:
        raise ResumeStateError(
            f"resume state fields state.lanes={plain['lanes']} and state.num_ranks={plain['num_ranks']} "
            "disagree (lanes are ranks x reading processes); pass what loader.state_dict() returned"
        )
    if (
        not isinstance(plain["start"], list)
        or not isinstance(plain["epoch_start"], list)
        or not isinstance(plain["consumed"], dict)
        or not isinstance(plain["taken"], dict)
        or not isinstance(plain["removed"], dict)
    ):
        raise ResumeStateError(
            "resume state fields state.start / state.epoch_start / state.consumed / state.taken / "
            "state.removed are damaged"
        )
    batches = plain["batches"]
    if batches is not None and (type(batches) is not int or batches < 0):
        raise ResumeStateError(f"resume state field state.batches={batches!r} is not a valid count")
    anchor = plain["anchor"]
    if anchor is not None and not isinstance(anchor, str):
        raise ResumeStateError(f"resume state field state.anchor={anchor!r} is not a source's name")


@dataclass(frozen=True)
class RecipeChange:
    """How a mix's recipe differs from the one a state was saved with (sources matched by name).

    Attributes:
        added: Sources now that the state's mix did not have (nor had removed).
        restored: Sources the state holds as removed, now back.
        removed: Sources of the state's mix that are left out now.
        weights: The weights (or schedule) differ.
        order: The same sources in another order.
    """

    added: tuple[str, ...] = ()
    restored: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    weights: bool = False
    order: bool = False

    def __bool__(self) -> bool:
        return bool(self.added or self.restored or self.removed or self.weights or self.order)

    def describe(self) -> str:
        """The change in words."""
        parts = []
        if self.weights:
            parts.append("other weights")
        for what, names in (("added", self.added), ("added back", self.restored), ("removed", self.removed)):
            if names:
                parts.append(f"{what} {list(names)}")
        if self.order:
            parts.append("the sources in another order")
        return ", ".join(parts)


def recipe_change(
    saved: Mapping[str, Any], expected: Mapping[str, Any], removed: Sequence[str] = ()
) -> RecipeChange:
    """The recipe change from a state's fingerprint ``saved`` to ``expected``.

    ``removed``: the names of the sources the state holds as removed.
    """
    old = [str(n) for n in saved.get("names") or []]
    new = [str(n) for n in expected.get("names") or []]
    return RecipeChange(
        added=tuple(n for n in new if n not in old and n not in removed),
        restored=tuple(n for n in new if n not in old and n in removed),
        removed=tuple(n for n in old if n not in new),
        weights=saved.get("weights") != expected.get("weights"),
        order=set(old) == set(new) and old != new,
    )


def _compare(
    saved: Mapping[str, Any], expected: Mapping[str, Any], allow_change: bool, removed: Mapping[str, Any]
) -> None:
    changes = [
        f"{key}: {saved.get(key)!r} in the state, {expected.get(key)!r} now"
        for key in sorted((set(saved) | set(expected)) - RECIPE_KEYS)
        if saved.get(key) != expected.get(key)
    ]
    old_sources, new_sources = saved.get("sources"), expected["sources"]
    old_names = saved.get("names")
    if (
        not isinstance(old_sources, list)
        or not isinstance(old_names, list)
        or len(old_names) != len(old_sources)
    ):
        raise ResumeStateError("resume state field state.fingerprint.sources (or names) is damaged")
    before = {name: entry.get("fingerprint") for name, entry in removed.items() if isinstance(entry, Mapping)}
    before.update(zip((str(n) for n in old_names), old_sources, strict=True))
    for name, own in zip(expected["names"], new_sources, strict=True):
        was = before.get(name)
        if was is not None and was != own:
            what = (
                sorted(k for k in set(was) | set(own) if was.get(k) != own.get(k))
                if isinstance(was, dict)
                else []
            )
            changes.append(
                f"source {name!r}: {', '.join(what) or 'its fingerprint'} changed (a source whose data or "
                "options changed is a new source: give it a new name, and it starts its first epoch)"
            )
    change = recipe_change(saved, expected, tuple(removed))
    if change and not allow_change:
        changes.append(
            f"the recipe: {change.describe()} (to go on with the new recipe, every source where it stood, "
            f"pass {RECIPE_OPT_IN} to create_mixed_dataloader)"
        )
    if changes:
        raise StateMismatchError(
            "the resume state was saved for other sources or options: "
            + "; ".join(changes)
            + ". Resume with the same sources and options, or start afresh without the state"
        )


def merge_mixed_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Combine the states every rank of a mixed loader saved at the same step.

    Raises:
        ResumeStateError: the states disagree (sources, epoch, start) or a rank appears twice.
    """
    if not states:
        raise ResumeStateError("merge_states needs at least one state")
    first = states[0]
    merged: dict[str, dict[str, Any]] = {key: {} for key in PER_RANK if key in first}
    steps = merged_steps([parse_steps(s.get("steps"), "state.steps") for s in states])
    for state in states:
        if not is_mix_state(state):
            raise ResumeStateError("cannot merge the state of a mix with a state of another kind")
        for key in sorted((set(first) | set(state)) - PER_RANK - {"steps"}):  # steps: merged below
            if state.get(key) != first.get(key):
                raise ResumeStateError(
                    f"cannot merge states with different {key}; merge the states every rank saved at the "
                    "same step"
                )
        for key, into in merged.items():
            given = state.get(key)
            if not isinstance(given, Mapping):
                raise ResumeStateError(f"resume state field state.{key} is damaged")
            for entry, value in given.items():
                if entry in into and into[entry] != value:
                    what = "rank" if key == "consumed" else "batch count"
                    raise ResumeStateError(f"{key}: {what} {entry} appears twice, with different values")
                into[entry] = value
    out: dict[str, Any] = {**dict(first), **merged}
    if steps is not None:
        out["steps"] = {str(rank): n for rank, n in sorted(steps.items())}
    return out
