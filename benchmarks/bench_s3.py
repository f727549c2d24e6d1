"""Object-storage benchmarks: data path, startup, throughput under latency, bytes fetched.

Run: ``PYTHONPATH=src:. python benchmarks/bench_s3.py [--repeats 3] [--skip-s3]``

1. Data path (SeaweedFS on 127.0.0.1, no added latency): the library reading a dataset
   with bytes through pyarrow's native S3 client vs through s3fs (the fsspec path),
   with ``storage_options`` and with ``filesystem=`` objects (a plain s3fs object takes
   the native path; a subclass of it, which the library cannot prove equal, the fsspec
   path), and the raw pyarrow loop (``ParquetFile.iter_batches``) over each client; a
   ratio column against the raw loop over the native client in the same run.
   ``--data-path-only`` runs this part alone.
2. Startup: 2,000 small files behind 10 ms per request (``latency://``): seconds from
   ``create_dataloader`` to the first batch; raw: pyarrow dataset discovery + first batch.
3. Throughput at 0 / 5 / 20 ms per request, projected columns, library vs raw pyarrow
   loop through the same wrapper, and bytes fetched vs bytes needed.
Every figure is the median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
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
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import testsupport.latency_fs as latency

from torch_dataloader_utils import create_dataloader

COLUMNS = ["id", "f0", "f1"]


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def write_dataset(root: Path, files: int, rows: int, rg_rows: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        ids = np.arange(i * rows, (i + 1) * rows)
        table = pa.table(
            {
                "id": ids,
                "f0": rng.random(rows),
                "f1": rng.random(rows).astype(np.float32),
                "f2": rng.random(rows),
                "f3": rng.integers(0, 1 << 40, rows),
            }
        )
        pq.write_table(table, root / f"part-{i:05d}.parquet", row_group_size=rg_rows)


def library_rows(url: str, options: dict[str, Any] | None, **kwargs: Any) -> int:
    loader, _ = create_dataloader(
        url, storage_options=options, num_workers=0, batch_size=65536, output_format="arrow", **kwargs
    )
    return sum(b.num_rows for b in loader)


def _s3fs_subclass() -> type:
    import s3fs

    class MyS3(s3fs.S3FileSystem):  # a user's own subclass: bytes through it (fsspec path)
        pass

    return MyS3


def raw_rows(fs: pafs.FileSystem, paths: list[str], columns: list[str] | None) -> int:
    rows = 0
    for p in paths:
        pf = pq.ParquetFile(p, filesystem=fs)
        for batch in pf.iter_batches(batch_size=65536, columns=columns):
            rows += batch.num_rows
    return rows


def latency_fs(delay: float, key: str) -> pafs.FileSystem:
    return pafs.PyFileSystem(pafs.FSSpecHandler(latency.LatencyFileSystem(delay=delay, stats_key=key)))


def bench_throughput(root: Path, repeats: int) -> list[str]:
    paths = sorted(str(p) for p in root.glob("*.parquet"))
    needed = 0
    for p in paths:
        meta = pq.read_metadata(p)
        names = [meta.schema.column(j).name for j in range(meta.num_columns)]
        for i in range(meta.num_row_groups):
            needed += sum(meta.row_group(i).column(names.index(c)).total_compressed_size for c in COLUMNS)
    lines = [
        "| added latency | library rows/s | raw pyarrow rows/s | library / raw | library vs 0 ms "
        "| library bytes fetched / needed | raw bytes fetched / needed |",
        "|---|---|---|---|---|---|---|",
    ]
    base = None
    for delay in (0.0, 0.005, 0.020):
        key = uuid.uuid4().hex
        counters = latency.stats(key)
        opts = {"delay": delay, "stats_key": key}
        lib_t, rows = median_time(
            lambda o=opts: library_rows(f"latency://{root}", o, columns=COLUMNS), repeats
        )
        lib_bytes = counters.bytes / repeats
        footer_bytes = 0
        counters.reset()
        rkey = uuid.uuid4().hex
        rcounters = latency.stats(rkey)
        raw_t, raw_n = median_time(
            lambda d=delay, k=rkey: raw_rows(latency_fs(d, k), paths, COLUMNS), repeats
        )
        assert raw_n == rows
        raw_bytes = rcounters.bytes / repeats
        del footer_bytes
        lib_rate, raw_rate = rows / lib_t, rows / raw_t
        base = base or lib_rate
        lines.append(
            f"| {delay * 1000:.0f} ms | {lib_rate:,.0f} | {raw_rate:,.0f} | {lib_rate / raw_rate:.2f}x "
            f"| {lib_rate / base:.2f}x | {lib_bytes / needed:.3f} | {raw_bytes / needed:.3f} |"
        )
    lines.append("")
    lines.append(
        f"Bytes needed: {needed:,} (column chunks of {COLUMNS} in every row group). Library bytes "
        "include one 64 KiB footer read per file during discovery."
    )
    return lines


def bench_startup(root: Path, repeats: int) -> list[str]:
    def library() -> float:
        key = uuid.uuid4().hex
        t = time.perf_counter()
        loader, _ = create_dataloader(
            f"latency://{root}", storage_options={"delay": 0.010, "stats_key": key}, num_workers=0
        )
        next(iter(loader))
        return time.perf_counter() - t

    def raw() -> float:
        t = time.perf_counter()
        dataset = pads.dataset(str(root), format="parquet", filesystem=latency_fs(0.010, uuid.uuid4().hex))
        next(iter(dataset.to_batches()))
        return time.perf_counter() - t

    lib = statistics.median(library() for _ in range(repeats))
    rw = statistics.median(raw() for _ in range(repeats))
    return [
        "| 2,000 files, 10 ms per request | seconds to first batch |",
        "|---|---|",
        f"| library (listing + 2,000 footers read concurrently, then the first chunk) | {lib:.2f} |",
        f"| raw pyarrow dataset (lists, reads only the first file's footer) | {rw:.2f} |",
    ]


def bench_data_path(root: Path, repeats: int) -> list[str]:
    import s3fs
    from testsupport.s3_server import BUCKET, KEY, SECRET, start_seaweedfs

    workdir = Path(tempfile.mkdtemp(prefix="tdu-bench-sw-"))
    started = start_seaweedfs(workdir)
    if isinstance(started, str):
        return [f"SeaweedFS could not start: {started}"]
    server, stop = started
    try:
        opts = server.options()
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
        fs.put(str(root) + "/", f"{BUCKET}/data/", recursive=True)
        url = f"s3://{BUCKET}/data"
        paths = sorted(fs.find(f"{BUCKET}/data"))
        native = pafs.S3FileSystem(
            access_key=KEY, secret_key=SECRET, endpoint_override=server.endpoint[7:], scheme="http"
        )
        via_s3fs = pafs.PyFileSystem(pafs.FSSpecHandler(fs))
        plain = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
        subclass = _s3fs_subclass()(skip_instance_cache=True, **opts)
        cases = {
            "raw pyarrow loop, native S3FileSystem": lambda: raw_rows(native, paths, COLUMNS),
            "raw pyarrow loop, s3fs via FSSpecHandler": lambda: raw_rows(via_s3fs, paths, COLUMNS),
            "library, storage_options: native pyarrow S3 bytes (default)": lambda: library_rows(
                url, opts, columns=COLUMNS
            ),
            "library, storage_options with an s3fs-only option: s3fs bytes (fsspec path)": lambda: (
                library_rows(url, {**opts, "version_aware": False}, columns=COLUMNS)
            ),
            "library, filesystem=s3fs.S3FileSystem(...): native bytes": lambda: library_rows(
                url, None, filesystem=plain, columns=COLUMNS
            ),
            "library, filesystem=a subclass of s3fs: the object's bytes (fsspec path)": lambda: library_rows(
                url, None, filesystem=subclass, columns=COLUMNS
            ),
        }
        lines = [
            "| SeaweedFS on 127.0.0.1, no added latency | seconds | rows/s | time / raw native loop |",
            "|---|---|---|---|",
        ]
        base: float | None = None
        for name, fn in cases.items():
            t, rows = median_time(fn, repeats)
            base = t if base is None else base
            lines.append(f"| {name} | {t:.2f} | {rows / t:,.0f} | {t / base:.2f}x |")
        return lines
    finally:
        stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument("--files", type=int, default=8, help="files of the throughput dataset")
    parser.add_argument("--data-path-only", action="store_true", help="only the data path comparison")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tdu-bench-s3-"))
    try:
        big = tmp / "big"
        write_dataset(big, files=args.files, rows=400_000, rg_rows=100_000)
        if args.data_path_only:
            print("\n".join(["## Data path", "", *bench_data_path(big, args.repeats)]))
            return
        small = tmp / "small"
        write_dataset(small, files=2000, rows=50, rg_rows=50)
        out = ["## Startup", "", *bench_startup(small, args.repeats), ""]
        out += ["## Throughput under latency", "", *bench_throughput(big, args.repeats), ""]
        if not args.skip_s3:
            out += ["## Data path", "", *bench_data_path(big, args.repeats), ""]
        print("\n".join(out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
