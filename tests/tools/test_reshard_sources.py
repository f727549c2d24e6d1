"""``reshard`` from object storage (the local S3 server) and from an Iceberg snapshot with deletes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixtures.iceberg import (
    commit_deletes,
    create_id_table,
    data_files,
    equality_delete_file,
    id_table,
    oracle_ids,
    position_delete_file,
)
from tests.fixtures.s3 import S3Server
from tests.tools.helpers import write_source
from torch_dataloader_utils import SourceChangedError, create_dataloader, reshard

pytestmark = pytest.mark.slow


def test_s3_to_s3_with_verify_and_the_loader_reads_the_manifest(s3_server: S3Server, tmp_path: Path) -> None:
    total = write_source(tmp_path / "src", "parquet", [900, 40, 1300, 700, 5, 1100], row_group_rows=200)
    prefix = s3_server.new_prefix()
    fs = s3_server.fs()
    for path in sorted((tmp_path / "src").iterdir()):
        fs.put_file(str(path), f"{prefix}/src/{path.name}")
    options = s3_server.options()
    report = reshard(
        f"s3://{prefix}/src",
        f"s3://{prefix}/dst",
        storage_options=options,  # also the destination's: same filesystem
        target_file_size="8KiB",
        row_group_rows=300,
        workers=2,
        verify=True,
    )
    assert report.verified
    assert report.num_shards >= 3
    fs.invalidate_cache()
    # Every object left is the manifest or a shard (SeaweedFS may show an empty "_reshard" directory).
    names = sorted(p.split("/dst/", 1)[1] for p in fs.find(f"{prefix}/dst"))
    assert names == sorted(["_manifest.json", *[s.path for s in report.manifest.shards]])
    loader, dataset = create_dataloader(
        f"s3://{prefix}/dst", storage_options=options, num_workers=2, batch_size=256, output_format="numpy"
    )
    assert dataset.discovered.manifest is not None
    ids = np.sort(np.concatenate([b["id"] for b in loader]))
    assert np.array_equal(ids, np.arange(total))


@pytest.fixture
def deleted_table(iceberg_catalog: Any) -> Any:
    """Three appends (ids 0..299), position and equality deletes; id 250 is re-added after its delete."""
    _, catalog = iceberg_catalog
    t = create_id_table(catalog)
    t.append(id_table(0, 100))
    t.append(id_table(100, 100))
    first, second = data_files(t)
    t = commit_deletes(t, [position_delete_file(t, {first: [0, 5, 17, 99], second: range(30, 45)})])
    t = commit_deletes(t, [equality_delete_file(t, {"id": [3, 150, 250]})])
    t.append(id_table(200, 100))
    return t


def test_iceberg_snapshot_with_deletes(iceberg_catalog: Any, deleted_table: Any, tmp_path: Path) -> None:
    config, _ = iceberg_catalog
    expected = oracle_ids(deleted_table)
    assert 3 not in expected
    assert 250 in expected
    snapshot = deleted_table.current_snapshot().snapshot_id
    report = reshard(
        "ns.t",
        str(tmp_path / "dst"),
        format="iceberg",
        catalog_config=config,
        target_file_size="2KiB",
        group_by="label",
        workers=2,
        verify=True,
    )
    assert report.manifest.source["snapshot_id"] == snapshot
    loader, _ = create_dataloader(str(tmp_path / "dst"), num_workers=0, output_format="arrow", batch_size=64)
    table = pa.Table.from_batches(list(loader))
    assert sorted(table.column("id").to_pylist()) == expected
    # Each label in one shard.
    homes = {
        label: {s.path for s in report.manifest.shards if label in _labels(tmp_path / "dst" / s.path)}
        for label in range(7)
    }
    assert all(len(paths) == 1 for paths in homes.values())
    # A new snapshot after the job: a rerun names the snapshot it started from.
    deleted_table.append(id_table(300, 10))
    with pytest.raises(SourceChangedError, match=f"pass snapshot_id={snapshot}"):
        reshard(
            "ns.t",
            str(tmp_path / "dst"),
            format="iceberg",
            catalog_config=config,
            target_file_size="2KiB",
            group_by="label",
        )
    again = reshard(
        "ns.t",
        str(tmp_path / "dst"),
        format="iceberg",
        catalog_config=config,
        snapshot_id=snapshot,
        target_file_size="2KiB",
        group_by="label",
    )
    assert (again.shards_written, again.num_rows) == (0, len(expected))


def _labels(path: Path) -> set[int]:
    return set(pq.read_table(path, columns=["label"]).column("label").to_pylist())
