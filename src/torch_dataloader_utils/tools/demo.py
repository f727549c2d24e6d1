"""``demo``: the README's main job, as real ranks — torchrun on CPU, every row checked.

``demo`` writes a small Parquet dataset with uneven files and launches ``torchrun``
(gloo) with ``demo-rank`` on each rank: a loop with one ``all_reduce`` per batch, as
DDP's gradient sync; rank 0 checks that every row arrived exactly once and that every
rank yielded the same number of batches.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DEMO_FILES", "DEMO_ROWS", "make_demo_dataset", "run_demo", "run_demo_rank"]

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
        pq.write_table(table, target / f"part-{i:05d}.parquet", row_group_size=4096)
        start += n
    done.touch()
    return target


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_demo(args: argparse.Namespace) -> int:
    """Launch the demo as real ranks: torchrun on CPU (gloo), then report its exit code."""
    path = make_demo_dataset(Path(args.data_dir))
    print(f"dataset: {path} ({DEMO_ROWS} rows in {DEMO_FILES} Parquet files)")
    print(
        f"launching torchrun: {args.num_ranks} ranks x {args.num_workers} workers on CPU (gloo), "
        f"shuffle=True, epochs={args.epochs}",
        flush=True,
    )
    package_root = str(Path(__file__).resolve().parents[2])
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p
    )
    child_env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        child_env.pop(name, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={args.num_ranks}",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        "--module",
        "torch_dataloader_utils",
        "demo-rank",
        f"--data-dir={path}",
        f"--num-workers={args.num_workers}",
        f"--batch-size={args.batch_size}",
        f"--epochs={args.epochs}",
    ]
    try:
        done = subprocess.run(cmd, env=child_env, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"FAIL: the demo did not finish in {args.timeout} s")
        return 1
    if done.returncode != 0:
        print(f"FAIL: torchrun exited with {done.returncode}")
    return 1 if done.returncode else 0


def run_demo_rank(args: argparse.Namespace) -> int:
    """One rank of the demo: a loop with one all_reduce per batch; rank 0 verifies."""
    import torch
    import torch.distributed as dist

    from torch_dataloader_utils import StructuredDataset

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    loader, dataset = StructuredDataset.create_dataloader(
        path=args.data_dir,
        format="parquet",
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        shuffle=True,
        shuffle_seed=42,
    )  # num_ranks / rank come from the process group; equal_batches='drop' by default; the
    # split is the library's (fine enough for every reader to mix rows of 8 chunks)
    ok = True
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)
        t0 = time.perf_counter()
        parts: list[np.ndarray] = []
        batches = 0
        for batch in loader:
            step = torch.ones(1)
            dist.all_reduce(step)  # one collective per batch, as DDP's gradient sync
            parts.append(batch["id"].numpy().copy())
            batches += 1
        ids = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        stats = (rank, len(ids), batches, len(loader), time.perf_counter() - t0)
        gathered: list[object] = [None] * world if rank == 0 else []
        dist.gather_object((stats, ids), gathered if rank == 0 else None, dst=0)
        if rank == 0:
            ok = _verify(epoch, gathered, dataset) and ok
        flag = torch.tensor([1 if ok else 0])
        dist.broadcast(flag, src=0)
        ok = bool(flag.item())
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def _verify(epoch: int, gathered: Sequence[Any], dataset: Any) -> bool:
    print(f"\nepoch {epoch}\n  rank  rows     batches  len(loader)  seconds")
    seen = []
    counts = set()
    for (rank, rows, batches, length, seconds), ids in gathered:
        print(f"  {rank:<5d} {rows:<8d} {batches:<8d} {length:<12d} {seconds:.2f}")
        seen.append(ids)
        counts.add(batches)
        counts.add(length)
    ids = np.concatenate(seen)
    dropped = sum(c.num_rows or 0 for c in dataset.plan(epoch).dropped)
    counts_ids = np.bincount(ids, minlength=DEMO_ROWS)
    missing, repeated = int((counts_ids == 0).sum()), int((counts_ids > 1).sum())
    if len(counts) == 1 and repeated == 0 and missing == dropped and len(ids) == DEMO_ROWS - dropped:
        print(
            f"  OK: every rank yielded {counts.pop()} batches; all {DEMO_ROWS - dropped} rows arrived "
            f"exactly once ({dropped} dropped to equalize ranks)"
        )
        return True
    print(
        f"  FAIL: batch counts {sorted(counts)}, {len(ids)} rows read, {missing} missing "
        f"({dropped} planned drops), {repeated} repeated"
    )
    return False
