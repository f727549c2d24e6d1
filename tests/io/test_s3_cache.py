"""The node-local ``data_cache`` in front of real S3 servers: later epochs make no request."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.data import write_parquet_files
from tests.fixtures.iceberg import (
    commit_deletes,
    create_id_table,
    data_files,
    id_table,
    make_catalog,
    position_delete_file,
)
from tests.fixtures.s3 import S3Server
from torch_dataloader_utils import IcebergDataset, create_dataloader
from torch_dataloader_utils.storage.cache import process_stats

pytestmark = pytest.mark.slow

ROWS = [1500, 900, 1200]
TOTAL = sum(ROWS)


def test_two_ranks_two_workers_second_epoch_from_the_cache(s3_server: S3Server, tmp_path: Path) -> None:
    local = tmp_path / "src"
    paths = write_parquet_files(local, ROWS, row_group_size=300)
    prefix = s3_server.new_prefix()
    fs = s3_server.fs()
    for p in paths:
        fs.put_file(str(p), f"{prefix}/{p.name}")
    cache = tmp_path / "cache"
    requests: dict[int, list[int]] = {0: [], 1: []}
    hits: dict[int, list[int]] = {0: [], 1: []}
    seen: dict[int, list[int]] = {0: [], 1: []}
    jobs = [
        create_dataloader(
            f"s3://{prefix}",
            storage_options=s3_server.options(),
            num_ranks=2,
            rank=rank,
            num_workers=2,
            batch_size=256,
            split_rows=600,
            shuffle=True,
            columns=["id", "s"],
            data_cache=str(cache),
            multiprocessing_context="fork",
        )
        for rank in range(2)
    ]
    for epoch in range(2):  # both ranks finish an epoch before either starts the next
        for loader, dataset in jobs:
            dataset.set_epoch(epoch)
            ids = np.concatenate([b["id"].numpy() for b in loader])
            seen[epoch] += ids.tolist()
            total = loader.metrics().total
            requests[epoch].append(total.requests)
            hits[epoch].append(total.cache_hits)
    for epoch in range(2):
        assert sorted(seen[epoch]) == list(range(TOTAL))  # every row once per epoch
    assert sum(requests[0]) > 0
    # Rank 1 read in epoch 0 what rank 0 reads in epoch 1 (and the reverse): the cache of
    # the node holds all of it, so the second epoch asks S3 for nothing, not even a HEAD.
    assert requests[1] == [0, 0]
    assert all(h > 0 for h in hits[1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def test_iceberg_data_files_read_through_the_cache(
    moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    s3 = boto3.client(
        "s3", endpoint_url=moto_endpoint, aws_access_key_id="key", aws_secret_access_key="secret",
        region_name="us-east-1",
    )  # fmt: skip
    s3.create_bucket(Bucket="lake")
    config = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": "s3://lake/wh",
        "s3.endpoint": moto_endpoint,
        "s3.access-key-id": "key",
        "s3.secret-access-key": "secret",
        "s3.region": "us-east-1",
    }
    catalog = make_catalog(config)
    t = create_id_table(catalog, row_group_limit=25)
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
