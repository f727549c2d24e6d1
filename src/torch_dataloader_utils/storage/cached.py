"""Remote reads, through the node-local cache when there is one: the path every reader's bytes take.

:class:`RemoteReads` is what the readers ask for the bytes of remote files: ranges
(:meth:`RemoteReads.fetch`: Parquet column chunks and footers, with retries) and files
opened for random access (:meth:`RemoteReads.open`: ORC stripes, CSV / JSONL byte
ranges; :meth:`RemoteReads.open_blocks`: Iceberg data files). Without ``data_cache``, or
for local files, it does exactly what the readers did before it existed:
:func:`~torch_dataloader_utils.storage.fetch.fetch_range` and the filesystem's own
``open_input_file``.

With ``data_cache``, every range goes through the :class:`~.cache.RangeCache` of the
node, keyed by the file's identity *as planned* (URL with endpoint, size, modification
time): a hit costs no request at all. A file opened for random access is served in
aligned blocks of :data:`BLOCK_BYTES` (each one cache entry), so readers that read a
file piece by piece (ORC, text) share blocks between chunks and epochs. ``before_fetch``
runs before any byte is fetched from storage: the readers pass their check that the
file is still the planned one, so a file whose bytes all come from the cache costs no
metadata request either (its bytes are those of the planned version, by their key).
A file whose modification time is unknown is never cached (its identity would be its
size alone).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from torch_dataloader_utils.config import CacheConfig, FetchConfig
from torch_dataloader_utils.storage.cache import FileKey, RangeCache, range_cache
from torch_dataloader_utils.storage.fetch import fetch_range
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.handles import Handles
from torch_dataloader_utils.storage.identity import Verify

__all__ = ["BLOCK_BYTES", "BlockFile", "ReadOnlyFile", "RemoteReads", "file_key", "open_blocks"]

BLOCK_BYTES = 4 * 1024**2
"""Block size of files opened for random access through the cache (one entry per block)."""

Fetch = Callable[[int, int], bytes]


def file_key(fs: FileSystemSpec, path: str, size: int, version: float | str | None) -> FileKey | None:
    """The cache key of ``path`` as planned, or ``None`` when it must not be cached.

    The URL names the endpoint too (the same bucket on two endpoints is two files).
    ``version`` is the planned modification time (or an ETag, or a marker of immutable
    files such as Iceberg's); without one, the file is not cached.
    """
    if version is None:
        return None
    url = fs.display(path)
    options = fs.storage_options
    client = options.get("client_kwargs")
    if options.get("endpoint_url") or (isinstance(client, dict) and client.get("endpoint_url")):
        url = f"{url}@{fs.endpoint}"  # the endpoint as fs.endpoint shows it: secrets hidden
    return FileKey(url, int(size), repr(version) if isinstance(version, float) else str(version))


class RemoteReads:
    """The remote reads of one reader, through the node-local cache when one is configured.

    A picklable value: each process (a DataLoader worker) opens its own cache handle.

    Args:
        fs: The files' filesystem.
        cache: The ``data_cache`` options (``None`` or no directory: no cache).
        config: Retries and time budget of the requests.
    """

    def __init__(
        self, fs: FileSystemSpec, cache: CacheConfig | None = None, config: FetchConfig | None = None
    ):
        self.fs = fs
        self.cache_config = cache if cache is not None and cache.enabled else None
        self.config = config or FetchConfig()

    @property
    def active(self) -> bool:
        """Whether reads go through a cache (a cache is configured and the files are remote)."""
        return self.cache_config is not None and not self.fs.is_local

    def cache(self) -> RangeCache | None:
        """This process's cache handle, or ``None`` without a cache."""
        config = self.cache_config
        if config is None or self.fs.is_local:
            return None
        directory = config.directory
        assert directory is not None
        return range_cache(directory, config.data_cache_size)

    # -- ranges ---------------------------------------------------------------------
    def fetch(
        self,
        path: str,
        start: int,
        stop: int,
        *,
        size: int,
        version: float | str | None,
        on_request: Callable[[int], None] | None = None,
        on_retry: Callable[[], None] | None = None,
        metadata: bool = False,
        before_fetch: Callable[[], None] | None = None,
        handles: Handles | None = None,
        through: Callable[[Callable[[Verify | None], bytes]], bytes] | None = None,
    ) -> bytes:
        """Bytes ``[start, stop)`` of ``path`` (clipped to ``size``): cached, or fetched with retries.

        ``on_request`` and ``on_retry`` are called for requests to storage only (a hit
        makes none); ``before_fetch`` before the first of them. ``handles``: the reader's
        open native files (see :func:`~torch_dataloader_utils.storage.fetch.fetch_range`).
        ``through``, instead of ``before_fetch``: runs a fetch from storage, giving it the
        check of the file its response makes, or ``None``
        (:meth:`~torch_dataloader_utils.storage.identity.FileChecks.read_checked`).
        """
        stop = min(stop, size)

        def read(verify: Verify | None) -> bytes:
            return fetch_range(
                self.fs,
                path,
                start,
                stop,
                size=size,
                config=self.config,
                on_request=on_request,
                on_retry=on_retry,
                metadata=metadata,
                handles=handles,
                verify=verify,
            )

        def from_storage() -> bytes:
            if through is not None:
                return through(read)
            if before_fetch is not None:
                before_fetch()
            return read(None)

        cache = self.cache()
        key = file_key(self.fs, path, size, version) if cache is not None else None
        if cache is None or key is None:
            return from_storage()
        return cache.fill(key, start, stop, from_storage)

    # -- files ----------------------------------------------------------------------
    def open(
        self,
        path: str,
        *,
        size: int,
        version: float | str | None,
        before_fetch: Callable[[], None] | None = None,
        on_request: Callable[[int], None] | None = None,
    ) -> Any:
        """``path`` opened for random access (a pyarrow ``NativeFile``)."""
        cache = self.cache()
        key = file_key(self.fs, path, size, version) if cache is not None else None
        if cache is None or key is None:
            return self.fs.arrow().open_input_file(path)

        def block(lo: int, hi: int) -> bytes:
            return self.fetch(
                path, lo, hi, size=size, version=version, before_fetch=before_fetch, on_request=on_request
            )

        return pa.PythonFile(BlockFile(size, block), mode="r")

    def open_stream(
        self,
        path: str,
        *,
        size: int,
        version: float | str | None,
        compression: str | None,
        before_fetch: Callable[[], None] | None = None,
    ) -> Any:
        """``path`` as a sequential stream, decompressed with ``compression`` (pyarrow codec name)."""
        if not self.active or version is None:
            return self.fs.arrow().open_input_stream(path, compression=compression)
        raw = self.open(path, size=size, version=version, before_fetch=before_fetch)
        return pa.CompressedInputStream(raw, compression) if compression else raw  # type: ignore[arg-type]


def open_blocks(cache: CacheConfig | None, key: FileKey | None, size: int, fetch: Fetch) -> Any | None:
    """A file of ``size`` bytes whose blocks come from the cache, else from ``fetch(lo, hi)``.

    For storages reached through another client than a :class:`FileSystemSpec`
    (Iceberg's FileIO). ``None`` without a cache or a key: the caller opens the file itself.
    """
    directory = cache.directory if cache is not None else None
    if cache is None or directory is None or key is None:
        return None
    store = range_cache(directory, cache.data_cache_size)
    return pa.PythonFile(
        BlockFile(size, lambda lo, hi: store.fill(key, lo, hi, lambda: fetch(lo, hi))), mode="r"
    )


class ReadOnlyFile(io.RawIOBase):
    """A read-only, seekable file of ``size`` bytes; subclasses implement :meth:`read`.

    Handed to pyarrow as ``pyarrow.PythonFile(f, mode="r")``.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        """Always ``True``."""
        return True

    def seekable(self) -> bool:
        """Always ``True``."""
        return True

    def tell(self) -> int:
        """The position."""
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move the position (as ``io.RawIOBase.seek``)."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readall(self) -> bytes:
        """The rest of the file."""
        return self.read(-1)

    def _span(self, size: int | None) -> tuple[int, int]:
        """``(start, stop)`` of a read of ``size`` bytes from the position (clipped to the end)."""
        start = self._pos
        return start, self._size if size is None or size < 0 else min(self._size, start + size)


class BlockFile(ReadOnlyFile):
    """A read-only file of ``size`` bytes read in aligned blocks of :data:`BLOCK_BYTES`.

    ``block(lo, hi)`` returns the bytes of one block (from the cache or storage); the
    last block read is kept, so small sequential reads cost one block each.
    """

    def __init__(self, size: int, block: Fetch, block_bytes: int = BLOCK_BYTES) -> None:
        super().__init__(size)
        self._block = block
        self._bytes = block_bytes
        self._held: tuple[int, bytes] | None = None

    def _get(self, index: int) -> bytes:
        held = self._held
        if held is not None and held[0] == index:
            return held[1]
        lo = index * self._bytes
        data = self._block(lo, min(self._size, lo + self._bytes))
        self._held = (index, data)
        return data

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes from the position (all the rest for ``-1``)."""
        start, stop = self._span(size)
        if stop <= start:
            return b""
        parts = []
        pos = start
        while pos < stop:
            index = pos // self._bytes
            data = self._get(index)
            lo = pos - index * self._bytes
            take = min(stop - pos, len(data) - lo)
            if take <= 0:
                break
            parts.append(data[lo : lo + take] if (lo, take) != (0, len(data)) else data)
            pos += take
        self._pos = pos
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def size(self) -> int:
        """The file's size."""
        return self._size
