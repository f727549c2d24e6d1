"""Remote bytes, fetched ahead and retried: ranged reads planned from Parquet footers.

For every chunk the reader will read, the byte ranges it needs are known before any
data is read: the footer's ``ColumnChunkMetaData`` gives the offset and compressed size
of every column chunk, so a chunk needs exactly the projected columns of its unpruned
row groups. :class:`ChunkSource` fetches those ranges (adjacent ones coalesced, large
ones split, all in parallel) for the chunk being decoded and for the next chunks of
the worker's plan, up to ``read_ahead_bytes`` of memory, and hands pyarrow a file that
serves its reads from the fetched bytes.

Every request goes through :func:`~torch_dataloader_utils.storage.fetch.fetch_range`:
transient errors (HTTP 500/502/503/504, connection reset, timeouts) are retried with
exponential backoff, a permanent failure raises :class:`ReadError` naming the file and
the byte range. A failed chunk stops the iteration: no row is ever skipped.
"""

from __future__ import annotations

import bisect
import io
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.plan.types import Chunk, FileInfo
from torch_dataloader_utils.storage.fetch import fetch_range
from torch_dataloader_utils.storage.footers import read_footer
from torch_dataloader_utils.storage.fs import FileSystemSpec

__all__ = ["ChunkSource", "FetchStats", "coalesce", "column_ranges"]

COALESCE_HOLE = 4096
"""Two ranges closer than this are fetched as one (the gap is read and thrown away)."""
MAX_PART_BYTES = 8 * 1024**2
"""Larger ranges are split into parts of this size, fetched in parallel."""
FETCH_THREADS = 8
"""Requests in flight at once per process."""


def column_ranges(
    metadata: pq.FileMetaData, row_groups: Iterable[int], columns: Sequence[str] | None
) -> list[tuple[int, int]]:
    """Byte ranges of the column chunks of ``columns`` in ``row_groups``, in file order.

    Args:
        metadata: The file's footer.
        row_groups: Row-group indices.
        columns: Top-level column names (every leaf under each), or ``None`` for all.
    """
    schema = metadata.schema
    wanted = set(columns) if columns is not None else None
    leaves = [
        j
        for j in range(metadata.num_columns)
        if wanted is None or schema.column(j).path.split(".")[0] in wanted
    ]
    out = []
    for i in row_groups:
        rg = metadata.row_group(i)
        for j in leaves:
            col = rg.column(j)
            start = col.data_page_offset
            dictionary = col.dictionary_page_offset
            if dictionary is not None and 0 < dictionary < start:
                start = dictionary
            out.append((start, start + col.total_compressed_size))
    out.sort()
    return out


def coalesce(
    ranges: Sequence[tuple[int, int]], hole: int = COALESCE_HOLE, part: int = MAX_PART_BYTES
) -> list[tuple[int, int]]:
    """Merge ranges closer than ``hole`` bytes, then split any longer than ``part``."""
    merged: list[list[int]] = []
    for start, stop in sorted(ranges):
        if merged and start - merged[-1][1] <= hole:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    out = []
    for start, stop in merged:
        for lo in range(start, stop, part):
            out.append((lo, min(stop, lo + part)))
    return out


@dataclass
class FetchStats:
    """I/O counters of a reader in one process (cumulative; a worker reports differences).

    Attributes:
        requests: Successful requests to storage (ranged reads, file checks).
        bytes_fetched: Bytes those requests returned (coalescing gaps included).
        bytes_needed: Bytes of the column chunks (or byte ranges) the chunks needed.
        misses: Reads outside the fetched ranges, fetched on demand.
        retries: Requests retried after a transient error.
        wait_sec: Seconds the reading thread waited for bytes from storage.
    """

    requests: int = 0
    bytes_fetched: int = 0
    bytes_needed: int = 0
    misses: int = 0
    retries: int = 0
    wait_sec: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("lock")  # a lock does not pickle (spawned workers); made again below
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        """Count one successful request of ``nbytes``."""
        with self.lock:
            self.requests += 1
            self.bytes_fetched += nbytes

    def retry(self) -> None:
        """Count one retried request."""
        with self.lock:
            self.retries += 1

    def read(self, fetched: int, needed: int) -> None:
        """Count bytes read without requests of their own (a local file): fetched and needed."""
        self.bytes_fetched += fetched
        self.bytes_needed += needed

    def totals(self) -> tuple[int, int, int, int, float]:
        """``(bytes_fetched, bytes_needed, requests, retries, wait_sec)`` so far."""
        return (self.bytes_fetched, self.bytes_needed, self.requests, self.retries, self.wait_sec)


class _SparseFile(io.RawIOBase):
    """A read-only file of ``size`` bytes whose reads are served from fetched ranges.

    A read outside them (rare: a writer's column sizes that undercount) is fetched on
    demand, with retries.
    """

    def __init__(self, size: int, ranges: Sequence[tuple[int, bytes]], miss: Callable[[int, int], bytes]):
        super().__init__()
        self._size = size
        self._starts = [start for start, _ in ranges]
        self._data = [data for _, data in ranges]
        self._miss = miss
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        start = self._pos
        stop = self._size if size is None or size < 0 else min(self._size, start + size)
        if stop <= start:
            return b""
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and stop - self._starts[i] <= len(self._data[i]):
            lo = start - self._starts[i]
            data = self._data[i][lo : lo + stop - start]
        else:
            data = self._miss(start, stop)
        self._pos = stop
        return data

    def readall(self) -> bytes:
        return self.read(-1)


class _Fetch:
    """The in-flight or finished requests of one chunk."""

    def __init__(self, ranges: list[tuple[int, int]], futures: list[Future[bytes]], nbytes: int):
        self.ranges = ranges
        self.futures = futures
        self.nbytes = nbytes

    def result(self) -> list[tuple[int, bytes]]:
        try:
            return [(r[0], f.result()) for r, f in zip(self.ranges, self.futures, strict=True)]
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        for f in self.futures:
            f.cancel()


class ChunkSource:
    """Fetches the bytes of Parquet chunks, the next ones ahead of the current one.

    One per reader; it holds only values when pickled to a DataLoader worker, and builds
    its thread pool and filesystem client in the process that reads.

    Args:
        fs: The filesystem.
        files: File metadata (size, unpruned row groups) by path.
        columns: Top-level columns to read.
        footers: Footer buffers by path (as :func:`read_footer` returns); a missing one
            is fetched on first use.
        config: Read-ahead bound and retries.
        threads: Requests in flight at once.
    """

    def __init__(
        self,
        fs: FileSystemSpec,
        files: Mapping[str, FileInfo],
        *,
        columns: Sequence[str] | None,
        footers: Mapping[str, bytes] | None = None,
        config: FetchConfig | None = None,
        threads: int = FETCH_THREADS,
    ) -> None:
        self.fs = fs
        self.config = config or FetchConfig()
        self._files = files
        self._columns = None if columns is None else list(columns)
        self._footers = dict(footers or {})
        self._threads = threads
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._pool: ThreadPoolExecutor | None = None
        self._metadata: dict[str, pq.FileMetaData] = {}
        self._plan: list[Chunk] = []
        self._cursor = 0
        self._pending: dict[int, _Fetch] = {}
        self.stats = FetchStats()

    def __getstate__(self) -> dict[str, object]:
        state = {k: v for k, v in self.__dict__.items() if k in ("fs", "config", "_files", "_columns")}
        state["_footers"] = self._footers
        state["_threads"] = self._threads
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # -- per-process state --------------------------------------------------------
    def _own_process(self) -> None:
        """Start clean in a forked process (the parent's threads and requests are not here)."""
        if self._pid != os.getpid():
            self._reset()

    def _executor(self) -> ThreadPoolExecutor:
        self._own_process()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="tdu-fetch")
        return self._pool

    def metadata(self, path: str) -> pq.FileMetaData:
        """The footer of ``path`` (parsed once per process)."""
        meta = self._metadata.get(path)
        if meta is None:
            footer = self._footers.get(path)
            if footer is None:
                footer = read_footer(self.fs, path, self._files[path].size, self.config)
                self._footers[path] = footer
            meta = pq.read_metadata(pa.BufferReader(footer))
            self._metadata[path] = meta
        return meta

    def needed_ranges(self, chunk: Chunk) -> list[tuple[int, int]]:
        """The column-chunk byte ranges ``chunk`` needs (before coalescing)."""
        groups = self._files[chunk.path].groups_in(chunk.start, chunk.stop)
        return column_ranges(self.metadata(chunk.path), [g.index for g in groups], self._columns)

    # -- fetching -------------------------------------------------------------------
    def _fetch(self, path: str, start: int, stop: int) -> bytes:
        size = self._files[path].size
        return fetch_range(
            self.fs,
            path,
            start,
            stop,
            size=size,
            config=self.config,
            on_request=self.stats.add,
            on_retry=self.stats.retry,
        )

    def _start(self, chunk: Chunk) -> _Fetch:
        needed = self.needed_ranges(chunk)
        ranges = coalesce(needed)
        pool = self._executor()
        futures = [pool.submit(self._fetch, chunk.path, lo, hi) for lo, hi in ranges]
        with self.stats.lock:
            self.stats.bytes_needed += sum(hi - lo for lo, hi in needed)
        return _Fetch(ranges, futures, sum(hi - lo for lo, hi in ranges))

    def schedule(self, chunks: Sequence[Chunk]) -> None:
        """Announce the chunks about to be read, in order: they are fetched ahead."""
        # In a forked worker, reset before keeping the plan: a reset at the first read
        # would drop it, and every chunk would then be fetched only when read.
        self._own_process()
        for fetch in self._pending.values():
            fetch.cancel()
        self._plan = list(chunks)
        self._cursor = 0
        self._pending = {}

    def _read_ahead(self, first: int) -> None:
        budget = self.config.read_ahead_bytes
        used = sum(f.nbytes for f in self._pending.values())
        for i in range(first, len(self._plan)):
            if i in self._pending:
                continue
            if used >= budget:
                return
            chunk = self._plan[i]
            estimate = sum(hi - lo for lo, hi in coalesce(self.needed_ranges(chunk)))
            if used + estimate > budget:
                return
            self._pending[i] = self._start(chunk)
            used += estimate

    def open(self, chunk: Chunk) -> pq.ParquetFile:
        """A ParquetFile for reading ``chunk``, served from its fetched bytes.

        Waits for the chunk's requests (started ahead when it was scheduled), then
        starts fetching the following chunks within the read-ahead bound.

        Raises:
            ReadError: a request failed permanently (file and byte range named).
        """
        self._executor()
        index = None
        for i in range(self._cursor, len(self._plan)):
            if self._plan[i] == chunk:
                index = i
                break
        if index is None:
            fetch = self._start(chunk)
        else:
            for stale in [i for i in self._pending if i < index]:
                self._pending.pop(stale).cancel()
            self._cursor = index + 1
            pending = self._pending.pop(index, None)
            fetch = pending if pending is not None else self._start(chunk)
            self._read_ahead(index + 1)
        waited = time.perf_counter()
        data = fetch.result()
        self.stats.wait_sec += time.perf_counter() - waited
        size = self._files[chunk.path].size

        def miss(start: int, stop: int) -> bytes:
            with self.stats.lock:
                self.stats.misses += 1
            began = time.perf_counter()
            try:
                return self._fetch(chunk.path, start, stop)
            finally:
                with self.stats.lock:
                    self.stats.wait_sec += time.perf_counter() - began

        sparse = _SparseFile(size, data, miss)
        # pre_buffer off: the bytes are in memory already, and its coalescing would read
        # across the gaps (unprojected columns) that were never fetched.
        return pq.ParquetFile(
            pa.PythonFile(sparse, mode="r"), metadata=self.metadata(chunk.path), pre_buffer=False
        )

    def close(self) -> None:
        """Cancel pending requests and stop the thread pool."""
        for fetch in self._pending.values():
            fetch.cancel()
        self._pending = {}
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
