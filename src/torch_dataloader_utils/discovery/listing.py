"""Listing data files: a file, a directory (recursive), a glob, or a list of those."""

from __future__ import annotations

import concurrent.futures
import glob as _glob
import os
import posixpath
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.errors import ConfigError, DiscoveryError, NoFilesFoundError, PathNotFoundError
from torch_dataloader_utils.storage.fetch import CREDENTIALS_FIX, GaveUp, lacks_credentials, retry_call
from torch_dataloader_utils.storage.fs import FileSystemSpec, GivenFileSystem, resolve
from torch_dataloader_utils.storage.identity import mtime_of
from torch_dataloader_utils.storage.redact import redact

__all__ = [
    "DATA_SUFFIXES",
    "EarlyListing",
    "ListedFile",
    "Listing",
    "list_files",
    "parse_hive_keys",
    "remote_request",
    "start_listing",
]

_MARKERS = frozenset({"_SUCCESS", "_metadata", "_common_metadata", "_committed", "_started"})
_GLOB_CHARS = set("*?[")
DATA_SUFFIXES = (".parquet", ".pq", ".orc", ".csv", ".json", ".jsonl", ".ndjson", ".gz", ".zst", ".bz2")
"""Names that look like data files: such a remote path is asked about before it is listed."""
LISTING_THREADS = 32
"""Paths (or glob matches) of a remote filesystem listed at once."""

_T = TypeVar("_T")
_R = TypeVar("_R")


def _map(fs: FileSystemSpec, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``[fn(x) for x in items]``, concurrently on remote filesystems (each is a request)."""
    if fs.is_local or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(LISTING_THREADS, len(items))) as pool:
        return list(pool.map(fn, items))


@dataclass(frozen=True, slots=True)
class ListedFile:
    """A data file found by listing.

    Attributes:
        path: Path on its filesystem (no scheme).
        size: Size in bytes.
        mtime: Modification time (seconds) when known.
        base: The directory it was found under (for hive partition keys), or ``None``.
        etag: The object store's entity tag when the listing reports one (S3, GCS...).
    """

    path: str
    size: int
    mtime: float | None
    base: str | None
    etag: str | None = None


@dataclass(frozen=True)
class Listing:
    """The result of listing: the filesystem and the files, sorted by path."""

    fs: FileSystemSpec
    files: tuple[ListedFile, ...]
    skipped: int


def _skip(rel: str, literal: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether a file under a listed directory is not data (hidden, markers, checksums).

    ``literal`` holds path parts the user spelled out (in a glob pattern): those are
    never a reason to skip, so ``data/.cache/*.parquet`` still lists ``.cache``.
    """
    parts = rel.split("/")
    name = parts[-1]
    if name not in literal and (name in _MARKERS or name.endswith(".crc")):
        return True
    return any(p.startswith((".", "_")) and p not in literal for p in parts)


def _is_glob(path: str) -> bool:
    return any(ch in _GLOB_CHARS for ch in path)


def _etag(info: dict[str, Any]) -> str | None:
    for key in ("ETag", "etag", "md5Hash"):
        value = info.get(key)
        if isinstance(value, str) and value:
            return value.strip('"')
    return None


def _walk_local(root: str) -> Iterable[tuple[str, int, float, None]]:
    """Files under ``root``, following symlinks (directory cycles visited once)."""
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames.sort()
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)  # follows symlinks
            except FileNotFoundError:  # dangling symlink
                continue
            yield full, st.st_size, st.st_mtime, None


def remote_request(fs: FileSystemSpec, config: FetchConfig, path: str, call: Callable[[], _R]) -> _R:
    """One metadata request (listing, a manifest) to remote storage, retried within its time budget.

    Raises:
        FileNotFoundError: as the client raised it (callers name the path).
        DiscoveryError: naming the URL, the endpoint, the cause and the fix.
    """
    try:
        return retry_call(call, config)
    except GaveUp as failed:
        error = failed.error
        if isinstance(error, FileNotFoundError):
            raise error from None
        where = f"listing {fs.display(path)!r} on {fs.endpoint}"
        if lacks_credentials(error):
            raise DiscoveryError(
                f"{where} failed: no credentials were found ({type(error).__name__}: {redact(str(error))}); "
                f"{CREDENTIALS_FIX}"
            ) from error
        if isinstance(error, PermissionError):
            raise DiscoveryError(
                f"{where} was refused: {type(error).__name__}: {redact(str(error))}; check the credentials "
                "(key, secret, token) in storage_options and that they may list this bucket"
            ) from error
        raise DiscoveryError(
            f"{where} failed {failed.how(config)}; check that {fs.where_to_fix} points at a running "
            "storage server reachable from here, or raise request_timeout= / retries="
        ) from error


class EarlyListing:
    """A directory's listing, sent before it is known to be needed (:func:`start_listing`).

    Its first attempt is the request already in flight; a retry is a new call.
    :meth:`cancel` stops it between two pages when it is not needed after all.
    """

    def __init__(self, fs: FileSystemSpec, root: str, future: concurrent.futures.Future[Any]) -> None:
        self.fs, self.root, self._future = fs, root, future
        self._started = time.monotonic()
        self._used = False

    def cancel(self) -> None:
        """Not needed: stop it (the pages already sent stay counted)."""
        self._future.cancel()

    def call(self, root: str) -> Callable[[], Any]:
        """The listing of ``root`` as :func:`remote_request` calls it: the early one first."""

        def again() -> Any:
            return self.fs.call("find", root, withdirs=False, detail=True)

        def first() -> Any:
            if self._used or root != self.root:
                return again()
            self._used = True
            deadline = self.fs.deadline
            wait = (
                None if deadline is None or deadline <= 0 else deadline - (time.monotonic() - self._started)
            )
            try:
                return self._future.result(timeout=None if wait is None else max(0.0, wait))
            except concurrent.futures.TimeoutError:
                self._future.cancel()
                from fsspec.exceptions import FSTimeoutError

                raise FSTimeoutError(f"listing {root!r} took over {deadline} s") from None

        return first


def start_listing(
    path: object,
    storage_options: dict[str, Any] | None,
    fetch: FetchConfig,
    filesystem: GivenFileSystem | None,
) -> EarlyListing | None:
    """Start listing the remote directory ``path`` now, beside another request (the manifest's search).

    Looking for a reshard manifest and listing the directory would otherwise be two
    round trips one after the other, before the first footer: with the listing sent
    beside the search, a directory that has no manifest costs the same requests one
    round trip sooner; one that has is read from its manifest and the listing stopped
    (after at most its first page). ``None`` where the listing cannot be stopped (a
    client the library did not make, a local path) or is not a plain directory listing
    (a list, a glob, a name that looks like a data file).
    """
    if not isinstance(path, (str, os.PathLike)):
        return None
    text = os.fspath(path)
    if _is_glob(text) or text.rstrip("/").lower().endswith(DATA_SUFFIXES):
        return None
    try:
        fs, stripped = resolve(
            text,
            storage_options,
            timeout=fetch.attempt_timeout,
            deadline=fetch.request_timeout,
            filesystem=filesystem,
        )
        root = stripped.rstrip("/")
        future = fs.start_call("find", root, withdirs=False, detail=True)
    except Exception:  # the listing proper will meet it again, and report it
        return None
    return None if future is None else EarlyListing(fs, root, future)


def _list_dir(
    fs: FileSystemSpec, root: str, config: FetchConfig, early: EarlyListing | None = None
) -> Iterable[tuple[str, int, float | None, str | None]]:
    if fs.is_local:
        yield from _walk_local(root)
        return
    if early is not None:
        call = early.call(root)
    else:

        def call() -> Any:
            return fs.call("find", root, withdirs=False, detail=True)

    found = remote_request(fs, config, root, call)
    for path, info in found.items():
        yield path, int(info.get("size") or 0), mtime_of(info), _etag(info)


def _exists(fs: FileSystemSpec, path: str, config: FetchConfig) -> bool:
    """Whether ``path`` names an existing file or directory, read literally (no pattern)."""
    if fs.is_local:
        return os.path.exists(path)
    return bool(remote_request(fs, config, path, lambda: fs.call("exists", path)))


def _list_one(
    fs: FileSystemSpec, path: str, config: FetchConfig, early: EarlyListing | None = None
) -> tuple[list[ListedFile], int]:
    fs.fsspec()  # built first: a client that refuses its options raises as it does, not as a listing
    # A path that exists as spelled is that path, even with glob characters in its name
    # (``run[1]`` is a directory, not the pattern matching ``run1``).
    if _is_glob(path) and not _exists(fs, path, config):
        if fs.is_local:
            matches = sorted(_glob.glob(path, recursive=True))
        else:
            matches = sorted(remote_request(fs, config, path, lambda: fs.call("glob", path)))
        base = path[: min(path.index(c) for c in _GLOB_CHARS if c in path)].rsplit("/", 1)[0]
        files: list[ListedFile] = []
        skipped = 0

        def _rel(p: str) -> str:
            p = p.replace(os.sep, "/")
            return posixpath.relpath(p, base.replace(os.sep, "/")) if base else p.lstrip("/")

        pattern_parts = set(_rel(path).split("/"))
        kept = []
        for m in matches:
            if _skip(_rel(m), literal=pattern_parts):
                skipped += 1
            else:
                kept.append(m)
        for m_files, m_skipped in _map(fs, lambda m: _list_one(fs, m, config), kept):
            skipped += m_skipped
            # The glob's fixed prefix is the base of every match, so hive keys in the
            # matched part (data/year=*/...) are kept.
            files.extend(ListedFile(f.path, f.size, f.mtime, base, f.etag) for f in m_files)
        return files, skipped
    if fs.is_local:
        if os.path.isdir(path):
            kind = "directory"
        elif os.path.isfile(path):
            kind = "file"
        else:
            raise PathNotFoundError(
                f"path={path!r} does not exist (no such file or directory); check the spelling "
                "or the working directory"
            )
    else:
        found = _find_remote(fs, path, config, early)
        if isinstance(found, ListedFile):
            return [found], 0
        return _under(path, found)
    if kind == "directory":
        return _under(path, _list_dir(fs, path.rstrip("/"), config))
    st = os.stat(path)
    return [ListedFile(path, st.st_size, st.st_mtime, None)], 0


def _find_remote(
    fs: FileSystemSpec, path: str, config: FetchConfig, early: EarlyListing | None = None
) -> ListedFile | list[tuple[str, int, float | None, str | None]]:
    """A remote ``path``: the file it names, or the files of the directory it names.

    A path named like a data file (:data:`DATA_SUFFIXES`) is asked about first (a HEAD
    on S3), and listed only if it is a directory. Any other path is listed first: a
    directory then costs its listing alone (one request per page on S3), with no
    metadata request before it; only a listing that finds nothing, or names ``path``
    itself, is followed by a metadata request.

    Raises:
        PathNotFoundError: nothing exists at ``path``.
    """
    root = path.rstrip("/")
    if not root.lower().endswith(DATA_SUFFIXES):
        listed = list(_list_dir(fs, root, config, early))
        under = [row for row in listed if row[0].rstrip("/") != root]
        if under:
            return under
        itself = [row for row in listed if row[0].rstrip("/") == root and row[1] > 0]
        if itself:  # a file, its size and time given by the listing (s3fs asks for them)
            return ListedFile(path, *itself[0][1:3], None, itself[0][3])
    try:
        info = remote_request(fs, config, path, lambda: fs.call("info", path))
    except FileNotFoundError as exc:
        raise PathNotFoundError(
            f"path={fs.display(path)!r} does not exist; check the URL and that "
            "storage_options point at the right endpoint and account"
        ) from exc
    if info.get("type", "file") == "directory":
        return list(_list_dir(fs, root, config)) if root.lower().endswith(DATA_SUFFIXES) else []
    return ListedFile(path, int(info.get("size") or 0), mtime_of(info), None, _etag(info))


def _under(
    path: str, listed: Iterable[tuple[str, int, float | None, str | None]]
) -> tuple[list[ListedFile], int]:
    """The data files of a directory's listing (hidden files and markers skipped, counted)."""
    files, skipped = [], 0
    root = path.rstrip("/")
    posix_root = root.replace(os.sep, "/")
    prefix = posix_root + "/"
    for full, size, mtime, etag in listed:
        posix = full.replace(os.sep, "/")
        # The fast, common case first: a path under the root as listed (relpath is slow).
        rel = posix[len(prefix) :] if posix.startswith(prefix) else posixpath.relpath(posix, posix_root)
        if _skip(rel):
            skipped += 1
            continue
        files.append(ListedFile(full, size, mtime, root, etag))
    return files, skipped


def list_files(
    path: str | Sequence[str],
    storage_options: dict[str, Any] | None = None,
    fetch: FetchConfig | None = None,
    *,
    filesystem: GivenFileSystem | None = None,
    early: EarlyListing | None = None,
) -> Listing:
    """List the data files of ``path``.

    Args:
        path: A file, a directory (listed recursively, so hive trees work), a glob, or a
            list of those. URLs (``s3://...``) use fsspec with ``storage_options``. A
            path that exists as spelled is read as that path even when its name holds
            glob characters (``run[1]``); only a path that does not exist is a pattern.
        storage_options: Options for the fsspec filesystem.
        fetch: Retries and the time budget of each request to remote storage.
        filesystem: The user's filesystem object (``filesystem=``), used for every
            request instead of one built from ``storage_options``.
        early: The listing of ``path`` already sent (:func:`start_listing`): its first
            attempt is that request.

    Returns:
        The filesystem and the files, sorted and without duplicates. Hidden files and
        directories (``.`` or ``_`` prefix), ``_SUCCESS`` / ``_metadata`` markers and
        ``.crc`` checksums under a directory are skipped; symlinks are followed.

    Raises:
        PathNotFoundError: a path does not exist.
        NoFilesFoundError: no data file was found.
        DiscoveryError: remote storage did not answer, or refused (endpoint named).
        ConfigError: paths of a list are on different filesystems, or ``storage_options``
            the client would reject.
    """
    config = fetch or FetchConfig()
    if isinstance(path, (str, os.PathLike)):
        paths = [path]
    elif isinstance(path, (list, tuple)):
        paths = list(path)
    else:
        raise ConfigError(f"path={path!r} must be a string (file, directory, glob or URL) or a list of them")
    if not paths:
        raise ConfigError("path=[] is empty; pass a file, a directory, a glob or a list of them")
    spec: FileSystemSpec | None = None
    stripped_paths = []
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            raise ConfigError(f"path={p!r} must be a string (file, directory, glob or URL)")
        p_spec, stripped = resolve(
            os.fspath(p),
            storage_options,
            timeout=config.attempt_timeout,
            deadline=config.request_timeout,
            filesystem=filesystem,
        )
        if spec is None:
            spec = p_spec
        elif p_spec.protocol != spec.protocol:
            raise ConfigError(
                f"path lists files on different filesystems ({spec.protocol!r} and "
                f"{p_spec.protocol!r}); read them as separate datasets"
            )
        stripped_paths.append(stripped)
    assert spec is not None
    fs = spec
    files: dict[str, ListedFile] = {}
    skipped = 0
    first = early if len(stripped_paths) == 1 else None
    for found, n_skipped in _map(fs, lambda p: _list_one(fs, p, config, first), stripped_paths):
        skipped += n_skipped
        for f in found:
            files.setdefault(f.path, f)
    if not files:
        hint = f" ({skipped} hidden/marker files were skipped)" if skipped else ""
        raise NoFilesFoundError(
            f"no data files found under path={path!r}{hint}; point path at a directory, file or "
            "glob that holds data files (names starting with '.' or '_' and .crc files are skipped)"
        )
    return Listing(spec, tuple(files[k] for k in sorted(files)), skipped)


def parse_hive_keys(listed: ListedFile) -> list[tuple[str, str | None]]:
    """The ``key=value`` directory pairs between a file's base directory and its name.

    ``__HIVE_DEFAULT_PARTITION__`` becomes ``None``; values are URL-decoded.
    """
    if listed.base is None:
        return []
    rel = posixpath.relpath(listed.path.replace(os.sep, "/"), listed.base.replace(os.sep, "/"))
    pairs: list[tuple[str, str | None]] = []
    for part in rel.split("/")[:-1]:
        if "=" not in part:
            continue
        key, value = part.split("=", 1)
        decoded = unquote(value)
        pairs.append((unquote(key), None if decoded == "__HIVE_DEFAULT_PARTITION__" else decoded))
    return pairs
