"""0.2.0-style custom strategies (both signatures, returning Shard/Split) keep our guarantees."""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import row_group_files
from torch_dataloader_utils import OverlappingChunksError, PlanError
from torch_dataloader_utils.config import EqualBatches
from torch_dataloader_utils.plan.planner import PlanSpec, plan_epoch
from torch_dataloader_utils.plan.splits import resolve_strategy
from torch_dataloader_utils.plan.types import FileInfo
from torch_dataloader_utils.splits.core import DataFileInfo, RowRange, Shard, Split
from torch_dataloader_utils.splits.target_size import TargetSizeSplitStrategy


class OlderHalves:
    """0.2.0 V1 signature: every file cut in two halves, one Shard per worker."""

    def generate(self, files: list[DataFileInfo], num_workers: int, epoch: int) -> list[Shard]:
        shards = [Shard(id=i) for i in range(num_workers)]
        k = 0
        for f in files:
            n = f.record_count
            if not n:
                continue
            half = n // 2
            for offset, length in ((0, half), (half, n - half)):
                if length:
                    shards[k % num_workers].splits.append(Split(f, RowRange(offset, length)))
                    k += 1
        return shards


class RankAwareWhole:
    """0.2.0 V2 signature (num_ranks / rank with defaults): whole files, [rank::num_ranks]."""

    def generate(
        self, files: list[DataFileInfo], num_workers: int, epoch: int, num_ranks: int = 1, rank: int = 0
    ) -> list[Shard]:
        mine = [f for f in files if f.record_count][rank::num_ranks]
        return [Shard(id=w, splits=[Split(f) for f in mine[w::num_workers]]) for w in range(num_workers)]


class ReadmeStyle:
    """The README's form: ``-> list[Split]`` (flat)."""

    def generate(self, files: list[Any], num_workers: int, epoch: int) -> list[Split]:
        return [Split(file=f) for f in files]


def _rows_read(files: list[FileInfo], strategy: Any, ranks: int, workers: int, epoch: int) -> Counter[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resolved = resolve_strategy(strategy)
    spec = PlanSpec(
        files=tuple(files),
        strategy=resolved,
        num_ranks=ranks,
        num_workers=workers,
        shuffle=True,
        seed=3,
        equal_batches=EqualBatches.OFF,
        batch_size=4,
    )
    plan = plan_epoch(spec, epoch)
    seen: Counter[Any] = Counter()
    by_path = {f.path: f for f in files}
    for r in range(ranks):
        for w in range(workers):
            for c in plan.chunks_for(r, w):
                f = by_path[c.path]
                for row in range(c.start, c.stop):
                    if f.rows_in(row, row + 1):
                        seen[(c.path, row)] += 1
    return seen


def _expected(files: list[FileInfo]) -> set[Any]:
    return {(f.path, row) for f in files for row in range(f.num_rows or 0) if f.rows_in(row, row + 1)}


@settings(max_examples=40, deadline=None)
@given(
    files=row_group_files(),
    strategy=st.sampled_from(
        [OlderHalves(), RankAwareWhole(), ReadmeStyle(), TargetSizeSplitStrategy(target_rows=7)]
    ),
    ranks=st.integers(1, 4),
    workers=st.integers(1, 3),
    epoch=st.integers(0, 3),
)
def test_every_row_exactly_once(
    files: list[FileInfo], strategy: Any, ranks: int, workers: int, epoch: int
) -> None:
    seen = _rows_read(files, strategy, ranks, workers, epoch)
    assert set(seen) == _expected(files)
    assert set(seen.values()) <= {1}


def test_older_signature_is_sharded_by_rank(tmp_path: Any) -> None:
    files = [FileInfo(f"f{i}", 100, num_rows=10) for i in range(4)]
    with pytest.warns(UserWarning, match=r"\[rank::num_ranks\]"):
        resolved = resolve_strategy(ReadmeStyle())
    spec = PlanSpec(
        files=tuple(files),
        strategy=resolved,
        num_ranks=2,
        num_workers=1,
        shuffle=False,
        seed=0,
        equal_batches=EqualBatches.OFF,
        batch_size=4,
    )
    plan = plan_epoch(spec, 0)
    r0 = {c.path for c in plan.rank_chunks(0)}
    r1 = {c.path for c in plan.rank_chunks(1)}
    assert r0
    assert r1
    assert not r0 & r1
    assert r0 | r1 == {f.path for f in files}


class Overlapping:
    def generate(
        self, files: list[Any], num_workers: int, epoch: int, num_ranks: int = 1, rank: int = 0
    ) -> list[Shard]:
        return [Shard(id=0, splits=[Split(f) for f in files])]  # every rank takes every file


def test_rank_aware_overlap_is_caught() -> None:
    files = [FileInfo(f"f{i}", 100, num_rows=10) for i in range(2)]
    spec = PlanSpec(
        files=tuple(files),
        strategy=resolve_strategy(Overlapping()),
        num_ranks=2,
        num_workers=1,
        shuffle=False,
        seed=0,
        equal_batches=EqualBatches.OFF,
        batch_size=4,
    )
    with pytest.raises(OverlappingChunksError):
        plan_epoch(spec, 0)


class UnknownFile:
    def generate(self, files: list[Any], num_workers: int, epoch: int) -> list[Split]:
        return [Split(DataFileInfo("nope.parquet"))]


def test_split_of_unknown_file_is_a_plan_error() -> None:
    files = [FileInfo("f0", 100, num_rows=10)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resolved = resolve_strategy(UnknownFile())
    spec = PlanSpec(
        files=tuple(files),
        strategy=resolved,
        num_ranks=1,
        num_workers=1,
        shuffle=False,
        seed=0,
        equal_batches=EqualBatches.OFF,
        batch_size=4,
    )
    with pytest.raises(PlanError, match=r"nope\.parquet"):
        plan_epoch(spec, 0)


def test_builtin_generate_gives_shards_of_this_rank() -> None:
    files = [FileInfo(f"f{i}", 100, num_rows=10) for i in range(5)]
    strategy = TargetSizeSplitStrategy()
    out = [strategy.generate(files, 2, 0, num_ranks=2, rank=r) for r in range(2)]
    paths = [s.file.path for shards in out for shard in shards for s in shard.splits]
    assert sorted(paths) == sorted(f.path for f in files)
    assert all(len(shards) == 2 for shards in out)
