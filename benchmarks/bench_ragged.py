"""Ragged columns: a string and a ``list<int32>`` column against the Arrow-layout raw loop.

The raw loop hands over Arrow's own layout, zero-copy, the cheapest a hand-written loop
can be (the ceiling)::

    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size, columns=columns):
            out = {"id": torch.from_numpy(b["id"].to_numpy()),
                   "tokens": (values tensor, offsets tensor),     # list<int32>
                   "text": (bytes tensor, offsets tensor)}        # string

The loader runs with its defaults (``tokens`` as a jagged nested tensor, ``text`` as
``list[str]``) and with other layouts (``--configs``), at ``num_workers`` 0 and 2.
Ratios are against the single-process raw loop, medians of interleaved runs; the time
from ``iter(loader)`` to the first batch is reported too (its median over the runs).

Run: ``python benchmarks/bench_ragged.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import common
from torch_dataloader_utils import create_dataloader

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

COLUMNS = ["id", "tokens", "text"]
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},  # jagged tokens, list[str] text
    "bytes": {"strings": "bytes"},  # jagged tokens, text as bytes + offsets: all Arrow layout
    "offsets": {"ragged": "offsets", "strings": "bytes"},
    "padded": {"ragged": "padded", "strings": "bytes"},
    "arrow_text": {"strings": "arrow"},
}


def ensure_ragged(root: Path, rows: int, files: int, row_group: int, max_tokens: int) -> list[Path]:
    """Write (once) ``files`` Parquet files: ``id``, ``tokens`` (list<int32>, 0..max_tokens
    items) and ``text`` (a string of 8-24 characters)."""
    target = root / f"ragged_rows{rows}_files{files}_rg{row_group}_tok{max_tokens}"
    done = target / "_SUCCESS"
    if done.exists():
        return sorted(target.glob("part-*.parquet"))
    target.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
    start = 0
    paths = []
    for i in range(files):
        n = rows // files + (1 if i < rows % files else 0)
        lengths = rng.integers(0, max_tokens + 1, n)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        text_lengths = rng.integers(8, 25, n)
        text_offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(text_lengths, out=text_offsets[1:])
        chars = alphabet[rng.integers(0, len(alphabet), int(text_offsets[-1]))]
        text = pa.StringArray.from_buffers(n, pa.py_buffer(text_offsets), pa.py_buffer(chars.tobytes()))
        ids = pa.array(np.arange(start, start + n, dtype=np.int64))
        path = target / f"part-{i:04d}.parquet"
        pq.write_table(pa.table({"id": ids, "tokens": tokens, "text": text}), path, row_group_size=row_group)
        paths.append(path)
        start += n
    done.write_text("ok\n")
    return paths


def _buffer_tensors(col: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if pa.types.is_string(col.type):
        bufs = col.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int32, count=len(col) + 1, offset=col.offset * 4)
        data = np.frombuffer(bufs[2], dtype=np.uint8)
        return torch.from_numpy(data), torch.from_numpy(offsets)
    return torch.from_numpy(col.values.to_numpy()), torch.from_numpy(col.offsets.to_numpy())


def raw_loop(files: Sequence[Path], batch_size: int) -> int:
    """The Arrow-layout baseline; returns the number of rows read."""
    rows = 0
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=COLUMNS):
            out = {
                "id": torch.from_numpy(b.column(0).to_numpy()),
                "tokens": _buffer_tensors(b.column(1)),
                "text": _buffer_tensors(b.column(2)),
            }
            rows += len(out["id"])
    return rows


class RawShards(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The raw loop inside DataLoader workers: worker ``k`` reads files ``k::num_workers``.

    No library code: the floor of what any loader built on ``torch.utils.data`` worker
    processes pays on this machine (forking workers, torch's own pickling of the tensors
    through shared memory, the main process receiving them).
    """

    def __init__(self, files: Sequence[Path], batch_size: int) -> None:
        self.files = list(files)
        self.batch_size = batch_size

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        for f in self.files[k::n]:
            for b in pq.ParquetFile(f).iter_batches(batch_size=self.batch_size, columns=COLUMNS):
                yield {
                    "id": torch.from_numpy(b.column(0).to_numpy()),
                    "tokens": _buffer_tensors(b.column(1)),
                    "text": _buffer_tensors(b.column(2)),
                }


class LoaderRun:
    """One loader configuration: each call is a full pass, recording the first batch's delay."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.first: list[float] = []

    def __call__(self) -> int:
        rows = 0
        t0 = time.perf_counter()
        it = iter(self.loader)
        for i, batch in enumerate(it):
            if i == 0:
                self.first.append(time.perf_counter() - t0)
            rows += len(batch["id"])
        return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = common.base_parser(__doc__.splitlines()[0])
    p.set_defaults(rows=500_000, files=4, row_group_size=32_768)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--max-tokens", type=int, default=64, help="list lengths are uniform in 0..max")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--configs", nargs="+", default=["default", "bytes"], choices=list(CONFIGS))
    p.add_argument(
        "--persistent",
        action="store_true",
        help="loaders with workers keep them (persistent_workers=True, started by the warm-up "
        "round): steady-state epochs; the first batch then excludes starting workers",
    )
    p.add_argument(
        "--raw-workers",
        action="store_true",
        help="also run the raw loop inside DataLoader workers (no library code): the ceiling "
        "of any worker-process loader on this machine",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.files, args.row_group_size, args.repeats = 100_000, 2, 16_384, min(args.repeats, 3)
    files = ensure_ragged(args.data_dir, args.rows, args.files, args.row_group_size, args.max_tokens)
    data_dir = files[0].parent
    bs = args.batch_size

    raw = common.Series("raw", {"batch_size": bs, "num_workers": 0})
    runs: list[tuple[common.Series, Callable[[], int]]] = [(raw, lambda: raw_loop(files, bs))]
    loaders: list[tuple[common.Series, LoaderRun]] = []
    for w in [w for w in args.workers if w > 0 and args.raw_workers]:
        raw_loader = torch.utils.data.DataLoader(
            RawShards(files, bs), batch_size=None, num_workers=w, persistent_workers=args.persistent
        )
        run = LoaderRun(raw_loader)
        s = common.Series(
            "raw_dataloader", {"config": "raw in DataLoader workers", "batch_size": bs, "num_workers": w}
        )
        runs.append((s, run))
        loaders.append((s, run))
    for config in args.configs:
        for w in args.workers:
            loader, _ = create_dataloader(
                str(data_dir),
                columns=COLUMNS,
                batch_size=bs,
                num_workers=w,
                persistent_workers=args.persistent and w > 0,
                **CONFIGS[config],
            )
            run = LoaderRun(loader)
            s = common.Series(
                "loader", {"config": config, "batch_size": bs, "num_workers": w, **CONFIGS[config]}
            )
            runs.append((s, run))
            loaders.append((s, run))
    common.interleave(runs, args.repeats)

    results = []
    md_rows = []
    for s, run in [(raw, None), *loaders]:
        if s.rows != args.rows:
            raise AssertionError(f"{s.name} {s.params} read {s.rows} rows, expected {args.rows}")
        ratio = raw.median_s / s.median_s
        entry = common.series_json(s)
        entry["ratio_vs_raw"] = ratio
        first = statistics.median(run.first[-args.repeats :]) if run else None
        entry["first_batch_s"] = first
        results.append(entry)
        md_rows.append(
            [
                "raw (Arrow layout)" if run is None else s.params["config"],
                s.params["num_workers"],
                f"{s.median_s:.3f}",
                f"{s.rows_per_s / 1e6:.2f} M",
                f"{ratio:.2f}x",
                f"{min(s.seconds):.3f}-{max(s.seconds):.3f}",
                "-" if first is None else f"{first:.3f}",
                f"{s.median_cpu_s:.2f}",
            ]
        )
        print(md_rows[-1], flush=True)
    info = common.machine()
    payload = {
        "benchmark": "ragged_throughput",
        "command": common.command_line(),
        "dataset": {
            "rows": args.rows,
            "files": args.files,
            "row_group_size": args.row_group_size,
            "max_tokens": args.max_tokens,
            "path": str(data_dir),
        },
        "configs": {c: CONFIGS[c] for c in args.configs},
        "persistent_workers": args.persistent,
        "repeats": args.repeats,
        "machine": info,
        "results": results,
    }
    md = (
        f"Dataset: {args.rows:,} rows (`id` int64, `tokens` list<int32> of 0-{args.max_tokens} items, "
        f"`text` string of 8-24 characters), {args.files} files, row groups of {args.row_group_size:,} "
        f"rows; batch size {bs}; {args.repeats} interleaved runs per configuration, medians"
        f"{'; persistent workers (steady state)' if args.persistent else ''}.\n"
        f"Machine: {info['cpus']} CPUs, {info['processor']}, Python {info['python']}, torch "
        f"{info['torch']}, pyarrow {info['pyarrow']}; load average at start {info['loadavg_at_start']}.\n\n"
        + common.table(
            ["config", "num_workers", "median s", "rows/s", "vs raw", "range s", "first batch s", "CPU s"],
            md_rows,
        )
    )
    name = "bench_ragged_persistent" if args.persistent else "bench_ragged"
    common.write_results(name, payload, md, args.out_dir)
    return payload


if __name__ == "__main__":
    main()
