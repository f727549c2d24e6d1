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

__all__ = ["MixState", "Segments", "SourcePosition", "position_of"]

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
class MixState:
    """The resume state of a mix, parsed (format ``torch_dataloader_utils.mix``, version 1).

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
    """

    fingerprint: Mapping[str, Any]
    epoch: int
    segment: int
    start: tuple[SourcePosition, ...]
    epoch_start: tuple[SourcePosition, ...]
    num_ranks: int
    lanes: int
    consumed: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: object, expected: Mapping[str, Any]) -> MixState:
        """``value`` (JSON values) checked and parsed; its fingerprint compared with ``expected``.

        Raises:
            ResumeStateError: not a state of a mix of this version, or damaged.
            StateMismatchError: saved for other sources or options (says what changed).
        """
        plain = check_mix_state(value, expected)
        consumed: dict[int, tuple[int, ...]] = {}
        for rank, counts in plain["consumed"].items():
            if not (isinstance(rank, str) and rank.isdigit()) or not isinstance(counts, list):
                raise ResumeStateError(
                    f"the mix's resume state gives rank {rank!r} the batch counts {str(counts)[:60]}; "
                    "pass what loader.state_dict() returned"
                )
            consumed[int(rank)] = tuple(counts)
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
            "num_ranks": self.num_ranks,
            "lanes": self.lanes,
            "consumed": {str(r): list(c) for r, c in sorted(self.consumed.items())},
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
