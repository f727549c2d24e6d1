"""The node-local ``data_cache`` over 3 epochs: 2 ranks x 2 workers on one machine.

Run: ``PYTHONPATH=src:. python benchmarks/bench_cache.py [--repeats 3] [--skip-s3]``

The benchmark dataset of ``common.py`` (its columns: ``id``, six float32, two int64 and
a string; by default its 6,000,000 rows in 16 files, row groups of 65,536) is read as a job
of 2 ranks, each a process with 2 DataLoader workers (persistent), for 3 epochs
(``shuffle=True``); the ranks wait for each other at the end of every epoch, as a DDP
loop's collectives make them, so an epoch's time is the slower rank's. Jobs:

* **local**: the files on local disk (the target's reference);
* **10 ms + cache**: the same files behind ``latency://`` (10 ms per request) with a
  cold ``data_cache`` (cleared before the job);
* **S3 + cache**: the same files on a SeaweedFS server on 127.0.0.1, cold cache;
* **10 ms, no cache** (epoch times only: what the cache saves);
* **10 ms + small cache**: ``data_cache_size`` a third of the data: eviction keeps the
  cache under its limit (and later epochs fetch again).

Per epoch: seconds, rows/s, requests to storage (the loader's metrics, all ranks and
workers: ranged reads and file checks; for ``latency://`` also counted by the
filesystem itself in a log every process appends to), cache hits, and the cache's size
on disk (all its files, in 4 KiB blocks) after the epoch. A raw pyarrow loop over the
local files (one process) is measured in the same run as the house reference. Every
job runs ``--repeats`` times, interleaved; the tables give medians.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import COLUMN_SETS, DatasetSpec, ensure_dataset, machine, table  # noqa: E402

EPOCHS = 3
RANKS = 2
WORKERS = 2


def _disk_bytes(directory: str) -> int:
    total = 0
    for folder, _, names in os.walk(directory):
        for name in names:
            with contextlib.suppress(OSError):
                total += -(-os.stat(os.path.join(folder, name)).st_size // 4096) * 4096
    return total


def _rank(
    rank: int, url: str, kwargs: dict[str, Any], barrier: Any, out: Any, cache: str | None, log: str | None
) -> None:
    import testsupport.latency_fs  # noqa: F401  (registers latency://)

    from torch_dataloader_utils import create_dataloader

    loader, dataset = create_dataloader(url, num_ranks=RANKS, rank=rank, num_workers=WORKERS, **kwargs)
    rows_total = 0
    for epoch in range(EPOCHS):
        dataset.set_epoch(epoch)
        logged = _lines(log)
        barrier.wait()
        started = time.perf_counter()
        rows = 0
        for batch in loader:
            rows += len(batch["id"])
        seconds = time.perf_counter() - started
        metrics = loader.metrics().total
        barrier.wait()  # the epoch ends for both ranks (a DDP loop's collectives)
        wall = time.perf_counter() - started
        disk = _disk_bytes(cache) if cache and rank == 0 else 0
        requests_logged = (_lines(log) - logged) if log and rank == 0 else 0
        out.put(
            {
                "rank": rank,
                "epoch": epoch,
                "seconds": seconds,
                "wall": wall,
                "rows": rows,
                "requests": metrics.requests,
                "hits": metrics.cache_hits,
                "misses": metrics.cache_misses,
                "served": metrics.cache_bytes_served,
                "evictions": metrics.cache_evictions,
                "disk": disk,
                "logged": requests_logged,
            }
        )
        rows_total += rows
        barrier.wait()  # rank 0 has counted the log before the next epoch's requests


def _lines(log: str | None) -> int:
    if not log or not os.path.exists(log):
        return 0
    with open(log, "rb") as fh:
        return sum(1 for _ in fh)


def run_job(
    url: str, kwargs: dict[str, Any], cache: str | None = None, log: str | None = None
) -> list[dict[str, Any]]:
    """One job of ``RANKS`` rank processes; per epoch, the slower rank's seconds and all ranks' counters."""
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(RANKS), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, url, kwargs, barrier, out, cache, log)) for r in range(RANKS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=1800) for _ in range(RANKS * EPOCHS)]
    for p in procs:
        p.join(timeout=120)
        if p.exitcode != 0:
            raise RuntimeError(f"a rank exited with {p.exitcode}")
    epochs = []
    for epoch in range(EPOCHS):
        mine = [r for r in results if r["epoch"] == epoch]
        epochs.append(
            {
                "epoch": epoch + 1,
                "seconds": max(r["seconds"] for r in mine),
                "rows": sum(r["rows"] for r in mine),
                **{k: sum(r[k] for r in mine) for k in ("requests", "hits", "misses", "served", "evictions")},
                "disk": max(r["disk"] for r in mine),
                "logged": max(r["logged"] for r in mine),
            }
        )
    return epochs


def raw_pyarrow(paths: list[Path], columns: list[str]) -> float:
    """One process, ``ParquetFile.iter_batches`` over the local files: seconds."""
    import pyarrow.parquet as pq
    import torch

    started = time.perf_counter()
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=8192, columns=columns):
            {
                n: torch.from_numpy(c.to_numpy())
                for n, c in zip(batch.schema.names, batch.columns, strict=True)
            }
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=6_000_000)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--row-group-size", type=int, default=65_536)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.010, help="seconds per request of latency://")
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument("--columns", choices=sorted(COLUMN_SETS), default="numeric")
    parser.add_argument("--data-dir", type=Path, default=HERE / ".data")
    parser.add_argument("--json", type=Path, help="also write every run's epochs to this file")
    args = parser.parse_args()

    spec = DatasetSpec(rows=args.rows, files=args.files, row_group_size=args.row_group_size)
    paths = ensure_dataset(spec, args.data_dir)
    root = paths[0].parent
    data_bytes = sum(p.stat().st_size for p in paths)
    columns = COLUMN_SETS[args.columns]
    base = {
        "columns": columns,
        "batch_size": 8192,
        "shuffle": True,
        "persistent_workers": True,
        "multiprocessing_context": "fork",
    }
    work = Path(tempfile.mkdtemp(prefix="tdu-bench-cache-"))
    cache = str(work / "cache")
    log = str(work / "requests.log")
    big = 4 * data_bytes
    small = data_bytes // 3

    def latency_options() -> dict[str, Any]:
        return {"delay": args.latency, "stats_key": uuid.uuid4().hex, "request_log": log}

    jobs: dict[str, Any] = {
        "local disk": lambda: run_job(str(root), base),
        f"{args.latency * 1000:.0f} ms + cache": lambda: run_job(
            f"latency://{root}",
            {**base, "storage_options": latency_options(), "data_cache": cache, "data_cache_size": big},
            cache,
            log,
        ),
    }
    stop_s3 = None
    if not args.skip_s3:
        from testsupport.s3_server import BUCKET, start_seaweedfs

        (work / "seaweed").mkdir()
        started = start_seaweedfs(work / "seaweed")
        if isinstance(started, str):
            print(f"SeaweedFS could not start ({started}): no S3 rows")
        else:
            server, stop_s3 = started
            fs = server.fs()
            fs.put(str(root) + "/", f"{BUCKET}/data/", recursive=True)
            s3_options = server.options()
            jobs["S3 (SeaweedFS) + cache"] = lambda: run_job(
                f"s3://{BUCKET}/data",
                {**base, "storage_options": s3_options, "data_cache": cache, "data_cache_size": big},
                cache,
            )
    jobs[f"{args.latency * 1000:.0f} ms, no cache"] = lambda: run_job(
        f"latency://{root}", {**base, "storage_options": latency_options()}, None, log
    )
    jobs[f"{args.latency * 1000:.0f} ms + cache of 1/3 the data"] = lambda: run_job(
        f"latency://{root}",
        {**base, "storage_options": latency_options(), "data_cache": cache, "data_cache_size": small},
        cache,
        log,
    )
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in jobs}
    raw: list[float] = []
    load = [os.getloadavg()]
    try:
        for _ in range(args.repeats):
            raw.append(raw_pyarrow(paths, columns))
            for name, job in jobs.items():
                shutil.rmtree(cache, ignore_errors=True)  # every job starts cold
                runs[name].append(job())
            load.append(os.getloadavg())
    finally:
        if stop_s3 is not None:
            stop_s3()
        shutil.rmtree(work, ignore_errors=True)

    def med(name: str, epoch: int, key: str) -> float:
        return statistics.median(r[epoch][key] for r in runs[name])

    rows = spec.rows
    local_later = statistics.median(sum(r[e]["seconds"] for e in (1, 2)) for r in runs["local disk"])
    lines = []
    for name in jobs:
        later = statistics.median(sum(r[e]["seconds"] for e in (1, 2)) for r in runs[name])
        for e in range(EPOCHS):
            lines.append(
                [
                    name,
                    e + 1,
                    f"{med(name, e, 'seconds'):.2f}",
                    f"{rows / med(name, e, 'seconds') / 1e6:.2f} M",
                    f"{med(name, e, 'requests'):.0f}",
                    f"{med(name, e, 'logged'):.0f}" if "ms" in name else "-",
                    f"{med(name, e, 'hits'):.0f}",
                    f"{med(name, e, 'disk') / 2**20:.0f}"
                    if "cache" in name and "no cache" not in name
                    else "-",
                    f"{local_later / later:.2f}x" if e == 2 else "",
                ]
            )
    out = [
        f"Data: {rows:,} rows, {args.files} files, {data_bytes / 2**20:.0f} MiB, row groups of "
        f"{args.row_group_size:,}; columns {args.columns}; {RANKS} ranks x {WORKERS} persistent workers, "
        f"batch 8192, shuffle; cache limit {big / 2**20:.0f} MiB (small: {small / 2**20:.0f} MiB); "
        f"medians of {args.repeats}.",
        f"Raw pyarrow loop, one process, local files: {statistics.median(raw):.2f} s per epoch "
        f"({rows / statistics.median(raw) / 1e6:.2f} M rows/s).",
        f"Load average (1 min) before and after each round: {[round(x[0], 2) for x in load]}.",
        "",
        table(
            [
                "job",
                "epoch",
                "seconds",
                "rows/s",
                "requests (metrics)",
                "requests (filesystem log)",
                "cache hits",
                "cache MiB on disk",
                "epochs 2-3 vs local",
            ],
            lines,
        ),
        f"Machine: {machine()}",
    ]
    print("\n".join(out))
    if args.json is not None:
        import json

        args.json.write_text(json.dumps({"runs": runs, "raw_seconds": raw, "load": load}, indent=1))


if __name__ == "__main__":
    main()
