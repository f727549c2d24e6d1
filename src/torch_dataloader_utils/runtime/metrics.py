"""Counters of what each worker delivered, kept in the main process from the batches' tags.

Every batch already travels with a tag (:mod:`.emit`): besides its position in the
worker's plan it carries its row count and Arrow size, so the main process counts rows,
batches, bytes and pieces per worker as the training loop receives batches, with no
extra messages from the workers. :class:`MetricsRecorder` is the one protocol the
loader (and a dataset iterated in the main process) calls: ``begin`` a pass,
``record`` each tag, ``finish``; ``drain`` / ``reset`` back ``get_metrics()`` /
``reset_metrics()``. Progress bars (``show_progress``) are fed from the same calls.

The counters describe batches the loop *received*, so batches prefetched but never
consumed (an interrupted epoch) are not counted — the same rule as the resume state.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch_dataloader_utils.config import ProgressConfig
from torch_dataloader_utils.errors import IncompatibleOptionsError

__all__ = ["MetricsRecorder", "WorkerMetrics"]

logger = logging.getLogger("torch_dataloader_utils")


@dataclass
class WorkerMetrics:
    """What one DataLoader worker delivered to the training loop (0.2.0's fields).

    Attributes:
        worker_id: The worker's id (0 when reading in the main process).
        rows_read: Rows in the batches received (padding rows included).
        batches_read: Batches received.
        bytes_read: Arrow size of those batches before conversion (an estimate of the
            decoded bytes, not of the bytes fetched from storage).
        files_read: Pieces of the plan (chunks, or windows of the row shuffle) begun.
        elapsed_sec: Seconds from the first to the last batch received (0 for one batch).
    """

    worker_id: int
    rows_read: int = 0
    batches_read: int = 0
    bytes_read: int = 0
    files_read: int = 0
    elapsed_sec: float = 0.0
    _first: float | None = field(default=None, repr=False, compare=False)


class MetricsRecorder:
    """Per-worker counters (and optional progress bars) of one dataset, main process only.

    Args:
        progress: The ``show_progress`` options.

    Raises:
        IncompatibleOptionsError: ``show_progress=True`` but ``tqdm`` is not installed.
    """

    def __init__(self, progress: ProgressConfig) -> None:
        if progress.show_progress and importlib.util.find_spec("tqdm") is None:
            raise IncompatibleOptionsError(
                "show_progress=True draws tqdm progress bars, but tqdm is not installed; "
                "pip install tqdm, or drop show_progress"
            )
        self._progress = progress
        self._workers: dict[int, WorkerMetrics] = {}
        self._totals: Sequence[int | None] = ()
        self._bars: dict[int, Any] = {}
        self.epoch = 0

    def __getstate__(self) -> dict[str, Any]:
        # Workers get an empty recorder: counting happens in the main process only.
        return {"_progress": self._progress, "_workers": {}, "_totals": (), "_bars": {}, "epoch": 0}

    def begin(self, epoch: int, totals: Sequence[int | None] = ()) -> None:
        """A pass over ``epoch`` starts; ``totals[w]`` is worker ``w``'s row count when known."""
        self.close_bars()
        self.epoch = epoch
        self._totals = tuple(totals)

    def record(self, tag: Sequence[int]) -> None:
        """Count the batch carrying ``tag`` ``(token, worker, workers, piece, offset, rows, nbytes)``."""
        worker, piece, offset = int(tag[1]), int(tag[3]), int(tag[4])
        rows = int(tag[5]) if len(tag) > 5 else 0
        nbytes = int(tag[6]) if len(tag) > 6 else 0
        now = time.monotonic()
        m = self._workers.get(worker)
        if m is None:
            m = self._workers[worker] = WorkerMetrics(worker_id=worker, _first=now)
        m.rows_read += rows
        m.batches_read += 1
        m.bytes_read += nbytes
        m.files_read = max(m.files_read, piece + (1 if offset > 0 else 0))
        m.elapsed_sec = now - (m._first if m._first is not None else now)
        if self._progress.show_progress:
            self._bar(worker).update(rows)

    def _bar(self, worker: int) -> Any:
        bar = self._bars.get(worker)
        if bar is None:
            from tqdm.auto import tqdm  # type: ignore[import-untyped]

            total = self._totals[worker] if worker < len(self._totals) else None
            bar = tqdm(
                total=total,
                desc=f"W{worker}",
                unit="rows",
                position=worker,
                mininterval=self._progress.progress_interval_sec,
                leave=True,
            )
            self._bars[worker] = bar
        return bar

    def close_bars(self) -> None:
        """Close the progress bars of the current pass."""
        for bar in self._bars.values():
            bar.close()
        self._bars = {}

    def finish(self) -> None:
        """The pass ended: close the bars (the counters stay until drained)."""
        self.close_bars()

    def snapshot(self) -> list[WorkerMetrics]:
        """The counters so far, by worker id (without clearing them)."""
        return [self._workers[w] for w in sorted(self._workers)]

    def drain(self) -> list[WorkerMetrics]:
        """The counters since the last drain or reset, logged as an epoch summary, then cleared."""
        results = self.snapshot()
        self._workers = {}
        if results:
            rows = sum(m.rows_read for m in results)
            elapsed = max(m.elapsed_sec for m in results)
            logger.info(
                "Epoch %d complete: workers=%d rows=%s batches=%d bytes=%s elapsed=%.1fs",
                self.epoch,
                len(results),
                f"{rows:,}",
                sum(m.batches_read for m in results),
                f"{sum(m.bytes_read for m in results):,}",
                elapsed,
            )
        return results

    def reset(self) -> None:
        """Discard the counters (and close any progress bars)."""
        self._workers = {}
        self.close_bars()
