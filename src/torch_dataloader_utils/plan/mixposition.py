"""Where each source of a mix stands: its begun epochs (as its own resume segments), then whole ones.

A :class:`SourcePosition` is the same on every lane of a mix; the segments are the
source's own resume-state segments (:class:`~torch_dataloader_utils.plan.state.Segment`),
so the rest of an interrupted epoch can be re-dealt over any number of lanes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch_dataloader_utils.errors import ResumeStateError
from torch_dataloader_utils.plan.state import Segment

__all__ = ["Segments", "SourcePosition", "position_of"]

Segments = tuple[Segment, ...]
"""The segments of a source's own resume state for one of its epochs (``()``: the whole epoch)."""


@dataclass(frozen=True)
class SourcePosition:
    """Where one source's lane streams stand (the same on every lane).

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
