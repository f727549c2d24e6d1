"""An Iceberg warehouse on S3 (moto's server), credentials only in catalog_config, read by 2 workers."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.iceberg import (
    commit_deletes,
    create_id_table,
    data_files,
    equality_delete_file,
    id_table,
    make_catalog,
    position_delete_file,
)
from torch_dataloader_utils import IcebergDataset
from torch_dataloader_utils.storage.cache import process_stats

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _warehouse(s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A bucket ``lake`` and the catalog config of a warehouse in it (no credentials from the host)."""
    import boto3

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="key",
        aws_secret_access_key="secret",
        region_name="us-east-1",
    ).create_bucket(Bucket="lake")
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": "s3://lake/wh",
        "s3.endpoint": s3_endpoint,
        "s3.access-key-id": "key",
        "s3.secret-access-key": "secret",
        "s3.region": "us-east-1",
    }


def test_s3_warehouse_read_by_two_workers(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _warehouse(s3_endpoint, tmp_path, monkeypatch)
    catalog = make_catalog(config)
    t = create_id_table(catalog, row_group_limit=25)
    t.append(id_table(0, 100))
    (first,) = data_files(t)  # ids 0..99 at positions 0..99
    t.append(id_table(100, 60))
    assert first.startswith("s3://lake/")
    t = commit_deletes(t, [position_delete_file(t, {first: [0, 26, 27, 99]})])
    t = commit_deletes(t, [equality_delete_file(t, {"id": [50, 120]})])
    expected = sorted(set(range(160)) - {0, 26, 27, 99} - {50, 120})
    loader, ds = IcebergDataset.create_dataloader(
        "ns.t", catalog_config=config, num_workers=2, split_rows=25, batch_size=17, output_format="numpy",
        timeout=60, multiprocessing_context="fork",
    )  # fmt: skip
    assert len(ds.plan().all_chunks()) == 7
    assert "secret" not in repr(ds.scan.fs)
    got = sorted(int(i) for b in loader for i in b["id"])
    assert got == expected
    assert len(expected) == 160 - 4 - 2


def test_data_files_read_through_the_node_local_cache(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _warehouse(s3_endpoint, tmp_path, monkeypatch)
    t = create_id_table(make_catalog(config), row_group_limit=25)
    t.append(id_table(0, 100))
    (first,) = data_files(t)
    t.append(id_table(100, 60))
    t = commit_deletes(t, [position_delete_file(t, {first: [0, 26, 27, 99]})])
    expected = sorted(set(range(160)) - {0, 26, 27, 99})
    cache = tmp_path / "cache"

    def read() -> list[int]:
        ds = IcebergDataset(
            "ns.t", catalog_config=config, split_rows=25, output_format="numpy", data_cache=str(cache)
        )
        return sorted(int(i) for b in ds for i in b["id"])

    misses, hits = process_stats().misses, process_stats().hits
    assert read() == expected
    assert process_stats().misses > misses  # the data files' blocks were fetched once ...
    filled = process_stats().misses
    assert read() == expected
    assert process_stats().misses == filled  # ... and read from the cache after that
    assert process_stats().hits > hits
