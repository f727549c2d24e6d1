"""``simulate`` against real runs: predicted vs measured epoch and time to first batch.

Every request to the data goes through the latency file system of ``testsupport``
(``latency://``: each request sleeps ``delay`` seconds first, as a round trip to an
object store would). For each latency (0, 10, 50 ms by default) and worker count, the
real loader reads one epoch (median of ``--repeats`` interleaved runs: time to the first
batch from ``iter()``, and the whole epoch), and ``simulate`` predicts both from the
same plan, the same latency, and a decode rate it measures on one chunk itself — no
figure of the real run is fed to the model. The check: the predicted epoch within 25%
of the measured one.

Run: ``python benchmarks/bench_simulate.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fsspec
import testsupport.latency_fs  # noqa: F401  (registers latency://)

import common
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.config import DEFAULT_READ_AHEAD_BYTES
from torch_dataloader_utils.io.prefetch import MAX_PART_BYTES
from torch_dataloader_utils.tools.simulate import SimulateRequest, StorageModel, run_simulation
from torch_dataloader_utils.tools.source import Source

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

TOLERANCE = 0.25


def measure(url: str, options: dict[str, Any], workers: int) -> tuple[float, float, int]:
    """One real epoch: ``(time to first batch, epoch seconds, rows)`` from ``iter()``."""
    loader, _ = create_dataloader(url, num_workers=workers, **options)
    t0 = time.perf_counter()
    first = None
    rows = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        rows += len(batch["id"])
    return first or 0.0, time.perf_counter() - t0, rows


def request_bandwidth(files: Sequence[Path], part: int = MAX_PART_BYTES) -> float:
    """Bytes per second of ranged requests of ``part`` bytes through ``latency://`` (no delay).

    Part of the storage model given to ``simulate``, measured on the store alone (as a
    user would measure an object store), not on the loader: every file read in parts,
    the parts kept in fresh buffers up to the read-ahead bound, as the fetcher keeps them
    (so the cost of new memory is in the figure, as it is in a real pass).
    """
    fs = fsspec.filesystem("latency", delay=0.0)
    total = 0
    kept: list[bytes] = []
    held = 0
    began = time.perf_counter()
    for f in files:
        size = f.stat().st_size
        for lo in range(0, size, part):
            data = fs.cat_file(str(f), start=lo, end=min(size, lo + part))
            total += len(data)
            kept.append(data)
            held += len(data)
            if held > DEFAULT_READ_AHEAD_BYTES:
                kept, held = [], 0
    return total / (time.perf_counter() - began)


def _spin(seconds: float) -> float:
    end = time.perf_counter() + seconds
    c0 = time.process_time()
    while time.perf_counter() < end:
        pass
    return time.process_time() - c0


def available_cores(cpus: int, seconds: float = 0.5) -> float:
    """Cores this job gets now: ``cpus`` processes spin for ``seconds``; their CPU time / wall.

    On a shared machine other jobs take part of the cores; ``simulate`` is told what is
    left (``--cores-per-rank``), as a user tells it what a rank gets.
    """
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(cpus) as pool:
        return float(sum(pool.map(_spin, [seconds] * cpus)) / seconds)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = common.base_parser(__doc__.splitlines()[0])
    p.set_defaults(rows=4_800_000, files=12, row_group_size=100_000, repeats=3)
    p.add_argument("--latencies-ms", type=float, nargs="+", default=[0.0, 10.0, 50.0])
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--split-rows", type=int, default=200_000, help="rows per chunk")
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument(
        "--cores-per-rank",
        type=float,
        default=None,
        help="cores given to simulate (default: measured around each latency's runs, as the "
        "cores this job gets on a shared machine)",
    )
    args = p.parse_args(argv)
    spec = common.spec_from_args(args)
    if args.quick:
        args.latencies_ms = args.latencies_ms[:2]
    files = common.ensure_dataset(spec, args.data_dir)
    root = files[0].parent
    cpus = len(os.sched_getaffinity(0))
    load = os.getloadavg()
    bandwidth = statistics.median(request_bandwidth(files) for _ in range(3))
    rows_md, results = [], []
    for latency_ms in args.latencies_ms:
        key = uuid.uuid4().hex
        options: dict[str, Any] = {
            "columns": common.NUMERIC_COLUMNS,
            "batch_size": args.batch_size,
            "split_rows": args.split_rows,
            "storage_options": {"delay": latency_ms / 1000, "stats_key": key},
        }
        url = f"latency://{root}"
        measured: dict[int, list[tuple[float, float]]] = {w: [] for w in args.workers}
        for w in args.workers:  # warm-up: page cache, imports
            measure(url, options, w)
        cores_seen = [available_cores(cpus)]
        for _ in range(args.repeats):
            for w in args.workers:
                first, epoch, rows = measure(url, options, w)
                if rows != spec.rows:
                    raise AssertionError(f"read {rows} rows, expected {spec.rows}")
                measured[w].append((first, epoch))
            cores_seen.append(available_cores(cpus))
        cores = args.cores_per_rank or min(float(cpus), statistics.median(cores_seen))
        for w in args.workers:
            request = SimulateRequest(
                source=Source(path=url, options=options),
                num_workers=w,
                # The store is local files: receiving its bytes is copying, on the same cores.
                storage=StorageModel(
                    latency_sec=latency_ms / 1000, bandwidth=bandwidth, receive_rate=bandwidth
                ),
                cores_per_rank=cores,
            )
            _, sim = run_simulation(request)
            first = statistics.median(m[0] for m in measured[w])
            epoch = statistics.median(m[1] for m in measured[w])
            error = sim.epoch_sec / epoch - 1
            entry = {
                "latency_ms": latency_ms,
                "num_workers": w,
                "measured_first_batch_s": first,
                "measured_epoch_s": epoch,
                "measured_epochs_s": [m[1] for m in measured[w]],
                "predicted_first_batch_s": sim.first_batch_sec,
                "predicted_epoch_s": sim.epoch_sec,
                "epoch_error": error,
                "within_tolerance": abs(error) <= TOLERANCE,
                "decode_rows_per_s": sim.decode.rows_per_sec,
                "decode_cores_used": sim.decode.cores_used,
                "batch_sec": sim.decode.batch_sec,
                "worker_start_sec": sim.worker_start_sec,
                "footer_sec": sim.decode.footer_sec,
                "cores_per_rank": cores,
                "cores_seen": cores_seen,
            }
            results.append(entry)
            rows_md.append(
                [
                    f"{latency_ms:g}",
                    w,
                    f"{cores:.2f}",
                    f"{first:.3f}",
                    f"{sim.first_batch_sec:.3f}",
                    f"{epoch:.2f}",
                    f"{sim.epoch_sec:.2f}",
                    f"{100 * error:+.0f}%",
                    "yes" if abs(error) <= TOLERANCE else "NO",
                ]
            )
            print(rows_md[-1], flush=True)
    info = common.machine()
    md = (
        f"Dataset: {spec.rows:,} rows, {spec.files} files, row groups of {spec.row_group_size:,} rows, "
        f"chunks of {args.split_rows:,} rows, numeric columns, batch_size {args.batch_size}; every "
        f"request through `latency://`. Measured: median of {args.repeats} interleaved epochs. "
        f"Predicted: `simulate` with the same latency, the store's bandwidth per request "
        f"({bandwidth / 2**20:,.0f} MiB/s, measured on the store alone) and the cores this job got "
        f"(of {cpus}: other jobs share the machine; measured by spinning {cpus} processes around the runs); "
        "it measures its own decode rate (on one chunk), per-batch cost and worker start-up. "
        f"Machine: {info['cpus']} CPUs, load average {tuple(round(x, 2) for x in load)} at start.\n\n"
        + common.table(
            [
                "latency ms",
                "num_workers",
                "cores available",
                "first batch s (measured)",
                "first batch s (predicted)",
                "epoch s (measured)",
                "epoch s (predicted)",
                "epoch error",
                f"within {TOLERANCE:.0%}",
            ],
            rows_md,
        )
    )
    payload = {
        "benchmark": "simulate_vs_real",
        "command": common.command_line(),
        "dataset": {**spec.__dict__, "path": str(root)},
        "machine": info,
        "loadavg": load,
        "request_bandwidth": bandwidth,
        "results": results,
    }
    common.write_results("bench_simulate", payload, md, args.out_dir)
    return payload


if __name__ == "__main__":
    main()
