"""The Iceberg demo of ``make demo``: a local SQLite-backed table with deletes, read as ranks x workers.

``python -m testsupport.demo_iceberg`` (from the repository root) builds a small table in a
SQLite ``SqlCatalog`` under the demo directory (no server), commits position and
equality deletes, and reads it as 2 ranks x 2 DataLoader workers, checking that every
live row arrives exactly once. It is not part of the installed package: writing delete
files needs private pyiceberg APIs (:mod:`testsupport.iceberg_tables`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from testsupport.iceberg_tables import (
    commit_deletes,
    equality_delete_file,
    make_catalog,
    position_delete_file,
    sql_catalog_config,
)

__all__ = ["iceberg_demo", "main", "make_demo_table"]

DEMO_ROWS = (12_000, 8_000, 5_000)
DEMO_ROW_GROUP = 500


def _rows(start: int, n: int, rng: np.random.Generator) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "f0": rng.standard_normal(n).astype(np.float32),
            "f1": rng.standard_normal(n).astype(np.float32),
            "label": rng.integers(0, 10, n),
        }
    )


def make_demo_table(root: Path) -> tuple[dict[str, str], str, set[int]]:
    """Build the demo table afresh under ``root``: (catalog_config, table name, live ids).

    Three appends; 5 % of the first file's rows position-deleted; an equality delete of
    every id divisible by 97, committed before the third append (whose rows it spares,
    by sequence number).
    """
    if root.exists():
        shutil.rmtree(root)
    config = sql_catalog_config(root.resolve())
    catalog = make_catalog(config, namespace="demo")
    rng = np.random.default_rng(0)
    schema = _rows(0, 1, rng).schema
    table = catalog.create_table(
        "demo.events", schema=schema, properties={"write.parquet.row-group-limit": str(DEMO_ROW_GROUP)}
    )
    live: set[int] = set()
    start = 0
    first_path = ""
    for i, n in enumerate(DEMO_ROWS):
        if i == 2:
            doomed = [x for x in range(start) if x % 97 == 0]
            table = commit_deletes(table, [equality_delete_file(table, {"id": doomed})])
            live -= set(doomed)
        table.append(_rows(start, n, rng))
        if i == 0:
            first_path = table.inspect.files().column("file_path")[0].as_py()
        live |= set(range(start, start + n))
        start += n
    positions = rng.choice(DEMO_ROWS[0], DEMO_ROWS[0] // 20, replace=False)
    table = commit_deletes(table, [position_delete_file(table, {first_path: positions.tolist()})])
    live -= {int(p) for p in positions}  # the first file holds ids 0.. at positions 0..
    return config, "demo.events", live


def iceberg_demo(data_dir: str | Path = "demo_data", num_ranks: int = 2, num_workers: int = 2) -> int:
    """Build the demo table and read it as ``num_ranks`` x ``num_workers``; 0 when every row arrived once."""
    from torch_dataloader_utils.runtime.iceberg import IcebergDataset

    config, name, live = make_demo_table(Path(data_dir) / "iceberg")
    total = sum(DEMO_ROWS)
    print(f"iceberg table {name} in {config['uri']}: {total} rows written, {len(live)} live after deletes")
    print(f"reading as {num_ranks} ranks x {num_workers} workers, split_rows=500")
    print("  rank  rows     batches  seconds")
    seen: list[np.ndarray[Any, Any]] = []
    counts = set()
    dropped = 0
    for rank in range(num_ranks):
        t0 = time.perf_counter()
        loader, dataset = IcebergDataset.create_dataloader(
            name,
            catalog_config=config,
            num_ranks=num_ranks,
            rank=rank,
            num_workers=num_workers,
            batch_size=1000,
            split_rows=500,
            shuffle=True,
            shuffle_seed=7,
            timeout=120,
        )
        rows = batches = 0
        for batch in loader:
            seen.append(batch["id"].numpy().copy())
            rows += len(batch["id"])
            batches += 1
        counts.add(batches)
        # Equal batches (the default) leave fewer than num_ranks rows out of the epoch.
        dropped = sum(c.num_rows or 0 for c in dataset.plan().dropped)
        print(f"  {rank:<5d} {rows:<8d} {batches:<8d} {time.perf_counter() - t0:.2f}")
    ids = np.concatenate(seen) if seen else np.empty(0, dtype=np.int64)
    got = set(ids.tolist())
    repeated = len(ids) - len(got)
    if repeated == 0 and got <= live and len(got) + dropped == len(live) and len(counts) == 1:
        print(
            f"  OK: {len(got)} of {len(live)} live rows arrived exactly once, deleted rows never, "
            f"{dropped} left out of this epoch to even the ranks; every rank yielded {counts.pop()} batches"
        )
        return 0
    missing = len(live - got) - dropped
    print(
        f"  FAIL: {len(ids)} rows read, {missing} missing, {repeated} repeated, {len(got - live)} deleted, "
        f"batches per rank {sorted(counts)}"
    )
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m testsupport.demo_iceberg``; 0 when every live row arrived once."""
    parser = argparse.ArgumentParser(
        prog="python -m testsupport.demo_iceberg",
        description="build a local SQLite-backed Iceberg table with deletes and read it as ranks x workers",
    )
    parser.add_argument("--data-dir", default="demo_data")
    parser.add_argument("--num-ranks", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=2)
    args = parser.parse_args(argv)
    return iceberg_demo(args.data_dir, num_ranks=args.num_ranks, num_workers=args.num_workers)


if __name__ == "__main__":
    sys.exit(main())
