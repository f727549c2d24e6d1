"""The cost of the metrics per batch, measured directly, against the loader's time per batch.

``bench_compare.py --base <rev>`` measures the loader before and after the metrics, but on
a busy machine its noise (several %) can exceed a 2% budget. This measures the added
work itself, in CPU time, in one process: what the main process does more per batch
(timing the loop around ``next()``: :func:`stall_clock`) and what a reading process does
more per batch (clock reads around reading and converting, in ``emit.grouped`` and the
main-process path) and per group (the work delta, added in the main process) — and
divides by the loader's own time per batch measured in the same run (medians).

Run: ``python benchmarks/bench_metrics_overhead.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import pyarrow.parquet as pq

import common
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.config import ProgressConfig
from torch_dataloader_utils.io.prefetch import column_ranges
from torch_dataloader_utils.runtime.metrics import MetricsRecorder, stall_clock
from torch_dataloader_utils.runtime.workstats import WorkStats

ITEMS = 200_000


def cpu_per_item(fn: Callable[[], int], repeats: int) -> float:
    """Median CPU seconds per item of ``fn`` (which returns its item count)."""
    out = []
    for _ in range(repeats):
        c0 = time.process_time()
        n = fn()
        out.append((time.process_time() - c0) / n)
    return statistics.median(out)


def bare() -> int:
    n = 0
    for _ in iter(range(ITEMS)):
        n += 1
    return n


def clocked() -> int:
    recorder = MetricsRecorder(ProgressConfig())
    n = 0
    for _ in stall_clock(iter(range(ITEMS)), recorder):
        n += 1
    return n


def worker_timers() -> int:
    """The clock reads and sums a reading process adds per batch, plus a delta every 64 batches."""
    work = WorkStats(object(), 1)
    recorder = MetricsRecorder(ProgressConfig())
    clock = time.perf_counter
    asked = clock()
    for i in range(ITEMS):
        got = clock()
        work.read_sec += got - asked
        work.count_padding(None)  # type: ignore[arg-type]
        asked = clock()
        work.convert_sec += asked - got
        if i % 64 == 63:
            began = clock()
            work.transfer_sec += clock() - began
            recorder.add_work(0, work.delta())
            asked = clock()
    return ITEMS


def bare_worker() -> int:
    n = 0
    for _ in range(ITEMS):
        n += 1
    return n


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=1024, help="the loader's batch size (small: worst case)")
    args = p.parse_args(argv)
    spec = common.spec_from_args(args)
    files = common.ensure_dataset(spec, args.data_dir)
    main_cost = cpu_per_item(clocked, args.repeats) - cpu_per_item(bare, args.repeats)
    worker_cost = cpu_per_item(worker_timers, args.repeats) - cpu_per_item(bare_worker, args.repeats)
    loader, dataset = create_dataloader(
        str(files[0].parent), columns=common.NUMERIC_COLUMNS, batch_size=args.batch_size, num_workers=0
    )
    per_batch = []
    for _ in range(args.repeats):
        c0 = time.process_time()
        batches = sum(1 for _ in loader)
        per_batch.append((time.process_time() - c0) / batches)
    batch_cpu = statistics.median(per_batch)
    # Local Parquet: the bytes of each chunk are counted from its footer (column ranges).
    chunks = dataset.plan(0).all_chunks()
    metadata = {c.path: pq.read_metadata(c.path) for c in chunks}
    by_path = {f.path: f for f in dataset.files}

    def count_bytes() -> int:
        for c in chunks:
            groups = by_path[c.path].groups_in(c.start, c.stop)
            column_ranges(metadata[c.path], [g.index for g in groups], common.NUMERIC_COLUMNS)
        return len(chunks)

    ranges_cost = cpu_per_item(count_bytes, args.repeats) * len(chunks) / batches
    share = (main_cost + worker_cost + ranges_cost) / batch_cpu
    info = common.machine()
    rows = [
        ["main process: timing the loop around next()", f"{main_cost * 1e6:.2f}"],
        ["reading process: clock reads per batch, a work delta per 64 batches", f"{worker_cost * 1e6:.2f}"],
        ["local Parquet: bytes of each chunk from its footer (per batch)", f"{ranges_cost * 1e6:.2f}"],
        [
            f"the loader's own CPU time per batch (batch_size {args.batch_size}, numeric, num_workers=0)",
            f"{batch_cpu * 1e6:.1f}",
        ],
        ["**added share**", f"**{100 * share:.2f}%**"],
    ]
    md = (
        f"CPU microseconds per batch, medians of {args.repeats} runs of {ITEMS:,} items; loader over "
        f"{spec.rows:,} rows. Machine: {info['cpus']} CPUs, load average {info['loadavg_at_start']}.\n\n"
        + common.table(["what", "µs per batch"], rows)
    )
    payload = {
        "benchmark": "metrics_overhead",
        "command": common.command_line(),
        "machine": info,
        "main_process_us": main_cost * 1e6,
        "reading_process_us": worker_cost * 1e6,
        "byte_counting_us": ranges_cost * 1e6,
        "loader_batch_cpu_us": batch_cpu * 1e6,
        "added_share": share,
    }
    common.write_results("bench_metrics_overhead", payload, md, args.out_dir)
    return payload


if __name__ == "__main__":
    main()
