"""Remote reads, through the node-local cache when there is one: the path every reader's bytes take.

:class:`RemoteReads` is what the readers ask for the bytes of remote files: ranges
(:meth:`RemoteReads.fetch`: Parquet column chunks and footers, with retries) and files
opened for random access (:meth:`RemoteReads.open`: ORC stripes, CSV / JSONL byte
ranges; :func:`open_blocks`: Iceberg data files). Every remote read goes through
:func:`~torch_dataloader_utils.storage.fetch.fetch_range`: transient errors are retried
within ``request_timeout``, a response shorter than asked is an error (retried), and a
failure for good is a :class:`~torch_dataloader_utils.errors.ReadError`. Without
``data_cache`` a file opened for random access is a :class:`RangeFile` (one request per
read, as the native client makes); local files are opened natively.

**Reading again.** A unit that does not decode is decoded once more from bytes read
again from storage before it may count as bad data
(:func:`~torch_dataloader_utils.io.bad.decode_again`): :meth:`RemoteReads.fresh` opens
the file so that every read is fetched now, never from the cache, and the cache's
entries it overlaps are dropped (they may hold the damaged bytes). A file object
remembers the error of its last failed fetch (:attr:`ReadOnlyFile.error`), since a
decoder may report a failed read as a decoding error of its own (pyarrow's ORC reader
turns any exception of the file into an ``OSError``).

With ``data_cache``, every range goes through the :class:`~.cache.RangeCache` of the
node, keyed by the file's identity *as planned* (URL, size, and version: the listing's
ETag, else the modification time) and the store its requests reach (:mod:`~.stores`:
the endpoint or account however it was configured, or the ``filesystem=`` object's): a
hit costs no request at all. A file opened for random access is served in aligned
blocks of :data:`BLOCK_BYTES` (each one cache entry), so readers that read a file piece
by piece (ORC, text) share blocks between chunks and epochs. ``before_fetch`` runs
before any byte is fetched from storage: the readers pass their check that the file is
still the planned one, so a file whose bytes all come from the cache costs no metadata
request either (its bytes are those of the planned version, by their key). A file
whose modification time is unknown is never cached (its identity would be its size
alone).

**Checked before it is cached.** A whole object fetched to be cached is compared with
its ETag where that is the MD5 of its bytes (:meth:`RemoteReads._vouched`). A file
versioned by a modification time in whole seconds (no ETag) has its first cached entry
compared with storage once per process before any of its ranges is served
(:meth:`RemoteReads._witness`): a rewrite of the same size in the same second never
mixes two generations.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from torch_dataloader_utils.config import CacheConfig, FetchConfig
from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.plan.types import FileInfo
from torch_dataloader_utils.storage.cache import CacheStats, FileKey, RangeCache, range_cache
from torch_dataloader_utils.storage.fetch import fetch_range
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.handles import Handles
from torch_dataloader_utils.storage.identity import Verify
from torch_dataloader_utils.storage.stores import store_identity

__all__ = [
    "BLOCK_BYTES",
    "BlockFile",
    "OpenedFile",
    "RangeFile",
    "ReadOnlyFile",
    "RemoteReads",
    "fetch_error",
    "file_key",
    "open_blocks",
]

BLOCK_BYTES = 4 * 1024**2
"""Block size of files opened for random access through the cache (one entry per block)."""
WITNESS_BYTES = 4096
"""Bytes of a cached entry compared with storage before a weakly versioned file is served
from the cache in a process (:meth:`RemoteReads._witness`)."""
VOUCH_READS = 3
"""Reads again of a whole object whose bytes do not match its MD5 ETag (:meth:`RemoteReads._vouched`)."""

_MD5 = re.compile(r"[0-9a-f]{32}")


def _weak(version: str) -> bool:
    """Whether a key's version is a modification time in whole seconds (the same for a rewrite then)."""
    try:
        return float(version).is_integer()
    except ValueError:
        return False  # an ETag, or a marker of immutable files


log = logging.getLogger(__name__)

Fetch = Callable[[int, int], bytes]


def file_key(
    fs: FileSystemSpec, path: str, size: int, version: float | str | None, store: str | None = None
) -> FileKey | None:
    """The cache key of ``path`` as planned, or ``None`` when it must not be cached.

    The key names the store too (the same bucket on two endpoints is two files), however
    its endpoint was configured: ``store`` (:func:`~.stores.store_identity` of ``fs``,
    computed here when not given). ``version`` is the planned modification time (or an
    ETag, or a marker of immutable files such as Iceberg's); without one, the file is
    not cached.
    """
    if version is None:
        return None
    if store is None:
        store = store_identity(fs.protocol, fs.storage_options, fs.user)
    shown = repr(version) if isinstance(version, float) else str(version)
    return FileKey(fs.display(path), int(size), shown, store)


class RemoteReads:
    """The remote reads of one reader, through the node-local cache when one is configured.

    A picklable value: each process (a DataLoader worker) opens its own cache handle.

    Args:
        fs: The files' filesystem.
        cache: The ``data_cache`` options (``None`` or no directory: no cache).
        config: Retries and time budget of the requests.
    """

    def __init__(
        self,
        fs: FileSystemSpec,
        cache: CacheConfig | None = None,
        config: FetchConfig | None = None,
        files: Mapping[str, FileInfo] | None = None,
    ):
        self.fs = fs
        self.cache_config = cache if cache is not None and cache.enabled else None
        self.config = config or FetchConfig()
        self.files = files
        self._reset()

    def _reset(self) -> None:
        self._store: str | None = None
        self.stats = CacheStats()  # each process counts its own reads
        self._handles = Handles()  # files opened without the cache (RangeFile), kept open
        self._witnessed: set[str] = set()  # files whose cached generation was checked (or needs none)
        self._witnessing: dict[str, threading.Lock] = {}
        self._unverifiable: set[str] = set()  # files whose ETag is not the MD5 of their bytes
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"fs": self.fs, "cache_config": self.cache_config, "config": self.config, "files": self.files}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def etag(self, path: str) -> str | None:
        """The ETag ``path`` was listed with (quotes removed), or ``None``."""
        info = self.files.get(path) if self.files is not None else None
        etag = info.etag if info is not None else None
        return etag.strip('"') if etag else None

    def key(self, path: str, size: int, version: float | str | None) -> FileKey | None:
        """The cache key of ``path`` (:func:`file_key`; the store's identity computed once).

        The version is the listed ETag where the store gave one (a rewrite of the same
        size in the same second has another), else ``version`` (the modification time).
        """
        if version is None:
            return None
        if self._store is None:
            self._store = store_identity(self.fs.protocol, self.fs.storage_options, self.fs.user)
        etag = self.etag(path)
        return file_key(self.fs, path, size, f"etag {etag}" if etag else version, self._store)

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

        def request(lo: int = start, hi: int = stop, verify: Verify | None = None) -> bytes:
            return fetch_range(
                self.fs,
                path,
                lo,
                hi,
                size=size,
                config=self.config,
                on_request=on_request,
                on_retry=on_retry,
                metadata=metadata,
                handles=handles,
                verify=verify,
            )

        def checked(lo: int = start, hi: int = stop) -> bytes:
            """A fetch from storage, the file checked first (or by the fetch's own response)."""
            if through is not None:
                return through(lambda verify: request(lo, hi, verify))
            if before_fetch is not None:
                before_fetch()
            return request(lo, hi)

        def from_storage() -> bytes:
            data = checked()
            if start == 0 and stop == size:  # the whole object, to be cached: what its ETag may vouch for
                data = self._vouched(path, data, request)
            return data

        cache = self.cache()
        key = self.key(path, size, version) if cache is not None else None
        if cache is None or key is None:
            return checked()  # not kept: a unit that does not decode is read again anyway
        if key.digest not in self._witnessed:
            with self._witness_lock(key.digest):  # other threads wait for the check's outcome
                if key.digest not in self._witnessed:
                    self._witness(cache, key, path, checked)
                    self._witnessed.add(key.digest)
        return cache.fill(key, start, stop, from_storage, self.stats)

    def _witness_lock(self, digest: str) -> threading.Lock:
        with self._lock:
            lock = self._witnessing.get(digest)
            if lock is None:
                lock = self._witnessing[digest] = threading.Lock()
            return lock

    def _vouched(self, path: str, data: bytes, request: Callable[[], bytes]) -> bytes:
        """A whole object's bytes checked against its ETag where that is their MD5 (else as read).

        A single-part upload's ETag is the MD5 of its bytes on S3 and most S3 servers; a
        multipart, SSE-KMS or SSE-C object's is not. Bytes that do not match are read
        again: bytes that match replace them; the same bytes twice mean the ETag is no MD5
        of them (the file is not checked again); bytes that differ at every read raise.

        Raises:
            ReadError: no two reads agreed (:data:`~torch_dataloader_utils.io.bad.READS_TO_AGREE`).
        """
        etag = self.etag(path)
        if etag is None or not _MD5.fullmatch(etag) or path in self._unverifiable:
            return data
        if hashlib.md5(data, usedforsecurity=False).hexdigest() == etag:
            return data
        for _ in range(VOUCH_READS):
            again = request()
            if hashlib.md5(again, usedforsecurity=False).hexdigest() == etag:
                log.warning("%s: a response did not match its ETag (MD5) and was read again", path)
                return again
            if again == data:  # not an MD5 of the bytes (SSE-KMS, another server's scheme)
                with self._lock:
                    self._unverifiable.add(path)
                return data
            data = again
        raise ReadError(
            f"{self.fs.display(path)!r}: its bytes differed from its ETag (MD5) {etag!r} and from "
            f"each other at each of {VOUCH_READS + 1} reads: the storage or the network returns damaged "
            "data. Check the endpoint (a proxy, a faulty disk or NIC) and read again"
        )

    def _witness(
        self,
        cache: RangeCache,
        key: FileKey,
        path: str,
        request: Callable[[int, int], bytes],
    ) -> None:
        """Once per process and file: check that cached ranges of a weakly versioned file are its bytes now.

        A key versioned by a modification time in whole seconds (an object store that
        gave no ETag) is the same for a file rewritten at the same size in the same
        second. Before this process serves any cached range of it, the start of its first
        cached entry is compared with storage (one request, :data:`WITNESS_BYTES`);
        entries of another generation are dropped, so one file's bytes never mix two
        generations. Strongly versioned keys (an ETag, Iceberg's immutable files, a
        modification time finer than the second) need no check.
        """
        if not _weak(key.version):
            return
        first = cache.first_entry(key, WITNESS_BYTES, self.stats)
        if first is None:
            return
        lo, cached = first
        if request(lo, lo + len(cached)) != cached:  # the file checked before (or by) this request
            dropped = cache.discard(key, 0, key.size, self.stats)
            log.warning(
                "data_cache: %s was rewritten with the same size in the same second as the version "
                "cached (its bytes at %d differ): %d cached ranges of the old version dropped",
                key.url,
                lo,
                dropped,
            )

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
        """``path`` opened for random access (a pyarrow ``NativeFile``).

        Local files: the native file. Remote files: through the cache in aligned blocks
        (:class:`BlockFile`), else one request per read (:class:`RangeFile`); retried.
        """
        if self.fs.is_local:
            return self.fs.arrow().open_input_file(path)
        cache = self.cache()
        key = self.key(path, size, version) if cache is not None else None
        if cache is None or key is None:

            def fetch(lo: int, hi: int) -> bytes:
                return self.fetch(
                    path, lo, hi, size=size, version=None, on_request=on_request, handles=self._handles
                )

            return OpenedFile(RangeFile(size, fetch))

        def block(lo: int, hi: int) -> bytes:
            return self.fetch(
                path, lo, hi, size=size, version=version, before_fetch=before_fetch, on_request=on_request
            )

        return OpenedFile(BlockFile(size, block))

    def fresh(self, path: str, *, size: int, version: float | str | None) -> RangeFile:
        """``path`` read anew: every read fetched from storage now (retried, its length checked).

        Never served from the cache; the cache's entries overlapping a read are dropped
        (they may hold the bytes that did not decode). Wrap it in ``pyarrow.PythonFile``
        to hand it to a decoder; its :attr:`~ReadOnlyFile.error` tells a failed fetch
        from a decoding error.
        """
        cache = self.cache()
        key = self.key(path, size, version) if cache is not None else None

        def fetch(lo: int, hi: int) -> bytes:
            if cache is not None and key is not None:
                cache.discard(key, lo, min(hi, size), self.stats)
            return fetch_range(self.fs, path, lo, hi, size=size, config=self.config)

        return RangeFile(size, fetch, track=True)

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
        if self.fs.is_local:
            return self.fs.arrow().open_input_stream(path, compression=compression)
        raw = self.open(path, size=size, version=version, before_fetch=before_fetch)
        return pa.CompressedInputStream(raw, compression) if compression else raw  # type: ignore[arg-type]


def open_blocks(
    cache: CacheConfig | None, key: FileKey | None, size: int, fetch: Fetch, stats: CacheStats | None = None
) -> Any | None:
    """A file of ``size`` bytes whose blocks come from the cache, else from ``fetch(lo, hi)``.

    For storages reached through another client than a :class:`FileSystemSpec`
    (Iceberg's FileIO). ``None`` without a cache or a key: the caller opens the file itself.
    ``stats``: the reader's own counters.
    """
    directory = cache.directory if cache is not None else None
    if cache is None or directory is None or key is None:
        return None
    store = range_cache(directory, cache.data_cache_size)
    return pa.PythonFile(
        BlockFile(size, lambda lo, hi: store.fill(key, lo, hi, lambda: fetch(lo, hi), stats)), mode="r"
    )


class OpenedFile(pa.PythonFile):
    """A pyarrow file over one of the library's files, kept as :attr:`source`.

    A decoder may report the error of a failed read as one of its own (pyarrow's ORC
    reader turns any exception of the file into an ``OSError``): :func:`fetch_error`
    finds the real one through :attr:`source`.
    """

    def __init__(self, source: ReadOnlyFile) -> None:
        self.source = source


def fetch_error(handle: object) -> BaseException | None:
    """The error of the last fetch of ``handle`` (an :class:`OpenedFile`) when it failed, else ``None``."""
    source = getattr(handle, "source", None)
    return source.error if isinstance(source, ReadOnlyFile) else None


class ReadOnlyFile(io.RawIOBase):
    """A read-only, seekable file of ``size`` bytes; subclasses implement :meth:`read`.

    Handed to pyarrow as ``pyarrow.PythonFile(f, mode="r")``.

    Attributes:
        error: The error of the last fetch when it failed (``None``: it did not). A
            decoder may report it as a decoding error of its own; this tells them apart.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0
        self.error: BaseException | None = None
        self._sticky = False  # keep the first error (a file read for one decode)

    def _fetched(self, fetch: Fetch, lo: int, hi: int) -> bytes:
        """``fetch(lo, hi)``, its error remembered (:attr:`error`) and raised."""
        try:
            data = fetch(lo, hi)
        except BaseException as exc:
            if self.error is None or not self._sticky:
                self.error = exc
            raise
        if not self._sticky:
            self.error = None
        return data

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
        data = self._fetched(self._block, lo, min(self._size, lo + self._bytes))
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


class RangeFile(ReadOnlyFile):
    """A read-only file of ``size`` bytes whose every read is one ``fetch(lo, hi)``.

    What a native input file does (one request per read), through the library's fetch:
    retried, its length checked, a failure remembered (:attr:`~ReadOnlyFile.error`).
    With ``track`` (a file read for one decode), a digest of what was read
    (:meth:`digest`) tells whether two reads of a unit returned the same bytes, and
    :attr:`~ReadOnlyFile.error` keeps the first failed fetch (else the last fetch's).
    """

    def __init__(self, size: int, fetch: Fetch, *, track: bool = False) -> None:
        super().__init__(size)
        self._fetch = fetch
        self._hash = hashlib.blake2b(digest_size=16) if track else None
        self._sticky = track

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes from the position (all the rest for ``-1``)."""
        start, stop = self._span(size)
        if stop <= start:
            return b""
        data = self._fetched(self._fetch, start, stop)
        if self._hash is not None:
            self._hash.update(start.to_bytes(8, "little") + len(data).to_bytes(8, "little"))
            self._hash.update(data)
        self._pos = start + len(data)
        return data

    def digest(self) -> bytes:
        """A digest of the offsets and bytes read so far (``track=True``), in order."""
        if self._hash is None:
            raise ValueError("a RangeFile made without track=True keeps no digest")
        return self._hash.digest()

    def size(self) -> int:
        """The file's size."""
        return self._size
