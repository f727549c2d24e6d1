"""The node-local cache costs no request of its own, and ``data_cache_prefetch`` warms every format.

* A cold epoch through the cache sends exactly the requests of a cold epoch without it
  (no HEAD before a fetch, no range fetched twice), over the ranks and workers of one
  node, as the S3 server logged them; the second epoch sends none.
* Prefetch (warming the next epoch's first chunks) works for ORC, JSONL and elastic
  order as for Parquet: a warmed chunk is read with no request (``latency://`` counts
  every request it serves).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.orc as po
import pytest
import testsupport.latency_fs as latency

from tests.fixtures.data import write_parquet_files
from tests.fixtures.s3 import S3Server
from tests.fixtures.stores import ServerLog
from tests.io.test_requests import ROWS, fresh_data, rank_loaders
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.storage.requests import RequestCounts


def _kinds(counts: RequestCounts) -> Counter[str]:
    return +Counter({"LIST": counts.lists, "HEAD": counts.heads, "GET": counts.gets, "PUT": counts.puts})


@pytest.mark.slow
def test_a_cold_epoch_through_the_cache_sends_the_requests_of_one_without_it(
    moto_server: S3Server, moto_log: ServerLog, tmp_path: Path
) -> None:
    prefix = fresh_data(moto_server)

    def jobs(cache: Path | None) -> list[Any]:
        extra = {"data_cache": str(cache)} if cache is not None else {}
        return rank_loaders(f"s3://{prefix}", moto_server.options(), shuffle=True, **extra)

    def epoch(built: list[Any], number: int) -> tuple[Counter[str], RequestCounts]:
        moto_log.clear()
        ids: list[int] = []
        counted = RequestCounts()
        for loader, dataset in built:
            dataset.set_epoch(number)
            dataset.reset_metrics()
            ids.extend(i for batch in loader for i in batch.column("id").to_pylist())
            counted += loader.metrics().request_counts
        assert sorted(ids) == list(range(ROWS))
        return moto_log.counts(), counted

    plain = jobs(None)
    without, _ = epoch(plain, 0)
    cached = jobs(tmp_path / "cache")
    cold, cold_counted = epoch(cached, 0)
    assert without["HEAD"] == 0
    assert cold == without  # no check of its own, no range fetched twice by the node's readers
    assert _kinds(cold_counted) == cold
    warm, warm_counted = epoch(cached, 1)  # another order: every range is in the node's cache
    assert warm == Counter()
    assert warm_counted.total == 0


def _latency(root: Path, **kwargs: Any) -> tuple[Any, Any, latency.RequestStats]:
    key = uuid.uuid4().hex
    loader, dataset = create_dataloader(
        f"latency://{root}", storage_options={"stats_key": key}, num_workers=0, **kwargs
    )
    return loader, dataset, latency.stats(key)


def _warm_then_read(dataset: Any, counters: latency.RequestStats, count: int) -> tuple[int, int]:
    """Warm the first ``count`` chunks of this process, then read them; requests of each step."""
    reader = dataset._reader  # the dataset's own reader, as a worker holds it
    chunks = list(dataset.worker_chunks())
    assert len(chunks) > count
    counters.reset()
    reader.warm(chunks[:count])
    assert reader.wait_warm(60)
    warmed = counters.requests
    counters.reset()
    for chunk in chunks[:count]:
        assert sum(b.num_rows for b in reader.read(chunk)) > 0
    return warmed, counters.requests


def test_orc_prefetch_warms_what_the_read_needs(tmp_path: Path) -> None:
    root = tmp_path / "orc"
    root.mkdir()
    for i in range(3):
        po.write_table(
            pa.table({"id": np.arange(i * 4000, (i + 1) * 4000)}), root / f"p{i}.orc", stripe_size=4096
        )
    _, dataset, counters = _latency(
        root, format="orc", data_cache=str(tmp_path / "cache"), data_cache_prefetch=2, shuffle=False
    )
    warmed, read = _warm_then_read(dataset, counters, 2)
    assert warmed > 0  # the blocks were fetched from storage while warming...
    assert read == 0  # ... so reading the warmed chunks asks storage for nothing


def test_jsonl_prefetch_warms_what_the_read_needs(tmp_path: Path) -> None:
    root = tmp_path / "jsonl"
    root.mkdir()
    for i in range(2):
        lines = "".join(f'{{"id": {j}, "s": "{"x" * 40}"}}\n' for j in range(i * 3000, (i + 1) * 3000))
        (root / f"p{i}.jsonl").write_text(lines)
    _, dataset, counters = _latency(
        root,
        format="jsonl",
        data_cache=str(tmp_path / "cache"),
        data_cache_prefetch=2,
        split_bytes=40_000,
        shuffle=False,
    )
    warmed, read = _warm_then_read(dataset, counters, 2)
    assert warmed > 0
    assert read == 0


def test_elastic_order_prefetch_warms_the_next_epoch(tmp_path: Path) -> None:
    """Rank 0 of 2 in elastic order: its next epoch reads chunks rank 1 read before (not in this
    node's cache). Warmed during the epoch before (prefetch of every chunk), none of them is
    fetched while the next epoch reads them (the requests then are the warming of the one after)."""
    root = tmp_path / "data"
    write_parquet_files(root, [4000] * 4, row_group_size=500)

    def fetched_while_reading(prefetch: int) -> list[tuple[str, int, int]]:
        log = tmp_path / f"requests-{prefetch}.log"
        loader, dataset = create_dataloader(
            f"latency://{root}",
            storage_options={"stats_key": uuid.uuid4().hex, "request_log": str(log)},
            num_workers=0,
            data_cache=str(tmp_path / f"cache-{prefetch}"),
            data_cache_prefetch=prefetch,
            num_ranks=2,
            rank=0,
            canonical_ranks=2,
            split_rows=500,
            batch_size=250,
            shuffle=True,
        )
        assert sum(len(b["id"]) for b in loader) > 0
        source = dataset._reader._source
        assert source.wait_warm(60)  # what epoch 0 warmed is in the cache
        dataset.set_epoch(1)
        log.unlink(missing_ok=True)
        assert sum(len(b["id"]) for b in loader) > 0
        wanted = [(c.path, lo, hi) for c in dataset.worker_chunks() for lo, hi in source.needed_ranges(c)]
        got = [(path, start, end) for _, path, start, end in latency.logged_requests(str(log))]
        return [w for w in wanted if any(p == w[0] and s < w[2] and w[1] < e for p, s, e in got)]

    assert fetched_while_reading(0)  # without prefetch: epoch 1 fetches its chunks as it reads them
    assert fetched_while_reading(64) == []  # warmed: none of its chunks is fetched
