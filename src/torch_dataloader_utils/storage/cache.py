"""The node-local cache of remote byte ranges (``data_cache=``), shared by every process.

Every rank and DataLoader worker of a node reads through one directory on local disk.
A range of a remote file is fetched from storage at most once while it is cached;
later epochs (and the other ranks of the node) read it from the disk. Layout::

    <data_cache>/tdu-cache-v2/
        usage                               bytes the cache holds (8 bytes; its lock
                                            serializes reservations and evictions)
        files/<k[:2]>/<k>/source.json       which file key ``k`` is (URL, size, version, store)
        files/<k[:2]>/<k>/<start>-<stop>    an entry: the range's bytes, then a trailer
        files/<k[:2]>/<k>/<start>-<stop>.lock   held by the process fetching the range

**Identity.** ``k`` is a digest of the file's URL, size, version (its modification
time or ETag, as planned) and store (the endpoint or account its requests reach,
however it was configured: :mod:`~torch_dataloader_utils.storage.stores`), so a
rewritten file, or the same path on another endpoint, has another key: it is never
served the old bytes.

**Entries are immutable and appear whole.** A writer writes ``<entry>.tmp-<pid>-<thread>``
and renames it into place, so a reader sees the whole entry or none. Concurrent
readers of a missing range take ``<entry>.lock`` (``flock``, released by the kernel if
the process dies): the first fetches and writes, the others wait, find the entry and
read it, so a range is fetched once however many processes want it. Every read checks
the entry's length and checksum (its 16-byte trailer: the checksum's kind, the length,
the checksum); a bad entry is removed and the range fetched again. The checksum covers
the entry's bytes, its file key and its range: an entry copied over another (another
file's, or another range's of the same file) fails it, and is never served. It is
CRC-32C (``google-crc32c``, hardware accelerated: about 6 GB/s here) where installed,
else zlib's CRC-32 (about 1-2.5 GB/s); an entry written with a kind this process cannot
compute is a miss, not an error. (The layout's version is 2: entries of version 1, whose
checksum covered the bytes alone, are never read; ``cache clear`` removes them.)

**Size and eviction.** Before writing, a process reserves the entry's size (rounded up
to 4 KiB blocks) in ``usage`` under its lock; when the reservation would pass
``data_cache_size``, the least recently used entries are removed (a hit refreshes an
entry's modification time) until the cache is 10% below the limit, and ``usage`` is
recounted from the disk, where an entry being written is counted whole: its temporary
file is created at full size under the same lock, when its bytes are granted. So the
entries never hold more than the limit. ``usage`` is opened for each reservation and
closed after it: a process holds no descriptor of a cache between reads.
A range larger than a quarter of the limit is not cached.

**Never an error.** A full disk (or any failure to write) is a warning, once per process
and minute, and the range is served without being cached; a failure to read an entry
is a miss.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import struct
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CACHE_DIRNAME",
    "CacheEntry",
    "CacheStats",
    "FileKey",
    "RangeCache",
    "process_stats",
    "range_cache",
]

log = logging.getLogger(__name__)

CACHE_DIRNAME = "tdu-cache-v2"
"""The directory the cache keeps under ``data_cache`` (the version of its layout)."""
LEGACY_DIRNAMES = ("tdu-cache-v1",)
"""Directories of older layouts: never read, removed by :meth:`RangeCache.clear`."""
BLOCK = 4096
"""Entries are counted in whole blocks of this many bytes (what they take on disk)."""
LOW_WATER = 0.9
"""An eviction brings the cache down to this fraction of its limit."""
MAX_ENTRY_FRACTION = 4
"""Ranges larger than ``limit / MAX_ENTRY_FRACTION`` are not cached."""
WRITE_PAUSE_SEC = 60.0
"""After a failed write (a full disk), a process stops writing entries for this long."""
STALE_TMP_SEC = 3600.0
"""Temporary files older than this (left by a process that died) are removed by an eviction."""

_ZLIB = b"TDU2"  # zlib.crc32 of the bytes, then of the entry's key and range
_CRC32C = b"TDV2"  # CRC-32C (Castagnoli), google-crc32c, likewise
_RANGE = struct.Struct("<QQ")
_TRAILER = struct.Struct("<4sQI")
TRAILER_BYTES = _TRAILER.size
_ENTRY = re.compile(r"^(\d+)-(\d+)$")
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

try:
    import google_crc32c as _crc32c

    _FAST = _crc32c.implementation == "c"
except ImportError:  # pragma: no cover - google-crc32c is in the cache extra
    _FAST = False


def _context(digest: str, start: int, stop: int) -> bytes:
    """What an entry's checksum covers besides its bytes: its file key and its range."""
    return digest.encode() + _RANGE.pack(start, stop)


def _checksum(data: bytes, context: bytes) -> tuple[bytes, int]:
    """``(kind, checksum)`` of an entry's bytes, then ``context``: CRC-32C where accelerated, else CRC-32."""
    if _FAST:
        return _CRC32C, int(_crc32c.extend(_crc32c.value(data), context))
    return _ZLIB, zlib.crc32(context, zlib.crc32(data))


def _verify(kind: bytes, data: bytes, context: bytes, expected: int) -> bool | None:
    """Whether ``data`` then ``context`` have the checksum ``expected`` (``None``: not computable)."""
    if kind == _ZLIB:
        return zlib.crc32(context, zlib.crc32(data)) == expected
    if kind == _CRC32C and _FAST:
        return int(_crc32c.extend(_crc32c.value(data), context)) == expected
    return None


@dataclass(frozen=True)
class FileKey:
    """The identity of a remote file version: what its cache entries are keyed by.

    Attributes:
        url: The file as a URL, e.g. ``s3://bucket/x.parquet``.
        size: Its size in bytes, as planned.
        version: Its modification time (``repr`` of the seconds) or ETag, as planned.
        store: The store its requests reach (endpoint, account, filesystem), as
            :mod:`~torch_dataloader_utils.storage.stores` names it; no secrets.
    """

    url: str
    size: int
    version: str
    store: str = ""

    @property
    def digest(self) -> str:
        """40 hex digits naming the file's directory in the cache."""
        text = json.dumps([self.url, self.size, self.version, self.store])
        return hashlib.sha256(text.encode()).hexdigest()[:40]


@dataclass
class CacheStats:
    """What one process's cache reads did (cumulative; metrics take differences).

    Attributes:
        hits: Ranges served from the cache.
        misses: Ranges fetched from storage through the cache.
        bytes_served: Bytes of the hits.
        bytes_stored: Bytes of the entries this process wrote.
        evictions: Entries this process evicted to stay under the limit.
        bypassed: Ranges fetched but not cached (full disk, too large, write errors).
        dropped: Entries that failed their length or checksum check (removed, fetched again).
    """

    hits: int = 0
    misses: int = 0
    bytes_served: int = 0
    bytes_stored: int = 0
    evictions: int = 0
    bypassed: int = 0
    dropped: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __reduce__(self) -> tuple[type[CacheStats], tuple[()]]:
        """Pickled as new counters: each process counts its own reads."""
        return (CacheStats, ())

    def add(self, **counts: int) -> None:
        """Add ``counts`` (field name -> amount)."""
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def totals(self) -> tuple[int, int, int, int]:
        """``(hits, misses, bytes_served, evictions)`` so far."""
        return (self.hits, self.misses, self.bytes_served, self.evictions)


_STATS = CacheStats()


def process_stats() -> CacheStats:
    """The counters of every cache read in this process (a forked child starts from its parent's)."""
    return _STATS


def _add(stats: CacheStats | None, **counts: int) -> None:
    """Count ``counts`` in this process's totals and in a reader's own ``stats`` (when given)."""
    _STATS.add(**counts)
    if stats is not None and stats is not _STATS:
        stats.add(**counts)


def _after_fork() -> None:
    global _CACHES_LOCK  # a thread of the parent may have held it at the fork
    _CACHES_LOCK = threading.Lock()
    _STATS.lock = threading.Lock()


_CACHES: dict[tuple[int, str, int], RangeCache] = {}
_CACHES_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_after_fork)


def range_cache(directory: str, limit: int) -> RangeCache:
    """This process's :class:`RangeCache` of ``directory`` (one per process, built on first use)."""
    key = (os.getpid(), os.path.abspath(directory), limit)
    with _CACHES_LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = _CACHES[key] = RangeCache(directory, limit)
        return cache


def _disk(nbytes: int) -> int:
    """Bytes an entry of ``nbytes`` takes on disk (whole blocks, trailer included)."""
    return -(-(nbytes + TRAILER_BYTES) // BLOCK) * BLOCK


@dataclass(frozen=True)
class CacheEntry:
    """One cached range, as :meth:`RangeCache.entries` finds it."""

    path: str
    start: int
    stop: int
    disk_bytes: int
    mtime: float


class RangeCache:
    """One cache directory as seen by one process (see the module docstring).

    Safe to use from several threads; each process builds its own (:func:`range_cache`),
    since the locks it holds are per process.

    Args:
        directory: The ``data_cache`` directory (created on first write).
        limit: Bytes the entries may hold on disk.
    """

    def __init__(self, directory: str, limit: int) -> None:
        self.directory = os.path.abspath(directory)
        self.root = os.path.join(self.directory, CACHE_DIRNAME)
        self.limit = int(limit)
        self.stats = _STATS
        self._usage_mutex = threading.Lock()
        self._paused_until = 0.0
        self._warned_at = -WRITE_PAUSE_SEC

    # -- paths ----------------------------------------------------------------------
    def _dir(self, key: FileKey) -> str:
        digest = key.digest
        return os.path.join(self.root, "files", digest[:2], digest)

    def entry_path(self, key: FileKey, start: int, stop: int) -> str:
        """Where the entry of ``[start, stop)`` of ``key`` is (whether or not it exists)."""
        return os.path.join(self._dir(key), f"{start}-{stop}")

    # -- reading --------------------------------------------------------------------
    def get(self, key: FileKey, start: int, stop: int, stats: CacheStats | None = None) -> bytes | None:
        """Bytes ``[start, stop)`` of ``key`` from the cache, or ``None`` (counted as a hit when found).

        The entry of exactly that range is looked for first, then an entry holding it.
        ``stats``: the reader's own counters, counted besides the process's.
        """
        if stop <= start:
            return b""
        data = self._read(key, start, stop, stats)
        if data is None:
            data = self._covering(key, start, stop, stats)
        if data is not None:
            _add(stats, hits=1, bytes_served=len(data))
        return data

    def _covering(self, key: FileKey, start: int, stop: int, stats: CacheStats | None) -> bytes | None:
        """``[start, stop)`` put together from entries that hold it (another chunking of the file).

        A chunk cut differently in another epoch or world asks for other ranges of the
        same bytes: any entries that together cover the range serve it.
        """
        folder = self._dir(key)
        try:
            names = os.listdir(folder)
        except OSError:
            return None
        spans = []
        for name in names:
            found = _ENTRY.match(name)
            if found is not None:
                lo, hi = int(found.group(1)), int(found.group(2))
                if lo < stop and hi > start and (lo, hi) != (start, stop):
                    spans.append((lo, hi))
        spans.sort()
        parts: list[bytes] = []
        pos = start
        i = 0
        while pos < stop:
            best: tuple[int, int] | None = None  # the entry from pos that reaches furthest
            while i < len(spans) and spans[i][0] <= pos:
                if spans[i][1] > pos and (best is None or spans[i][1] > best[1]):
                    best = spans[i]
                i += 1
            if best is None:
                return None
            data = self._read(key, best[0], best[1], stats)
            if data is None:
                return None
            end = min(stop, best[1])
            parts.append(data[pos - best[0] : end - best[0]])
            pos = end
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read(self, key: FileKey, start: int, stop: int, stats: CacheStats | None) -> bytes | None:
        """The checked payload of the entry of ``[start, stop)`` of ``key``, or ``None``."""
        path = self.entry_path(key, start, stop)
        nbytes = stop - start
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size != nbytes + TRAILER_BYTES:
                return self._drop(path, f"{size} bytes on disk for a range of {nbytes}", stats)
            data = _pread_all(fd, nbytes, 0)
            trailer = _pread_all(fd, TRAILER_BYTES, nbytes)
        except OSError as exc:
            log.debug("cache entry %s cannot be read (%s): fetched instead", path, exc)
            return None
        finally:
            os.close(fd)
        kind, length, crc = _TRAILER.unpack(trailer) if len(trailer) == TRAILER_BYTES else (b"", -1, 0)
        if kind not in (_ZLIB, _CRC32C) or length != nbytes or len(data) != nbytes:
            return self._drop(path, "its trailer does not describe it", stats)
        good = _verify(kind, data, _context(key.digest, start, stop), crc)
        if good is None:
            return None  # written by a process with another checksum: a miss
        if not good:
            return self._drop(path, "its checksum does not match its bytes, file and range", stats)
        with contextlib.suppress(OSError):
            os.utime(path)  # most recently used: evicted last
        return data

    def _drop(self, path: str, why: str, stats: CacheStats | None = None) -> bytes | None:
        """Remove a damaged entry: ``None`` (a miss)."""
        log.warning("dropping the damaged cache entry %s (%s); the range is fetched again", path, why)
        _add(stats, dropped=1)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None

    def first_entry(
        self, key: FileKey, nbytes: int, stats: CacheStats | None = None
    ) -> tuple[int, bytes] | None:
        """``(start, its first nbytes bytes)`` of the cached entry of ``key`` that starts first, or ``None``.

        The entry is checked (length, checksum) as every read is; not counted as a hit.
        """
        try:
            names = os.listdir(self._dir(key))
        except OSError:
            return None
        spans = sorted(
            (int(found.group(1)), int(found.group(2))) for name in names if (found := _ENTRY.match(name))
        )
        for lo, hi in spans:
            data = self._read(key, lo, hi, stats)
            if data is not None:
                return lo, data[:nbytes]
        return None

    def discard(self, key: FileKey, start: int, stop: int, stats: CacheStats | None = None) -> int:
        """Remove the entries of ``key`` that overlap ``[start, stop)``: how many were removed.

        For bytes that did not decode: the range is read again from storage, and the
        entries may hold the damaged bytes. Processes reading them meanwhile only miss.
        """
        folder = self._dir(key)
        try:
            names = os.listdir(folder)
        except OSError:
            return 0
        removed = 0
        for name in names:
            found = _ENTRY.match(name)
            if found is None or int(found.group(1)) >= stop or int(found.group(2)) <= start:
                continue
            path = os.path.join(folder, name)
            try:
                disk = _disk(os.stat(path).st_size - TRAILER_BYTES)
                os.unlink(path)
            except OSError:
                continue
            removed += 1
            with contextlib.suppress(OSError):
                self._release(disk)
        if removed:
            _add(stats, dropped=removed)
            log.info("data_cache: dropped %d entries of %s in [%d, %d)", removed, key.url, start, stop)
        return removed

    # -- filling --------------------------------------------------------------------
    def fill(
        self,
        key: FileKey,
        start: int,
        stop: int,
        fetch: Callable[[], bytes],
        stats: CacheStats | None = None,
    ) -> bytes:
        """Bytes ``[start, stop)`` of ``key``: from the cache, else ``fetch()`` once, and cached.

        While one process fetches a range, the others that want it wait for its entry
        (a ``flock`` on the entry's lock file) instead of fetching it too. Errors of
        ``fetch`` propagate (nothing is cached); cache errors never do. ``stats``: the
        reader's own counters, counted besides the process's.
        """
        data = self.get(key, start, stop, stats)
        if data is not None:
            return data
        with self._range_lock(key, start, stop) as locked:
            if locked:
                data = self.get(key, start, stop, stats)  # written while this process waited
                if data is not None:
                    return data
            data = fetch()
            _add(stats, misses=1)
            self.put(key, start, stop, data, stats)
            return data

    @contextlib.contextmanager
    def _range_lock(self, key: FileKey, start: int, stop: int) -> Iterator[bool]:
        """Hold the lock of one range (``False`` if it could not be taken: then no lock)."""
        path = self.entry_path(key, start, stop) + ".lock"
        fd: int | None = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if fd is not None:
                os.close(fd)
                fd = None
            log.debug("cache lock %s not taken (%s)", path, exc)
        try:
            yield fd is not None
        finally:
            if fd is not None:
                # Removed while held: a process arriving later finds the entry first. One
                # that opened this file before it was removed takes its lock, then finds
                # the entry; one that creates a new lock file finds the entry too.
                with contextlib.suppress(OSError):
                    os.unlink(path)
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def put(self, key: FileKey, start: int, stop: int, data: bytes, stats: CacheStats | None = None) -> bool:
        """Cache ``data`` as bytes ``[start, stop)`` of ``key``: whether it was written."""
        nbytes = len(data)
        if nbytes != stop - start:
            raise ValueError(f"{nbytes} bytes for the range [{start}, {stop})")
        if time.monotonic() < self._paused_until or _disk(nbytes) * MAX_ENTRY_FRACTION > self.limit:
            _add(stats, bypassed=1)
            return False
        folder = self._dir(key)
        need = _disk(nbytes)
        source = os.path.join(folder, "source.json")
        described = os.path.exists(source)
        if not described:
            need += BLOCK  # the file's source.json
        kind, crc = _checksum(data, _context(key.digest, start, stop))
        entry = self.entry_path(key, start, stop)
        opened: list[tuple[str, int]] = []

        def allocate() -> None:  # under the usage lock: any later recount sees the entry whole
            os.makedirs(folder, exist_ok=True)
            opened.append(_open_tmp(entry, nbytes + TRAILER_BYTES))

        try:
            if not self._reserve(need, allocate, stats):
                _add(stats, bypassed=1)
                return False
        except OSError as exc:
            self._cannot_write(exc, stats)
            return False
        tmp, fd = opened[0]
        try:
            if not described:
                try:
                    _write_file(source, _source(key), b"")
                except OSError:
                    os.close(fd)
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
            _finish_tmp(tmp, fd, entry, data, _TRAILER.pack(kind, nbytes, crc))
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._release(need)
            self._cannot_write(exc, stats)
            return False
        _add(stats, bytes_stored=nbytes)
        return True

    def _cannot_write(self, exc: OSError, stats: CacheStats | None = None) -> None:
        """A write failed: warn (once a minute per process), pause writing, serve uncached."""
        now = time.monotonic()
        self._paused_until = now + WRITE_PAUSE_SEC
        _add(stats, bypassed=1)
        if now - self._warned_at < WRITE_PAUSE_SEC:
            return
        self._warned_at = now
        what = "is full" if exc.errno in _FULL else "cannot be written"
        warnings.warn(
            f"data_cache {self.directory!r} {what} ({type(exc).__name__}: {exc}); remote bytes are read "
            f"without the cache for the next {WRITE_PAUSE_SEC:.0f} s. Free space there or lower "
            "data_cache_size below the free space",
            UserWarning,
            stacklevel=2,
        )

    # -- size and eviction ----------------------------------------------------------
    @contextlib.contextmanager
    def _usage(self) -> Iterator[int]:
        """The ``usage`` file, opened and locked for this process and thread (its descriptor).

        Opened for each use and closed after it (closing releases the lock): a process
        keeps no descriptor of a cache it is not writing to.
        """
        with self._usage_mutex:
            os.makedirs(self.root, exist_ok=True)
            fd = os.open(os.path.join(self.root, "usage"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield fd
            finally:
                os.close(fd)

    def _reserve(
        self, nbytes: int, allocate: Callable[[], None] | None = None, stats: CacheStats | None = None
    ) -> bool:
        """Count ``nbytes`` more in ``usage``, evicting first when they would pass the limit.

        ``allocate`` runs under the lock once the bytes are granted: it creates the entry's
        temporary file at full size, so an eviction's recount from the disk (by any
        process) counts the reservation.
        """
        with self._usage() as fd:
            used = _read_usage(fd)
            if used + nbytes > self.limit:
                used = self._evict(min(self.limit - nbytes, int(self.limit * LOW_WATER) - nbytes), stats)
                if used + nbytes > self.limit:
                    _write_usage(fd, used)
                    return False
            if allocate is not None:
                try:
                    allocate()
                except BaseException:
                    _write_usage(fd, used)
                    raise
            _write_usage(fd, used + nbytes)
            return True

    def _release(self, nbytes: int) -> None:
        with self._usage() as fd:
            _write_usage(fd, max(0, _read_usage(fd) - nbytes))

    def _evict(self, target: int, stats: CacheStats | None = None) -> int:
        """Remove least recently used entries until at most ``target`` bytes remain (under the lock).

        Returns:
            The bytes the cache holds afterwards, counted from the disk.
        """
        entries = []
        total = 0
        now = time.time()
        folders: dict[str, int] = {}
        for folder, names in self._folders():
            count = 0
            for name in names:
                path = os.path.join(folder, name)
                if ".tmp-" in name:  # being written, at its full size (or left by a dead process)
                    with contextlib.suppress(OSError):
                        st = os.stat(path)
                        if now - st.st_mtime > STALE_TMP_SEC:
                            os.unlink(path)
                        else:
                            total += -(-st.st_size // BLOCK) * BLOCK
                            count += 1  # its folder and source.json stay
                    continue
                if name == "source.json":
                    total += BLOCK
                    continue
                if _ENTRY.match(name) is None:
                    continue
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                disk = _disk(st.st_size - TRAILER_BYTES)
                entries.append((st.st_mtime, disk, path, folder))
                total += disk
                count += 1
            folders[folder] = count
        entries.sort()
        evicted = 0
        for _, disk, path, folder in entries:
            if total <= max(target, 0):
                break
            try:
                os.unlink(path)
            except OSError:
                continue
            total -= disk
            evicted += 1
            folders[folder] -= 1
            if folders[folder] == 0:  # no entry left: the file's folder goes too
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, "source.json"))
                    total -= BLOCK
                    os.rmdir(folder)
        if evicted:
            _add(stats, evictions=evicted)
            log.debug("data_cache %s: evicted %d entries, %d bytes left", self.directory, evicted, total)
        return total

    def _folders(self) -> Iterator[tuple[str, list[str]]]:
        base = os.path.join(self.root, "files")
        try:
            shards = os.listdir(base)
        except OSError:
            return
        for shard in shards:
            try:
                keys = os.listdir(os.path.join(base, shard))
            except OSError:
                continue
            for k in keys:
                folder = os.path.join(base, shard, k)
                try:
                    yield folder, os.listdir(folder)
                except OSError:
                    continue

    # -- inspection (the ``cache`` command) -----------------------------------------
    def entries(self) -> Iterator[tuple[dict[str, Any], list[CacheEntry]]]:
        """Every cached file (its ``source.json``) and its entries."""
        for folder, names in self._folders():
            source: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, "source.json")) as fh:
                source = json.load(fh)
            found = []
            for name in names:
                match = _ENTRY.match(name)
                if match is None:
                    continue
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                found.append(
                    CacheEntry(
                        path,
                        int(match.group(1)),
                        int(match.group(2)),
                        _disk(st.st_size - TRAILER_BYTES),
                        st.st_mtime,
                    )
                )
            yield source, sorted(found, key=lambda e: e.start)

    def recorded_usage(self) -> int:
        """The bytes ``usage`` says the cache holds (0 for a cache never written)."""
        path = os.path.join(self.root, "usage")
        try:
            with open(path, "rb") as fh:
                raw = fh.read(8)
        except OSError:
            return 0
        return int.from_bytes(raw, "little") if len(raw) == 8 else 0

    def clear(self) -> int:
        """Remove every entry; returns the bytes they took. Processes reading it meanwhile only miss.

        Directories of older layouts (:data:`LEGACY_DIRNAMES`) are removed too.
        """
        for legacy in LEGACY_DIRNAMES:
            old = os.path.join(self.directory, legacy)
            if os.path.isdir(old):
                gone = f"{old}.removing-{os.getpid()}"
                with contextlib.suppress(OSError):
                    os.rename(old, gone)
                    shutil.rmtree(gone, ignore_errors=True)
        if not os.path.isdir(self.root):
            return 0
        held = sum(e.disk_bytes for _, entries in self.entries() for e in entries)
        with self._usage() as fd:
            _write_usage(fd, self._evict(0))
        gone = f"{self.root}.removing-{os.getpid()}"
        with contextlib.suppress(OSError):
            os.rename(os.path.join(self.root, "files"), gone)
            shutil.rmtree(gone, ignore_errors=True)
        return held


def _source(key: FileKey) -> bytes:
    described = {"url": key.url, "size": key.size, "version": key.version, "store": key.store}
    return json.dumps(described).encode() + b"\n"


def _write_file(path: str, data: bytes, trailer: bytes) -> None:
    """Write ``data + trailer`` to ``path`` atomically (a temporary file renamed into place)."""
    _finish_tmp(*_open_tmp(path, len(data) + len(trailer)), path, data, trailer)


def _open_tmp(path: str, total: int) -> tuple[str, int]:
    """``path``'s temporary file, created at its full size ``total``: its name and descriptor.

    Its full size at once: a full disk fails here, and an eviction counts it whole.
    """
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if total and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, total)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, total)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp, fd


def _finish_tmp(tmp: str, fd: int, path: str, data: bytes, trailer: bytes) -> None:
    """Write ``data + trailer`` through ``fd`` (from :func:`_open_tmp`), close it, rename to ``path``."""
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if trailer:
                os.write(fd, trailer)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _pread_all(fd: int, nbytes: int, offset: int) -> bytes:
    data = os.pread(fd, nbytes, offset)
    if len(data) == nbytes or not data:
        return data
    parts = [data]
    got = len(data)
    while got < nbytes:
        more = os.pread(fd, nbytes - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _read_usage(fd: int) -> int:
    raw = os.pread(fd, 8, 0)
    return int.from_bytes(raw, "little") if len(raw) == 8 else 0


def _write_usage(fd: int, value: int) -> None:
    os.pwrite(fd, int(value).to_bytes(8, "little"), 0)
