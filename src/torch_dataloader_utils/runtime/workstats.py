"""A reading process's timers and counters, carried by the batches it already sends.

A DataLoader worker times its own work — reading (storage wait + decode), converting,
packing for the transfer — and reads its reader's I/O counters (bytes fetched and
needed, requests, retries, storage wait), its process's ``data_cache`` counters (hits,
misses, bytes served, evictions) and the units of bad data it skipped. It sends no
message of its own: every group of batches it hands over (:func:`~.emit.grouped`)
carries the differences since the previous group as a short tuple of numbers
(:data:`WORK_FIELDS`), plus the rows skipped per file when there are any, which the main
process adds to the worker's :class:`~.metrics.WorkerMetrics`. No lock and no shared
memory are involved; the cost is a few clock reads per batch and one tuple per group.

When the dataset is read in the main process, the recorder reads the live
:class:`WorkStats` directly instead.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.io.bad import bad_data_files, bad_data_totals
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.storage.cache import process_stats
from torch_dataloader_utils.storage.requests import KINDS, process_requests

__all__ = ["WORK_FIELDS", "WorkStats"]

WORK_FIELDS = (
    "read_sec",
    "convert_sec",
    "transfer_sec",
    "rows_padded",
    "pieces",
    "bytes_fetched",
    "bytes_needed",
    "requests",
    "retries",
    "storage_wait_sec",
    "cache_hits",
    "cache_misses",
    "cache_bytes_served",
    "cache_evictions",
    "bad_units",
    "bad_rows",
    *(f"{kind[:-1]}_requests" for kind in KINDS),
    "bytes_received",
    "bytes_sent",
)
"""The order of the numbers in a work delta (what :meth:`WorkStats.delta` returns).

The last seven are the requests this process sent to storage, by kind, and their bytes
(:class:`~torch_dataloader_utils.storage.requests.RequestCounts`); ``requests`` is their total."""

FileCounts = tuple[tuple[str, int], ...]
"""Rows skipped per file (``on_bad_data``), as ``(file, rows)`` pairs."""


def _process_counts() -> tuple[int, ...]:
    """This process's cache and bad-data counters, in :data:`WORK_FIELDS` order."""
    return (*process_stats().totals(), *bad_data_totals())


_NO_IO = (0, 0, 0, 0, 0.0)


class WorkStats:
    """What one pass of one reading process did so far; see the module docstring.

    Args:
        reader: The chunk reader; its ``io_totals()`` (when it has one) gives the I/O
            counters ``(bytes_fetched, bytes_needed, requests, retries, wait_sec)``; the
            requests counted are this process's (:func:`~.storage.requests.process_requests`).
        pieces: Pieces (chunks, or windows of the row shuffle) this pass reads.
        flag_column: The padding flag column (``equal_batches='pad'``), or ``None``.

    Attributes:
        read_sec: Seconds spent getting the next batch from the reader (storage wait,
            decoding, filtering, re-batching).
        convert_sec: Seconds converting batches to the output format.
        transfer_sec: Seconds packing batches into the buffer they cross processes in.
        rows_padded: Rows flagged as padding in the batches produced.
    """

    __slots__ = (
        "_base",
        "_files_sent",
        "_io",
        "_pieces",
        "_process_base",
        "_requests_base",
        "_sent",
        "convert_sec",
        "flag_column",
        "read_sec",
        "rows_padded",
        "transfer_sec",
    )

    def __init__(self, reader: ChunkReader, pieces: int, flag_column: str | None = None) -> None:
        self._io = reader.io_totals
        self._base = self._io() or _NO_IO
        self._process_base = _process_counts()
        self._requests_base = process_requests()
        self._files_sent = bad_data_files()
        self._pieces = pieces
        self._sent: tuple[float, ...] = (0.0,) * len(WORK_FIELDS)
        self.read_sec = 0.0
        self.convert_sec = 0.0
        self.transfer_sec = 0.0
        self.rows_padded = 0
        self.flag_column = flag_column

    def count_padding(self, batch: pa.RecordBatch) -> None:
        """Count the rows of ``batch`` flagged as padding (a no-op without the flag)."""
        if self.flag_column is not None:
            self.rows_padded += int(pc.sum(batch.column(self.flag_column)).as_py() or 0)

    def totals(self) -> tuple[float, ...]:
        """Everything so far in this pass, in :data:`WORK_FIELDS` order."""
        io = [now - base for now, base in zip(self._io() or _NO_IO, self._base, strict=True)]
        sent = process_requests() - self._requests_base
        io[2] = sent.total  # every request this process sent, whichever reader sent it
        return (
            self.read_sec,
            self.convert_sec,
            self.transfer_sec,
            self.rows_padded,
            self._pieces,
            *io,
            *(now - base for now, base in zip(_process_counts(), self._process_base, strict=True)),
            *sent.as_tuple(),
        )

    def delta(self) -> tuple[float, ...]:
        """What changed since the previous call (the first call: everything so far)."""
        now = self.totals()
        out = tuple(a - b for a, b in zip(now, self._sent, strict=True))
        self._sent = now
        return out

    def files_delta(self) -> FileCounts:
        """Rows skipped per file since the previous call (``()``: none)."""
        now = bad_data_files()
        if now == self._files_sent:
            return ()
        out = tuple(
            (path, rows - self._files_sent.get(path, 0))
            for path, rows in sorted(now.items())
            if rows != self._files_sent.get(path, 0)
        )
        self._files_sent = now
        return out
