"""The resume state of a mix: its JSON format, its checks, and merging the ranks' states.

A mixed dataset's state (format ``torch_dataloader_utils.mix``, version 1) holds:

* ``fingerprint``: every source's own fingerprint (files digest and options) and the
  mix's options (names, integer weights, ``on_exhausted``, ``source_column``,
  ``batch_size``, ``drop_last``, ``equal_batches``, ``shuffle``, ``shuffle_seed``);
* ``epoch`` of the mix and ``segment``: the pass of it (0, then one more per resume);
* ``start``: where every source stood when the pass started (a
  :class:`~torch_dataloader_utils.plan.mixposition.SourcePosition`:
  the epochs it had begun, each with the segments of the source's own resume state,
  its next whole epoch, and rows already read of the head on every lane);
* ``epoch_start``: where every source stood when the epoch's first pass started (the
  same as ``start`` in pass 0): ``len()`` of a resumed loader is that pass's batches;
* ``num_ranks`` and ``lanes`` (ranks x reading processes per rank) of the saving job;
* ``consumed``: per rank, the batches the loop received from each of its lanes in the
  pass (``{}`` at the start of a pass).

Each rank saves its own ``consumed``; :func:`merge_mixed_states` unites them (every
other field is the same on every rank). Nothing here plans or reads data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from torch_dataloader_utils.errors import ResumeStateError, StateMismatchError
from torch_dataloader_utils.plan.ledger import merged_steps, parse_steps
from torch_dataloader_utils.plan.state_kind import MIX_FORMAT, not_a_state

__all__ = [
    "MIX_STATE_FORMAT",
    "MIX_STATE_VERSION",
    "check_mix_state",
    "is_mix_state",
    "merge_mixed_states",
    "partial_mix_state",
    "saved_sources",
]

MIX_STATE_FORMAT = MIX_FORMAT
"""The ``format`` of a mixed dataset's resume state."""
MIX_STATE_VERSION = 1
"""The version of that format this library reads and writes."""
STATE_KEYS = frozenset(
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


def saved_sources(state: object) -> list[Mapping[str, Any]]:
    """The sources' own fingerprints a mix's state was saved with (``[]`` if it has none).

    Read before the state is checked, to adopt the splits the library chose for them; a
    malformed state is left to :func:`check_mix_state` to refuse.
    """
    fingerprint = state.get("fingerprint") if isinstance(state, Mapping) else None
    sources = fingerprint.get("sources") if isinstance(fingerprint, Mapping) else None
    if not isinstance(sources, list) or not all(isinstance(s, Mapping) for s in sources):
        return []
    return list(sources)


def check_mix_state(state: object, expected: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` as plain JSON, its shape checked and its fingerprint compared with ``expected``.

    Raises:
        ResumeStateError: not a state of a mix of this version, or damaged.
        StateMismatchError: saved for other sources or options (says what changed).
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
    if plain.get("version") != MIX_STATE_VERSION or set(plain) - {"steps"} != STATE_KEYS:
        raise ResumeStateError(
            f"resume state version {plain.get('version')!r} with fields {sorted(plain)} is not a version "
            f"{MIX_STATE_VERSION} state of a mix; resume with the library version that saved it"
        )
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
    ):
        raise ResumeStateError(
            "resume state fields state.start / state.epoch_start / state.consumed are damaged"
        )
    if not isinstance(plain["fingerprint"], dict):
        raise ResumeStateError("resume state field state.fingerprint is damaged")
    _compare(plain["fingerprint"], expected)
    if len(plain["start"]) != len(expected["sources"]) or len(plain["epoch_start"]) != len(
        expected["sources"]
    ):
        raise ResumeStateError(
            "resume state fields state.start and state.epoch_start must hold one position per source"
        )
    return dict(plain)


def _compare(saved: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    changes = []
    for key in sorted(set(saved) | set(expected)):
        if key != "sources" and saved.get(key) != expected.get(key):
            changes.append(f"{key}: {saved.get(key)!r} in the state, {expected.get(key)!r} now")
    old, new = saved.get("sources"), expected["sources"]
    if not isinstance(old, list) or len(old) != len(new):
        shown = len(old) if isinstance(old, list) else old
        changes.append(f"sources: {shown!r} in the state, {len(new)} now")
    else:
        names = expected.get("names") or [str(i) for i in range(len(new))]
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            if a != b:
                what = (
                    sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)) if isinstance(a, dict) else []
                )
                changes.append(f"source {i} ({names[i]!r}): {', '.join(what) or 'its fingerprint'} changed")
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
    consumed: dict[str, Any] = {}
    steps = merged_steps([parse_steps(s.get("steps"), "state.steps") for s in states])
    for state in states:
        if not is_mix_state(state):
            raise ResumeStateError("cannot merge the state of a mix with a state of another kind")
        for key in sorted(STATE_KEYS - {"consumed"}):
            if state.get(key) != first.get(key):
                raise ResumeStateError(
                    f"cannot merge states with different {key}; merge the states every rank saved at the "
                    "same step"
                )
        given = state.get("consumed")
        if not isinstance(given, Mapping):
            raise ResumeStateError("resume state field state.consumed is damaged")
        for rank, counts in given.items():
            if rank in consumed and consumed[rank] != counts:
                raise ResumeStateError(f"rank {rank} appears twice, with different batch counts")
            consumed[rank] = counts
    merged = {**dict(first), "consumed": consumed}
    if steps is not None:
        merged["steps"] = {str(rank): n for rank, n in sorted(steps.items())}
    return merged
