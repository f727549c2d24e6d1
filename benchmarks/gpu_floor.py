"""The no-library floor of the GPU scenario (issue 23): torch's own DataLoader, no Parquet.

Workers of a plain ``torch.utils.data.DataLoader`` hand over premade ``[8192, 32]`` float32
batches and their int64 labels (slices of tensors built in memory before the workers start,
copied once per batch as a real loader's output is), with ``pin_memory=True`` and persistent
workers; the loop copies each batch with ``non_blocking=True`` and runs bench_gpu's training
step. No decoding, no shuffle, no library: what is left is torch's hand-off between
processes, its pin thread, and the GIL they share with the loop. Its stall against the
memory-fed loop, measured in the same run, is the floor for bench_gpu's ``loader`` rows.

    PYTHONPATH=src:. python benchmarks/gpu_floor.py --device cuda
    PYTHONPATH=src:. python benchmarks/gpu_floor.py --device cpu --rows 200000 --hidden 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
from benchmarks.bench_gpu import BATCH, make_step, sync
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

FEATURES = 32


class Premade(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Batches sliced from tensors in memory, dealt round robin over the workers."""

    def __init__(self, rows: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(rows, FEATURES, generator=gen)
        self.y = torch.randint(0, 1000, (rows,), generator=gen)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        starts = range(0, len(self.y), BATCH)
        for k, i in enumerate(starts):
            if k % workers == worker:
                yield self.x[i : i + BATCH].clone(), self.y[i : i + BATCH].clone()


def epochs_of(batches: Any, step: Any, device: torch.device, epochs: int, rows: int) -> list[float]:
    times = []
    for _ in range(epochs):
        sync(device)
        t0 = time.perf_counter()
        n = 0
        for x, y in batches():
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            step(x, y)
            n += len(y)
        sync(device)
        times.append(time.perf_counter() - t0)
        if n != rows:
            raise AssertionError(f"{n} rows, expected {rows}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=8_000_000)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-step", action="store_true", help="no training step: rows/s into the device")
    args = parser.parse_args()
    device = torch.device(args.device)
    step = make_step(device, args.hidden)
    if args.no_step:

        def step(x: torch.Tensor, y: torch.Tensor) -> None:
            pass

    data = Premade(args.rows)
    x, y = data.x, data.y
    if device.type == "cuda":
        x, y = x.pin_memory(), y.pin_memory()

    def memory() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(0, len(y), BATCH):
            yield x[i : i + BATCH], y[i : i + BATCH]

    out: dict[str, Any] = {}
    ref = epochs_of(memory, step, device, args.epochs, args.rows)
    out["memory"] = statistics.median(ref[1:])
    for nw in args.workers:
        loader = DataLoader(
            data, batch_size=None, num_workers=nw, pin_memory=device.type == "cuda", persistent_workers=True
        )
        times = epochs_of(loader.__iter__, step, device, args.epochs, args.rows)
        out[f"torch DataLoader nw={nw}"] = statistics.median(times[1:])
    ref2 = epochs_of(memory, step, device, args.epochs, args.rows)  # the reference again, after
    out["memory (again)"] = statistics.median(ref2[1:])
    base = min(out["memory"], out["memory (again)"])
    print(f"{args.rows:,} rows, batch {BATCH}, hidden {args.hidden}, device {device}")
    gb = args.rows * (FEATURES * 4 + 8) / 1e9
    print("| loop | s/epoch (steady, median) | stall vs memory | GB/s |")
    print("|---|---|---|---|")
    for name, s in out.items():
        print(f"| {name} | {s:.3f} | {100 * (s / base - 1):+.1f}% | {gb / s:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
