"""Planning an incremental Iceberg epoch (``since_snapshot_id``) against planning the full snapshot.

A table of ``--files`` Parquet data files: S1 holds ``(1 - --new) * files`` of them, S2
appends the rest (1 % by default). Both plans build an ``IcebergDataset`` of S2 (catalog,
manifests, footers, the epoch's plan): the full one reads every manifest entry and every
footer, the incremental one (``since_snapshot_id=S1``) only the manifests S2's commit
wrote and the new files' footers. Runs are interleaved (full, incremental, full, ...) so
load from other processes hits both alike; medians, ranges and the median of the per-run
ratios are reported.

Usage::

    python benchmarks/bench_iceberg_incremental.py [--files 10000] [--new 0.01] [--repeats 7] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from testsupport.iceberg_tables import make_catalog, sql_catalog_config  # noqa: E402

from torch_dataloader_utils import IcebergDataset  # noqa: E402

ROWS_PER_FILE = 200
ADD_BATCH = 2000
"""Data files registered per ``add_files`` call while building S1."""


def _write_files(folder: Path, first: int, count: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(first)
    paths = []
    for i in range(first, first + count):
        ids = np.arange(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE, dtype=np.int64)
        table = pa.table({"id": ids, "x": rng.standard_normal(ROWS_PER_FILE), "label": ids % 10})
        path = folder / f"part-{i:06d}.parquet"
        pq.write_table(table, path)
        paths.append(f"file://{path}")
    return paths


def build(root: Path, files: int, new: float) -> tuple[dict[str, str], int, int]:
    """The table and its snapshots S1 (old files) and S2 (S1 plus the new files)."""
    config = sql_catalog_config(root / "iceberg")
    catalog = make_catalog(config)
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("label", pa.int64())])
    table = catalog.create_table("ns.grows", schema=schema)
    added = max(1, round(files * new))
    old = _write_files(root / "files", 0, files - added)
    with table.transaction() as tx:  # S1: one commit
        for k in range(0, len(old), ADD_BATCH):
            tx.add_files(old[k : k + ADD_BATCH], check_duplicate_files=False)
    table = table.refresh()
    s1 = table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    table.add_files(_write_files(root / "files", files - added, added), check_duplicate_files=False)
    table = table.refresh()
    s2 = table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    return config, s1, s2


def plan(config: dict[str, str], s2: int, since: int | None) -> tuple[float, int, int]:
    """Seconds to build the dataset (its plan of epoch 0 included), its files and rows."""
    t0 = time.perf_counter()
    ds = IcebergDataset(
        "ns.grows",
        catalog_config=config,
        snapshot_id=s2,
        **({} if since is None else {"since_snapshot_id": since}),
        num_workers=0,
        batch_size=1024,
    )
    rows = sum(ds.rank_plan(0).rows_for(w) or 0 for w in range(1))
    return time.perf_counter() - t0, len(ds.files), rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--new", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    logging.getLogger("torch_dataloader_utils").setLevel(logging.ERROR)  # the small files' advice
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        config, s1, s2 = build(Path(tmp), args.files, args.new)
        built = time.perf_counter() - t0
        plan(config, s2, None)  # warm-up: imports, first catalog load
        full: list[float] = []
        incremental: list[float] = []
        shape: dict[str, tuple[int, int]] = {}
        for _ in range(args.repeats):
            seconds, n_files, rows = plan(config, s2, None)
            full.append(seconds)
            shape["full"] = (n_files, rows)
            seconds, n_files, rows = plan(config, s2, s1)
            incremental.append(seconds)
            shape["incremental"] = (n_files, rows)
    ratios = [i / f for i, f in zip(incremental, full, strict=True)]
    expected_new = max(1, round(args.files * args.new))
    assert shape["incremental"] == (expected_new, expected_new * ROWS_PER_FILE), shape
    assert shape["full"] == (args.files, args.files * ROWS_PER_FILE), shape

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"

    lines = [
        "# Iceberg benchmark: planning an incremental epoch",
        "",
        f"Command: `python benchmarks/bench_iceberg_incremental.py --files {args.files} --new {args.new} "
        f"--repeats {args.repeats}`",
        "",
        f"{args.files:,} Parquet data files of {ROWS_PER_FILE} rows in a SQLite catalog (built in "
        f"{built:.0f} s): S1 holds {args.files - expected_new:,} of them (one commit), S2 appends "
        f"{expected_new:,} ({args.new:.0%}). Each run builds an `IcebergDataset` of S2 (catalog, "
        "manifests, footers, the plan of epoch 0), main process; the two kinds alternate. "
        "Seconds: median (min-max) of the runs.",
        "",
        "| plan | data files | rows | seconds |",
        "|---|---:|---:|---:|",
        f"| full S2 | {shape['full'][0]:,} | {shape['full'][1]:,} | {cell(full)} |",
        f"| incremental S1 -> S2 | {shape['incremental'][0]:,} | {shape['incremental'][1]:,} | "
        f"{cell(incremental)} |",
        "",
        f"Incremental / full: **{statistics.median(ratios):.3f}x** (median of the per-run ratios; "
        f"range {min(ratios):.3f}-{max(ratios):.3f}; target <= 0.2x).",
    ]
    print(*lines, sep="\n")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
