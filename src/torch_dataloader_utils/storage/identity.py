"""Files are read as they were planned: their size and modification time are checked on open.

A plan holds row-group indices, row ranges and byte offsets taken from a file's metadata
when the dataset was built. If the file is rewritten afterwards (other row groups, more
or fewer rows, another column type), those numbers describe a file that no longer
exists: read blindly, rows are lost, duplicated or mis-typed without an error. So every
reader calls :func:`check_unchanged` when it opens a file, and a file whose size or
modification time differs from the planned ones raises :class:`FileChangedError`.

Local files are checked with one ``stat`` on every open. Remote files cost a metadata
request (a HEAD on S3), so each process checks each remote file once. Object stores
report modification times in whole seconds on some calls, so remote times are compared
to the second; the size is compared exactly.
"""

from __future__ import annotations

import datetime as _dt
import os
import threading
from collections.abc import Mapping
from typing import Any

import pyarrow.fs as pafs

from torch_dataloader_utils.errors import FileChangedError, ReadError
from torch_dataloader_utils.storage.fs import FileSystemSpec

__all__ = ["check_size", "check_unchanged", "current_state", "mtime_of"]

_CHECKED: set[tuple[int, str, str, int, float | None]] = set()
_LOCK = threading.Lock()


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


def check_unchanged(fs: FileSystemSpec, path: str, size: int, mtime: float | None) -> None:
    """Raise :class:`FileChangedError` when ``path`` is no longer the file that was planned.

    Args:
        fs: The file's filesystem.
        path: The file.
        size: Its size in bytes when the dataset was built.
        mtime: Its modification time then, or ``None`` when the storage gave none
            (then only the size is compared).

    Raises:
        FileChangedError: the size or modification time differs (both values named).
        FileChangedError: the file was deleted.
        ReadError: the storage could not be asked (file named, cause included).
    """
    remote = not fs.is_local
    key = (os.getpid(), fs.protocol, path, size, mtime)
    if remote and key in _CHECKED:
        return
    try:
        now_size, now_mtime = current_state(fs, path)
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
    if remote:
        with _LOCK:
            _CHECKED.add(key)


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
