"""The node-local ``data_cache`` in front of real S3 servers: later epochs make no request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.data import write_parquet_files
from tests.fixtures.s3 import S3Server
from torch_dataloader_utils import create_dataloader

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
