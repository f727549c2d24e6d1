"""discover(): files, schema, output vs. read columns, row-group pruning by statistics."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.fixtures.data import WriteParquet
from tests.fixtures.e2e import TOKEN, TokenMemoryFileSystem, upload
from torch_dataloader_utils.config import FileFormat, FileSourceConfig
from torch_dataloader_utils.discovery import discover
from torch_dataloader_utils.errors import (
    CorruptFileError,
    SchemaMismatchError,
    UnknownColumnError,
)

PARQUET = FileFormat.PARQUET


def test_files_sorted_with_row_groups_from_footers(write_parquet: WriteParquet) -> None:
    paths = write_parquet([250, 7, 100], row_group_size=[100, 3, 100])
    found = discover(str(paths[0].parent), FileSourceConfig(format=PARQUET))
    assert [f.path for f in found.files] == [str(p) for p in paths]
    assert [f.num_rows for f in found.files] == [250, 7, 100]
    groups = found.files[0].row_groups
    assert groups is not None
    assert [(g.index, g.first_row, g.num_rows) for g in groups] == [(0, 0, 100), (1, 100, 100), (2, 200, 50)]
    assert all(g.num_bytes > 0 for g in groups)
    assert [g.num_rows for g in found.files[1].row_groups or ()] == [3, 3, 1]
    assert found.files[0].size == paths[0].stat().st_size
    assert found.output_columns == found.data_columns == ("id", "x", "label", "s")
    assert found.partition_columns == ()
    assert found.partitions is None


def test_columns_select_and_order(write_parquet: WriteParquet) -> None:
    paths = write_parquet([10])
    found = discover(str(paths[0]), FileSourceConfig(format=PARQUET, columns=["label", "id"]))
    assert found.output_columns == ("label", "id")
    assert found.output_schema.names == ["label", "id"]
    assert set(found.data_columns) == {"label", "id"}


def test_filter_column_is_read_but_not_output(write_parquet: WriteParquet) -> None:
    paths = write_parquet([10])
    found = discover(
        str(paths[0]), FileSourceConfig(format=PARQUET, columns=["id"], filters=pc.field("label") > 2)
    )
    assert found.output_columns == ("id",)
    assert found.data_columns == ("id", "label")
    assert "s" not in found.data_columns
    assert "x" not in found.data_columns


def test_nested_filter_reference_needs_only_that_field(tmp_path: Path) -> None:
    table = pa.table({"id": [1, 2], "st": [{"a": 1, "b": 2}, {"a": 3, "b": 4}], "other": [0.0, 1.0]})
    pq.write_table(table, tmp_path / "n.parquet")
    found = discover(
        str(tmp_path), FileSourceConfig(format=PARQUET, columns=["id"], filters=pc.field("st", "a") > 1)
    )
    assert found.data_columns == ("id", "st")


def test_row_groups_pruned_by_statistics(write_parquet: WriteParquet) -> None:
    # ids are sorted, so each row group has a narrow [min, max]: 0-99, 100-199, ...
    paths = write_parquet([500, 300], row_group_size=100)
    found = discover(
        str(paths[0].parent),
        FileSourceConfig(format=PARQUET, filters=(pc.field("id") >= 250) & (pc.field("id") < 620)),
    )
    kept = [[g.index for g in f.row_groups or ()] for f in found.files]
    assert kept == [[2, 3, 4], [0, 1]]
    assert [f.live_rows for f in found.files] == [300, 200]
    assert [f.num_rows for f in found.files] == [500, 300], "row positions stay those of the file"


def test_filter_matching_no_row_group_warns(write_parquet: WriteParquet) -> None:
    paths = write_parquet([100], row_group_size=10)
    with pytest.warns(UserWarning, match="excludes every row group"):
        found = discover(str(paths[0]), FileSourceConfig(format=PARQUET, filters=pc.field("id") > 10_000))
    assert found.files[0].live_rows == 0


def test_string_statistics_prune(write_parquet: WriteParquet) -> None:
    # Group 0 holds "row-0".."row-9"; later groups' [min, max] ("row-10".."row-19", ...)
    # exclude "row-5" in lexicographic order.
    paths = write_parquet([100], row_group_size=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = discover(str(paths[0]), FileSourceConfig(format=PARQUET, filters=pc.field("s") == "row-5"))
    assert [g.index for g in found.files[0].row_groups or ()] == [0]


def test_filter_without_usable_statistics_keeps_every_group(write_parquet: WriteParquet) -> None:
    paths = write_parquet([100], row_group_size=10)
    found = discover(str(paths[0]), FileSourceConfig(format=PARQUET, filters=pc.field("label") == 3))
    assert found.files[0].live_rows == 100


def test_unknown_column_and_filter(write_parquet: WriteParquet) -> None:
    paths = write_parquet([10])
    with pytest.raises(UnknownColumnError, match=r"available columns: \['id', 'x', 'label', 's'\]"):
        discover(str(paths[0]), FileSourceConfig(format=PARQUET, columns=["idd"]))
    with pytest.raises(UnknownColumnError, match="idd"):
        discover(str(paths[0]), FileSourceConfig(format=PARQUET, filters=pc.field("idd") == 1))


def test_mismatch_only_matters_for_needed_fields(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1], "a": [1.0], "b": ["x"]}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"id": [2], "a": [1], "b": ["y"]}), tmp_path / "2.parquet")
    found = discover(str(tmp_path), FileSourceConfig(format=PARQUET, columns=["id", "b"]))
    assert found.data_columns == ("id", "b")
    with pytest.raises(SchemaMismatchError, match="'a' is double"):
        discover(str(tmp_path), FileSourceConfig(format=PARQUET, columns=["id"], filters=pc.field("a") > 0))


def test_corrupt_file_among_good_ones(write_parquet: WriteParquet) -> None:
    paths = write_parquet([10, 10, 10])
    paths[1].write_bytes(b"PAR1 garbage")
    with pytest.raises(CorruptFileError, match=str(paths[1].name)):
        discover(str(paths[0].parent), FileSourceConfig(format=PARQUET))


def test_parquet_file_read_as_orc_names_the_file(write_parquet: WriteParquet) -> None:
    paths = write_parquet([10])
    with pytest.raises(CorruptFileError, match=str(paths[0].name)):
        discover(str(paths[0]), FileSourceConfig(format=FileFormat.ORC))


def test_discover_over_fsspec_with_storage_options(
    tmp_path: Path, write_parquet: WriteParquet, tokmem: TokenMemoryFileSystem
) -> None:
    paths = write_parquet([120, 80], row_group_size=40)
    upload(tokmem, paths, paths[0].parent, "/bucket/ds")
    found = discover(
        "tokmem://bucket/ds",
        FileSourceConfig(format=PARQUET, filters=pc.field("id") >= 100, storage_options={"token": TOKEN}),
    )
    assert found.fs.protocol == "tokmem"
    assert found.fs.storage_options == {"token": TOKEN}
    assert [f.path for f in found.files] == ["/bucket/ds/part-0000.parquet", "/bucket/ds/part-0001.parquet"]
    assert [[g.index for g in f.row_groups or ()] for f in found.files] == [[2], [0, 1]]
    # The footers really came through the filesystem.
    assert {p for p, _, _ in TokenMemoryFileSystem.reads} == {f.path for f in found.files}
