"""A finer split when the row mixing needs more chunks per reader than the default split gives.

With ``shuffle=True`` a reader mixes the rows of
:data:`~torch_dataloader_utils.plan.mixing.DEFAULT_MIX_STREAMS` chunks side by side (or,
with ``row_shuffle_window``, of the chunks of a window), so a batch draws from as many
files as those chunks come from. A small dataset read by many readers has few chunks per
reader with the default 64 MiB target: 8 files read by 4 ranks x 2 workers gave one
chunk per reader, and about 1.3 files per batch. When the user left the split to the
library (no ``split_bytes`` / ``split_rows``, a built-in strategy), the target is lowered
here, before planning, until every reader can get that many chunks: ``split_bytes`` of
the dataset's bytes over the chunks needed (so the packed chunks number at least that
many), and, for a window, at most an eighth of the window's rows per chunk. Row groups
(Parquet), stripes (ORC) and, for counted text, the count blocks are the smallest units:
a chunk never cuts one.

Who the readers are is the order's to say (:mod:`.orders`): the ranks times the workers
of the plain order, the ``canonical_ranks`` streams of elastic order (the same for any
number of ranks and workers, so the plan is too), every lane of a mix for each of its
sources. A resume state records the choice (the ``split_auto`` entry of its
fingerprint), and a dataset whose split is left to the library adopts the state's choice
when it loads it (:func:`strategy_for`), so a state resumes on any number of ranks and
workers, as with an explicit split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from torch_dataloader_utils.config import SplitKind
from torch_dataloader_utils.plan.chunks import ChunkTable
from torch_dataloader_utils.plan.mixing import DEFAULT_MIX_STREAMS
from torch_dataloader_utils.plan.splits import ByteRangeSplit, RankAwareStrategy, RowGroupSplit, Splitter
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.runtime.options import Options

__all__ = ["MIN_TEXT_SPLIT_BYTES", "WINDOW_CHUNKS", "SplitNeed", "finer_split", "need_of", "strategy_for"]

MIN_TEXT_SPLIT_BYTES = 2**20
"""The smallest byte range chosen for text (a range costs a request and a partial line)."""
WINDOW_CHUNKS = DEFAULT_MIX_STREAMS
"""Chunks a ``row_shuffle_window`` should span, as many as the row mixing reads side by side."""


@dataclass(frozen=True)
class SplitNeed:
    """What the mixing needs of the split, for a world of ``readers`` readers.

    Attributes:
        readers: Ranks x reading processes per rank.
        streams: Chunks a reader mixes (the mixing's streams, or the chunks a window spans).
        row_cap: Most rows per chunk (a window: an eighth of it), or ``None``.
    """

    readers: int
    streams: int
    row_cap: int | None

    @property
    def chunks(self) -> int:
        """Chunks the dataset needs: ``streams`` per reader."""
        return self.readers * self.streams

    def met_by(self, table: ChunkTable) -> bool:
        """Whether ``table`` gives every reader enough chunks (and a window small ones)."""
        if len(table) < self.chunks:
            return False
        if self.row_cap is None:
            return True
        rows = table.rows[table.rows >= 0]
        return not len(rows) or float(np.median(rows)) <= self.row_cap


def need_of(
    options: Options, readers: int, *, streams: int | None = None, library_only: bool = True
) -> SplitNeed | None:
    """What the mixing of ``readers`` readers needs, or ``None`` when the split is the user's.

    The library chooses the split when ``shuffle=True`` mixes rows (row mixing or a row
    window), the strategy is a built-in one that takes a size (``row_group``,
    ``byte_range``) and neither ``split_bytes`` nor ``split_rows`` was given; with
    ``library_only=False``, also when they were (to warn about the user's split).
    ``streams``: chunks a reader mixes, when not the row mixing's own (elastic order's
    streams mix fewer each, as every batch draws from all of a rank's streams).
    """
    shuffle, split = options.shuffle, options.split
    mixing, window = shuffle.mixing, shuffle.row_window
    if not shuffle.shuffle or (mixing is None and window is None):
        return None
    if library_only and (split.split_bytes is not None or split.split_rows is not None):
        return None
    if split.split_strategy is not None and not isinstance(split.split_strategy, (str, SplitKind)):
        return None
    if type(options.strategy) not in (RowGroupSplit, ByteRangeSplit):
        return None
    readers = max(1, readers)
    if mixing is not None:
        return SplitNeed(readers, mixing.streams if streams is None else streams, None)
    assert window is not None
    return SplitNeed(readers, WINDOW_CHUNKS, max(1, window // WINDOW_CHUNKS))


def finer_split(
    strategy: Splitter | RankAwareStrategy, files: FileTable, need: SplitNeed
) -> tuple[Splitter, dict[str, int]]:
    """A finer built-in strategy meeting ``need`` as far as the smallest units allow, and its sizes.

    Returns:
        ``(strategy, {"split_bytes": n[, "split_rows": m]})``: the sizes are what a resume
        state records.
    """
    total = int(files.size.sum())
    target = max(1, total // max(1, need.chunks))
    if isinstance(strategy, ByteRangeSplit):
        size = max(MIN_TEXT_SPLIT_BYTES, min(strategy.split_bytes, target))
        return ByteRangeSplit(split_bytes=size), {"split_bytes": size}
    assert isinstance(strategy, RowGroupSplit)
    size = target if strategy.split_bytes is None else min(strategy.split_bytes, target)
    sizes = {"split_bytes": size}
    if need.row_cap is not None:
        sizes["split_rows"] = need.row_cap
    return RowGroupSplit(split_bytes=size, split_rows=need.row_cap), sizes


def strategy_for(
    strategy: Splitter | RankAwareStrategy, sizes: Mapping[str, Any] | None
) -> Splitter | RankAwareStrategy | None:
    """``strategy`` with the sizes a resume state recorded (``None``: the default), or ``None`` if invalid."""
    if sizes is None:
        return strategy
    if not isinstance(sizes, Mapping) or not sizes or set(sizes) - {"split_bytes", "split_rows"}:
        return None
    if any(type(v) is not int or v < 1 for v in sizes.values()):
        return None
    if isinstance(strategy, ByteRangeSplit) and set(sizes) == {"split_bytes"}:
        return ByteRangeSplit(split_bytes=sizes["split_bytes"])
    if isinstance(strategy, RowGroupSplit):
        return RowGroupSplit(split_bytes=sizes.get("split_bytes"), split_rows=sizes.get("split_rows"))
    return None
