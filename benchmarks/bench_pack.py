"""Sequence packing against reading the same token column as jagged (and a raw pyarrow loop).

Documents of 0 to ``--max-tokens`` tokens (uniform), a ``list<int32>`` column, are read
three ways, each a full pass:

* ``raw``: a pyarrow loop, ``iter_batches`` of the column, values and offsets to tensors
  (Arrow's layout, zero-copy: the ceiling);
* ``jagged``: ``create_dataloader`` of the column as it is (a jagged nested tensor);
* ``packed``: ``create_dataloader(pack_sequences=SequencePack("tokens", seq_len))``: every
  batch's documents packed into rows of ``seq_len`` tokens with ``position_ids`` and
  ``cu_seqlens``, with ``equal_batches='pad'``.

Rows/s count documents. The targets are ``packed >= 0.8x jagged`` in documents per
second and padding ``<= 1%`` of the packed tokens (only each batch's last row is
padded). Padding is counted exactly: packed slots minus the documents' tokens. Memory:
each reader's pass in a fresh process (peak RSS growth of the main process, and the
largest worker's peak), as ``bench_memory.py`` measures it.

Run: ``python benchmarks/bench_pack.py`` (``--quick`` for a smoke run; the full run
writes 1M documents, about 4 GB).
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
from torch_dataloader_utils import SequencePack, create_dataloader  # noqa: E402

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def ensure_documents(
    root: Path, docs: int, files: int, row_group: int, max_tokens: int
) -> tuple[list[Path], int]:
    """Write (once) ``files`` Parquet files of ``docs`` documents; returns them and the token count."""
    target = root / f"pack_docs{docs}_files{files}_rg{row_group}_tok{max_tokens}"
    done = target / "_SUCCESS"
    if done.exists():
        return sorted(target.glob("part-*.parquet")), int(done.read_text())
    target.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    total = 0
    for i in range(files):
        n = docs // files + (1 if i < docs % files else 0)
        lengths = rng.integers(0, max_tokens + 1, n)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        pq.write_table(
            pa.table({"tokens": tokens}), target / f"part-{i:04d}.parquet", row_group_size=row_group
        )
        total += int(offsets[-1])
    done.write_text(str(total))
    return sorted(target.glob("part-*.parquet")), total


def raw_loop(files: Sequence[Path], batch_size: int) -> int:
    docs = 0
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=["tokens"]):
            col = b.column(0)
            out = (torch.from_numpy(col.values.to_numpy()), torch.from_numpy(col.offsets.to_numpy()))
            docs += len(out[1]) - 1
    return docs


class Packed:
    """A loader's pass: documents read, and packed rows seen (for the padding)."""

    def __init__(self, loader: Any, packed: bool) -> None:
        self.loader = loader
        self.packed = packed
        self.rows = 0

    def __call__(self) -> int:
        docs = rows = 0
        self.loader.dataset.reset_metrics()
        for batch in self.loader:
            if self.packed:
                rows += batch["tokens"].shape[0]
            else:
                docs += batch["tokens"].size(0)
        self.rows = rows
        return self.loader.metrics().total.rows_read if self.packed else docs


def build(kind: str, data_dir: str, batch_size: int, workers: int, seq_len: int) -> Any:
    options: dict[str, Any] = {"batch_size": batch_size, "num_workers": workers, "equal_batches": "pad"}
    if kind == "packed":
        options["pack_sequences"] = SequencePack("tokens", seq_len=seq_len)
    return create_dataloader(data_dir, **options)[0]


def child(kind: str, data_dir: str, batch_size: int, workers: int, seq_len: int) -> None:
    """One pass in this process; prints the memory figures as a JSON line."""
    files = sorted(Path(data_dir).glob("part-*.parquet"))
    run = (
        None
        if kind == "raw"
        else Packed(build(kind, data_dir, batch_size, workers, seq_len), kind == "packed")
    )
    print(json.dumps(common.pass_memory((lambda: raw_loop(files, batch_size)) if run is None else run)))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = common.base_parser(__doc__.splitlines()[0])
    p.set_defaults(rows=1_000_000, files=8, row_group_size=16_384, repeats=3)
    p.add_argument("--max-tokens", type=int, default=2048, help="document lengths are uniform in 0..max")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=256, help="documents per batch")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--memory-repeats", type=int, default=1, help="fresh-process passes per config for memory")
    p.add_argument("--child", nargs=5, metavar=("KIND", "DIR", "BS", "WORKERS", "SEQ"), help="(internal)")
    args = p.parse_args(argv)
    if args.child:
        kind, data_dir, bs, workers, seq = args.child
        child(kind, data_dir, int(bs), int(workers), int(seq))
        return {}
    if args.quick:
        args.rows, args.files, args.repeats = 50_000, 4, min(args.repeats, 3)
    files, tokens = ensure_documents(
        args.data_dir, args.rows, args.files, args.row_group_size, args.max_tokens
    )
    data_dir = str(files[0].parent)
    bs = args.batch_size
    raw = common.Series("raw", {"batch_size": bs, "num_workers": 0})
    runs: list[tuple[common.Series, Callable[[], int]]] = [(raw, lambda: raw_loop(files, bs))]
    entries = []
    for w in args.workers:
        for kind in ("jagged", "packed"):
            run = Packed(build(kind, data_dir, bs, w, args.seq_len), kind == "packed")
            s = common.Series(kind, {"batch_size": bs, "num_workers": w, "seq_len": args.seq_len})
            runs.append((s, run))
            entries.append((w, kind, s, run))
    common.interleave(runs, args.repeats)
    mem = common.fresh_process_memory(
        {
            f"{k}/{w}": [sys.executable, __file__, "--child", k, data_dir, str(bs), str(w), str(args.seq_len)]
            for k, w in [("raw", 0), *[(k, w) for w, k, _, _ in entries]]
        },
        args.memory_repeats,
    )

    jagged = {w: s for w, k, s, _ in entries if k == "jagged"}
    md_rows = [["raw pyarrow loop", 0, f"{raw.median_s:.2f}", f"{raw.rows_per_s / 1e3:.0f} k", "-", "-", "-",
                f"{mem['raw/0']['growth_mib']:.0f}", "-"]]  # fmt: skip
    results: list[dict[str, Any]] = [{**common.series_json(raw), "memory": mem["raw/0"]}]
    for w, kind, s, run in entries:
        if s.rows != args.rows:
            raise AssertionError(f"{kind} nw={w} read {s.rows} documents, expected {args.rows}")
        m = mem[f"{kind}/{w}"]
        pad = (run.rows * args.seq_len - tokens) / (run.rows * args.seq_len) if kind == "packed" else None
        vs_jagged = s.rows_per_s / jagged[w].rows_per_s
        results.append(
            {
                **common.series_json(s),
                "vs_raw": s.rows_per_s / raw.rows_per_s,
                "vs_jagged": vs_jagged,
                "packed_rows": run.rows if kind == "packed" else None,
                "pad_fraction": pad,
                "memory": m,
            }
        )
        md_rows.append(
            [
                kind,
                w,
                f"{s.median_s:.2f}",
                f"{s.rows_per_s / 1e3:.0f} k",
                f"{s.rows_per_s / raw.rows_per_s:.2f}x",
                f"{vs_jagged:.2f}x" if kind == "packed" else "-",
                "-" if pad is None else f"{100 * pad:.3f}%",
                f"{m['growth_mib']:.0f}",
                "-" if m["worker_peak_mib"] is None else f"{m['worker_peak_mib']:.0f}",
            ]
        )
    info = common.machine()
    payload = {
        "benchmark": "pack",
        "command": common.command_line(),
        "dataset": {
            "documents": args.rows,
            "tokens": tokens,
            "files": args.files,
            "row_group_size": args.row_group_size,
            "max_tokens": args.max_tokens,
        },
        "seq_len": args.seq_len,
        "repeats": args.repeats,
        "machine": info,
        "results": results,
    }
    md = (
        f"Dataset: {args.rows:,} documents of 0-{args.max_tokens} tokens (uniform; {tokens:,} int32 tokens) "
        f"in {args.files} files, row groups of {args.row_group_size:,}; {bs} documents per batch; packed "
        f"into "
        f"rows of {args.seq_len} tokens, equal_batches='pad'; {args.repeats} interleaved runs, medians; "
        f"rows/s are documents/s. Memory: peak RSS growth of the main process during a pass, and the "
        f"largest worker's peak, in fresh processes.\n"
        f"Machine: {info['cpus']} CPUs, Python {info['python']}, torch {info['torch']}, pyarrow "
        f"{info['pyarrow']}; load average at start {info['loadavg_at_start']}.\n\n"
        + common.table(
            [
                "reader",
                "num_workers",
                "median s",
                "docs/s",
                "vs raw",
                "packed / jagged",
                "padding",
                "main RSS +MiB",
                "worker peak MiB",
            ],
            md_rows,
        )
    )
    common.write_results("bench_pack", payload, md, args.out_dir)
    return payload


if __name__ == "__main__":
    main()
