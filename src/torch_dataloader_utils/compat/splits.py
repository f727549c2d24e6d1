"""What a 0.2.0 split strategy returns: ``Split`` (a file, or rows of it) grouped in ``Shard``.

The planner (:mod:`torch_dataloader_utils.plan.splits`) recognizes these by their
attributes and turns each ``Split`` into a chunk, so they are plain records here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_dataloader_utils.compat.files import DataFileInfo

__all__ = ["RowRange", "Shard", "Split"]


@dataclass
class RowRange:
    """Rows ``[offset, offset + length)`` of a file (file row positions)."""

    offset: int
    length: int


@dataclass
class Split:
    """One unit of work: a whole file (``row_range=None``) or a row range of it."""

    file: DataFileInfo
    row_range: RowRange | None = None


@dataclass
class Shard:
    """A group of splits (0.2.0: one worker's). The planner keeps the splits, not the grouping."""

    id: int
    splits: list[Split] = field(default_factory=list)
    row_count: int | None = None
    size_bytes: int | None = None
