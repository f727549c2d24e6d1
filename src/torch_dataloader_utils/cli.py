"""Command line: ``demo`` (the README's main job), ``plan`` (inspect a plan), ``reshard``.

Usage::

    python -m torch_dataloader_utils demo          # torchrun on CPU: 2 ranks x 2 workers
    python -m torch_dataloader_utils plan PATH --num-ranks 4 --num-workers 2 --epoch 0
    torch-dataloader-utils reshard SRC DST --target-file-size 256MiB --workers 8
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _demo(args: argparse.Namespace) -> int:
    """Launch the demo as real ranks: torchrun on CPU (gloo), then report its exit code."""
    path = make_demo_dataset(Path(args.data_dir))
    print(f"dataset: {path} ({DEMO_ROWS} rows in {DEMO_FILES} Parquet files)")
    print(
        f"launching torchrun: {args.num_ranks} ranks x {args.num_workers} workers on CPU (gloo), "
        f"shuffle=True, epochs={args.epochs}",
        flush=True,
    )
    package_root = str(Path(__file__).resolve().parents[1])
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


def _demo_rank(args: argparse.Namespace) -> int:
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
        split_rows=16384,
    )  # num_ranks / rank come from the process group; equal_batches='drop' by default
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
    plan = dataset.plan(args.epoch, num_workers=args.num_workers)
    print(f"epoch {plan.epoch}  ranks {plan.num_ranks}  workers/rank {plan.num_workers}  seed {plan.seed}")
    dropped = sum(c.num_rows or 0 for c in plan.dropped)
    print(f"equal_batches {dataset.equal_batches.value}  rows dropped to equalize ranks: {dropped}")
    print(f"{'rank':>4} {'worker':>6} {'rows':>10} {'chunks':>6}  first chunks")
    for r in range(plan.num_ranks):
        for w in range(plan.num_workers):
            chunks = plan.chunks_for(r, w)
            rows = plan.rows_for(r, w)
            head = ", ".join(f"{Path(c.path).name}[{c.start}:{c.stop})" for c in chunks[:3])
            more = " ..." if len(chunks) > 3 else ""
            print(f"{r:>4} {w:>6} {rows if rows is not None else '?':>10} {len(chunks):>6}  {head}{more}")
    if args.verify:
        dataset.verify_plan(args.epoch, num_workers=args.num_workers)
        print(f"verified: no row is planned for two ranks in epoch {plan.epoch}")
    return 0


_FILTER_RE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(==|!=|<=|>=|<|>|=|\bin\b)\s*(.+?)\s*$")


def parse_filter(text: str) -> Any:
    """``--filter "NAME OP VALUE"`` as a pyarrow expression.

    ``OP`` is one of ``== != < <= > >= in``; ``VALUE`` is a JSON literal (``5``,
    ``"a"``, ``true``, ``[1, 2]`` for ``in``) or a bare word (a string).

    Raises:
        ConfigError: the text is not of that form.
    """
    import pyarrow.compute as pc

    from torch_dataloader_utils.errors import ConfigError

    match = _FILTER_RE.match(text)
    if match is None:
        raise ConfigError(
            f"--filter {text!r} is not 'NAME OP VALUE' (OP one of == != < <= > >= in), "
            "e.g. --filter 'label == 3' or --filter 'split in [\"train\", \"val\"]'"
        )
    name, op, raw = match.groups()
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    field = pc.field(name)
    if op == "in":
        if not isinstance(value, list):
            raise ConfigError(f"--filter {text!r}: 'in' needs a JSON list, e.g. [1, 2]")
        return field.isin(value)
    ops = {
        "==": field.__eq__,
        "=": field.__eq__,
        "!=": field.__ne__,
        "<": field.__lt__,
        "<=": field.__le__,
        ">": field.__gt__,
        ">=": field.__ge__,
    }
    return ops[op](value)


def _json_option(text: str | None, flag: str) -> Any:
    from torch_dataloader_utils.errors import ConfigError

    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f'{flag} must be a JSON object, e.g. \'{{"key": "..."}}\' ({exc})') from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object, got {text!r}")
    return value


def _names_option(text: str | None) -> list[str] | None:
    return None if text is None else [c.strip() for c in text.split(",") if c.strip()]


def _reshard(args: argparse.Namespace) -> int:
    """Parse ``reshard``'s flags into :func:`~torch_dataloader_utils.tools.reshard.reshard`'s keywords."""
    from torch_dataloader_utils.errors import DataLoaderUtilsError
    from torch_dataloader_utils.tools.reshard import reshard

    try:
        filters = None
        for text in args.filter or []:
            expr = parse_filter(text)
            filters = expr if filters is None else filters & expr
        size = args.row_group_size.strip()
        by_rows = size.lower().endswith("rows")
        report = reshard(
            args.src if len(args.src) > 1 else args.src[0],
            args.dst,
            format=args.format,
            columns=_names_option(args.columns),
            filters=filters,
            storage_options=_json_option(args.storage_options, "--storage-options"),
            partitioning=args.partitioning,
            catalog_config=_json_option(args.catalog_config, "--catalog-config"),
            snapshot_id=args.snapshot_id,
            dst_storage_options=_json_option(args.dst_storage_options, "--dst-storage-options"),
            target_file_size=args.target_file_size,
            row_group_bytes=None if by_rows else size,
            row_group_rows=_rows(size) if by_rows else None,
            compression=args.compression,
            sort_by=_names_option(args.sort_by),
            group_by=_names_option(args.group_by),
            partition_by=_names_option(args.partition_by),
            workers=args.workers,
            verify=args.verify,
            rank_timeout=args.rank_timeout,
        )
    except DataLoaderUtilsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{report.destination}: {report.num_shards} shards, {report.num_rows} rows, "
        f"{report.num_bytes} bytes ({report.shards_written} written now, {report.shards_skipped} "
        f"done before) in {report.seconds:.1f} s" + ("; verified" if report.verified else "")
    )
    return 0


def _rows(text: str) -> int:
    from torch_dataloader_utils.errors import ConfigError

    digits = text[: -len("rows")].strip().replace("_", "")
    if not digits.isdigit():
        raise ConfigError(f"--row-group-size {text!r}: give bytes ('32MiB') or rows ('100000rows')")
    return int(digits)


def _add_reshard(sub: Any) -> None:
    from torch_dataloader_utils.tools.reshard import (
        COMPRESSIONS,
        DEFAULT_COMPRESSION,
        DEFAULT_RANK_TIMEOUT,
        SOURCE_FORMATS,
    )

    cmd = sub.add_parser(
        "reshard",
        help="rewrite many small files into Parquet shards of a target size, with a manifest",
        description=(
            "Rewrite SRC (anything the loader reads) into Parquet shards of about "
            "--target-file-size under DST, with DST/_manifest.json that the loader opens "
            "without listing or footers. Restartable: run the same command again after an "
            "interruption. Under torchrun every rank writes its share."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    cmd.add_argument(
        "src", nargs="+", help="files, directories, globs or URLs; or a table with --format iceberg"
    )
    cmd.add_argument("dst", help="output directory (local or URL): new, empty, or an interrupted job's")
    cmd.add_argument("--format", default="parquet", choices=SOURCE_FORMATS, help="source format")
    cmd.add_argument("--columns", default=None, help="comma-separated columns to keep; all when unset")
    cmd.add_argument("--filter", action="append", help="keep rows where 'NAME OP VALUE' holds (repeat: and)")
    cmd.add_argument("--partitioning", default=None, choices=["hive"], help="read key=value directories")
    cmd.add_argument("--storage-options", default=None, help="source filesystem options (JSON object)")
    cmd.add_argument("--dst-storage-options", default=None, help="output filesystem options (JSON)")
    cmd.add_argument("--catalog-config", default=None, help="Iceberg catalog properties (JSON object)")
    cmd.add_argument(
        "--snapshot-id", type=int, default=None, help="Iceberg snapshot; the current one when unset"
    )
    cmd.add_argument("--target-file-size", default="256MiB", help="bytes per shard, e.g. 256MiB")
    cmd.add_argument("--row-group-size", default="32MiB", help="bytes (32MiB) or rows (100000rows)")
    cmd.add_argument("--compression", default=DEFAULT_COMPRESSION, choices=COMPRESSIONS)
    cmd.add_argument("--sort-by", default=None, help="comma-separated columns to sort each shard by")
    cmd.add_argument("--group-by", default=None, help="columns whose rows stay in one shard, contiguous")
    cmd.add_argument("--partition-by", default=None, help="columns written as key=value directories")
    cmd.add_argument("--workers", type=int, default=1, help="worker processes per rank")
    cmd.add_argument("--verify", action="store_true", help="compare row counts and column checksums")
    cmd.add_argument(
        "--rank-timeout", type=float, default=DEFAULT_RANK_TIMEOUT, help="seconds a rank waits at a barrier"
    )
    cmd.set_defaults(fn=_reshard)


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
    demo.add_argument("--timeout", type=float, default=300, help="seconds before the demo gives up")
    demo.set_defaults(fn=_demo)
    rank = sub.add_parser("demo-rank", help="one rank of the demo (started by torchrun)")
    rank.add_argument("--data-dir", required=True)
    rank.add_argument("--num-workers", type=int, default=2)
    rank.add_argument("--batch-size", type=int, default=1000)
    rank.add_argument("--epochs", type=int, default=2)
    rank.set_defaults(fn=_demo_rank)
    plan = sub.add_parser("plan", help="show which chunks each rank and worker reads")
    plan.add_argument("path")
    plan.add_argument("--format", default="parquet")
    plan.add_argument("--num-ranks", type=int, default=1)
    plan.add_argument("--num-workers", type=int, default=1)
    plan.add_argument("--epoch", type=int, default=0)
    plan.add_argument("--shuffle", action="store_true")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--split-bytes", default=None)
    plan.add_argument("--verify", action="store_true", help="check that no row is planned for two ranks")
    plan.set_defaults(fn=_plan)
    _add_reshard(sub)
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
