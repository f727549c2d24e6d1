"""Where a shuffled read's time goes at ``num_workers=0``: a diagnostic, not a ratio.

    python benchmarks/mix_timeline.py [--rows 2000000] [--repeats 7] [--streams 8]

Reads the dataset of ``bench_shuffle.py`` (8 files, 65,536-row groups, the default
split) with chunk order (``row_mixing=None``) and with the default row mixing,
alternately, and prints per epoch (medians of ``--repeats``):

* ``wall`` and ``cpu``: the epoch's wall time and the process's CPU time (all threads);
* ``first wait``: how long the converting thread waited for its first item (a mix
  needs every stream opened and decoded before its first round);
* ``waits``: all the converting thread's waits for the read-ahead thread;
* ``gathers here`` / ``gathers there``: time in the shuffles' gathers, in the
  converting thread and in the read-ahead thread.

A reference row, ``pyarrow, 8 files side by side``, opens every file with
``ParquetFile.iter_batches`` (65,536 rows) and decodes them round-robin: its ``first
wait`` is the time to every file's first batch, what a mix needs before its first round.

``--streams N`` mixes N chunks side by side instead of the default 8 (it changes
``RowMixing``'s default, which has no option of its own), and adds the mixing measure
of ``bench_shuffle.py`` (same-file pairs in a batch) to show what fewer streams give up.

It times library internals by wrapping them (``queue.Queue.get`` in the main thread,
``Gather._fill``), so its own overhead is in the figures.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from bench_shuffle import mixing as mixing_measure
from bench_shuffle import write
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.io import pieces
from torch_dataloader_utils.plan.mixing import DEFAULT_MIX_ROWS, DEFAULT_MIX_STREAMS, RowMixing

MAIN = threading.main_thread()
_events: dict[str, float] = {}
_first: list[float] = []


def _add(key: str, seconds: float) -> None:
    _events[key] = _events.get(key, 0.0) + seconds


def _instrument() -> None:
    get = queue.Queue.get
    fill = pieces.Gather._fill

    def timed_get(self: queue.Queue[Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        item = get(self, *args, **kwargs)
        if threading.current_thread() is MAIN:
            waited = time.perf_counter() - start
            if not _first:
                _first.append(waited)
            _add("waits", waited)
        return item

    def timed_fill(self: pieces.Gather) -> bool:
        start = time.perf_counter()
        done = fill(self)
        where = "gathers here" if threading.current_thread() is MAIN else "gathers there"
        _add(where, time.perf_counter() - start)
        return done

    queue.Queue.get = timed_get  # type: ignore[method-assign]
    pieces.Gather._fill = timed_fill  # type: ignore[method-assign]


def epoch(root: Path, mixing: bool, measure: bool = False) -> dict[str, float]:
    _events.clear()
    _first.clear()
    options: dict[str, Any] = {} if mixing else {"row_mixing": None}
    wall, cpu = time.perf_counter(), time.process_time()
    loader, _ = create_dataloader(
        str(root), batch_size=1024, num_workers=0, shuffle=True, shuffle_seed=1, **options
    )
    ids = [batch["id"].numpy() for batch in loader]
    out = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
    if measure:  # after the clock stops; once per read (the order is the same every run)
        out["same-file pairs"] = mixing_measure(ids, sum(len(i) for i in ids))["same-file pairs"]
    out["first wait"] = _first[0] if _first else 0.0
    for key in ("waits", "gathers here", "gathers there"):
        out[key] = _events.get(key, 0.0)
    return out


def side_by_side(root: Path) -> dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    streams = [pq.ParquetFile(path).iter_batches(batch_size=65536) for path in sorted(root.glob("*.parquet"))]
    live = [next(stream, None) is not None for stream in streams]
    first = time.perf_counter() - wall
    while any(live):
        live = [alive and next(stream, None) is not None for alive, stream in zip(live, streams, strict=True)]
    out = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "first wait": first}
    return out | {"waits": 0.0, "gathers here": 0.0, "gathers there": 0.0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--streams", type=int, default=DEFAULT_MIX_STREAMS)
    args = parser.parse_args()
    RowMixing.__init__.__defaults__ = (DEFAULT_MIX_ROWS, args.streams)  # type: ignore[attr-defined]
    _instrument()
    mix = f"row mixing ({args.streams} streams)"
    raw = "pyarrow, 8 files side by side"
    runs: dict[str, list[dict[str, float]]] = {raw: [], "chunk order": [], mix: []}
    pairs = {raw: float("nan")}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write(root, args.rows)
        for name, mixing in (("chunk order", False), (mix, True)):  # warm-up
            pairs[name] = epoch(root, mixing, measure=True)["same-file pairs"]
        for _ in range(args.repeats):
            runs[raw].append(side_by_side(root))
            runs["chunk order"].append(epoch(root, False))
            runs[mix].append(epoch(root, True))
    keys = ["wall", "cpu", "first wait", "waits", "gathers here", "gathers there"]
    print(f"rows={args.rows} repeats={args.repeats} streams={args.streams} (medians, ms)")
    print("| read | " + " | ".join(keys) + " | same-file pairs |")
    print("|---|" + "---|" * (len(keys) + 1))
    for name, rows in runs.items():
        cells = [f"{statistics.median(r[k] for r in rows) * 1000:.1f}" for k in keys]
        cells.append(f"{pairs[name]:.3f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
