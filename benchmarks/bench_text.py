"""CSV and JSONL throughput: torch_dataloader_utils with 0 and 2 workers vs pyarrow's own read.

Generates one CSV and one JSONL file (>= 200 MB each) once into a cache directory
(``--cache-dir``, default ``.bench_cache/text``, never committed), then for each format
times, in the same run, ``--runs`` times each (medians reported):

* ``pyarrow``: ``pyarrow.csv.read_csv`` / ``pyarrow.json.read_json`` of the whole file,
  single-threaded (``use_threads=False``);
* ``loader w=0``: ``create_dataloader(..., num_workers=0)``, the numeric columns as
  torch tensors (pyarrow parses the same columns);
* ``loader w=2``: the same with ``num_workers=2`` (fork).

Run: ``PYTHONPATH=src python benchmarks/bench_text.py [--mb 200] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson

from torch_dataloader_utils import create_dataloader

BATCH = 8192


def generate(cache: Path, mb: int) -> dict[str, Path]:
    cache.mkdir(parents=True, exist_ok=True)
    out = {"csv": cache / f"bench-{mb}mb.csv", "jsonl": cache / f"bench-{mb}mb.jsonl"}
    target = mb * 1_000_000
    rng = np.random.default_rng(0)
    for fmt, path in out.items():
        if path.exists() and path.stat().st_size >= target:
            continue
        tmp = path.with_suffix(".tmp")
        written = 0
        first = 0
        with open(tmp, "wb") as fh:
            if fmt == "csv":
                fh.write(b"id,label,x,y,text\n")
            while written < target:
                n = 100_000
                ids = np.arange(first, first + n)
                label = rng.integers(0, 10, n)
                x = rng.random(n).round(6)
                y = rng.normal(size=n).round(6)
                words = rng.integers(0, 1_000_000, n)
                if fmt == "csv":
                    lines = [
                        f"{i},{lab},{a},{b},word{w} é{w % 97}\n"
                        for i, lab, a, b, w in zip(ids, label, x, y, words, strict=True)
                    ]
                else:
                    lines = [
                        f'{{"id": {i}, "label": {lab}, "x": {a}, "y": {b}, "text": "word{w} é{w % 97}"}}\n'
                        for i, lab, a, b, w in zip(ids, label, x, y, words, strict=True)
                    ]
                chunk = "".join(lines).encode()
                fh.write(chunk)
                written += len(chunk)
                first += n
        os.replace(tmp, path)
    return out


def timed_interleaved(fns: dict[str, Callable[[], int]], runs: int) -> dict[str, tuple[float, int]]:
    """Median seconds and the row count of each function, runs interleaved (fair under noise)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    rows: dict[str, int] = {}
    for _ in range(runs):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            rows[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), rows[k]) for k, v in times.items()}


COLUMNS = ["id", "label", "x", "y"]
"""Numeric feature columns, returned as torch tensors (the text column is parsed, not returned)."""


def pyarrow_read(fmt: str, path: Path) -> int:
    if fmt == "csv":
        return pcsv.read_csv(
            path,
            read_options=pcsv.ReadOptions(use_threads=False),
            convert_options=pcsv.ConvertOptions(include_columns=COLUMNS),
        ).num_rows
    table = pjson.read_json(path, read_options=pjson.ReadOptions(use_threads=False))
    return table.select(COLUMNS).num_rows


def loader_read(fmt: str, path: Path, workers: int, split: str) -> int:
    loader, _ = create_dataloader(
        str(path),
        format=fmt,
        num_workers=workers,
        batch_size=BATCH,
        columns=COLUMNS,
        output_format="torch",
        split_bytes=split,
        multiprocessing_context="fork" if workers else None,
        timeout=600 if workers else 0,
    )
    return sum(len(batch["id"]) for batch in loader)


class SteadyLoader:
    """One loader with persistent workers, started by a warm-up epoch: times steady-state epochs."""

    def __init__(self, fmt: str, path: Path, workers: int, split: str) -> None:
        self.loader, _ = create_dataloader(
            str(path),
            format=fmt,
            num_workers=workers,
            batch_size=BATCH,
            columns=COLUMNS,
            output_format="torch",
            split_bytes=split,
            persistent_workers=workers > 0,
            multiprocessing_context="fork" if workers else None,
            timeout=600 if workers else 0,
        )
        self()  # warm-up: starts the workers

    def __call__(self) -> int:
        return sum(len(batch["id"]) for batch in self.loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--split", default="4MiB", help="split_bytes (4 MiB: ~25 equal chunks per worker of a 200 MB file)"
    )
    parser.add_argument(
        "--persistent",
        action="store_true",
        help="time steady-state epochs of loaders with persistent workers (started before timing)",
    )
    parser.add_argument("--cache-dir", default=".bench_cache/text")
    parser.add_argument("--json", default=None, help="also write results as JSON here")
    args = parser.parse_args()
    pa.set_cpu_count(max(2, os.cpu_count() or 2))
    paths = generate(Path(args.cache_dir), args.mb)
    results = []
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    machine = f"{platform.platform()}, {os.cpu_count()} CPUs, load {load}"
    print(f"# {machine}, pyarrow {pa.__version__}, runs={args.runs}")
    print(f"# split_bytes={args.split}, persistent={args.persistent}")
    for fmt, path in paths.items():
        size_mb = path.stat().st_size / 1e6
        got = timed_interleaved(
            {
                "pyarrow": functools.partial(pyarrow_read, fmt, path),
                "w0": SteadyLoader(fmt, path, 0, args.split)
                if args.persistent
                else functools.partial(loader_read, fmt, path, 0, args.split),
                "w2": SteadyLoader(fmt, path, 2, args.split)
                if args.persistent
                else functools.partial(loader_read, fmt, path, 2, args.split),
            },
            args.runs,
        )
        (base, n_base), (w0, n0), (w2, n2) = got["pyarrow"], got["w0"], got["w2"]
        assert n_base == n0 == n2, (n_base, n0, n2)
        row = {
            "format": fmt,
            "file_mb": round(size_mb, 1),
            "rows": n_base,
            "pyarrow_s": round(base, 3),
            "w0_s": round(w0, 3),
            "w2_s": round(w2, 3),
            "pyarrow_MBps": round(size_mb / base, 1),
            "w0_MBps": round(size_mb / w0, 1),
            "w2_MBps": round(size_mb / w2, 1),
            "w2_over_w0": round(w0 / w2, 2),
            "w2_over_pyarrow": round(base / w2, 2),
        }
        results.append(row)
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
