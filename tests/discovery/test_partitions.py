"""Hive partitions: typed values, nulls, and pruning of whole files by partition filters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.fixtures.e2e import assert_exactly_once, column_chunk_range, corrupt, epoch_ids
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.config import FileFormat, FileSourceConfig
from torch_dataloader_utils.discovery import discover
from torch_dataloader_utils.discovery.listing import ListedFile
from torch_dataloader_utils.discovery.partitions import infer_partitions
from torch_dataloader_utils.errors import ReadError, SchemaMismatchError


def _listed(*rels: str) -> list[ListedFile]:
    return [ListedFile(f"/r/{rel}", 1, None, "/r") for rel in rels]


def test_types_inferred_per_key() -> None:
    parts = infer_partitions(
        _listed(
            "i=1/f=0.5/s=a/x.parquet",
            "i=-2/f=3/s=7/y.parquet",
            "i=__HIVE_DEFAULT_PARTITION__/f=1e3/s=__HIVE_DEFAULT_PARTITION__/z.parquet",
        )
    )
    assert parts.schema == pa.schema([("i", pa.int64()), ("f", pa.float64()), ("s", pa.string())])
    assert parts.values["/r/i=1/f=0.5/s=a/x.parquet"] == (1, 0.5, "a")
    assert parts.values["/r/i=-2/f=3/s=7/y.parquet"] == (-2, 3.0, "7")
    z = parts.values["/r/i=__HIVE_DEFAULT_PARTITION__/f=1e3/s=__HIVE_DEFAULT_PARTITION__/z.parquet"]
    assert z == (None, 1000.0, None)


def test_different_keys_are_a_mismatch() -> None:
    with pytest.raises(SchemaMismatchError, match=r"partition keys \['a'\].*\['b'\]"):
        infer_partitions(_listed("a=1/x.parquet", "b=1/y.parquet"))


def test_no_keys() -> None:
    parts = infer_partitions(_listed("x.parquet", "sub/y.parquet"))
    assert parts.schema.names == []


def test_columns_and_expression() -> None:
    parts = infer_partitions(_listed("k=3/s=__HIVE_DEFAULT_PARTITION__/x.parquet"))
    cols = dict(parts.columns("/r/k=3/s=__HIVE_DEFAULT_PARTITION__/x.parquet", 2, ["k", "s"]))
    assert cols["k"].to_pylist() == [3, 3]
    assert cols["k"].type == pa.int64()
    assert cols["s"].to_pylist() == [None, None]
    expr = parts.expression("/r/k=3/s=__HIVE_DEFAULT_PARTITION__/x.parquet")
    assert expr is not None
    assert expr.equals((pc.field("k") == pa.scalar(3, pa.int64())) & pc.field("s").is_null())


# -- end to end over a hive tree ---------------------------------------------------------

YEARS = [2021, 2022, 2023]
REGIONS = ["eu", "us", None]


def _hive_tree(root: Path, rows: int = 40) -> dict[tuple[int, str | None, float], list[int]]:
    """year=int / region=str|null / w=float; each file's ids are listed by its key."""
    out = {}
    next_id = 0
    for y in YEARS:
        for r in REGIONS:
            w = (y - 2020) / 2
            region = "__HIVE_DEFAULT_PARTITION__" if r is None else r
            d = root / f"year={y}" / f"region={region}" / f"w={w}"
            d.mkdir(parents=True)
            ids = np.arange(next_id, next_id + rows, dtype=np.int64)
            pq.write_table(pa.table({"id": ids, "v": ids * 2}), d / "part-0.parquet", row_group_size=16)
            (d / "_SUCCESS").write_bytes(b"")
            out[(y, r, w)] = ids.tolist()
            next_id += rows
    return out


@pytest.fixture
def hive(tmp_path: Path) -> tuple[Path, dict[tuple[int, str | None, float], list[int]]]:
    root = tmp_path / "hive"
    return root, _hive_tree(root)


def test_partition_columns_are_typed_in_batches(hive: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    root, layout = hive
    loader, dataset = create_dataloader(
        str(root), partitioning="hive", num_workers=2, batch_size=25, output_format="arrow"
    )
    schema = dataset.discovered.output_schema
    assert schema == pa.schema(
        [
            ("id", pa.int64()),
            ("v", pa.int64()),
            ("year", pa.int64()),
            ("region", pa.string()),
            ("w", pa.float64()),
        ]
    )
    rows = {}
    for batch in loader:
        for row in batch.to_pylist():
            rows[row["id"]] = (row["year"], row["region"], row["w"])
    expected = {i: key for key, ids in layout.items() for i in ids}
    assert rows == expected


def test_partition_columns_in_torch_output(hive: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    root, layout = hive
    loader, _ = create_dataloader(
        str(root), partitioning="hive", columns=["id", "year", "w"], num_workers=0, batch_size=1000
    )
    (batch,) = list(loader)
    assert batch["year"].dtype == batch["id"].dtype
    assert str(batch["w"].dtype) == "torch.float64"
    by_id = {i: (y, w) for (y, _, w), ids in layout.items() for i in ids}
    for i, y, w in zip(batch["id"].tolist(), batch["year"].tolist(), batch["w"].tolist(), strict=True):
        assert by_id[i] == (y, w)


@pytest.mark.parametrize(
    ("expr", "keep"),
    [
        (pc.field("year") == 2022, lambda y, r, w: y == 2022),
        (pc.field("year") >= 2022, lambda y, r, w: y >= 2022),
        (pc.field("region") == "eu", lambda y, r, w: r == "eu"),
        (pc.field("region").is_null(), lambda y, r, w: r is None),
        (pc.field("w") > 1.0, lambda y, r, w: w > 1.0),
        ((pc.field("year") == 2021) & (pc.field("region") == "us"), lambda y, r, w: (y, r) == (2021, "us")),
    ],
)
def test_partition_filters_prune_whole_files(
    hive: tuple[Path, dict], expr: pc.Expression, keep: object
) -> None:  # type: ignore[type-arg]
    root, layout = hive
    found = discover(
        str(root), FileSourceConfig(format=FileFormat.PARQUET, filters=expr, partitioning="hive")
    )
    kept_keys = [k for k in layout if keep(*k)]  # type: ignore[operator]
    live = [f for f in found.files if f.live_rows]
    assert len(live) == len(kept_keys)
    for f in found.files:
        assert f.live_rows in (0, 40), "a partition filter keeps or drops a whole file"
    # Prove pruned files are never read: corrupt their data pages, then read.
    for f in found.files:
        if not f.live_rows:
            path = Path(f.path)
            groups = pq.ParquetFile(path).metadata.num_row_groups
            corrupt(path, [column_chunk_range(path, g, c) for g in range(groups) for c in ("id", "v")])
    loader, _ = create_dataloader(
        str(root), partitioning="hive", filters=expr, num_workers=0, batch_size=7, columns=["id"]
    )
    assert_exactly_once(epoch_ids(loader), [i for k in kept_keys for i in layout[k]])
    # The corruption is real: reading everything fails.
    unfiltered, _ = create_dataloader(str(root), partitioning="hive", num_workers=0, columns=["id"])
    with pytest.raises(ReadError):
        epoch_ids(unfiltered)


def test_partition_and_data_filter_combined(hive: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    root, layout = hive
    expr = (pc.field("year") == 2023) & (pc.field("v") >= 600)
    loader, _ = create_dataloader(str(root), partitioning="hive", filters=expr, num_workers=2, batch_size=8)
    want = [i for (y, _, _), ids in layout.items() if y == 2023 for i in ids if i * 2 >= 600]
    assert_exactly_once(epoch_ids(loader), want)


def test_without_partitioning_keys_are_not_columns(hive: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    root, _ = hive
    _, dataset = create_dataloader(str(root), num_workers=0)
    assert dataset.discovered.output_columns == ("id", "v")


def test_partition_key_clashing_with_a_file_column(tmp_path: Path) -> None:
    d = tmp_path / "id=1"
    d.mkdir()
    pq.write_table(pa.table({"id": [1]}), d / "a.parquet")
    with pytest.raises(SchemaMismatchError, match=r"partition keys \['id'\] are also columns"):
        create_dataloader(str(tmp_path), partitioning="hive")


def test_inconsistent_partition_keys(tmp_path: Path) -> None:
    for rel in ["a=1/x.parquet", "b=1/y.parquet"]:
        (tmp_path / rel).parent.mkdir(parents=True)
        pq.write_table(pa.table({"id": [1]}), tmp_path / rel)
    with pytest.raises(SchemaMismatchError, match="every file needs the same key=value directories"):
        create_dataloader(str(tmp_path), partitioning="hive")


@pytest.mark.parametrize("pattern", ["year=*", "year=202[23]", "*/region=eu"])
def test_glob_over_partition_directories_keeps_their_keys(
    hive: tuple[Path, dict],  # type: ignore[type-arg]
    pattern: str,
) -> None:
    root, layout = hive
    loader, _ = create_dataloader(
        str(root / pattern), partitioning="hive", num_workers=0, batch_size=1000, columns=["id", "year"]
    )
    (batch,) = list(loader)
    by_id = {i: y for (y, _, _), ids in layout.items() for i in ids}
    got = dict(zip(batch["id"].tolist(), batch["year"].tolist(), strict=True))
    assert got == {i: by_id[i] for i in got}
    assert len(got) == {"year=*": 360, "year=202[23]": 240, "*/region=eu": 120}[pattern]
