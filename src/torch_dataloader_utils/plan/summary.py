"""Summaries of files and plans as values, and the layouts that will hurt a run.

Everything here is computed from metadata and plans alone (stdlib + numpy), so the
runtime logs it, the command line prints it, and tests check it, without reading data.
Nothing here logs or warns: :func:`layout_issues` returns what it found as values and
the caller decides how to report them.

* :func:`summarize_files`: files, rows, bytes, row groups, sizes.
* :func:`summarize_plan`: rows, bytes and chunks per rank and per worker, with their
  spread (min / max / imbalance), rows left out or padded by equal batches, idle ranks
  and workers, the largest chunk.
* :func:`layout_issues`: ranks or workers with nothing to read, a chunk far larger than
  the rest, many small files, ``shuffle=True`` where every batch comes from one file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from torch_dataloader_utils.plan.planner import LazyRanks
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, FileInfo

__all__ = [
    "LARGE_CHUNK_RATIO",
    "SMALL_FILES_MAX_BYTES",
    "SMALL_FILES_MIN_COUNT",
    "FileSummary",
    "LayoutIssue",
    "PlanSummary",
    "Spread",
    "histogram",
    "layout_issues",
    "summarize_files",
    "summarize_plan",
]

LARGE_CHUNK_RATIO = 8.0
"""A chunk this many times the median chunk (by rows, else bytes) is reported: the worker
reading it finishes long after the others."""

SMALL_FILES_MIN_COUNT = 256
"""At least this many files ..."""

SMALL_FILES_MAX_BYTES = 16 * 2**20
"""... with a median size under this many bytes are reported as many small files: each
costs an open, a footer read and requests of its own, whatever its size."""

RESHARD_TARGET_BYTES = 128 * 2**20
"""The file size a resharding of small files is advised to aim for."""


@dataclass(frozen=True)
class Spread:
    """How a quantity is spread over ranks (or workers): its extremes and balance.

    Attributes:
        count: Values summarized.
        total: Their sum.
        min: The smallest.
        max: The largest.
        mean: ``total / count``.
    """

    count: int
    total: float
    min: float
    max: float
    mean: float

    @classmethod
    def of(cls, values: Iterable[float] | np.ndarray) -> Spread:
        """The spread of ``values`` (all zero when there are none)."""
        arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64)
        if arr.size == 0:
            return cls(0, 0.0, 0.0, 0.0, 0.0)
        total = float(arr.sum())
        return cls(int(arr.size), total, float(arr.min()), float(arr.max()), total / arr.size)

    @property
    def imbalance(self) -> float | None:
        """``max / mean``: 1.0 is perfect balance; 2.0 means the largest has twice the mean."""
        return self.max / self.mean if self.mean > 0 else None

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready), imbalance included."""
        return {
            "count": self.count,
            "total": self.total,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "imbalance": self.imbalance,
        }


def histogram(values: Sequence[float] | np.ndarray, bins: int = 10) -> list[tuple[float, float, int]]:
    """``(low, high, count)`` of ``bins`` equal-width bins over ``values`` (one bin if all equal)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return []
    lo, hi = float(arr.min()), float(arr.max())
    if lo == hi:
        return [(lo, hi, int(arr.size))]
    counts, edges = np.histogram(arr, bins=bins, range=(lo, hi))
    return [(float(edges[i]), float(edges[i + 1]), int(c)) for i, c in enumerate(counts)]


@dataclass(frozen=True)
class FileSummary:
    """The files of a dataset, from their metadata.

    Attributes:
        files: Number of files.
        bytes: Their total size.
        rows: Rows in them (``None`` when a count is unknown: text before counting).
        live_rows: Rows the plan deals out: in row groups left after pruning by ``filters``,
            less deleted positions (``None``: unknown).
        row_groups: Unpruned row groups (or stripes); 0 when the format has none.
        sizes: File sizes in bytes, in the files' order.
        empty_files: Files with no live rows.
        deleted_rows: Row positions excluded one by one: Iceberg deletes (position and
            equality delete files), and the rows a counted row filter drops there.
    """

    files: int
    bytes: int
    rows: int | None
    live_rows: int | None
    row_groups: int
    sizes: tuple[int, ...] = field(repr=False)
    empty_files: int = 0
    deleted_rows: int = 0

    @property
    def pruned_rows(self) -> int | None:
        """Rows in row groups pruned by statistics or partition values (``None``: unknown)."""
        if self.rows is None or self.live_rows is None:
            return None
        return self.rows - self.live_rows - self.deleted_rows

    @property
    def size_spread(self) -> Spread:
        """Min / max / mean file size."""
        return Spread.of(self.sizes)

    @property
    def median_size(self) -> float:
        """The median file size (0 without files)."""
        return float(np.median(self.sizes)) if self.sizes else 0.0


def summarize_files(files: FileTable | Sequence[FileInfo]) -> FileSummary:
    """The summary of ``files`` (metadata only): a :class:`~.table.FileTable` from its columns."""
    if isinstance(files, FileTable):
        return _summarize_table(files)
    rows: int | None = 0
    live: int | None = 0
    groups = empty = deleted = 0
    for f in files:
        positions = getattr(f, "deleted", None)
        deleted += 0 if positions is None else len(positions)
        if rows is not None:
            rows = None if f.num_rows is None else rows + f.num_rows
        live_rows = f.live_rows
        if live is not None:
            live = None if live_rows is None else live + live_rows
        groups += len(f.row_groups or ())
        if live_rows == 0:
            empty += 1
    sizes = tuple(f.size for f in files)
    return FileSummary(len(files), sum(sizes), rows, live, groups, sizes, empty, deleted)


def _summarize_table(table: FileTable) -> FileSummary:
    """:func:`summarize_files` over the table's columns (no ``FileInfo`` built)."""
    rows = None if bool(np.any(table.rows < 0)) else int(table.rows.sum())
    live = None if bool(np.any(table.live < 0)) else int(table.live.sum())
    groups = int(np.diff(table.group_offsets)[table.has_groups].sum())  # as FileInfo.row_groups
    sizes = tuple(table.size.tolist())
    deleted = 0 if table.deleted is None else len(table.deleted)
    return FileSummary(
        len(table), sum(sizes), rows, live, groups, sizes, int(np.count_nonzero(table.live == 0)), deleted
    )


@dataclass(frozen=True)
class PlanSummary:
    """One epoch's plan in figures: per rank and per worker rows, bytes and chunks.

    Attributes:
        epoch: The epoch.
        num_ranks: Ranks planned for.
        num_workers: Workers per rank.
        rows: ``rows[rank, worker]`` (padding included), or ``None`` when a chunk's
            count is unknown (text before counting).
        bytes: ``bytes[rank, worker]``: approximate bytes on disk of the chunks.
        chunks: ``chunks[rank, worker]``: number of chunks.
        rows_dropped: Rows left out of the epoch to equalize ranks (all ranks).
        rows_padded: Rows repeated to equalize ranks (all ranks).
        files: Distinct files in the plan.
        largest_chunk: The chunk of the largest weight (rows, else bytes), or ``None``.
        median_weight: The median chunk weight.
        median_chunk_rows: The median chunk row count (``None``: unknown).
    """

    epoch: int
    num_ranks: int
    num_workers: int
    rows: np.ndarray | None = field(repr=False)
    bytes: np.ndarray = field(repr=False)
    chunks: np.ndarray = field(repr=False)
    rows_dropped: int = 0
    rows_padded: int = 0
    files: int = 0
    largest_chunk: Chunk | None = None
    median_weight: float = 0.0
    median_chunk_rows: float | None = None

    @property
    def total_chunks(self) -> int:
        """Chunks in the epoch (all ranks)."""
        return int(self.chunks.sum())

    @property
    def total_rows(self) -> int | None:
        """Rows in the epoch (padding included; ``None``: unknown)."""
        return None if self.rows is None else int(self.rows.sum())

    def per_rank(self, what: str) -> np.ndarray | None:
        """``"rows"``, ``"bytes"`` or ``"chunks"`` summed per rank (``None``: rows unknown)."""
        table = getattr(self, what)
        return None if table is None else np.asarray(table.sum(axis=1))

    def rank_spread(self, what: str) -> Spread | None:
        """The spread of ``what`` over ranks (``None``: rows unknown)."""
        values = self.per_rank(what)
        return None if values is None else Spread.of(values)

    def worker_spread(self, what: str) -> Spread | None:
        """The spread of ``what`` over every worker of every rank (``None``: rows unknown)."""
        table = getattr(self, what)
        return None if table is None else Spread.of(np.asarray(table).ravel())

    @property
    def idle_ranks(self) -> list[int]:
        """Ranks with no chunk at all."""
        return [int(r) for r in np.flatnonzero(self.chunks.sum(axis=1) == 0)]

    @property
    def idle_workers(self) -> list[tuple[int, int]]:
        """``(rank, worker)`` with no chunk, on ranks that have chunks."""
        busy = self.chunks.sum(axis=1) > 0
        return [(int(r), int(w)) for r, w in np.argwhere(self.chunks == 0) if busy[r]]

    def as_dict(self) -> dict[str, Any]:
        """Figures as plain values (JSON-ready); per-rank arrays not included."""

        def spread(s: Spread | None) -> dict[str, Any] | None:
            return None if s is None else s.as_dict()

        largest = self.largest_chunk
        return {
            "epoch": self.epoch,
            "num_ranks": self.num_ranks,
            "num_workers": self.num_workers,
            "chunks": self.total_chunks,
            "rows": self.total_rows,
            "bytes": int(self.bytes.sum()),
            "files": self.files,
            "rows_dropped": self.rows_dropped,
            "rows_padded": self.rows_padded,
            "per_rank": {w: spread(self.rank_spread(w)) for w in ("rows", "bytes", "chunks")},
            "per_worker": {w: spread(self.worker_spread(w)) for w in ("rows", "bytes", "chunks")},
            "idle_ranks": self.idle_ranks,
            "idle_workers": [list(x) for x in self.idle_workers],
            "largest_chunk": None
            if largest is None
            else {
                "path": largest.path,
                "start": largest.start,
                "stop": largest.stop,
                "rows": largest.num_rows,
                "bytes": largest.num_bytes,
            },
            "median_chunk_weight": self.median_weight,
        }


def summarize_plan(plan: EpochPlan) -> PlanSummary:
    """The figures of ``plan`` (only its ``num_ranks``, ``num_workers``, ``chunks_for`` and ``dropped``).

    A plan of the :class:`~.planner.Planner` (whose ranks are planned when read) is
    summarized from each rank's chunks as columns (:meth:`~.planner.RankPlan.columns`):
    no chunk is built but the largest. Any other plan in one pass over its chunks. The
    rest is vectorized.
    """
    ranks = plan.assignments
    if isinstance(ranks, LazyRanks):
        return _summarize_columns(plan, ranks)
    counts = np.zeros(plan.num_ranks * plan.num_workers, dtype=np.int64)
    chunks: list[Chunk] = []
    for r in range(plan.num_ranks):
        for w in range(plan.num_workers):
            mine = plan.chunks_for(r, w)
            counts[r * plan.num_workers + w] = len(mine)
            chunks.extend(mine)
    fields = list(zip(*map(attrgetter("num_rows", "num_bytes", "padding", "path"), chunks), strict=True))
    raw_rows, raw_bytes, raw_padding, paths = fields if fields else ((), (), (), ())
    n = len(chunks)
    rows = np.fromiter((-1 if v is None else v for v in raw_rows), dtype=np.int64, count=n)
    nbytes = np.asarray(raw_bytes, dtype=np.int64)
    padding = np.asarray(raw_padding, dtype=bool)
    return _summary(plan, counts, rows, nbytes, padding, len(set(paths)), chunks.__getitem__)


def _summarize_columns(plan: EpochPlan, ranks: LazyRanks) -> PlanSummary:
    """:func:`summarize_plan` of a planner's plan, from its ranks' chunks as columns."""
    plans = [ranks.rank_plan(r) for r in range(plan.num_ranks)]
    cols = [p.columns() for p in plans]
    counts = np.concatenate([c.counts for c in cols]) if cols else np.zeros(0, dtype=np.int64)
    rows, nbytes, file = (
        np.concatenate([getattr(c, name) for c in cols]) if cols else np.zeros(0, dtype=np.int64)
        for name in ("rows", "bytes", "file")
    )
    padding = np.concatenate([c.padding for c in cols]) if cols else np.zeros(0, dtype=bool)
    tables = {id(c.files): c.files for c in cols if c.files is not None}
    if len(tables) <= 1:  # file ids of one table: distinct ids are distinct paths
        files = len(np.unique(file))
    else:
        files = len(
            {c.files.path(i) for c in cols if c.files is not None for i in np.unique(c.file).tolist()}
        )
    starts = np.cumsum([0, *(len(c.rows) for c in cols)])

    def chunk_at(k: int) -> Chunk:
        rank = int(np.searchsorted(starts, k, side="right")) - 1
        j = k - int(starts[rank])
        for w, spans in enumerate(plans[rank].workers):
            if j < len(spans):
                return plans[rank].chunk(w, j)
            j -= len(spans)
        raise IndexError(k)

    return _summary(plan, counts, rows, nbytes, padding, files, chunk_at)


def _summary(
    plan: EpochPlan,
    counts: np.ndarray,
    rows: np.ndarray,
    nbytes: np.ndarray,
    padding: np.ndarray,
    files: int,
    chunk_at: Callable[[int], Chunk],
) -> PlanSummary:
    """The summary from every chunk's figures, in plan order (``rows``: ``-1`` unknown).

    ``counts`` holds the chunks of each (rank, worker), rank-major; ``chunk_at(k)`` is
    the ``k``-th chunk.
    """
    shape = (plan.num_ranks, plan.num_workers)
    owner = np.repeat(np.arange(counts.size), counts)
    known = not bool(np.any(rows < 0))
    byte_table = np.bincount(owner, weights=nbytes, minlength=counts.size).astype(np.int64)
    rows_table: np.ndarray | None = None
    padded = 0
    median_rows: float | None = None
    if known:
        rows_table = np.bincount(owner, weights=rows, minlength=counts.size).astype(np.int64).reshape(shape)
        padded = int(rows[padding].sum())
        median_rows = float(np.median(rows)) if rows.size else None
        weights = rows
    else:
        weights = np.where(rows >= 0, rows, nbytes)  # Chunk.weight: rows when known, else bytes
    largest = chunk_at(int(np.argmax(weights))) if rows.size else None
    return PlanSummary(
        epoch=plan.epoch,
        num_ranks=plan.num_ranks,
        num_workers=plan.num_workers,
        rows=rows_table,
        bytes=byte_table.reshape(shape),
        chunks=counts.reshape(shape),
        rows_dropped=sum(c.num_rows or 0 for c in plan.dropped),
        rows_padded=padded,
        files=files,
        largest_chunk=largest,
        median_weight=float(np.median(weights)) if rows.size else 0.0,
        median_chunk_rows=median_rows,
    )


@dataclass(frozen=True)
class LayoutIssue:
    """A layout that will hurt a run, and what to do about it.

    Attributes:
        kind: ``"idle_ranks"``, ``"idle_workers"``, ``"large_chunk"``, ``"small_files"``
            or ``"one_file_batches"``.
        message: What was found, what it costs, and the fix.
    """

    kind: str
    message: str


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _examples(items: Sequence[Any], limit: int = 5) -> str:
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def layout_issues(
    plan: PlanSummary,
    files: FileSummary | None = None,
    *,
    shuffle: bool = False,
    row_window: int | None = None,
    batch_size: int = 1,
    more_chunks: str = "Lower split_rows / split_bytes",
) -> list[LayoutIssue]:
    """The layouts of ``plan`` (and ``files``) that will hurt a run, as values.

    Args:
        plan: The epoch's plan summary.
        files: The dataset's files, for the small-files check.
        shuffle: Whether chunk order is shuffled (``shuffle=True``).
        row_window: Rows mixed across chunks (the row shuffle's window or the row mixing's
            round; ``None``: rows keep their chunk's order).
        batch_size: Rows per batch.
        more_chunks: How the data gives more chunks (the fix of idle ranks and workers;
            where a lower split cannot give more, the dataset says what can).
    """
    found = (
        _idle_ranks(plan, more_chunks),
        _idle_workers(plan, more_chunks),
        _large_chunk(plan),
        _small_files(files),
        _one_file_batches(plan, shuffle and row_window is None, batch_size),
    )
    return [issue for issue in found if issue is not None]


def _idle_ranks(plan: PlanSummary, more_chunks: str) -> LayoutIssue | None:
    idle = plan.idle_ranks
    if not idle:
        return None
    return LayoutIssue(
        "idle_ranks",
        f"{len(idle)} of {plan.num_ranks} ranks have nothing to read in epoch {plan.epoch} "
        f"(ranks {_examples(idle)}; {plan.total_chunks} chunks in all): they yield no "
        f"batches. {more_chunks} so there are at least as many chunks as ranks, or run fewer ranks",
    )


def _idle_workers(plan: PlanSummary, more_chunks: str) -> LayoutIssue | None:
    idle = plan.idle_workers
    if not idle:
        return None
    return LayoutIssue(
        "idle_workers",
        f"{len(idle)} of {plan.num_ranks * plan.num_workers} workers have nothing to read in "
        f"epoch {plan.epoch} ((rank, worker) {_examples(idle)}): num_workers={plan.num_workers} "
        f"is more than some ranks have chunks. {more_chunks}{_or_fewer_workers(more_chunks)}",
    )


def _or_fewer_workers(more_chunks: str) -> str:
    if "num_workers" in more_chunks:
        return ""
    return " or num_workers" if more_chunks.startswith("Lower ") else ", or lower num_workers"


def _large_chunk(plan: PlanSummary) -> LayoutIssue | None:
    largest, median = plan.largest_chunk, plan.median_weight
    if largest is None or plan.total_chunks < 3 or median <= 0 or largest.weight < LARGE_CHUNK_RATIO * median:
        return None
    unit = "rows" if largest.num_rows is not None else "bytes"
    return LayoutIssue(
        "large_chunk",
        f"chunk {largest.path}[{largest.start}:{largest.stop}) holds {largest.weight:,} {unit}, "
        f"{largest.weight / median:.0f}x the median chunk ({median:,.0f} {unit}): the worker reading it "
        "finishes long after the others. Split it finer (split_rows / split_bytes; a file with "
        "one huge row group needs rewriting with smaller row groups, e.g. "
        "`torch-dataloader-utils reshard`)",
    )


def _small_files(files: FileSummary | None) -> LayoutIssue | None:
    if files is None or files.files < SMALL_FILES_MIN_COUNT or files.median_size >= SMALL_FILES_MAX_BYTES:
        return None
    target = max(1, min(files.files, round(files.bytes / RESHARD_TARGET_BYTES)))
    return LayoutIssue(
        "small_files",
        f"{files.files:,} files with a median size of {_size(files.median_size)}: every file costs "
        "an open, a footer read and requests of its own, so reading is dominated by per-file "
        f"overhead (on object storage most of all). Rewrite them into about {target:,} files of "
        f"~{_size(RESHARD_TARGET_BYTES)} with `torch-dataloader-utils reshard`",
    )


def _one_file_batches(plan: PlanSummary, unmixed: bool, batch_size: int) -> LayoutIssue | None:
    """``shuffle=True`` without row mixing, over chunks of at least a batch: batches of one file."""
    rows = plan.median_chunk_rows
    if not unmixed or rows is None or rows < batch_size:
        return None
    return LayoutIssue(
        "one_file_batches",
        f"shuffle=True shuffles the order of the {plan.total_chunks:,} chunks, but rows keep their "
        f"file order inside a chunk: with chunks of a median {rows:,.0f} rows >= "
        f"batch_size={batch_size}, nearly every batch holds rows of one file only. If files group "
        f"similar rows (by time, label or source), interleave them: keep row_interleave on (its default) or "
        f"set row_shuffle_window={int(4 * rows)}, which shuffles rows across about 4 chunks",
    )
