"""Cost and mixing of the shuffles vs an unshuffled read, same run.

    python benchmarks/bench_shuffle.py [--rows 2000000] [--window 262144] [--repeats 5]
                                       [--split-rows 65536 | --split-rows 0] [--workers 0]

Times (medians of ``--repeats`` interleaved runs) of one epoch read with
``batch_size=1024``, torch output:

* ``pyarrow``: a raw ``ParquetFile.iter_batches`` loop over the files (reference);
* ``pyarrow, 65536-row reads``: the same loop reading 65,536 rows at a time, cut into
  ``batch_size`` slices (the floor's sequential reference);
* ``pyarrow, mixed by hand``: the floor of any row mixing, with no library code: the 8
  files read side by side with ``iter_batches`` (65,536 rows), and each round of 32,768
  rows (4,096 of every file) gathered with one Arrow ``take`` in a permutation drawn
  once, then cut into batches. Both run in one thread; ``mixed by hand / 65536-row
  reads`` is what the gather alone costs on this machine (printed below the table);
* ``chunk shuffle``: ``shuffle=True, row_mixing=None`` (chunk order only: rows of a
  chunk in file order), the unshuffled-rows baseline;
* ``row mixing (default)``: ``shuffle=True`` (``row_mixing=32768``);
* ``row mixing 131072``: ``shuffle=True, row_mixing=131072`` (larger rounds);
* ``row shuffle window``: ``shuffle=True, row_shuffle_window=W``.

Chunks are single row groups (``split_rows=65536``) or, with ``--split-rows 0``, the
default split (64 MiB of row groups: one chunk per file here).

Mixing, from the ``id`` column (ids are file order), against a uniform permutation of
the same rows cut into the same batches:

* ``same-file pairs``: the mean share of row pairs inside a batch that come from the
  same file (uniform: about 1 / files);
* ``neighbour corr``: the correlation of the source positions (ids) of consecutive
  output rows (uniform: about 0; file order: 1);
* ``consecutive``: the share of consecutive output rows that are consecutive in the file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils import create_dataloader

FILES = 8
BATCH = 1024
ROUND = 32768


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
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
            out.append(batch.column("id").to_numpy())
    return out


def raw_large(root: Path) -> list[np.ndarray]:
    """pyarrow reading 65,536 rows at a time, cut into ``BATCH``-row slices."""
    out = []
    for path in sorted(root.glob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65536):
            for i in range(0, batch.num_rows, BATCH):
                out.append(batch.slice(i, BATCH).column("id").to_numpy())
    return out


def raw_mixed(root: Path) -> list[np.ndarray]:
    """Row mixing written by hand: 8 files side by side, one ``take`` per round of 32,768 rows."""
    streams = [pq.ParquetFile(p).iter_batches(batch_size=65536) for p in sorted(root.glob("*.parquet"))]
    section = ROUND // len(streams)
    order = pa.array(np.random.default_rng(0).permutation(section * len(streams)))
    current: list[pa.RecordBatch | None] = [None] * len(streams)
    offsets = [0] * len(streams)
    out = []
    while True:
        parts = []
        for i, stream in enumerate(streams):
            got = 0
            while got < section:
                batch = current[i]
                if batch is None or offsets[i] >= batch.num_rows:
                    current[i], offsets[i] = next(stream, None), 0
                    if current[i] is None:
                        break
                    continue
                n = min(section - got, batch.num_rows - offsets[i])
                parts.append(batch.slice(offsets[i], n))
                offsets[i] += n
                got += n
        if not parts:
            return out
        table = pa.Table.from_batches(parts)
        idx = (
            order
            if table.num_rows == len(order)
            else pa.array(np.random.default_rng(1).permutation(table.num_rows))
        )
        mixed = table.take(idx).combine_chunks()
        for batch in mixed.to_batches(max_chunksize=BATCH):
            out.append(batch.column("id").to_numpy())


def ours(root: Path, split_rows: int, workers: int, **options: Any) -> list[np.ndarray]:
    split = {"split_rows": split_rows} if split_rows else {}
    loader, _ = create_dataloader(
        str(root), batch_size=BATCH, num_workers=workers, shuffle=True, shuffle_seed=1, **split, **options
    )
    return [batch["id"].numpy() for batch in loader]


def mixing(batches: list[np.ndarray], rows: int) -> dict[str, float]:
    ids = np.concatenate(batches)
    assert np.array_equal(np.sort(ids), np.arange(rows)), "every row exactly once"
    per = rows // FILES
    same = []
    for b in batches:
        n = len(b)
        if n < 2:
            continue
        counts = np.bincount(b // per, minlength=FILES).astype(np.float64)
        same.append(float((np.sum(counts * counts) - n) / (n * (n - 1))))
    return {
        "same-file pairs": float(np.mean(same)),
        "neighbour corr": float(np.corrcoef(ids[:-1], ids[1:])[0, 1]),
        "consecutive": float(np.mean(np.diff(ids) == 1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--window", type=int, default=262_144)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--split-rows", type=int, default=65536, help="0: the default split")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    rows = args.rows // FILES * FILES
    s, w = args.split_rows, args.workers
    configs: dict[str, Callable[[Path], list[np.ndarray]]] = {
        "pyarrow iter_batches": raw,
        "pyarrow, 65536-row reads": raw_large,
        "pyarrow, mixed by hand": raw_mixed,
        "chunk shuffle": lambda r: ours(r, s, w, row_mixing=None),
        "row mixing (default)": lambda r: ours(r, s, w),
        "row mixing 131072": lambda r: ours(r, s, w, row_mixing=131072),
        f"row shuffle window {args.window}": lambda r: ours(r, s, w, row_shuffle_window=args.window),
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    results: dict[str, list[np.ndarray]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write(root, rows)
        for name, fn in configs.items():  # warm-up
            results[name] = fn(root)
        for _ in range(args.repeats):
            for name, fn in configs.items():
                start = time.perf_counter()
                fn(root)
                times[name].append(time.perf_counter() - start)
    load = os.getloadavg()
    split = f"split_rows={s}" if s else "default split"
    print(
        f"rows={rows} files={FILES} row_group=65536 {split} batch={BATCH} num_workers={w} "
        f"repeats={args.repeats} loadavg={load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    base = statistics.median(times["chunk shuffle"])
    t_raw = statistics.median(times["pyarrow iter_batches"])
    perm = np.random.default_rng(0).permutation(rows)
    uniform = mixing([perm[i : i + BATCH] for i in range(0, rows, BATCH)], rows)
    cols = ["read", "median s", "vs pyarrow", "vs chunk shuffle"]
    cols += ["same-file pairs", "neighbour corr", "consecutive"]
    print("| " + " | ".join(cols) + " |")
    print("|---|---|---|---|---|---|---|")
    for name in configs:
        t = statistics.median(times[name])
        m = (
            mixing(results[name], rows)
            if name not in ("pyarrow iter_batches", "pyarrow, 65536-row reads")
            else None
        )
        cells = (
            "| - | - | -"
            if m is None
            else (f"| {m['same-file pairs']:.3f} | {m['neighbour corr']:.3f} | {m['consecutive']:.3f}")
        )
        print(f"| {name} | {t:.3f} | {t / t_raw:.2f}x | {t / base:.2f}x {cells} |")
    u = uniform
    print(
        f"| uniform permutation (reference) | - | - | - | {u['same-file pairs']:.3f} | "
        f"{u['neighbour corr']:.3f} | {u['consecutive']:.3f} |"
    )
    floor = statistics.median(times["pyarrow, mixed by hand"]) / statistics.median(
        times["pyarrow, 65536-row reads"]
    )
    mixed = statistics.median(times["row mixing (default)"]) / base
    print(
        f"floor of row mixing here (pyarrow mixed by hand / pyarrow 65536-row reads): {floor:.2f}x; "
        f"the library's row mixing / chunk shuffle: {mixed:.2f}x"
    )


if __name__ == "__main__":
    main()
