"""0.2.0's built-in strategies, as this library's splitters.

Each is a splitter the planner calls directly (``name`` and ``split``): it cuts files
with one of :mod:`torch_dataloader_utils.plan.splits`' splitters, and with
``shuffle=True`` reorders the chunks by ``(seed, epoch)``. The planner then deals the
chunks to ranks and workers (exactly once, balanced by rows), as for any strategy.
``generate(files, num_workers, epoch, num_ranks, rank)`` gives 0.2.0's view of the
same chunks (one :class:`Shard` of :class:`Split` per worker) for code that calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch_dataloader_utils.compat.files import DataFileInfo
from torch_dataloader_utils.compat.splits import RowRange, Shard, Split
from torch_dataloader_utils.config import check_bool, check_int, parse_size
from torch_dataloader_utils.plan.assign import assign
from torch_dataloader_utils.plan.shuffle import shuffled
from torch_dataloader_utils.plan.splits import FileSplit, RowGroupSplit, Splitter
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo, World

__all__ = ["RoundRobinSplitStrategy", "SizeBalancedSplitStrategy", "TargetSizeSplitStrategy"]

_DEFAULT_TARGET_BYTES = 128 * 1024**2


class _Adapted:
    """A 0.2.0 strategy: a splitter of this library plus 0.2.0's ``shuffle`` / ``seed``."""

    name = "compat"

    def __init__(self, splitter: Splitter, shuffle: bool, seed: int) -> None:
        self._splitter = splitter
        self.shuffle = check_bool(shuffle, "shuffle")
        check_int(seed, "seed", 0)
        self.seed = seed

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._splitter!r}, shuffle={self.shuffle}, seed={self.seed})"

    def split(self, files: Sequence[FileInfo], *, num_workers: int = 1, epoch: int = 0) -> list[Chunk]:
        """Every chunk of the dataset, reordered by ``(seed, epoch)`` when ``shuffle``."""
        chunks = self._splitter.split(files, num_workers=num_workers, epoch=epoch)
        return shuffled(chunks, self.seed, epoch) if self.shuffle else chunks

    def generate(
        self, files: Sequence[Any], num_workers: int, epoch: int = 0, num_ranks: int = 1, rank: int = 0
    ) -> list[Shard]:
        """0.2.0's view: this rank's chunks ``[rank::num_ranks]`` as one ``Shard`` per worker.

        ``files`` are this library's ``FileInfo`` (``dataset.files``) or 0.2.0's
        ``DataFileInfo``; the latter carry no row groups, so each is one whole-file split.
        """
        World(num_ranks, rank)  # checks the pair
        check_int(num_workers, "num_workers", 1)
        infos = [f for f in files if isinstance(f, FileInfo)]
        chunks = self.split(infos, num_workers=num_workers, epoch=epoch)
        units: list[Split] = [_as_split(c, f) for c, f in _with_files(chunks, infos)]
        units += [Split(file=f) for f in files if not isinstance(f, FileInfo)]
        mine = units[rank::num_ranks]
        bins = assign(mine, num_workers, _weight)
        return [Shard(id=i, splits=b, row_count=_rows(b)) for i, b in enumerate(bins)]


def _with_files(chunks: Sequence[Chunk], files: Sequence[FileInfo]) -> list[tuple[Chunk, FileInfo]]:
    by_path = {f.path: f for f in files}
    return [(c, by_path[c.path]) for c in chunks]


def _as_split(chunk: Chunk, f: FileInfo) -> Split:
    info = DataFileInfo(path=f.path, file_size=f.size, record_count=f.num_rows)
    if chunk.unit is ChunkUnit.ROWS and (chunk.start, chunk.stop) != (0, f.num_rows):
        return Split(file=info, row_range=RowRange(chunk.start, chunk.stop - chunk.start))
    return Split(file=info)


def _weight(split: Split) -> int:
    if split.row_range is not None:
        return split.row_range.length
    return split.file.record_count or split.file.file_size or 1


def _rows(splits: Sequence[Split]) -> int | None:
    total = 0
    for s in splits:
        rows = s.row_range.length if s.row_range is not None else s.file.record_count
        if rows is None:
            return None
        total += rows
    return total


class RoundRobinSplitStrategy(_Adapted):
    """Whole files (0.2.0: dealt round-robin by count; here balanced by rows by the planner).

    Args:
        shuffle: Reorder the files every epoch by ``(seed, epoch)``.
        seed: Seed of that order (0.2.0's default 42).
    """

    name = "round_robin"

    def __init__(self, shuffle: bool = False, seed: int = 42) -> None:
        super().__init__(FileSplit(), shuffle, seed)


class SizeBalancedSplitStrategy(_Adapted):
    """Whole files balanced by size (the planner balances every strategy's chunks by rows).

    Args:
        shuffle: Reorder the files every epoch by ``(seed, epoch)``.
        seed: Seed of that order (0.2.0's default 42).
    """

    name = "size_balanced"

    def __init__(self, shuffle: bool = False, seed: int = 42) -> None:
        super().__init__(FileSplit(), shuffle, seed)


class TargetSizeSplitStrategy(_Adapted):
    """Consecutive row groups / stripes packed to a target size (this library's ``row_group``).

    Args:
        target_bytes: Target chunk size, an int or a string such as ``"128MiB"`` (default).
        target_rows: Target rows per chunk; overrides ``target_bytes`` when given.
        shuffle: Reorder the chunks every epoch by ``(seed, epoch)``.
        seed: Seed of that order (0.2.0's default 42).
    """

    name = "target_size"

    def __init__(
        self,
        target_bytes: int | str = _DEFAULT_TARGET_BYTES,
        target_rows: int | None = None,
        shuffle: bool = False,
        seed: int = 42,
    ) -> None:
        check_int(target_rows, "target_rows", 1, optional=True)
        self.target_bytes = parse_size(target_bytes, "target_bytes")
        self.target_rows = target_rows
        splitter = (
            RowGroupSplit(split_rows=target_rows)
            if target_rows is not None
            else RowGroupSplit(split_bytes=self.target_bytes)
        )
        super().__init__(splitter, shuffle, seed)
