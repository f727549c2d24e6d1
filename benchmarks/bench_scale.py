"""Planning at scale: one rank's plan, resume and metadata memory over synthetic metadata.

Synthetic metadata stands for what discovery finds (no file is written): ``--files``
Parquet files of ``--groups`` row groups each (1,000-3,000 rows, ~48 KB a row, so with
the default ``split_bytes`` every row group is one chunk), shuffle on, ``equal_batches=
'drop'``. Every figure comes from a fresh process (``python bench_scale.py _one ...``)
and is the median of ``--repeats`` runs; peak RSS is the process's ``ru_maxrss``,
metadata included. ``--src`` runs the same measurements against another checkout's
``src`` (e.g. the code before per-rank planning), whose API it detects.

    python benchmarks/bench_scale.py plan                   # 1M chunks x 1,024 and 8,192 ranks
    python benchmarks/bench_scale.py plan --quick           # 100k chunks
    python benchmarks/bench_scale.py plan --src /tmp/base/src --ranks 1024   # before
    python benchmarks/bench_scale.py digest         # digests of some ranks' plans (compare trees)

Measured (see docs/benchmarks.md):

* ``plan``: one rank's plan for one epoch (the first plan in the process, which
  builds the chunk table once per dataset, and a later epoch), and one worker's chunks;
* ``load``: ``load_state_dict`` of a merged mid-epoch state of every rank: the state's
  checks (files digest) and this rank's plan of the rest of the epoch;
* ``state``: one ``state_dict()`` call (after the first);

``load`` and ``state`` group a worker's chunks into row mixes as ``shuffle=True`` does by
default (``--no-mixing``: chunks only).
* ``meta``: bytes of metadata per file.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "bench_scale_plan.json"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------
# One measurement, in a fresh process
# ---------------------------------------------------------------------------------------


def _metadata(files: int, groups: int, new_api: bool) -> Any:
    """The synthetic dataset: a FileTable (per-rank planner) or FileInfo objects (before)."""
    import numpy as np

    rng = np.random.default_rng(0)
    if new_api:  # the group columns as a columnar discovery gives them (int32: the values fit)
        rows = np.empty(files * groups, dtype=np.int32)
        for a in range(0, len(rows), 1 << 16):  # the same values as one draw, without an int64 copy
            b = min(len(rows), a + (1 << 16))
            rows[a:b] = rng.integers(1000, 3000, b - a)
    else:
        rows = rng.integers(1000, 3000, files * groups).astype(np.int64)
    template = "s3://bucket/dataset/date=2026-11-{:02d}/part-{:08d}.parquet"
    if new_api:
        from torch_dataloader_utils.plan.table import FileTable

        # Paths straight into one byte blob (as an Arrow string column holds them).
        width = len(template.format(0, 0))
        blob = np.tile(np.frombuffer(template.format(0, 0).encode(), np.uint8), files).reshape(files, width)
        ids = np.arange(files, dtype=np.int32)
        day = template.index("{:02d}")
        part = len(template.format(0, 0)) - len("00000000.parquet")
        for k in range(2):
            blob[:, day + 1 - k] += ((ids % 30) // 10**k % 10).astype(np.uint8)
        for k in range(8):
            blob[:, part + 7 - k] += (ids // 10**k % 10).astype(np.uint8)
        blob = blob.reshape(-1)
        first = np.zeros(files * groups, dtype=np.int32)
        per_file = rows.reshape(files, groups)
        np.cumsum(per_file[:, :-1], axis=1, dtype=np.int32, out=first.reshape(files, groups)[:, 1:])
        file_rows = per_file.sum(axis=1, dtype=np.int64)

        def offsets(step: int) -> Any:  # as Arrow's offsets are: int32 (int64 for large ones)
            end = files * step
            return np.arange(0, end + 1, step, dtype=np.int32 if end < 2**31 else np.int64)

        return FileTable.from_arrays(
            paths_blob=blob,
            path_offsets=offsets(width),
            size=file_rows * 48_000,
            rows=file_rows,
            mtime=np.full(files, 1.7e9),
            group_offsets=offsets(groups),
            group_index=np.tile(np.arange(groups, dtype=np.int16), files),
            group_first_row=first,
            group_rows=rows,
            group_bytes=rows * np.int32(48_000),
        )
    from torch_dataloader_utils.plan.types import FileInfo, RowGroup

    out = []
    for i in range(files):
        n = rows[i * groups : (i + 1) * groups].tolist()
        starts = [0]
        for k in n[:-1]:
            starts.append(starts[-1] + k)
        out.append(
            FileInfo(
                template.format(i % 30, i),
                sum(n) * 48_000,
                sum(n),
                tuple(RowGroup(g, s, k, k * 48_000) for g, (s, k) in enumerate(zip(starts, n, strict=True))),
                1.7e9,
            )
        )
    return tuple(out)


def _spec(files: Any, ranks: int, workers: int, policy: str = "drop", split_bytes: int = 0) -> Any:
    from torch_dataloader_utils.config import DEFAULT_SPLIT_BYTES
    from torch_dataloader_utils.plan.planner import PlanSpec
    from torch_dataloader_utils.plan.splits import RowGroupSplit
    from torch_dataloader_utils.plan.types import EqualBatches

    return PlanSpec(
        files,
        RowGroupSplit(split_bytes=split_bytes or DEFAULT_SPLIT_BYTES),
        ranks,
        workers,
        True,
        7,
        EqualBatches(policy),
        1024,
    )


def digest(args: argparse.Namespace) -> None:
    """Print digests of the metadata's columns and of some ranks' plans (to compare two trees).

    For each world of ``--ranks`` (default 6, 7, 1,024 and 8,192) and each of
    ``equal_batches`` ``'drop'`` and ``'pad'``: the chunks of every worker of ranks 0, 1,
    the middle one and the last (epochs 1 and 2), and the rows the policy drops or
    repeats. Equal digests before and after a change mean byte-identical plans.
    """
    import hashlib

    import numpy as np

    from torch_dataloader_utils.plan.planner import Planner

    files = _metadata(args.files, args.groups, True)
    h = hashlib.sha256()
    for name in (
        "paths_blob",
        "path_offsets",
        "size",
        "rows",
        "live",
        "mtime",
        "splittable",
        "has_groups",
        "group_offsets",
        "group_index",
        "group_first_row",
        "group_rows",
        "group_bytes",
    ):
        column = np.asarray(getattr(files, name))
        if column.dtype.kind == "i":  # the values, whatever the columns' widths
            column = column.astype(np.int64)
        h.update(name.encode() + np.ascontiguousarray(column).view(np.uint8).tobytes())
    every = hashlib.sha256(h.digest())
    print(f"metadata {h.hexdigest()[:16]} ({args.files} files x {args.groups} row groups)", flush=True)
    for ranks in args.ranks:
        for policy in ("drop", "pad"):
            planner = Planner(_spec(files, ranks, args.workers, policy, args.split_bytes))
            h = hashlib.sha256()
            for epoch in (1, 2):
                for rank in sorted({0, 1 % ranks, ranks // 2, ranks - 1}):
                    plan = planner.rank_plan(epoch, rank, args.workers)
                    for w in range(args.workers):
                        h.update(repr((epoch, rank, w, plan.chunks_for(w))).encode())
                h.update(repr((planner.dropped(epoch), planner.padding(epoch))).encode())
            every.update(h.digest())
            print(f"ranks {ranks} {policy}: {h.hexdigest()[:16]}", flush=True)
    print(f"all {every.hexdigest()[:16]}")


def _state_of(
    ranks: int, workers: int, quota: int, fingerprint: dict[str, Any], with_left: bool
) -> dict[str, Any]:
    """A merged state of every rank, each worker a quarter through its rows (cursor in piece 0)."""
    from torch_dataloader_utils.plan.ranks import worker_quotas
    from torch_dataloader_utils.plan.state import STATE_FORMAT, STATE_VERSION

    quotas = worker_quotas(quota, workers, 1024)
    entries = {}
    for r in range(ranks):
        entry: dict[str, Any] = {"num_workers": workers, "cursors": [[0, 0]] * workers, "done": False}
        if with_left:
            entry["left"] = quotas
        entries[str(r)] = entry
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "fingerprint": fingerprint,
        "epoch": 1,
        "seed": 7,
        "world": {"num_ranks": ranks, "rank": 0},
        "segments": [{"num_ranks": ranks, "ranks": entries}],
    }


def _mixing(args: argparse.Namespace) -> Any:
    """The row mixing ``shuffle=True`` has by default (``None`` with ``--no-mixing``)."""
    if args.no_mixing:
        return None
    from torch_dataloader_utils.plan.mixing import RowMixing

    return RowMixing()


def one(args: argparse.Namespace) -> dict[str, Any]:
    """Run one measurement in this (fresh) process; return its figures."""
    if args.src:
        sys.path.insert(0, args.src)
    if args.with_torch:
        import torch  # noqa: F401  # the runtime's footprint, to report RSS as a job sees it
    import torch_dataloader_utils.plan as plan_pkg

    new_api = hasattr(__import__("torch_dataloader_utils.plan.planner", fromlist=["Planner"]), "Planner")
    base = _rss_mb()
    t = time.perf_counter()
    files = _metadata(args.files, args.groups, new_api)
    out: dict[str, Any] = {
        "api": "per-rank" if new_api else "all-ranks",
        "import_rss_mb": round(base, 1),
        "metadata_s": round(time.perf_counter() - t, 3),
        "metadata_rss_mb": round(_rss_mb(), 1),
    }
    if new_api:
        out["metadata_bytes_per_file"] = round(files.nbytes / args.files, 1)
    rank = args.ranks // 2
    if args.what == "meta":
        out["rss_per_file_bytes"] = round((_rss_mb() - base) * 2**20 / args.files, 1)
        return out
    spec = _spec(files, args.ranks, args.workers, split_bytes=args.split_bytes)
    if args.what == "plan":
        if new_api:
            from torch_dataloader_utils.plan.planner import Planner

            planner = Planner(spec)
            t = time.perf_counter()
            plan = planner.rank_plan(1, rank, args.workers)
            out["first_plan_s"] = round(time.perf_counter() - t, 4)
            t = time.perf_counter()
            plan = planner.rank_plan(2, rank, args.workers)
            out["plan_s"] = round(time.perf_counter() - t, 4)
            t = time.perf_counter()
            chunks = plan.chunks_for(0)
            out["worker_chunks_s"] = round(time.perf_counter() - t, 4)
            out["rank_chunks"] = plan.share_size
            out["worker_chunks"] = len(chunks)
        else:
            t = time.perf_counter()
            full = plan_pkg.plan_epoch(spec, 1)
            chunks = full.rank_chunks(rank)
            out["first_plan_s"] = out["plan_s"] = round(time.perf_counter() - t, 4)
            out["rank_chunks"] = len(chunks)
        out["peak_rss_mb"] = round(_rss_mb(), 1)
        return out
    from torch_dataloader_utils.plan.state import check_state, fingerprint

    options = {"split_strategy": "row_group"}
    if args.what == "load":
        t = time.perf_counter()
        expected = fingerprint(files, options)
        out["fingerprint_s"] = round(time.perf_counter() - t, 4)
        if new_api:
            from torch_dataloader_utils.plan.planner import Planner
            from torch_dataloader_utils.plan.resume import Resumer

            planner = Planner(spec)
            t = time.perf_counter()
            planner.chunk_table()  # built once per dataset, at construction
            out["chunk_table_s"] = round(time.perf_counter() - t, 4)
            quota = int(planner.shares(1, args.workers).totals().sum()) // args.ranks
            planner.shares(0, args.workers)  # a fresh process has planned epoch 0 (construction), not 1
            state = _state_of(args.ranks, args.workers, quota, expected, not args.no_left)
            parsed = getattr(
                __import__("torch_dataloader_utils.plan.state", fromlist=["x"]), "ResumeState", None
            )
            t = time.perf_counter()
            if parsed is not None:  # the state parsed once, as load_state_dict does
                segments = parsed.parse(json.loads(json.dumps(state))).check_against(expected).segments
            else:
                segments = check_state(json.loads(json.dumps(state)), expected)["segments"]
            resumer = Resumer(
                planner,
                1,
                segments,
                num_ranks=args.new_ranks or args.ranks,
                num_workers=lambda r: args.workers,
                window_rows=None,
                exact=True,
                mixing=_mixing(args),
            )
            pieces = resumer.rank((args.new_ranks or args.ranks) // 2)
            out["load_s"] = round(time.perf_counter() - t, 4)
            out["pieces"] = sum(len(w) for w in pieces)
        else:
            from dataclasses import replace

            from torch_dataloader_utils.plan.resume import segment_pieces

            full = plan_pkg.plan_epoch(spec, 1)
            quota = sum(c.num_rows or 0 for c in full.rank_chunks(0))
            state = _state_of(args.ranks, args.workers, quota, expected, False)
            del full
            t = time.perf_counter()
            checked = check_state(json.loads(json.dumps(state)), expected)
            result = segment_pieces(
                replace(spec),
                1,
                checked["segments"],
                num_ranks=args.new_ranks or args.ranks,
                num_workers=lambda r: args.workers,
                window_rows=None,
                exact=True,
            )
            out["load_s"] = round(time.perf_counter() - t, 4)
            out["pieces"] = sum(len(w) for w in result.assignments[(args.new_ranks or args.ranks) // 2])
        out["peak_rss_mb"] = round(_rss_mb(), 1)
        return out
    if args.what == "state":
        from torch_dataloader_utils.plan.types import World
        from torch_dataloader_utils.runtime.state import ResumeTracker

        world = World(args.ranks, rank)
        if new_api:
            from torch_dataloader_utils.plan.planner import Planner

            planner = Planner(spec)

            @functools.cache
            def counted(epoch: int, workers: int) -> list[list[int]]:
                plan = planner.rank_plan(epoch, rank, workers)
                mixing = _mixing(args)
                spans = hasattr(plan, "piece_rows")  # the one dealer's plan (else: parts with lo, hi)
                if mixing is None:
                    if spans:
                        return [[n or 0 for n in plan.piece_rows(w)] for w in range(workers)]
                    return [[p.hi - p.lo for p in plan.workers[w]] for w in range(workers)]
                from torch_dataloader_utils.plan.pieces import as_pieces, mix_pieces

                def pieces(w: int) -> Any:
                    return plan.pieces_for(w) if spans else as_pieces(plan.chunks_for(w))

                return [  # what the dataset counts: rows per mix (the pieces its cursors point into)
                    [
                        p.num_rows or 0
                        for p in mix_pieces(pieces(w), mixing, (7, epoch, 0, rank, w), planner.files)
                    ]
                    for w in range(workers)
                ]

            def rows(epoch: int, workers: int, segments: list[dict[str, Any]]) -> list[list[int]]:
                return counted(epoch, workers)  # the dataset keeps them per pass, too

            tracker, piece_rows = ResumeTracker(files, options, world, 7), rows
            t = time.perf_counter()
            rows(1, args.workers, [])  # what the dataset does when a pass starts (main process)
            tracker.fingerprint()
            out["pass_start_s"] = round(time.perf_counter() - t, 4)
        else:
            tracker, piece_rows = ResumeTracker(files, options, world, 7), None
        progress = tracker.begin(args.workers, 1)
        for w in range(args.workers):
            progress.record((0, w, args.workers, 0, 512))
        t = time.perf_counter()
        tracker.state_dict(1, piece_rows)
        out["first_state_dict_s"] = round(time.perf_counter() - t, 4)
        times = []
        for _ in range(20):
            progress.record((0, 0, args.workers, 0, 1024))
            t = time.perf_counter()
            state = tracker.state_dict(1, piece_rows)
            times.append(time.perf_counter() - t)
        out["state_dict_s"] = round(statistics.median(times), 5)
        out["state_bytes"] = len(json.dumps(state))
        out["peak_rss_mb"] = round(_rss_mb(), 1)
        return out
    raise SystemExit(f"unknown measurement {args.what!r}")


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------


def _run_one(argv: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "_one", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["plan", "digest", "_one"])
    parser.add_argument("--what", default="plan", choices=["plan", "load", "state", "meta"])
    parser.add_argument("--measure", nargs="+", default=["plan", "load", "state", "meta"])
    parser.add_argument("--files", type=int, default=62_500)
    parser.add_argument("--groups", type=int, default=16, help="row groups per file")
    parser.add_argument("--ranks", type=int, nargs="+", help="default: 1024 8192 (digest: 6 7 1024 8192)")
    parser.add_argument("--new-ranks", type=int, default=0, help="load: the world resumed in (default: same)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--split-bytes", type=int, default=0, help="RowGroupSplit's split_bytes (default 64 MiB)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--src", default="", help="another checkout's src directory (figures before)")
    parser.add_argument("--with-torch", action="store_true", help="import torch first (a job's process)")
    parser.add_argument("--no-left", action="store_true", help="load: a state without rows left per worker")
    parser.add_argument(
        "--no-mixing", action="store_true", help="load, state: without row mixing (shuffle=True's default)"
    )
    parser.add_argument("--quick", action="store_true", help="100k chunks, one repeat")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    if args.ranks is None:
        args.ranks = [6, 7, 1024, 8192] if args.command == "digest" else [1024, 8192]
    if args.command == "digest":
        digest(args)
        return
    if args.command == "_one":
        args.ranks = args.ranks[0]
        print(json.dumps(one(args)))
        return
    if args.quick:
        args.files, args.repeats = max(1, args.files // 10), 1
    print(f"loadavg {os.getloadavg()}, {args.files} files x {args.groups} row groups, workers {args.workers}")
    results = []
    for what in args.measure:
        for ranks in args.ranks if what != "meta" else args.ranks[:1]:
            argv_one = [
                "--what",
                what,
                "--files",
                str(args.files),
                "--groups",
                str(args.groups),
                "--ranks",
                str(ranks),
                "--workers",
                str(args.workers),
            ]
            for flag, value in (
                ("--src", args.src),
                ("--new-ranks", args.new_ranks),
                ("--split-bytes", args.split_bytes),
            ):
                if value:
                    argv_one += [flag, str(value)]
            if args.with_torch:
                argv_one.append("--with-torch")
            if args.no_left:
                argv_one.append("--no-left")
            if args.no_mixing:
                argv_one.append("--no-mixing")
            runs = [_run_one(argv_one) for _ in range(args.repeats)]
            row = {"what": what, "ranks": ranks, **_median(runs), "loadavg": os.getloadavg()[0]}
            results.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
