"""Resharding many small files: the job's time, then the loader's start and epoch before vs after.

Run: ``PYTHONPATH=src:. python benchmarks/bench_reshard.py [--files 20000] [--repeats 3]``
(``--quick``: 2,000 files). Under ``flock /tmp/heavy.lock`` on a shared machine.

The source is ``--files`` Parquet files of ``--rows-per-file`` rows (``id``, two float32,
a label, a short string), generated once and cached under ``benchmarks/.data/``. For
each storage — the local disk, and the same files behind ``latency://`` (10 ms added to
every request, as an object store) — the benchmark:

1. reshards the files into shards of ``--target`` (``workers`` local processes), timed once;
2. times, interleaved and ``--repeats`` times, the loader's seconds to the first batch and
   for a whole epoch (``num_workers=0``, Arrow batches) over the small files ("before")
   and over the shards through their manifest ("after");
3. times a raw pyarrow loop (``ParquetFile.iter_batches`` over every shard) in the same
   runs, so the loader's epoch is also a ratio to pyarrow reading the same bytes.

Figures are medians; ``os.getloadavg()`` is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import testsupport.latency_fs as latency

from torch_dataloader_utils import create_dataloader, reshard

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"
RESULTS = HERE / "results"
DELAY = 0.010


def ensure_small_files(files: int, rows: int) -> Path:
    """``files`` Parquet files of ``rows`` rows each, written once (cached)."""
    root = DATA / f"reshard_files{files}_rows{rows}"
    if (root / "_SUCCESS").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
    t0 = time.perf_counter()
    for i in range(files):
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        lengths = rng.integers(4, 17, rows)
        offsets = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        chars = alphabet[rng.integers(0, len(alphabet), int(offsets[-1]))]
        table = pa.table(
            {
                "id": ids,
                "f0": rng.standard_normal(rows, dtype=np.float32),
                "f1": rng.standard_normal(rows, dtype=np.float32),
                "label": rng.integers(0, 10, rows),
                "s": pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes())),
            }
        )
        pq.write_table(table, root / f"part-{i:06d}.parquet")
        if i and i % 2000 == 0:
            print(f"  generated {i} files ({time.perf_counter() - t0:.0f} s)", flush=True)
    (root / "_SUCCESS").write_text("ok\n")
    return root


def url(path: Path, remote: bool) -> str:
    return f"latency://{path}" if remote else str(path)


def options(remote: bool) -> dict[str, Any] | None:
    return {"delay": DELAY, "stats_key": uuid.uuid4().hex} if remote else None


def first_batch(path: str, opts: dict[str, Any] | None) -> float:
    t = time.perf_counter()
    loader, _ = create_dataloader(
        path, storage_options=opts, num_workers=0, batch_size=4096, output_format="arrow"
    )
    next(iter(loader))
    return time.perf_counter() - t


def epoch(path: str, opts: dict[str, Any] | None, rows: int) -> float:
    t = time.perf_counter()
    loader, _ = create_dataloader(
        path, storage_options=opts, num_workers=0, batch_size=65536, output_format="arrow"
    )
    seen = sum(b.num_rows for b in loader)
    assert seen == rows, (seen, rows)
    return time.perf_counter() - t


def raw_epoch(paths: list[str], fs: pafs.FileSystem, rows: int) -> float:
    t = time.perf_counter()
    seen = 0
    for p in paths:
        for batch in pq.ParquetFile(p, filesystem=fs).iter_batches(batch_size=65536):
            seen += batch.num_rows
    assert seen == rows, (seen, rows)
    return time.perf_counter() - t


def raw_fs(remote: bool) -> pafs.FileSystem:
    if not remote:
        return pafs.LocalFileSystem()
    handler = pafs.FSSpecHandler(latency.LatencyFileSystem(delay=DELAY, stats_key=uuid.uuid4().hex))
    return pafs.PyFileSystem(handler)  # type: ignore[abstract]


def median(fn: Callable[[], float], times: list[float]) -> None:
    times.append(fn())


def bench(src: Path, work: Path, remote: bool, args: argparse.Namespace, rows: int) -> dict[str, Any]:
    name = "latency 10 ms" if remote else "local disk"
    dst = work / ("dst-remote" if remote else "dst-local")
    shutil.rmtree(dst, ignore_errors=True)
    print(f"[{name}] resharding {args.files} files ...", flush=True)
    t0 = time.perf_counter()
    report = reshard(
        url(src, remote),
        str(dst),
        storage_options=options(remote),
        dst_storage_options={},
        target_file_size=args.target,
        workers=args.workers,
    )
    reshard_s = time.perf_counter() - t0
    assert report.num_rows == rows
    shard_paths = [str(dst / s.path) for s in report.manifest.shards]
    sizes = [s.bytes for s in report.manifest.shards]
    series: dict[str, list[float]] = {
        k: [] for k in ("first_before", "first_after", "epoch_before", "epoch_after", "raw_after")
    }
    for i in range(args.repeats):
        print(f"[{name}] repeat {i + 1}/{args.repeats}", flush=True)
        median(lambda: first_batch(url(src, remote), options(remote)), series["first_before"])
        median(lambda: first_batch(url(dst, remote), options(remote)), series["first_after"])
        if not args.skip_epoch_before:
            median(lambda: epoch(url(src, remote), options(remote), rows), series["epoch_before"])
        median(lambda: epoch(url(dst, remote), options(remote), rows), series["epoch_after"])
        median(lambda: raw_epoch(shard_paths, raw_fs(remote), rows), series["raw_after"])
    med = {k: statistics.median(v) if v else float("nan") for k, v in series.items()}
    return {
        "storage": name,
        "reshard_s": reshard_s,
        "shards": report.num_shards,
        "shard_mib_min_max": [min(sizes) / 2**20, max(sizes[:-1] or sizes) / 2**20],
        "medians": med,
        "runs": series,
    }


def markdown(
    results: list[dict[str, Any]], args: argparse.Namespace, rows: int, load: tuple[float, ...]
) -> str:
    lines = [
        f"{args.files:,} Parquet files of {args.rows_per_file:,} rows ({rows:,} rows) -> shards of "
        f"{args.target} with {args.workers} workers; medians of {args.repeats} interleaved runs; "
        f"loadavg at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "",
        "| storage | reshard s | shards | first batch before s | after s | start speed-up "
        "| epoch before s | after s | raw pyarrow over shards s | after / raw |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["medians"]
        lines.append(
            f"| {r['storage']} | {r['reshard_s']:.1f} | {r['shards']} | {m['first_before']:.2f} | "
            f"{m['first_after']:.3f} | {m['first_before'] / m['first_after']:.0f}x | "
            f"{m['epoch_before']:.1f} | "
            f"{m['epoch_after']:.1f} | {m['raw_after']:.1f} | {m['epoch_after'] / m['raw_after']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=20_000, help="small source files")
    parser.add_argument("--rows-per-file", type=int, default=1000)
    parser.add_argument("--target", default="64MiB", help="target_file_size of the shards")
    parser.add_argument("--workers", type=int, default=2, help="reshard worker processes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-remote", action="store_true", help="local disk only")
    parser.add_argument("--skip-epoch-before", action="store_true", help="skip the slowest timing")
    parser.add_argument("--quick", action="store_true", help="2,000 files, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.files, args.repeats = min(args.files, 2000), 1
    load = os.getloadavg()
    src = ensure_small_files(args.files, args.rows_per_file)
    rows = args.files * args.rows_per_file
    work = Path(tempfile.mkdtemp(prefix="tdu-bench-reshard-"))
    try:
        results = [bench(src, work, False, args, rows)]
        if not args.skip_remote:
            results.append(bench(src, work, True, args, rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = markdown(results, args, rows, load)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_reshard.md").write_text(text)
    (RESULTS / "bench_reshard.json").write_text(
        json.dumps({"args": vars(args), "loadavg_at_start": load, "results": results}, indent=2) + "\n"
    )
    print(text)


if __name__ == "__main__":
    main()
