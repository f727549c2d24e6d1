"""Training-loop overlap: does the loader hide its work behind a training step?

A training loop is simulated by a GIL-free ``time.sleep`` per batch, sized so the step
takes ``--step-factor`` (default 1.3) times the single-process read time of a batch.
The same loop runs

* fed from memory (every batch already in a list): the floor, no loading at all;
* fed by ``create_dataloader(num_workers=2)`` (new workers every epoch, and with
  ``persistent_workers=True``), ``shuffle=False`` and ``shuffle=True`` (row mixing),
* with ``--in-process``, also fed by ``create_dataloader(num_workers=0)``,

over ``--epochs`` epochs (``set_epoch`` each). Reported: wall time over the memory-fed
loop (target: within 3 %), and the latency from ``iter(loader)`` to the first batch
(epoch 0, and later epochs). A second table measures the first-batch latency on a
dataset with a ``list<int32>`` and a string column (``--ragged-rows`` rows).

Runs are interleaved (memory, loaders, memory, ...) and the tables give medians.

Run: ``python benchmarks/bench_overlap.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import common
from torch_dataloader_utils import create_dataloader

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def read_seconds(data: Path, columns: list[str], batch_size: int) -> tuple[float, int]:
    """Single-process read of one epoch (the loader with ``num_workers=0``): seconds, batches."""
    loader, _ = create_dataloader(str(data), columns=columns, batch_size=batch_size, num_workers=0)
    start = time.perf_counter()
    batches = sum(1 for _ in loader)
    return time.perf_counter() - start, batches


def memory_loop(batches: list[Any], epochs: int, step: float) -> float:
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in batches:
            _ = batch["id"][0]
            time.sleep(step)
    return time.perf_counter() - start


def loader_loop(loader: Any, dataset: Any, epochs: int, step: float) -> tuple[float, list[float], int]:
    """Wall seconds of the loop, first-batch latency per epoch, rows seen."""
    firsts = []
    rows = 0
    start = time.perf_counter()
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        began = time.perf_counter()
        for i, batch in enumerate(loader):
            if i == 0:
                firsts.append(time.perf_counter() - began)
            rows += len(batch["id"])
            time.sleep(step)
    return time.perf_counter() - start, firsts, rows


class RawShards(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The raw pyarrow loop inside DataLoader workers (worker ``k`` reads files ``k::n``).

    No library code: what any loader built on ``torch.utils.data`` worker processes pays
    on this machine, the floor the library's loaders are compared with.
    """

    def __init__(self, files: Sequence[Path], columns: list[str], batch_size: int) -> None:
        self.files, self.columns, self.batch_size = list(files), columns, batch_size

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        for f in self.files[k::n]:
            for b in pq.ParquetFile(f).iter_batches(batch_size=self.batch_size, columns=self.columns):
                yield {name: torch.from_numpy(b.column(i).to_numpy()) for i, name in enumerate(self.columns)}


class EmptyBatches(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """``batches`` tiny batches split over the workers, no loading work at all: what a torch
    DataLoader with worker processes costs by itself (one queue hop per batch)."""

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        batch = {"id": torch.zeros(1)}
        for _ in range(k, self.batches, n):
            yield batch


class _RawDataset:
    """``set_epoch`` for the raw loaders' loop (they do not shuffle)."""

    def set_epoch(self, epoch: int) -> None:
        pass


def ragged_dataset(root: Path, rows: int, files: int = 4) -> Path:
    """``rows`` rows: ``id``, a ``list<int32>`` of 0-64 token ids, a string of 8-40 characters."""
    target = root / f"ragged_rows{rows}_files{files}"
    if (target / "_SUCCESS").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = rows // files
    for i in range(files):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        lengths = rng.integers(0, 65, per)
        offsets = np.zeros(per + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        tokens = pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32))
        )
        text = pa.array([f"text-{j}-{'x' * (j % 33)}" for j in ids])
        pq.write_table(pa.table({"id": ids, "tokens": tokens, "text": text}), target / f"part-{i}.parquet")
    (target / "_SUCCESS").write_text("ok\n")
    return target


def first_batch(path: Path, workers: int, batch_size: int, shuffle: bool) -> float:
    loader, _ = create_dataloader(str(path), batch_size=batch_size, num_workers=workers, shuffle=shuffle)
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    elapsed = time.perf_counter() - start
    del it
    return elapsed


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = common.base_parser(__doc__.splitlines()[0])
    p.set_defaults(rows=2_000_000, repeats=3)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-factor", type=float, default=1.3, help="step time / single-process read time")
    p.add_argument("--step-ms", type=float, default=None, help="a fixed step time instead of --step-factor")
    p.add_argument("--column-set", default="numeric", choices=list(common.COLUMN_SETS))
    p.add_argument("--ragged-rows", type=int, default=500_000)
    p.add_argument("--skip-ragged", action="store_true")
    p.add_argument(
        "--raw-workers",
        action="store_true",
        help="also run the raw pyarrow loop in DataLoader workers (no library code, numeric "
        "columns only) and a DataLoader whose workers yield tiny premade batches (no loading "
        "at all): the floors of any worker-process loader on this machine",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="also run the loop with num_workers=0 (the loop's own process reads; with a CPU "
        "to spare, batches are decoded ahead by a thread while the step runs)",
    )
    args = p.parse_args(argv)
    spec = common.spec_from_args(args)
    files = common.ensure_dataset(spec, args.data_dir)
    data = files[0].parent
    columns = common.COLUMN_SETS[args.column_set]
    bs = args.batch_size

    read_s = statistics.median(read_seconds(data, columns, bs)[0] for _ in range(3))
    _, n_batches = read_seconds(data, columns, bs)
    step = args.step_factor * read_s / n_batches if args.step_ms is None else args.step_ms / 1e3
    memory, _ = create_dataloader(str(data), columns=columns, batch_size=bs, num_workers=0)
    batches = [{k: v.clone() if hasattr(v, "clone") else list(v) for k, v in b.items()} for b in memory]

    variants: dict[str, dict[str, Any]] = {
        "new workers, shuffle=False": {"persistent_workers": False, "shuffle": False},
        "new workers, shuffle=True": {"persistent_workers": False, "shuffle": True},
        "persistent, shuffle=False": {"persistent_workers": True, "shuffle": False},
        "persistent, shuffle=True": {"persistent_workers": True, "shuffle": True},
    }
    if args.in_process:  # the loop's own process reads (batches decoded ahead in a thread)
        variants["num_workers=0, shuffle=False"] = {"num_workers": 0, "shuffle": False}
        variants["num_workers=0, shuffle=True"] = {"num_workers": 0, "shuffle": True}
    loaders: dict[str, tuple[Any, Any]] = {}
    for name, opts in variants.items():
        opts = {"num_workers": args.workers, **opts}
        loaders[name] = create_dataloader(str(data), columns=columns, batch_size=bs, **opts)
    if args.raw_workers:  # the floor: no library code, numeric columns only
        for persistent in (False, True):
            name = f"raw in DataLoader workers, {'persistent' if persistent else 'new workers'}"
            variants[name] = {}
            raw = torch.utils.data.DataLoader(
                RawShards(files, columns, bs),
                batch_size=None,
                num_workers=args.workers,
                persistent_workers=persistent,
            )
            loaders[name] = (raw, _RawDataset())
        name = "empty batches in DataLoader workers, persistent"
        variants[name] = {}
        empty = torch.utils.data.DataLoader(
            EmptyBatches(n_batches), batch_size=None, num_workers=args.workers, persistent_workers=True
        )
        loaders[name] = (empty, _RawDataset())
    walls: dict[str, list[float]] = {"memory": [], **{name: [] for name in variants}}
    firsts: dict[str, list[float]] = {name: [] for name in variants}
    later: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        walls["memory"].append(memory_loop(batches, args.epochs, step))
        for name, (loader, dataset) in loaders.items():
            wall, first, rows = loader_loop(loader, dataset, args.epochs, step)
            assert rows == spec.rows * args.epochs or name.startswith("empty"), (name, rows)
            walls[name].append(wall)
            firsts[name].append(first[0])
            later[name].extend(first[1:])
    load = os.getloadavg()
    base = statistics.median(walls["memory"])
    lines = [
        f"rows={spec.rows} files={spec.files} batch_size={bs} batches/epoch={n_batches} epochs={args.epochs} "
        f"num_workers={args.workers} repeats={args.repeats}",
        f"single-process read: {read_s:.3f} s/epoch ({read_s / n_batches * 1e3:.2f} ms/batch); "
        f"step: {step * 1e3:.2f} ms ({step * n_batches / read_s:.2f}x); "
        f"loadavg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "",
    ]
    md = (
        "\n".join(lines)
        + "\n"
        + common.table(
            [
                "loop",
                "median wall s",
                "vs memory",
                "first batch, epoch 0 (ms)",
                "first batch, later epochs (ms)",
            ],
            [["fed from memory", f"{base:.3f}", "1.000x", "-", "-"]]
            + [
                [
                    name,
                    f"{statistics.median(walls[name]):.3f}",
                    f"{statistics.median(walls[name]) / base:.3f}x",
                    f"{statistics.median(firsts[name]) * 1e3:.0f}",
                    f"{statistics.median(later[name]) * 1e3:.0f}" if later[name] else "-",
                ]
                for name in variants
            ],
        )
    )
    ragged: dict[str, list[float]] = {}
    if not args.skip_ragged:
        rpath = ragged_dataset(args.data_dir, 50_000 if args.quick else args.ragged_rows)
        cases = [(w, s) for w in (0, args.workers) for s in (False, True)]
        for _ in range(args.repeats):
            for w, s in cases:
                ragged.setdefault(f"num_workers={w}, shuffle={s}", []).append(first_batch(rpath, w, bs, s))
        md += "\n" + common.table(
            ["list<int32> + string dataset", "first batch after iter() (ms, median)"],
            [[k, f"{statistics.median(v) * 1e3:.0f}"] for k, v in ragged.items()],
        )
    payload = {
        "machine": common.machine(),
        "command": common.command_line(),
        "step_s": step,
        "read_s": read_s,
        "walls": walls,
        "first_batch": firsts,
        "first_batch_later": later,
        "ragged_first_batch": ragged,
    }
    common.write_results("bench_overlap", payload, md, args.out_dir)
    return payload


if __name__ == "__main__":
    main()
