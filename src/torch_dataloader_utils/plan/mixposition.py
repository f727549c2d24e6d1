"""Where each source of a mix stands, and the mix's resume state as a value.

A :class:`SourcePosition` is where a source stands on every lane: its begun epochs (as
the source's own resume-state segments, :class:`~torch_dataloader_utils.plan.state.Segment`,
so the rest of an interrupted epoch can be re-dealt over any number of lanes), then
whole ones. It is the same on every lane of a mix. :class:`MixState` is a mix's resume
state parsed once from its JSON (:mod:`.mixstate`) into such values; nothing else reads
the JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch_dataloader_utils.errors import ResumeStateError
from torch_dataloader_utils.plan.mixstate import MIX_STATE_FORMAT, MIX_STATE_VERSION, check_mix_state
from torch_dataloader_utils.plan.state import Segment

__all__ = ["MixState", "Removed", "SchedulePoint", "Segments", "SourcePosition", "position_of"]

Segments = tuple[Segment, ...]
"""The segments of a source's own resume state for one of its epochs (``()``: the whole epoch)."""


@dataclass(frozen=True)
class SourcePosition:
    """Where one source stands on its lanes (the same on every lane).

    Attributes:
        entries: Epochs of the source begun and not finished, in order: ``(epoch,
            segments)``, the segments of the source's own resume state saying what
            every lane of each interrupted pass consumed.
        next_epoch: The first epoch after them, read whole (and every one after it).
        skip: Rows of the stream's head (the first entry, or ``next_epoch``) already
            read on every lane.
    """

    entries: tuple[tuple[int, Segments], ...] = ()
    next_epoch: int = 0
    skip: int = 0

    def head(self) -> tuple[int, Segments]:
        """The epoch (and its segments) the stream reads first."""
        return self.entries[0] if self.entries else (self.next_epoch, ())

    def as_json(self) -> dict[str, Any]:
        """Plain JSON values."""
        return {
            "entries": [{"epoch": e, "segments": [g.to_json() for g in s]} for e, s in self.entries],
            "next_epoch": self.next_epoch,
            "skip": self.skip,
        }


def position_of(value: object, where: str) -> SourcePosition:
    """A :class:`SourcePosition` from a state's JSON (segments parsed; checked against the source later).

    Raises:
        ResumeStateError: not a position.
    """
    fail = ResumeStateError(
        f"resume state field {where} is not a source position ({{'entries': [...], 'next_epoch': int, "
        "'skip': int}}); pass what loader.state_dict() returned, unchanged"
    )
    if not isinstance(value, Mapping) or set(value) != {"entries", "next_epoch", "skip"}:
        raise fail
    entries = value["entries"]
    if not isinstance(entries, list) or not all(
        isinstance(e, Mapping) and set(e) == {"epoch", "segments"} and isinstance(e["segments"], list)
        for e in entries
    ):
        raise fail
    ints = [value["next_epoch"], value["skip"], *(e["epoch"] for e in entries)]
    if not all(type(i) is int and i >= 0 for i in ints):
        raise fail
    return SourcePosition(
        tuple(
            (
                int(e["epoch"]),
                tuple(
                    Segment.parse(g, f"{where}.entries[{i}].segments[{j}]")
                    for j, g in enumerate(e["segments"])
                ),
            )
            for i, e in enumerate(entries)
        ),
        int(value["next_epoch"]),
        int(value["skip"]),
    )


@dataclass(frozen=True)
class SchedulePoint:
    """Where a pass (or an epoch) started in the weights' schedule.

    Attributes:
        step: Batches every rank had received since the start of training.
        rows: Rows every rank together had taken from the sources since then.
        stage: The schedule's stage in force there (``None`` where not recorded).
        weights: That stage's integer weights (``None`` where not recorded).
    """

    step: int = 0
    rows: int = 0
    stage: int | None = None
    weights: tuple[int, ...] | None = None

    def as_json(self) -> dict[str, Any]:
        """Plain JSON values (``stage`` and ``weights`` only where recorded)."""
        out: dict[str, Any] = {"step": self.step, "rows": self.rows}
        if self.stage is not None and self.weights is not None:
            out.update(stage=self.stage, weights=list(self.weights))
        return out

    @classmethod
    def parse(cls, value: object, where: str, staged: bool) -> SchedulePoint:
        """From a state's JSON (``staged``: with ``stage`` and ``weights``).

        Raises:
            ResumeStateError: not such a point.
        """
        keys = {"step", "rows", "stage", "weights"} if staged else {"step", "rows"}
        if not isinstance(value, Mapping) or set(value) != keys:
            raise ResumeStateError(
                f"resume state field {where} is not a schedule point ({sorted(keys)}); pass what "
                "loader.state_dict() returned, unchanged"
            )
        ints = [value[k] for k in ("step", "rows", "stage") if k in value]
        weights = value.get("weights", [1])
        if (
            not all(type(i) is int and i >= 0 for i in ints)
            or not isinstance(weights, list)
            or not weights
            or not all(type(w) is int and w >= 1 for w in weights)
        ):
            raise ResumeStateError(f"resume state field {where}={str(dict(value))[:80]} is damaged")
        if not staged:
            return cls(int(value["step"]), int(value["rows"]))
        return cls(int(value["step"]), int(value["rows"]), int(value["stage"]), tuple(weights))


@dataclass(frozen=True)
class Removed:
    """A source a recipe change left out, kept so that adding it back resumes it.

    Attributes:
        fingerprint: The source's own fingerprint (it must match when it comes back).
        position: Where it stood when the pass that removed it started.
        lanes: Lanes of the job that read that pass.
        rows: Rows every such lane had read of it since (one per lane).
    """

    fingerprint: Mapping[str, Any]
    position: SourcePosition
    lanes: int
    rows: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        """Plain JSON values: ``rows`` as runs ``[rows, lanes]``."""
        runs: list[list[int]] = []
        for n in self.rows:
            if runs and runs[-1][0] == n:
                runs[-1][1] += 1
            else:
                runs.append([n, 1])
        return {
            "fingerprint": dict(self.fingerprint),
            "position": self.position.as_json(),
            "lanes": self.lanes,
            "rows": runs,
        }

    @classmethod
    def parse(cls, value: object, where: str) -> Removed:
        """From a state's JSON.

        Raises:
            ResumeStateError: not a removed source's entry.
        """
        fail = ResumeStateError(
            f"resume state field {where} is not a removed source ({{'fingerprint', 'position', 'lanes', "
            "'rows'}}); pass what loader.state_dict() returned, unchanged"
        )
        if not isinstance(value, Mapping) or set(value) != {"fingerprint", "position", "lanes", "rows"}:
            raise fail
        lanes, runs = value["lanes"], value["rows"]
        if (
            not isinstance(value["fingerprint"], Mapping)
            or type(lanes) is not int
            or not isinstance(runs, list)
        ):
            raise fail
        rows: list[int] = []
        for run in runs:
            if not (isinstance(run, list) and len(run) == 2 and all(type(i) is int and i >= 0 for i in run)):
                raise fail
            rows += [run[0]] * run[1]
        if lanes < 1 or len(rows) != lanes:
            raise fail
        position = position_of(value["position"], f"{where}.position")
        return cls(dict(value["fingerprint"]), position, lanes, tuple(rows))


@dataclass(frozen=True)
class MixState:
    """The resume state of a mix, parsed (format ``torch_dataloader_utils.mix``, version 2; 1 is read).

    See :mod:`~torch_dataloader_utils.plan.mixstate` for its JSON. Every source's
    position is a :class:`SourcePosition` in *its own* epochs, so what each source read
    is known whatever the weights (a recipe changed at a checkpoint keeps it).

    Attributes:
        fingerprint: What it was saved for: every source's fingerprint and the mix's
            options (JSON values, compared as a whole).
        epoch: The epoch of the mix.
        segment: The pass of that epoch (0, then one more per resume in another world).
        start: Where every source stood when the pass started.
        epoch_start: Where every source stood when the epoch's first pass started.
        num_ranks: Ranks of the saving job.
        lanes: Lanes of the saving job (ranks x reading processes per rank).
        consumed: Per rank, the batches the loop received from each of its lanes in the
            pass (empty at the start of a pass).
        at: Where the pass started in the schedule (``None``: a version 1 state).
        epoch_at: Where the epoch's first pass started (``None``: a version 1 state).
        anchor: The name of the source whose epoch ends the mix's (``None``: version 1).
        batches: Batches of every lane in the pass (``None``: version 1).
        taken: For every batch count in ``consumed``, the rows of every source a lane's
            first batches of that count hold.
        removed: Sources a recipe change left out, by name.
    """

    fingerprint: Mapping[str, Any]
    epoch: int
    segment: int
    start: tuple[SourcePosition, ...]
    epoch_start: tuple[SourcePosition, ...]
    num_ranks: int
    lanes: int
    consumed: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    at: SchedulePoint | None = None
    epoch_at: SchedulePoint | None = None
    anchor: str | None = None
    batches: int | None = None
    taken: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    removed: Mapping[str, Removed] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the sources it was saved with, in order."""
        return tuple(str(n) for n in self.fingerprint.get("names") or ())

    @classmethod
    def parse(cls, value: object, expected: Mapping[str, Any], allow_change: bool = False) -> MixState:
        """``value`` (JSON values) checked and parsed; its fingerprint compared with ``expected``.

        Args:
            value: The state.
            expected: The fingerprint of the mix loading it.
            allow_change: Sources matched by name may be added, removed or added back,
                and the weights may differ (``allow_recipe_change``).

        Raises:
            ResumeStateError: not a state of a mix of a version read here, or damaged.
            StateMismatchError: saved for other sources or options (says what changed).
        """
        plain = check_mix_state(value, expected, allow_change)
        consumed = _per_rank(plain["consumed"], "consumed")
        taken = _per_rank(plain["taken"], "taken")
        width = len(plain["start"])
        if not all(len(t) == width and all(type(n) is int and n >= 0 for n in t) for t in taken.values()):
            raise ResumeStateError(
                f"the mix's resume state field state.taken is damaged (a count of rows per source, {width} "
                "sources); pass what loader.state_dict() returned"
            )
        v2 = plain["version"] == 2
        return cls(
            fingerprint=plain["fingerprint"],
            epoch=plain["epoch"],
            segment=plain["segment"],
            start=tuple(position_of(p, f"state.start[{s}]") for s, p in enumerate(plain["start"])),
            epoch_start=tuple(
                position_of(p, f"state.epoch_start[{s}]") for s, p in enumerate(plain["epoch_start"])
            ),
            num_ranks=plain["num_ranks"],
            lanes=plain["lanes"],
            consumed=consumed,
            at=SchedulePoint.parse(plain["at"], "state.at", True) if v2 else None,
            epoch_at=SchedulePoint.parse(plain["epoch_at"], "state.epoch_at", False) if v2 else None,
            anchor=plain["anchor"],
            batches=plain["batches"],
            taken=taken,
            removed={
                str(name): Removed.parse(entry, f"state.removed[{name!r}]")
                for name, entry in plain["removed"].items()
            },
        )

    def to_json(self) -> dict[str, Any]:
        """The state as JSON values (what a mixed loader's ``state_dict()`` returns)."""
        return {
            "format": MIX_STATE_FORMAT,
            "version": MIX_STATE_VERSION,
            "fingerprint": dict(self.fingerprint),
            "epoch": self.epoch,
            "segment": self.segment,
            "start": [p.as_json() for p in self.start],
            "epoch_start": [p.as_json() for p in self.epoch_start],
            "at": None if self.at is None else self.at.as_json(),
            "epoch_at": None if self.epoch_at is None else self.epoch_at.as_json(),
            "anchor": self.anchor,
            "num_ranks": self.num_ranks,
            "lanes": self.lanes,
            "batches": self.batches,
            "consumed": {str(r): list(c) for r, c in sorted(self.consumed.items())},
            "taken": {str(n): list(t) for n, t in sorted(self.taken.items())},
            "removed": {name: r.as_json() for name, r in sorted(self.removed.items())},
        }

    def source_fingerprints(self) -> tuple[Mapping[str, Any], ...]:
        """Every source's own fingerprint (what its split was chosen with)."""
        sources = self.fingerprint.get("sources")
        return tuple(s for s in sources if isinstance(s, Mapping)) if isinstance(sources, list) else ()

    def received(self, batches: int) -> list[int]:
        """Batches received from every saved lane, rank after rank (each at most ``batches``).

        Raises:
            ResumeStateError: a rank is missing, or a rank's counts are not one per lane.
        """
        ranks = sorted(self.consumed)
        if ranks != list(range(self.num_ranks)):
            missing = sorted(set(range(self.num_ranks)) - set(ranks))
            raise ResumeStateError(
                f"the mix's resume state holds ranks {[str(r) for r in ranks][:20]} of a "
                f"{self.num_ranks}-rank job (missing {missing[:20]}); merge the states of all ranks "
                "first (merge_states, or gather_state)"
            )
        per_rank = self.lanes // self.num_ranks
        out: list[int] = []
        for rank in ranks:
            counts = self.consumed[rank]
            if len(counts) != per_rank or not all(type(n) is int and 0 <= n <= batches for n in counts):
                raise ResumeStateError(
                    f"the mix's resume state gives rank {rank} the batch counts {str(list(counts))[:60]}: "
                    f"expected {per_rank} counts from 0 to {batches}; pass what loader.state_dict() returned"
                )
            out.extend(counts)
        return out


def _per_rank(value: Mapping[str, Any], key: str) -> dict[int, tuple[int, ...]]:
    """A state's ``consumed`` or ``taken``: ``{"<int>": [ints]}`` as ``{int: (ints)}``."""
    out: dict[int, tuple[int, ...]] = {}
    for entry, counts in value.items():
        if not (isinstance(entry, str) and entry.isdigit()) or not isinstance(counts, list):
            raise ResumeStateError(
                f"the mix's resume state field state.{key} gives {entry!r} the counts {str(counts)[:60]}; "
                "pass what loader.state_dict() returned"
            )
        out[int(entry)] = tuple(counts)
    return out
