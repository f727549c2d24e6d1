"""The per-rank planner against a straightforward all-ranks reference kept here.

The reference plans every rank at once with Chunk objects, as the planner did before it
became per-rank: split, normalize, shuffle by ``(seed, epoch)``, share ``[rank::num_ranks]``;
the epoch's row stream is the shares one after another (rank-aware strategies: each rank's
chunks); leave out (``'drop'``) a span of the stream, keep each share up to the quota and
move the surplus, rank after rank, to the short ranks (with ``'pad'``, the padding span
ends the pool), then LPT and worker quotas per rank. Chunks of no rows carry no rows to
deal: with equal batches they are left out. The planner must give exactly its chunks, for
every rank and worker, over layouts x strategies x ranks x workers x epochs.

:func:`reference_deal` is the same deal over rows (any stream: a fresh epoch's, or what an
interrupted pass left), the oracle of fresh and resumed epochs alike.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import strategies as ts
from tests.strategies import piece_rows
from torch_dataloader_utils.config import EqualBatches
from torch_dataloader_utils.errors import PlanError
from torch_dataloader_utils.plan.assign import assign
from torch_dataloader_utils.plan.deal import DROP_SALT, PAD_SALT
from torch_dataloader_utils.plan.mixing import RowMixing
from torch_dataloader_utils.plan.pieces import Piece as PieceOf
from torch_dataloader_utils.plan.planner import Planner, PlanSpec, plan_epoch, rank_shares
from torch_dataloader_utils.plan.ranks import worker_quotas
from torch_dataloader_utils.plan.resume import segment_pieces
from torch_dataloader_utils.plan.shuffle import random_offset, shuffled
from torch_dataloader_utils.plan.splits import FileSplit, RankAwareStrategy, RowGroupSplit, normalize_chunks
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo


@dataclass(frozen=True)
class Piece:
    """Rows ``[lo, hi)`` of ``chunk`` (in the order it yields them)."""

    chunk: Chunk
    lo: int
    hi: int
    padding: bool = False

    @property
    def rows(self) -> int:
        return self.hi - self.lo


def materialize(p: Piece, files: dict[str, FileInfo]) -> Chunk:
    c = p.chunk
    n = c.num_rows
    if n is None or (p.lo == 0 and p.hi == n):
        if p.padding and not c.padding:
            return Chunk(c.path, c.start, c.stop, c.unit, c.num_rows, c.num_bytes, True, c.skip)
        return c
    size = c.num_bytes * p.hi // n - c.num_bytes * p.lo // n
    pad = p.padding or c.padding
    if c.unit is ChunkUnit.BYTES:
        return Chunk(c.path, c.start, c.stop, c.unit, p.rows, size, pad, c.skip + p.lo)
    f = files[c.path]
    start = c.start if p.lo == 0 else f.stop_after(c.start, p.lo)
    stop = c.stop if p.hi == n else f.stop_after(c.start, p.hi)
    return Chunk(c.path, start, stop, ChunkUnit.ROWS, p.rows, size, pad)


def cut(p: Piece, rows: int) -> tuple[Piece, Piece]:
    return Piece(p.chunk, p.lo, p.lo + rows, p.padding), Piece(p.chunk, p.lo + rows, p.hi, p.padding)


def weight(p: Piece) -> int:
    return p.rows if p.chunk.num_rows is not None else p.chunk.num_bytes


def reference_stream(spec: PlanSpec, epoch: int) -> list[tuple[Chunk, int]]:
    """The epoch's chunks in stream order, with the rank whose share each is.

    Strategies returning every chunk: chunk ``j`` of the shuffled order is in share ``j %
    num_ranks``. Rank-aware strategies: each rank's (shuffled) chunks. Shares one after another.
    """
    files = {f.path: f for f in spec.files}  # type: ignore[union-attr]
    strategy = spec.strategy
    if isinstance(strategy, RankAwareStrategy):
        stream = []
        for rank in range(spec.num_ranks):
            chunks = strategy.split_rank(
                spec.files,  # type: ignore[arg-type]
                num_workers=spec.num_workers,
                epoch=epoch,
                num_ranks=spec.num_ranks,
                rank=rank,
            )
            chunks = normalize_chunks(chunks, files, strategy.name)
            stream += [
                (c, rank) for c in (shuffled(chunks, spec.seed, epoch, rank) if spec.shuffle else chunks)
            ]
        return stream
    chunks = normalize_chunks(
        strategy.split(spec.files, num_workers=spec.num_workers, epoch=epoch),  # type: ignore[arg-type]
        files,
        strategy.name,
    )
    if spec.shuffle:
        chunks = shuffled(chunks, spec.seed, epoch)
    r = spec.num_ranks
    return [(c, rank) for rank in range(r) for c in chunks[rank::r]]


def reference_plan(
    spec: PlanSpec, epoch: int, workers_of: Callable[[int], int]
) -> tuple[list[list[list[Chunk]]], list[Chunk]]:
    """Every rank's chunks per worker, and the chunks left out."""
    files = {f.path: f for f in spec.files}  # type: ignore[union-attr]
    chunks = reference_stream(spec, epoch)
    num_ranks = spec.num_ranks
    dropped: list[Piece] = []
    if not spec.equalized:
        pieces: list[list[Piece]] = [[] for _ in range(num_ranks)]
        for c, r in chunks:
            pieces[r].append(Piece(c, 0, c.num_rows or 0))
        quota = 0
    else:
        if any(c.num_rows is None for c, _ in chunks):
            raise PlanError("equal_batches needs exact row counts")
        stream = [Piece(c, 0, c.num_rows or 0) for c, _ in chunks]
        owner = [r for _, r in chunks]
        total = sum(p.rows for p in stream)
        pad = spec.equal_batches is EqualBatches.PAD
        pad_rows = -total % num_ranks if pad else 0
        left_out = 0 if pad else total % num_ranks
        quota = (total + pad_rows - left_out) // num_ranks
        span_lo = total - left_out
        if spec.shuffle and left_out:
            span_lo = random_offset(total - left_out + 1, spec.seed, epoch, DROP_SALT)
        span_hi = span_lo + left_out
        # Leave the span out of the stream: pieces before, inside and after it.
        pieces = [[] for _ in range(num_ranks)]
        position = 0
        for p, r in zip(stream, owner, strict=True):
            a = min(max(span_lo - position, 0), p.rows)
            b = min(max(span_hi - position, 0), p.rows)
            for lo, hi in ((0, a), (b, p.rows)):
                if hi > lo:
                    pieces[r].append(Piece(p.chunk, lo, hi))
            if b > a:
                dropped.append(Piece(p.chunk, a, b))
            position += p.rows
        # Keep each share up to the quota; the surplus goes to a pool, rank after rank.
        pool: deque[Piece] = deque()
        kept: list[list[Piece]] = []
        for share_pieces in pieces:
            out: list[Piece] = []
            have = 0
            for p in share_pieces:
                if have >= quota and p.rows > 0:
                    pool.append(p)
                elif have + p.rows <= quota:
                    out.append(p)
                    have += p.rows
                else:
                    head, tail = cut(p, quota - have)
                    out.append(head)
                    pool.append(tail)
                    have = quota
            kept.append(out)
        # Padding: pad_rows rows of the stream read cyclically from an offset.
        offset = (
            random_offset(total, spec.seed, epoch, PAD_SALT) if spec.shuffle and total and pad_rows else 0
        )
        cyclic = [p for p in stream if p.rows]
        position, need = 0, pad_rows
        starts = []
        for p in cyclic:
            starts.append(position)
            position += p.rows
        at = offset
        while need > 0:
            k = max(i for i, s in enumerate(starts) if s <= at)
            p = cyclic[k]
            lo = at - starts[k]
            n = min(p.rows - lo, need)
            pool.append(Piece(p.chunk, lo, lo + n, True))
            need -= n
            at = (at + n) % total
        # Short ranks take from the pool, in rank order.
        for out in kept:
            have = sum(p.rows for p in out)
            while have < quota:
                p = pool.popleft()
                if p.rows <= quota - have:
                    out.append(p)
                    have += p.rows
                else:
                    head, tail = cut(p, quota - have)
                    out.append(head)
                    pool.appendleft(tail)
                    have = quota
        assert not [p for p in pool if p.rows]
        pieces = kept
    plans = []
    for rank, share_pieces in enumerate(pieces):
        workers = workers_of(rank)
        bins = assign(share_pieces, workers, weight)
        if spec.equalized:
            bins = fill(bins, worker_quotas(quota, workers, spec.batch_size))
        plans.append([[materialize(p, files) for p in b] for b in bins])
    return plans, [materialize(p, files) for p in dropped]


def fill(bins: Sequence[Sequence[Piece]], quotas: Sequence[int]) -> list[list[Piece]]:
    """Each worker keeps its pieces up to its quota; the rest tops up the others."""
    pool: deque[Piece] = deque()
    kept: list[list[Piece]] = []
    for pieces, quota in zip(bins, quotas, strict=True):
        out: list[Piece] = []
        have = 0
        for p in pieces:
            if have >= quota and p.rows > 0:
                pool.append(p)
            elif have + p.rows <= quota:
                out.append(p)
                have += p.rows
            else:
                head, tail = cut(p, quota - have)
                out.append(head)
                pool.append(tail)
                have = quota
        kept.append(out)
    for out, quota in zip(kept, quotas, strict=True):
        have = sum(p.rows for p in out)
        while have < quota and pool:
            p = pool.popleft()
            if p.rows <= quota - have:
                out.append(p)
                have += p.rows
            else:
                head, tail = cut(p, quota - have)
                out.append(head)
                pool.appendleft(tail)
                have = quota
    return kept


@dataclass(frozen=True)
class Case:
    files: list[FileInfo]
    strategy: Any
    num_ranks: int
    workers: list[int]
    shuffle: bool
    seed: int
    policy: EqualBatches
    batch_size: int
    epochs: list[int]

    def spec(self) -> PlanSpec:
        return PlanSpec(
            tuple(self.files),
            ts.quiet_resolve(self.strategy),
            self.num_ranks,
            1,
            self.shuffle,
            self.seed,
            self.policy,
            self.batch_size,
        )

    def workers_of(self, rank: int) -> int:
        return self.workers[rank % len(self.workers)]


cases = st.builds(
    Case,
    files=st.one_of(ts.rich_layouts(), ts.layouts().map(list)),
    strategy=st.one_of(ts.rich_splits(), st.just(ts.HalfFileLegacy()), st.just(ts.HalfFileSharded())),
    num_ranks=ts.num_ranks,
    workers=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    shuffle=st.booleans(),
    seed=ts.seeds,
    policy=st.sampled_from(list(EqualBatches)),
    batch_size=st.integers(1, 40),
    epochs=st.lists(ts.epochs, min_size=1, max_size=3),
)


@ts.more_examples(3)
@given(cases)
def test_per_rank_planner_matches_the_reference(case: Case) -> None:
    spec = case.spec()
    for epoch in case.epochs:
        try:
            expected, dropped = reference_plan(spec, epoch, case.workers_of)
        except PlanError:
            with pytest.raises(PlanError, match="exact row counts"):
                Planner(spec).rank_plan(epoch, 0, case.workers_of(0))
            continue
        # Every rank plans alone, in a process of its own (a fresh planner), as in a job.
        for rank in range(case.num_ranks):
            plan = Planner(spec).rank_plan(epoch, rank, case.workers_of(rank))
            assert [list(w) for w in plan.assignments()] == expected[rank]
            # A DataLoader worker builds only its own chunks: the same ones.
            for w in range(plan.num_workers):
                assert (
                    list(Planner(spec).rank_plan(epoch, rank, case.workers_of(rank)).chunks_for(w))
                    == (expected[rank][w])
                )
        assert list(Planner(spec).dropped(epoch)) == dropped


@given(cases.filter(lambda c: c.policy is not EqualBatches.OFF and c.num_ranks > 1))
def test_all_ranks_plan_is_the_per_rank_plans(case: Case) -> None:
    spec = case.spec()
    epoch = case.epochs[0]
    try:
        plan = plan_epoch(spec, epoch)
    except PlanError:
        return
    planner = Planner(spec)
    assert list(plan.assignments) == [
        planner.rank_plan(epoch, r).assignments() for r in range(case.num_ranks)
    ]
    assert planner.epoch_plan(epoch) == plan  # planned rank by rank when read


# ---------------------------------------------------------------------------------------
# The deal over rows: one oracle for fresh and resumed epochs
# ---------------------------------------------------------------------------------------

Row = tuple[str, int, bool]
"""``(path, file row, padding)``."""


def reference_deal(
    stream: list[tuple[Row, int | None]], num_ranks: int, spec: PlanSpec, key: tuple[int, ...]
) -> tuple[list[list[Row]], list[Row]]:
    """Each rank's rows and the rows left out, dealing ``stream`` (rows with their home).

    A home of ``None`` means even homes: the rows (the dropped span aside) cut into
    ``num_ranks`` runs of the quota (``ceil(total / num_ranks)`` without equal batches).
    Every rank keeps its home's rows up to the quota; the rest, home after home, then the
    padding (the stream read cyclically from an offset), fills the short ranks in order.
    """
    rows = [row for row, _ in stream]
    total = len(rows)
    equal = spec.equal_batches.acts_on(num_ranks)
    pad = -total % num_ranks if equal and spec.equal_batches is EqualBatches.PAD else 0
    left_out = total % num_ranks if equal and not pad and spec.equal_batches is EqualBatches.DROP else 0
    quota = (total + pad - left_out) // num_ranks if equal else -(-total // num_ranks)
    lo = total - left_out
    if spec.shuffle and left_out:
        lo = random_offset(total - left_out + 1, spec.seed, key[0], DROP_SALT, *key[1:])
    kept = [s for i, s in enumerate(stream) if not lo <= i < lo + left_out]
    own: list[list[Row]] = [[] for _ in range(num_ranks)]
    pool: deque[Row] = deque()
    for j, (row, home) in enumerate(kept):
        home = min(j // max(quota, 1), num_ranks - 1) if home is None else home
        (own[home] if len(own[home]) < quota or not equal else pool).append(row)
    offset = random_offset(total, spec.seed, key[0], PAD_SALT, *key[1:]) if spec.shuffle and pad else 0
    pool += [(p, r, True) for p, r, _ in (rows[(offset + i) % total] for i in range(pad))]
    for mine in own:
        while equal and len(mine) < quota:
            mine.append(pool.popleft())
    assert not pool
    return own, rows[lo : lo + left_out]


def _rows_of(pieces: Sequence[Any], files: dict[str, FileInfo]) -> list[Row]:
    return [row for p in pieces for row in piece_rows(p, files)]


def _check_deal(
    result: Any, expected: list[list[Row]], dropped: list[Row], files: dict[str, FileInfo]
) -> None:
    for rank, workers in enumerate(result.assignments):
        assert Counter(_rows_of([p for w in workers for p in w], files)) == Counter(expected[rank])
    assert Counter(_rows_of(result.dropped, files)) == Counter(dropped)


@ts.more_examples(2)
@given(
    files=ts.layouts(),
    strategy=st.sampled_from([FileSplit(), RowGroupSplit(), RowGroupSplit(split_rows=30)]),
    before=st.integers(1, 5),
    after=st.integers(1, 6),
    workers=st.integers(1, 3),
    shuffle=st.booleans(),
    seed=st.integers(0, 9),
    policy=st.sampled_from(list(EqualBatches)),
    window=st.one_of(st.none(), st.integers(1, 60)),
    mixing=st.one_of(st.none(), st.builds(RowMixing, rows=st.integers(1, 60), streams=st.integers(1, 3))),
    data=st.data(),
)
def test_the_deal_partitions_fresh_and_resumed_streams_like_the_reference(
    files, strategy, before, after, workers, shuffle, seed, policy, window, mixing, data
) -> None:
    """Each rank reads its quota of the stream, minus the drop span, plus the pad ranges.

    A fresh epoch's stream is the shares one after another; a resumed one is what every
    worker of the interrupted pass left, worker after worker, rank after rank, in even homes.
    """
    spec = PlanSpec(files, strategy, shuffle=shuffle, seed=seed, equal_batches=policy, batch_size=4)
    by_path = {f.path: f for f in files}
    epoch = 3

    def plan(segments: list[dict[str, Any]], num_ranks: int) -> Any:
        return segment_pieces(
            spec, epoch, segments, num_ranks=num_ranks, num_workers=lambda r: workers,
            window_rows=window, exact=True, mixing=None if window else mixing,
        )  # fmt: skip

    fresh = plan([], before)
    shares = rank_shares(replace(spec, num_ranks=before), epoch)
    stream = [
        (row, rank) for rank, share in enumerate(shares) for c in share for row in chunk_rows(c, by_path)
    ]
    _check_deal(fresh, *reference_deal(stream, before, spec, (epoch,)), by_path)

    segment: dict[str, Any] = {"num_ranks": before, "ranks": {}}
    rest: list[tuple[Row, int | None]] = []
    for rank, ws in enumerate(fresh.assignments):
        cursors = []
        for pieces in ws:
            i = data.draw(st.integers(0, len(pieces)))
            k = data.draw(st.integers(0, pieces[i].num_rows or 0)) if i < len(pieces) else 0
            cursors.append([i, k])
            rest += [(row, None) for row in _rows_of(pieces[i:], by_path)[k:]]
        segment["ranks"][str(rank)] = {"num_workers": len(ws), "cursors": cursors, "done": False}
    resumed = plan([segment], after)
    _check_deal(resumed, *reference_deal(rest, after, spec, (epoch, 1)), by_path)


def chunk_rows(chunk: Chunk, files: dict[str, FileInfo]) -> list[Row]:
    return piece_rows(PieceOf.file(chunk), files)
