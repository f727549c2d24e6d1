"""A reading process's timers and counters, carried by the batches it already sends.

A DataLoader worker times its own work — reading (storage wait + decode), converting,
packing for the transfer — and reads its reader's I/O counters (bytes fetched and
needed, requests, retries, storage wait), its reader's ``data_cache`` counters (hits,
misses, bytes served, evictions) and the units of bad data it skipped
(:meth:`~torch_dataloader_utils.io.base.ChunkReader.counts`: the reader's own, never the
process's, so two loaders of one process never count each other's). It sends no
message of its own: every group of batches it hands over (:func:`~.emit.grouped`)
carries the differences since the previous group as a short tuple of numbers
(:data:`WORK_FIELDS`), plus the rows skipped per file when there are any, which the main
process adds to the worker's :class:`~.metrics.WorkerMetrics`. No lock and no shared
memory are involved; the cost is a few clock reads per batch and one tuple per group.

When the dataset is read in the main process, the recorder reads the live
:class:`WorkStats` directly instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.io.base import ChunkReader, IoTotals, ReaderCounts
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
(:class:`~torch_dataloader_utils.storage.requests.RequestCounts`, counted per process:
where requests are sent, by the storage clients); ``requests`` is their total."""

FileCounts = tuple[tuple[str, int], ...]
"""Rows skipped per file (``on_bad_data``), as ``(file, rows)`` pairs."""


_NO_IO = (0, 0, 0, 0, 0.0)
_NO_COUNTS = ReaderCounts()


def _summed(counters: Sequence[Callable[[], IoTotals | None]]) -> Callable[[], IoTotals | None]:
    """The I/O counters of several readers, summed (``None`` when none counts)."""

    def total() -> IoTotals | None:
        found = [t for t in (c() for c in counters) if t is not None]
        if not found:
            return None
        sums = [sum(t[i] for t in found) for i in range(5)]
        return (int(sums[0]), int(sums[1]), int(sums[2]), int(sums[3]), float(sums[4]))

    return total


def _counted(readers: Sequence[ChunkReader]) -> Callable[[], ReaderCounts | None]:
    """The counts of several readers, summed (``None`` when none counts)."""
    # readers of other libraries may lack ``counts``
    counters = [c for c in (getattr(r, "counts", None) for r in readers) if callable(c)]

    def total() -> ReaderCounts | None:
        found = [n for n in (c() for c in counters) if n is not None]
        return sum(found[1:], found[0]) if found else None

    return total


class WorkStats:
    """What one pass of one reading process did so far; see the module docstring.

    Args:
        reader: The chunk reader (or the readers of several sources, summed); its
            ``io_totals()`` (when it has one) gives the I/O counters ``(bytes_fetched,
            bytes_needed, requests, retries, wait_sec)``; the requests counted are this
            process's (:func:`~.storage.requests.process_requests`).
        pieces: Pieces (chunks, or windows of the row shuffle) this pass reads.
        flag_column: The padding flag column (``equal_batches='pad'``), or ``None``.

    Attributes:
        read_sec: Seconds spent getting the next batch from the reader (storage wait,
            decoding, filtering, re-batching).
        convert_sec: Seconds converting batches to the output format.
        transfer_sec: Seconds packing batches into the buffer they cross processes in.
        rows_padded: Rows flagged as padding in the batches produced (stand-ins of skipped
            units included; :meth:`totals` leaves them out: they are ``bad_rows``).
    """

    __slots__ = (
        "_base",
        "_counts",
        "_counts_base",
        "_files_sent",
        "_io",
        "_pieces",
        "_requests_base",
        "_sent",
        "_standins_base",
        "convert_sec",
        "flag_column",
        "read_sec",
        "rows_padded",
        "transfer_sec",
    )

    def __init__(
        self, reader: ChunkReader | Sequence[ChunkReader], pieces: int, flag_column: str | None = None
    ) -> None:
        readers = reader if isinstance(reader, Sequence) else [reader]
        self._io = _summed([r.io_totals for r in readers])
        self._base = self._io() or _NO_IO
        self._counts = _counted(readers)
        now = self._counts() or _NO_COUNTS
        self._counts_base = (*now.cache, *now.bad)
        self._standins_base = now.standin_rows
        self._files_sent = dict(now.bad_files)
        self._requests_base = process_requests()
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
        io[2] = sent.total  # every request this process sent, whichever client sent it
        counts = self._counts() or _NO_COUNTS
        padded = self.rows_padded
        if self.flag_column is not None:  # stand-ins are flagged too, but counted as bad rows
            padded = max(0, padded - (counts.standin_rows - self._standins_base))
        return (
            self.read_sec,
            self.convert_sec,
            self.transfer_sec,
            padded,
            self._pieces,
            *io,
            *(now - base for now, base in zip((*counts.cache, *counts.bad), self._counts_base, strict=True)),
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
        now = dict((self._counts() or _NO_COUNTS).bad_files)
        if now == self._files_sent:
            return ()
        out = tuple(
            (path, rows - self._files_sent.get(path, 0))
            for path, rows in sorted(now.items())
            if rows != self._files_sent.get(path, 0)
        )
        self._files_sent = now
        return out
