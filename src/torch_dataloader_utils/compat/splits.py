"""What a 0.2.0 split strategy returns: ``Split`` (a file, or rows of it) grouped in ``Shard``.

:func:`chunks_of` turns them into chunks for the planner (registered in
:data:`torch_dataloader_utils.plan.splits.ITEM_ADAPTERS`). They are recognized by their
attributes, so objects of a user's own 0.2.0-style classes work too: anything with
``splits`` is a shard, anything with ``file.path`` and ``row_range`` (file row positions
``offset`` / ``length``; ``None``: the whole file) a split. The worker a shard named is
not kept: the planner assigns chunks to workers itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch_dataloader_utils.compat.files import DataFileInfo
from torch_dataloader_utils.errors import PlanError
from torch_dataloader_utils.plan.splits import ITEM_ADAPTERS, FileSplit
from torch_dataloader_utils.plan.types import Chunk, FileInfo

__all__ = ["RowRange", "Shard", "Split", "chunks_of"]


def chunks_of(item: object, files: Mapping[str, FileInfo], name: str) -> list[Chunk] | None:
    """The chunks of a 0.2.0 ``Shard`` or ``Split`` (``None`` for anything else).

    Raises:
        PlanError: a split of a file that is not the dataset's, or a row range of a file
            whose row count is unknown.
    """
    splits = getattr(item, "splits", None)
    if isinstance(splits, (list, tuple)):
        return [c for split in splits for c in (chunks_of(split, files, name) or [])]
    if not (hasattr(item, "file") and hasattr(item, "row_range")):
        return None
    path = getattr(getattr(item, "file", None), "path", None)
    f = files.get(path) if isinstance(path, str) else None
    if f is None:
        raise PlanError(
            f"split strategy {name!r} returned a Split of {path!r}, which is not one of the dataset's files"
        )
    rr = getattr(item, "row_range", None)
    if rr is None:
        return FileSplit().split([f])
    if f.num_rows is None:
        raise PlanError(
            f"split strategy {name!r} returned a Split with row_range={rr!r} of {path!r}, whose row "
            "count is unknown (a text format): return the whole file (row_range=None) instead"
        )
    offset, length = int(rr.offset), int(rr.length)
    return [Chunk.rows(f, offset, offset + length)] if length > 0 else []


ITEM_ADAPTERS.append(chunks_of)


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
