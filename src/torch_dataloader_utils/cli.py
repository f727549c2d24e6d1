"""Command line: ``demo`` (the README's main job) and ``plan`` (inspect a plan).

Usage::

    python -m torch_dataloader_utils demo
    python -m torch_dataloader_utils demo-iceberg
    python -m torch_dataloader_utils plan PATH --num-ranks 4 --num-workers 2 --epoch 0
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["main"]

DEMO_ROWS = 200_000
DEMO_FILES = 7


def make_demo_dataset(root: Path, rows: int = DEMO_ROWS, files: int = DEMO_FILES) -> Path:
    """Write a small Parquet dataset with uneven files and an ``id`` column (once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = root / "parquet"
    done = target / "_SUCCESS"
    if done.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    weights = rng.uniform(0.3, 1.7, size=files)
    sizes = np.floor(weights / weights.sum() * rows).astype(int)
    sizes[-1] += rows - sizes.sum()
    start = 0
    for i, n in enumerate(sizes):
        ids = np.arange(start, start + n, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "f0": rng.standard_normal(n).astype(np.float32),
                "f1": rng.standard_normal(n).astype(np.float32),
                "label": rng.integers(0, 10, n),
            }
        )
        pq.write_table(table, target / f"part-{i:05d}.parquet", row_group_size=8192)
        start += n
    done.touch()
    return target


def _demo(args: argparse.Namespace) -> int:
    from torch_dataloader_utils import StructuredDataset

    path = make_demo_dataset(Path(args.data_dir))
    num_ranks, num_workers = args.num_ranks, args.num_workers
    print(f"dataset: {path} ({DEMO_ROWS} rows in {DEMO_FILES} Parquet files)")
    print(f"reading as {num_ranks} ranks x {num_workers} workers, shuffle=True, epochs={args.epochs}")
    ok = True
    for epoch in range(args.epochs):
        seen: list[np.ndarray] = []
        print(f"\nepoch {epoch}\n  rank  rows     batches  seconds")
        for rank in range(num_ranks):
            t0 = time.perf_counter()
            loader, dataset = StructuredDataset.create_dataloader(
                path=str(path),
                format="parquet",
                batch_size=args.batch_size,
                num_workers=num_workers,
                shuffle=True,
                shuffle_seed=42,
                split_rows=16384,
                num_ranks=num_ranks,
                rank=rank,
            )
            dataset.set_epoch(epoch)
            rows = batches = 0
            for batch in loader:
                seen.append(batch["id"].numpy().copy())
                rows += len(batch["id"])
                batches += 1
            print(f"  {rank:<5d} {rows:<8d} {batches:<8d} {time.perf_counter() - t0:.2f}")
        ids = np.concatenate(seen) if seen else np.empty(0, dtype=np.int64)
        counts = np.bincount(ids, minlength=DEMO_ROWS)
        missing, repeated = int((counts == 0).sum()), int((counts > 1).sum())
        if len(ids) == DEMO_ROWS and missing == 0 and repeated == 0:
            print(f"  OK: all {DEMO_ROWS} rows arrived exactly once")
        else:
            ok = False
            print(f"  FAIL: {len(ids)} rows read, {missing} missing, {repeated} repeated")
    return 0 if ok else 1


def _demo_iceberg(args: argparse.Namespace) -> int:
    from torch_dataloader_utils.demo_iceberg import iceberg_demo

    return iceberg_demo(args.data_dir, num_ranks=args.num_ranks, num_workers=args.num_workers)


def _plan(args: argparse.Namespace) -> int:
    from torch_dataloader_utils import StructuredDataset

    dataset = StructuredDataset(
        args.path,
        format=args.format,
        num_ranks=args.num_ranks,
        rank=0,
        num_workers=args.num_workers,
        shuffle=args.shuffle,
        shuffle_seed=args.seed,
        split_bytes=args.split_bytes,
    )
    plan = dataset.plan(args.epoch, num_workers=max(1, args.num_workers))
    print(f"epoch {plan.epoch}  ranks {plan.num_ranks}  workers/rank {plan.num_workers}  seed {plan.seed}")
    print(f"{'rank':>4} {'worker':>6} {'rows':>10} {'chunks':>6}  first chunks")
    for r in range(plan.num_ranks):
        for w in range(plan.num_workers):
            chunks = plan.chunks_for(r, w)
            rows = plan.rows_for(r, w)
            head = ", ".join(f"{Path(c.path).name}[{c.start}:{c.stop})" for c in chunks[:3])
            more = " ..." if len(chunks) > 3 else ""
            print(f"{r:>4} {w:>6} {rows if rows is not None else '?':>10} {len(chunks):>6}  {head}{more}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m torch_dataloader_utils``."""
    parser = argparse.ArgumentParser(prog="torch_dataloader_utils")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="generate a local dataset and read it as ranks x workers")
    demo.add_argument("--data-dir", default="demo_data")
    demo.add_argument("--num-ranks", type=int, default=2)
    demo.add_argument("--num-workers", type=int, default=2)
    demo.add_argument("--batch-size", type=int, default=1000)
    demo.add_argument("--epochs", type=int, default=2)
    demo.set_defaults(fn=_demo)
    demo_ice = sub.add_parser(
        "demo-iceberg",
        help="build a local SQLite-backed Iceberg table with deletes and read it as ranks x workers",
    )
    demo_ice.add_argument("--data-dir", default="demo_data")
    demo_ice.add_argument("--num-ranks", type=int, default=2)
    demo_ice.add_argument("--num-workers", type=int, default=2)
    demo_ice.set_defaults(fn=_demo_iceberg)
    plan = sub.add_parser("plan", help="show which chunks each rank and worker reads")
    plan.add_argument("path")
    plan.add_argument("--format", default="parquet")
    plan.add_argument("--num-ranks", type=int, default=1)
    plan.add_argument("--num-workers", type=int, default=1)
    plan.add_argument("--epoch", type=int, default=0)
    plan.add_argument("--shuffle", action="store_true")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--split-bytes", default=None)
    plan.set_defaults(fn=_plan)
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
