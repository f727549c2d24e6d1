"""Timings of the loading machinery on this machine, for ``simulate``: worker start-up, per-batch cost.

Measured with real DataLoaders (over trivial items, or a small temporary Parquet file),
so they hold whatever this machine, its Python and its load make of them.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

__all__ = ["measure_batch_overhead", "measure_thread_start", "measure_worker_start"]


class _Items(IterableDataset[Any]):
    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is not None and info.id:  # one item from each other worker
            yield 0
            return
        item = {"x": torch.zeros(4)}
        for _ in range(self.count):
            yield item


def measure_batch_overhead(batches: int = 3000, batch_size: int = 8) -> float:
    """Seconds per batch the library's loader spends beside reading and converting.

    Reads a small Parquet file in tiny batches twice — through ``create_dataloader``'s
    loader (the DataLoader's machinery, tags, resume state, metrics) and through the
    bare reader, cut into batches and converted — and divides the difference by the
    batches (best of two runs each).
    """
    from torch_dataloader_utils.io.batching import rebatch
    from torch_dataloader_utils.runtime.files import create_dataloader

    quiet = logging.getLogger("torch_dataloader_utils.runtime.report")
    disabled, quiet.disabled = quiet.disabled, True
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "calibrate.parquet"
            pq.write_table(pa.table({"x": np.arange(batches * batch_size, dtype=np.int64)}), path)
            loader, dataset = create_dataloader(str(path), batch_size=batch_size, num_workers=0)
            chunks = dataset.plan(0).all_chunks()

            def through_loader() -> None:
                for _ in loader:
                    pass

            def bare() -> None:
                for chunk in chunks:
                    for batch in rebatch(dataset.reader.read(chunk), batch_size):
                        dataset.convert_batch(batch)

            def best(fn: Callable[[], None]) -> float:
                times = []
                for _ in range(2):
                    began = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - began)
                return min(times)

            return max(0.0, best(through_loader) - best(bare)) / batches
    finally:
        quiet.disabled = disabled


def measure_thread_start(threads: int, repeats: int = 3) -> float:
    """Seconds to start ``threads`` threads of a pool, as a reading process does for each pass.

    A pool starts a thread per task submitted until it has ``threads``; each start waits
    until the new thread runs, which on a busy machine takes a scheduler slot (median
    of ``repeats``).
    """
    from concurrent.futures import ThreadPoolExecutor

    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        pool = ThreadPoolExecutor(threads)
        for _ in range(threads):
            pool.submit(time.sleep, 0.001)
        times.append(time.perf_counter() - began)
        pool.shutdown(wait=True)
    return float(np.median(times))


def _passthrough(batch: Any) -> Any:
    return batch


def measure_worker_start(workers: int) -> float:
    """Seconds from starting a DataLoader with ``workers`` workers to its first item (0 without)."""
    if workers <= 0:
        return 0.0
    loader: DataLoader[Any] = DataLoader(
        _Items(1), batch_size=None, num_workers=workers, collate_fn=_passthrough
    )
    began = time.perf_counter()
    it = iter(loader)
    next(it)
    spent = time.perf_counter() - began
    for _ in it:
        pass
    return spent
