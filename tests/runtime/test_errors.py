"""One test per bad input: the exact error class and the key parts of its message.

Every error here is raised by ``create_dataloader`` itself, at construction, before any
iteration (no DataLoader worker is ever started).
"""

from __future__ import annotations

import decimal
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.fixtures.data import WriteParquet
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.errors import (
    ConfigError,
    ConversionError,
    CorruptFileError,
    DataLoaderUtilsError,
    DistributedConfigError,
    IncompatibleOptionsError,
    NoFilesFoundError,
    PathNotFoundError,
    SchemaMismatchError,
    UnknownColumnError,
)


@pytest.fixture
def data(write_parquet: WriteParquet) -> str:
    return str(write_parquet([40, 30], row_group_size=10)[0].parent)


def _raises(error: type[Exception], *parts: str, path: str, **kwargs: Any) -> Exception:
    with pytest.raises(error) as exc:
        create_dataloader(path, **kwargs)
    message = str(exc.value)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    assert isinstance(exc.value, DataLoaderUtilsError)
    return exc.value


# -- paths and files -------------------------------------------------------------------


def test_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _raises(
        NoFilesFoundError,
        "no data files",
        str(tmp_path / "empty"),
        "point path at",
        path=str(tmp_path / "empty"),
    )


def test_directory_with_only_markers(tmp_path: Path) -> None:
    (tmp_path / "_SUCCESS").write_bytes(b"")
    _raises(NoFilesFoundError, "1 hidden/marker files were skipped", path=str(tmp_path))


def test_missing_path(tmp_path: Path) -> None:
    err = _raises(PathNotFoundError, str(tmp_path / "nope"), "does not exist", path=str(tmp_path / "nope"))
    assert isinstance(err, FileNotFoundError)


def test_empty_path_list() -> None:
    with pytest.raises(ConfigError, match=re.escape("path=[] is empty")):
        create_dataloader([])


def test_corrupt_file_is_named(tmp_path: Path, write_parquet: WriteParquet) -> None:
    good = write_parquet([10])[0]
    bad = good.parent / "part-9999.parquet"
    bad.write_bytes(b"this is not a parquet file at all")
    _raises(CorruptFileError, repr(str(bad)), "Parquet footer", "Remove it from path", path=str(good.parent))


def test_truncated_file_is_named(tmp_path: Path, write_parquet: WriteParquet) -> None:
    path = write_parquet([100])[0]
    path.write_bytes(path.read_bytes()[:-20])
    _raises(CorruptFileError, str(path), path=str(path))


def test_schema_mismatch_type_names_both_files_and_field(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1, 2], "x": [1.0, 2.0]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3, 4], "x": [1, 2]}), tmp_path / "b.parquet")
    _raises(
        SchemaMismatchError,
        "'x'",
        str(tmp_path / "a.parquet"),
        str(tmp_path / "b.parquet"),
        "double",
        "int64",
        "leave the field out of columns",
        path=str(tmp_path),
    )


def test_schema_mismatch_missing_field_names_both_files(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1, 2], "x": [1.0, 2.0]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3, 4]}), tmp_path / "b.parquet")
    _raises(
        SchemaMismatchError,
        "'x'",
        "missing from",
        str(tmp_path / "a.parquet"),
        str(tmp_path / "b.parquet"),
        path=str(tmp_path),
    )


def test_schema_mismatch_in_unselected_column_is_fine(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1, 2], "x": [1.0, 2.0]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3, 4], "x": [1, 2]}), tmp_path / "b.parquet")
    loader, _ = create_dataloader(str(tmp_path), columns=["id"], num_workers=0)
    assert sorted(i for b in loader for i in b["id"].tolist()) == [1, 2, 3, 4]


# -- columns and filters ---------------------------------------------------------------


def test_unknown_column_lists_available(data: str) -> None:
    _raises(
        UnknownColumnError,
        "['nope'] not found",
        "available columns: ['id', 'x', 'label', 's']",
        path=data,
        columns=["id", "nope"],
    )


def test_unknown_column_in_filters(data: str) -> None:
    _raises(
        UnknownColumnError, "filters=", "nope", "available columns", path=data, filters=pc.field("nope") > 1
    )


def test_filters_not_an_expression(data: str) -> None:
    _raises(ConfigError, "filters='id > 3'", "pyarrow.compute.Expression", path=data, filters="id > 3")


def test_filters_type_error(data: str) -> None:
    _raises(ConfigError, "filters=", "cannot be applied", path=data, filters=pc.field("s") > 3)


def test_columns_as_string(data: str) -> None:
    _raises(ConfigError, "columns='id'", "list of column names", path=data, columns="id")


def test_columns_twice(data: str) -> None:
    _raises(ConfigError, "names a column twice", path=data, columns=["id", "id"])


def test_columns_empty(data: str) -> None:
    _raises(ConfigError, "columns=[]", "pass None", path=data, columns=[])


def test_unconvertible_types_fail_at_construction(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": [1],
            "d": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
            "st": pa.array([{"a": 1}]),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    _raises(ConversionError, "'d'", "decimal128(5, 2)", "output_format='arrow'", path=str(tmp_path))
    _raises(ConversionError, "'st'", "struct", path=str(tmp_path), columns=["id", "st"])
    _raises(
        ConversionError,
        "'st'",
        "output_format='numpy'",
        path=str(tmp_path),
        columns=["st"],
        output_format="numpy",
    )
    # The arrow and dict outputs hold them; leaving the column out works too.
    create_dataloader(str(tmp_path), output_format="arrow")
    create_dataloader(str(tmp_path), output_format="dict")
    create_dataloader(str(tmp_path), columns=["id"])


def test_null_fill_unknown_column(data: str) -> None:
    _raises(ConversionError, "null_fill", "['nope']", "output columns", path=data, null_fill={"nope": 0})


# -- ranks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_ranks", "rank", "parts"),
    [
        (2, 2, ("rank=2", "< num_ranks=2", "global rank")),
        (2, -1, ("rank=-1", ">= 0", "get_rank()")),
        (0, 0, ("num_ranks=0", ">= 1", "get_world_size()")),
        (-1, 0, ("num_ranks=-1", ">= 1")),
        (True, 0, ("num_ranks=True", "must be an int")),
        (2, 1.0, ("rank=1.0", "must be an int")),
        (2, "1", ("rank='1'", "must be an int")),
        (None, 1, ("pass both num_ranks and rank or neither", "rank=1")),
        (2, None, ("pass both num_ranks and rank or neither", "num_ranks=2")),
    ],
)
def test_invalid_rank_or_num_ranks(
    data: str, num_ranks: object, rank: object, parts: tuple[str, ...]
) -> None:
    err = _raises(DistributedConfigError, *parts, path=data, num_ranks=num_ranks, rank=rank)
    assert isinstance(err, ConfigError)


# -- sizes and counts ------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "10", None])
def test_invalid_batch_size(data: str, value: object) -> None:
    _raises(ConfigError, f"batch_size={value!r}", "rows per batch", path=data, batch_size=value)


@pytest.mark.parametrize("value", [-1, True, 1.5, "2"])
def test_invalid_num_workers(data: str, value: object) -> None:
    _raises(ConfigError, f"num_workers={value!r}", ">= 0", "None for automatic", path=data, num_workers=value)


@pytest.mark.parametrize(
    ("value", "part"),
    [
        ("12 parsecs", "'128MiB'"),
        (0, "at least 1 byte"),
        (-1, "at least 1 byte"),
        ("0MiB", "at least 1 byte"),
        (True, "'128MiB'"),
        (1.5, "'128MiB'"),
        ([1], "'128MiB'"),
    ],
)
def test_invalid_split_bytes(data: str, value: object, part: str) -> None:
    _raises(ConfigError, f"split_bytes={value!r}", part, path=data, split_bytes=value)


@pytest.mark.parametrize("value", ["128MiB", "64MB", "1.5GiB", "1k", 4096, " 2 mib "])
def test_valid_split_bytes_strings(data: str, value: object) -> None:
    loader, _dataset = create_dataloader(data, split_bytes=value, num_workers=0)
    assert sum(len(b["id"]) for b in loader) == 70


@pytest.mark.parametrize("value", [0, -5, True, 1.5, "10"])
def test_invalid_split_rows(data: str, value: object) -> None:
    _raises(ConfigError, f"split_rows={value!r}", ">= 1", path=data, split_rows=value)


@pytest.mark.parametrize("value", [-1, True, 1.5, "42"])
def test_invalid_shuffle_seed(data: str, value: object) -> None:
    _raises(ConfigError, f"shuffle_seed={value!r}", ">= 0", path=data, shuffle_seed=value)


# -- enumerations ----------------------------------------------------------------------


def test_invalid_format(data: str) -> None:
    _raises(ConfigError, "format='parket'", "'parquet', 'orc', 'csv', 'jsonl'", path=data, format="parket")


def test_invalid_output_format(data: str) -> None:
    _raises(
        ConfigError,
        "output_format='pandas'",
        "'torch', 'numpy', 'arrow', 'dict'",
        path=data,
        output_format="pandas",
    )


def test_invalid_partitioning(data: str) -> None:
    _raises(ConfigError, "partitioning='directory'", "'hive' or None", path=data, partitioning="directory")


def test_invalid_split_strategy_name(data: str) -> None:
    _raises(
        ConfigError, "split_strategy='rowgroup'", "'file', 'row_group'", path=data, split_strategy="rowgroup"
    )


def test_split_strategy_without_generate(data: str) -> None:
    _raises(ConfigError, "has no generate() method", path=data, split_strategy=object())


@pytest.mark.parametrize("param", ["shuffle", "drop_last", "pin_memory", "persistent_workers"])
def test_bool_options_reject_strings(data: str, param: str) -> None:
    # "no" is truthy: accepting it would silently turn the option on.
    extra = {"num_workers": 1} if param == "persistent_workers" else {}
    _raises(ConfigError, f"{param}='no'", "True or False", path=data, **{param: "no"}, **extra)


# -- incompatible options --------------------------------------------------------------


def test_persistent_workers_without_workers(data: str) -> None:
    _raises(
        IncompatibleOptionsError,
        "persistent_workers=True",
        "num_workers=0",
        "set num_workers",
        path=data,
        persistent_workers=True,
        num_workers=0,
    )


def test_prefetch_factor_without_workers(data: str) -> None:
    _raises(
        IncompatibleOptionsError,
        "prefetch_factor=2",
        "num_workers=0",
        path=data,
        prefetch_factor=2,
        num_workers=0,
    )


@pytest.mark.parametrize(("param", "value"), [("split_bytes", "1MiB"), ("split_rows", 10)])
def test_split_size_with_file_strategy(data: str, param: str, value: object) -> None:
    _raises(
        IncompatibleOptionsError,
        "split_strategy='file'",
        f"{param}={value!r}",
        "split_strategy='row_group'",
        path=data,
        split_strategy="file",
        **{param: value},
    )


def test_split_size_with_custom_strategy(data: str) -> None:
    class Strategy:
        def generate(
            self, files: Any, num_workers: int, epoch: int, *, num_ranks: int, rank: int
        ) -> list[Any]:
            return []

    _raises(
        IncompatibleOptionsError, "custom", "Strategy", path=data, split_strategy=Strategy(), split_rows=5
    )


# -- other parameters ------------------------------------------------------------------


def test_invalid_timeout(data: str) -> None:
    _raises(ConfigError, "timeout=-1", ">= 0", path=data, timeout=-1, num_workers=1)


def test_invalid_prefetch_factor(data: str) -> None:
    _raises(ConfigError, "prefetch_factor=0", ">= 1", path=data, prefetch_factor=0, num_workers=1)


def test_invalid_storage_options(data: str) -> None:
    _raises(ConfigError, "storage_options='x'", "dict", path=data, storage_options="x")


def test_invalid_collate_fn(data: str) -> None:
    _raises(ConfigError, "collate_fn=3", "callable", path=data, collate_fn=3)


def test_invalid_path_type() -> None:
    with pytest.raises(ConfigError, match=r"path=3 must be a string"):
        create_dataloader(3)  # type: ignore[arg-type]


def test_set_epoch_rejects_negative(data: str) -> None:
    _, dataset = create_dataloader(data, num_workers=0)
    with pytest.raises(ConfigError, match=r"epoch=-1"):
        dataset.set_epoch(-1)
