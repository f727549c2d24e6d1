"""Timings of the loading machinery on this machine, for ``simulate``: worker start-up, per-batch cost.

Measured with real DataLoaders over trivial items (no data is read), so they hold
whatever this machine, its Python and its load make of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from torch_dataloader_utils.config import ProgressConfig
from torch_dataloader_utils.runtime.metrics import MetricsRecorder, stall_clock

__all__ = ["measure_batch_overhead", "measure_worker_start"]


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


def measure_batch_overhead(items: int = 20_000) -> float:
    """Seconds per batch the main process spends in a DataLoader's machinery, tags and metrics.

    Times a single-process DataLoader handing out ready batches, through the same
    per-batch bookkeeping the loader does (the stall clock and the metrics record).
    """
    loader: DataLoader[Any] = DataLoader(_Items(items), batch_size=None, collate_fn=_passthrough)
    recorder = MetricsRecorder(ProgressConfig())
    tag = (0, 0, 1, 0, 1, 1, 1)
    began = time.perf_counter()
    for _ in stall_clock(iter(loader), recorder):
        recorder.record(tag)
    return (time.perf_counter() - began) / items


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
