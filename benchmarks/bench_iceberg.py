"""Iceberg read throughput: a table with 5 % of rows position-deleted vs the same table without deletes.

Both tables hold the same rows in the same layout (Parquet files, row groups); the
second has one position delete file per data file removing a random 5 % of its rows.
Each configuration is read end to end through ``IcebergDataset`` (main process, arrow
and torch output) and through a raw pyarrow loop over the same data files (the
reference), several times; medians are reported.

Usage::

    python benchmarks/bench_iceberg.py [--rows 2000000] [--repeats 5] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from testsupport.iceberg_tables import (  # noqa: E402
    commit_deletes,
    data_files,
    make_catalog,
    position_delete_file,
    sql_catalog_config,
)

from torch_dataloader_utils import IcebergDataset  # noqa: E402

FILES = 4
ROW_GROUP = 65536
BATCH = 8192


def make_data(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "f0": rng.standard_normal(rows).astype(np.float32),
            "f1": rng.standard_normal(rows).astype(np.float32),
            "f2": rng.standard_normal(rows),
            "label": rng.integers(0, 10, rows),
        }
    )


def build(root: Path, rows: int, fraction: float) -> tuple[dict[str, str], int]:
    config = sql_catalog_config(root)
    catalog = make_catalog(config)
    data = make_data(rows)
    per_file = rows // FILES
    live = rows
    for name, deletes in (("ns.clean", False), ("ns.deleted", True)):
        t = catalog.create_table(
            name, schema=data.schema, properties={"write.parquet.row-group-limit": str(ROW_GROUP)}
        )
        for i in range(FILES):
            t.append(data.slice(i * per_file, per_file))
        if deletes:
            rng = np.random.default_rng(1)
            files = data_files(t)
            chosen = {p: rng.choice(per_file, int(per_file * fraction), replace=False) for p in files}
            t = commit_deletes(t, [position_delete_file(t, {p: pos.tolist()}) for p, pos in chosen.items()])
            live = rows - sum(len(v) for v in chosen.values())
    return config, live


def read_dataset(config: dict[str, str], table: str, output: str) -> tuple[float, float, int]:
    """(seconds to build the loader (discovery, delete files), seconds to read one epoch, rows)."""
    t0 = time.perf_counter()
    loader, _ = IcebergDataset.create_dataloader(
        table, catalog_config=config, num_workers=0, batch_size=BATCH, output_format=output
    )
    t1 = time.perf_counter()
    rows = 0
    for batch in loader:
        rows += batch.num_rows if output == "arrow" else len(batch["id"])
    return t1 - t0, time.perf_counter() - t1, rows


def read_epoch(loader: Any, output: str) -> tuple[float, int]:
    """Seconds and rows of one more epoch of an already built (and warmed-up) loader."""
    t0 = time.perf_counter()
    rows = 0
    for batch in loader:
        rows += batch.num_rows if output == "arrow" else len(batch["id"])
    return time.perf_counter() - t0, rows


def read_raw(paths: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    rows = 0
    for p in paths:
        for batch in pq.ParquetFile(p.removeprefix("file://")).iter_batches(batch_size=BATCH):
            rows += batch.num_rows
    return time.perf_counter() - t0, rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--steady",
        action="store_true",
        help="build each loader once and time later epochs (after a warm-up), not a fresh loader per run",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config, live = build(Path(tmp), args.rows, args.fraction)
        catalog = make_catalog(config)
        raw_paths = data_files(catalog.load_table("ns.clean"))
        raw_times, raw_rows = [], 0
        setup: dict[tuple[str, str], list[float]] = {}
        epoch: dict[tuple[str, str], list[float]] = {}
        rows_of: dict[tuple[str, str], int] = {}
        kept: dict[tuple[str, str], Any] = {}
        built: dict[tuple[str, str], float] = {}
        if args.steady:
            for output in ("arrow", "torch"):
                for table in ("ns.clean", "ns.deleted"):
                    t0 = time.perf_counter()
                    kept[(table, output)] = IcebergDataset.create_dataloader(
                        table, catalog_config=config, num_workers=0, batch_size=BATCH, output_format=output
                    )[0]
                    built[(table, output)] = time.perf_counter() - t0
                    sum(1 for _ in kept[(table, output)])  # warm-up epoch
        # Interleaved runs, so load from other processes hits every configuration alike.
        for _ in range(args.repeats):
            t, raw_rows = read_raw(raw_paths)
            raw_times.append(t)
            for output in ("arrow", "torch"):
                for table in ("ns.clean", "ns.deleted"):
                    if args.steady:
                        build_s = built[(table, output)]
                        read_s, rows = read_epoch(kept[(table, output)], output)
                    else:
                        build_s, read_s, rows = read_dataset(config, table, output)
                    setup.setdefault((table, output), []).append(build_s)
                    epoch.setdefault((table, output), []).append(read_s)
                    rows_of[(table, output)] = rows
        assert rows_of[("ns.deleted", "torch")] == live
    raw_t = statistics.median(raw_times)
    lines = [
        "# Iceberg benchmark: position deletes",
        "",
        f"Command: `python benchmarks/bench_iceberg.py --rows {args.rows} --repeats {args.repeats}"
        f"{' --steady' if args.steady else ''}`"
        + (" (each loader built once; epochs after a warm-up epoch)" if args.steady else ""),
        "",
        f"{args.rows:,} rows (int64 id, 3 float columns, int64 label) in {FILES} Parquet data files, "
        f"row groups of {ROW_GROUP:,} rows, batch size {BATCH}, main process (num_workers=0). "
        f"`ns.deleted` has {args.fraction:.0%} of each file's rows position-deleted (one delete file per "
        f"data file); {live:,} rows are live. Medians of {args.repeats} interleaved runs; "
        "rows/s counts rows delivered. "
        "*build* is `create_dataloader` (catalog, manifests, footers, delete files); *epoch* is one pass.",
        "",
        "| configuration | build s | epoch s | rows | Mrows/s (epoch) | epoch vs raw |",
        "|---|---:|---:|---:|---:|---:|",
        f"| raw pyarrow loop (clean files) | - | {raw_t:.3f} | {raw_rows:,} | "
        f"{raw_rows / raw_t / 1e6:.2f} | 1.00x |",
    ]
    for (table, output), times in epoch.items():
        t = statistics.median(times)
        b = statistics.median(setup[(table, output)])
        rows = rows_of[(table, output)]
        lines.append(
            f"| IcebergDataset {table} -> {output} | {b:.3f} | {t:.3f} | {rows:,} | {rows / t / 1e6:.2f} | "
            f"{raw_t / t:.2f}x |"
        )
    for output in ("arrow", "torch"):
        clean = statistics.median(epoch[("ns.clean", output)])
        deleted = statistics.median(epoch[("ns.deleted", output)])
        clean_all = statistics.median(
            a + b for a, b in zip(epoch[("ns.clean", output)], setup[("ns.clean", output)], strict=True)
        )
        deleted_all = statistics.median(
            a + b for a, b in zip(epoch[("ns.deleted", output)], setup[("ns.deleted", output)], strict=True)
        )
        paired = statistics.median(
            c / d for c, d in zip(epoch[("ns.clean", output)], epoch[("ns.deleted", output)], strict=True)
        )
        lines.append("")
        lines.append(
            f"**{output}**: with {args.fraction:.0%} of rows position-deleted an epoch reads at "
            f"**{paired:.2f}x** the speed of the table without deletes (median of per-run ratios of "
            f"back-to-back runs; target >= 0.8x); ratio of medians {clean / deleted:.2f}x; "
            f"{clean_all / deleted_all:.2f}x including building the loader (which reads the delete files)."
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
