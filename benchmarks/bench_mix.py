"""Mixing 4 sources against reading one source of the same total size (and a raw pyarrow loop).

The dataset of ``common.ensure_dataset`` (numeric columns) is read three ways, each a
full pass over all its rows:

* ``raw``: a pyarrow loop over every file (``iter_batches``, each column to a tensor);
* ``one source``: ``create_dataloader`` over the whole directory;
* ``mix of 4``: ``create_mixed_dataloader`` over the same files split into 4 sources
  of 6, 5, 3 and 2 files, weighted 6:5:3:2, so that one epoch of the mix reads every
  source once: the same rows, from 4 sources, every batch mixing them.

Figures are medians of interleaved runs at ``num_workers`` 0 and 2 (``--shuffle`` for
shuffled reads); the target is ``mix / one source <= 1.1`` in seconds per pass. Memory:
each reader's pass in a fresh process, the peak RSS above its RSS before the loop (and,
with workers, the largest worker's peak), as ``bench_memory.py`` measures it.

Run: ``python benchmarks/bench_mix.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import common  # noqa: E402
from torch_dataloader_utils import create_dataloader, create_mixed_dataloader  # noqa: E402

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

COLUMNS = list(common.NUMERIC_COLUMNS)
SPLIT = (6, 5, 3, 2)
"""Files per source (of 16): the sources' sizes, and their weights."""


def sources_of(files: Sequence[Path]) -> list[list[str]]:
    """The files cut into ``len(SPLIT)`` sources in the proportions of ``SPLIT``."""
    counts = [len(files) * n // sum(SPLIT) for n in SPLIT]
    counts[0] += len(files) - sum(counts)
    out, start = [], 0
    for n in counts:
        out.append([str(f) for f in files[start : start + n]])
        start += n
    return out


def _tensors(column: Any) -> Any:
    """A column as tensors without a copy: numbers, or a string's bytes and offsets."""
    if pa.types.is_string(column.type):
        buffers = column.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int32, count=len(column) + 1, offset=column.offset * 4)
        return torch.from_numpy(np.frombuffer(buffers[2], dtype=np.uint8)), torch.from_numpy(offsets)
    return torch.from_numpy(column.to_numpy())


def raw_loop(files: Sequence[Path], batch_size: int) -> int:
    rows = 0
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=COLUMNS):
            out = {name: _tensors(b.column(i)) for i, name in enumerate(COLUMNS)}
            rows += len(out["id"])
    return rows


def raw_mix_loop(files: Sequence[Path], batch_size: int) -> int:
    """The no-library floor of a mix: the 4 sources read side by side by hand, each batch
    joined from each source's share of it (one copy, as the mix makes), as tensors."""
    groups = sources_of(files)
    sizes = [len(g) for g in groups]
    share = [batch_size * n // sum(sizes) for n in sizes]
    share[0] += batch_size - sum(share)

    def stream(paths: Sequence[str]) -> Any:
        for f in paths:
            yield from pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=COLUMNS)

    streams = [stream(g) for g in groups]
    current: list[Any] = [None] * len(groups)
    offset = [0] * len(groups)
    rows = 0
    while True:
        parts = []
        for i, it in enumerate(streams):
            want = share[i]
            while want > 0:
                if current[i] is None or offset[i] >= current[i].num_rows:
                    current[i], offset[i] = next(it, None), 0
                    if current[i] is None:
                        break
                take = min(want, current[i].num_rows - offset[i])
                parts.append(current[i].slice(offset[i], take))
                offset[i] += take
                want -= take
        if not parts:
            return rows
        joined = pa.concat_batches(parts)
        out = {name: _tensors(joined.column(i)) for i, name in enumerate(COLUMNS)}
        rows += len(out["id"])


def loader_loop(loader: Any) -> int:
    return sum(len(batch["id"]) for batch in loader)


def build(kind: str, files: Sequence[Path], batch_size: int, workers: int, shuffle: bool) -> Any:
    options = {
        "columns": COLUMNS,
        "batch_size": batch_size,
        "num_workers": workers,
        "shuffle": shuffle,
        "strings": "bytes",  # Arrow's layout, as the raw loop
    }
    if kind == "one":
        return create_dataloader([str(f) for f in files], **options)[0]
    groups = sources_of(files)
    weights = [len(g) for g in groups]
    return create_mixed_dataloader([{"path": g} for g in groups], weights, **options)[0]


def child(kind: str, data_dir: str, batch_size: int, workers: int, shuffle: bool) -> None:
    """One pass in this process; prints the memory figures as a JSON line."""
    files = sorted(Path(data_dir).glob("part-*.parquet"))
    loader = None if kind == "raw" else build(kind, files, batch_size, workers, shuffle)
    run = (lambda: raw_loop(files, batch_size)) if loader is None else (lambda: loader_loop(loader))
    print(json.dumps(common.pass_memory(run)))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = common.base_parser(__doc__.splitlines()[0])
    p.set_defaults(rows=4_000_000, files=16, row_group_size=65_536)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--shuffle", action="store_true", help="shuffled reads (row mixing in every source)")
    p.add_argument("--columns", choices=list(common.COLUMN_SETS), default="numeric", help="columns read")
    p.add_argument("--memory-repeats", type=int, default=2, help="fresh-process passes per config for memory")
    p.add_argument("--child", nargs=4, metavar=("KIND", "DIR", "BS", "WORKERS"), help="(internal)")
    args = p.parse_args(argv)
    COLUMNS[:] = common.COLUMN_SETS[args.columns]
    if args.child:
        kind, data_dir, bs, workers = args.child
        child(kind, data_dir, int(bs), int(workers), args.shuffle)
        return {}
    if args.quick:
        args.rows, args.files, args.row_group_size, args.repeats = 400_000, 16, 16_384, min(args.repeats, 3)
    spec = common.DatasetSpec(rows=args.rows, files=args.files, row_group_size=args.row_group_size)
    files = common.ensure_dataset(spec, args.data_dir)
    bs = args.batch_size
    raw = common.Series("raw", {"batch_size": bs, "num_workers": 0})
    raw_mix = common.Series("raw mix", {"batch_size": bs, "num_workers": 0})
    runs: list[tuple[common.Series, Callable[[], int]]] = [
        (raw, lambda: raw_loop(files, bs)),
        (raw_mix, lambda: raw_mix_loop(files, bs)),
    ]
    pairs = []
    for w in args.workers:
        one = common.Series("one source", {"batch_size": bs, "num_workers": w, "shuffle": args.shuffle})
        mix = common.Series("mix of 4", {"batch_size": bs, "num_workers": w, "shuffle": args.shuffle})
        one_loader = build("one", files, bs, w, args.shuffle)
        mix_loader = build("mix", files, bs, w, args.shuffle)
        runs += [(one, lambda ld=one_loader: loader_loop(ld)), (mix, lambda ld=mix_loader: loader_loop(ld))]
        pairs.append((w, one, mix))
    common.interleave(runs, args.repeats)
    configs = [("raw", 0)] + [(k, w) for w in args.workers for k in ("one", "mix")]
    mem = common.fresh_process_memory(
        {
            f"{k}/{w}": [sys.executable, __file__, "--child", k, str(files[0].parent), str(bs), str(w)]
            + (["--shuffle"] if args.shuffle else [])
            + ["--columns", args.columns]
            for k, w in configs
        },
        args.memory_repeats,
    )

    md_rows = [["raw pyarrow loop", 0, f"{raw.median_s:.3f}", f"{raw.rows_per_s / 1e6:.2f} M", "1.00x", "-",
                f"{mem['raw/0']['growth_mib']:.0f}", "-"]]  # fmt: skip
    results: list[dict[str, Any]] = [{**common.series_json(raw), "memory": mem["raw/0"]}]
    floor = raw.rows_per_s / raw_mix.rows_per_s
    results.append({**common.series_json(raw_mix), "mix_cost_over_one": floor})
    shown = f"{floor:.2f}x"
    md_rows.append(["pyarrow, 4 sources mixed by hand (floor)", 0, f"{raw_mix.median_s:.3f}",
                    f"{raw_mix.rows_per_s / 1e6:.2f} M", shown, shown, "-", "-"])  # fmt: skip
    for w, one, mix in pairs:
        # The mix's last batch is filled from the other sources: up to a batch more rows.
        if one.rows != args.rows or not args.rows <= mix.rows < args.rows + bs * max(1, w):
            raise AssertionError(f"rows read: one source {one.rows}, mix {mix.rows}, expected {args.rows}")
        cost = one.rows_per_s / mix.rows_per_s
        for s, kind in ((one, "one"), (mix, "mix")):
            m = mem[f"{kind}/{w}"]
            entry = {
                **common.series_json(s),
                "cost_vs_raw": raw.rows_per_s / s.rows_per_s,
                "mix_cost_over_one": cost if s is mix else None,
                "memory": m,
            }
            results.append(entry)
            md_rows.append(
                [
                    s.name,
                    w,
                    f"{s.median_s:.3f}",
                    f"{s.rows_per_s / 1e6:.2f} M",
                    f"{raw.rows_per_s / s.rows_per_s:.2f}x",
                    f"{cost:.2f}x" if s is mix else "-",
                    f"{m['growth_mib']:.0f}",
                    "-" if m["worker_peak_mib"] is None else f"{m['worker_peak_mib']:.0f}",
                ]
            )
    info = common.machine()
    payload = {
        "benchmark": "mix",
        "command": common.command_line(),
        "dataset": {"rows": args.rows, "files": args.files, "row_group_size": args.row_group_size},
        "sources": [len(g) for g in sources_of(files)],
        "shuffle": args.shuffle,
        "columns": COLUMNS,
        "repeats": args.repeats,
        "machine": info,
        "results": results,
    }
    md = (
        f"Dataset: {args.rows:,} rows of {len(COLUMNS)} columns ({args.columns}; strings as bytes + "
        f"offsets) in {args.files} files (row groups of "
        f"{args.row_group_size:,}); the mix reads them as 4 sources of {[len(g) for g in sources_of(files)]} "
        f"files weighted by their size (one epoch of the mix = every row once, and up to a batch more: "
        f"its last batch is filled from the other sources); cost = seconds per row; batch size {bs}; "
        f"shuffle {'on' if args.shuffle else 'off'}; {args.repeats} interleaved runs, medians. Memory: "
        f"peak RSS growth of the main process during a pass, and the largest worker's peak, in fresh "
        f"processes.\n"
        f"Machine: {info['cpus']} CPUs, Python {info['python']}, torch {info['torch']}, pyarrow "
        f"{info['pyarrow']}; load average at start {info['loadavg_at_start']}.\n\n"
        + common.table(
            [
                "reader",
                "num_workers",
                "median s",
                "rows/s",
                "cost vs raw",
                "mix cost / one source",
                "main RSS +MiB",
                "worker peak MiB",
            ],
            md_rows,
        )
    )
    name = (
        "bench_mix" + ("_shuffle" if args.shuffle else "") + ("" if args.columns == "numeric" else "_strings")
    )
    common.write_results(name, payload, md, args.out_dir)
    return payload


if __name__ == "__main__":
    main()
