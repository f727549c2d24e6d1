"""Split strategies: built-in packing, custom-strategy resolution and chunk validation."""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import (
    EveryChunkOnEveryRank,
    HalfFileLegacy,
    HalfFileSharded,
    builtin_splits,
    chunk_cells,
    file_layouts,
    half_file_chunks,
    live_cells,
    more_examples,
    row_group_files,
)
from torch_dataloader_utils.errors import ConfigError, OverlappingChunksError, PlanError
from torch_dataloader_utils.plan.splits import (
    FileSplit,
    LegacySplitStrategy,
    RankAwareStrategy,
    RowGroupSplit,
    SplitStrategy,
    check_no_overlap,
    normalize_chunks,
    resolve_strategy,
)
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo, RowGroup

# ---------------------------------------------------------------------------------------
# Built-in strategies
# ---------------------------------------------------------------------------------------


@more_examples()
@given(file_layouts(), builtin_splits())
def test_builtin_split_covers_every_live_row_exactly_once(
    files: list[FileInfo], split: FileSplit | RowGroupSplit
) -> None:
    by_path = {f.path: f for f in files}
    chunks = split.split(files)
    yielded = Counter(cell for c in chunks for cell in chunk_cells(c, by_path))
    assert yielded == live_cells(files)
    # Chunks carry exact counts, no empty chunk is planned, and file order is kept.
    for c in chunks:
        f = by_path[c.path]
        if c.unit is ChunkUnit.ROWS:
            assert c.num_rows == f.rows_in(c.start, c.stop) > 0
        else:
            assert f.num_rows is None
            assert c.num_bytes == c.stop - c.start > 0
    assert normalize_chunks(chunks, by_path, split.name) == chunks
    check_no_overlap(chunks)
    paths = [c.path for c in chunks]
    assert paths == sorted(paths)


@given(file_layouts())
def test_file_split_is_one_chunk_per_nonempty_file(files: list[FileInfo]) -> None:
    chunks = FileSplit().split(files)
    expected = [f.path for f in files if (f.live_rows if f.num_rows is not None else f.size)]
    assert [c.path for c in chunks] == expected
    for c in chunks:
        f = next(f for f in files if f.path == c.path)
        assert (c.start, c.stop) == (0, f.num_rows if f.num_rows is not None else f.size)


@more_examples()
@given(
    row_group_files(),
    st.none() | st.integers(1, 1500),
    st.none() | st.integers(1, 120),
)
def test_row_group_packing(files: list[FileInfo], split_bytes: int | None, split_rows: int | None) -> None:
    split = RowGroupSplit(split_bytes=split_bytes, split_rows=split_rows)
    chunks = split.split(files)
    for f in files:
        assert f.row_groups is not None
        nonempty = [g for g in f.row_groups if g.num_rows > 0]
        mine = [c for c in chunks if c.path == f.path]
        runs = [[g for g in nonempty if c.start <= g.first_row and g.stop_row <= c.stop] for c in mine]
        # Every non-empty live group is in exactly one chunk, in file order, and each
        # chunk is a run of consecutive groups starting and ending on group edges.
        assert [g for run in runs for g in run] == nonempty
        for c, run in zip(mine, runs, strict=True):
            assert run
            assert (c.start, c.stop) == (run[0].first_row, run[-1].stop_row)
            assert c.num_rows == sum(g.num_rows for g in run)
            assert c.num_bytes == sum(g.num_bytes for g in run)
            if len(run) > 1:  # only a single oversized group may exceed a target
                assert split_bytes is None or c.num_bytes <= split_bytes
                assert split_rows is None or c.num_rows <= split_rows
            if split_bytes is None and split_rows is None:
                assert len(run) == 1
        # Greedy: a chunk closes only because the next group would exceed a target.
        for run, nxt in itertools.pairwise(runs):
            if split_bytes is None and split_rows is None:
                continue
            g = nxt[0]
            too_many_bytes = (
                split_bytes is not None and sum(x.num_bytes for x in run) + g.num_bytes > split_bytes
            )
            too_many_rows = split_rows is not None and sum(x.num_rows for x in run) + g.num_rows > split_rows
            assert too_many_bytes or too_many_rows


def test_row_group_packing_example() -> None:
    groups = (
        RowGroup(0, 0, 10, 100),
        RowGroup(1, 10, 10, 100),
        RowGroup(2, 20, 0, 0),
        RowGroup(3, 20, 10, 500),  # larger than the target on its own
        RowGroup(5, 40, 10, 100),  # group 4 [30, 40) pruned
        RowGroup(6, 50, 10, 100),
    )
    f = FileInfo("f.parquet", 1000, 60, groups)
    got = [(c.start, c.stop, c.num_rows) for c in RowGroupSplit(split_bytes=250).split([f])]
    assert got == [(0, 20, 20), (20, 30, 10), (40, 60, 20)]
    got = [(c.start, c.stop) for c in RowGroupSplit(split_rows=15).split([f])]
    assert got == [(0, 10), (10, 20), (20, 30), (40, 50), (50, 60)]
    # A chunk that reaches a target exactly is still one chunk.
    got = [(c.start, c.stop) for c in RowGroupSplit(split_bytes=200).split([f])]
    assert got == [(0, 20), (20, 30), (40, 60)]
    # Live groups 3 and 5 are consecutive once group 4 is pruned: one chunk of 20 rows.
    got = [(c.start, c.stop, c.num_rows) for c in RowGroupSplit(split_rows=20).split([f])]
    assert got == [(0, 20, 20), (20, 50, 20), (50, 60, 10)]
    got = [(c.start, c.stop) for c in RowGroupSplit(split_bytes=200, split_rows=19).split([f])]
    assert got == [(0, 10), (10, 20), (20, 30), (40, 50), (50, 60)]
    assert len(RowGroupSplit().split([f])) == 5
    # Without row-group metadata a file is one chunk, by rows or by bytes.
    assert RowGroupSplit(split_rows=1).split([FileInfo("r", 9, 7)]) == [
        Chunk("r", 0, 7, ChunkUnit.ROWS, 7, 9)
    ]
    assert RowGroupSplit(split_rows=1).split([FileInfo("t", 9)]) == [
        Chunk("t", 0, 9, ChunkUnit.BYTES, None, 9)
    ]


# ---------------------------------------------------------------------------------------
# Resolving custom strategies
# ---------------------------------------------------------------------------------------


def test_builtin_strategies_resolve_to_themselves() -> None:
    for split in (FileSplit(), RowGroupSplit(split_rows=3)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert resolve_strategy(split) is split


def test_current_signature_is_rank_aware_without_warning() -> None:
    strategy = HalfFileSharded()
    assert isinstance(strategy, SplitStrategy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolved = resolve_strategy(strategy)
    assert isinstance(resolved, RankAwareStrategy)
    assert resolved.name == "HalfFileSharded"


def test_var_keyword_generate_is_rank_aware() -> None:
    class Kw:
        def generate(self, files: Sequence[FileInfo], num_workers: int, epoch: int, **kw: int) -> list[Chunk]:
            return half_file_chunks(files)[kw["rank"] :: kw["num_ranks"]]

    assert isinstance(resolve_strategy(Kw()), RankAwareStrategy)


def test_older_signature_warns_once_naming_the_rank_share() -> None:
    strategy = HalfFileLegacy()
    assert isinstance(strategy, LegacySplitStrategy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolved = resolve_strategy(strategy)
        files = [FileInfo("a", 10, 10), FileInfo("b", 7)]
        for epoch in range(3):
            resolved.split(files, num_workers=2, epoch=epoch)  # type: ignore[union-attr]
    assert len(caught) == 1
    (w,) = caught
    assert w.category is UserWarning
    message = str(w.message)
    assert "HalfFileLegacy" in message
    assert "generate(files, num_workers, epoch)" in message
    assert "[rank::num_ranks]" in message
    assert "num_ranks and rank" in message  # says how to shard yourself


class _NoGenerate:
    pass


class _GenerateNotCallable:
    generate = 3


@pytest.mark.parametrize("strategy", [_NoGenerate(), _GenerateNotCallable(), "by_file", 42])
def test_object_without_generate_is_a_config_error(strategy: object) -> None:
    with pytest.raises(ConfigError, match="has no generate") as info:
        resolve_strategy(strategy)
    message = str(info.value)
    assert repr(strategy) in message
    assert "generate(files, num_workers, epoch, *, num_ranks, rank)" in message


class _TooFewParams:
    def generate(self, files: Sequence[FileInfo]) -> list[Chunk]:
        return []


class _TooManyParams:
    def generate(self, files: Sequence[FileInfo], num_workers: int, epoch: int, extra: int) -> list[Chunk]:
        return []


class _RankAwareWithoutEpoch:
    def generate(
        self, files: Sequence[FileInfo], num_workers: int, *, num_ranks: int, rank: int
    ) -> list[Chunk]:
        return []


class _RankAwareWithRequiredExtra:
    def generate(
        self, files: Sequence[FileInfo], num_workers: int, epoch: int, *, num_ranks: int, rank: int, fmt: str
    ) -> list[Chunk]:
        return []


class _RankKeywordsPositionalOnly:
    def generate(
        self, files: Sequence[FileInfo], num_workers: int, epoch: int, num_ranks: int, rank: int, /
    ) -> list[Chunk]:
        return []


class _OnlyNumRanks:
    def generate(
        self, files: Sequence[FileInfo], num_workers: int, epoch: int, *, num_ranks: int
    ) -> list[Chunk]:
        return []


@pytest.mark.parametrize(
    "strategy",
    [
        _TooFewParams(),
        _TooManyParams(),
        _RankAwareWithoutEpoch(),
        _RankAwareWithRequiredExtra(),
        _RankKeywordsPositionalOnly(),
        _OnlyNumRanks(),
        HalfFileLegacy,  # the class instead of an instance: generate() wants self too
    ],
)
def test_wrong_generate_signature_is_a_config_error_naming_both_signatures(strategy: object) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a rejected strategy must not also warn
        with pytest.raises(ConfigError, match="matches neither supported signature") as info:
            resolve_strategy(strategy)
    message = str(info.value)
    assert "generate(files, num_workers, epoch, *, num_ranks, rank) (current)" in message
    assert "generate(files, num_workers, epoch) (older)" in message


# ---------------------------------------------------------------------------------------
# Validating what strategies return
# ---------------------------------------------------------------------------------------

_FILES = {
    f.path: f for f in (FileInfo("a", 100, 10, (RowGroup(0, 0, 4), RowGroup(2, 8, 2))), FileInfo("t", 50))
}


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        (Chunk("zzz", 0, 1), r"returned a chunk of 'zzz', which is not one of the dataset's files"),
        (Chunk("a", 0, 11), r"chunk 'a' \[0, 11\) rows, outside the file's \[0, 10\)"),
        (Chunk("a", -1, 3), r"chunk 'a' \[-1, 3\) rows, outside the file's \[0, 10\)"),
        (Chunk("a", 4, 4), r"chunk 'a' \[4, 4\) rows, outside"),
        (Chunk("t", 0, 51, ChunkUnit.BYTES), r"chunk 't' \[0, 51\) bytes, outside the file's \[0, 50\)"),
        (Chunk("t", 0, 5), r"row-range chunk of 't', whose row count is unknown; use byte ranges"),
    ],
)
def test_invalid_chunks_are_plan_errors(chunk: Chunk, message: str) -> None:
    with pytest.raises(PlanError, match=message) as info:
        normalize_chunks([chunk], _FILES, "Mine")
    assert "'Mine'" in str(info.value)
    assert not isinstance(info.value, OverlappingChunksError)


def test_normalize_fills_in_exact_row_counts() -> None:
    got = normalize_chunks([Chunk("a", 2, 9), Chunk("a", 0, 2, ChunkUnit.ROWS, 99, 7)], _FILES, "Mine")
    assert [(c.num_rows, c.num_bytes) for c in got] == [(3, 70), (2, 7)]
    same = Chunk("a", 0, 4, ChunkUnit.ROWS, 4, 1)
    assert normalize_chunks([same], _FILES, "Mine") == [same]


def test_non_chunk_items_are_plan_errors() -> None:
    class ReturnsTuples:
        def generate(self, files: Sequence[FileInfo], num_workers: int, epoch: int) -> list[object]:
            return [("a", 0, 10)]

    class ReturnsNone:
        def generate(self, files: Sequence[FileInfo], num_workers: int, epoch: int) -> None:
            return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuples = resolve_strategy(ReturnsTuples())
        none = resolve_strategy(ReturnsNone())
    with pytest.raises(
        PlanError, match=r"'ReturnsTuples' returned 'a'; expected Chunk objects \(build them with"
    ):
        tuples.split(list(_FILES.values()), num_workers=1, epoch=0)  # type: ignore[union-attr]
    with pytest.raises(PlanError, match=r"'ReturnsNone' must return a sequence of Chunk, got None"):
        none.split(list(_FILES.values()), num_workers=1, epoch=0)  # type: ignore[union-attr]


def test_older_strategy_may_return_one_list_per_worker() -> None:
    class PerWorker:
        def generate(self, files: Sequence[FileInfo], num_workers: int, epoch: int) -> list[list[Chunk]]:
            chunks = half_file_chunks(files)
            return [chunks[w::num_workers] for w in range(num_workers)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resolved = resolve_strategy(PerWorker())
    files = list(_FILES.values())
    got = resolved.split(files, num_workers=3, epoch=0)  # type: ignore[union-attr]
    assert sorted(got, key=lambda c: (c.path, c.start)) == half_file_chunks(files)


def test_check_no_overlap() -> None:
    check_no_overlap([Chunk("a", 0, 5), Chunk("a", 5, 9), Chunk("b", 0, 5)])
    check_no_overlap([])
    with pytest.raises(
        OverlappingChunksError, match=r"reads rows twice: chunks \[0, 5\) and \[4, 9\) of 'a'"
    ):
        check_no_overlap([Chunk("a", 4, 9), Chunk("b", 0, 5), Chunk("a", 0, 5)], "Mine")
    with pytest.raises(OverlappingChunksError, match=r"\[0, 10\) and \[2, 3\)"):
        check_no_overlap([Chunk("a", 0, 10), Chunk("a", 2, 3), Chunk("a", 5, 8)])
    with pytest.raises(OverlappingChunksError, match="mixes row-range and byte-range chunks of 'a'"):
        check_no_overlap([Chunk("a", 0, 5), Chunk("a", 5, 9, ChunkUnit.BYTES)])
    with pytest.raises(OverlappingChunksError, match=r"Mine reads rows twice"):
        check_no_overlap([Chunk("a", 0, 5), Chunk("a", 0, 5)], "Mine")


def test_every_chunk_on_every_rank_strategy_is_rank_aware() -> None:
    # Resolution cannot know it is buggy; the planner catches it (see test_planner).
    assert isinstance(resolve_strategy(EveryChunkOnEveryRank()), RankAwareStrategy)
