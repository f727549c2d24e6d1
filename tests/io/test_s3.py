"""Parquet on a real S3 server: credentials and endpoint only in storage_options."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.data import write_parquet_files
from tests.fixtures.s3 import FaultProxy, S3Server
from torch_dataloader_utils import ReadError, StructuredDataset, create_dataloader

pytestmark = pytest.mark.slow

ROWS = [3000, 1700, 2500, 800]
TOTAL = sum(ROWS)


@pytest.fixture(scope="module")
def s3_dataset(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Four Parquet files (row groups of 500) on S3 and their local copy."""
    local = tmp_path_factory.mktemp("s3src")
    paths = write_parquet_files(local, ROWS, row_group_size=500)
    prefix = s3_server.new_prefix()
    fs = s3_server.fs()
    for p in paths:
        fs.put_file(str(p), f"{prefix}/{p.name}")
    return f"s3://{prefix}", local


def _ids(loader: object) -> np.ndarray:
    return np.concatenate([b["id"].numpy() for b in loader])  # type: ignore[attr-defined]


def test_ranks_and_two_workers_read_every_row_once(s3_server: S3Server, s3_dataset: tuple[str, Path]) -> None:
    url, _ = s3_dataset
    seen = []
    for rank in range(2):
        loader, dataset = create_dataloader(
            url,
            storage_options=s3_server.options(),
            num_ranks=2,
            rank=rank,
            num_workers=2,
            batch_size=333,
            split_rows=1000,
            columns=["id", "s"],
            multiprocessing_context="fork",
            read_ahead_bytes="1MiB",
        )
        assert dataset.discovered.fs.native  # bytes through pyarrow's S3 client
        seen.append(_ids(loader))
    all_ids = np.concatenate(seen)
    assert len(all_ids) == TOTAL
    assert np.array_equal(np.sort(all_ids), np.arange(TOTAL))
    assert len(seen[0]) > 0
    assert len(seen[1]) > 0


def test_row_group_split_same_chunks_as_local_copy(s3_server: S3Server, s3_dataset: tuple[str, Path]) -> None:
    url, local = s3_dataset
    kwargs = dict(split_rows=1200, num_ranks=2, rank=0, shuffle=True, shuffle_seed=3)
    remote = StructuredDataset(url, storage_options=s3_server.options(), **kwargs)  # type: ignore[arg-type]
    here = StructuredDataset(str(local), **kwargs)  # type: ignore[arg-type]

    def shape(ds: StructuredDataset) -> list[list[tuple[str, int, int, int | None]]]:
        plan = ds.plan(1, num_workers=2)
        return [
            [(os.path.basename(c.path), c.start, c.stop, c.num_rows) for c in plan.chunks_for(r, w)]
            for r in range(2)
            for w in range(2)
        ]

    assert shape(remote) == shape(here)
    assert len(remote.plan(0).all_chunks()) > len(ROWS)  # really split inside files


def test_s3fs_data_path_is_fork_safe_with_two_workers(
    s3_server: S3Server, s3_dataset: tuple[str, Path]
) -> None:
    url, _ = s3_dataset
    # version_aware is an s3fs-only option: the bytes go through s3fs too.
    options = {**s3_server.options(), "version_aware": False}
    loader, dataset = create_dataloader(
        url, storage_options=options, num_workers=2, batch_size=500, multiprocessing_context="fork"
    )
    fs = dataset.discovered.fs
    assert not fs.native
    parent_client = fs.fsspec()  # an s3fs client alive in the parent before the fork
    assert parent_client.exists(url[len("s3://") :])
    ids = _ids(loader)
    assert np.array_equal(np.sort(ids), np.arange(TOTAL))


def test_transient_faults_are_retried_and_no_row_is_lost(
    s3_server: S3Server, s3_proxy: FaultProxy, s3_dataset: tuple[str, Path]
) -> None:
    url, _ = s3_dataset
    for status in (503, 500, 0):  # 0: the proxy resets the connection
        loader, _ = create_dataloader(
            url,
            storage_options=s3_server.options(s3_proxy.endpoint),
            num_workers=0,
            batch_size=400,
            split_rows=1000,
            retries=3,
            retry_backoff=0.01,
        )
        s3_proxy.reset()
        s3_proxy.fail_every, s3_proxy.fail_status = 3, status
        ids = _ids(loader)
        assert s3_proxy.failures > 0, status
        assert np.array_equal(np.sort(ids), np.arange(TOTAL)), status
        # The metrics count the library's retries; a reset connection may also be retried
        # inside the S3 client (pyarrow's), unseen, so only HTTP errors are counted one for one.
        retries = loader.metrics().total.retries
        assert retries <= s3_proxy.failures, status
        if status:
            assert retries == s3_proxy.failures, status


def test_permanent_failure_names_file_and_byte_range(
    s3_server: S3Server, s3_proxy: FaultProxy, s3_dataset: tuple[str, Path]
) -> None:
    url, _ = s3_dataset
    loader, _ = create_dataloader(
        url,
        storage_options=s3_server.options(s3_proxy.endpoint),
        num_workers=0,
        batch_size=400,
        retries=2,
        retry_backoff=0.01,
    )
    s3_proxy.fail_every, s3_proxy.fail_path = 1, "part-0002.parquet"
    rows = [0]

    def consume() -> None:
        for batch in loader:
            rows[0] += len(batch["id"])

    with pytest.raises(
        ReadError, match=r"part-0002\.parquet' bytes \[\d+, \d+\) failed after 3 attempt\(s\)"
    ):
        consume()
    assert rows[0] <= ROWS[0] + ROWS[1]  # the failing file's rows were not skipped over
    assert s3_proxy.failures == 3


def test_no_retries_fail_at_first_fault(
    s3_server: S3Server, s3_proxy: FaultProxy, s3_dataset: tuple[str, Path]
) -> None:
    url, _ = s3_dataset
    loader, _ = create_dataloader(
        url, storage_options=s3_server.options(s3_proxy.endpoint), num_workers=0, retries=0
    )
    s3_proxy.reset()  # forget the footer reads of discovery
    s3_proxy.fail_every = 1
    with pytest.raises(
        ReadError, match=r"s3://.*part-0000\.parquet' bytes \[\d+, \d+\) failed after 1 attempt"
    ):
        list(loader)
    # One range per file (each file is one chunk), each tried once: no retry happened.
    assert 1 <= s3_proxy.failures == s3_proxy.requests <= len(ROWS)
