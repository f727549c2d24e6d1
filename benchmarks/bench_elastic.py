"""Elastic order's price: bytes read over bytes needed and throughput against the default order.

For one rank (rank 0) of ``R`` in (1, 4) ranks and ``num_workers`` in (0, 2), an epoch is
read three ways, interleaved, medians of ``--repeats`` runs:

* ``raw``: a pyarrow loop over the rank's share of the files (``files[rank::R]``), the
  reference of every ratio;
* ``raw streams``: the no-library floor of elastic order. The same files as ``C / R``
  streams (contiguous runs of their row groups) read side by side by pyarrow in batches of
  ``STREAM_READ_ROWS`` rows, every batch joined from ``batch_size * R / C`` rows of each
  (one concatenation per batch), then converted as ``raw`` converts;
* ``raw one stream``: the same loop over one stream (the rank's row groups in order,
  each batch a slice): ``raw streams`` over it is the floor's price of reading
  side by side;
* ``default``: the loader in the default order;
* ``elastic``: the loader with ``canonical_ranks=C`` (``--canonical``, default 16), the
  same global batch (``--global-batch`` rows, ``batch_size = global / R``).

Bytes: what the loader's metrics count as read from storage (local Parquet: the column
chunks read; a row group cut between two readers is read by both) over the bytes the
rank's rows need (the dataset's column chunks times the rank's share of the rows).

Run: ``python benchmarks/bench_elastic.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import common
from torch_dataloader_utils import create_dataloader


def raw_loop(files: Sequence[Path], columns: list[str], batch_size: int) -> int:
    """The hand-written baseline over ``files``; returns the number of rows read."""
    rows = 0
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=columns):
            out = {n: torch.from_numpy(c.to_numpy()) for n, c in zip(b.schema.names, b.columns, strict=True)}
            rows += len(out["id"])
    return rows


STREAM_READ_ROWS = 32768
"""Rows per decoded batch of every stream of ``raw streams`` (the loader's size for them)."""


def raw_streams_loop(files: Sequence[Path], columns: list[str], batch_size: int, streams: int) -> int:
    """The hand-written floor of elastic order: ``files`` as ``streams`` runs of row groups, side by side."""
    per = batch_size // streams
    groups = [(f, g) for f in files for g in range(pq.ParquetFile(f).metadata.num_row_groups)]

    def cut(run: Sequence[tuple[Path, int]]) -> Iterator[pa.RecordBatch]:
        """One stream's rows in slices of ``per`` rows (a slice across two decoded batches joined)."""
        held: list[pa.RecordBatch] = []
        count = 0
        for f in dict.fromkeys(f for f, _ in run):
            mine = [g for path, g in run if path == f]
            for b in pq.ParquetFile(f).iter_batches(STREAM_READ_ROWS, row_groups=mine, columns=columns):
                at = 0
                while at < b.num_rows:
                    take = min(per - count, b.num_rows - at)
                    held.append(b.slice(at, take))
                    count += take
                    at += take
                    if count == per:
                        yield held[0] if len(held) == 1 else pa.concat_batches(held)
                        held, count = [], 0
        if held:
            yield pa.concat_batches(held)

    runs = [groups[i * len(groups) // streams : (i + 1) * len(groups) // streams] for i in range(streams)]
    rows = 0
    for parts in itertools.zip_longest(*(cut(r) for r in runs)):  # uneven only when tiny (--quick)
        b = pa.concat_batches([p for p in parts if p is not None])
        out = {n: torch.from_numpy(c.to_numpy()) for n, c in zip(b.schema.names, b.columns, strict=True)}
        rows += len(out["id"])
    return rows


def column_bytes(files: Sequence[Path], columns: list[str]) -> int:
    """Compressed bytes of the column chunks of ``columns`` in every row group of ``files``."""
    total = 0
    for f in files:
        meta = pq.ParquetFile(f).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                if group.column(c).path_in_schema in columns:
                    total += group.column(c).total_compressed_size
    return total


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--canonical", type=int, default=16)
    p.add_argument("--global-batch", type=int, default=1024)
    args = p.parse_args(argv)
    spec = common.spec_from_args(args)
    files = common.ensure_dataset(spec, args.data_dir)
    columns = common.NUMERIC_COLUMNS
    needed_all = column_bytes(files, columns)
    results, md_rows = [], []
    for ranks in args.ranks:
        size = args.global_batch // ranks
        raw = common.Series("raw", {"num_ranks": ranks, "num_workers": 0})
        floor = common.Series("raw streams", {"num_ranks": ranks, "num_workers": 0})
        single = common.Series("raw one stream", {"num_ranks": ranks, "num_workers": 0})
        per_rank = args.canonical // ranks
        runs: list[tuple[common.Series, Callable[[], int]]] = [
            (raw, lambda r=ranks, b=size: raw_loop(files[::r], columns, b)),
            (floor, lambda r=ranks, b=size, n=per_rank: raw_streams_loop(files[::r], columns, b, n)),
            (single, lambda r=ranks, b=size: raw_streams_loop(files[::r], columns, b, 1)),
        ]
        loaders: dict[tuple[str, int], tuple[common.Series, Any]] = {}
        for workers in args.workers:
            for order, extra in (("default", {}), ("elastic", {"canonical_ranks": args.canonical})):
                loader, _ = create_dataloader(
                    str(files[0].parent),
                    columns=columns,
                    batch_size=size,
                    num_workers=workers,
                    num_ranks=ranks,
                    rank=0,
                    shuffle=True,
                    **extra,
                )
                s = common.Series(order, {"num_ranks": ranks, "num_workers": workers})

                def run(ld: Any = loader, series: common.Series = s) -> int:
                    ld.dataset.reset_metrics()
                    rows = sum(len(b["id"]) for b in ld)
                    series.extra["bytes_fetched"] = ld.metrics().total.bytes_fetched
                    return rows

                runs.append((s, run))
                loaders[(order, workers)] = (s, loader)
        common.interleave(runs, args.repeats)
        for hand in (raw, floor, single):
            vs_raw = raw.median_s / hand.median_s
            vs_single = single.median_s / hand.median_s  # the floor: streams side by side vs one
            results.append({**common.series_json(hand), "ratio_vs_raw": vs_raw, "vs_one_stream": vs_single})
            rate, median = f"{hand.rows_per_s / 1e6:.2f} M", f"{hand.median_s:.3f}"
            ratios = [f"{vs_raw:.2f}x", f"({vs_single:.2f}x)"]
            md_rows.append([ranks, 0, hand.name, median, rate, *ratios, "", ""])
            print(md_rows[-1], flush=True)
        for (order, workers), (s, _) in loaders.items():
            needed = needed_all * s.rows / spec.rows
            default = loaders[("default", workers)][0]
            entry = common.series_json(s)
            entry.update(
                ratio_vs_raw=raw.median_s / s.median_s,
                bytes_read_over_needed=s.extra["bytes_fetched"] / needed,
                throughput_vs_default=default.median_s / s.median_s,
                bytes_vs_default=s.extra["bytes_fetched"] / default.extra["bytes_fetched"],
            )
            results.append(entry)
            md_rows.append(
                [
                    ranks,
                    workers,
                    order,
                    f"{s.median_s:.3f}",
                    f"{s.rows_per_s / 1e6:.2f} M",
                    f"{entry['ratio_vs_raw']:.2f}x",
                    f"{entry['throughput_vs_default']:.2f}x",
                    f"{entry['bytes_read_over_needed']:.3f}",
                    f"{entry['bytes_vs_default']:.3f}",
                ]
            )
            print(md_rows[-1], flush=True)
    info = common.machine()
    payload = {
        "benchmark": "elastic_order",
        "command": common.command_line(),
        "dataset": {**spec.__dict__, "columns": columns},
        "canonical_ranks": args.canonical,
        "global_batch": args.global_batch,
        "repeats": args.repeats,
        "machine": info,
        "results": results,
    }
    md = (
        f"Dataset: {spec.rows:,} rows, {spec.files} files, row groups of {spec.row_group_size:,} rows, "
        f"numeric columns; rank 0 of num_ranks, shuffle=True, global batch {args.global_batch} rows, "
        f"canonical_ranks={args.canonical}; {args.repeats} interleaved runs, medians.\n"
        f"Machine: {info['cpus']} CPUs, Python {info['python']}, torch {info['torch']}, pyarrow "
        f"{info['pyarrow']}; load average at start {info['loadavg_at_start']}.\n\n"
        + common.table(
            [
                "num_ranks",
                "num_workers",
                "order",
                "median s",
                "rows/s",
                "vs raw",
                "throughput vs default (raw rows: vs raw one stream)",
                "bytes read / needed",
                "bytes vs default",
            ],
            md_rows,
        )
    )
    common.write_results("bench_elastic", payload, md, args.out_dir)
    return payload


if __name__ == "__main__":
    main()
