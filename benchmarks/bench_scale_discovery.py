"""Time to first batch over many small Parquet files behind 10 ms per request, 8 ranks.

Run (under the heavy-work lock, from the repository root):

    flock /tmp/heavy.lock env PYTHONPATH=src:. .venv/bin/python benchmarks/bench_scale_discovery.py
    ... --files 10000 100000 --ranks 8 --repeats 3     # the default
    ... --quick                                        # 2,000 files, 4 ranks, one run

1. **Ranks** (for each ``--files N``): ``--ranks`` real processes (forked, gloo
   process group over TCP) build ``create_dataloader("latency://DIR", ...)`` over N
   files of ``--rows`` rows, each request delayed ``--delay`` s (``testsupport/latency_fs.py``),
   and take the first batch. Timed per rank from a barrier; the figure is the slowest
   rank. Cold: no metadata cache (rank 0 lists, every rank reads its share of the
   footers, the shares are all-gathered); warm: ``metadata_cache=`` a local file
   written by the cold run (rank 0 lists and reads the cache, no footer is read);
   warm on open: the same with ``metadata_cache_check="on_open"`` (rank 0 reads the
   cache and lists nothing; each file is checked when it is opened).
2. **Workers**: one process, ``--small-files`` files of 1,000 rows,
   ``num_workers=2``: seconds from ``create_dataloader`` to the first batch, and the
   main process's requests.

Baseline in the same run: a raw pyarrow dataset (``pyarrow.dataset.dataset`` over the
same latency filesystem, one process) to its first batch: it lists and reads one footer,
so it promises nothing about rows per rank; it shows what listing alone costs.

Files are generated once under ``benchmarks/.data/scale-discovery/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import socket
import statistics
import tempfile
import time
import traceback
import uuid
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import testsupport.latency_fs as latency

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data" / "scale-discovery"


# -- data ---------------------------------------------------------------------------
def _write_range(root: str, start: int, stop: int, rows: int) -> None:
    for i in range(start, stop):
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        table = pa.table({"id": ids, "x": (ids % 1000).astype(np.float32)})
        pq.write_table(table, os.path.join(root, f"part-{i:07d}.parquet"))


def ensure_files(n: int, rows: int) -> Path:
    """``n`` Parquet files of ``rows`` rows (ids consecutive), written once and cached."""
    root = DATA / f"{n}x{rows}"
    done = root / "_DONE"
    if done.exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    step = 2000
    with ProcessPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(_write_range, str(root), lo, min(n, lo + step), rows) for lo in range(0, n, step)
        ]
        for f in futures:
            f.result()
    done.write_text("ok")  # a marker: skipped by listing ('_' prefix)
    return root


# -- ranks --------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    rank: int,
    world: int,
    port: int,
    url: str,
    delay: float,
    cache: str | None,
    workers: int,
    queue: Any,
    check: str = "listing",
) -> None:
    try:
        import torch.distributed as dist

        import torch_dataloader_utils.runtime.files as files_module
        from torch_dataloader_utils import create_dataloader

        discovery_time = [0.0]
        discover = files_module.discover

        def timed_discover(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return discover(*args, **kwargs)
            finally:
                discovery_time[0] = time.perf_counter() - t

        files_module.discover = timed_discover  # type: ignore[assignment]
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=600),
        )
        dist.barrier()
        key = uuid.uuid4().hex
        options: dict[str, Any] = {"storage_options": {"delay": delay, "stats_key": key}}
        if cache is not None:
            options["metadata_cache"] = cache
            if check != "listing":
                options["metadata_cache_check"] = check
        t0 = time.perf_counter()
        c0 = time.process_time()
        loader, dataset = create_dataloader(url, num_workers=workers, batch_size=1024, **options)
        t1 = time.perf_counter()
        batch = next(iter(loader))
        t2 = time.perf_counter()
        cpu = time.process_time() - c0
        assert len(batch["id"]) == 1024
        table = getattr(dataset.discovered, "metadata", None)  # None before the columnar tables
        out = {
            "rank": rank,
            "discover_s": discovery_time[0],
            "build_s": t1 - t0,
            "first_batch_s": t2 - t0,
            "cpu_s": cpu,
            "requests": latency.stats(key).requests,
            "files": len(dataset.files),
            "metadata_bytes": None if table is None else table.nbytes,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        dist.barrier()
        dist.destroy_process_group()
        queue.put(out)
    except BaseException:
        queue.put({"rank": rank, "error": traceback.format_exc()})


def run_ranks(
    root: Path, world: int, delay: float, cache: str | None, workers: int, check: str = "listing"
) -> list[dict[str, Any]]:
    """One multi-rank start: every rank's figures (``check``: ``metadata_cache_check``)."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = _free_port()
    url = f"latency://{root}"
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, url, delay, cache, workers, queue, check))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in range(world):
            item = queue.get(timeout=900)
            if "error" in item:
                raise RuntimeError(f"rank {item['rank']} failed:\n{item['error']}")
            results.append(item)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return sorted(results, key=lambda r: r["rank"])


def raw_first_batch(root: Path, delay: float) -> float:
    """Seconds for a raw pyarrow dataset over the same latency filesystem to its first batch."""
    fs = pafs.PyFileSystem(pafs.FSSpecHandler(latency.LatencyFileSystem(delay=delay, stats_key="raw")))
    t = time.perf_counter()
    dataset = pads.dataset(str(root), format="parquet", filesystem=fs)
    next(iter(dataset.to_batches(batch_size=1024)))
    return time.perf_counter() - t


def bench_ranks(n: int, args: argparse.Namespace) -> dict[str, Any]:
    root = ensure_files(n, args.rows)
    cold, warm, trusted, raw = [], [], [], []
    tmp = Path(tempfile.mkdtemp(prefix="tdu-scale-"))
    try:
        for i in range(args.repeats):
            cache = str(tmp / f"meta-{i}.arrow")
            raw.append(raw_first_batch(root, args.delay))
            cold.append(run_ranks(root, args.ranks, args.delay, cache if not args.no_cache else None, 0))
            if not args.no_cache:
                warm.append(run_ranks(root, args.ranks, args.delay, cache, 0))
                trusted.append(run_ranks(root, args.ranks, args.delay, cache, 0, "on_open"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def summary(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
        if not runs:
            return {}
        slowest = [max(r["first_batch_s"] for r in run) for run in runs]
        out: dict[str, Any] = {
            "first_batch_s_median": statistics.median(slowest),
            "first_batch_s_runs": slowest,
        }
        for field in ("discover_s", "build_s", "cpu_s", "requests", "peak_rss_mb"):
            out[f"{field}_max_median"] = statistics.median(max(r[field] for r in run) for run in runs)
        # CPU seconds of all ranks together: on a machine with fewer cores than ranks,
        # (sum / cores) bounds the wall time from below
        out["cpu_s_sum_median"] = statistics.median(sum(r["cpu_s"] for r in run) for run in runs)
        out["requests_per_rank_last_run"] = [r["requests"] for r in runs[-1]]
        out["metadata_bytes"] = runs[-1][0]["metadata_bytes"]
        assert all(r["files"] == n for run in runs for r in run)
        return out

    return {
        "files": n,
        "ranks": args.ranks,
        "cold": summary(cold),
        "warm": summary(warm),
        "warm_on_open": summary(trusted),
        "raw_first_batch_s_median": statistics.median(raw),
    }


# -- one process, two workers ---------------------------------------------------------
def bench_workers(args: argparse.Namespace) -> dict[str, Any]:
    from torch_dataloader_utils import create_dataloader

    root = ensure_files(args.small_files, 1000)
    lib, raw, requests = [], [], []
    for _ in range(args.repeats):
        raw.append(raw_first_batch(root, args.delay))
        key = uuid.uuid4().hex
        t = time.perf_counter()
        loader, _ = create_dataloader(
            f"latency://{root}",
            storage_options={"delay": args.delay, "stats_key": key},
            num_workers=2,
            batch_size=1024,
            multiprocessing_context="fork",
        )
        it = iter(loader)
        next(it)
        lib.append(time.perf_counter() - t)
        requests.append(latency.stats(key).requests)
        del it, loader
    return {
        "files": args.small_files,
        "first_batch_s_median": statistics.median(lib),
        "first_batch_s_runs": lib,
        "main_process_requests": requests[-1],
        "raw_first_batch_s_median": statistics.median(raw),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rows", type=int, default=100, help="rows per file of the multi-rank runs")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.010, help="seconds added to every request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small-files", type=int, default=1000, help="files of the num_workers=2 case")
    parser.add_argument("--skip-ranks", action="store_true")
    parser.add_argument("--skip-workers", action="store_true")
    parser.add_argument("--no-cache", action="store_true", help="no metadata_cache (older versions)")
    parser.add_argument("--quick", action="store_true", help="2,000 files, 4 ranks, one run")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "scale_discovery.json")
    args = parser.parse_args()
    if args.quick:
        args.files, args.ranks, args.repeats = [2000], 4, 1
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result: dict[str, Any] = {
        "loadavg_at_start": os.getloadavg(),
        "args": {**vars(args), "out": str(args.out)},
    }
    if not args.skip_workers:
        result["workers"] = bench_workers(args)
        print(json.dumps(result["workers"], indent=1), flush=True)
    if not args.skip_ranks:
        result["ranks"] = []
        for n in args.files:
            result["ranks"].append(bench_ranks(n, args))
            print(json.dumps(result["ranks"][-1], indent=1), flush=True)
        cold = [r["cold"]["first_batch_s_median"] for r in result["ranks"]]
        if len(cold) >= 2:
            result["growth_cold"] = cold[-1] / cold[0]
            print(f"growth {args.files[0]} -> {args.files[-1]} files (cold): {result['growth_cold']:.2f}x")
    result["loadavg_at_end"] = os.getloadavg()
    print(f"load average: start {result['loadavg_at_start']}, end {result['loadavg_at_end']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
