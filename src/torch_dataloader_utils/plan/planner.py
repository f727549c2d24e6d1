"""Planning an epoch for one rank: numpy over the chunk table, objects for this rank only.

    files ──split (once)──▶ chunk table ──shuffle(seed, epoch)──▶ shares [rank::num_ranks]
        ──deal (.deal)──▶ this rank's rows ──LPT + worker quotas (.ranks)──▶ workers

The epoch's *stream* is the ranks' shares one after another (a rank-aware strategy's
shares are what it returned for each rank, shuffled by ``(seed, epoch, rank)``); each
share is its rank's home. Without equal batches a rank reads its share; with them the
deal (:mod:`.deal`) gives every rank the same number of rows as a few ranges of the
stream. The only work over the whole dataset is numpy over integer columns: the
permutation of the chunk table and each share's row total (a reshape and a sum). A
rank's ranges are found in the shares they cross only, as :data:`~.ranks.Span` values;
no object is built per chunk until a worker asks for its pieces
(:meth:`RankPlan.pieces_for`).

Every rank and every DataLoader worker computes the same decisions from values alone,
with no communication. :func:`plan_epoch` gives the plan of every rank (for the command
line and the tests) by calling the per-rank planner for each rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, overload

import numpy as np

from torch_dataloader_utils.errors import PlanError
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.chunks import (
    ChunkTable,
    build_chunks,
    check_table_overlap,
    from_chunks,
    is_builtin,
)
from torch_dataloader_utils.plan.deal import Deal, Range, crossed, deal
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.ranks import Span, to_workers
from torch_dataloader_utils.plan.shuffle import permutation
from torch_dataloader_utils.plan.splits import RankAwareStrategy, Splitter
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, EqualBatches, FileInfo, WorkerChunks

__all__ = [
    "AUTO_VERIFY_RANKS",
    "LazyRanks",
    "PartColumns",
    "PlanSpec",
    "Planner",
    "RankPlan",
    "Source",
    "Stream",
    "plan_epoch",
    "rank_shares",
    "verify_plan",
]

Array = np.ndarray[Any, Any]

AUTO_VERIFY_RANKS = 16
"""Worlds of at most this many ranks check a rank-aware strategy's chunks across ranks."""


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


# ---------------------------------------------------------------------------------------
# Streams: what the dealt ranges of an epoch hold
# ---------------------------------------------------------------------------------------


class Source(Protocol):
    """The items of one segment of a stream, in stream order (a share; a worker's rest)."""

    rows: Array
    """Rows of every item (``int64``; ``-1``: unknown)."""

    def weight(self, item: int) -> int:
        """Balancing weight of an item: its rows when known, else its bytes."""
        ...

    def pieces(self, spans: Sequence[Span]) -> list[Piece]:
        """The pieces the spans of this segment stand for."""
        ...


def _by_segment(spans: Sequence[Span]) -> dict[int, list[int]]:
    """Positions of ``spans`` by the segment each is of."""
    out: dict[int, list[int]] = {}
    for k, span in enumerate(spans):
        out.setdefault(span[0], []).append(k)
    return out


class Stream:
    """Segments one after another, each built when a range first crosses it.

    Args:
        sizes: Positions of every segment: rows (``items=False``) or items; a callable
            is called when positions are first needed.
        source: The items of a segment.
        items: Positions count items (whole items; their rows may be unknown), not rows.
    """

    def __init__(
        self, sizes: Array | Callable[[], Array], source: Callable[[int], Source], *, items: bool = False
    ) -> None:
        self._sizes = sizes
        self._source = source
        self.items = items
        self._sources: dict[int, Source] = {}
        self._prefix: dict[int, Array] = {}
        self._starts: Array | None = None

    @property
    def starts(self) -> Array:
        """Stream position of every segment's start, and the total, last."""
        if self._starts is None:
            sizes = self._sizes() if callable(self._sizes) else self._sizes
            self._starts = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
        return self._starts

    def source(self, segment: int) -> Source:
        """The items of ``segment`` (built once)."""
        found = self._sources.get(segment)
        if found is None:
            found = self._sources[segment] = self._source(segment)
        return found

    def whole(self, segment: int) -> list[Span]:
        """Every item of ``segment``, whole."""
        rows = self.source(segment).rows.tolist()
        return [(segment, i, 0, n, False) for i, n in enumerate(rows)]

    def _in(self, segment: int, a: int, b: int, padding: bool) -> list[Span]:
        """Spans of positions ``[a, b)`` of one segment (items with rows only)."""
        rows = self.source(segment).rows
        if self.items:
            return [(segment, i, 0, int(rows[i]), padding) for i in range(a, b)]
        first = self._prefix.get(segment)
        if first is None:
            first = self._prefix[segment] = np.concatenate(([0], np.cumsum(rows, dtype=np.int64)))
        return [(segment, i, x, y, padding) for i, x, y in crossed(first, a, b)]

    def spans(self, ranges: Sequence[Range]) -> list[Span]:
        """What the stream positions ``ranges`` hold, in order (items of no rows left out)."""
        starts = self.starts
        out: list[Span] = []
        for lo, hi, padding in ranges:
            for segment, a, b in crossed(starts, lo, hi):
                out += self._in(segment, a, b, padding)
        return out

    def weight(self, span: Span) -> int:
        """Balancing weight of a span: its rows when known, else its item's bytes."""
        return span[3] - span[2] if span[3] >= 0 else self.source(span[0]).weight(span[1])

    def pieces(self, spans: Sequence[Span]) -> list[Piece]:
        """The pieces ``spans`` stand for, in order (built now)."""
        out: list[Piece | None] = [None] * len(spans)
        for segment, at in _by_segment(spans).items():
            for k, piece in zip(at, self.source(segment).pieces([spans[k] for k in at]), strict=True):
                out[k] = piece
        return out  # type: ignore[return-value]  # every position filled


class TableSource:
    """The items of a segment that are chunks of a :class:`~.chunks.ChunkTable`.

    Args:
        table: The chunk table.
        index: The segment's chunks, in stream order (positions in ``table``).
    """

    def __init__(self, table: ChunkTable, index: Array) -> None:
        self.table = table
        self.index = index
        self.rows = table.rows[index].astype(np.int64, copy=False)

    def weight(self, item: int) -> int:
        """Balancing weight of an item."""
        return self.table.weight(int(self.index[item]))

    def columns(self, spans: Sequence[Span]) -> tuple[Array, Array, Array, Array, Array]:
        """``(table index, lo, hi, padding, whole)`` of ``spans``: whole spans are their chunk."""
        n = len(spans)
        items, lo, hi = (np.fromiter((s[k] for s in spans), dtype=np.int64, count=n) for k in (1, 2, 3))
        pad = np.fromiter((s[4] for s in spans), dtype=bool, count=n)
        return self.index[items], lo, hi, pad, (lo == 0) & ((hi == self.rows[items]) | (hi < 0))

    def chunks(self, spans: Sequence[Span]) -> list[Chunk]:
        """The chunks ``spans`` stand for: whole chunks built in bulk, cut ones one by one."""
        index, lo, hi, pad, whole = self.columns(spans)
        out: list[Chunk] = [None] * len(spans)  # type: ignore[list-item]  # every position filled below
        at = np.flatnonzero(whole).tolist()
        for k, chunk in zip(at, self.table.chunks(index[whole], pad[whole]) if at else [], strict=True):
            out[k] = chunk
        for k in np.flatnonzero(~whole).tolist():
            out[k] = self.table.part(int(index[k]), int(lo[k]), int(hi[k]), bool(pad[k]))
        return out

    def chunk(self, span: Span) -> Chunk:
        """The chunk one span stands for (built alone)."""
        return self.table.part(int(self.index[span[1]]), span[2], span[3], span[4])

    def pieces(self, spans: Sequence[Span]) -> list[Piece]:
        """Every span as one chunk read in file order."""
        return [Piece.file(c) for c in self.chunks(spans)]


# ---------------------------------------------------------------------------------------
# One rank's plan
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PartColumns:
    """A rank plan's chunks as columns, worker after worker, in reading order.

    Only chunks cut inside a chunk of the table (a few per rank) are built to compute
    their figures.

    Attributes:
        counts: Chunks of each worker (``int64``, ``num_workers``).
        rows: ``Chunk.num_rows`` of each chunk (``int64``, ``-1``: unknown).
        bytes: ``Chunk.num_bytes`` of each chunk (``int64``).
        padding: ``Chunk.padding`` of each chunk (``bool``).
        file: The file id of each chunk in :attr:`files` (``int64``).
        files: The file table of the chunks' files (``None`` without chunks).
    """

    counts: Array
    rows: Array
    bytes: Array
    padding: Array
    file: Array
    files: FileTable | None


def _columns(stream: Stream, spans: Sequence[Span]) -> tuple[Array, Array, Array, Array, FileTable | None]:
    """``(rows, bytes, padding, file, files)`` of the chunks ``spans`` of a table stream stand for."""
    n = len(spans)
    rows, nbytes, file = (np.empty(n, dtype=np.int64) for _ in range(3))
    padding = np.zeros(n, dtype=bool)
    files = None
    for segment, positions in _by_segment(spans).items():
        source = stream.source(segment)
        assert isinstance(source, TableSource)
        table, at = source.table, np.asarray(positions, dtype=np.int64)
        if files is not None and table.files is not files:
            raise ValueError("the spans' chunk tables have different file tables")
        files = table.files
        index, _, _, pad, whole = source.columns([spans[k] for k in positions])
        rows[at], nbytes[at], file[at] = table.rows[index], table.bytes[index], table.files_of(index)
        padding[at] = pad | (table.padding[index] if table.padding is not None else False)
        cut = np.flatnonzero(~whole)
        for k, chunk in zip(at[cut].tolist(), source.chunks([spans[positions[j]] for j in cut]), strict=True):
            rows[k] = -1 if chunk.num_rows is None else chunk.num_rows
            nbytes[k], padding[k] = chunk.num_bytes, chunk.padding
    return rows, nbytes, padding, file, files


def _chunk(stream: Stream, span: Span) -> Chunk:
    source = stream.source(span[0])
    assert isinstance(source, TableSource)
    return source.chunk(span)


@dataclass(frozen=True, eq=False)
class RankPlan:
    """One rank's plan of one epoch: its rows per worker, made into pieces on demand.

    Attributes:
        epoch: The epoch.
        rank: The rank.
        num_ranks: Ranks in the job.
        num_workers: Reading workers of the rank.
        workers: Each worker's spans of :attr:`stream`, in reading order.
        share_size: Spans of the rank before they were dealt to workers (its chunk
            count; the same for any ``num_workers``).
        stream: The stream the spans point into.
        digest: For a custom strategy, a digest of the chunks it returned for this plan
            (``None`` for built-in strategies), so processes can check they agree.
    """

    epoch: int
    rank: int
    num_ranks: int
    num_workers: int
    workers: tuple[tuple[Span, ...], ...]
    share_size: int
    stream: Stream
    digest: int | None = None

    def pieces_for(self, worker: int) -> list[Piece]:
        """The pieces of one worker, in reading order (built now)."""
        return self.stream.pieces(self.workers[worker])

    def chunks_for(self, worker: int) -> WorkerChunks:
        """The chunks of one worker, in reading order (built now; one per piece)."""
        return tuple(p.chunks[0] for p in self.pieces_for(worker))

    def chunk(self, worker: int, index: int) -> Chunk:
        """Chunk ``index`` of one worker (built alone)."""
        return _chunk(self.stream, self.workers[worker][index])

    def assignments(self) -> tuple[WorkerChunks, ...]:
        """Every worker's chunks (built now)."""
        return tuple(self.chunks_for(w) for w in range(self.num_workers))

    def columns(self) -> PartColumns:
        """Every worker's chunks as columns (chunks built only for spans cut inside one)."""
        rows, nbytes, padding, file, files = _columns(self.stream, [s for w in self.workers for s in w])
        counts = np.fromiter((len(w) for w in self.workers), dtype=np.int64, count=len(self.workers))
        return PartColumns(counts, rows, nbytes, padding, file, files)

    def piece_rows(self, worker: int) -> list[int | None]:
        """Rows of each piece of one worker (``None`` when unknown)."""
        return [None if s[3] < 0 else s[3] - s[2] for s in self.workers[worker]]

    def rows_for(self, worker: int) -> int | None:
        """Rows of one worker, or ``None`` when a chunk's count is unknown."""
        counts = self.piece_rows(worker)
        return None if None in counts else sum(n or 0 for n in counts)

    def rows(self) -> int | None:
        """Rows of the rank (padding included), or ``None`` when unknown."""
        counts = [self.rows_for(w) for w in range(self.num_workers)]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


# ---------------------------------------------------------------------------------------
# Shares: each rank's chunks in reading order
# ---------------------------------------------------------------------------------------


def _known_rows(table: ChunkTable, index: Array) -> Array:
    """Rows of the chunks at ``index`` (:class:`PlanError` naming the first unknown count)."""
    rows = table.rows[index]
    if not np.any(rows < 0):
        return rows
    c = table.chunk(int(index[int(np.argmax(rows < 0))]))
    raise PlanError(
        f"equal_batches needs exact row counts, but chunk {c.path!r} [{c.start}, {c.stop}) "
        f"{c.unit.value} has an unknown row count; use a format whose row counts are "
        "known (Parquet, ORC, Iceberg) or pass equal_batches='off'"
    )


class _Shares:
    """Each rank's share of an epoch's chunks (its home in the stream)."""

    num_ranks: int

    def source(self, rank: int) -> TableSource:
        raise NotImplementedError

    def totals(self) -> Array:
        """Rows of every share (:class:`PlanError` on an unknown count)."""
        raise NotImplementedError

    def digest(self, rank: int) -> int | None:
        return None


class _Dealt(_Shares):
    """One chunk table in shuffled order, share ``r`` its positions ``r, r + R, ...``.

    The row totals of the shares are computed a block of positions at a time (a reshape
    and a sum): no column of every chunk's rows in stream order is kept.
    """

    _GATHER = 1 << 16
    """Positions gathered at a time when counting rows (bounds the temporaries)."""

    def __init__(self, table: ChunkTable, order: Array, num_ranks: int, digest: int | None) -> None:
        self.table = table
        self.order = order
        self.num_ranks = num_ranks
        self._digest = digest
        self._totals: Array | None = None

    def source(self, rank: int) -> TableSource:
        return TableSource(self.table, self.order[rank :: self.num_ranks])

    def totals(self) -> Array:
        if self._totals is None:
            r, n = self.num_ranks, len(self.order)
            totals = np.zeros(r, dtype=np.int64)
            step = max(1, self._GATHER // r) * r
            for a in range(0, n, step):
                rows = _known_rows(self.table, self.order[a : a + step])
                full = len(rows) // r * r
                totals += rows[:full].reshape(-1, r).sum(axis=0, dtype=np.int64)
                totals[: len(rows) - full] += rows[full:]
            self._totals = totals
        return self._totals

    def digest(self, rank: int) -> int | None:
        return self._digest


class _PerRank(_Shares):
    """A rank-aware strategy's chunks, asked of the strategy one rank at a time."""

    def __init__(self, planner: Planner, epoch: int, num_workers: int, totals: Sequence[int] | None) -> None:
        self.planner = planner
        self.epoch = epoch
        self.num_workers = num_workers
        self.num_ranks = planner.spec.num_ranks
        self._tables: dict[int, TableSource] = {}
        self._given = None if totals is None else np.asarray(totals, dtype=np.int64)
        self._totals: Array | None = None

    def call(self, rank: int) -> ChunkTable:
        strategy = self.planner.spec.strategy
        assert isinstance(strategy, RankAwareStrategy)
        chunks = strategy.split_rank(
            self.planner.files.infos,
            num_workers=self.num_workers,
            epoch=self.epoch,
            num_ranks=self.num_ranks,
            rank=rank,
        )
        return from_chunks(chunks, self.planner.files, strategy.name)

    def source(self, rank: int) -> TableSource:
        found = self._tables.get(rank)
        if found is None:
            spec = self.planner.spec
            table = self.call(rank)
            n = len(table)
            order = permutation(n, spec.seed, self.epoch, rank) if spec.shuffle else np.arange(n)
            found = self._tables[rank] = TableSource(table, order)
        return found

    def totals(self) -> Array:
        if self._given is not None:
            if self._given.shape != (self.num_ranks,):
                raise ValueError(f"totals must hold {self.num_ranks} row counts, got {self._given.shape}")
            return self._given
        if self._totals is None:
            out = np.zeros(self.num_ranks, dtype=np.int64)
            for rank in range(self.num_ranks):
                source = self.source(rank)
                out[rank] = int(_known_rows(source.table, source.index).sum())
            self._totals = out
        return self._totals

    def digest(self, rank: int) -> int | None:
        return self.source(rank).table.digest()

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
                if known is not None and known.table.digest() != table.digest():
                    raise nondeterministic(strategy.name, f"two calls for rank {rank} of epoch {self.epoch}")
            else:
                table = self.source(rank).table
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


class _Epoch:
    """One epoch's shares, its stream (share after share) and, with equal batches, its deal.

    Not the shares' own attributes: the stream calls the shares, so shares holding it
    would be a reference cycle, keeping a dropped epoch's order alive until a collection.
    """

    def __init__(self, spec: PlanSpec, epoch: int, shares: _Shares) -> None:
        self.spec = spec
        self.epoch = epoch
        self.shares = shares
        self.stream = Stream(shares.totals, shares.source)  # without equal batches: whole shares only
        self._deal: Deal | None = None

    def totals(self) -> Array:
        """Rows of every share (:class:`PlanError` on an unknown count)."""
        return self.shares.totals()

    @property
    def deal(self) -> Deal:
        """The equal-batches deal of the stream, the shares as homes."""
        if self._deal is None:
            spec, starts = self.spec, self.stream.starts
            self._deal = deal(
                int(starts[-1]),
                spec.num_ranks,
                spec.equal_batches,
                homes=starts,
                shuffle=spec.shuffle,
                seed=spec.seed,
                key=(self.epoch,),
            )
        return self._deal

    def spans(self, rank: int) -> list[Span]:
        """What ``rank`` reads: its share, or (equal batches) its deal's ranges."""
        if not self.spec.equalized:
            return self.stream.whole(rank)
        return self.stream.spans(self.deal.ranges(rank))

    def chunks(self, ranges: Sequence[Range]) -> tuple[Chunk, ...]:
        """The chunks of stream positions ``ranges`` (the few rows dropped or padded)."""
        return tuple(_chunk(self.stream, span) for span in self.stream.spans(ranges))


# ---------------------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------------------


class Planner:
    """Plans of one dataset, one rank at a time, with what does not change kept.

    The chunk table of a built-in strategy is built once (epochs do not change it); the
    shuffled order and the shares' row totals once per epoch; a rank's plan once per
    ``(epoch, rank, num_workers)``. The cached values are dropped when the planner is
    pickled (to DataLoader workers), except the chunk table.

    Args:
        spec: What the plans depend on (its ``num_workers`` is the default of
            :meth:`rank_plan`).
    """

    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self.files = spec.files if isinstance(spec.files, FileTable) else FileTable.from_infos(spec.files)
        self._chunks: ChunkTable | None = None
        self._epochs: dict[tuple[int, int], _Epoch] = {}
        self._plans: BoundedDict[tuple[int, int, int], RankPlan] = BoundedDict(16)

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "files": self.files, "_chunks": self._chunks}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._epochs = {}
        self._plans = BoundedDict(16)

    def for_world(self, num_ranks: int) -> Planner:
        """This planner for a world of ``num_ranks`` ranks (sharing the chunk table)."""
        if num_ranks == self.spec.num_ranks:
            return self
        other = Planner(replace(self.spec, num_ranks=num_ranks, files=self.files))
        other._chunks = self.chunk_table()
        return other

    def rows_known(self, epoch: int, num_workers: int) -> bool:
        """Whether every chunk of ``epoch`` has a known row count.

        A rank-aware strategy is not asked for every rank: with equal batches its counts
        are known (planning needs them), without they count as unknown.
        """
        shares = self.shares(epoch, num_workers).shares
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

    def shares(self, epoch: int, num_workers: int, totals: Sequence[int] | None = None) -> _Epoch:
        """Each rank's chunks of ``epoch``, in reading order, and their deal (cached per epoch).

        Custom strategies are told ``num_workers``; built-in ones are not.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        strategy = self.spec.strategy
        key = (epoch, 0 if is_builtin(strategy) else num_workers)
        found = self._epochs.get(key)
        if found is not None:
            return found
        self._epochs.clear()  # one epoch's arrays at a time: they hold 4 bytes per chunk
        self._plans.clear()
        if isinstance(strategy, RankAwareStrategy):
            shares: _Shares = _PerRank(self, epoch, num_workers, totals)
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
                permutation(n, self.spec.seed, epoch, narrow=True)
                if self.spec.shuffle
                else np.arange(n, dtype=np.int32 if n <= np.iinfo(np.int32).max else np.int64)
            )
            shares = _Dealt(table, order, self.spec.num_ranks, digest)
        found = self._epochs[key] = _Epoch(self.spec, epoch, shares)
        return found

    def totals(self, epoch: int, num_workers: int) -> Array:
        """Every rank's share of rows in ``epoch`` (:class:`PlanError` on unknown counts)."""
        return self.shares(epoch, num_workers).totals()

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
        if not 0 <= rank < spec.num_ranks:
            raise ValueError(f"rank must be in [0, {spec.num_ranks}), got {rank}")
        key = (epoch, rank, workers)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        found = self.shares(epoch, workers, totals)
        shares = found.shares
        spans = found.spans(rank)
        if verify and isinstance(shares, _PerRank) and (spec.verify or spec.num_ranks <= AUTO_VERIFY_RANKS):
            shares.verify(fresh=True)  # after this rank's own call: a second call must agree with it
        bins = to_workers(
            spans, workers, found.stream.weight, batch_size=spec.batch_size, equal=spec.equalized
        )
        plan = RankPlan(
            epoch=epoch,
            rank=rank,
            num_ranks=spec.num_ranks,
            num_workers=workers,
            workers=tuple(tuple(b) for b in bins),
            share_size=len(spans),
            stream=found.stream,
            digest=shares.digest(rank),
        )
        self._plans[key] = plan
        return plan

    def dropped(self, epoch: int, num_workers: int | None = None) -> tuple[Chunk, ...]:
        """Rows ``equal_batches='drop'`` leaves out of ``epoch`` (fewer than ``num_ranks``)."""
        if not self.spec.equalized:
            return ()
        found = self.shares(epoch, self.spec.num_workers if num_workers is None else num_workers)
        return found.chunks(found.deal.dropped())

    def padding(self, epoch: int, num_workers: int | None = None) -> tuple[Chunk, ...]:
        """Rows ``equal_batches='pad'`` repeats in ``epoch`` (fewer than ``num_ranks``)."""
        if not self.spec.equalized:
            return ()
        found = self.shares(epoch, self.spec.num_workers if num_workers is None else num_workers)
        return found.chunks(found.deal.padding())

    def verify(self, epoch: int, num_workers: int | None = None) -> None:
        """Check the epoch's chunks: no two chunks (of any ranks) share a row.

        For a rank-aware strategy it calls the strategy for every rank; for other
        strategies it checks the chunk table (vectorized).

        Raises:
            OverlappingChunksError: two chunks share rows.
            PlanError: a strategy returned invalid chunks.
        """
        shares = self.shares(epoch, self.spec.num_workers if num_workers is None else num_workers).shares
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
        """The plan of ``rank`` (its spans; no chunks built)."""
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
            found = self._done[rank] = self._plan(rank).assignments()
        return found

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


def _checked(spec: PlanSpec, epoch: int) -> Planner:
    """A planner whose ``epoch`` is planned, a rank-aware strategy checked across ranks."""
    planner = Planner(spec)
    if planner.rank_aware:
        planner.verify(epoch)
    return planner


def rank_shares(spec: PlanSpec, epoch: int) -> list[list[Chunk]]:
    """Each rank's chunks for ``epoch``, shuffled, before equalizing and assignment to workers."""
    found = _checked(spec, epoch).shares(epoch, spec.num_workers)
    return [found.shares.source(r).chunks(found.stream.whole(r)) for r in range(spec.num_ranks)]


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
    planner = _checked(spec, epoch)
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
