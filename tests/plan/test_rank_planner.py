"""The per-rank planner's own seams: verification, given totals, caches, lazy plans."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import strategies as ts
from torch_dataloader_utils.config import EqualBatches
from torch_dataloader_utils.errors import OverlappingChunksError, PlanError
from torch_dataloader_utils.plan.planner import AUTO_VERIFY_RANKS, Planner, PlanSpec, plan_epoch, verify_plan
from torch_dataloader_utils.plan.splits import FileSplit, RowGroupSplit, resolve_strategy
from torch_dataloader_utils.plan.types import Chunk, FileInfo

FILES = tuple(FileInfo(f"f{i:02d}", 100, 10 + i) for i in range(30))


def test_large_worlds_check_a_rank_aware_strategy_on_demand() -> None:
    ranks = AUTO_VERIFY_RANKS + 1
    strategy = resolve_strategy(ts.EveryChunkOnEveryRank())
    spec = PlanSpec(FILES, strategy, ranks, 2)
    Planner(spec).rank_plan(0, 3, verify=True)  # not checked: each rank reads what it is given
    with pytest.raises(OverlappingChunksError, match=rf"'EveryChunkOnEveryRank' across {ranks} ranks"):
        Planner(PlanSpec(FILES, strategy, ranks, 2, verify=True)).rank_plan(0, 3, verify=True)
    with pytest.raises(OverlappingChunksError, match="reads rows twice"):
        verify_plan(spec, epochs=(0, 1))
    small = PlanSpec(FILES, strategy, AUTO_VERIFY_RANKS, 2)
    with pytest.raises(OverlappingChunksError):
        Planner(small).rank_plan(0, 3, verify=True)
    verify_plan(PlanSpec(FILES, resolve_strategy(ts.HalfFileSharded()), ranks, 2))
    verify_plan(PlanSpec(FILES, RowGroupSplit(), ranks, 2))


def test_rank_aware_strategy_is_called_for_this_rank_only() -> None:
    calls: list[int] = []

    class Recorder:
        def generate(
            self, files: Any, num_workers: int, epoch: int, *, num_ranks: int, rank: int
        ) -> list[Chunk]:
            calls.append(rank)
            return ts.half_file_chunks(files)[rank::num_ranks]

    spec = PlanSpec(FILES, resolve_strategy(Recorder()), 64, 2, True, 1)
    Planner(spec).rank_plan(0, 5)
    assert calls == [5]
    calls.clear()
    equal = PlanSpec(FILES, resolve_strategy(Recorder()), 64, 2, True, 1, EqualBatches.DROP, 4)
    planner = Planner(equal)
    expected = planner.rank_plan(0, 5).assignments()
    assert sorted(set(calls)) == list(range(64))  # every rank's row count is needed
    totals = planner.shares(0, 2).totals().tolist()
    calls.clear()
    given_totals = Planner(equal).rank_plan(0, 5, totals=totals)
    assert given_totals.assignments() == expected
    assert len(calls) < 64  # this rank and the ranks whose surplus it takes


@given(
    ts.layouts(), st.integers(2, 6), st.integers(1, 4), st.sampled_from([EqualBatches.DROP, EqualBatches.PAD])
)
def test_given_totals_give_the_same_plan(
    files: tuple[FileInfo, ...], ranks: int, workers: int, policy: Any
) -> None:
    spec = PlanSpec(files, resolve_strategy(ts.HalfFileSharded()), ranks, workers, True, 2, policy, 3)
    planner = Planner(spec)
    totals = planner.shares(1, workers).totals().tolist()
    for rank in range(ranks):
        assert (
            Planner(spec).rank_plan(1, rank, totals=totals).assignments()
            == planner.rank_plan(1, rank).assignments()
        )


def test_planner_pickles_without_its_plans_and_lazy_plans_pickle_as_tuples() -> None:
    planner = Planner(PlanSpec(FILES, RowGroupSplit(), 4, 2, True, 3, EqualBatches.DROP, 4))
    planner.rank_plan(0, 1)
    copy = pickle.loads(pickle.dumps(planner))
    assert copy.chunk_table() is not None
    assert not copy._plans
    assert copy.rank_plan(0, 1).assignments() == planner.rank_plan(0, 1).assignments()
    lazy = planner.epoch_plan(0)
    assert repr(lazy.assignments).startswith("LazyRanks(4 ranks, 0 planned)")
    assert lazy.chunks_for(2, 1) == planner.rank_plan(0, 2).chunks_for(1)
    assert pickle.loads(pickle.dumps(lazy)) == plan_epoch(planner.spec, 0) == lazy
    assert isinstance(pickle.loads(pickle.dumps(lazy)).assignments, tuple)


def test_unknown_rows_with_equal_batches_name_the_chunk() -> None:
    spec = PlanSpec(
        (FileInfo("a.csv", 100), FileInfo("b", 10, 4)), FileSplit(), 2, 1, equal_batches=EqualBatches.PAD
    )
    with pytest.raises(PlanError, match=r"chunk 'a.csv' \[0, 100\) bytes has an unknown row count"):
        Planner(spec).rank_plan(0, 1)
