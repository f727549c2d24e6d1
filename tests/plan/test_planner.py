"""``plan_epoch``: exactly once, identical everywhere, deterministic, balanced.

Properties run over random file layouts x split strategies (built-in, older-signature
and current-signature custom ones) x 1-16 ranks x 1-8 workers x epochs x shuffle.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import strategies as ts
from torch_dataloader_utils.errors import OverlappingChunksError, PlanError
from torch_dataloader_utils.plan.planner import PlanSpec, plan_epoch, rank_shares
from torch_dataloader_utils.plan.splits import FileSplit, RowGroupSplit, resolve_strategy
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, EpochPlan, FileInfo, RowGroup


@dataclass(frozen=True)
class Case:
    files: list[FileInfo]
    strategy: Any  # what the user passed, unresolved
    num_ranks: int
    num_workers: int
    shuffle: bool
    seed: int
    epoch: int

    def spec(self) -> PlanSpec:
        return PlanSpec(
            files=tuple(self.files),
            strategy=ts.quiet_resolve(self.strategy),
            num_ranks=self.num_ranks,
            num_workers=self.num_workers,
            shuffle=self.shuffle,
            seed=self.seed,
        )

    def independent_spec(self) -> PlanSpec:
        """The same values, rebuilt from scratch as another rank would."""
        return PlanSpec(
            files=tuple(ts.clone_files(self.files)),
            strategy=ts.quiet_resolve(ts.clone_strategy(self.strategy)),
            num_ranks=int(self.num_ranks),
            num_workers=int(self.num_workers),
            shuffle=bool(self.shuffle),
            seed=int(self.seed),
        )


cases = st.builds(
    Case,
    files=ts.file_layouts(),
    strategy=ts.split_strategies(),
    num_ranks=ts.num_ranks,
    num_workers=ts.num_workers,
    shuffle=st.booleans(),
    seed=ts.seeds,
    epoch=ts.epochs,
)


def _cells(plan: EpochPlan, files: list[FileInfo]) -> Counter[ts.Cell]:
    by_path = {f.path: f for f in files}
    return Counter(cell for c in plan.all_chunks() for cell in ts.chunk_cells(c, by_path))


# ---------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------


@ts.more_examples()
@given(cases)
def test_every_live_row_exactly_once_per_epoch(case: Case) -> None:
    plan = plan_epoch(case.spec(), case.epoch)
    assert _cells(plan, case.files) == ts.live_cells(case.files)
    assert (plan.epoch, plan.num_ranks, plan.num_workers) == (case.epoch, case.num_ranks, case.num_workers)
    assert plan.seed == (case.seed if case.shuffle else None)
    assert len(plan.assignments) == case.num_ranks
    assert all(len(rank) == case.num_workers for rank in plan.assignments)


@given(cases, st.lists(ts.epochs, min_size=1, max_size=3))
def test_every_epoch_is_exactly_once(case: Case, more_epochs: list[int]) -> None:
    spec = case.spec()
    expected = ts.live_cells(case.files)
    for epoch in more_epochs:
        assert _cells(plan_epoch(spec, epoch), case.files) == expected


@ts.more_examples()
@given(cases)
def test_every_rank_computes_the_same_plan(case: Case) -> None:
    plan = plan_epoch(case.spec(), case.epoch)
    # Another rank builds its spec from the same values, with no object in common.
    other = plan_epoch(case.independent_spec(), case.epoch)
    assert other == plan
    assert other is not plan
    assert plan_epoch(case.spec(), case.epoch) == plan  # determinism


@ts.more_examples()
@given(cases)
def test_lpt_bound_on_every_rank(case: Case) -> None:
    plan = plan_epoch(case.spec(), case.epoch)
    for rank in range(case.num_ranks):
        chunks = plan.rank_chunks(rank)
        if not chunks:
            continue
        loads = [sum(c.weight for c in plan.chunks_for(rank, w)) for w in range(case.num_workers)]
        assert max(loads) <= sum(loads) / case.num_workers + max(c.weight for c in chunks)


@ts.more_examples()
@given(cases)
def test_workers_keep_the_shuffled_order(case: Case) -> None:
    spec = case.spec()
    shares = rank_shares(spec, case.epoch)
    plan = plan_epoch(spec, case.epoch)
    for rank, share in enumerate(shares):
        position = {c: i for i, c in enumerate(share)}
        assert len(position) == len(share)
        assert Counter(plan.rank_chunks(rank)) == Counter(share)
        for w in range(case.num_workers):
            order = [position[c] for c in plan.chunks_for(rank, w)]
            assert order == sorted(order)


@given(cases.filter(lambda c: c.strategy.__class__ in (FileSplit, RowGroupSplit, ts.HalfFileLegacy)))
def test_rank_shares_are_a_slice_of_one_order(case: Case) -> None:
    """Strategies that return every chunk: shares are ``[rank::num_ranks]`` of one sequence."""
    spec = case.spec()
    shares = rank_shares(spec, case.epoch)
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    merged: list[Chunk] = []
    for i in range(max(sizes)):
        merged.extend(s[i] for s in shares if i < len(s))
    assert len(set(merged)) == len(merged)  # disjoint
    strategy = spec.strategy
    everything = strategy.split(spec.files, num_workers=spec.num_workers, epoch=case.epoch)  # type: ignore[union-attr]
    assert sorted(merged, key=_key) == sorted(everything, key=_key)  # union = all
    if not case.shuffle:
        assert merged == everything  # shuffle off: file order


def _key(c: Chunk) -> tuple[str, int, int]:
    return (c.path, c.start, c.stop)


@given(cases.filter(lambda c: c.shuffle), ts.epochs)
def test_shuffle_depends_on_epoch_only_through_the_order(case: Case, other_epoch: int) -> None:
    spec = case.spec()
    a, b = plan_epoch(spec, case.epoch), plan_epoch(spec, other_epoch)
    assert sorted(a.all_chunks(), key=_key) == sorted(b.all_chunks(), key=_key)


@given(cases.filter(lambda c: not c.shuffle), ts.epochs)
def test_without_shuffle_every_epoch_has_the_same_plan(case: Case, other_epoch: int) -> None:
    spec = case.spec()
    a, b = plan_epoch(spec, case.epoch), plan_epoch(spec, other_epoch)
    assert a.assignments == b.assignments


# ---------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------


def _many_files(n: int = 40) -> tuple[FileInfo, ...]:
    return tuple(FileInfo(f"f{i:03d}", 100, 10 + i % 3) for i in range(n))


def _order(spec: PlanSpec, epoch: int) -> list[str]:
    return [c.path for c in rank_shares(spec, epoch)[0]]


def test_seed_42_epoch_1_differs_from_seed_43_epoch_0() -> None:
    files = _many_files()
    a = plan_epoch(PlanSpec(files, FileSplit(), num_workers=2, shuffle=True, seed=42), 1)
    b = plan_epoch(PlanSpec(files, FileSplit(), num_workers=2, shuffle=True, seed=43), 0)
    assert a.assignments != b.assignments
    assert _order(PlanSpec(files, FileSplit(), shuffle=True, seed=42), 1) != _order(
        PlanSpec(files, FileSplit(), shuffle=True, seed=43), 0
    )


def test_shuffle_changes_with_epoch_and_off_keeps_file_order() -> None:
    files = _many_files()
    on = PlanSpec(files, FileSplit(), shuffle=True, seed=7)
    orders = [_order(on, e) for e in range(5)]
    assert len({tuple(o) for o in orders}) == 5
    assert all(sorted(o) == [f.path for f in files] for o in orders)
    off = PlanSpec(files, FileSplit(), shuffle=False, seed=7)
    assert _order(off, 0) == _order(off, 3) == [f.path for f in files]


def test_shuffle_changes_each_ranks_share_between_epochs() -> None:
    spec = PlanSpec(_many_files(), FileSplit(), num_ranks=4, shuffle=True, seed=1)
    # Slicing comes after the shuffle, so a rank's *set* of chunks changes, not only its order.
    assert set(rank_shares(spec, 0)[2]) != set(rank_shares(spec, 1)[2])


def test_rank_aware_shares_are_shuffled_per_epoch() -> None:
    files = _many_files()
    strategy = resolve_strategy(ts.HalfFileSharded())
    on = PlanSpec(files, strategy, num_ranks=2, shuffle=True, seed=9)
    unshuffled = ts.half_file_chunks(files)[1::2]
    shares = [rank_shares(on, e)[1] for e in range(3)]
    assert all(sorted(s, key=_key) == unshuffled for s in shares)
    assert len({tuple(s) for s in shares}) == 3
    assert rank_shares(PlanSpec(files, strategy, num_ranks=2), 4)[1] == unshuffled


def test_balanced_with_shuffle_off_example() -> None:
    # Sorted files with growing sizes: a round-robin deal would give worker 0 all the small ones.
    files = tuple(FileInfo(f"f{i:02d}", 10, i + 1) for i in range(12))
    plan = plan_epoch(PlanSpec(files, FileSplit(), num_workers=3), 0)
    assert [plan.rows_for(0, w) for w in range(3)] == [26, 26, 26]


def test_equal_weights_are_dealt_in_shuffled_order() -> None:
    files = tuple(FileInfo(f"f{i:02d}", 10, 5) for i in range(10))
    spec = PlanSpec(files, FileSplit(), num_workers=3, shuffle=True, seed=3)
    share = rank_shares(spec, 2)[0]
    plan = plan_epoch(spec, 2)
    assert [list(plan.chunks_for(0, w)) for w in range(3)] == [share[w::3] for w in range(3)]


def test_empty_dataset_plans_empty_workers() -> None:
    plan = plan_epoch(PlanSpec((), RowGroupSplit(), num_ranks=3, num_workers=2, shuffle=True), 0)
    assert plan.assignments == (((), ()),) * 3


def test_more_ranks_than_chunks_leaves_some_ranks_empty() -> None:
    files = (FileInfo("a", 10, 5), FileInfo("b", 10, 5))
    plan = plan_epoch(PlanSpec(files, FileSplit(), num_ranks=5, num_workers=2), 0)
    assert [len(plan.rank_chunks(r)) for r in range(5)] == [1, 1, 0, 0, 0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_ranks": 0}, "num_ranks must be >= 1, got 0"),
        ({"num_workers": 0}, "num_workers must be >= 1 in a plan, got 0"),
        ({"seed": -1}, "seed must be >= 0, got -1"),
    ],
)
def test_plan_spec_rejects_bad_values(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlanSpec((), FileSplit(), **kwargs)


def test_negative_epoch_is_rejected() -> None:
    with pytest.raises(ValueError, match="epoch must be >= 0, got -1"):
        plan_epoch(PlanSpec((), FileSplit()), -1)


# ---------------------------------------------------------------------------------------
# Custom strategies
# ---------------------------------------------------------------------------------------


@given(ts.file_layouts(min_files=1), st.integers(2, 16), ts.num_workers, st.booleans())
def test_older_strategy_warns_once_and_is_sharded_without_overlap(
    files: list[FileInfo], ranks: int, workers: int, shuffle: bool
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = PlanSpec(tuple(files), resolve_strategy(ts.HalfFileLegacy()), ranks, workers, shuffle, 5)
        plans = [plan_epoch(spec, e) for e in range(3)]
    assert len(caught) == 1
    assert caught[0].category is UserWarning
    assert "[rank::num_ranks]" in str(caught[0].message)
    expected = ts.live_cells(files)
    everything = ts.half_file_chunks(files)
    for plan in plans:
        assert _cells(plan, files) == expected
        shares = [set(plan.rank_chunks(r)) for r in range(ranks)]
        for r in range(ranks):
            # No rank reads the whole dataset (when there is more than one chunk to share).
            if len(everything) > 1:
                assert len(shares[r]) < len(everything)
            for s in range(r):
                assert not shares[r] & shares[s]


@given(ts.file_layouts(min_files=1), st.integers(2, 16), ts.num_workers, st.booleans(), ts.epochs)
def test_current_strategy_that_does_not_shard_is_refused(
    files: list[FileInfo], ranks: int, workers: int, shuffle: bool, epoch: int
) -> None:
    spec = PlanSpec(tuple(files), resolve_strategy(ts.EveryChunkOnEveryRank()), ranks, workers, shuffle, 0)
    if not ts.half_file_chunks(files):
        assert plan_epoch(spec, epoch).all_chunks() == []
        return
    with pytest.raises(
        OverlappingChunksError, match=r"'EveryChunkOnEveryRank' across \d+ ranks reads rows twice"
    ):
        plan_epoch(spec, epoch)


def test_current_strategy_that_does_not_shard_is_fine_on_one_rank() -> None:
    files = (FileInfo("a", 10, 5), FileInfo("t", 9))
    plan = plan_epoch(PlanSpec(files, resolve_strategy(ts.EveryChunkOnEveryRank())), 0)
    assert _cells(plan, list(files)) == ts.live_cells(files)


def test_current_strategy_receives_world_and_epoch() -> None:
    calls: list[tuple[int, int, int, int]] = []

    class Recorder:
        def generate(
            self, files: Any, num_workers: int, epoch: int, *, num_ranks: int, rank: int
        ) -> list[Chunk]:
            calls.append((num_workers, epoch, num_ranks, rank))
            return ts.half_file_chunks(files)[rank::num_ranks]

    plan_epoch(PlanSpec((FileInfo("a", 10, 5),), resolve_strategy(Recorder()), 3, 2), 4)
    assert calls == [(2, 4, 3, 0), (2, 4, 3, 1), (2, 4, 3, 2)]


class _Returns:
    """A current-signature strategy returning fixed items on rank 0."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def generate(self, files: Any, num_workers: int, epoch: int, *, num_ranks: int, rank: int) -> list[Any]:
        return self.items if rank == 0 else []


class _ReturnsAll:
    """An older-signature strategy returning fixed items."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def generate(self, files: Any, num_workers: int, epoch: int) -> list[Any]:
        return self.items


_DATA = (FileInfo("a", 100, 10), FileInfo("t", 50))


@pytest.mark.parametrize("wrapper", [_Returns, _ReturnsAll])
@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([Chunk("nope", 0, 3)], r"chunk of 'nope', which is not one of the dataset's files"),
        ([Chunk("a", 5, 11)], r"chunk 'a' \[5, 11\) rows, outside the file's \[0, 10\)"),
        ([Chunk("t", 40, 60, ChunkUnit.BYTES)], r"chunk 't' \[40, 60\) bytes, outside the file's \[0, 50\)"),
        ([Chunk("t", 0, 3)], r"row-range chunk of 't', whose row count is unknown"),
        (["a"], r"returned 'a'; expected Chunk objects"),
        ([{"path": "a"}], r"returned \{'path': 'a'\}; expected Chunk objects"),
        ([Chunk("a", 0, 5), None], r"returned None; expected Chunk objects"),
    ],
)
def test_strategy_returning_bad_chunks_is_a_plan_error(wrapper: type, items: list[Any], message: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy = resolve_strategy(wrapper(items))
    with pytest.raises(PlanError, match=message) as info:
        plan_epoch(PlanSpec(_DATA, strategy, num_ranks=2), 0)
    assert not isinstance(info.value, OverlappingChunksError)
    assert wrapper.__name__ in str(info.value)


@pytest.mark.parametrize("wrapper", [_Returns, _ReturnsAll])
def test_strategy_returning_overlapping_chunks_is_refused(wrapper: type) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy = resolve_strategy(wrapper([Chunk("a", 0, 6), Chunk("a", 5, 10)]))
    with pytest.raises(OverlappingChunksError, match=r"\[0, 6\) and \[5, 10\) of 'a' overlap"):
        plan_epoch(PlanSpec(_DATA, strategy, num_ranks=2), 0)


def test_custom_chunks_get_exact_row_counts_for_balancing() -> None:
    f = FileInfo("a", 100, 30, (RowGroup(0, 0, 10), RowGroup(2, 20, 10)))  # rows [10, 20) pruned
    strategy = resolve_strategy(_Returns([Chunk("a", 0, 15), Chunk("a", 15, 30)]))
    plan = plan_epoch(PlanSpec((f,), strategy), 0)
    assert sorted((c.start, c.num_rows) for c in plan.all_chunks()) == [(0, 10), (15, 10)]
