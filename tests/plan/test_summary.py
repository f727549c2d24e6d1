"""plan/summary.py: figures equal to the plan they summarize; layout issues from values alone."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests import strategies as ts
from torch_dataloader_utils.errors import PlanError
from torch_dataloader_utils.plan.planner import LazyRanks, Planner, PlanSpec, plan_epoch
from torch_dataloader_utils.plan.splits import RowGroupSplit
from torch_dataloader_utils.plan.summary import (
    FileSummary,
    PlanSummary,
    Spread,
    histogram,
    layout_issues,
    summarize_files,
    summarize_plan,
)
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, EqualBatches, FileInfo, RowGroup


@given(
    files=ts.row_group_files(),
    ranks=st.integers(1, 6),
    workers=st.integers(1, 4),
    policy=st.sampled_from(list(EqualBatches)),
    shuffle=st.booleans(),
)
def test_figures_equal_the_plan(
    files: list[FileInfo], ranks: int, workers: int, policy: EqualBatches, shuffle: bool
) -> None:
    spec = PlanSpec(
        files=tuple(files),
        strategy=RowGroupSplit(),
        num_ranks=ranks,
        num_workers=workers,
        shuffle=shuffle,
        equal_batches=policy,
        batch_size=3,
    )
    plan = plan_epoch(spec, 1)
    s = summarize_plan(plan)
    assert s.rows is not None
    for r in range(ranks):
        assert int(s.rows[r].sum()) == plan.rank_rows(r)
        for w in range(workers):
            chunks = plan.chunks_for(r, w)
            assert s.rows[r, w] == plan.rows_for(r, w)
            assert s.chunks[r, w] == len(chunks)
            assert s.bytes[r, w] == sum(c.num_bytes for c in chunks)
    everything = plan.all_chunks()
    assert s.total_chunks == len(everything)
    assert s.rows_dropped == sum(c.num_rows or 0 for c in plan.dropped)
    assert s.rows_padded == sum(c.num_rows or 0 for c in everything if c.padding)
    live = sum(f.live_rows or 0 for f in files)
    assert s.total_rows == live - s.rows_dropped + s.rows_padded
    assert s.idle_ranks == [r for r in range(ranks) if not plan.rank_chunks(r)]
    assert s.idle_workers == [
        (r, w)
        for r in range(ranks)
        for w in range(workers)
        if plan.rank_chunks(r) and not plan.chunks_for(r, w)
    ]
    spread = s.rank_spread("rows")
    assert spread is not None
    assert spread.total == s.total_rows
    assert spread.min <= spread.mean <= spread.max
    if spread.imbalance is not None:
        assert spread.imbalance >= 1.0
    if policy is not EqualBatches.OFF and ranks > 1:
        assert spread.min == spread.max  # equal batches: equal rows per rank
    if everything:
        assert s.largest_chunk is not None
        assert s.largest_chunk.weight == max(c.weight for c in everything)


def _figures(s: PlanSummary) -> dict[str, Any]:
    arrays = {
        name: None if getattr(s, name) is None else getattr(s, name).tolist()
        for name in ("rows", "bytes", "chunks")
    }
    return {
        **s.as_dict(),
        **arrays,
        "largest_chunk": s.largest_chunk,
        "median_chunk_rows": s.median_chunk_rows,
    }


@given(
    files=st.one_of(ts.row_group_files(max_files=8), ts.rich_layouts(max_files=8)),
    strategy=st.one_of(ts.rich_splits(), st.just(ts.HalfFileLegacy()), st.just(ts.HalfFileSharded())),
    ranks=st.integers(1, 5),
    workers=st.integers(1, 3),
    policy=st.sampled_from(list(EqualBatches)),
    shuffle=st.booleans(),
    epoch=st.integers(0, 3),
)
def test_summary_from_columns_equals_summary_from_chunks(
    files: list[FileInfo],
    strategy: Any,
    ranks: int,
    workers: int,
    policy: EqualBatches,
    shuffle: bool,
    epoch: int,
) -> None:
    """The planner's plan is summarized from its parts as columns: the same figures as from its chunks."""

    def spec(strategy: Any) -> PlanSpec:
        return PlanSpec(
            files=tuple(files),
            strategy=ts.quiet_resolve(strategy),
            num_ranks=ranks,
            num_workers=workers,
            shuffle=shuffle,
            equal_batches=policy,
            batch_size=2,
        )

    try:
        by_chunks = summarize_plan(plan_epoch(spec(strategy), epoch))
    except PlanError:  # equal batches over unknown row counts: both ways
        return
    plan = Planner(spec(strategy)).epoch_plan(epoch)
    assert isinstance(plan.assignments, LazyRanks)
    assert _figures(summarize_plan(plan)) == _figures(by_chunks)
    table = FileTable.from_infos(files)
    assert summarize_files(table) == summarize_files(files)


def test_summary_from_columns_counts_whole_chunks_of_padding() -> None:
    """One-row chunks: the padding repeats a whole chunk (flagged by the part, not the chunk)."""
    files = tuple(FileInfo(f"f{i}", 10, 1, (RowGroup(0, 0, 1, 10),)) for i in range(3))
    spec = PlanSpec(files=files, strategy=RowGroupSplit(), num_ranks=2, equal_batches=EqualBatches.PAD)
    s = summarize_plan(Planner(spec).epoch_plan(0))
    assert s.rows_padded == 1
    assert _figures(s) == _figures(summarize_plan(plan_epoch(spec, 0)))


def test_spread_and_histogram() -> None:
    s = Spread.of([2, 4, 6])
    assert (s.count, s.total, s.min, s.max, s.mean, s.imbalance) == (3, 12, 2, 6, 4, 1.5)
    assert Spread.of([]).imbalance is None
    assert histogram([1, 1, 1]) == [(1.0, 1.0, 3)]
    bins = histogram(list(range(10)), bins=3)
    assert [c for _, _, c in bins] == [3, 3, 4]
    assert bins[0][0] == 0
    assert bins[-1][1] == 9
    assert histogram([]) == []


def test_file_summary_counts_pruned_rows() -> None:
    files = [
        FileInfo("a", 100, 30, (RowGroup(0, 0, 10), RowGroup(2, 20, 10))),  # group 1 pruned
        FileInfo("b", 300, 20, ()),  # every group pruned
    ]
    s = summarize_files(files)
    assert (s.files, s.bytes, s.rows, s.live_rows, s.pruned_rows, s.empty_files) == (2, 400, 50, 20, 30, 1)
    assert s.median_size == 200
    text = summarize_files([FileInfo("t", 10)])
    assert text.rows is None
    assert text.pruned_rows is None


def _plan(weights: list[int], ranks: int = 1, workers: int = 1) -> EpochPlan:
    chunks = [Chunk(f"f{i}", 0, n, num_rows=n) for i, n in enumerate(weights)]
    per = [
        [chunks[i] for i in range(len(chunks)) if i % (ranks * workers) == r * workers + w]
        for r in range(ranks)
        for w in range(workers)
    ]
    return EpochPlan(
        0,
        None,
        ranks,
        workers,
        tuple(tuple(tuple(per[r * workers + w]) for w in range(workers)) for r in range(ranks)),
    )


def test_layout_issues() -> None:
    assert layout_issues(summarize_plan(_plan([100] * 8, 2, 2))) == []
    kinds = [i.kind for i in layout_issues(summarize_plan(_plan([100, 100, 100], 2, 2)))]
    assert kinds == ["idle_workers"]
    assert [i.kind for i in layout_issues(summarize_plan(_plan([100], 3, 1)))] == ["idle_ranks"]
    big = layout_issues(summarize_plan(_plan([800, 100, 100])))
    assert [i.kind for i in big] == ["large_chunk"]
    assert "f0[0:800) holds 800 rows, 8x the median" in big[0].message
    assert layout_issues(summarize_plan(_plan([799, 100, 100]))) == []
    small = FileSummary(
        files=300, bytes=300 * 2**20, rows=1, live_rows=1, row_groups=300, sizes=(2**20,) * 300
    )
    [issue] = layout_issues(summarize_plan(_plan([100] * 3)), small)
    assert issue.kind == "small_files"
    assert "about 2 files of ~128.0 MiB" in issue.message
    plan = summarize_plan(_plan([100] * 3))
    assert [i.kind for i in layout_issues(plan, shuffle=True, batch_size=100)] == ["one_file_batches"]
    assert layout_issues(plan, shuffle=True, batch_size=101) == []
    assert layout_issues(plan, shuffle=True, row_window=400, batch_size=10) == []
    assert layout_issues(plan, shuffle=False, batch_size=10) == []
    assert np.array_equal(plan.per_rank("rows"), [300])
