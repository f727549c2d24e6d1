"""Throughput: the loader against a raw pyarrow loop, same run, interleaved, medians.

The raw loop is what a user would write by hand, doing the same conversion work as the
loader (numeric columns to tensors, string columns to ``list[str]``)::

    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size, columns=columns):
            out = {name: torch.from_numpy(col.to_numpy()) ...}   # strings: col.to_pylist()

Configurations: column set (numeric / numeric+string) x batch size x num_workers (0, 2).
The ratio of ``num_workers=2`` is against the single-process raw loop.

Run: ``python benchmarks/bench_parquet.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import common
from torch_dataloader_utils import create_dataloader

# torch warns (once) that Arrow memory is read-only; both sides hand out such tensors.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def raw_loop(files: Sequence[Path], columns: list[str], batch_size: int) -> int:
    """The hand-written baseline; returns the number of rows read."""
    rows = 0
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=columns):
            out: dict[str, Any] = {}
            for name, col in zip(b.schema.names, b.columns, strict=True):
                if pa.types.is_string(col.type):
                    out[name] = col.to_pylist()
                else:
                    out[name] = torch.from_numpy(col.to_numpy())
            rows += len(out["id"])
    return rows


def loader_loop(loader: Any) -> int:
    rows = 0
    for batch in loader:
        rows += len(batch["id"])
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1024, 8192])
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument(
        "--column-sets", nargs="+", default=list(common.COLUMN_SETS), choices=list(common.COLUMN_SETS)
    )
    p.add_argument(
        "--persistent",
        action="store_true",
        help="loaders with workers keep them (persistent_workers=True, started by a warm-up epoch): "
        "steady-state epochs of a multi-epoch job",
    )
    args = p.parse_args(argv)
    spec = common.spec_from_args(args)
    files = common.ensure_dataset(spec, args.data_dir)
    data_dir = files[0].parent

    results: list[dict[str, Any]] = []
    md_rows = []
    for colset in args.column_sets:
        columns = common.COLUMN_SETS[colset]
        for bs in args.batch_sizes:
            raw = common.Series("raw", {"columns": colset, "batch_size": bs, "num_workers": 0})
            runs: list[tuple[common.Series, Callable[[], int]]] = [
                (raw, lambda c=columns, b=bs: raw_loop(files, c, b))
            ]
            loaders = []
            for w in args.workers:
                loader, _ = create_dataloader(
                    str(data_dir),
                    columns=columns,
                    batch_size=bs,
                    num_workers=w,
                    persistent_workers=args.persistent and w > 0,
                )
                if args.persistent and w > 0:
                    loader_loop(loader)  # warm-up: starts the workers
                s = common.Series("loader", {"columns": colset, "batch_size": bs, "num_workers": w})
                runs.append((s, lambda ld=loader: loader_loop(ld)))
                loaders.append(s)
            common.interleave(runs, args.repeats)
            for s in [raw, *loaders]:
                if s.rows != spec.rows:
                    raise AssertionError(f"{s.name} {s.params} read {s.rows} rows, expected {spec.rows}")
                ratio = raw.median_s / s.median_s
                entry = common.series_json(s)
                entry["ratio_vs_raw"] = ratio
                results.append(entry)
                md_rows.append(
                    [
                        colset,
                        bs,
                        s.name if s is raw else f"loader, num_workers={s.params['num_workers']}",
                        f"{s.median_s:.3f}",
                        f"{s.rows_per_s / 1e6:.2f} M",
                        f"{ratio:.2f}x",
                        f"{min(s.seconds):.3f}-{max(s.seconds):.3f}",
                        f"{s.median_cpu_s:.2f}",
                    ]
                )
                print(md_rows[-1], flush=True)
    info = common.machine()
    payload = {
        "benchmark": "parquet_throughput",
        "command": common.command_line(),
        "dataset": {**spec.__dict__, "path": str(data_dir)},
        "repeats": args.repeats,
        "machine": info,
        "results": results,
    }
    md = (
        f"Dataset: {spec.rows:,} rows, {spec.files} files, row groups of {spec.row_group_size:,} rows; "
        f"{args.repeats} interleaved runs per configuration, medians.\n"
        f"Machine: {info['cpus']} CPUs, {info['processor']}, Python {info['python']}, "
        f"torch {info['torch']}, pyarrow {info['pyarrow']}; load average at start "
        f"{info['loadavg_at_start']}.\n\n"
        + common.table(
            ["columns", "batch_size", "reader", "median s", "rows/s", "vs raw", "range s", "CPU s"], md_rows
        )
    )
    payload["persistent_workers"] = args.persistent
    common.write_results(
        "bench_parquet_persistent" if args.persistent else "bench_parquet", payload, md, args.out_dir
    )
    return payload


if __name__ == "__main__":
    main()
