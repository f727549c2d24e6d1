"""Planning an epoch for one rank: numpy over the chunk table, objects for this rank only.

    files ──split (once)──▶ chunk table ──shuffle(seed, epoch)──▶ [rank::num_ranks]
        ──equalize (prefix sums)──▶ this rank's parts ──LPT + quotas──▶ workers

The only work over the whole dataset is numpy over integer columns: the permutation of
the chunk table, each rank's row total (a reshape and a sum) and prefix sums for the
rows a short rank receives. Only this rank's chunks become objects, and in a
DataLoader worker only that worker's (:meth:`RankPlan.chunks_for`).

Equal batches (``equal_batches`` on, more than one rank): the epoch's *row stream* is
every rank's share of chunks, rank after rank. With ``'drop'``, the ``total %
num_ranks`` rows left out are a span of that stream at an offset drawn from ``(seed,
epoch)`` when shuffling (so they change every epoch, as a shuffled sampler's dropped
tail does), else its last rows. Then every rank keeps its share up to the quota, and
ranks over it hand their surplus, in rank order, to ranks under it, in rank order,
cutting chunks at row granularity (:mod:`.ranks`). With ``'pad'``, the pool of surplus
rows ends with the ``-total % num_ranks`` padding rows: a span of the stream (cyclic)
at an offset drawn from ``(seed, epoch)`` when shuffling, else its first rows.

Every rank and every DataLoader worker computes the same decisions from values alone,
with no communication. :func:`plan_epoch` gives the plan of every rank (for the command
line and the tests) by calling the per-rank planner for each rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, overload

import numpy as np

from torch_dataloader_utils.errors import PlanError
from torch_dataloader_utils.plan.assign import assign
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.chunks import (
    ChunkTable,
    build_chunks,
    check_table_overlap,
    from_chunks,
    is_builtin,
)
from torch_dataloader_utils.plan.ranks import fill_quotas_by, worker_quotas
from torch_dataloader_utils.plan.shuffle import permutation, random_offset
from torch_dataloader_utils.plan.splits import RankAwareStrategy, Splitter
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, EqualBatches, FileInfo, WorkerChunks

__all__ = [
    "AUTO_VERIFY_RANKS",
    "LazyRanks",
    "Part",
    "PartColumns",
    "PlanSpec",
    "Planner",
    "RankPlan",
    "plan_epoch",
    "rank_shares",
    "verify_plan",
]

Array = np.ndarray[Any, Any]

AUTO_VERIFY_RANKS = 16
"""Worlds of at most this many ranks check a rank-aware strategy's chunks across ranks."""

_DROP_SALT = 0x64726F70
"""Salt of the offset of the rows ``equal_batches='drop'`` leaves out."""
_PAD_SALT = 0x70616400
"""Salt of the offset of the rows ``equal_batches='pad'`` repeats."""


@dataclass(frozen=True)
class PlanSpec:
    """Everything a plan depends on, apart from the epoch (and, per rank, the rank).

    Attributes:
        files: The dataset's files, in a deterministic (sorted) order: ``FileInfo``
            objects or a :class:`~.table.FileTable`.
        strategy: A built-in or adapted split strategy (see ``resolve_strategy``).
        num_ranks: Number of ranks in the job.
        num_workers: Reading workers per rank (>= 1).
        shuffle: Whether chunk order is shuffled every epoch.
        seed: The shuffle seed.
        equal_batches: The equal-batches policy (applies when ``num_ranks > 1``).
        batch_size: Rows per batch (worker quotas are multiples of it).
        verify: Check a rank-aware strategy's chunks across ranks in worlds of more than
            :data:`AUTO_VERIFY_RANKS` ranks too (it calls the strategy for every rank).
    """

    files: tuple[FileInfo, ...] | FileTable
    strategy: Splitter | RankAwareStrategy
    num_ranks: int = 1
    num_workers: int = 1
    shuffle: bool = False
    seed: int = 0
    equal_batches: EqualBatches = EqualBatches.OFF
    batch_size: int = 1
    verify: bool = False

    @property
    def equalized(self) -> bool:
        """Whether ranks are given equal row counts (a policy is on and there are ranks)."""
        return self.equal_batches.acts_on(self.num_ranks)

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {self.num_ranks}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 in a plan, got {self.num_workers}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


class Part(NamedTuple):
    """Rows ``[lo, hi)`` of chunk ``item`` of ``table`` (``hi = -1``: all, count unknown)."""

    table: ChunkTable
    item: int
    lo: int
    hi: int
    padding: bool = False

    @property
    def rows(self) -> int | None:
        """Rows of the part, or ``None`` when unknown."""
        return None if self.hi < 0 else self.hi - self.lo

    def chunk(self) -> Chunk:
        """The part as a :class:`Chunk`."""
        if self.hi < 0:
            return self.table.chunk(self.item)
        return self.table.part(self.item, self.lo, self.hi, self.padding)


def _part_rows(part: Part) -> int:
    return part.hi - part.lo


def _part_weight(part: Part) -> int:
    return part.hi - part.lo if part.hi >= 0 else int(part.table.bytes[part.item])


def _cut(part: Part, rows: int) -> tuple[Part, Part]:
    mid = part.lo + rows
    return part._replace(hi=mid), part._replace(lo=mid)


@dataclass(frozen=True, eq=False)
class PartColumns:
    """A rank plan's parts as columns: what each part's :class:`Chunk` would hold.

    Parts are in reading order, worker after worker, as :meth:`RankPlan.chunks_for`
    gives them; only parts cut inside a chunk (a few per rank) are built as chunks to
    compute their figures.

    Attributes:
        counts: Parts of each worker (``int64``, ``num_workers``).
        rows: ``Chunk.num_rows`` of each part (``int64``, ``-1``: unknown).
        bytes: ``Chunk.num_bytes`` of each part (``int64``).
        padding: ``Chunk.padding`` of each part (``bool``).
        file: The file id of each part in :attr:`files` (``int64``).
        files: The file table of the parts' files (``None`` without parts).
    """

    counts: Array
    rows: Array
    bytes: Array
    padding: Array
    file: Array
    files: FileTable | None


def _columns_of(parts: Sequence[Part]) -> tuple[list[tuple[ChunkTable, Array]], Array, Array, Array, Array]:
    """``parts`` as columns: ``(groups, item, lo, hi, padding)``.

    ``groups`` pairs each chunk table with the positions of its parts (one table, by
    identity, but for a rank-aware strategy's rank receiving other ranks' rows).
    """
    n = len(parts)
    tables, raw_items, raw_lo, raw_hi, raw_pad = zip(*parts, strict=True) if n else ((), (), (), (), ())
    items = np.fromiter(raw_items, dtype=np.int64, count=n)
    lo = np.fromiter(raw_lo, dtype=np.int64, count=n)
    hi = np.fromiter(raw_hi, dtype=np.int64, count=n)
    pad = np.fromiter(raw_pad, dtype=bool, count=n)
    if not n:
        return [], items, lo, hi, pad
    first = tables[0]
    if tables.count(first) == n:
        return [(first, np.arange(n))], items, lo, hi, pad
    distinct = {id(t): t for t in tables}
    ids = np.fromiter(map(id, tables), dtype=np.int64, count=n)
    return [(t, np.flatnonzero(ids == key)) for key, t in distinct.items()], items, lo, hi, pad


def _whole(table: ChunkTable, item: Array, lo: Array, hi: Array) -> Array:
    """Which parts :meth:`Part.chunk` gives as their chunk (all its rows, or an unknown count).

    A whole part is its chunk (flagged when the part pads); any other part is cut.
    """
    count = table.rows[item]
    whole: Array = (hi < 0) | ((lo == 0) & ((hi == count) | (count < 0)))
    return whole


def _chunks_of(parts: Sequence[Part]) -> list[Chunk]:
    """``[p.chunk() for p in parts]``, whole chunks built in bulk."""
    out: list[Chunk | None] = [None] * len(parts)
    groups, items, lo, hi, pad = _columns_of(parts)
    for table, at in groups:
        it, h = items[at], hi[at]
        whole = _whole(table, it, lo[at], h)
        built = table.chunks(it[whole], (pad[at] & (h >= 0))[whole])
        for k, chunk in zip(at[whole].tolist(), built, strict=True):
            out[k] = chunk
        for k in at[~whole].tolist():
            out[k] = parts[k].chunk()
    return out  # type: ignore[return-value]  # every position filled


def _part_columns(parts: Sequence[Part]) -> tuple[Array, Array, Array, Array, FileTable | None]:
    """``(rows, bytes, padding, file, files)`` of ``parts`` as :meth:`Part.chunk` gives them.

    ``files`` is the file table of every part's chunk table (``None`` without parts).
    """
    n = len(parts)
    rows = np.empty(n, dtype=np.int64)
    nbytes = np.empty(n, dtype=np.int64)
    padding = np.zeros(n, dtype=bool)
    file = np.empty(n, dtype=np.int64)
    groups, items, lo, hi, pad = _columns_of(parts)
    if not groups:
        return rows, nbytes, padding, file, None
    files = groups[0][0].files
    for table, at in groups:
        if table.files is not files:
            raise ValueError("the parts' chunk tables have different file tables")
        it, h = items[at], hi[at]
        rows[at] = table.rows[it]
        nbytes[at] = table.bytes[it]
        own = table.padding[it] if table.padding is not None else np.zeros(len(it), dtype=bool)
        padding[at] = own | (pad[at] & (h >= 0))
        file[at] = table.files_of(it)
        for k in at[~_whole(table, it, lo[at], h)].tolist():  # cut: built (a few per rank)
            chunk = parts[k].chunk()
            rows[k] = -1 if chunk.num_rows is None else chunk.num_rows
            nbytes[k] = chunk.num_bytes
            padding[k] = chunk.padding
    return rows, nbytes, padding, file, files


@dataclass(frozen=True, eq=False)
class RankPlan:
    """One rank's plan of one epoch: its parts per worker, made into chunks on demand.

    Attributes:
        epoch: The epoch.
        rank: The rank.
        num_ranks: Ranks in the job.
        num_workers: Reading workers of the rank.
        workers: Each worker's parts, in reading order.
        share_size: Parts of the rank before they were dealt to workers (its chunk
            count; the same for any ``num_workers``).
        digest: For a custom strategy, a digest of the chunks it returned for this plan
            (``None`` for built-in strategies), so processes can check they agree.
    """

    epoch: int
    rank: int
    num_ranks: int
    num_workers: int
    workers: tuple[tuple[Part, ...], ...]
    share_size: int
    digest: int | None = None

    def chunks_for(self, worker: int) -> WorkerChunks:
        """The chunks of one worker, in reading order (built now)."""
        return tuple(_chunks_of(self.workers[worker]))

    def assignments(self) -> tuple[WorkerChunks, ...]:
        """Every worker's chunks (built now)."""
        return tuple(self.chunks_for(w) for w in range(self.num_workers))

    def columns(self) -> PartColumns:
        """Every worker's parts as columns (chunks built only for parts cut inside one)."""
        rows, nbytes, padding, file, files = _part_columns([p for w in self.workers for p in w])
        counts = np.fromiter((len(w) for w in self.workers), dtype=np.int64, count=len(self.workers))
        return PartColumns(counts, rows, nbytes, padding, file, files)

    def rows_for(self, worker: int) -> int | None:
        """Rows of one worker, or ``None`` when a chunk's count is unknown."""
        total = 0
        for part in self.workers[worker]:
            if part.hi < 0:
                return None
            total += part.hi - part.lo
        return total

    def rows(self) -> int | None:
        """Rows of the rank (padding included), or ``None`` when unknown."""
        counts = [self.rows_for(w) for w in range(self.num_workers)]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


# ---------------------------------------------------------------------------------------
# Shares: each rank's chunks in reading order, before equalizing
# ---------------------------------------------------------------------------------------


class _Shares:
    """Each rank's items ``(table, indices)``, row totals, and the epoch's row stream.

    The row stream orders every item of every share: the shuffled chunk order for
    strategies that return every chunk (share ``r`` holds positions ``r, r + R, ...``),
    the shares one after another for rank-aware strategies.
    """

    num_ranks: int
    stream: _Stream | None = None
    """The equal-batches arithmetic over the stream, once computed."""

    def share(self, rank: int) -> tuple[ChunkTable, Array]:
        raise NotImplementedError

    def totals(self) -> Array:
        raise NotImplementedError

    def digest(self, rank: int) -> int | None:
        return None

    def stream_starts(self, rank: int) -> Array:
        """Stream row of each item of the share's first row."""
        raise NotImplementedError

    def items_in(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """``(rank, k, start)`` of the items with rows in stream rows ``[lo, hi)``, in stream order."""
        raise NotImplementedError

    def overlap(self, lo: int, hi: int) -> Array:
        """Rows of each share in stream rows ``[lo, hi)``."""
        out = np.zeros(self.num_ranks, dtype=np.int64)
        for rank, k, start in self.items_in(lo, hi):
            table, index = self.share(rank)
            n = int(table.rows[index[k]])
            out[rank] += min(hi, start + n) - max(lo, start)
        return out


def _unknown_rows(table: ChunkTable, index: int) -> PlanError:
    c = table.chunk(index)
    return PlanError(
        f"equal_batches needs exact row counts, but chunk {c.path!r} [{c.start}, {c.stop}) "
        f"{c.unit.value} has an unknown row count; use a format whose row counts are "
        "known (Parquet, ORC, Iceberg) or pass equal_batches='off'"
    )


class _Dealt(_Shares):
    """One chunk table in shuffled order, dealt ``[rank::num_ranks]``.

    The row stream is the shuffled order; its prefix sums are kept at block starts only
    (every ``num_ranks``-th position, one row of shares), and a share's stream rows are
    computed when that share is planned: no array of 8 bytes per chunk is kept.
    """

    _GATHER = 1 << 16
    """Items gathered at a time when computing a share's stream rows (bounds the temporaries)."""

    def __init__(self, table: ChunkTable, order: Array, num_ranks: int, digest: int | None) -> None:
        self.table = table
        self.order = order
        self.num_ranks = num_ranks
        self._digest = digest
        self._totals: Array | None = None
        self._blocks: Array = np.zeros(1, dtype=np.int64)

    def share(self, rank: int) -> tuple[ChunkTable, Array]:
        return self.table, self.order[rank :: self.num_ranks]

    def totals(self) -> Array:
        if self._totals is None:
            r, n = self.num_ranks, len(self.order)
            totals = np.zeros(r, dtype=np.int64)
            self._blocks = np.zeros(-(-n // r) + 1, dtype=np.int64)
            step = max(1, self._GATHER // r) * r  # positions at a time, whole blocks
            for a in range(0, n, step):  # in pieces: no column of every chunk's rows
                rows = self.table.rows[self.order[a : a + step]]
                if np.any(rows < 0):
                    bad = a + int(np.argmax(rows < 0))
                    raise _unknown_rows(self.table, int(self.order[bad]))
                full = len(rows) // r * r
                grid = rows[:full].reshape(-1, r)
                k = a // r
                if full:
                    totals += grid.sum(axis=0, dtype=np.int64)
                    self._blocks[k + 1 : k + 1 + full // r] = grid.sum(axis=1, dtype=np.int64)
                if full < len(rows):  # the last block, shorter than num_ranks
                    totals[: len(rows) - full] += rows[full:]
                    self._blocks[-1] = int(rows[full:].sum(dtype=np.int64))
            np.cumsum(self._blocks, out=self._blocks)
            self._totals = totals
        return self._totals

    def stream_starts(self, rank: int) -> Array:
        self.totals()
        r, n = self.num_ranks, len(self.order)
        count = len(range(rank, n, r))
        first = self._blocks[:count].copy()  # stream row of each block's start
        if rank:
            step = max(1, self._GATHER // rank)  # blocks at a time
            for k in range(0, count, step):
                a, b = k * r, min(n, (k + step) * r)
                idx = self.order[a:b]
                full = (b - a) // r
                part = self.table.rows[idx[: full * r].reshape(full, r)[:, :rank]]
                first[k : k + full] += part.sum(axis=1, dtype=np.int64)
                if full < min(step, count - k):  # the last block, shorter than num_ranks
                    first[k + full] += int(
                        self.table.rows[idx[full * r : full * r + rank]].sum(dtype=np.int64)
                    )
        return first

    def items_in(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        self.totals()
        r, n, blocks = self.num_ranks, len(self.order), self._blocks
        k = max(0, int(np.searchsorted(blocks, lo, side="right")) - 1)
        while k * r < n and blocks[k] < hi:
            a = k * r
            rows = self.table.rows[self.order[a : min(n, a + r)]].astype(np.int64)
            ends = np.cumsum(rows) + int(blocks[k])
            for m in np.flatnonzero((ends > lo) & (rows > 0)).tolist():
                start = int(ends[m] - rows[m])
                if start >= hi:
                    return
                yield m, k, start
            k += 1

    def digest(self, rank: int) -> int | None:
        return self._digest


class _PerRank(_Shares):
    """A rank-aware strategy's chunks, asked of the strategy one rank at a time."""

    def __init__(self, planner: Planner, epoch: int, num_workers: int, totals: Sequence[int] | None) -> None:
        self.planner = planner
        self.epoch = epoch
        self.num_workers = num_workers
        self.num_ranks = planner.spec.num_ranks
        self._tables: dict[int, tuple[ChunkTable, Array]] = {}
        self._given = None if totals is None else np.asarray(totals, dtype=np.int64)
        self._totals: Array | None = None

    def call(self, rank: int) -> ChunkTable:
        spec = self.planner.spec
        strategy = spec.strategy
        assert isinstance(strategy, RankAwareStrategy)
        chunks = strategy.split_rank(
            self.planner.files.infos,
            num_workers=self.num_workers,
            epoch=self.epoch,
            num_ranks=spec.num_ranks,
            rank=rank,
        )
        return from_chunks(chunks, self.planner.files, strategy.name)

    def share(self, rank: int) -> tuple[ChunkTable, Array]:
        found = self._tables.get(rank)
        if found is None:
            spec = self.planner.spec
            table = self.call(rank)
            n = len(table)
            order = permutation(n, spec.seed, self.epoch, rank) if spec.shuffle else np.arange(n)
            found = (table, order)
            self._tables[rank] = found
        return found

    def totals(self) -> Array:
        if self._given is not None:
            if self._given.shape != (self.num_ranks,):
                raise ValueError(f"totals must hold {self.num_ranks} row counts, got {self._given.shape}")
            return self._given
        if self._totals is None:
            out = np.zeros(self.num_ranks, dtype=np.int64)
            for rank in range(self.num_ranks):
                table, order = self.share(rank)
                rows = table.rows[order]
                if np.any(rows < 0):
                    raise _unknown_rows(table, int(order[int(np.argmax(rows < 0))]))
                out[rank] = int(rows.sum())
            self._totals = out
        return self._totals

    def digest(self, rank: int) -> int | None:
        return self.share(rank)[0].digest()

    def _starts(self) -> Array:
        starts = np.zeros(self.num_ranks + 1, dtype=np.int64)
        np.cumsum(self.totals(), out=starts[1:])
        return starts

    def stream_starts(self, rank: int) -> Array:
        table, index = self.share(rank)
        rows = table.rows[index]
        first = np.zeros(len(rows), dtype=np.int64)
        if len(rows) > 1:
            np.cumsum(rows[:-1], out=first[1:])
        first += int(self._starts()[rank])
        return first

    def items_in(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        starts = self._starts()
        rank = max(0, int(np.searchsorted(starts, lo, side="right")) - 1)
        while rank < self.num_ranks and starts[rank] < hi:
            if starts[rank + 1] > lo:
                table, index = self.share(rank)
                first = self.stream_starts(rank)
                end = first + table.rows[index]
                for k in np.flatnonzero((first < hi) & (end > lo) & (end > first)).tolist():
                    yield rank, k, int(first[k])
            rank += 1

    def verify(self, fresh: bool) -> None:
        """Check that no two ranks share a row (calling the strategy for every rank).

        ``fresh`` calls the strategy again for every rank instead of reusing what it
        returned, and checks this process's earlier answers are the same.
        """
        strategy = self.planner.spec.strategy
        tables = []
        for rank in range(self.num_ranks):
            if fresh:
                table = self.call(rank)
                known = self._tables.get(rank)
                if known is not None and known[0].digest() != table.digest():
                    raise nondeterministic(strategy.name, f"two calls for rank {rank} of epoch {self.epoch}")
            else:
                table = self.share(rank)[0]
            tables.append(table)
        check_table_overlap(
            ChunkTable.concat(self.planner.files, tables),
            f"split strategy {strategy.name!r} across {self.num_ranks} ranks",
        )


def nondeterministic(name: str, where: str) -> PlanError:
    """The error for a custom strategy that returned different chunks for the same arguments."""
    return PlanError(
        f"split strategy {name!r} returned different chunks for the same arguments ({where}), "
        "so ranks and DataLoader workers would read some rows twice and never read others. "
        "generate() must be a pure function of its arguments (files, num_workers, epoch, "
        "num_ranks, rank): derive any randomness from them, e.g. numpy.random.default_rng((my_seed, epoch))"
    )


# ---------------------------------------------------------------------------------------
# Equalizing: this rank's parts from prefix sums
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stream:
    """The epoch's row stream and the equal-batches arithmetic over it."""

    total: int
    quota: int
    span: tuple[int, int]  # stream rows left out (drop)
    pad_offset: int  # stream row the padding starts at (pad)
    pad_rows: int
    kept: Array  # rows of each share after the span is left out
    surplus_starts: Array  # pool offset of each share's surplus (len num_ranks + 1)
    deficit_starts: Array  # pool offset of each rank's deficit (len num_ranks + 1)


def _stream(shares: _Shares, *, pad: bool, shuffle: bool, seed: int, salt: Sequence[int]) -> _Stream:
    totals = shares.totals()
    num_ranks = len(totals)
    total = int(totals.sum())
    span = (total, total)
    pad_offset = pad_rows = 0
    if pad:
        pad_rows = -total % num_ranks
        quota = (total + pad_rows) // num_ranks
        if shuffle and total > 0 and pad_rows:
            pad_offset = random_offset(total, seed, *salt[:1], _PAD_SALT, *salt[1:])
    else:
        left_out = total % num_ranks
        quota = (total - left_out) // num_ranks
        offset = total - left_out
        if shuffle and left_out:
            offset = random_offset(total - left_out + 1, seed, *salt[:1], _DROP_SALT, *salt[1:])
        span = (offset, offset + left_out)
    kept = totals - shares.overlap(*span) if span[1] > span[0] else totals
    surplus = np.maximum(0, kept - quota)
    deficit = np.maximum(0, quota - kept)
    surplus_starts = np.zeros(num_ranks + 1, dtype=np.int64)
    np.cumsum(surplus, out=surplus_starts[1:])
    deficit_starts = np.zeros(num_ranks + 1, dtype=np.int64)
    np.cumsum(deficit, out=deficit_starts[1:])
    return _Stream(total, quota, span, pad_offset, pad_rows, kept, surplus_starts, deficit_starts)


@dataclass(frozen=True)
class _ShareRows:
    """One share's items with their rows, the span's cut of them, and kept prefix sums."""

    table: ChunkTable
    index: Array
    rows: Array
    cut_lo: Array  # removed rows [cut_lo, cut_hi) of each item (item coordinates)
    cut_hi: Array
    kept: Array
    before: Array  # kept rows of the share before each item


def _share_rows(shares: _Shares, stream: _Stream, rank: int) -> _ShareRows:
    table, index = shares.share(rank)
    rows = table.rows[index]
    first = shares.stream_starts(rank)
    lo, hi = stream.span
    cut_lo = np.minimum(np.maximum(lo - first, 0), rows)
    cut_hi = np.minimum(np.maximum(hi - first, 0), rows)
    kept = rows - (cut_hi - cut_lo)
    before = np.zeros(len(rows), dtype=np.int64)
    if len(rows) > 1:
        np.cumsum(kept[:-1], out=before[1:])
    return _ShareRows(table, index, rows, cut_lo, cut_hi, kept, before)


def _live(share: _ShareRows, k: int, x: int, y: int, padding: bool = False) -> list[Part]:
    """Parts for kept rows ``[x, y)`` of item ``k`` (rows the span left out are skipped)."""
    a, b = int(share.cut_lo[k]), int(share.cut_hi[k])
    w = b - a
    i = int(share.index[k])
    if w == 0 or y <= a:
        spans = [(x, y)]
    elif x >= a:
        spans = [(x + w, y + w)]
    else:
        spans = [(x, a), (b, y + w)]
    return [Part(share.table, i, lo, hi, padding) for lo, hi in spans if hi > lo]


def _kept_range(share: _ShareRows, x: int, y: int, padding: bool = False) -> list[Part]:
    """Parts for the share's kept rows ``[x, y)``, in order."""
    if y <= x:
        return []
    end = share.before + share.kept
    live = np.flatnonzero((share.kept > 0) & (share.before < y) & (end > x))
    out: list[Part] = []
    for k in live.tolist():
        b = int(share.before[k])
        out.extend(_live(share, k, max(x, b) - b, min(y, int(end[k])) - b, padding))
    return out


def _own(share: _ShareRows, quota: int) -> list[Part]:
    """The share's parts a rank keeps: items up to the quota (and items of no rows)."""
    take = np.minimum(np.maximum(quota - share.before, 0), share.kept)
    zero = share.rows == 0
    chosen = np.flatnonzero(zero | (take > 0))
    table = share.table
    out: list[Part] = []
    # One pass over plain ints: an item the span does not cut (most) is one part [0, take).
    for k, i, n, cut in zip(
        chosen.tolist(),
        share.index[chosen].tolist(),
        np.where(zero[chosen], 0, take[chosen]).tolist(),
        (share.cut_hi[chosen] - share.cut_lo[chosen]).tolist(),
        strict=True,
    ):
        if n == 0 or cut == 0:
            out.append(Part(table, i, 0, n))
        else:
            out.extend(_live(share, k, 0, n))
    return out


class _ShareCache:
    """Share rows computed at most once per rank while planning a rank."""

    def __init__(self, shares: _Shares, stream: _Stream) -> None:
        self.shares = shares
        self.stream = stream
        self._rows: dict[int, _ShareRows] = {}

    def __call__(self, rank: int) -> _ShareRows:
        found = self._rows.get(rank)
        if found is None:
            found = _share_rows(self.shares, self.stream, rank)
            self._rows[rank] = found
        return found


def _stream_range(rows: _ShareCache, x: int, y: int, padding: bool) -> list[Part]:
    """Parts for stream rows ``[x, y)``, in stream order (no span left out: ``'pad'``)."""
    out: list[Part] = []
    for rank, k, start in rows.shares.items_in(x, y):
        share = rows(rank)
        n = int(share.rows[k])
        out.extend(_live(share, k, max(x, start) - start, min(y, start + n) - start, padding))
    return out


def _pool_range(rows: _ShareCache, x: int, y: int) -> list[Part]:
    """Parts for rows ``[x, y)`` of the pool: the shares' surplus, rank after rank, then padding."""
    stream = rows.stream
    ps = stream.surplus_starts
    out: list[Part] = []
    first = int(np.searchsorted(ps, x, side="right")) - 1
    for rank in range(max(first, 0), len(ps) - 1):
        lo, hi = int(ps[rank]), int(ps[rank + 1])
        if lo >= y:
            break
        if hi <= x or hi == lo:
            continue
        q = stream.quota
        out.extend(_kept_range(rows(rank), q + max(x, lo) - lo, q + min(y, hi) - lo))
    pad_lo = int(ps[-1])
    a, b = max(x, pad_lo) - pad_lo, min(y, pad_lo + stream.pad_rows) - pad_lo
    total = stream.total
    while a < b and total > 0:  # padding: the stream read cyclically from pad_offset
        s = (stream.pad_offset + a) % total
        n = min(b - a, total - s)
        out.extend(_stream_range(rows, s, s + n, True))
        a += n
    return out


def _dropped(rows: _ShareCache) -> list[Part]:
    """Parts for the stream rows ``'drop'`` leaves out, in stream order."""
    lo, hi = rows.stream.span
    out: list[Part] = []
    for rank, k, _ in rows.shares.items_in(lo, hi):
        share = rows(rank)
        out.append(Part(share.table, int(share.index[k]), int(share.cut_lo[k]), int(share.cut_hi[k])))
    return out


# ---------------------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------------------


class Planner:
    """Plans of one dataset, one rank at a time, with what does not change kept.

    The chunk table of a built-in strategy is built once (epochs do not change it); the
    shuffled order and the ranks' row totals once per epoch; a rank's parts once per
    ``(epoch, rank)`` and its workers' once per ``(epoch, rank, num_workers)``. The
    cached values are dropped when the planner is pickled (to DataLoader workers),
    except the chunk table.

    Args:
        spec: What the plans depend on (its ``num_workers`` is the default of
            :meth:`rank_plan`).
    """

    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self.files = spec.files if isinstance(spec.files, FileTable) else FileTable.from_infos(spec.files)
        self._chunks: ChunkTable | None = None
        self._shares: dict[tuple[int, int], _Shares] = {}
        self._parts: BoundedDict[tuple[int, int, int], tuple[list[Part], _Shares]] = BoundedDict(64)
        self._plans: BoundedDict[tuple[int, int, int], RankPlan] = BoundedDict(16)

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "files": self.files, "_chunks": self._chunks}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._shares, self._parts, self._plans = {}, BoundedDict(64), BoundedDict(16)

    def for_world(self, num_ranks: int) -> Planner:
        """This planner for a world of ``num_ranks`` ranks (sharing the chunk table)."""
        if num_ranks == self.spec.num_ranks:
            return self
        other = Planner.__new__(Planner)
        other.__setstate__(
            {
                "spec": replace(self.spec, num_ranks=num_ranks),
                "files": self.files,
                "_chunks": self.chunk_table(),
            }
        )
        return other

    def rows_known(self, epoch: int, num_workers: int) -> bool:
        """Whether every chunk of ``epoch`` has a known row count.

        A rank-aware strategy is not asked for every rank: with equal batches its counts
        are known (planning needs them), without they count as unknown.
        """
        shares = self.shares(epoch, num_workers)
        if isinstance(shares, _Dealt):
            return shares.table.known
        return self.spec.equalized

    @property
    def rank_aware(self) -> bool:
        """The strategy returns one rank's chunks (called per rank)."""
        return isinstance(self.spec.strategy, RankAwareStrategy)

    def chunk_table(self) -> ChunkTable | None:
        """The built-in strategy's chunk table (built on the first call), else ``None``."""
        if self._chunks is None and is_builtin(self.spec.strategy):
            self._chunks = build_chunks(self.spec.strategy, self.files)  # type: ignore[arg-type]
        return self._chunks

    def _key(self, num_workers: int) -> int:
        """Part of the cache keys: custom strategies are told ``num_workers``, built-ins not."""
        return 0 if is_builtin(self.spec.strategy) else num_workers

    def shares(self, epoch: int, num_workers: int, totals: Sequence[int] | None = None) -> _Shares:
        """Each rank's chunks of ``epoch``, in reading order (cached per epoch)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        key = (epoch, self._key(num_workers))
        found = self._shares.get(key)
        if found is not None:
            return found
        spec = self.spec
        strategy = spec.strategy
        if self._shares:  # one epoch's arrays at a time: they hold 16 bytes per chunk
            self._shares.clear()
            self._parts.clear()
        if isinstance(strategy, RankAwareStrategy):
            found = _PerRank(self, epoch, num_workers, totals)
        else:
            table = self.chunk_table()
            digest = None
            if table is None:
                chunks = strategy.split(self.files.infos, num_workers=num_workers, epoch=epoch)
                table = from_chunks(chunks, self.files, strategy.name)
                check_table_overlap(table, f"split strategy {strategy.name!r}")
                digest = table.digest()
            n = len(table)
            order = (  # int32 when it fits: 4 bytes per chunk held for the epoch
                permutation(n, spec.seed, epoch, narrow=True)
                if spec.shuffle
                else np.arange(n, dtype=np.int32 if n <= np.iinfo(np.int32).max else np.int64)
            )
            found = _Dealt(table, order, spec.num_ranks, digest)
        self._shares[key] = found
        return found

    def _stream(self, shares: _Shares, epoch: int) -> _Stream:
        if shares.stream is None:
            spec = self.spec
            shares.stream = _stream(
                shares,
                pad=spec.equal_batches is EqualBatches.PAD,
                shuffle=spec.shuffle,
                seed=spec.seed,
                salt=(epoch,),
            )
        return shares.stream

    def parts(
        self, epoch: int, rank: int, num_workers: int, totals: Sequence[int] | None = None
    ) -> tuple[list[Part], _Shares]:
        """This rank's parts of ``epoch`` before they are dealt to workers."""
        spec = self.spec
        if not 0 <= rank < spec.num_ranks:
            raise ValueError(f"rank must be in [0, {spec.num_ranks}), got {rank}")
        key = (epoch, self._key(num_workers), rank)
        found = self._parts.get(key)
        if found is not None:
            return found
        shares = self.shares(epoch, num_workers, totals)
        if spec.equalized:
            stream = self._stream(shares, epoch)
            rows = _ShareCache(shares, stream)
            out = _own(rows(rank), stream.quota)
            d0, d1 = int(stream.deficit_starts[rank]), int(stream.deficit_starts[rank + 1])
            out += _pool_range(rows, d0, d1)
        else:
            table, index = shares.share(rank)
            rows_of = table.rows[index]
            out = [Part(table, i, 0, n) for i, n in zip(index.tolist(), rows_of.tolist(), strict=True)]
        self._parts[key] = (out, shares)
        return out, shares

    def rank_plan(
        self,
        epoch: int,
        rank: int,
        num_workers: int | None = None,
        *,
        totals: Sequence[int] | None = None,
        verify: bool = False,
    ) -> RankPlan:
        """The plan of one rank for ``epoch`` (cached per ``(epoch, rank, num_workers)``).

        Args:
            epoch: The epoch (>= 0).
            rank: The rank.
            num_workers: Reading workers of the rank (default ``spec.num_workers``).
            totals: Rank-aware strategy with equal batches: every rank's row total for
                this epoch when the caller knows them (e.g. gathered from the ranks);
                otherwise the strategy is called for every rank to count them.
            verify: Rank-aware strategy: check that no two ranks share a row (calling
                the strategy for every rank again) when the world has at most
                :data:`AUTO_VERIFY_RANKS` ranks or ``spec.verify`` is set.

        Raises:
            PlanError: a strategy returned invalid or overlapping chunks, or equal
                batches meet unknown row counts.
        """
        spec = self.spec
        workers = spec.num_workers if num_workers is None else num_workers
        if workers < 1:
            raise ValueError(f"num_workers must be >= 1 in a plan, got {workers}")
        key = (epoch, rank, workers)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        parts, shares = self.parts(epoch, rank, workers, totals)
        if verify and isinstance(shares, _PerRank) and (spec.verify or spec.num_ranks <= AUTO_VERIFY_RANKS):
            shares.verify(fresh=True)
        bins = assign(parts, workers, _part_weight)
        if spec.equalized:
            rows = sum(_part_rows(p) for p in parts)
            bins, rest = fill_quotas_by(
                bins, worker_quotas(rows, workers, spec.batch_size), rows=_part_rows, cut=_cut
            )
            assert not rest, "worker quotas add up to the rank's rows"
        plan = RankPlan(
            epoch=epoch,
            rank=rank,
            num_ranks=spec.num_ranks,
            num_workers=workers,
            workers=tuple(tuple(b) for b in bins),
            share_size=len(parts),
            digest=shares.digest(rank),
        )
        self._plans[key] = plan
        return plan

    def dropped(self, epoch: int, num_workers: int | None = None) -> tuple[Chunk, ...]:
        """Rows ``equal_batches='drop'`` leaves out of ``epoch`` (fewer than ``num_ranks``)."""
        spec = self.spec
        if not spec.equalized or spec.equal_batches is not EqualBatches.DROP:
            return ()
        shares = self.shares(epoch, spec.num_workers if num_workers is None else num_workers)
        rows = _ShareCache(shares, self._stream(shares, epoch))
        return tuple(p.chunk() for p in _dropped(rows))

    def padding(self, epoch: int, num_workers: int | None = None) -> tuple[Chunk, ...]:
        """Rows ``equal_batches='pad'`` repeats in ``epoch`` (fewer than ``num_ranks``)."""
        spec = self.spec
        if not spec.equalized or spec.equal_batches is not EqualBatches.PAD:
            return ()
        shares = self.shares(epoch, spec.num_workers if num_workers is None else num_workers)
        stream = self._stream(shares, epoch)
        rows = _ShareCache(shares, stream)
        start = int(stream.surplus_starts[-1])
        return tuple(p.chunk() for p in _pool_range(rows, start, start + stream.pad_rows))

    def verify(self, epoch: int, num_workers: int | None = None) -> None:
        """Check the epoch's chunks: no two chunks (of any ranks) share a row.

        For a rank-aware strategy it calls the strategy for every rank; for other
        strategies it checks the chunk table (vectorized).

        Raises:
            OverlappingChunksError: two chunks share rows.
            PlanError: a strategy returned invalid chunks.
        """
        workers = self.spec.num_workers if num_workers is None else num_workers
        shares = self.shares(epoch, workers)
        if isinstance(shares, _PerRank):
            shares.verify(fresh=False)
        elif isinstance(shares, _Dealt):
            check_table_overlap(shares.table, f"split strategy {self.spec.strategy.name!r}")

    def epoch_plan(self, epoch: int, num_workers: int | None = None) -> EpochPlan:
        """Every rank's plan of ``epoch``; each rank is planned when it is first read."""
        spec = self.spec
        workers = spec.num_workers if num_workers is None else num_workers
        self.shares(epoch, workers)  # errors in the strategy surface here
        return EpochPlan(
            epoch=epoch,
            seed=spec.seed if spec.shuffle else None,
            num_ranks=spec.num_ranks,
            num_workers=workers,
            assignments=LazyRanks(spec.num_ranks, lambda r: self.rank_plan(epoch, r, workers)),
            dropped=self.dropped(epoch, workers),
        )


class LazyRanks(Sequence[tuple[WorkerChunks, ...]]):
    """Every rank's chunks per worker, each rank planned when first read (and kept)."""

    def __init__(self, num_ranks: int, plan: Callable[[int], RankPlan]) -> None:
        self._n = num_ranks
        self._plan = plan
        self._done: dict[int, tuple[WorkerChunks, ...]] = {}

    def rank_plan(self, rank: int) -> RankPlan:
        """The plan of ``rank`` (its parts; no chunks built)."""
        if not 0 <= rank < self._n:
            raise IndexError(rank)
        return self._plan(rank)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, rank: int) -> tuple[WorkerChunks, ...]: ...

    @overload
    def __getitem__(self, rank: slice) -> Sequence[tuple[WorkerChunks, ...]]: ...

    def __getitem__(self, rank: int | slice) -> tuple[WorkerChunks, ...] | Sequence[tuple[WorkerChunks, ...]]:
        if isinstance(rank, slice):
            return [self[r] for r in range(self._n)[rank]]
        if rank < 0:
            rank += self._n
        if not 0 <= rank < self._n:
            raise IndexError(rank)
        found = self._done.get(rank)
        if found is None:
            found = self._plan(rank).assignments()
            self._done[rank] = found
        return found

    def __iter__(self) -> Iterator[tuple[WorkerChunks, ...]]:
        return (self[r] for r in range(self._n))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (tuple(self),))  # pickles as the plain tuple of every rank

    def __repr__(self) -> str:
        return f"LazyRanks({self._n} ranks, {len(self._done)} planned)"


# ---------------------------------------------------------------------------------------
# Functions over every rank (command line, tests)
# ---------------------------------------------------------------------------------------


def rank_shares(spec: PlanSpec, epoch: int) -> list[list[Chunk]]:
    """Each rank's chunks for ``epoch``, shuffled, before equalizing and assignment to workers."""
    planner = Planner(spec)
    shares = planner.shares(epoch, spec.num_workers)
    if isinstance(shares, _PerRank):
        shares.verify(fresh=False)
    out = []
    for rank in range(spec.num_ranks):
        table, index = shares.share(rank)
        out.append([table.chunk(i) for i in index.tolist()])
    return out


def plan_epoch(spec: PlanSpec, epoch: int) -> EpochPlan:
    """The plan of one epoch for every rank: which chunks each (rank, worker) reads, in order.

    Calls the per-rank planner for every rank (a rank-aware strategy once per rank, its
    chunks checked across ranks). A job's processes call :meth:`Planner.rank_plan`
    for their own rank instead.

    Args:
        spec: What the plan depends on besides the epoch.
        epoch: The epoch (>= 0); with shuffling on, each epoch has its own order.

    Returns:
        The :class:`EpochPlan` for every rank and worker.
    """
    planner = Planner(spec)
    shares = planner.shares(epoch, spec.num_workers)
    if isinstance(shares, _PerRank):
        shares.verify(fresh=False)
    return replace(
        planner.epoch_plan(epoch),
        assignments=tuple(planner.rank_plan(epoch, r).assignments() for r in range(spec.num_ranks)),
    )


def verify_plan(spec: PlanSpec, epochs: Sequence[int] = (0,)) -> None:
    """Check that no two chunks of any ranks share a row, in each of ``epochs``.

    What ``plan --verify`` runs: for a rank-aware strategy it calls the strategy for
    every rank (``num_ranks`` calls per epoch), which worlds of more than
    :data:`AUTO_VERIFY_RANKS` ranks skip while planning (see ``verify_plan=True``).

    Raises:
        OverlappingChunksError: two chunks share rows (naming both).
        PlanError: the strategy returned invalid chunks.
    """
    planner = Planner(spec)
    for epoch in epochs:
        planner.verify(epoch)
