"""A GPU training loop fed by the loader, against the same loop fed from memory (issue 23).

    python benchmarks/bench_gpu.py --out DIR [--device cuda|cpu] [--rows 8000000]
                                   [--workers 2 4 8] [--epochs 3] [--hidden 2048]
                                   [--budget-s 270]

The scenario: ``--rows`` rows (8M) of 32 float32 features and an int64 label in 16
Parquet files with row groups of 131,072 rows (about 1 GB), read in batches of 8,192
with ``pack_features=FeaturePack(32 columns, key="x")``, persistent workers and
``pin_memory=True``. The step: an MLP 32-2048-2048-2048-1 under bf16 autocast, an SGD
update. Loops, each over ``--epochs`` epochs (``set_epoch`` each):

* ``memory``: the reference, fed from one pinned ``[N, 32]`` tensor (and the labels)
  in memory, copied to the device with ``non_blocking=True``;
* ``pyarrow``: a raw ``ParquetFile.iter_batches`` loop in the training process, the
  features stacked with numpy (what a user writes by hand);
* ``loader``: ``create_dataloader(..., device=DEVICE)`` at each ``--workers``,
  ``shuffle=True`` (row mixing, the default) and ``False``;
* ``loader, loop copies``: the loop of the issue's first measurement, ``pin_memory=True``
  and the loop's own ``.to(device, non_blocking=True)``, at 4 workers, shuffled.

Each loop runs with the step and without it (``no step``: only the batches' arrival on
the device). Reported per loop: the steady-state time per epoch (median of the epochs
after the first), the stall against the memory-fed loop with the step
(``epoch / memory epoch - 1``), rows/s and GB/s into the device, the first batch (first
epoch: workers start; later epochs: persistent workers), and the main process's CPU
seconds per GB delivered (all its threads, epochs after the first).

``--device cpu`` runs the same loops on the CPU (pass a smaller ``--rows`` and
``--hidden``): it is how the script is tested without a GPU. ``--budget-s``: loops that
would start after that many seconds are skipped (and listed), so one invocation has a
bounded time. Results: ``bench_gpu.json`` and ``bench_gpu.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from torch_dataloader_utils import FeaturePack, create_dataloader

HERE = Path(__file__).resolve().parent

FEATURES = [f"f{i:02d}" for i in range(32)]
FILES = 16
ROW_GROUP = 131_072
BATCH = 8192
BYTES_PER_ROW = 4 * len(FEATURES) + 8


def write_data(root: Path, rows: int, seed: int = 0) -> list[Path]:
    """``rows`` rows of 32 float32 features and an int64 label in 16 files (cached in ``root``)."""
    target = root / f"gpu_rows{rows}_files{FILES}_rg{ROW_GROUP}_seed{seed}"
    done = target / "_SUCCESS"
    if done.exists():
        return sorted(target.glob("part-*.parquet"))
    target.mkdir(parents=True, exist_ok=True)
    per = [rows // FILES + (1 if i < rows % FILES else 0) for i in range(FILES)]
    starts = np.cumsum([0, *per[:-1]])

    def one(i: int) -> Path:
        rng = np.random.default_rng((seed, i))
        n = per[i]
        cols: dict[str, Any] = {name: rng.standard_normal(n, dtype=np.float32) for name in FEATURES}
        cols["label"] = np.arange(starts[i], starts[i] + n, dtype=np.int64)  # doubles as a row id
        path = target / f"part-{i:04d}.parquet"
        pq.write_table(pa.table(cols), path, row_group_size=ROW_GROUP, compression="none")
        return path

    with ThreadPoolExecutor(max_workers=min(FILES, os.cpu_count() or 1)) as pool:
        paths = list(pool.map(one, range(FILES)))
    done.write_text("ok\n")
    return paths


def make_model(device: torch.device, hidden: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(len(FEATURES), hidden), torch.nn.ReLU()]
    for _ in range(2):
        layers += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(hidden, 1))
    model = torch.nn.Sequential(*layers).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4)


def make_step(device: torch.device, hidden: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
    model, opt = make_model(device, hidden)

    # bf16 autocast on the GPU; on the CPU it is far slower than float32 (a CPU run only
    # tests the script), so the CPU step runs in float32.
    autocast = device.type == "cuda"

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(x).squeeze(1)
            loss = torch.nn.functional.mse_loss(out.float(), (y % 10).float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main_cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


class Result:
    def __init__(self, name: str, **params: Any) -> None:
        self.name = name
        self.params = params
        self.epochs: list[float] = []
        self.first_batch: list[float] = []
        self.cpu: list[float] = []
        self.rows: list[int] = []

    def steady(self) -> tuple[float, float, float]:
        """Median seconds per epoch, first-batch seconds and CPU seconds of the epochs after the first."""
        later = slice(1, None) if len(self.epochs) > 1 else slice(0, None)
        return (
            statistics.median(self.epochs[later]),
            statistics.median(self.first_batch[later]),
            statistics.median(self.cpu[later]),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": self.params,
            "epoch_s": self.epochs,
            "first_batch_s": self.first_batch,
            "main_cpu_s": self.cpu,
            "rows": self.rows,
        }


def run_epochs(
    result: Result,
    epochs: int,
    batches: Callable[[int], Iterator[tuple[torch.Tensor, torch.Tensor]]],
    step: Callable[[torch.Tensor, torch.Tensor], None] | None,
    device: torch.device,
    rows: int,
) -> Result:
    for epoch in range(epochs):
        sync(device)
        c0, t0 = main_cpu(), time.perf_counter()
        first = None
        n = 0
        for x, y in batches(epoch):
            if first is None:
                first = time.perf_counter() - t0
            if step is not None:
                step(x, y)
            n += len(y)
        sync(device)
        result.epochs.append(time.perf_counter() - t0)
        result.cpu.append(main_cpu() - c0)
        result.first_batch.append(first or 0.0)
        result.rows.append(n)
        if n != rows:
            raise AssertionError(
                f"{result.name} {result.params}: epoch {epoch} gave {n} rows, expected {rows}"
            )
    return result


def memory_batches(files: list[Path], device: torch.device) -> Callable[[int], Iterator[Any]]:
    table = pa.concat_tables(pq.read_table(f) for f in files)
    x = torch.from_numpy(np.stack([table.column(c).to_numpy() for c in FEATURES], axis=1))
    y = torch.from_numpy(table.column("label").to_numpy())
    if device.type == "cuda":
        x, y = x.pin_memory(), y.pin_memory()

    def batches(epoch: int) -> Iterator[Any]:
        for i in range(0, len(y), BATCH):
            yield (
                x[i : i + BATCH].to(device, non_blocking=True),
                y[i : i + BATCH].to(device, non_blocking=True),
            )

    return batches


def pyarrow_batches(files: list[Path], device: torch.device) -> Callable[[int], Iterator[Any]]:
    def batches(epoch: int) -> Iterator[Any]:
        for f in files:
            for b in pq.ParquetFile(f).iter_batches(batch_size=BATCH, columns=[*FEATURES, "label"]):
                x = np.stack([b.column(c).to_numpy() for c in FEATURES], axis=1)
                y = b.column("label").to_numpy()
                yield (
                    torch.from_numpy(x).to(device, non_blocking=True),
                    torch.from_numpy(y.copy()).to(device, non_blocking=True),
                )

    return batches


def loader_batches(
    root: Path, device: torch.device, workers: int, shuffle: bool, loop_copies: bool
) -> tuple[Callable[[int], Iterator[Any]], Any]:
    loader, dataset = create_dataloader(
        str(root),
        columns=[*FEATURES, "label"],
        batch_size=BATCH,
        pack_features=FeaturePack(FEATURES, key="x"),
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=device.type == "cuda",
        shuffle=shuffle,
        **({} if loop_copies else {"device": device}),
    )

    def batches(epoch: int) -> Iterator[Any]:
        dataset.set_epoch(epoch)
        for batch in loader:
            x, y = batch["x"], batch["label"]
            if loop_copies:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            yield x, y

    return batches, loader


def table_rows(results: list[Result], reference: float | None) -> list[list[str]]:
    out = []
    for r in results:
        epoch, first, cpu = r.steady()
        rows = r.rows[-1]
        gb = rows * BYTES_PER_ROW / 1e9
        stall = (
            "-" if reference is None or not r.params.get("step") else f"{100 * (epoch / reference - 1):+.1f}%"
        )
        out.append(
            [
                r.name,
                str(r.params.get("workers", "-")),
                {True: "on", False: "off", None: "-"}[r.params.get("shuffle")],
                "yes" if r.params.get("step") else "no",
                f"{epoch:.3f}",
                stall,
                f"{rows / epoch / 1e6:.2f}M",
                f"{gb / epoch:.2f}",
                f"{r.first_batch[0]:.3f} / {first:.3f}",
                f"{cpu / gb:.3f}",
            ]
        )
    return out


def markdown(results: list[Result], reference: float | None, header: str, skipped: list[str]) -> str:
    cols = [
        "loop",
        "workers",
        "shuffle",
        "step",
        "s/epoch (steady)",
        "stall vs memory",
        "rows/s",
        "GB/s",
        "first batch s (epoch 1 / later)",
        "main CPU s/GB",
    ]
    lines = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results, reference)]
    if skipped:
        lines += ["", "Skipped (time budget): " + "; ".join(skipped)]
    return "\n".join(lines) + "\n"


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "loadavg": os.getloadavg(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="directory for bench_gpu.json / .md")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rows", type=int, default=8_000_000)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--epochs", type=int, default=3, help="epochs per loop; the first is not steady")
    p.add_argument("--hidden", type=int, default=2048, help="MLP width (smaller for CPU runs)")
    p.add_argument("--data-dir", type=Path, default=HERE / ".data")
    p.add_argument("--budget-s", type=float, default=270.0, help="skip loops starting after this")
    p.add_argument("--skip-pyarrow", action="store_true")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    began = time.perf_counter()
    files = write_data(args.data_dir, args.rows)
    written = time.perf_counter() - began
    root = files[0].parent
    rows = args.rows
    print(f"data: {rows:,} rows in {len(files)} files ({written:.1f} s); device {device}", flush=True)
    step = make_step(device, args.hidden)
    results: list[Result] = []
    skipped: list[str] = []

    def over_budget(name: str) -> bool:
        if time.perf_counter() - began > args.budget_s:
            skipped.append(name)
            print(f"skipped (budget): {name}", flush=True)
            return True
        return False

    def report(r: Result) -> None:
        epoch, first, cpu = r.steady()
        print(
            f"{r.name} {r.params}: {epoch:.3f} s/epoch steady, epochs {[round(e, 3) for e in r.epochs]}, "
            f"first batch {r.first_batch[0]:.3f}/{first:.3f} s, main CPU {cpu:.2f} s "
            f"({time.perf_counter() - began:.0f} s elapsed)",
            flush=True,
        )

    # Warm-up: the model's kernels and autocast, outside every timed loop.
    feed = memory_batches(files, device)
    for i, (x, y) in enumerate(feed(0)):
        step(x, y)
        if i == 3:
            break
    sync(device)
    reference = None
    for with_step in (True, False):
        r = run_epochs(
            Result("memory", step=with_step), args.epochs, feed, step if with_step else None, device, rows
        )
        report(r)
        results.append(r)
        if with_step:
            reference = r.steady()[0]
    del feed
    if not args.skip_pyarrow and not over_budget("pyarrow"):
        r = run_epochs(
            Result("pyarrow", step=True),
            min(args.epochs, 2),
            pyarrow_batches(files, device),
            step,
            device,
            rows,
        )
        report(r)
        results.append(r)
    configs = [
        (w, shuffle, with_step, False)
        for with_step in (True, False)
        for w in args.workers
        for shuffle in (True, False)
    ]
    configs.append((4 if 4 in args.workers else args.workers[0], True, True, True))
    for workers, shuffle, with_step, loop_copies in configs:
        name = "loader, loop copies" if loop_copies else "loader"
        label = f"{name} nw={workers} shuffle={shuffle} step={with_step}"
        if over_budget(label):
            continue
        batches, loader = loader_batches(root, device, workers, shuffle, loop_copies)
        r = Result(name, workers=workers, shuffle=shuffle, step=with_step)
        run_epochs(r, args.epochs, batches, step if with_step else None, device, rows)
        del loader, batches
        report(r)
        results.append(r)
    precision = "bf16 autocast" if device.type == "cuda" else "float32"
    header = (
        f"{rows:,} rows x 32 float32 + int64 label, {FILES} files, row groups of {ROW_GROUP:,}, "
        f"batch {BATCH}, MLP 32-{args.hidden}x3-1 {precision} + SGD, {args.epochs} epochs per loop "
        f"(steady: after the first), device {device}"
    )
    info = machine(device)
    header += (
        f"; {info.get('gpu', 'no GPU')}, {info['cpus']} CPUs, torch {info['torch']}, "
        f"pyarrow {info['pyarrow']}, load {info['loadavg']}"
    )
    md = markdown(results, reference, header, skipped)
    payload = {
        "benchmark": "bench_gpu",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": info,
        "rows": rows,
        "reference_epoch_s": reference,
        "results": [r.as_dict() for r in results],
        "skipped": skipped,
        "wall_s": time.perf_counter() - began,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_gpu.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    (args.out / "bench_gpu.md").write_text(md)
    print(md, flush=True)
    return payload


if __name__ == "__main__":
    main()
