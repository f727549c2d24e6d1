"""The seam between planning and reading: the ChunkReader protocol."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.config import BadDataConfig, CacheConfig, FetchConfig
from torch_dataloader_utils.io.bad import BadData
from torch_dataloader_utils.io.finish import BatchFinisher
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.types import Chunk, FileInfo
from torch_dataloader_utils.storage.cached import RemoteReads
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.partitions import Partitions

__all__ = ["ChunkReader", "IoTotals", "OpenFiles", "ReadRequest", "ReaderBase", "ReaderCounts"]

T = TypeVar("T")

IoTotals = tuple[int, int, int, int, float]
"""``(bytes_fetched, bytes_needed, requests, retries, wait_sec)`` of a process so far."""


@dataclass(frozen=True)
class ReaderCounts:
    """What one reader counted in this process so far (cumulative; the metrics take differences).

    A reader's own counters, not the process's: two loaders of one process (a training
    and an evaluation loader) never count each other's reads.

    Attributes:
        cache: ``(hits, misses, bytes_served, evictions)`` of its ``data_cache`` reads.
        bad: ``(units, rows)`` of the data it skipped (``on_bad_data``).
        bad_files: Rows it skipped per file.
        standin_rows: Rows of the stand-ins it yielded for skipped units of chunks that
            are not padding (flagged ``_is_padding`` with ``equal_batches='pad'``, yet
            not padding: the metrics subtract them from ``rows_padded``).
    """

    cache: tuple[int, int, int, int] = (0, 0, 0, 0)
    bad: tuple[int, int] = (0, 0)
    bad_files: Mapping[str, int] = field(default_factory=dict)
    standin_rows: int = 0

    def __add__(self, other: ReaderCounts) -> ReaderCounts:
        files = dict(self.bad_files)
        for path, rows in other.bad_files.items():
            files[path] = files.get(path, 0) + rows
        cache = tuple(a + b for a, b in zip(self.cache, other.cache, strict=True))
        bad = tuple(a + b for a, b in zip(self.bad, other.bad, strict=True))
        return ReaderCounts(cache, bad, files, self.standin_rows + other.standin_rows)  # type: ignore[arg-type]

    @classmethod
    def of(cls, reads: RemoteReads | None, bad: BadData) -> ReaderCounts:
        """The counts of a reader's remote reads (``None``: none) and its bad-data handling."""
        cache = reads.stats.totals() if reads is not None else (0, 0, 0, 0)
        return cls(cache, bad.totals(), bad.files(), bad.standin_rows())


@runtime_checkable
class ChunkReader(Protocol):
    """Reads one chunk's rows as record batches, already projected and filtered.

    Besides :meth:`read`, a reader declares what else it can do; :class:`ReaderBase`
    gives the defaults of a reader that can do none of it.
    """

    @property
    def fetches_ahead(self) -> bool:
        """Whether bytes come from remote storage through a read-ahead fetcher (thread pool)."""
        ...

    def read(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """Yield the chunk's rows, in file order, as batches of the output schema."""
        ...

    def schedule(self, chunks: Sequence[Chunk]) -> None:
        """Announce the chunks this process reads next, in order (remote read-ahead, checks)."""
        ...

    def use_threads(self, on: bool) -> None:
        """Decode with Arrow's thread pool (``True``) or in the calling thread."""
        ...

    def warm(self, chunks: Sequence[Chunk]) -> None:
        """Fetch ``chunks`` into the node-local ``data_cache`` while idle (the next epoch's first)."""
        ...

    def with_read_rows(self, rows: int) -> ChunkReader:
        """This reader decoding batches of about ``rows`` rows (or itself, when it cannot choose)."""
        ...

    def io_totals(self) -> IoTotals | None:
        """What this process fetched and waited for so far (``None``: not counted)."""
        ...

    def counts(self) -> ReaderCounts | None:
        """This reader's cache reads and skipped data in this process so far (``None``: none)."""
        ...


class ReaderBase:
    """The defaults of :class:`ChunkReader`'s capabilities: a reader that has none of them."""

    @property
    def fetches_ahead(self) -> bool:
        """Bytes are not fetched ahead."""
        return False

    def schedule(self, chunks: Sequence[Chunk]) -> None:
        """Nothing is fetched or checked ahead."""

    def use_threads(self, on: bool) -> None:
        """Decoding threads are not the reader's to choose."""

    def warm(self, chunks: Sequence[Chunk]) -> None:
        """Nothing is warmed (no node-local cache, or local files)."""

    def with_read_rows(self, rows: int) -> ChunkReader:
        """The batch size is not the reader's to choose: the reader itself."""
        return self  # type: ignore[return-value]  # a subclass is a ChunkReader

    def io_totals(self) -> IoTotals | None:
        """Nothing is counted."""
        return None

    def counts(self) -> ReaderCounts | None:
        """Nothing is counted."""
        return None


@dataclass(frozen=True)
class ReadRequest:
    """What every file reader is asked to read, decided once by the runtime.

    Attributes:
        fs: The filesystem of the files.
        files: File metadata by path.
        data_columns: File columns to read (outputs plus those the filter needs).
        output_columns: Columns of every output batch, in order.
        batch_size: The dataset's ``batch_size``; readers decode in batches of at least
            this many rows and the dataset re-batches exactly.
        partitions: Hive partition values per file, or ``None``.
        partition_columns: Partition keys to add as columns.
        filters: The row filter, or ``None``.
        output_schema: The schema of every output batch (files differing from it only in
            NOT NULL declarations are relabelled to it), or ``None``.
        manifest: The reshard manifest the files were planned from (as shown to users),
            or ``None`` (planned from a listing): the advice when a file changed.
        cache: The node-local ``data_cache`` of remote bytes, or ``None``.
        fetch: Retries and time budget of remote requests, or ``None`` (defaults).
        bad_data: What to do with units that do not decode (``on_bad_data``).
    """

    fs: FileSystemSpec
    files: Mapping[str, FileInfo]
    data_columns: tuple[str, ...]
    output_columns: tuple[str, ...]
    batch_size: int
    partitions: Partitions | None = None
    partition_columns: tuple[str, ...] = ()
    filters: pc.Expression | None = None
    output_schema: pa.Schema | None = None
    manifest: str | None = None
    cache: CacheConfig | None = None
    fetch: FetchConfig | None = None
    bad_data: BadDataConfig | None = None

    def reads(self) -> RemoteReads:
        """The readers' remote reads (through the ``data_cache`` when one is set)."""
        return RemoteReads(self.fs, self.cache, self.fetch, self.files)

    def bad(self) -> BadData:
        """The readers' handling of units that do not decode."""
        return BadData(self.bad_data)

    def finisher(self) -> BatchFinisher:
        """Adds partition columns, filters rows and projects, as every reader does last."""
        return BatchFinisher(
            self.output_columns, self.partitions, self.partition_columns, self.filters, self.output_schema
        )


class OpenFiles(Generic[T]):
    """The few files a reader has open, most recently used last (per process).

    Opening a file costs a footer read (and a request on object storage), so a reader
    keeps the last ``size`` files it read from. The cache never crosses a process
    boundary: it pickles empty, so each DataLoader worker opens its own files.

    Args:
        opener: Opens a path.
        size: Files kept open.
        closer: Called on a file dropped from the cache, when it needs closing.
    """

    def __init__(
        self, opener: Callable[[str], T], size: int = 4, closer: Callable[[T], Any] | None = None
    ) -> None:
        self._opener = opener
        self._size = size
        self._closer = closer
        self._open = self._empty()
        self._lock = threading.Lock()

    def _empty(self) -> BoundedDict[str, T]:
        closer = self._closer
        return BoundedDict(self._size, lru=True, on_drop=None if closer is None else lambda _, f: closer(f))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open = self._empty()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def get(self, path: str) -> T:
        """The open file of ``path`` (opened now if it is not in the cache); safe from several threads."""
        with self._lock:
            handle = self._open.get(path)
            if handle is None:
                handle = self._opener(path)
                self._open[path] = handle
        return handle

    def close(self) -> None:
        """Drop (and close, with a ``closer``) every open file."""
        with self._lock:
            self._open.clear()
