"""Equal batches on every rank: exact row quotas planned from metadata alone."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import layouts, live_row_ids
from torch_dataloader_utils.config import EqualBatches
from torch_dataloader_utils.errors import PlanError
from torch_dataloader_utils.plan.pieces import cut_chunk
from torch_dataloader_utils.plan.planner import PlanSpec, plan_epoch
from torch_dataloader_utils.plan.ranks import worker_quotas
from torch_dataloader_utils.plan.splits import FileSplit, RowGroupSplit
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, FileInfo, RowGroup


def rows_of(chunk: Chunk, files: dict[str, FileInfo]) -> list[tuple[str, int]]:
    f = files[chunk.path]
    if f.row_groups is None:
        return [(chunk.path, i) for i in range(chunk.start, min(chunk.stop, f.num_rows or 0))]
    return [
        (chunk.path, i)
        for g in f.groups_in(chunk.start, chunk.stop)
        for i in range(max(g.first_row, chunk.start), min(g.stop_row, chunk.stop))
    ]


def batches(rows: int, batch_size: int, drop_last: bool) -> int:
    return rows // batch_size if drop_last else -(-rows // batch_size)


def rank_batches(plan: EpochPlan, rank: int, batch_size: int, drop_last: bool = False) -> int:
    return sum(batches(plan.rows_for(rank, w) or 0, batch_size, drop_last) for w in range(plan.num_workers))


STRATEGIES = st.sampled_from([FileSplit(), RowGroupSplit(), RowGroupSplit(split_rows=50)])


@given(
    files=layouts(),
    strategy=STRATEGIES,
    num_ranks=st.integers(2, 5),
    batch_size=st.integers(1, 40),
    workers=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    epoch=st.integers(0, 3),
    shuffle=st.booleans(),
    policy=st.sampled_from([EqualBatches.DROP, EqualBatches.PAD]),
    drop_last=st.booleans(),
)
def test_every_rank_yields_the_same_batches_for_any_worker_counts(
    files, strategy, num_ranks, batch_size, workers, epoch, shuffle, policy, drop_last
):
    by_path = {f.path: f for f in files}
    everything = live_row_ids(files)
    total = len(everything)
    counts = set()
    real: Counter[tuple[str, int]] = Counter()
    padded: list[tuple[str, int]] = []
    dropped: list[tuple[str, int]] = []
    for rank in range(num_ranks):
        # Ranks may run different numbers of workers: each plans with its own.
        w = workers[rank % len(workers)]
        spec = PlanSpec(
            files, strategy, num_ranks, w, shuffle, seed=7, equal_batches=policy, batch_size=batch_size
        )
        plan = plan_epoch(spec, epoch)
        counts.add(rank_batches(plan, rank, batch_size, drop_last))
        quotas = [plan.rows_for(rank, k) for k in range(w)]
        assert quotas == worker_quotas(sum(quotas), w, batch_size)  # multiples of batch_size
        for chunk in plan.rank_chunks(rank):
            rows = rows_of(chunk, by_path)
            assert len(rows) == chunk.num_rows
            if chunk.padding:
                padded.extend(rows)
            else:
                real.update(rows)
        if rank == 0:
            dropped = [r for c in plan.dropped for r in rows_of(c, by_path)]
    assert len(counts) == 1, counts
    assert all(n == 1 for n in real.values()), "a row is read twice"
    if policy is EqualBatches.DROP:
        assert not padded
        assert len(dropped) == total % num_ranks < num_ranks
        assert set(real) | set(dropped) == set(everything)
        assert not set(real) & set(dropped)
    else:
        assert not dropped
        assert set(real) == set(everything)
        assert len(padded) == (-total) % num_ranks < num_ranks
        assert set(padded) <= set(everything)  # padding repeats real rows


@given(files=layouts(), num_ranks=st.integers(2, 4), epoch=st.integers(0, 2))
def test_same_rank_plan_for_any_worker_count(files, num_ranks, epoch):
    """A rank's rows do not depend on its worker count, so ranks need not agree on it."""

    def rank_rows(w: int) -> list[set[tuple[str, int]]]:
        spec = PlanSpec(files, RowGroupSplit(), num_ranks, w, True, 3, EqualBatches.DROP, 4)
        plan = plan_epoch(spec, epoch)
        by_path = {f.path: f for f in files}
        return [{r for c in plan.rank_chunks(k) for r in rows_of(c, by_path)} for k in range(num_ranks)]

    assert rank_rows(1) == rank_rows(3)


@given(rows=st.integers(0, 500), workers=st.integers(1, 9), batch_size=st.integers(1, 64))
def test_worker_quotas_give_ceil_batches(rows, workers, batch_size):
    quotas = worker_quotas(rows, workers, batch_size)
    assert sum(quotas) == rows
    assert sum(-(-q // batch_size) for q in quotas) == -(-rows // batch_size)
    assert sum(1 for q in quotas if q % batch_size) <= 1


def test_seven_uneven_chunks_over_three_ranks():
    """The issue's example: unequal chunks give 8/5/4 batches without equalizing."""
    sizes = [300, 100, 250, 50, 200, 120, 30]
    files = tuple(FileInfo(f"f{i}", n * 8, n) for i, n in enumerate(sizes))
    off = plan_epoch(PlanSpec(files, FileSplit(), 3, 1, equal_batches=EqualBatches.OFF, batch_size=64), 0)
    assert len({rank_batches(off, r, 64) for r in range(3)}) > 1
    on = plan_epoch(PlanSpec(files, FileSplit(), 3, 2, equal_batches=EqualBatches.DROP, batch_size=64), 0)
    assert [on.rank_rows(r) for r in range(3)] == [350, 350, 350]
    assert {rank_batches(on, r, 64) for r in range(3)} == {6}
    assert sum(c.num_rows or 0 for c in on.dropped) == 1050 - 1050  # 1050 % 3 == 0


def test_cut_skips_pruned_row_groups():
    f = FileInfo("a", 100, 100, (RowGroup(0, 0, 10), RowGroup(2, 30, 10), RowGroup(3, 40, 60)))
    head, tail = cut_chunk(Chunk.rows(f), f, 15)
    assert (head.start, head.stop, head.num_rows) == (0, 35, 15)
    assert (tail.start, tail.stop, tail.num_rows) == (35, 100, 65)


def test_unknown_row_counts_are_a_plan_error():
    files = (FileInfo("a.csv", 1000), FileInfo("b.csv", 500))
    spec = PlanSpec(files, FileSplit(), 2, 1, equal_batches=EqualBatches.DROP, batch_size=8)
    with pytest.raises(PlanError, match=r"exact row counts.*equal_batches='off'"):
        plan_epoch(spec, 0)


def test_one_rank_is_never_cut_dropped_or_padded():
    files = (FileInfo("a", 80, 10), FileInfo("b", 80, 7))
    for policy in EqualBatches:
        plan = plan_epoch(PlanSpec(files, FileSplit(), 1, 2, equal_batches=policy, batch_size=4), 0)
        assert sorted((c.path, c.start, c.stop) for c in plan.all_chunks()) == [("a", 0, 10), ("b", 0, 7)]
        assert plan.dropped == ()


def _left_out_rows(plan: EpochPlan, by_path: dict[str, FileInfo]) -> set[tuple[str, int]]:
    return {r for c in plan.dropped for r in rows_of(c, by_path)}


def test_case_8_rows_left_out_change_with_the_epoch_when_shuffling():
    """Issue 16, case 8: 16,033 rows on 3 ranks left out the same row in epochs 0, 1 and 2."""
    files = tuple(
        FileInfo(f"f{i}", n * 8, n, (RowGroup(0, 0, n, n * 8),)) for i, n in enumerate([5000, 4000, 7033])
    )
    by_path = {f.path: f for f in files}
    everything = set(live_row_ids(files))
    epochs = range(12)
    spec = PlanSpec(files, RowGroupSplit(), 3, 2, True, 0, EqualBatches.DROP, 32)
    left_out = [_left_out_rows(plan_epoch(spec, e), by_path) for e in epochs]
    assert all(len(rows) == 16_033 % 3 == 1 for rows in left_out)
    assert len(set().union(*left_out)) == len(left_out)  # another row every epoch
    for e, rows in zip(epochs, left_out, strict=True):
        plan = plan_epoch(spec, e)
        read = [r for rank in range(3) for c in plan.rank_chunks(rank) for r in rows_of(c, by_path)]
        assert sorted(read + sorted(rows)) == sorted(everything)  # every other row exactly once
    # Without shuffle the rows left out are the last rows in file order, every epoch.
    still = PlanSpec(files, RowGroupSplit(), 3, 2, False, 0, EqualBatches.DROP, 32)
    assert {frozenset(_left_out_rows(plan_epoch(still, e), by_path)) for e in epochs} == {
        frozenset({("f2", 7032)})
    }


def test_case_8_padding_rows_change_with_the_epoch_when_shuffling():
    files = tuple(FileInfo(f"f{i}", n * 8, n) for i, n in enumerate([50, 41, 30]))  # 121 rows on 4 ranks
    by_path = {f.path: f for f in files}
    spec = PlanSpec(files, FileSplit(), 4, 1, True, 9, EqualBatches.PAD, 8)
    repeated = []
    for e in range(8):
        plan = plan_epoch(spec, e)
        pads = [
            r for rank in range(4) for c in plan.rank_chunks(rank) if c.padding for r in rows_of(c, by_path)
        ]
        assert len(pads) == len(set(pads)) == (-121) % 4
        repeated.append(frozenset(pads))
    assert len(set(repeated)) > 4
    still = PlanSpec(files, FileSplit(), 4, 1, False, 9, EqualBatches.PAD, 8)
    plan = plan_epoch(still, 3)
    pads = [r for rank in range(4) for c in plan.rank_chunks(rank) if c.padding for r in rows_of(c, by_path)]
    assert sorted(pads) == [("f0", 0), ("f0", 1), ("f0", 2)]  # the first rows in file order
