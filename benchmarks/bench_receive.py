"""The main process's CPU per GB received from workers, at 1 and 64 columns (issue 23).

    python benchmarks/bench_receive.py [--mb 256] [--workers 2] [--repeats 3] [--out DIR]

Each configuration reads Parquet files of float32 columns with ``num_workers`` persistent
workers and a loop that does nothing with the batches; the figure is the CPU time of the
main process (all its threads: receiving, building the batches, the loop), from
``getrusage(RUSAGE_SELF)``, per GB delivered and per batch, medians of ``--repeats``
epochs after a warm-up epoch. The workers' CPU is not in it.

Configurations (about ``--mb`` MB each):

* 64 columns, batch 8,192 (2 MiB per batch);
* 1 column, batch 8,192 (32 KiB per batch): the per-batch cost with one column;
* 1 column, batch 524,288 (2 MiB per batch): per GB at the 64-column batch's size.

The main process also has a fixed cost per epoch (planning the epoch, restarting the
persistent workers' iterators): ``fixed ms/epoch`` is measured on the same loader
settings over a dataset of one batch per file, and ``us/batch beyond`` is the rest
divided by the batches, the cost that grows with the data.

The floors, in the same run: torch's own DataLoader with the same workers handing over
premade batches of the same shapes (a dict of tensors; torch's default transfer) and
loading nothing; the same DataLoader handing over premade groups of batches of about
``GROUP_BYTES`` as one ``[batches, columns, rows]`` block each, which the main process
cuts into a dict of column tensors per batch (one ``unbind``): the least a loop fed
one tensor per column can cost with torch's worker machinery; and the same DataLoader
handing over one int per item: what torch's
worker machinery costs the main process per hand-off by itself (the library sends a
group of batches, about ``GROUP_BYTES`` (32 MiB), per hand-off; its s/GB column is that
cost per ``GROUP_BYTES``).

The loop does constant work per batch (it counts a batch's bytes from one column's
rows), so the figures are the loader's, not the loop's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.runtime.emit import GROUP_BYTES

HERE = Path(__file__).resolve().parent

FILES = 8


def main_cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def write(root: Path, columns: int, rows: int) -> Path:
    target = root / f"receive_c{columns}_r{rows}"
    if (target / "_SUCCESS").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    per = rows // FILES
    rng = np.random.default_rng(0)
    for i in range(FILES):
        table = pa.table({f"c{c}": rng.standard_normal(per, dtype=np.float32) for c in range(columns)})
        pq.write_table(
            table, target / f"part-{i}.parquet", row_group_size=min(per, 1 << 20), compression="none"
        )
    (target / "_SUCCESS").write_text("ok\n")
    return target


class Ints(IterableDataset[int]):
    """Each worker yields its share of ``items`` ints: torch's per-hand-off cost alone."""

    def __init__(self, items: int) -> None:
        self.items = items

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        yield from range(info.id, self.items, info.num_workers) if info is not None else range(self.items)


class Premade(IterableDataset[dict[str, torch.Tensor]]):
    """Each worker yields its share of ``batches`` premade batches: no loading at all."""

    def __init__(self, columns: int, rows: int, batches: int) -> None:
        self.columns, self.rows, self.batches = columns, rows, batches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        share = range(info.id, self.batches, info.num_workers) if info is not None else range(self.batches)
        batch = {f"c{c}": torch.zeros(self.rows, dtype=torch.float32) for c in range(self.columns)}
        for _ in share:
            yield batch


class PremadeGroups(IterableDataset[torch.Tensor]):
    """Each worker yields premade ``[k, columns, rows]`` blocks of about ``GROUP_BYTES``."""

    def __init__(self, columns: int, rows: int, batches: int) -> None:
        self.per_group = max(1, GROUP_BYTES // (4 * columns * rows))
        self.columns, self.rows, self.groups = columns, rows, -(-batches // self.per_group)

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        share = range(info.id, self.groups, info.num_workers) if info is not None else range(self.groups)
        block = torch.zeros(self.per_group, self.columns, self.rows, dtype=torch.float32)
        for _ in share:
            yield block


class Unbound:
    """The batches of :class:`PremadeGroups` as dicts of column tensors: one ``unbind`` per batch.

    The least a main process can do to hand a loop a dict of one tensor per column when
    workers send a group of batches as one block through torch's DataLoader.
    """

    def __init__(self, loader: DataLoader[torch.Tensor], columns: int) -> None:
        self.loader, self.keys = loader, tuple(f"c{c}" for c in range(columns))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        keys = self.keys
        for block in self.loader:
            for batch in block:
                yield dict(zip(keys, batch.unbind(0), strict=True))


def epochs(loader: Any, repeats: int) -> tuple[list[float], list[float], int, int]:
    """Per epoch: main-process CPU seconds and wall seconds; batches and bytes per epoch."""
    cpu, wall = [], []
    batches = nbytes = 0
    for epoch in range(repeats + 1):
        c0, t0 = main_cpu(), time.perf_counter()
        batches = nbytes = row_bytes = 0
        for batch in loader:
            batches += 1
            if isinstance(batch, dict):
                # Constant work per batch whatever the columns (the loop is to cost nothing):
                # a row's bytes once per epoch, then the rows of one column.
                first = next(iter(batch.values()))
                if not row_bytes:
                    row_bytes = sum(v.element_size() * (v.numel() // len(v)) for v in batch.values())
                nbytes += len(first) * row_bytes
            else:
                nbytes += GROUP_BYTES  # one library group's worth
        if epoch:  # the first epoch starts the workers
            cpu.append(main_cpu() - c0)
            wall.append(time.perf_counter() - t0)
    return cpu, wall, batches, nbytes


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=256, help="MB of data per configuration")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="epochs measured after a warm-up epoch")
    p.add_argument("--data-dir", type=Path, default=HERE / ".data")
    p.add_argument("--out", type=Path, default=None, help="directory for bench_receive.json / .md")
    p.add_argument("--skip-floor", action="store_true")
    args = p.parse_args(argv)
    configs = [(64, 8192), (1, 8192), (1, 524288)]
    rows_for = {
        c: max(1, args.mb * 1_000_000 // (4 * c) // (FILES * 8192)) * FILES * 8192 for c, _ in configs
    }
    results = []
    for columns, batch in configs:
        rows = rows_for[columns]
        root = write(args.data_dir, columns, rows)
        loader, _ = create_dataloader(
            str(root), batch_size=batch, num_workers=args.workers, persistent_workers=True, timeout=120
        )
        cpu, wall, batches, nbytes = epochs(loader, args.repeats)
        del loader
        tiny = write(args.data_dir, columns, FILES * batch)  # one batch per file
        small, _ = create_dataloader(
            str(tiny), batch_size=batch, num_workers=args.workers, persistent_workers=True, timeout=120
        )
        fixed, _, _, _ = epochs(small, args.repeats)
        del small
        entry = {"loop": "loader", "columns": columns, "batch_size": batch, "cpu_s": cpu, "wall_s": wall}
        entry.update(batches=batches, bytes=nbytes, fixed_cpu_s=fixed)
        results.append(entry)
        if not args.skip_floor:
            premade = DataLoader(
                Premade(columns, batch, batches),
                batch_size=None,
                num_workers=args.workers,
                persistent_workers=True,
            )
            cpu, wall, fb, fbytes = epochs(premade, args.repeats)
            del premade
            entry = {"loop": "torch DataLoader, premade", "columns": columns, "batch_size": batch}
            entry.update(cpu_s=cpu, wall_s=wall, batches=fb, bytes=fbytes)
            results.append(entry)
            groups = DataLoader(
                PremadeGroups(columns, batch, batches),
                batch_size=None,
                num_workers=args.workers,
                persistent_workers=True,
            )
            cpu, wall, fb, fbytes = epochs(Unbound(groups, columns), args.repeats)
            del groups
            entry = {"loop": "torch DataLoader, premade groups + unbind", "columns": columns}
            entry["batch_size"] = batch
            entry.update(cpu_s=cpu, wall_s=wall, batches=fb, bytes=fbytes)
            results.append(entry)
        print(json.dumps(results[-3:] if not args.skip_floor else results[-1:]), flush=True)
    if not args.skip_floor:
        ints = DataLoader(Ints(2000), batch_size=None, num_workers=args.workers, persistent_workers=True)
        cpu, wall, items, _ = epochs(ints, args.repeats)
        del ints
        entry = {"loop": "torch DataLoader, an int per hand-off", "columns": 0, "batch_size": 0}
        entry.update(cpu_s=cpu, wall_s=wall, batches=items, bytes=items * GROUP_BYTES)
        results.append(entry)
    load = os.getloadavg()
    lines = [
        f"num_workers={args.workers} persistent, {args.repeats} epochs after a warm-up, medians; "
        f"{len(os.sched_getaffinity(0))} CPUs, torch {torch.__version__}, pyarrow {pa.__version__}, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "",
        "| loop | columns | batch | MB/batch | batches/epoch | main CPU s/GB | main CPU us/batch "
        "| fixed ms/epoch | us/batch beyond | wall GB/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cpu, wall = statistics.median(r["cpu_s"]), statistics.median(r["wall_s"])
        gb = r["bytes"] / 1e9
        fixed = statistics.median(r["fixed_cpu_s"]) if "fixed_cpu_s" in r else None
        shown = "-" if fixed is None else f"{fixed * 1e3:.1f}"
        beyond = "-" if fixed is None else f"{(cpu - fixed) / r['batches'] * 1e6:.1f}"
        lines.append(
            f"| {r['loop']} | {r['columns']} | {r['batch_size']} | {r['bytes'] / r['batches'] / 2**20:.2f} | "
            f"{r['batches']} | {cpu / gb:.4f} | {cpu / r['batches'] * 1e6:.1f} | {shown} | {beyond} | "
            f"{gb / wall:.2f} |"
        )
    md = "\n".join(lines) + "\n"
    print(md)
    payload = {"benchmark": "bench_receive", "command": " ".join(sys.argv), "load": load, "results": results}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_receive.json").write_text(json.dumps(payload, indent=2) + "\n")
        (args.out / "bench_receive.md").write_text(md)
    return payload


if __name__ == "__main__":
    main()
