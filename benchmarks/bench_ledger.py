"""The training ledger's costs: bytes per rank, time to replay one step, --where, the loop's overhead.

    python benchmarks/bench_ledger.py bytes     # 1M steps over 100 passes: bytes per rank (goal <= 1 MB)
    python benchmarks/bench_ledger.py replay    # one step at 1M chunks x 1,024 ranks (goal <= 1 s)
    python benchmarks/bench_ledger.py where     # --where over 10M rows against a full scan, same run
    python benchmarks/bench_ledger.py overhead  # a loader epoch with and without ledger=, interleaved
    python benchmarks/bench_ledger.py all --quick

* ``bytes``: a rank's file after 100 passes of 10,000 steps (a pass record and an end
  record each, a resume every 10 passes); the shared files (config, the files manifest
  of 1M chunks, the resume states) are reported apart: they are written once.
* ``replay``: ``Ledger(DIR).batch(step, rank)`` in a fresh process (imports excluded:
  the time from opening the ledger to the rows of the step), for a rank of 1,024 with 8
  workers, shuffle and row mixing on, over synthetic metadata (``bench_scale``'s: 1M row
  groups, one chunk each); median of ``--repeats`` processes.
* ``where``: ``where(id = X)`` over a ledger of one pass over 10M rows (20 files, row
  groups of 65,536 rows, ids in file order), against the same query reading every chunk
  the pass read (``prune=False``: a full scan mapped to steps) and a bare pyarrow scan of
  the ``id`` column of every file (finding the row only, no step), interleaved.
* ``overhead``: one epoch of the loader over ``common``'s dataset, ``ledger=DIR`` and
  none, interleaved; the ratio of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import (  # noqa: E402
    DatasetSpec,
    Series,
    command_line,
    ensure_dataset,
    interleave,
    machine,
    table,
    write_results,
)

RANKS = 1024
WORKERS = 8
CONFIG = {
    "ledger": 1,
    "kind": "config",
    "order": "planned",
    "source": {"type": "files", "path": "s3://bucket/dataset", "format": "parquet", "keywords": {}},
    "options": {"shuffle": True, "shuffle_seed": 7},
    "fingerprint": {"options": {}},
    "row_count_issue": None,
}


def _synthetic(files: int, groups: int) -> Any:
    from bench_scale import _metadata

    return _metadata(files, groups, True)


def _write_pass(
    root: Path, table: Any, rank: int, step: int, start: dict[str, Any] | None, epoch: int
) -> None:
    from torch_dataloader_utils.runtime.ledger import LedgerWriter

    writer = LedgerWriter(str(root), rank)
    writer.writes_shared = True
    record = writer.begin(
        config=CONFIG,
        tables=[(table, "synthetic" + "0" * 55)],
        num_ranks=RANKS,
        num_workers=WORKERS,
        epoch=epoch,
        step=step,
        order="planned",
        groups=1024,
        start=start,
        library="bench",
    )
    writer.end(record.step, 10_000, True)


def bytes_(args: argparse.Namespace) -> dict[str, Any]:
    """A rank's file after 100 passes of 10,000 steps; the shared files apart."""
    root = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    try:
        table = _synthetic(args.files, args.groups)
        entry = {"num_workers": WORKERS, "cursors": [[3, 517]] * WORKERS}
        state = {
            "epoch": 0,
            "segments": [{"num_ranks": RANKS, "ranks": {str(r): entry for r in range(RANKS)}}],
        }
        for p in range(args.passes):
            start = {**state, "epoch": p} if p % 10 == 9 else None
            _write_pass(root, table, 17, p * 10_000, start, p)
        sizes = {path.name: path.stat().st_size for path in root.iterdir()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rank_bytes = sizes.pop("rank-00017.jsonl")
    manifest = sum(v for k, v in sizes.items() if k.startswith("files-"))
    states = sum(v for k, v in sizes.items() if k.startswith("state-"))
    configs = sum(v for k, v in sizes.items() if k.startswith("config-"))
    return {
        "passes": args.passes,
        "steps": args.passes * 10_000,
        "rank_file_bytes": rank_bytes,
        "bytes_per_pass": rank_bytes / args.passes,
        "manifest_bytes": manifest,
        "chunks": args.files * args.groups,
        "state_files_bytes": states,
        "config_bytes": configs,
    }


def _replay_one(root: str, step: int, rank: int) -> dict[str, float]:
    from torch_dataloader_utils.tools.ledger import Ledger

    t = time.perf_counter()
    lineage = Ledger(root).batch(step, rank)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    Ledger(root).batch(step + 1, rank)
    return {"cold_s": cold, "rows": lineage.rows.num_rows, "second_ledger_s": time.perf_counter() - t}


def replay(args: argparse.Namespace) -> dict[str, Any]:
    """One step of a rank of 1,024 at 1M chunks, in fresh processes."""
    root = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    try:
        rank = 517
        _write_pass(root, _synthetic(args.files, args.groups), rank, 0, None, 1)
        runs = []
        for i in range(args.repeats):
            cmd = [sys.executable, __file__, "_replay", str(root), str(100 + 37 * i), str(rank)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        cold = [r["cold_s"] for r in runs]
        warm = [r["second_ledger_s"] for r in runs]
        return {
            "chunks": args.files * args.groups,
            "ranks": RANKS,
            "workers": WORKERS,
            "rows": runs[0]["rows"],
            "cold_s_median": statistics.median(cold),
            "cold_s_range": [min(cold), max(cold)],
            "in_process_s_median": statistics.median(warm),
            "repeats": args.repeats,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _where_data(rows: int, root: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = root / f"where-{rows}"
    if (target / "_SUCCESS").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    files = 20
    rng = np.random.default_rng(0)
    for i in range(files):
        ids = np.arange(i * rows // files, (i + 1) * rows // files, dtype=np.int64)
        cols = {"id": ids, "x": rng.standard_normal(len(ids), dtype=np.float32), "label": ids % 10}
        pq.write_table(pa.table(cols), target / f"part-{i:04d}.parquet", row_group_size=65_536)
    (target / "_SUCCESS").write_text("ok\n")
    return target


def where(args: argparse.Namespace) -> dict[str, Any]:
    """--where over a ledger of one pass over ``--where-rows`` rows, against a full scan of ``id``."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from torch_dataloader_utils import Ledger, create_dataloader

    data = _where_data(args.where_rows, args.data_dir)
    ledger = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    try:
        loader, _ = create_dataloader(
            str(data / "*.parquet"), batch_size=8192, num_workers=0, shuffle=True, ledger=str(ledger)
        )
        t = time.perf_counter()
        steps = sum(1 for _ in loader)
        pass_s = time.perf_counter() - t
        wanted = args.where_rows // 2 + 12_345
        files = sorted(data.glob("*.parquet"))
        found: list[Any] = []

        def ours() -> int:
            found[:] = Ledger(ledger).where(pc.field("id") == wanted)
            return len(found)

        def unpruned() -> int:
            return len(Ledger(ledger).where(pc.field("id") == wanted, prune=False))

        def scan() -> int:
            hits = 0
            for f in files:
                column = pq.read_table(f, columns=["id"]).column("id")
                hits += int(pc.sum(pc.equal(column, wanted)).as_py() or 0)
            return hits

        a, b, c = Series("where", {}), Series("full scan", {}), Series("where, no statistics", {})
        interleave([(a, ours), (c, unpruned), (b, scan)], repeats=args.repeats)
        assert a.rows == b.rows == c.rows == 1, (a.rows, b.rows, c.rows)
        return {
            "rows": args.where_rows,
            "pass_steps": steps,
            "pass_s": pass_s,
            "where_s_median": a.median_s,
            "where_s_range": [min(a.seconds), max(a.seconds)],
            "scan_s_median": b.median_s,
            "scan_s_range": [min(b.seconds), max(b.seconds)],
            "where_over_scan": a.median_s / b.median_s,
            "unpruned_s_median": c.median_s,
            "unpruned_s_range": [min(c.seconds), max(c.seconds)],
            "where_over_unpruned": a.median_s / c.median_s,
            "found": [(s.step, s.rank, s.position) for s in found],
        }
    finally:
        shutil.rmtree(ledger, ignore_errors=True)


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    """One loader epoch with ``ledger=DIR`` and without, interleaved."""
    from torch_dataloader_utils import create_dataloader

    spec = DatasetSpec(rows=args.rows, files=8, row_group_size=65_536)
    paths = ensure_dataset(spec, args.data_dir)
    ledger = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    try:

        def epoch(with_ledger: bool) -> int:
            loader, _ = create_dataloader(
                [str(p) for p in paths], batch_size=1024, num_workers=args.workers, shuffle=True,
                columns=["id", "f0", "f1", "label"], ledger=str(ledger) if with_ledger else None,
            )  # fmt: skip
            return sum(len(b["id"]) for b in loader)

        on, off = Series("ledger", {}), Series("no ledger", {})
        interleave([(off, lambda: epoch(False)), (on, lambda: epoch(True))], repeats=args.repeats)
        return {
            "rows": on.rows,
            "workers": args.workers,
            "ledger_s_median": on.median_s,
            "ledger_s_range": [min(on.seconds), max(on.seconds)],
            "none_s_median": off.median_s,
            "none_s_range": [min(off.seconds), max(off.seconds)],
            "ratio": on.median_s / off.median_s,
        }
    finally:
        shutil.rmtree(ledger, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["bytes", "replay", "where", "overhead", "all", "_replay"])
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--files", type=int, default=62_500, help="synthetic files (bytes, replay)")
    parser.add_argument("--groups", type=int, default=16, help="row groups per synthetic file")
    parser.add_argument("--passes", type=int, default=100)
    parser.add_argument("--where-rows", type=int, default=10_000_000)
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of the overhead dataset")
    parser.add_argument("--workers", type=int, default=2, help="overhead: DataLoader workers")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=HERE / ".data")
    parser.add_argument("--quick", action="store_true", help="100k chunks, 1M rows, 3 repeats")
    args = parser.parse_args(argv)
    if args.command == "_replay":
        root, step, rank = args.rest
        print(json.dumps(_replay_one(root, int(step), int(rank))))
        return
    if args.quick:
        args.files, args.where_rows, args.rows, args.repeats = 6_250, 1_000_000, 500_000, 3
    print(f"loadavg {os.getloadavg()}", flush=True)
    wanted = ["bytes", "replay", "where", "overhead"] if args.command == "all" else [args.command]
    run = {"bytes": bytes_, "replay": replay, "where": where, "overhead": overhead}
    results = {name: run[name](args) for name in wanted}
    rows = [(name, json.dumps(value)) for name, value in results.items()]
    write_results(
        "bench_ledger",
        {"machine": machine(), "command": command_line(), "results": results},
        f"`{command_line()}`\n\n" + table(["measure", "figures"], rows),
    )


if __name__ == "__main__":
    main()
