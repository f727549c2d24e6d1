"""IcebergDataset on real tables in a SQLite SqlCatalog, with position and equality deletes."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import GreaterThanOrEqual
from pyiceberg.types import LongType, StringType

from tests.fixtures.iceberg import (
    commit_deletes,
    create_id_table,
    data_files,
    equality_delete_file,
    id_table,
    oracle_filtered_ids,
    oracle_ids,
    position_delete_file,
)
from torch_dataloader_utils import IcebergDataset
from torch_dataloader_utils.errors import (
    ConfigError,
    IncompatibleOptionsError,
    PathNotFoundError,
    UnknownColumnError,
)

Catalog = tuple[dict[str, str], SqlCatalog]


def read_all(table: str, config: dict[str, str], **kwargs: Any) -> list[Any]:
    """Every batch of every rank, read through a real DataLoader (numpy output)."""
    num_ranks = kwargs.pop("num_ranks", 1)
    kwargs.setdefault("output_format", "numpy")
    out = []
    for rank in range(num_ranks):
        loader, _ = IcebergDataset.create_dataloader(
            table, catalog_config=config, num_ranks=num_ranks, rank=rank, **kwargs
        )
        out.extend(loader)
    return out


def ids_of(batches: list[Any]) -> list[int]:
    return sorted(int(i) for b in batches for i in b["id"])


def read_ranks(
    table: str, config: dict[str, str], num_ranks: int, **kwargs: Any
) -> tuple[list[Any], list[int]]:
    """Each rank's batches (real DataLoaders) and the ids equal batches dropped from the epoch.

    Checks that every rank yields the same number of batches, equal to ``len(loader)``.
    """
    kwargs.setdefault("output_format", "numpy")
    per_rank = []
    dropped: list[int] = []
    for rank in range(num_ranks):
        loader, ds = IcebergDataset.create_dataloader(
            table, catalog_config=config, num_ranks=num_ranks, rank=rank, **kwargs
        )
        per_rank.append(list(loader))
        assert len(per_rank[-1]) == len(loader)
        plan = ds.plan()
        dropped = [i for c in plan.dropped for b in ds._reader.read(c) for i in b.column("id").to_pylist()]
        assert len(dropped) == sum(c.num_rows for c in plan.dropped) < num_ranks
    assert len({len(batches) for batches in per_rank}) == 1
    return per_rank, dropped


def read_in_process(ds: IcebergDataset) -> list[int]:
    """Read every (rank, worker)'s chunks of the epoch plan with the dataset's reader."""
    ids: list[int] = []
    for chunk in ds.plan().all_chunks():
        for batch in ds._reader.read(chunk):
            ids.extend(batch.column("id").to_pylist())
    return sorted(ids)


@pytest.fixture
def deleted_table(iceberg_catalog: Catalog) -> Any:
    """Three appends (ids 0..299) with position deletes and equality deletes across sequence numbers."""
    _, catalog = iceberg_catalog
    t = create_id_table(catalog)
    t.append(id_table(0, 100))
    t.append(id_table(100, 100))
    first, second = data_files(t)
    t = commit_deletes(t, [position_delete_file(t, {first: [0, 5, 17, 99], second: range(30, 45)})])
    t = commit_deletes(t, [equality_delete_file(t, {"id": [3, 150, 250]})])
    # Appended after the equality delete: its id 250 must survive (higher sequence number).
    t.append(id_table(200, 100))
    return t


def test_deletes_match_independent_reader_across_ranks_and_workers(
    iceberg_catalog: Catalog, deleted_table: Any
) -> None:
    config, _ = iceberg_catalog
    expected = oracle_ids(deleted_table)
    assert 250 in expected
    assert 3 not in expected
    assert 150 not in expected
    per_rank, dropped = read_ranks(
        "ns.t", config, num_ranks=2, num_workers=2, split_rows=20, batch_size=16, timeout=60
    )
    got = ids_of([b for batches in per_rank for b in batches])
    assert len(got) == len(set(got))
    assert not set(got) & set(dropped)
    assert sorted(got + dropped) == expected  # every live row once, less < num_ranks dropped


@pytest.mark.parametrize("equal_batches", ["drop", "pad"])
def test_equal_batches_with_equality_deletes_on_three_ranks(
    iceberg_catalog: Catalog, equal_batches: str
) -> None:
    config, catalog = iceberg_catalog
    t = create_id_table(catalog)
    t.append(id_table(0, 100))
    (first,) = data_files(t)  # ids 0..99 at positions 0..99
    t.append(id_table(100, 100))
    t = commit_deletes(t, [position_delete_file(t, {first: [0, 5]})])
    t = commit_deletes(t, [equality_delete_file(t, {"id": [5, 7, 150, 210]})])  # 5: deleted twice
    t.append(id_table(200, 30))  # after the equality delete: id 210 survives
    expected = oracle_ids(t)
    assert len(expected) == 226
    assert len(expected) % 3 == 1  # uneven: one row dropped, or two repeats padded
    kwargs: dict[str, Any] = dict(num_workers=2, split_rows=15, batch_size=8, timeout=60)
    per_rank, dropped = read_ranks("ns.t", config, 3, equal_batches=equal_batches, **kwargs)
    if equal_batches == "drop":
        got = ids_of([b for batches in per_rank for b in batches])
        assert len(got) == len(set(got)) == 225
        assert len(dropped) == 1
        assert sorted(got + dropped) == expected
        return
    assert dropped == []
    real: list[int] = []
    repeats: list[int] = []
    for batches in per_rank:
        assert sum(len(b["id"]) for b in batches) == 76  # every rank: ceil(226 / 3) rows
        for b in batches:
            flags = b["_is_padding"].astype(bool)
            real.extend(int(i) for i in b["id"][~flags])
            repeats.extend(int(i) for i in b["id"][flags])
    assert sorted(real) == expected  # every live row exactly once unflagged
    assert len(repeats) == 2
    assert set(repeats) <= set(expected)


def test_equality_deletes_match_nulls_several_columns_and_promoted_types(iceberg_catalog: Catalog) -> None:
    config, catalog = iceberg_catalog
    schema = pa.schema([("id", pa.int64()), ("a", pa.int32()), ("s", pa.string())])
    t = catalog.create_table("ns.eq", schema=schema)
    a = [None if i % 3 == 0 else i for i in range(10)]
    t.append(pa.table({"id": list(range(10)), "a": a, "s": [f"row-{i}" for i in range(10)]}, schema=schema))
    t = commit_deletes(t, [equality_delete_file(t, {"a": [None]})])  # nulls match nulls: 0, 3, 6, 9
    t = commit_deletes(t, [equality_delete_file(t, {"id": [1, 2], "s": ["row-1", "nope"]})])  # 1 only
    with t.update_schema() as u:
        u.update_column("a", LongType())  # the old file's int column is promoted to match
    t = t.refresh()
    t = commit_deletes(t, [equality_delete_file(t, {"a": [5]})])
    new = pa.table({"id": [10, 11, 12], "a": pa.array([None, 11, 12], pa.int64()), "s": ["x", "y", "z"]})
    t.append(new)  # after every delete: all three survive
    ds = IcebergDataset("ns.eq", catalog_config=config, split_rows=3)
    assert ds.exact_row_counts
    assert sum(f.live_rows for f in ds.files) == 7
    assert sum(c.num_rows for c in ds.plan().all_chunks()) == 7
    assert read_in_process(ds) == [2, 4, 7, 8, 10, 11, 12] == oracle_ids(t)
    assert ds.scan.delete_files_read == 3
    assert ds.scan.equality_files_read == 1  # the new file is older than no delete


def test_position_deletes_match_pyiceberg_scan(iceberg_catalog: Catalog) -> None:
    config, catalog = iceberg_catalog
    t = create_id_table(catalog)
    t.append(id_table(0, 120))
    (path,) = data_files(t)
    t = commit_deletes(t, [position_delete_file(t, {path: [1, 2, 3, 59, 60, 119]})])
    t = commit_deletes(t, [position_delete_file(t, {path: [3, 70]})])  # overlapping delete files
    expected = sorted(t.scan().to_arrow().column("id").to_pylist())
    assert len(expected) == 120 - 7
    ds = IcebergDataset("ns.t", catalog_config=config, split_rows=10)
    assert len(ds.plan().all_chunks()) == 12  # sub-file splits stay on
    assert read_in_process(ds) == expected


def test_each_chunk_applies_exactly_its_deletes_and_counts_them(iceberg_catalog: Catalog) -> None:
    config, catalog = iceberg_catalog
    t = create_id_table(catalog)
    t.append(id_table(0, 120))  # one file: the row at position p has id p
    (path,) = data_files(t)
    pos = {0, 9, 10, 11, 55, 119}
    t = commit_deletes(t, [position_delete_file(t, {path: pos})])
    eq = {10, 12, 56, 57}  # 10 is also position-deleted: counted once
    t = commit_deletes(t, [equality_delete_file(t, {"id": sorted(eq)})])
    ds = IcebergDataset("ns.t", catalog_config=config, split_rows=10, columns=["id"])
    chunks = ds.plan().all_chunks()
    assert len(chunks) == 12
    for chunk in chunks:
        ids = [i for b in ds._reader.read(chunk) for i in b.column("id").to_pylist()]
        rows = set(range(chunk.start, chunk.stop))
        assert ids == sorted(rows - pos - eq)
        assert chunk.num_rows == len(rows - pos - eq)  # both kinds of deletes are counted exactly
    assert sum(c.num_rows for c in chunks) == 120 - len(pos | eq) == 111
    assert ds.exact_row_counts
    (info,) = ds.files
    assert info.deleted.tolist() == sorted(pos | eq)
    # Each delete file was read once, at discovery, and the data file's equality column once.
    assert ds.scan.delete_files_read == 2
    assert ds.scan.equality_files_read == 1


def test_schema_evolution_rename_add_drop_reorder_and_promote(iceberg_catalog: Catalog) -> None:
    config, catalog = iceberg_catalog
    schema = pa.schema([("id", pa.int64()), ("a", pa.int32()), ("b", pa.string()), ("c", pa.float64())])
    t = catalog.create_table("ns.evo", schema=schema)
    old = pa.table(
        {"id": pa.array([0, 1, 2], pa.int64()), "a": pa.array([10, 11, 12], pa.int32()),
         "b": ["x0", "x1", "x2"], "c": [0.5, 1.5, 2.5]},
        schema=schema,
    )  # fmt: skip
    t.append(old)
    (old_path,) = data_files(t)
    with t.update_schema() as u:
        u.rename_column("b", "label")
        u.delete_column("c")
        u.add_column("extra", StringType())
        u.update_column("a", LongType())  # int -> long promotion
    with t.update_schema() as u:
        u.move_first("label")
    t = t.refresh()
    new = pa.table(
        {"label": ["y3"], "id": pa.array([3], pa.int64()), "a": pa.array([13], pa.int64()), "extra": ["e3"]}
    )
    t.append(new)
    t = commit_deletes(t, [position_delete_file(t, {old_path: [1]})])
    batches = read_all("ns.evo", config, output_format="arrow", batch_size=100)
    table = pa.Table.from_batches(batches).sort_by("id")
    assert table.schema.names == ["label", "id", "a", "extra"]
    assert table.column("id").to_pylist() == [0, 2, 3]
    assert table.column("label").to_pylist() == ["x0", "x2", "y3"]
    assert table.column("a").type == pa.int64()
    assert table.column("a").to_pylist() == [10, 12, 13]
    assert table.column("extra").to_pylist() == [None, None, "e3"]
    # A column re-added under a dropped column's name is a new field: old files give nulls.
    with t.update_schema() as u:
        u.add_column("c", StringType())
    batches = read_all("ns.evo", config, output_format="arrow", columns=["id", "c"])
    assert pa.Table.from_batches(batches).column("c").to_pylist() == [None, None, None]


def test_time_travel_by_snapshot_id_and_timestamp(iceberg_catalog: Catalog) -> None:
    config, catalog = iceberg_catalog
    t = create_id_table(catalog)
    t.append(id_table(0, 10))
    first = t.current_snapshot()
    time.sleep(0.01)
    t.append(id_table(10, 10))
    t = commit_deletes(t, [equality_delete_file(t, {"id": [0, 15]})])
    assert ids_of(read_all("ns.t", config)) == [i for i in range(20) if i not in (0, 15)]
    assert ids_of(read_all("ns.t", config, snapshot_id=first.snapshot_id)) == list(range(10))
    as_of = dt.datetime.fromtimestamp(first.timestamp_ms / 1000, tz=dt.UTC)
    assert ids_of(read_all("ns.t", config, as_of=as_of)) == list(range(10))
    assert ids_of(read_all("ns.t", config, as_of=first.timestamp_ms)) == list(range(10))
    with pytest.raises(ConfigError, match="before the table's first snapshot"):
        IcebergDataset("ns.t", catalog_config=config, as_of=first.timestamp_ms - 10_000)
    with pytest.raises(ConfigError, match="snapshot_id=123 is not a snapshot"):
        IcebergDataset("ns.t", catalog_config=config, snapshot_id=123)
    with pytest.raises(IncompatibleOptionsError, match="pass one of them"):
        IcebergDataset("ns.t", catalog_config=config, snapshot_id=first.snapshot_id, as_of=first.timestamp_ms)
    with pytest.raises(ConfigError, match="no time zone"):
        IcebergDataset("ns.t", catalog_config=config, as_of=dt.datetime(2020, 1, 1))


@pytest.mark.parametrize(
    ("expr", "prunes"),
    [
        (pc.field("id") >= 100, True),
        (pc.field("id") > 99.5, False),  # oddly typed: not used for pruning, rows still exact
        ((pc.field("id") >= 100) & (pc.field("s") != "row-150"), True),
        ((pc.field("id") < 5) | (pc.field("id") > 195), False),
        (~(pc.field("id") < 100), True),
    ],
)
def test_filters_prune_files_and_always_filter_rows(
    iceberg_catalog: Catalog, deleted_table: Any, expr: pc.Expression, prunes: bool
) -> None:
    config, _ = iceberg_catalog
    live = pa.table({"id": oracle_ids(deleted_table)})
    live = live.append_column("s", pa.array([f"row-{i}" for i in live.column("id").to_pylist()]))
    expected = sorted(live.filter(expr).column("id").to_pylist())
    ds = IcebergDataset("ns.t", catalog_config=config, filters=expr, columns=["id"])
    assert read_in_process(ds) == expected
    assert (len(ds.files) < 3) is prunes
    assert ds.scan.output_columns == ("id",)


def test_scan_filter_prunes_with_a_native_expression(iceberg_catalog: Catalog, deleted_table: Any) -> None:
    config, _ = iceberg_catalog
    ds = IcebergDataset("ns.t", catalog_config=config, scan_filter=GreaterThanOrEqual("id", 200))
    assert len(ds.files) == 1
    assert read_in_process(ds) == list(range(200, 300))
    with pytest.raises(ConfigError, match=r"scan_filter=.*must be a pyiceberg expression"):
        IcebergDataset("ns.t", catalog_config=config, scan_filter=pc.field("id") > 1)


def test_identity_partitions_scope_deletes_and_prune(iceberg_catalog: Catalog) -> None:
    from pyiceberg.transforms import IdentityTransform

    config, catalog = iceberg_catalog
    schema = id_table(0, 1).schema
    t = catalog.create_table("ns.p", schema=schema)
    with t.update_spec() as u:
        u.add_field("label", IdentityTransform(), "label")
    t = t.refresh()
    t.append(id_table(0, 70))  # one file per label value 0..6
    files = t.scan().plan_files()
    by_label = {f.file.partition[0]: f.file for f in files}
    assert sorted(by_label) == list(range(7))
    # Equality delete on id 7 (label 0) and 8 (label 1), scoped to label 0's partition only.
    eq = equality_delete_file(t, {"id": [7, 8]}, partition=by_label[0].partition)
    pos = position_delete_file(t, {by_label[2].file_path: [0]}, partition=by_label[2].partition)
    t = commit_deletes(t, [eq, pos])
    expected = oracle_ids(t)
    assert 7 not in expected
    assert 8 in expected
    assert 2 not in expected
    assert ids_of(read_all("ns.p", config, num_workers=2, timeout=60)) == expected
    ds = IcebergDataset("ns.p", catalog_config=config, filters=pc.field("label") == 3)
    assert len(ds.files) == 1
    assert read_in_process(ds) == [i for i in range(70) if i % 7 == 3]


def test_empty_table_and_table_without_snapshot_yield_zero_rows(iceberg_catalog: Catalog) -> None:
    config, catalog = iceberg_catalog
    create_id_table(catalog, "ns.empty")
    loader, ds = IcebergDataset.create_dataloader("ns.empty", catalog_config=config, num_workers=None)
    assert ds.snapshot_id is None
    assert list(loader) == []
    t = create_id_table(catalog, "ns.emptied")
    t.append(id_table(0, 5))
    t.delete("id >= 0")
    loader, ds = IcebergDataset.create_dataloader("ns.emptied", catalog_config=config)
    assert ds.snapshot_id is not None
    assert list(loader) == []


def test_bad_table_names_and_columns_are_clear_errors(iceberg_catalog: Catalog, tmp_path: Path) -> None:
    config, catalog = iceberg_catalog
    create_id_table(catalog)
    with pytest.raises(ConfigError, match=r"table='t' must be 'namespace.table'"):
        IcebergDataset("t", catalog_config=config)
    with pytest.raises(PathNotFoundError, match=r"table='ns\.missing' does not exist"):
        IcebergDataset("ns.missing", catalog_config=config)
    with pytest.raises(UnknownColumnError, match=r"\['nope'\] not found"):
        IcebergDataset("ns.t", catalog_config=config, columns=["id", "nope"])
    with pytest.raises(ConfigError, match=r"catalog_config=.*must be a dict"):
        IcebergDataset("ns.t", catalog_config="sqlite:///x")  # type: ignore[arg-type]
    # "catalog.ns.table" names the catalog.
    assert IcebergDataset("default.ns.t", catalog_config=config).snapshot_id is None  # catalog.ns.table


def test_outputs_torch_tensors_through_workers(iceberg_catalog: Catalog, deleted_table: Any) -> None:
    config, _ = iceberg_catalog
    loader, ds = IcebergDataset.create_dataloader(
        "ns.t", catalog_config=config, num_workers=2, batch_size=32, shuffle=True, shuffle_seed=3,
        columns=["id", "x"], split_rows=25, timeout=60,
    )  # fmt: skip
    seen: list[int] = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        ids = [int(i) for b in loader for i in b["id"].tolist()]
        assert sorted(ids) == oracle_ids(deleted_table)
        seen.append(ids[0])
    assert np.all(np.isfinite(np.array(seen)))


def _write_with_ids(path: Path, table: pa.Table, ids: dict[str, int]) -> None:
    import pyarrow.parquet as pq

    schema = pa.schema([f.with_metadata({b"PARQUET:field_id": str(ids[f.name])}) for f in table.schema])
    pq.write_table(table.cast(schema), path)


def test_identity_partition_value_fills_a_column_the_file_lacks(
    iceberg_catalog: Catalog, tmp_path: Path
) -> None:
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.typedef import Record

    config, catalog = iceberg_catalog
    t = catalog.create_table("ns.p", schema=id_table(0, 1).schema)
    with t.update_spec() as u:
        u.add_field("label", IdentityTransform(), "label")
    t = t.refresh()
    ids = {f.name: f.field_id for f in t.schema().fields}
    # A data file written without its partition column (as some writers do).
    rows = id_table(0, 6).drop_columns(["label"])
    path = tmp_path / "no-label.parquet"
    _write_with_ids(path, rows, ids)
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f"file://{path}",
        file_format=FileFormat.PARQUET,
        partition=Record(4),
        record_count=6,
        file_size_in_bytes=path.stat().st_size,
        spec_id=t.spec().spec_id,
    )
    with t.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(data_file)
    t = t.refresh()
    t = commit_deletes(t, [position_delete_file(t, {f"file://{path}": [1]}, partition=Record(4))])
    batches = read_all("ns.p", config, output_format="arrow")
    table = pa.Table.from_batches(batches).sort_by("id")
    assert table.column("id").to_pylist() == [0, 2, 3, 4, 5]
    assert table.column("label").to_pylist() == [4] * 5
    assert table.column("s").to_pylist() == ["row-0", "row-2", "row-3", "row-4", "row-5"]


def test_files_without_field_ids_use_the_name_mapping(iceberg_catalog: Catalog, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    config, catalog = iceberg_catalog
    t = create_id_table(catalog)
    path = tmp_path / "imported.parquet"
    pq.write_table(id_table(0, 8), path)  # no field ids: add_files sets a name mapping
    t.add_files([f"file://{path}"])
    with t.update_schema() as u:
        u.rename_column("s", "text")
    t = t.refresh()
    t = commit_deletes(t, [equality_delete_file(t, {"text": ["row-3"]})])
    batches = read_all("ns.t", config, output_format="arrow", columns=["id", "text"])
    table = pa.Table.from_batches(batches).sort_by("id")
    assert table.column("id").to_pylist() == [0, 1, 2, 4, 5, 6, 7]
    assert table.column("text").to_pylist() == [f"row-{i}" for i in (0, 1, 2, 4, 5, 6, 7)]


def test_stop_after_cuts_after_live_rows(iceberg_catalog: Catalog) -> None:
    config, catalog = iceberg_catalog
    t = create_id_table(catalog)
    t.append(id_table(0, 50))
    (path,) = data_files(t)
    t = commit_deletes(t, [position_delete_file(t, {path: [2, 3, 4, 10, 49]})])
    ds = IcebergDataset("ns.t", catalog_config=config)
    (info,) = ds.files
    assert info.live_rows == 45
    for start in range(50):
        for rows in range(info.rows_in(start, 50) + 1):
            stop = info.stop_after(start, rows)
            assert info.rows_in(start, stop) == rows
            assert stop == start or info.rows_in(start, stop - 1) == rows - 1  # the cut is tight
    with pytest.raises(ValueError, match="fewer than 46 live rows"):
        info.stop_after(0, 46)


def test_planner_options_are_forwarded_to_the_core(iceberg_catalog: Catalog, deleted_table: Any) -> None:
    config, _ = iceberg_catalog
    with pytest.raises(TypeError, match="no_such_option"):
        IcebergDataset("ns.t", catalog_config=config, no_such_option=1)


def test_count_rows_false_keeps_filters_with_equal_batches_an_error(
    iceberg_catalog: Catalog, deleted_table: Any
) -> None:
    config, _ = iceberg_catalog
    expr = pc.field("id") >= 100
    with pytest.raises(
        IncompatibleOptionsError,
        match=r"equal_batches='drop' needs exact row counts, but filters=.* count_rows=False did not "
        r"count them \(count_rows=None or True counts them",
    ):
        IcebergDataset("ns.t", catalog_config=config, filters=expr, num_ranks=2, rank=0, count_rows=False)
    ds = IcebergDataset("ns.t", catalog_config=config, filters=expr, num_ranks=2, rank=1, equal_batches="off")
    assert not ds.exact_row_counts  # nothing needs counts: none taken
    assert ds.scan.filter_files_read == 0
    with pytest.raises(TypeError, match=r"unknown before reading.*count_rows=True counts them"):
        len(ds)
    assert not IcebergDataset("ns.t", catalog_config=config, filters=expr).exact_row_counts  # one rank
    ds = IcebergDataset("ns.t", catalog_config=config, filters=expr, count_rows=True, batch_size=10)
    assert ds.exact_row_counts
    expected = [i for i in oracle_ids(deleted_table) if i >= 100]
    assert len(ds) == -(-len(expected) // 10)
    assert read_in_process(ds) == expected
    with pytest.raises(ConfigError, match=r"count_rows='yes' must be True or False"):
        IcebergDataset("ns.t", catalog_config=config, filters=expr, count_rows="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"count_rows=1 must be True or False"):
        IcebergDataset.create_dataloader("ns.t", catalog_config=config, count_rows=1)


FILTER = (pc.field("label") != 2) & ((pc.field("x") < 40.0) | (pc.field("s") >= "row-15"))


@pytest.mark.parametrize("equal_batches", ["drop", "pad"])
def test_filters_with_equal_batches_on_three_ranks_are_counted_exactly(
    iceberg_catalog: Catalog, equal_batches: str
) -> None:
    config, catalog = iceberg_catalog
    t = create_id_table(catalog)
    t.append(id_table(0, 100))
    (first,) = data_files(t)
    t.append(id_table(100, 100))
    t = commit_deletes(t, [position_delete_file(t, {first: [0, 5, 9, 16, 50]})])
    t = commit_deletes(t, [equality_delete_file(t, {"id": [5, 7, 8, 150, 160, 210]})])
    t.append(id_table(200, 40))  # after the equality delete: id 210 survives
    expected = oracle_filtered_ids(t, FILTER)
    assert 210 in expected
    assert not {0, 5, 7, 8, 150, 2, 9}.intersection(expected)  # deleted, or filtered out
    assert len(expected) % 3 != 0  # uneven: equal batches must drop or pad
    kwargs: dict[str, Any] = dict(num_workers=2, split_rows=15, batch_size=8, timeout=60, filters=FILTER)
    for rank in range(3):  # every chunk's planned count is exactly the rows it reads
        ds = IcebergDataset("ns.t", catalog_config=config, num_ranks=3, rank=rank, split_rows=15,
                            filters=FILTER, equal_batches=equal_batches)  # fmt: skip
        assert ds.exact_row_counts
        assert ds.scan.filter_files_read == 3
        for chunk in ds.plan().all_chunks():
            assert sum(b.num_rows for b in ds._reader.read(chunk)) == chunk.num_rows
    per_rank, dropped = read_ranks("ns.t", config, 3, equal_batches=equal_batches, **kwargs)
    if equal_batches == "drop":
        got = ids_of([b for batches in per_rank for b in batches])
        assert len(got) == len(set(got)) == len(expected) - len(dropped)
        assert 0 < len(dropped) < 3
        assert sorted(got + dropped) == expected
        return
    assert dropped == []
    real: list[int] = []
    repeats: list[int] = []
    for batches in per_rank:
        assert sum(len(b["id"]) for b in batches) == -(-len(expected) // 3)
        for b in batches:
            flags = b["_is_padding"].astype(bool)
            real.extend(int(i) for i in b["id"][~flags])
            repeats.extend(int(i) for i in b["id"][flags])
    assert sorted(real) == expected  # every filtered live row exactly once unflagged
    assert 0 < len(repeats) < 3
    assert set(repeats) <= set(expected)


def test_filtered_rows_join_position_and_equality_deletes(iceberg_catalog: Catalog) -> None:
    config, catalog = iceberg_catalog
    t = create_id_table(catalog)
    t.append(id_table(0, 120))  # one file: the row at position p has id p
    (path,) = data_files(t)
    pos = {0, 9, 10, 55, 119}
    t = commit_deletes(t, [position_delete_file(t, {path: pos})])
    eq = {10, 12, 56, 66}
    t = commit_deletes(t, [equality_delete_file(t, {"id": sorted(eq)})])
    expr = (pc.field("label") != 3) & (pc.field("id") != 12)  # 10, 12, 66 are also deleted: once
    fail = {i for i in range(120) if i % 7 == 3 or i == 12}
    ds = IcebergDataset(
        "ns.t", catalog_config=config, split_rows=10, columns=["id"], filters=expr, count_rows=True
    )
    (info,) = ds.files
    assert info.deleted.tolist() == sorted(pos | eq | fail)
    assert ds.scan.equality_files_read == 1
    assert ds.scan.filter_files_read == 1  # the same single pass over the data file
    assert ds.scan.read_columns == ("id", "label")
    for chunk in ds.plan().all_chunks():
        ids = [i for b in ds._reader.read(chunk) for i in b.column("id").to_pylist()]
        assert ids == sorted(set(range(chunk.start, chunk.stop)) - pos - eq - fail)
        assert chunk.num_rows == len(ids)
    assert read_in_process(ds) == oracle_filtered_ids(t, expr)


def test_counted_filters_read_columns_by_field_id(iceberg_catalog: Catalog) -> None:
    config, catalog = iceberg_catalog
    schema = pa.schema([("id", pa.int64()), ("a", pa.int32())])
    t = catalog.create_table("ns.evo", schema=schema)
    t.append(pa.table({"id": list(range(6)), "a": pa.array([5, None, 7, 8, 9, 10], pa.int32())}))
    with t.update_schema() as u:
        u.update_column("a", LongType())
        u.rename_column("a", "b")
        u.add_column("extra", StringType())
    t = t.refresh()
    t.append(pa.table({"id": [6, 7, 8], "b": pa.array([6, 20, None], pa.int64()), "extra": ["e", None, "e"]}))
    # b: the old file's renamed, promoted a; extra: nulls in the old file.
    expr = (pc.field("b") >= 7) & pc.field("extra").is_null()
    ds = IcebergDataset("ns.evo", catalog_config=config, filters=expr, columns=["id"], num_ranks=2, rank=0)
    assert ds.exact_row_counts
    assert sum(f.live_rows for f in ds.files) == 5  # 2, 3, 4, 5 and 7
    padded = ids_of(read_all("ns.evo", config, filters=expr, num_ranks=2, equal_batches="pad"))
    # Which row pads depends on the data files' order (their paths hold random UUIDs).
    assert sorted(set(padded)) == [2, 3, 4, 5, 7]
    assert len(padded) == 6  # 5 live rows padded to 3 per rank: one repeat


def test_decode_thread_is_remade_in_forked_workers(iceberg_catalog: Catalog) -> None:
    """A reader used in the main process (decode-ahead thread started) still reads in forked workers."""
    config, catalog = iceberg_catalog
    t = create_id_table(catalog)
    t.append(id_table(0, 3000))
    (path,) = data_files(t)
    commit_deletes(t, [position_delete_file(t, {path: list(range(0, 3000, 7))})])
    expected = sorted(set(range(3000)) - set(range(0, 3000, 7)))
    ds = IcebergDataset("ns.t", catalog_config=config, split_rows=500, batch_size=64)
    assert sorted(int(i) for b in ds for i in b["id"]) == expected  # main process: thread started
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60
    )
    assert sorted(int(i) for b in loader for i in b["id"]) == expected
