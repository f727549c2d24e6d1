"""Shared benchmark harness: dataset generation, timing, medians, JSON and markdown output.

Every benchmark compares the library with a raw pyarrow loop measured in the same run,
interleaving the two (raw, loader, raw, loader, ...) so that load from other processes
on the machine hits both alike, and reports medians.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_DATA = HERE / ".data"
DEFAULT_RESULTS = HERE / "results"

NUMERIC_COLUMNS = ["id", "f0", "f1", "f2", "f3", "f4", "f5", "i0", "label"]
STRING_COLUMN = "s"
COLUMN_SETS = {
    "numeric": NUMERIC_COLUMNS,
    "numeric+string": [*NUMERIC_COLUMNS, STRING_COLUMN],
}


@dataclass(frozen=True)
class DatasetSpec:
    """Shape of the generated benchmark dataset."""

    rows: int = 6_000_000
    files: int = 16
    row_group_size: int = 65_536
    seed: int = 0

    @property
    def name(self) -> str:
        return f"rows{self.rows}_files{self.files}_rg{self.row_group_size}_seed{self.seed}"


def ensure_dataset(spec: DatasetSpec, root: Path = DEFAULT_DATA) -> list[Path]:
    """Write the dataset once into ``root/<spec.name>`` (cached) and return its files.

    Columns: ``id`` (int64, unique), six float32 ``f*``, ``i0`` and ``label`` (int64) and
    ``s`` (a string of 8-24 characters).
    """
    target = root / spec.name
    done = target / "_SUCCESS"
    if done.exists():
        return sorted(target.glob("part-*.parquet"))
    target.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    per_file = [spec.rows // spec.files + (1 if i < spec.rows % spec.files else 0) for i in range(spec.files)]
    start = 0
    paths = []
    for i, n in enumerate(per_file):
        ids = np.arange(start, start + n, dtype=np.int64)
        cols: dict[str, Any] = {"id": ids}
        for j in range(6):
            cols[f"f{j}"] = rng.standard_normal(n, dtype=np.float32)
        cols["i0"] = rng.integers(0, 1 << 40, n, dtype=np.int64)
        cols["label"] = rng.integers(0, 10, n, dtype=np.int64)
        lengths = rng.integers(8, 25, n)
        alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
        chars = alphabet[rng.integers(0, len(alphabet), int(lengths.sum()))]
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        cols["s"] = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))
        path = target / f"part-{i:04d}.parquet"
        pq.write_table(pa.table(cols), path, row_group_size=spec.row_group_size)
        paths.append(path)
        start += n
    done.write_text("ok\n")
    return paths


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its finished children so far."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], int]) -> tuple[float, int, float]:
    """Run ``fn`` (which returns a row count) once; returns ``(seconds, rows, cpu_seconds)``.

    CPU time counts DataLoader workers once they have exited (the loader joins them at
    the end of an epoch without persistent workers).
    """
    gc.collect()
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    rows = fn()
    return time.perf_counter() - t0, rows, cpu_seconds() - c0


@dataclass
class Series:
    """Repeated measurements of one configuration."""

    name: str
    params: dict[str, Any]
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    rows: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, seconds: float, rows: int, cpu: float = float("nan")) -> None:
        if self.rows and rows != self.rows:
            raise AssertionError(f"{self.name}: row count changed between runs ({self.rows} -> {rows})")
        self.rows = rows
        self.seconds.append(seconds)
        self.cpu_seconds.append(cpu)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def median_cpu_s(self) -> float:
        return statistics.median(self.cpu_seconds)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.median_s


def interleave(runs: Sequence[tuple[Series, Callable[[], int]]], repeats: int, warmup: int = 1) -> None:
    """Run every configuration ``repeats`` times in round-robin order (after warm-up runs)."""
    for _ in range(warmup):
        for _, fn in runs:
            fn()
    for _ in range(repeats):
        for series, fn in runs:
            series.add(*timed(fn))


def machine() -> dict[str, Any]:
    """A description of the machine and software the numbers come from."""
    import torch

    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": cpus,
        "loadavg_at_start": load,
        "torch": torch.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
    }


def write_results(name: str, payload: dict[str, Any], markdown: str, out_dir: Path = DEFAULT_RESULTS) -> None:
    """Write ``<name>.json`` and ``<name>.md`` under ``out_dir`` and print the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    (out_dir / f"{name}.md").write_text(markdown)
    print(markdown)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def series_json(series: Series) -> dict[str, Any]:
    out = asdict(series)
    out["median_s"] = series.median_s
    out["rows_per_s"] = series.rows_per_s
    out["median_cpu_s"] = series.median_cpu_s
    return out


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--rows", type=int, default=DatasetSpec.rows, help="rows in the dataset")
    p.add_argument("--files", type=int, default=DatasetSpec.files, help="number of Parquet files")
    p.add_argument("--row-group-size", type=int, default=DatasetSpec.row_group_size)
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="dataset cache directory")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_RESULTS, help="where JSON/markdown go")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per configuration (median)")
    p.add_argument("--quick", action="store_true", help="small dataset and 3 repeats (smoke run)")
    return p


def spec_from_args(args: argparse.Namespace) -> DatasetSpec:
    if args.quick:
        args.repeats = min(args.repeats, 3)
        return DatasetSpec(rows=200_000, files=4, row_group_size=16_384)
    return DatasetSpec(rows=args.rows, files=args.files, row_group_size=args.row_group_size)


def command_line() -> str:
    return " ".join([Path(sys.executable).name, *sys.argv])


def rss_mib() -> float:
    """This process's resident memory now, in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def reset_peak() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs``), so what came before does not count."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_mib() -> float:
    """This process's peak RSS (since the last :func:`reset_peak`), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pass_memory(run: Callable[[], int]) -> dict[str, float]:
    """One pass of ``run`` in this process: its rows, the peak RSS growth over the RSS before
    it, and the largest finished child's (a DataLoader worker's) peak RSS, in MiB."""
    base = rss_mib()
    reset_peak()
    rows = run()
    peak = peak_mib()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"rows": rows, "growth_mib": peak - base, "worker_peak_mib": kids}


def fresh_process_memory(commands: dict[str, list[str]], repeats: int) -> dict[str, dict[str, float | None]]:
    """Run every command (a child printing :func:`pass_memory`'s JSON last) ``repeats`` times,
    interleaved, each in a fresh process; medians per command name (``name/0``: no workers)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    samples: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeats):
        for name, cmd in commands.items():
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
            samples.setdefault(name, []).append(json.loads(out.strip().splitlines()[-1]))
    return {
        name: {
            "growth_mib": statistics.median(s["growth_mib"] for s in runs),
            "worker_peak_mib": None
            if name.endswith("/0")
            else statistics.median(s["worker_peak_mib"] for s in runs),
        }
        for name, runs in samples.items()
    }
