"""Value types: FileInfo row arithmetic against a brute-force oracle, Chunk, World, EpochPlan."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import clone_files, file_layouts, row_group_files
from torch_dataloader_utils.plan.types import (
    Chunk,
    ChunkUnit,
    EpochPlan,
    FileInfo,
    RowGroup,
    World,
    total_rows,
)


def _live_rows(f: FileInfo) -> list[int]:
    if f.row_groups is None:
        assert f.num_rows is not None
        return list(range(f.num_rows))
    return [r for g in f.row_groups for r in range(g.first_row, g.stop_row)]


@st.composite
def _file_and_range(draw: st.DrawFn) -> tuple[FileInfo, int, int]:
    files = draw(file_layouts(min_files=1).filter(lambda fs: any(f.num_rows is not None for f in fs)))
    f = draw(st.sampled_from([f for f in files if f.num_rows is not None]))
    assert f.num_rows is not None
    start = draw(st.integers(-5, f.num_rows + 5))
    stop = draw(st.integers(-5, f.num_rows + 5))
    return f, start, stop


@given(_file_and_range())
def test_rows_in_counts_live_rows_in_range(case: tuple[FileInfo, int, int]) -> None:
    f, start, stop = case
    expected = sum(1 for r in _live_rows(f) if start <= r < stop)
    assert f.rows_in(start, stop) == expected


@given(_file_and_range())
def test_groups_in_are_the_groups_holding_rows_in_range(case: tuple[FileInfo, int, int]) -> None:
    f, start, stop = case
    got = f.groups_in(start, stop)
    if f.row_groups is None:
        assert got == ()
        return
    holding = [g for g in f.row_groups if any(start <= r < stop for r in range(g.first_row, g.stop_row))]
    # Empty groups hold no row; whether one is listed does not change what is read.
    assert [g for g in got if g.num_rows > 0] == holding
    assert all(g in f.row_groups for g in got)
    assert list(got) == sorted(got, key=lambda g: g.index)


@given(row_group_files())
def test_live_rows_counts_unpruned_rows_only(files: list[FileInfo]) -> None:
    for f in files:
        assert f.live_rows == len(_live_rows(f))
        assert f.num_rows is not None
        assert f.live_rows <= f.num_rows
        assert f.rows_in(0, f.num_rows) == f.live_rows


def test_rows_in_skips_pruned_and_empty_groups() -> None:
    groups = (RowGroup(0, 0, 10), RowGroup(1, 10, 0), RowGroup(3, 25, 5))  # group 2 [10, 25) pruned
    f = FileInfo("f", 100, 30, groups)
    assert f.rows_in(0, 30) == 15
    assert f.rows_in(5, 27) == 7
    assert f.rows_in(10, 25) == 0
    assert f.groups_in(10, 25) == ()
    assert f.groups_in(9, 26) == groups
    assert f.live_rows == 15


def test_rows_in_of_unknown_row_count_names_the_file() -> None:
    with pytest.raises(ValueError, match=r"row count of 'x\.jsonl' is unknown"):
        FileInfo("x.jsonl", 10).rows_in(0, 1)


def test_file_info_equality_ignores_the_cached_index_and_survives_pickle() -> None:
    f = FileInfo("a", 10, 4, (RowGroup(0, 0, 2, 5), RowGroup(1, 2, 2, 5)), mtime=1.5)
    (g,) = clone_files([f])
    assert f == g
    assert hash(f) == hash(g)
    for h in (pickle.loads(pickle.dumps(f)), copy.deepcopy(f)):
        assert h == f
        assert h.rows_in(1, 3) == 2
        assert h.groups_in(1, 3) == f.row_groups


def test_chunk_constructors() -> None:
    f = FileInfo("a", 100, 20, (RowGroup(0, 0, 10, 50), RowGroup(2, 15, 5, 25)))
    c = Chunk.rows(f)
    assert (c.start, c.stop, c.unit, c.num_rows) == (0, 20, ChunkUnit.ROWS, 15)
    assert c.num_bytes == 100 * 15 // 20
    assert c.weight == 15
    part = Chunk.rows(f, 5, 16)
    assert part.num_rows == 6
    b = Chunk.bytes(FileInfo("t", 64), 10, 40)
    assert (b.start, b.stop, b.unit, b.num_rows, b.num_bytes) == (10, 40, ChunkUnit.BYTES, None, 30)
    assert b.weight == 30
    assert Chunk.bytes(FileInfo("t", 64)).stop == 64
    assert Chunk.rows(FileInfo("e", 8, 0)).num_bytes == 0
    with pytest.raises(ValueError, match=r"unknown; use Chunk\.bytes"):
        Chunk.rows(FileInfo("t", 64))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_ranks": 0}, ValueError, r"num_ranks must be >= 1, got 0"),
        ({"num_ranks": -3}, ValueError, r"num_ranks must be >= 1, got -3"),
        ({"num_ranks": 4, "rank": 4}, ValueError, r"rank must be in \[0, num_ranks=4\), got 4"),
        ({"num_ranks": 4, "rank": -1}, ValueError, r"rank must be in \[0, num_ranks=4\), got -1"),
        ({"num_ranks": 2.0}, TypeError, r"num_ranks must be an int, got 2\.0"),
        ({"num_ranks": True}, TypeError, r"num_ranks must be an int, got True"),
        ({"rank": "0"}, TypeError, r"rank must be an int, got '0'"),
        ({"rank": False}, TypeError, r"rank must be an int, got False"),
    ],
)
def test_world_rejects_bad_values(kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        World(**kwargs)  # type: ignore[arg-type]


@given(st.integers(1, 1000).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
def test_world_accepts_every_valid_rank(case: tuple[int, int]) -> None:
    n, r = case
    w = World(num_ranks=n, rank=r)
    assert (w.num_ranks, w.rank) == (n, r)
    assert World() == World(1, 0)


def test_epoch_plan_accessors() -> None:
    a = Chunk("a", 0, 5, ChunkUnit.ROWS, 5)
    b = Chunk("b", 0, 3, ChunkUnit.ROWS, 3)
    t = Chunk("t", 0, 9, ChunkUnit.BYTES, None, 9)
    plan = EpochPlan(epoch=2, seed=7, num_ranks=2, num_workers=2, assignments=(((a,), (b, a)), ((), (t,))))
    assert plan.chunks_for(0, 1) == (b, a)
    assert plan.rank_chunks(0) == [a, b, a]
    assert plan.all_chunks() == [a, b, a, t]
    assert plan.rows_for(0, 1) == 8
    assert plan.rows_for(1, 0) == 0
    assert plan.rows_for(1, 1) is None
    assert total_rows([a, b]) == 8
    assert total_rows([a, t]) is None
    assert pickle.loads(pickle.dumps(plan)) == plan
