"""One end-to-end suite over every store: local files, S3 (SeaweedFS and moto), GCS and Azure.

Each store is a real server on 127.0.0.1 (started once per session, see
``tests/fixtures/stores.py``), reached through its fsspec package with
``storage_options`` as a user passes them: ``s3://`` (s3fs, bytes through pyarrow's
native client), ``gs://`` (gcsfs and gcp-storage-emulator), ``az://`` (adlfs and Azurite).
Every test checks exact rows by an ``id`` column.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.bounds import assert_ends_within
from tests.fixtures.e2e import assert_exactly_once, epoch_ids
from tests.fixtures.stores import black_hole
from torch_dataloader_utils import DiscoveryError, create_dataloader, reshard

ROWS = (120, 80, 100)
TOTAL = sum(ROWS)
STORES = ["file", "s3-seaweedfs", "s3-moto", "gs", "az"]


@dataclass
class Store:
    """A place to write a dataset, and how the loader reaches it."""

    name: str
    scheme: str
    root: str
    options: dict[str, Any] | None
    writer: Any  # an fsspec filesystem, or None for local files
    dead: Callable[[str], dict[str, Any]] | None = None  # storage_options for another endpoint

    def url(self, rel: str = "") -> str:
        path = f"{self.root}/{rel}" if rel else self.root
        return path if self.scheme == "file" else f"{self.scheme}://{path}"

    def put(self, rel: str, data: bytes) -> None:
        if self.writer is None:
            target = Path(self.root) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        else:
            self.writer.pipe_file(f"{self.root}/{rel}", data)

    def exists(self, rel: str) -> bool:
        if self.writer is None:
            return (Path(self.root) / rel).exists()
        self.writer.invalidate_cache()
        return bool(self.writer.exists(f"{self.root}/{rel}"))


def _make_store(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if name == "file":
        return Store(name, "file", str(tmp_path / "store"), None, None)
    fixture = {
        "s3-seaweedfs": "s3_server",
        "s3-moto": "moto_server",
        "gs": "gcs_server",
        "az": "azure_server",
    }
    server = request.getfixturevalue(fixture[name])
    scheme = {"gs": "gs", "az": "az"}.get(name, "s3")
    writer = server.fs()
    return Store(name, scheme, server.new_prefix(), server.options(), writer, server.options)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh prefix on one store, with a 300-row dataset under ``data/`` (3 files, row groups of 20)."""
    made = _make_store(request.param, request, tmp_path)
    start = 0
    for i, rows in enumerate(ROWS):
        buf = io.BytesIO()
        pq.write_table(
            pa.table({"id": pa.array(range(start, start + rows), pa.int64())}), buf, row_group_size=20
        )
        made.put(f"data/part-{i}.parquet", buf.getvalue())
        start += rows
    return made


def _loader(store: Store, url: str | None = None, **options: Any) -> Any:
    options.setdefault("batch_size", 32)
    options.setdefault("request_timeout", 20)
    loader, _ = create_dataloader(url or store.url("data"), storage_options=store.options, **options)
    return loader


@pytest.mark.slow
def test_rows_exactly_once_over_ranks_and_workers(store: Store) -> None:
    ids: list[int] = []
    for rank in range(2):
        loader = _loader(store, num_ranks=2, rank=rank, num_workers=2, shuffle=True, equal_batches="off")
        ids += epoch_ids(loader)
    assert_exactly_once(ids, range(TOTAL))


@pytest.mark.slow
def test_resume_mid_epoch_on_other_workers_then_next_epoch(store: Store) -> None:
    first = _loader(store, num_workers=0, shuffle=True)
    it = iter(first)
    seen = [i for _ in range(4) for i in epoch_ids([next(it)])]
    state = first.state_dict()
    del it
    resumed = _loader(store, num_workers=2, shuffle=True)
    resumed.load_state_dict(state)
    rest = epoch_ids(resumed)
    assert_exactly_once(seen + rest, range(TOTAL))
    resumed.dataset.set_epoch(1)
    assert_exactly_once(epoch_ids(resumed), range(TOTAL))


@pytest.mark.slow
def test_metadata_cache_on_the_store(store: Store) -> None:
    cache = store.url(f"cache-{uuid.uuid4().hex[:6]}/meta.arrow")
    assert_exactly_once(epoch_ids(_loader(store, num_workers=0, metadata_cache=cache)), range(TOTAL))
    assert store.exists(cache.split("://")[-1].removeprefix(store.root + "/"))
    # A warm cache, trusted without a listing: the files come from the cache.
    warm = _loader(store, num_workers=0, metadata_cache=cache, metadata_cache_check="on_open")
    assert_exactly_once(epoch_ids(warm), range(TOTAL))


@pytest.mark.slow
def test_reshard_then_read_from_the_manifest(store: Store) -> None:
    report = reshard(
        store.url("data"),
        store.url("shards"),
        storage_options=store.options,
        target_file_size=2000,
        row_group_rows=25,
    )
    assert report.manifest.num_rows == TOTAL
    loader, dataset = create_dataloader(
        store.url("shards"), storage_options=store.options, num_workers=2, batch_size=32
    )
    assert dataset.discovered.reshard_manifest is not None
    assert_exactly_once(epoch_ids(loader), range(TOTAL))


@pytest.mark.slow
@pytest.mark.parametrize("name", [s for s in STORES if s != "file"])
def test_dead_endpoint_fails_within_request_timeout_naming_it(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store = _make_store(name, request, tmp_path)
    assert store.dead is not None
    with black_hole() as endpoint:
        started = time.monotonic()
        with pytest.raises(DiscoveryError) as caught:
            create_dataloader(
                store.url("data"),
                storage_options=store.dead(endpoint),
                num_workers=0,
                request_timeout=3,
                retries=1,
            )
        elapsed = time.monotonic() - started
    assert_ends_within(elapsed, 3)  # was < 3 + 3: 6.86 s on a busy machine
    text = str(caught.value)
    assert endpoint in text
    assert f"://{store.root}/data'" in text  # the URL (az:// is shown as adlfs's abfs://)
    assert "request_timeout" in text
