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

from pyiceberg.expressions import In  # noqa: E402
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


def build(root: Path, files: int, new: float) -> tuple[dict[str, str], int, int, int]:
    """The table and its snapshots S1 (old files), S2 (S1 plus the new files) and S3.

    S3 rewrites as many old files as S2 added: a copy-on-write delete of one row of each
    (an ``overwrite`` commit that removes them and adds their other rows in new files).
    """
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
    step = max(1, (files - added) // added)
    table.delete(In("id", [i * step * ROWS_PER_FILE for i in range(added)]))
    table = table.refresh()
    s3 = table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    return config, s1, s2, s3


def plan(config: dict[str, str], snapshot: int, since: int | None) -> tuple[float, int, int]:
    """Seconds to build the dataset (its plan of epoch 0 included), its files and rows."""
    t0 = time.perf_counter()
    ds = IcebergDataset(
        "ns.grows",
        catalog_config=config,
        snapshot_id=snapshot,
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
        config, s1, s2, s3 = build(Path(tmp), args.files, args.new)
        built = time.perf_counter() - t0
        plan(config, s2, None)  # warm-up: imports, first catalog load
        runs = {
            "full S2": (s2, None),
            "incremental S1 -> S2": (s2, s1),
            "full S3": (s3, None),
            "incremental S1 -> S3": (s3, s1),
        }
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        shape: dict[str, tuple[int, int]] = {}
        for _ in range(args.repeats):
            for name, (snapshot, since) in runs.items():
                took, n_files, rows = plan(config, snapshot, since)
                seconds[name].append(took)
                shape[name] = (n_files, rows)
    full, incremental = seconds["full S2"], seconds["incremental S1 -> S2"]
    ratios = [i / f for i, f in zip(incremental, full, strict=True)]
    rewrite = [i / f for i, f in zip(seconds["incremental S1 -> S3"], seconds["full S3"], strict=True)]
    expected_new = max(1, round(args.files * args.new))
    assert shape["incremental S1 -> S2"] == (expected_new, expected_new * ROWS_PER_FILE), shape
    assert shape["full S2"] == (args.files, args.files * ROWS_PER_FILE), shape
    # The rewritten files' rows moved (not new) but for the row each rewrite deleted.
    assert shape["incremental S1 -> S3"] == (2 * expected_new, expected_new * ROWS_PER_FILE), shape

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
        f"{expected_new:,} ({args.new:.0%}), S3 rewrites {expected_new:,} of S1's. Each run builds an "
        "`IcebergDataset` (catalog, manifests, footers, the plan of epoch 0), main process; the "
        "four kinds alternate. "
        "Seconds: median (min-max) of the runs.",
        "",
        "| plan | data files | rows | seconds |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {shape[name][0]:,} | {shape[name][1]:,} | {cell(seconds[name])} |" for name in runs),
        "",
        f"Incremental / full (S2, appends only): **{statistics.median(ratios):.3f}x** (median of the "
        f"per-run ratios; range {min(ratios):.3f}-{max(ratios):.3f}; target <= 0.2x).",
        f"S3 also rewrites {expected_new:,} old files (a copy-on-write delete of one row each): the "
        f"incremental plan then compares rows by content; incremental / full (S3): "
        f"**{statistics.median(rewrite):.3f}x** (range {min(rewrite):.3f}-{max(rewrite):.3f}).",
    ]
    print(*lines, sep="\n")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
