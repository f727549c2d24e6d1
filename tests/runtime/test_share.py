"""With a process group, rank 0 lists, every rank reads its share of footers, all get the same."""

from __future__ import annotations

import multiprocessing as mp
import traceback
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.data import write_parquet_files
from tests.fixtures.s3 import free_ports

pytestmark = pytest.mark.slow


def _rank_main(rank: int, port: int, url: str, queue: Any) -> None:
    try:
        import testsupport.latency_fs as latency
        import torch.distributed as dist

        from torch_dataloader_utils import PathNotFoundError, StructuredDataset

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=2,
            timeout=timedelta(seconds=20),
        )
        key = uuid.uuid4().hex
        ds = StructuredDataset(url, storage_options={"stats_key": key}, split_rows=300)
        requests = latency.stats(key).requests
        try:
            StructuredDataset(url + "/missing", storage_options={"stats_key": key})
            error = None
        except PathNotFoundError as exc:
            error = str(exc)
        plan = ds.plan(0, num_workers=2)
        queue.put((rank, requests, [f.path for f in ds.files], plan.assignments, error))
        dist.destroy_process_group()
    except BaseException:
        queue.put((rank, traceback.format_exc()))


def test_ranks_share_the_footers_and_every_rank_gets_the_same(tmp_path: Path) -> None:
    write_parquet_files(tmp_path, [1000, 700, 400], row_group_size=100)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = free_ports(1)[0]
    procs = [ctx.Process(target=_rank_main, args=(r, port, f"latency://{tmp_path}", queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(2):
            item = queue.get(timeout=60)
            assert len(item) == 5, item[1]
            results[item[0]] = item[1:]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    (req0, files0, plan0, err0), (req1, files1, plan1, err1) = results[0], results[1]
    # Rank 0 lists (one listing page: no HEAD before it) and reads its share, file [0, 1);
    # rank 1 reads the first file's footer (the dataset's schema) and its share, files [1, 3).
    assert req0 == 2
    assert req1 == 1 + 2
    assert files0 == files1
    assert len(files0) == 3
    assert plan0 == plan1
    # An error on rank 0 reaches every rank instead of leaving one waiting.
    assert err0 is not None
    assert err0 == err1
    assert "missing" in err0
