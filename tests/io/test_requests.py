"""Every request a job sends to S3 is one the plan needs, and ``metrics()`` counts them exactly.

The counts come from the servers themselves: moto's own request log (werkzeug's line per
request) and, for SeaweedFS, a proxy in front of it that sees every request. Each test
states the planned requests independently of the library's code, from the data's
layout: a row group's column chunks of adjacent columns are one GET, a gap of an
unread column wider than the coalescing hole (64 KiB) makes two; every rank without a process
group lists the directory (one page) and reads every footer (one GET each, the footers
being under 64 KiB), after one GET for a reshard manifest that is not there.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils.discovery.dataset as discovery_dataset
from tests.fixtures.s3 import FaultProxy, S3Server
from tests.fixtures.stores import ServerLog
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.storage.requests import RequestCounts

FILES = 5
GROUPS = 4  # row groups per file
GROUP_ROWS = 1000
ROWS = FILES * GROUPS * GROUP_ROWS
RANKS = 2
WORKERS = 2


def _write(fs: Any, prefix: str) -> None:
    """``FILES`` files of ``GROUPS`` row groups; each file ~450 KB, its footer a few KB."""
    rng = np.random.default_rng(0)
    for i in range(FILES):
        n = GROUPS * GROUP_ROWS
        table = pa.table(
            {
                "id": np.arange(i * n, (i + 1) * n),
                # 80 KB per row group: wider than the 64 KiB coalescing hole.
                "a": pa.array([rng.bytes(80) for _ in range(n)], pa.binary(80)),
                "b": rng.random(n),
                "c": rng.random(n),
            }
        )
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=GROUP_ROWS, compression="none")
        fs.pipe_file(f"{prefix}/part-{i}.parquet", sink.getvalue().to_pybytes())


def fresh_data(server: S3Server, under: str = "") -> str:
    """A new prefix holding the test's files under ``under`` (written before any request is counted)."""
    fs = server.fs()
    prefix = server.new_prefix()
    _write(fs, f"{prefix}/{under}".rstrip("/"))
    return prefix


def rank_loaders(url: str, options: dict[str, Any], **kwargs: Any) -> list[tuple[Any, Any]]:
    """``(loader, dataset)`` of every rank, each building its dataset alone (no process group)."""
    return [
        create_dataloader(
            url,
            storage_options=options,
            num_ranks=RANKS,
            rank=rank,
            num_workers=WORKERS,
            multiprocessing_context="fork",
            split_rows=GROUP_ROWS,
            batch_size=500,
            output_format="arrow",
            **kwargs,
        )
        for rank in range(RANKS)
    ]


def _epoch(url: str, options: dict[str, Any], **kwargs: Any) -> tuple[list[int], RequestCounts]:
    """One cold epoch of every rank (each building its dataset alone); ids and summed metrics."""
    ids: list[int] = []
    counted = RequestCounts()
    for loader, _ in rank_loaders(url, options, **kwargs):
        for batch in loader:
            ids.extend(batch.column("id").to_pylist())
        counted += loader.metrics().request_counts
    return ids, counted


def _as_kinds(counts: RequestCounts) -> Counter[str]:
    found = Counter({"LIST": counts.lists, "HEAD": counts.heads, "GET": counts.gets, "PUT": counts.puts})
    found["other"] = counts.others
    return +found  # zeros dropped, as in a Counter of what the server saw


def _planned(columns: list[str] | None) -> Counter[str]:
    """The requests of one cold epoch, from the layout alone (see the module docstring)."""
    ranges_per_group = 1 if columns is None else 2  # ["id", "b"]: "a" between them is a gap
    return Counter(
        {
            "LIST": RANKS * math.ceil(FILES / 1000),  # one listing page per rank
            "GET": RANKS * (1 + FILES) + FILES * GROUPS * ranges_per_group,  # manifest, footers, data
        }
    )


@pytest.mark.slow
@pytest.mark.parametrize("columns", [None, ["id", "b"]], ids=["all_columns", "a_gap"])
def test_cold_epoch_on_moto_sends_the_planned_requests_and_metrics_count_them(
    moto_server: S3Server, moto_log: ServerLog, columns: list[str] | None
) -> None:
    prefix = fresh_data(moto_server)
    moto_log.clear()
    ids, counted = _epoch(f"s3://{prefix}", moto_server.options(), columns=columns)
    assert sorted(ids) == list(range(ROWS))
    seen = moto_log.counts()
    assert seen == _planned(columns)
    assert seen["HEAD"] == 0  # nothing asked about a file after the listing
    assert _as_kinds(counted) == seen  # metrics() says what the server saw
    assert counted.total == sum(seen.values())


@pytest.mark.slow
def test_cold_epoch_on_seaweedfs_sends_the_planned_requests_and_metrics_count_them(
    s3_server: S3Server, s3_proxy: FaultProxy
) -> None:
    prefix = fresh_data(s3_server)
    s3_proxy.reset()
    ids, counted = _epoch(f"s3://{prefix}", s3_server.options(s3_proxy.endpoint))
    assert sorted(ids) == list(range(ROWS))
    assert +s3_proxy.kinds == _planned(None)
    assert _as_kinds(counted) == +s3_proxy.kinds


@pytest.mark.slow
def test_retried_requests_are_counted_as_the_server_saw_them(
    s3_server: S3Server, s3_proxy: FaultProxy
) -> None:
    """A request that failed and was retried is two requests to the server, and in metrics()."""
    prefix = fresh_data(s3_server)
    s3_proxy.reset()
    s3_proxy.fail_every = 7
    s3_proxy.fail_path = prefix.split("/", 1)[1]
    ids, counted = _epoch(f"s3://{prefix}", s3_server.options(s3_proxy.endpoint), retry_backoff=0.01)
    assert sorted(ids) == list(range(ROWS))
    assert s3_proxy.failures > 0
    planned = _planned(None)
    assert s3_proxy.kinds["GET"] == planned["GET"] + s3_proxy.failures
    assert _as_kinds(counted) == +s3_proxy.kinds


@pytest.mark.slow
def test_a_warm_start_reads_the_footers_from_the_metadata_cache(
    moto_server: S3Server, moto_log: ServerLog, tmp_path: Path
) -> None:
    prefix = fresh_data(moto_server, under="data")
    url, cache = f"s3://{prefix}/data", f"s3://{prefix}/cache/meta.arrow"

    def epoch() -> tuple[list[int], RequestCounts]:
        loader, _ = create_dataloader(
            url,
            storage_options=moto_server.options(),
            metadata_cache=cache,
            num_workers=WORKERS,
            multiprocessing_context="fork",
            split_rows=GROUP_ROWS,
            batch_size=500,
            output_format="arrow",
        )
        ids = [i for batch in loader for i in batch.column("id").to_pylist()]
        return ids, loader.metrics().request_counts

    moto_log.clear()
    ids, cold = epoch()
    assert sorted(ids) == list(range(ROWS))
    data_gets = FILES * GROUPS
    # The manifest (missing), the cache (missing), every footer, the data; the cache written.
    assert moto_log.counts() == Counter({"LIST": 1, "GET": 2 + FILES + data_gets, "PUT": 1})
    assert _as_kinds(cold) == moto_log.counts()
    moto_log.clear()
    ids, warm = epoch()
    assert sorted(ids) == list(range(ROWS))
    # No footer read, by discovery or by the readers: they come with the cache.
    assert moto_log.counts() == Counter({"LIST": 1, "GET": 2 + data_gets})
    assert _as_kinds(warm) == moto_log.counts()


@pytest.mark.slow
def test_the_listing_is_sent_beside_the_search_for_a_reshard_manifest(
    s3_server: S3Server, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two round trips become one: the LIST is in flight before the manifest's GET is sent.

    The search is held until the server has seen the listing's request; on the previous
    code (search, then listing) it never does and the test fails.
    """
    prefix = fresh_data(s3_server)
    s3_proxy.reset()
    seen_first: list[bool] = []
    search = discovery_dataset.find_manifest

    def held(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + 10
        while not s3_proxy.kinds["LIST"] and time.monotonic() < deadline:
            time.sleep(0.005)
        seen_first.append(s3_proxy.kinds["LIST"] == 1)
        return search(*args, **kwargs)

    monkeypatch.setattr(discovery_dataset, "find_manifest", held)
    loader, _ = create_dataloader(
        f"s3://{prefix}", storage_options=s3_server.options(s3_proxy.endpoint), num_workers=0
    )
    assert seen_first == [True]  # the listing was on the wire before the search began
    ids = sorted(int(i) for batch in loader for i in batch["id"].tolist())
    assert ids == list(range(ROWS))
    # The same requests as before, no more: one LIST, the search's GET (404), footers, data.
    assert +s3_proxy.kinds == Counter({"LIST": 1, "GET": 1 + 2 * FILES})  # a file is one chunk: one GET
    assert _as_kinds(loader.metrics().request_counts) == +s3_proxy.kinds


@pytest.mark.slow
def test_a_resharded_directory_stops_the_listing_sent_beside_its_manifest(
    s3_server: S3Server, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    """A manifest found: the dataset comes from it, and the listing sent beside it is stopped."""
    from torch_dataloader_utils import reshard

    source = tmp_path / "source"
    source.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"id": np.arange(i * 100, (i + 1) * 100)}), source / f"part-{i}.parquet")
    prefix = s3_server.new_prefix()
    reshard(str(source), f"s3://{prefix}", target_file_size="1KiB", dst_storage_options=s3_server.options())
    s3_proxy.reset()
    loader, dataset = create_dataloader(
        f"s3://{prefix}", storage_options=s3_server.options(s3_proxy.endpoint), num_workers=0
    )
    assert dataset.discovered.manifest is not None  # read from the manifest
    assert s3_proxy.kinds["LIST"] <= 1  # at most the first page, sent beside the search
    assert s3_proxy.kinds["GET"] == 1  # the manifest, no footer
    ids = sorted(int(i) for batch in loader for i in batch["id"].tolist())
    assert ids == list(range(300))
    assert _as_kinds(loader.metrics().request_counts) == +s3_proxy.kinds
