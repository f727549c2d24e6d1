"""Files are read as they were planned: their size and modification time are checked on open.

A plan holds row-group indices, row ranges and byte offsets taken from a file's metadata
when the dataset was built. If the file is rewritten afterwards (other row groups, more
or fewer rows, another column type), those numbers describe a file that no longer
exists: read blindly, rows are lost, duplicated or mis-typed without an error. So every
reader calls :func:`check_unchanged` when it opens a file, and a file whose size or
modification time differs from the planned ones raises :class:`FileChangedError`.

A reader announces the files of its next pass (:func:`schedule_checks`, when a worker
starts an epoch), so files it keeps open across epochs are checked again. Local files
cost one ``stat`` there and on every open. Remote files cost a metadata request (a HEAD
on S3): they are checked concurrently while the reader reads, and each open waits for
its file's answer; a file no pass announced is checked once per process. Object stores
report modification times in whole seconds on some calls, so remote times are compared
to the second; the size exactly.
"""

from __future__ import annotations

import datetime as _dt
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow.fs as pafs

from torch_dataloader_utils.errors import FileChangedError, ReadError
from torch_dataloader_utils.storage.fs import FileSystemSpec

__all__ = ["check_size", "check_unchanged", "current_state", "mtime_of", "schedule_checks"]

CHECK_THREADS = 8
"""Remote files checked at once by :func:`schedule_checks`."""

_Key = tuple[int, str, str, int, float | None]
_CHECKS: dict[_Key, Future[None]] = {}
_LOCK = threading.Lock()
_POOL: list[tuple[int, ThreadPoolExecutor]] = []


def mtime_of(info: Mapping[str, Any]) -> float | None:
    """Modification time (seconds since the epoch) in an fsspec ``info`` dict, if any."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        timestamp = getattr(value, "timestamp", None)
        if callable(timestamp):
            return float(timestamp())
    return None


def current_state(fs: FileSystemSpec, path: str) -> tuple[int, float | None]:
    """``(size, mtime)`` of ``path`` now, asked from the storage (never from a cache)."""
    if fs.is_local:
        st = os.stat(path)  # follows symlinks, as listing does
        return st.st_size, st.st_mtime
    if fs.native:
        info = fs.arrow().get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(path)
        mtime = info.mtime.timestamp() if info.mtime is not None else None
        return int(info.size or 0), mtime
    client = fs.fsspec()
    client.invalidate_cache(path)
    details = client.info(path)
    return int(details.get("size") or 0), mtime_of(details)


def _same_time(planned: float, now: float, remote: bool) -> bool:
    if remote:  # listings give milliseconds, HEAD requests whole seconds
        return int(planned) == int(now)
    return planned == now


def _when(mtime: float | None) -> str:
    if mtime is None:
        return "unknown"
    return _dt.datetime.fromtimestamp(mtime, tz=_dt.UTC).isoformat(timespec="microseconds")


def _pool() -> ThreadPoolExecutor:
    pid = os.getpid()
    if not _POOL or _POOL[0][0] != pid:  # none yet, or inherited over a fork: a new one
        _POOL[:] = [(pid, ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="tdu-check"))]
    return _POOL[0][1]


def schedule_checks(
    fs: FileSystemSpec, files: Iterable[Any], on_request: Callable[[], None] | None = None
) -> None:
    """Check the ``files`` (``FileInfo``) a reader is about to read in its next pass.

    Every file is checked again: a new pass may follow a rewrite, and readers keep a few
    files open across passes. Local files are checked here, one ``stat`` each; remote
    files concurrently, each open then waiting for its own answer in
    :func:`check_unchanged`. ``on_request`` is called once per remote metadata request
    answered (the metrics count them).

    Raises:
        FileChangedError: a local file changed (remote ones raise when opened).
    """
    if fs.is_local:
        for info in {f.path: f for f in files}.values():
            _check_now(fs, info.path, info.size, info.mtime)
        return
    pid = os.getpid()
    with _LOCK:
        pool = _pool()
        for info in {f.path: f for f in files}.values():
            key = (pid, fs.protocol, info.path, info.size, info.mtime)
            _CHECKS[key] = pool.submit(_check_now, fs, info.path, info.size, info.mtime, on_request)


def check_unchanged(
    fs: FileSystemSpec,
    path: str,
    size: int,
    mtime: float | None,
    on_request: Callable[[], None] | None = None,
) -> None:
    """Raise :class:`FileChangedError` when ``path`` is no longer the file that was planned.

    Args:
        fs: The file's filesystem.
        path: The file.
        size: Its size in bytes when the dataset was built.
        mtime: Its modification time then, or ``None`` when the storage gave none
            (then only the size is compared).
        on_request: Called when a remote metadata request is made here and answered
            (a file no pass announced).

    Raises:
        FileChangedError: the size or modification time differs (both values named).
        FileChangedError: the file was deleted.
        ReadError: the storage could not be asked (file named, cause included).
    """
    if fs.is_local:
        _check_now(fs, path, size, mtime)
        return
    key = (os.getpid(), fs.protocol, path, size, mtime)
    with _LOCK:
        check = _CHECKS.get(key)
        if check is None:  # not announced: checked now, once in this process
            check = _CHECKS[key] = Future()
            owner = True
        else:
            owner = False
    if owner:
        try:
            _check_now(fs, path, size, mtime, on_request)
        except BaseException as exc:
            check.set_exception(exc)
            raise
        check.set_result(None)
    check.result()


def _check_now(
    fs: FileSystemSpec,
    path: str,
    size: int,
    mtime: float | None,
    on_request: Callable[[], None] | None = None,
) -> None:
    remote = not fs.is_local
    try:
        now_size, now_mtime = current_state(fs, path)
        if remote and on_request is not None:
            on_request()
    except FileNotFoundError as exc:
        raise FileChangedError(
            f"{fs.display(path)!r} was deleted after the dataset was built (it was {size} bytes); "
            "build the dataset again to plan the files that exist now"
        ) from exc
    except OSError as exc:
        raise ReadError(
            f"cannot check {fs.display(path)!r} against the plan (its size and modification "
            f"time): {type(exc).__name__}: {exc}"
        ) from exc
    changed = now_size != size or (
        mtime is not None and now_mtime is not None and not _same_time(mtime, now_mtime, remote)
    )
    if changed:
        raise FileChangedError(
            f"{fs.display(path)!r} changed after the dataset was built: it was {size} bytes, "
            f"modified {_when(mtime)}, when planned, and is {now_size} bytes, modified "
            f"{_when(now_mtime)}, now. The plan's row groups and offsets no longer describe "
            "it, so it is not read; build the dataset again (create_dataloader / "
            "StructuredDataset) to plan the new contents"
        )


def check_size(display: str, planned: int, now: int) -> None:
    """Raise :class:`FileChangedError` when an opened file's size is not the planned one.

    For storages whose metadata gives sizes only (Iceberg manifests): the size is known
    from the open file handle, so this costs no request.
    """
    if planned != now:
        raise FileChangedError(
            f"{display!r} is {now} bytes but the table's metadata (when the dataset was built) "
            f"says {planned} bytes: the file was rewritten or damaged. Build the dataset again; "
            "if the metadata is current, the data file no longer matches it"
        )
