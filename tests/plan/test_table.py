"""Columnar metadata: FileTable round trips, and chunk tables equal to the strategies' chunks."""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import torch_dataloader_utils.plan.chunks as chunks_module
import torch_dataloader_utils.plan.table as table_module
from tests import strategies as ts
from torch_dataloader_utils.errors import OverlappingChunksError
from torch_dataloader_utils.plan.chunks import ChunkTable, build_chunks, check_table_overlap, from_chunks
from torch_dataloader_utils.plan.splits import RowGroupSplit, check_no_overlap, normalize_chunks
from torch_dataloader_utils.plan.table import FileTable, FileWithDeletes, encode_paths, search
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo, RecordIndex, RowGroup


def _columns_of(table: FileTable) -> dict[str, object]:
    """The same table, rebuilt from its numpy columns (as a columnar discovery would)."""
    return {
        "paths_blob": table.paths_blob,
        "path_offsets": table.path_offsets,
        "size": table.size,
        "rows": table.rows,
        "mtime": table.mtime,
        "splittable": table.splittable,
        "group_offsets": table.group_offsets,
        "group_index": table.group_index,
        "group_first_row": table.group_first_row,
        "group_rows": table.group_rows,
        "group_bytes": table.group_bytes,
        "has_groups": table.has_groups,
        "block_bytes": table.block_bytes,
        "record_offsets": table.record_offsets,
        "record_counts": table.record_counts,
        "delete_offsets": table.delete_offsets,
        "deleted": table.deleted,
    }


def _same_file(a: FileInfo, b: FileInfo) -> None:
    assert (a.path, a.size, a.num_rows, a.row_groups, a.mtime, a.records, a.splittable) == (
        b.path,
        b.size,
        b.num_rows,
        b.row_groups,
        b.mtime,
        b.records,
        b.splittable,
    )
    assert a.live_rows == b.live_rows
    a_del, b_del = getattr(a, "deleted", None), getattr(b, "deleted", None)
    assert list(a_del if a_del is not None else []) == list(b_del if b_del is not None else [])


@contextmanager
def _pieces_of(size: int) -> Iterator[None]:
    """Columns over every group checked and computed ``size`` groups at a time (many pieces)."""
    with mock.patch.object(table_module, "_PIECE", size), mock.patch.object(chunks_module, "_BLOCK", size):
        yield


def _group_columns(files: list[FileInfo]) -> tuple[list[int], list[int]]:
    """Every file's groups' index and first row, concatenated."""
    groups = [g for f in files for g in f.row_groups or ()]
    return [g.index for g in groups], [g.first_row for g in groups]


@given(ts.rich_layouts(), st.integers(1, 5))
def test_from_arrays_rebuilds_every_file(files: list[FileInfo], piece: int) -> None:
    given_table = FileTable.from_infos(files)
    with _pieces_of(piece):
        built = FileTable.from_arrays(**_columns_of(given_table))  # type: ignore[arg-type]
        index, first = _group_columns(files)
        for table in (built, given_table):
            assert table.group_index.tolist() == index
            assert table.group_first_row.tolist() == first
            assert [table.first_row(g) for g in range(len(first))] == first
    assert len(built) == len(files) == len(given_table)
    assert list(built) == [f.path for f in files]
    np.testing.assert_array_equal(built.live, given_table.live)
    for i, f in enumerate(files):
        assert given_table.info(i) is f  # kept, not copied
        _same_file(built.info(i), f)
        assert built.index(f.path) == i == given_table.index(f.path)
        assert built[f.path].path == f.path
        for start, rows in ((0, 0), (0, 1), (1, 2)):
            try:
                expected: object = f.stop_after(start, rows)
            except ValueError:
                expected = ValueError
            try:
                got: object = built.stop_after(i, start, rows)
            except ValueError:
                got = ValueError
            assert got == expected
    assert "nope" not in built
    with pytest.raises(KeyError):
        built.index("nope")
    assert built.digest() == given_table.digest()
    again = pickle.loads(pickle.dumps(built))
    assert again.digest() == built.digest()
    assert list(again) == list(built)


def test_lookup_by_path_in_unsorted_table() -> None:
    table = FileTable.from_arrays(paths=["b", "a", "c/d"], size=[1, 2, 3])
    assert [table.index(p) for p in ("a", "b", "c/d")] == [1, 0, 2]
    assert table.infos[2] == FileInfo("c/d", 3)


def test_encode_paths_and_bad_columns() -> None:
    blob, offsets = encode_paths(["é", "ab"])
    assert blob.tobytes() == "éab".encode()
    assert offsets.tolist() == [0, 2, 4]
    with pytest.raises(ValueError, match=r"size must have shape \(2,\)"):
        FileTable.from_arrays(paths=["a", "b"], size=[1])
    with pytest.raises(ValueError, match="group_offsets must rise from 0 to 1"):
        FileTable.from_arrays(paths=["a"], size=[1], group_offsets=[0, 2], group_rows=[5])


def test_deletes_are_counted_out() -> None:
    groups = (RowGroup(0, 0, 10, 80), RowGroup(1, 10, 10, 80))
    f = FileWithDeletes("a", 160, 20, groups, deleted=np.array([3, 4, 15]))
    table = FileTable.from_infos([f])
    assert table.live.tolist() == [17]
    assert table.has_deletes
    built = FileTable.from_arrays(**_columns_of(table))  # type: ignore[arg-type]
    assert isinstance(built.info(0), FileWithDeletes)
    assert built.stop_after(0, 0, 5) == 7  # rows 3 and 4 are deleted


def test_group_index_and_first_rows_are_kept_only_when_they_do_not_follow_from_the_rows() -> None:
    def table_of(*groups: RowGroup) -> FileTable:
        rows = sum(g.num_rows for g in groups) + 5
        return FileTable.from_infos(
            [FileInfo("a", 100, rows, groups), FileInfo("b", 10, 2, (RowGroup(0, 0, 2, 9),))]
        )

    footer = table_of(RowGroup(0, 0, 5, 50), RowGroup(1, 5, 7, 50))  # as a footer gives them
    pruned = table_of(RowGroup(0, 0, 5, 50), RowGroup(2, 12, 7, 50))  # group 1 pruned
    shifted = table_of(RowGroup(0, 3, 5, 50), RowGroup(1, 8, 7, 50))  # numbered 0, 1 but not from row 0
    assert footer.nbytes - pruned.nbytes == -3 * (2 + 4)  # pruned: index (int16) and first rows stored
    assert shifted.nbytes - footer.nbytes == 3 * 4  # the first rows only
    for table, index, first in (
        (footer, [0, 1, 0], [0, 5, 0]),
        (pruned, [0, 2, 0], [0, 12, 0]),
        (shifted, [0, 1, 0], [3, 8, 0]),
    ):
        assert table.group_index.tolist() == index
        assert table.group_index.dtype == np.int16
        assert table.group_first_row.tolist() == first
        assert [table.first_row(g) for g in range(3)] == first
        rebuilt = FileTable.from_arrays(**_columns_of(table))  # type: ignore[arg-type]
        assert rebuilt.nbytes == table.nbytes
        assert [rebuilt.info(i) for i in range(2)] == list(table.infos)
        again = pickle.loads(pickle.dumps(rebuilt))
        assert again.group_first_row.tolist() == first
        assert again.info(0) == table.info(0)
        chunks = build_chunks(RowGroupSplit(split_bytes=1), rebuilt)
        assert [chunks.chunk(i).start for i in range(3)] == first


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64])
def test_search_is_searchsorted_in_the_columns_type(dtype: type) -> None:
    column = np.array([0, 0, 3, 3, 7, np.iinfo(dtype).max], dtype=dtype)
    for value in (0, 1, 3, 6, 7, 8, int(np.iinfo(dtype).max), int(np.iinfo(dtype).max) + 1, 2**70):
        for side in ("left", "right"):
            expected = len(column) if value > np.iinfo(dtype).max else np.searchsorted(column, value, side)
            assert search(column, value, side) == expected, (value, side)


def test_memory_per_file_is_columns() -> None:
    n = 10_000
    table = FileTable.from_arrays(
        paths=[f"s3://bucket/dataset/part-{i:07d}.parquet" for i in range(n)],
        size=np.full(n, 1 << 20),
        rows=np.full(n, 1000),
        group_offsets=np.arange(n + 1),
        group_first_row=np.zeros(n),
        group_rows=np.full(n, 1000),
        group_bytes=np.full(n, 1 << 20),
    )
    assert table.nbytes / n < 200


# ---------------------------------------------------------------------------------------
# Chunk tables
# ---------------------------------------------------------------------------------------


@given(ts.rich_layouts(), ts.rich_splits(), st.integers(1, 5))
def test_built_in_chunk_table_is_the_strategys_chunks(
    files: list[FileInfo], strategy: object, piece: int
) -> None:
    with _pieces_of(piece):
        table = FileTable.from_infos(files)
        expected = normalize_chunks(strategy.split(files), table, strategy.name)  # type: ignore[attr-defined]
        chunks = build_chunks(strategy, table)  # type: ignore[arg-type]
        assert [chunks.chunk(i) for i in range(len(chunks))] == expected
        # Built from columns alone (no FileInfo objects), the same chunks.
        columnar = FileTable.from_arrays(**_columns_of(table))  # type: ignore[arg-type]
        again = build_chunks(strategy, columnar)  # type: ignore[arg-type]
        assert [again.chunk(i) for i in range(len(again))] == expected
        assert [(again.file_of(i), int(again.start[i]), int(again.stop[i])) for i in range(len(again))] == [
            again.span_of(i) for i in range(len(again))
        ]
        # In bulk (a worker's chunks), any order and repeats: the same chunks.
        order = np.arange(len(chunks))[::-1].repeat(2)
        assert chunks.chunks(order) == [expected[i] for i in order.tolist()]
        assert again.chunks(order) == [expected[i] for i in order.tolist()]
        assert again.files.paths_of(np.arange(len(files))[::-1]) == [f.path for f in reversed(files)]


@given(ts.rich_layouts(min_files=1), st.data())
def test_parts_of_a_chunk_tile_it(files: list[FileInfo], data: st.DataObject) -> None:
    table = FileTable.from_infos(files)
    chunks = build_chunks(data.draw(ts.rich_splits()), table)
    known = [i for i in range(len(chunks)) if chunks.rows[i] > 0]
    if not known:
        return
    i = data.draw(st.sampled_from(known))
    n = int(chunks.rows[i])
    cuts = sorted(set(data.draw(st.lists(st.integers(0, n), max_size=4))) | {0, n})
    parts = [chunks.part(i, a, b) for a, b in itertools.pairwise(cuts)]
    whole = chunks.chunk(i)
    assert sum(p.num_rows or 0 for p in parts) == n
    assert sum(p.num_bytes for p in parts) == whole.num_bytes
    if whole.unit is ChunkUnit.ROWS and not isinstance(files[int(chunks.file[i])], FileWithDeletes):
        by_path = {f.path: f for f in files}
        cells = [c for p in parts for c in ts.chunk_cells(p, by_path)]
        assert cells == ts.chunk_cells(whole, by_path)
    else:
        assert (
            all(p.start == whole.start and p.stop == whole.stop for p in parts)
            or whole.unit is ChunkUnit.ROWS
        )


@given(ts.rich_layouts(), st.data())
def test_vectorized_overlap_check_agrees_with_the_object_one(
    files: list[FileInfo], data: st.DataObject
) -> None:
    table = FileTable.from_infos(files)
    chunks = ts.half_file_chunks(files)
    picked = data.draw(st.lists(st.sampled_from(chunks), max_size=8)) if chunks else []
    extra = data.draw(st.lists(st.sampled_from(chunks), max_size=2)) if chunks else []
    mixed = picked + extra
    expected: object = None
    try:
        check_no_overlap(mixed, "x")
    except OverlappingChunksError as exc:
        expected = str(exc)
    got: object = None
    try:
        check_table_overlap(from_chunks(mixed, table, "s"), "x")
    except OverlappingChunksError as exc:
        got = str(exc)
    assert got == expected


def test_custom_chunks_keep_windows_and_padding() -> None:
    f = FileInfo("t", 90, records=RecordIndex(30, (2, 2, 2)))
    table = FileTable.from_infos([f])
    chunks = [
        Chunk("t", 0, 90, ChunkUnit.BYTES, 2, 30, skip=0),
        Chunk("t", 0, 90, ChunkUnit.BYTES, 4, 60, skip=2),
        Chunk("t", 0, 90, ChunkUnit.BYTES, 1, 10, padding=True),
    ]
    converted = from_chunks(chunks, table, "s")
    assert [converted.chunk(i) for i in range(3)] == chunks
    check_table_overlap(converted, "x")  # disjoint windows of one range
    assert ChunkTable.concat(table, [converted, converted.take(np.array([0]))]).chunk(3) == chunks[0]


@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 30), st.integers(0, 400)), max_size=7), min_size=32, max_size=70
    ),
    st.none() | st.integers(1, 900),
    st.none() | st.integers(1, 60),
)
def test_row_group_packing_of_many_files_in_lockstep(
    layout: list[list[tuple[int, int]]], split_bytes: int | None, split_rows: int | None
) -> None:
    """Enough files that groups are packed level by level across files (not one by one)."""
    files = []
    for i, groups in enumerate(layout):
        first, rgs = 0, []
        for k, (n, b) in enumerate(groups):
            rgs.append(RowGroup(k, first, n, b))
            first += n
        files.append(FileInfo(f"f{i:03d}", 10 + sum(b for _, b in groups), first, tuple(rgs)))
    strategy = RowGroupSplit(split_bytes=split_bytes, split_rows=split_rows)
    table = FileTable.from_infos(files)
    chunks = build_chunks(strategy, table)
    assert [chunks.chunk(i) for i in range(len(chunks))] == normalize_chunks(
        strategy.split(files), table, "row_group"
    )


def _wide_table(first_row: int, group_bytes: int) -> tuple[FileTable, list[FileInfo]]:
    groups = (RowGroup(0, first_row, 5, group_bytes), RowGroup(1, first_row + 5, 7, group_bytes))
    files = [
        FileInfo("a", 100, first_row + 12, groups),
        FileInfo("b", 100, 3, (RowGroup(0, 0, 1, 50), RowGroup(1, 1, 2, 50))),
    ]
    return FileTable.from_infos(files), files


@pytest.mark.parametrize(
    ("first_row", "group_bytes", "rows_type", "bytes_type"),
    [
        (0, 50, np.int32, np.int32),
        (2**31 - 13, 50, np.int32, np.int32),  # the last group's stop is 2**31 - 1
        (2**31 - 12, 50, np.int64, np.int32),  # its stop would not fit int32
        (0, 2**31, np.int32, np.int64),
    ],
)
def test_group_columns_are_int32_only_when_the_values_fit(
    first_row: int, group_bytes: int, rows_type: type, bytes_type: type
) -> None:
    table, files = _wide_table(first_row, group_bytes)
    assert table.group_rows.dtype == rows_type
    assert table.group_first_row.dtype == rows_type
    assert table.group_bytes.dtype == bytes_type
    assert table.group_index.dtype == np.int16
    assert table.live.tolist() == [12, 3]
    assert table.info(0) == files[0]
    for strategy in (RowGroupSplit(split_bytes=1), RowGroupSplit(split_bytes=2**40)):
        chunks = build_chunks(strategy, table)
        assert [chunks.chunk(i) for i in range(len(chunks))] == normalize_chunks(
            strategy.split(files), table, "row_group"
        )
        assert int(chunks.stop.max()) == max(first_row + 12, 3)


def test_one_chunk_per_group_shares_the_group_columns() -> None:
    table, _ = _wide_table(0, 50)
    chunks = build_chunks(RowGroupSplit(split_bytes=1), table)  # every group is a chunk
    for column, group_column in ((chunks.rows, table.group_rows), (chunks.bytes, table.group_bytes)):
        assert np.shares_memory(column, group_column)
    assert chunks.start.tolist() == [0, 5, 0, 1]  # the first rows, derived from the rows
    assert chunks.file.dtype == np.int32
    assert chunks.nbytes < 24 * len(chunks)
    same = ChunkTable(
        table,
        *(c.astype(np.int64) for c in (chunks.file, chunks.start, chunks.stop)),
        chunks.unit,
        chunks.rows.astype(np.int64),
        chunks.bytes.astype(np.int64),
    )
    assert same.digest() == chunks.digest()  # the digest does not depend on the columns' widths
    assert chunks.file.tolist() == [0, 0, 1, 1]
    assert chunks.stop.tolist() == [5, 12, 1, 3]
    back = pickle.loads(pickle.dumps(chunks))
    assert [back.chunk(i) for i in range(len(back))] == [chunks.chunk(i) for i in range(len(chunks))]
    assert back.take(np.array([3, 0])).file.tolist() == [1, 0]
