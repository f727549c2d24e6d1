"""Cost and mixing of the row-level window shuffle vs an unshuffled read, same run.

    python benchmarks/bench_shuffle.py [--rows 2000000] [--window 262144] [--repeats 3]

Times (medians of ``--repeats``) of one epoch read in the main process with
``batch_size=1024``, torch output:

* ``pyarrow``: a raw ``ParquetFile.iter_batches`` loop over the files (reference);
* ``chunk shuffle``: ``shuffle=True, split_rows=65536`` (chunk = row group; order only),
  the unshuffled-rows baseline;
* ``row shuffle``: ``shuffle=True, row_shuffle_window=W``.

Mixing, from the ``id`` column (ids are file order): how far rows move from their
position in file order (mean, median, p90, as a fraction of the dataset), the share of
consecutive output rows that were consecutive in the file, and the mean share of row
pairs inside a batch that come from different files.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils import create_dataloader

FILES = 8


def write(root: Path, rows: int) -> None:
    per = rows // FILES
    for i in range(FILES):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "x": (ids * 0.5).astype(np.float32),
                "y": (ids % 13).astype(np.float64),
                "label": (ids % 7).astype(np.int64),
            }
        )
        pq.write_table(table, root / f"part-{i:02d}.parquet", row_group_size=65536)


def raw(root: Path) -> list[np.ndarray]:
    out = []
    for path in sorted(root.glob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            out.append(batch.column("id").to_numpy())
    return out


def ours(root: Path, window: int | None) -> list[np.ndarray]:
    loader, _ = create_dataloader(
        str(root),
        batch_size=1024,
        num_workers=0,
        shuffle=True,
        shuffle_seed=1,
        split_rows=65536,
        row_shuffle_window=window,
    )
    return [batch["id"].numpy() for batch in loader]


def timed(fn, repeats: int) -> tuple[float, list[np.ndarray]]:
    times, result = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def mixing(batches: list[np.ndarray], rows: int) -> dict[str, float]:
    ids = np.concatenate(batches)
    assert np.array_equal(np.sort(ids), np.arange(rows)), "every row exactly once"
    moved = np.abs(ids - np.arange(rows)) / rows
    file_of = lambda a: a // (rows // FILES)  # noqa: E731
    cross = []
    for b in batches:
        counts = np.bincount(file_of(b), minlength=FILES) / len(b)
        cross.append(1.0 - float(np.sum(counts**2)))
    return {
        "mean move": float(moved.mean()),
        "median move": float(np.median(moved)),
        "p90 move": float(np.quantile(moved, 0.9)),
        "consecutive": float(np.mean(np.diff(ids) == 1)),
        "cross-file pairs": float(np.mean(cross)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--window", type=int, default=262_144)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = args.rows // FILES * FILES
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write(root, rows)
        t_raw, _ = timed(lambda: raw(root), args.repeats)
        t_chunk, chunk = timed(lambda: ours(root, None), args.repeats)
        t_row, row = timed(lambda: ours(root, args.window), args.repeats)
    print(f"rows={rows} files={FILES} row_group=65536 batch=1024 window={args.window} repeats={args.repeats}")
    print("| read | median s | vs pyarrow | vs chunk shuffle |")
    print("|---|---|---|---|")
    for name, t in (("pyarrow iter_batches", t_raw), ("chunk shuffle", t_chunk), ("row shuffle", t_row)):
        print(f"| {name} | {t:.3f} | {t / t_raw:.2f}x | {t / t_chunk:.2f}x |")
    print()
    print("| read | mean move | median move | p90 move | consecutive ids | cross-file pairs in a batch |")
    print("|---|---|---|---|---|---|")
    for name, batches in (("chunk shuffle", chunk), ("row shuffle", row)):
        m = mixing(batches, rows)
        print(
            f"| {name} | {m['mean move']:.3f} | {m['median move']:.3f} | {m['p90 move']:.3f} | "
            f"{m['consecutive']:.3f} | {m['cross-file pairs']:.3f} |"
        )


if __name__ == "__main__":
    main()
