"""Remote bytes, fetched ahead and retried: ranged reads planned from Parquet footers.

For every chunk the reader will read, the byte ranges it needs follow from the file's
footer: its ``ColumnChunkMetaData`` gives the offset and compressed size of every
column chunk, so a chunk needs exactly the projected columns of its unpruned row
groups. :class:`ChunkSource` fetches, in the worker's plan order, the footer of each
chunk's file (one request, kept for the next chunks of that file) and then those
ranges (adjacent ones coalesced, large ones split, all in parallel), for the chunk
being decoded and for the next chunks of the plan, up to ``read_ahead_bytes`` of
memory and :data:`READ_AHEAD_CHUNKS` chunks, and hands pyarrow a file that serves its
reads from the fetched bytes. A file no larger than one footer read is fetched whole in
one request. Requests run on a small pool that always serves the earliest chunk of the
plan first, so the first batch costs about one chunk's requests however many chunks
are queued behind it; nothing is fetched before the chunk that needs it is within the
read-ahead window.

Every request goes through :func:`~torch_dataloader_utils.storage.fetch.fetch_range`:
transient errors (HTTP 500/502/503/504, connection reset, timeouts) are retried with
exponential backoff, a permanent failure raises :class:`ReadError` naming the file and
the byte range. A failed chunk stops the iteration: no row is ever skipped.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.types import Chunk, FileInfo
from torch_dataloader_utils.storage.cached import ReadOnlyFile, RemoteReads
from torch_dataloader_utils.storage.footers import FOOTER_READ_BYTES, NotParquetError, read_footer
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.handles import Handles
from torch_dataloader_utils.storage.identity import FileChecks, check_footer, stale_advice

__all__ = ["ChunkSource", "FetchStats", "PlanOrderPool", "Warmer", "coalesce", "column_ranges"]

COALESCE_HOLE = 64 * 1024
"""Two ranges closer than this are fetched as one (the gap is read and thrown away).

A request costs a round trip (10-50 ms on object storage) and a fee; 64 KiB more of a
response costs well under a millisecond at any bandwidth a store serves one request
with. So the column chunks of a row group that lie 64 KiB apart or closer (narrow
unread columns between read ones) are one GET; a wider gap (an unread wide column) is
not read. ``benchmarks/bench_s3.py --section coalesce`` measures the requests saved
against the bytes over-read."""
MAX_PART_BYTES = 8 * 1024**2
"""Larger ranges are split into parts of this size, fetched in parallel."""
FETCH_THREADS = 8
"""Requests in flight at once per process."""
READ_AHEAD_CHUNKS = 32
"""Chunks of the plan fetched ahead of the one being read, at most (with small chunks
the byte bound alone would start every chunk of the worker at once); a pass starts with
fewer (:meth:`ChunkSource.ahead_chunks`)."""
FOOTER_CACHE_FILES = 1024
"""Parsed footers kept per process (for the next chunks of the same files)."""
WARM_PRIORITY = 1e12
"""Priority of the requests warming the cache for the next epoch: after every request of
the current one (a pool thread takes them only when no chunk of the plan waits)."""

R = TypeVar("R")

log = logging.getLogger(__name__)


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
        requests: Successful requests to storage (ranged reads, whole small files, file checks).
        bytes_fetched: Bytes those requests returned (coalescing gaps included).
        bytes_needed: Bytes of the column chunks (or byte ranges) the chunks needed.
        misses: Reads outside the fetched ranges, fetched on demand.
        footer_requests: Requests for footers (small files come whole instead).
        footer_bytes: Bytes of those footer reads.
        retries: Requests retried after a transient error.
        wait_sec: Seconds the reading thread waited for bytes from storage.
    """

    requests: int = 0
    bytes_fetched: int = 0
    bytes_needed: int = 0
    misses: int = 0
    footer_requests: int = 0
    footer_bytes: int = 0
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
        with self.lock:
            self.bytes_fetched += fetched
            self.bytes_needed += needed

    def totals(self) -> tuple[int, int, int, int, float]:
        """``(bytes_fetched, bytes_needed, requests, retries, wait_sec)`` so far."""
        return (self.bytes_fetched, self.bytes_needed, self.requests, self.retries, self.wait_sec)


class PlanOrderPool:
    """Threads running submitted calls in priority order (lowest first; FIFO among equals).

    The priority of a request is the position of its chunk in the plan, so the chunk
    about to be read never waits behind requests for chunks far ahead. Threads start
    on demand and end when the pool is shut down or garbage collected.

    Args:
        threads: Calls running at once.
        name: Prefix of the threads' names.
    """

    def __init__(self, threads: int, name: str = "tdu-fetch") -> None:
        self._queue: queue.PriorityQueue[tuple[float, int, Any]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._size = max(1, threads)
        self._name = name
        self._started = [0]  # threads started (a list: the finalizer reads it too)
        self._closed = False
        # The threads hold the queue, not the pool: a pool nobody holds is collected,
        # and then its threads are told to stop.
        self._finalizer = weakref.finalize(self, _stop_threads, self._queue, self._seq, self._started)

    def submit(self, priority: float, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run ``fn(*args)`` when no call of a lower priority is waiting.

        Raises:
            RuntimeError: the pool is shut down.
        """
        if self._closed:
            raise RuntimeError("cannot schedule new requests after shutdown")
        future: Future[R] = Future()
        self._queue.put((priority, next(self._seq), (future, fn, args)))
        if self._started[0] < self._size:
            self._started[0] += 1
            name = f"{self._name}-{self._started[0]}"
            threading.Thread(target=_run_calls, args=(self._queue,), name=name, daemon=True).start()
        return future

    def shutdown(self) -> None:
        """Cancel the waiting calls and stop the threads (running calls finish)."""
        self._closed = True
        self._finalizer()


def _run_calls(calls: queue.PriorityQueue[tuple[float, int, Any]]) -> None:
    while True:
        _, _, item = calls.get()
        if item is None:
            return
        future, fn, args = item
        if not future.set_running_or_notify_cancel():
            continue
        try:
            result = fn(*args)
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)
        del future, fn, args, item


def _stop_threads(
    calls: queue.PriorityQueue[tuple[float, int, Any]], seq: Iterator[int], started: list[int]
) -> None:
    """Cancel the calls still waiting and send every thread a stop marker."""
    while True:
        try:
            _, _, item = calls.get_nowait()
        except queue.Empty:
            break
        if item is not None:
            item[0].cancel()
    for _ in range(started[0]):
        calls.put((float("inf"), next(seq), None))


def _best_effort(call: Callable[[], object]) -> None:
    try:
        call()
    except Exception as exc:  # the chunk is fetched when it is read
        log.debug("warming the cache failed (the chunk is fetched when read): %s", exc)


class Warmer:
    """Warms the node-local cache on one thread of the reading process, when it is idle.

    For readers without a fetch pool of their own (ORC, CSV / JSONL): each call runs at
    :data:`WARM_PRIORITY`, best effort (a failure is logged at DEBUG). Pickles empty; a
    forked process starts its own thread.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._pool: PlanOrderPool | None = None
        self._futures: list[Future[None]] = []

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._reset()

    def submit(self, calls: Sequence[Callable[[], object]]) -> None:
        """Run ``calls`` in order on the warming thread."""
        if self._pid != os.getpid():
            self._reset()
        if self._pool is None:
            self._pool = PlanOrderPool(1, name="tdu-warm")
        self._futures = [f for f in self._futures if not f.done()]
        for i, call in enumerate(calls):
            self._futures.append(self._pool.submit(WARM_PRIORITY + i, _best_effort, call))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the calls submitted so far; whether they all ended."""
        done, pending = wait_futures(self._futures, timeout)
        del done
        return not pending

    def close(self) -> None:
        """Stop the thread (calls not started are dropped)."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown()
        self._pool = None


class _SparseFile(ReadOnlyFile):
    """A read-only file of ``size`` bytes whose reads are served from fetched ranges.

    A read outside them (rare: a writer's column sizes that undercount) is fetched on
    demand, with retries.
    """

    def __init__(self, size: int, ranges: Sequence[tuple[int, bytes]], miss: Callable[[int, int], bytes]):
        super().__init__(size)
        self._starts = [start for start, _ in ranges]
        self._data = [memoryview(data) for _, data in ranges]
        self._miss = miss

    def read(self, size: int | None = -1) -> bytes:
        """Bytes from the position: a zero-copy view of a fetched range (pyarrow takes any buffer)."""
        start, stop = self._span(size)
        if stop <= start:
            return b""
        i = bisect.bisect_right(self._starts, start) - 1
        data: Any
        if i >= 0 and stop - self._starts[i] <= len(self._data[i]):
            lo = start - self._starts[i]
            data = self._data[i][lo : lo + stop - start]
        else:
            data = self._miss(start, stop)
        self._pos = stop
        return data  # type: ignore[no-any-return]


class _Fetch:
    """The requests of one chunk: its footer first (when not known yet), then its ranges.

    ``nbytes`` is an estimate (the chunk's row groups, all columns) until the footer is
    known, then the bytes of the chunk's coalesced ranges.
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.ranges: list[tuple[int, int]] = []
        self.futures: list[Future[bytes]] = []
        self.whole: bytes | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.ready = threading.Event()

    def result(self) -> list[tuple[int, bytes]]:
        self.ready.wait()
        if self.error is not None:
            raise self.error
        if self.whole is not None:
            return [(0, self.whole)]
        try:
            return [(r[0], f.result()) for r, f in zip(self.ranges, self.futures, strict=True)]
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        self.cancelled = True
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
        footers: Footer buffers by path (as :func:`read_footer` returns), when already
            read; any other footer is fetched when a chunk of its file is first fetched.
        config: Read-ahead bound and retries.
        threads: Requests in flight at once.
        filtered: The plan counts only rows passing a filter (see :func:`check_footer`).
        manifest: The reshard manifest the files were planned from (as shown), or ``None``.
        reads: The remote reads through the node-local ``data_cache``, when one is set:
            every range and footer then comes from the cache or is fetched once into it,
            and a file is checked against the plan only before its first fetch from
            storage in a pass (:attr:`cached`).
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
        filtered: bool = False,
        manifest: str | None = None,
        reads: RemoteReads | None = None,
    ) -> None:
        self.fs = fs
        self._filtered = filtered
        self._manifest = manifest
        self.config = config or FetchConfig()
        self._files = files
        self._columns = None if columns is None else list(columns)
        self._footers = dict(footers or {})
        self._threads = threads
        self._reads = reads if reads is not None else RemoteReads(fs, None, self.config)
        self._checks = FileChecks(fs, files, manifest=manifest)
        self._reset()

    @property
    def cached(self) -> bool:
        """Whether bytes go through the node-local cache (then this source checks files itself)."""
        return self._reads.active

    @property
    def reads(self) -> RemoteReads:
        """The remote reads its bytes come through (their cache counters, reading a file again)."""
        return self._reads

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._pool: PlanOrderPool | None = None
        self._metadata: BoundedDict[str, pq.FileMetaData] = BoundedDict(FOOTER_CACHE_FILES, lru=True)
        self._loading: dict[str, Future[pq.FileMetaData]] = {}
        self._meta_lock = threading.Lock()
        self._plan: list[Chunk] = []
        self._cursor = 0
        self._pending: dict[int, _Fetch] = {}
        self._handles = Handles()  # this reader's open native files (per process)
        self._observing: bool | None = None
        self._warming: list[Future[None]] = []
        self.stats = FetchStats()

    def __getstate__(self) -> dict[str, object]:
        keep = ("fs", "config", "_files", "_columns", "_filtered", "_manifest", "_reads", "_checks")
        state = {k: v for k, v in self.__dict__.items() if k in keep}
        state["_footers"] = self._footers
        state["_threads"] = self._threads
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # -- per-process state --------------------------------------------------------
    def _check_process(self) -> None:
        """Start clean in a process forked with this source's state (a DataLoader worker)."""
        if self._pid != os.getpid():
            self._reset()

    def _executor(self) -> PlanOrderPool:
        self._check_process()
        if self._pool is None:
            self._pool = PlanOrderPool(self._threads)
        return self._pool

    # -- footers --------------------------------------------------------------------
    def _remember(self, path: str, meta: pq.FileMetaData) -> None:
        with self._meta_lock:
            self._metadata[path] = meta

    def _known(self, path: str) -> pq.FileMetaData | None:
        with self._meta_lock:
            return self._metadata.get(path)

    def _parse(self, path: str, footer: bytes) -> pq.FileMetaData:
        try:
            meta = pq.read_metadata(pa.BufferReader(footer))
        except (OSError, pa.ArrowException) as exc:
            raise ReadError(
                f"the footer of {self.fs.display(path)!r} cannot be read ({exc}); the file changed "
                f"since the dataset was built: {stale_advice(self._manifest)}"
            ) from exc
        check_footer(
            self.fs.display(path),
            self._files[path],
            meta,
            filtered=self._filtered,
            manifest=self._manifest,
            columns=self._columns,
        )
        self._remember(path, meta)
        return meta

    def _load_footer(self, path: str) -> pq.FileMetaData:
        footer = self._footers.pop(path, None)
        if footer is None:
            size = self._files[path].size
            fetch = None
            if self.cached:
                fetch = functools.partial(self._read, path, on_request=self._footer_request, metadata=True)
            try:
                footer = read_footer(
                    self.fs, path, size, self.config, on_request=self._footer_request, fetch=fetch
                )
            except NotParquetError as exc:
                raise ReadError(
                    f"{self.fs.display(path)!r} has no Parquet footer any more ({exc}); the file "
                    f"changed since the dataset was built: {stale_advice(self._manifest)}"
                ) from exc
        return self._parse(path, footer)

    def _footer_request(self, nbytes: int) -> None:
        with self.stats.lock:
            self.stats.footer_requests += 1
            self.stats.footer_bytes += nbytes

    def _footer_future(self, path: str, priority: float) -> Future[pq.FileMetaData]:
        """The footer of ``path``: known, being fetched, or fetched now at ``priority``."""
        meta = self._known(path)
        if meta is not None:
            done: Future[pq.FileMetaData] = Future()
            done.set_result(meta)
            return done
        loading = self._loading.get(path)
        if loading is None or loading.cancelled():
            loading = self._executor().submit(priority, self._load_footer, path)
            self._loading[path] = loading
            loading.add_done_callback(functools.partial(self._loaded, path))
        return loading

    def _loaded(self, path: str, _future: Future[pq.FileMetaData]) -> None:
        self._loading.pop(path, None)

    def metadata(self, path: str) -> pq.FileMetaData:
        """The footer of ``path`` (fetched on first use, parsed once per process).

        Raises:
            ReadError: it could not be fetched or parsed.
        """
        meta = self._known(path)
        if meta is not None:
            return meta
        if path in self._footers:
            return self._parse(path, self._footers.pop(path))
        return self._footer_future(path, -1).result()

    def needed_ranges(self, chunk: Chunk) -> list[tuple[int, int]]:
        """The column-chunk byte ranges ``chunk`` needs (before coalescing)."""
        return self._ranges_of(chunk, self.metadata(chunk.path))

    def _ranges_of(self, chunk: Chunk, meta: pq.FileMetaData) -> list[tuple[int, int]]:
        groups = self._files[chunk.path].groups_in(chunk.start, chunk.stop)
        return column_ranges(meta, [g.index for g in groups], self._columns)

    def _requests_of(self, chunk: Chunk, meta: pq.FileMetaData) -> list[tuple[int, int]]:
        """The ranges ``chunk`` is fetched in: its column chunks, coalesced.

        Through the cache, ranges are coalesced within each row group only: chunks are
        cut at row-group edges in other ways in other epochs and worlds (row mixing
        splits a worker's chunks into streams), and each row group then still finds its
        entries whole, instead of reading a larger entry to cut a part out of it.
        """
        if not self.cached:
            return coalesce(self._ranges_of(chunk, meta))
        groups = self._files[chunk.path].groups_in(chunk.start, chunk.stop)
        return [r for g in groups for r in coalesce(column_ranges(meta, [g.index], self._columns))]

    # -- fetching -------------------------------------------------------------------
    def _read(
        self, path: str, start: int, stop: int, *, on_request: Callable[[int], None], metadata: bool = False
    ) -> bytes:
        """Bytes of ``path``, with retries, from a file checked against the plan once per pass.

        Through the cache, the file is checked before its first fetch from storage. Where
        a read's response tells the file's state (S3), the first read of the file in the
        pass checks it (:meth:`FileChecks.read_checked`: no request of its own); elsewhere
        a metadata request checks it (sent ahead when the pass was scheduled).
        """
        info = self._files[path]
        observing = self._observes()
        checked = functools.partial(self._checks.read_checked, path, info.size, info.mtime)
        return self._reads.fetch(
            path,
            start,
            stop,
            size=info.size,
            version=info.mtime,
            on_request=on_request,
            on_retry=self.stats.retry,
            metadata=metadata,
            before_fetch=None if observing else functools.partial(self._check, path),
            handles=self._handles,
            through=checked if observing else None,
        )

    def _observes(self) -> bool:
        """Whether reads check their file themselves (:attr:`FileSystemSpec.observes`), in this process."""
        if self._observing is None:
            self._observing = self.fs.observes
        return self._observing

    def _check(self, path: str) -> None:
        info = self._files[path]
        self._checks.check(path, info.size, info.mtime, self._check_request)

    def _check_request(self) -> None:
        self.stats.add(0)  # a metadata request: counted, no bytes

    def _fetch(self, path: str, start: int, stop: int) -> bytes:
        return self._read(path, start, stop, on_request=self.stats.add)

    def _estimate(self, chunk: Chunk) -> int:
        """Bytes ``chunk`` will fetch: exact when its footer is known, else its row groups' size."""
        meta = self._known(chunk.path)
        if meta is not None:
            return sum(hi - lo for lo, hi in self._requests_of(chunk, meta))
        info = self._files[chunk.path]
        if info.size <= FOOTER_READ_BYTES:
            return info.size
        return sum(g.num_bytes for g in info.groups_in(chunk.start, chunk.stop))

    def _start(self, chunk: Chunk, priority: float) -> _Fetch:
        """Start fetching ``chunk``: its footer if needed, then its ranges (in plan order)."""
        pool = self._executor()
        fetch = _Fetch(self._estimate(chunk))
        path = chunk.path
        size = self._files[path].size
        if self._known(path) is None and path not in self._footers and size <= FOOTER_READ_BYTES:
            # A small file: one request brings its footer and every column chunk.
            future = pool.submit(priority, self._fetch_whole, chunk, fetch)
            future.add_done_callback(lambda f: self._whole_done(f, fetch))
            return fetch
        if path in self._footers:
            footer: Future[pq.FileMetaData] = Future()
            try:
                footer.set_result(self._parse(path, self._footers.pop(path)))
            except ReadError as exc:
                footer.set_exception(exc)
        else:
            footer = self._footer_future(path, priority)
        footer.add_done_callback(lambda f: self._footer_done(f, chunk, fetch, priority))
        return fetch

    def _fetch_whole(self, chunk: Chunk, fetch: _Fetch) -> bytes:
        data = self._fetch(chunk.path, 0, self._files[chunk.path].size)
        meta = self._known(chunk.path)
        if meta is None:
            length = int.from_bytes(data[-8:-4], "little") if len(data) >= 12 else -1
            if data[-4:] != b"PAR1" or not 0 <= length <= len(data) - 12:
                raise ReadError(
                    f"{self.fs.display(chunk.path)!r} has no Parquet footer any more; the file "
                    f"changed since the dataset was built: {stale_advice(self._manifest)}"
                )
            meta = self._parse(chunk.path, b"PAR1" + data[-(length + 8) :])
        needed = self._ranges_of(chunk, meta)
        with self.stats.lock:
            self.stats.bytes_needed += sum(hi - lo for lo, hi in needed)
        fetch.nbytes = len(data)
        return data

    @staticmethod
    def _whole_done(future: Future[bytes], fetch: _Fetch) -> None:
        try:
            fetch.whole = future.result()
        except BaseException as exc:
            fetch.error = exc
        finally:
            fetch.ready.set()

    def _footer_done(
        self, footer: Future[pq.FileMetaData], chunk: Chunk, fetch: _Fetch, priority: float
    ) -> None:
        """The footer of ``chunk`` is known: start its ranges (runs on a pool thread)."""
        try:
            meta = footer.result()
            if fetch.cancelled:
                raise RuntimeError("the chunk's fetch was cancelled")
            needed = self._ranges_of(chunk, meta)
            ranges = self._requests_of(chunk, meta)
            with self.stats.lock:
                self.stats.bytes_needed += sum(hi - lo for lo, hi in needed)
            fetch.nbytes = sum(hi - lo for lo, hi in ranges)
            pool = self._pool
            if pool is None:
                raise RuntimeError("the fetch pool was closed")
            fetch.ranges = ranges
            fetch.futures = [pool.submit(priority, self._fetch, chunk.path, lo, hi) for lo, hi in ranges]
        except BaseException as exc:
            fetch.error = exc
        finally:
            fetch.ready.set()

    def schedule(self, chunks: Sequence[Chunk]) -> None:
        """Announce the chunks about to be read, in order: they are fetched ahead."""
        # In a forked worker, reset before keeping the plan: a reset at the first read
        # would drop it, and every chunk would then be fetched only when read.
        self._check_process()
        # A new pass: each file is checked again, at its first fetch (through the cache, or
        # by its first read where reads tell the file's state), else by a metadata request
        # sent ahead in the order of the chunks.
        ahead = self.cached or self.fs.is_local or self._observes()
        self._checks.schedule(() if ahead else [c.path for c in chunks], self._check_request)
        for fetch in self._pending.values():
            fetch.cancel()
        self._plan = list(chunks)
        self._cursor = 0
        self._pending = {}

    def ahead_chunks(self, read: int) -> int:
        """Chunks fetched ahead once ``read`` chunks of the pass were read: it grows with the pass.

        A pass starts with as many as there are requests in flight (:data:`FETCH_THREADS`),
        and one more for every 4 chunks read, up to :data:`READ_AHEAD_CHUNKS`. Requests
        queued beyond those in flight go out no sooner (the pool sends the earliest
        first), but with small chunks their CPU (a GET through botocore is about 2 ms)
        delays the first batch: over 1,000 files of 50 rows at 10 ms per request, the
        first batch needs 21 chunks and came after 49 GETs, in 160 ms with 32 ahead from
        the start, 103 ms with this ramp (medians of 5, same run); an epoch of those
        files, and one of 8 large files at 20 ms, took the same time either way.
        """
        return min(READ_AHEAD_CHUNKS, self._threads + read // 4)

    def _read_ahead(self, first: int) -> None:
        budget = self.config.read_ahead_bytes
        used = sum(f.nbytes for f in self._pending.values())
        last = min(len(self._plan), first + self.ahead_chunks(first))
        for i in range(first, last):
            if i in self._pending:
                continue
            if used >= budget:
                return
            chunk = self._plan[i]
            estimate = self._estimate(chunk)
            if used + estimate > budget:
                return
            self._pending[i] = self._start(chunk, i)
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
            fetch = self._start(chunk, -1)
        else:
            for stale in [i for i in self._pending if i < index]:
                self._pending.pop(stale).cancel()
            self._cursor = index + 1
            pending = self._pending.pop(index, None)
            fetch = pending if pending is not None else self._start(chunk, index)
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
            pa.PythonFile(sparse, mode="r"),
            metadata=self.metadata(chunk.path),
            pre_buffer=False,
            page_checksum_verification=True,
        )

    def warm(self, chunks: Sequence[Chunk]) -> None:
        """Fetch the bytes of ``chunks`` into the node-local cache when the fetch threads are idle.

        For the next epoch's first chunks (``data_cache_prefetch``); best effort: a
        failure is logged at DEBUG and the chunk is fetched when it is read. Nothing
        happens without a cache.
        """
        if not self.cached:
            return
        pool = self._executor()
        self._warming = [f for f in self._warming if not f.done()]
        for i, chunk in enumerate(chunks):
            self._warming.append(pool.submit(WARM_PRIORITY + i, self._warm_one, chunk))

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Wait for the chunks given to :meth:`warm` so far; whether they were all fetched (or failed)."""
        _, pending = wait_futures(self._warming, timeout)
        return not pending

    def _warm_one(self, chunk: Chunk) -> None:
        try:
            meta = self._known(chunk.path)
            if meta is None:  # in this thread: a pool thread never waits on another's request
                meta = self._load_footer(chunk.path)
            for lo, hi in self._requests_of(chunk, meta):
                self._fetch(chunk.path, lo, hi)
        except Exception as exc:
            log.debug("warming the cache with %s failed (it is fetched when read): %s", chunk.path, exc)

    def close(self) -> None:
        """Cancel pending requests and stop the thread pool."""
        for fetch in self._pending.values():
            fetch.cancel()
        self._pending = {}
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown()
        self._pool = None
        self._handles.close()
