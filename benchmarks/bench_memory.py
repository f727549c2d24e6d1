"""Peak memory: the loader against the raw pyarrow loop, each in a fresh process.

Each configuration runs in its own Python process (so high-water marks do not mix);
it reports the peak RSS of that process above its RSS just before the loop (after
importing torch and pyarrow and building the dataset; the peak is reset there with
``/proc/self/clear_refs``), and for ``num_workers > 0`` the
peak RSS of the largest worker. Repeated runs are interleaved; medians are reported.

Run: ``python benchmarks/bench_memory.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import common  # noqa: E402

_rss_mib, _reset_peak, _peak_mib = common.rss_mib, common.reset_peak, common.peak_mib


def child(kind: str, data_dir: str, colset: str, batch_size: int, workers: int) -> None:
    """Run one loop in this process and print a JSON line with the memory figures."""
    import warnings

    import bench_parquet

    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    columns = common.COLUMN_SETS[colset]
    files = sorted(Path(data_dir).glob("part-*.parquet"))
    loader = None
    if kind == "loader":
        from torch_dataloader_utils import create_dataloader

        loader, _ = create_dataloader(data_dir, columns=columns, batch_size=batch_size, num_workers=workers)
    base = _rss_mib()
    _reset_peak()
    if loader is None:
        rows = bench_parquet.raw_loop(files, columns, batch_size)
    else:
        rows = bench_parquet.loader_loop(loader)
    peak = _peak_mib()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"rows": rows, "base_mib": base, "peak_mib": peak, "worker_peak_mib": kids}))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument("--child", nargs=5, metavar=("KIND", "DIR", "COLS", "BS", "WORKERS"), help=argparse_hide())
    args = p.parse_args(argv)
    if args.child:
        kind, data_dir, colset, bs, workers = args.child
        child(kind, data_dir, colset, int(bs), int(workers))
        return {}
    spec = common.spec_from_args(args)
    files = common.ensure_dataset(spec, args.data_dir)
    data_dir = str(files[0].parent)
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
    configs = [("raw", 0), ("loader", 0), ("loader", 2)]
    samples: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for _ in range(args.repeats):
        for colset in common.COLUMN_SETS:
            for kind, workers in configs:
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    kind,
                    data_dir,
                    colset,
                    str(args.batch_size),
                    str(workers),
                ]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True)
                samples.setdefault((colset, kind, workers), []).append(
                    json.loads(out.stdout.splitlines()[-1])
                )
    results = []
    md_rows = []
    for (colset, kind, workers), runs in samples.items():
        growth = statistics.median(r["peak_mib"] - r["base_mib"] for r in runs)
        worker_peak = statistics.median(r["worker_peak_mib"] for r in runs)
        base = statistics.median(r["base_mib"] for r in runs)
        results.append(
            {
                "columns": colset,
                "reader": kind,
                "num_workers": workers,
                "main_growth_mib": growth,
                "worker_peak_mib": worker_peak,
                "runs": runs,
            }
        )
        label = "raw" if kind == "raw" else f"loader, num_workers={workers}"
        md_rows.append(
            [colset, label, f"{base:.0f}", f"{growth:.0f}", f"{worker_peak:.0f}" if workers else "-"]
        )
    info = common.machine()
    payload = {
        "benchmark": "memory",
        "command": common.command_line(),
        "dataset": {**spec.__dict__, "path": data_dir},
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "machine": info,
        "results": results,
    }
    md = (
        f"Dataset: {spec.rows:,} rows, {spec.files} files; batch_size {args.batch_size}; "
        f"median of {args.repeats} runs, each in a fresh process. A forked worker starts "
        "with the main process's pages (about its RSS before the loop), so its peak "
        "includes them.\n\n"
        + common.table(
            [
                "columns",
                "reader",
                "main RSS before the loop (MiB)",
                "main peak RSS growth (MiB)",
                "largest worker peak RSS (MiB)",
            ],
            md_rows,
        )
    )
    common.write_results("bench_memory", payload, md, args.out_dir)
    return payload


def argparse_hide() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
