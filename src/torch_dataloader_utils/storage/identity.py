"""Files are read as they were planned: their size and modification time are checked on read.

A plan holds row-group indices, row ranges and byte offsets taken from a file's metadata
when the dataset was built. If the file is rewritten afterwards (other row groups, more
or fewer rows, another column type), those numbers describe a file that no longer
exists: read blindly, rows are lost, duplicated or mis-typed without an error. So every
reader keeps a :class:`FileChecks` and calls :meth:`FileChecks.check` before it reads a
chunk: a file whose size or modification time differs from the planned ones raises
:class:`FileChangedError`, and is not read.

A reader announces the files of its next pass, in reading order
(:meth:`FileChecks.schedule`, when a worker starts an epoch). Each file is checked once
per pass, before its first chunk of the pass is read, so files a reader keeps open
across passes are checked again. Local files cost one ``stat`` at that first read.
Where a read's own response tells the file's size and time (S3:
:meth:`FileChecks.read_checked`), the first read of the file in the pass checks it, at
no request of its own. Other remote files cost a metadata request: they are checked concurrently,
:data:`CHECKS_AHEAD` files ahead of the reads in the announced order (more are sent as
files are read, so a pass of 100,000 files starts as fast as one of 100), and a read
waits for its file's answer; a file read before its check was sent (or that no pass
announced) is checked then, once per pass. Object stores report modification times in
whole seconds on some calls, so remote times are compared to the second; the size
exactly.

A file replaced by one of the same size and the same modification time (``rsync -t``,
``touch -d``, a copy that keeps times) passes that check. A Parquet reader opens the
file's footer anyway, so it compares the footer's row groups with the planned ones
(:func:`check_footer`): a file whose row groups differ is refused too, where it used to
lose rows or raise an ``IndexError``.

Files planned from a reshard manifest are checked against the manifest (sizes, and
modification times where it records them); when one changed, the advice is that the
manifest is stale (build the dataset again would read the same manifest).
"""

from __future__ import annotations

import datetime as _dt
import functools
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from torch_dataloader_utils.errors import (
    FileChangedError,
    IncompatibleOptionsError,
    ReadError,
    SchemaMismatchError,
)
from torch_dataloader_utils.storage.fetch import describe_failure
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.requests import count_request

__all__ = [
    "CHECKS_AHEAD",
    "CHECK_THREADS",
    "FileChecks",
    "check_footer",
    "check_size",
    "compare_state",
    "current_state",
    "mtime_of",
    "process_local",
    "stale_advice",
]

CHECK_THREADS = 8
"""Remote files checked at once per process."""

CHECKS_AHEAD = 4 * CHECK_THREADS
"""Remote files of a pass checked ahead of the reads, at most, per reader: enough to keep
the threads busy while the reads catch up, few enough that a pass starts at once."""

T = TypeVar("T")
Verify = Callable[[tuple[int | None, float | None] | None], None]
"""Checks the state a read's response reported: ``(size, mtime)``, or ``None`` (no such file)."""

_POOL_LOCK = threading.Lock()
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
        count_request("heads")
        info = fs.arrow().get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(path)
        mtime = info.mtime.timestamp() if info.mtime is not None else None
        return int(info.size or 0), mtime
    fs.fsspec().invalidate_cache(path)
    details = fs.call("info", path)
    return int(details.get("size") or 0), mtime_of(details)


def process_local(fs: FileSystemSpec) -> bool:
    """Whether ``fs`` keeps its files in this process's memory (fsspec's ``memory://``)."""
    if fs.user is not None:
        return bool(getattr(fs.user, "process_local", False))
    return fs.protocol == "memory"


def _local_kind(fs: FileSystemSpec) -> str:
    return f"filesystem={fs.user.name}" if fs.user is not None else "memory:// filesystem"


def _same_time(planned: float, now: float, remote: bool) -> bool:
    if remote:  # listings give milliseconds, HEAD requests whole seconds
        return int(planned) == int(now)
    return planned == now


def _when(mtime: float | None) -> str:
    if mtime is None:
        return "unknown"
    return _dt.datetime.fromtimestamp(mtime, tz=_dt.UTC).isoformat(timespec="microseconds")


def _after_fork() -> None:
    global _POOL_LOCK  # a thread of the parent may have held it at the fork
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def _pool() -> ThreadPoolExecutor:
    pid = os.getpid()
    with _POOL_LOCK:
        if not _POOL or _POOL[0][0] != pid:  # none yet, or inherited over a fork: a new one
            _POOL[:] = [(pid, ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="tdu-check"))]
        return _POOL[0][1]


class _Planned(Protocol):
    """What a check needs of a planned file (a ``FileInfo``)."""

    @property
    def size(self) -> int: ...

    @property
    def mtime(self) -> float | None: ...


class _PlannedGroups(Protocol):
    """What a footer is compared with (a ``FileInfo``)."""

    @property
    def num_rows(self) -> int | None: ...

    @property
    def row_groups(self) -> Sequence[_Group] | None: ...


class _Group(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def first_row(self) -> int: ...

    @property
    def num_rows(self) -> int: ...


_OK = object()
"""A file checked in this pass and found unchanged."""


class FileChecks:
    """Checks that the files one reader reads are still the planned ones (see the module).

    One per reader; it holds only values when pickled to a DataLoader worker, and keeps
    its pass in the process that reads (a process forked with a pass starts clean). Safe
    to call from several threads.

    Args:
        fs: The files' filesystem.
        files: The planned files by path (their ``size`` and ``mtime``).
        ahead: Remote files checked ahead of the reads, at most (:data:`CHECKS_AHEAD`).
        manifest: The reshard manifest the files were planned from (as shown to users),
            or ``None``: it decides the advice of an error (:func:`stale_advice`).
    """

    def __init__(
        self,
        fs: FileSystemSpec,
        files: Mapping[str, _Planned],
        ahead: int = CHECKS_AHEAD,
        *,
        manifest: str | None = None,
    ) -> None:
        if ahead < 1:
            raise ValueError(f"ahead must be >= 1, got {ahead}")
        self.fs = fs
        self._files = files
        self._ahead = ahead
        self.manifest = manifest
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        # This pass: each file checked (_OK), being checked (its Future), or failed (its Future).
        self._done: dict[str, Any] = {}
        self._sent: set[str] = set()  # checks sent ahead whose file is not read yet
        self._order: Iterator[str] | None = None  # the pass's files not yet sent, in order
        self._on_request: Callable[[], None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"fs": self.fs, "_files": self._files, "_ahead": self._ahead, "manifest": self.manifest}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    def schedule(self, paths: Iterable[str], on_request: Callable[[], None] | None = None) -> None:
        """Start a pass: the files about to be read, in reading order (repeats allowed).

        Every file of the pass is checked again, since a new pass may follow a rewrite.
        ``paths`` is consumed as reading goes (remote files) or not at all (local files:
        each is checked when first read). ``on_request`` is called once per remote
        metadata request answered (the metrics count them).
        """
        self._check_process()
        with self._lock:
            for path in self._sent:  # the last pass's checks not read: not needed any more
                check = self._done.get(path)
                if isinstance(check, Future):
                    check.cancel()
            self._done = {}
            self._sent = set()
            self._order = None if self.fs.is_local else iter(paths)
            self._on_request = on_request
            self._send()

    def _send(self) -> None:
        """Send checks of the pass's next files until :attr:`_ahead` are out (under the lock)."""
        order = self._order
        if order is None:
            return
        pool: ThreadPoolExecutor | None = None
        while len(self._sent) < self._ahead:
            path = next(order, None)
            if path is None:
                self._order = None
                return
            if path in self._done:
                continue
            planned = self._files[path]
            if pool is None:
                pool = _pool()
            self._done[path] = pool.submit(
                _check_now, self.fs, path, planned.size, planned.mtime, self._on_request, self.manifest
            )
            self._sent.add(path)

    def check(
        self, path: str, size: int, mtime: float | None, on_request: Callable[[], None] | None = None
    ) -> None:
        """Raise :class:`FileChangedError` when ``path`` is no longer the file that was planned.

        Called before every read of a chunk of ``path``: the file is checked at its
        first read of the pass (or waited for, when its check was sent ahead); later
        reads in the pass cost a dictionary lookup.

        Args:
            path: The file.
            size: Its size in bytes when the dataset was built.
            mtime: Its modification time then, or ``None`` when the storage gave none
                (then only the size is compared).
            on_request: Called when a remote metadata request is made here and answered
                (a file read before its check was sent ahead).

        Raises:
            FileChangedError: the size or modification time differs (both values named).
            FileChangedError: the file was deleted.
            ReadError: the storage could not be asked (file named, cause included).
        """
        self._check_process()
        done = self._done
        found = done.get(path)
        if found is _OK:
            return
        if self.fs.is_local:  # one stat, no thread: a race only checks twice
            _check_now(self.fs, path, size, mtime, manifest=self.manifest)
            done[path] = _OK
            return
        found, owner = self._claim(path, sent=True)
        if found is _OK:
            return
        if owner:
            try:
                _check_now(self.fs, path, size, mtime, on_request, self.manifest)
            except BaseException as exc:
                found.set_exception(exc)
                raise
            found.set_result(None)
        found.result()  # raises the check's error, on every read of the file in this pass
        self._settled(path, found)

    def _claim(self, path: str, *, sent: bool = False) -> tuple[Any, bool]:
        """The pass's entry of ``path`` (``_OK`` or its check's future), and whether the caller checks it.

        ``sent``: the file is being read, so its check sent ahead is no longer ahead
        (another is sent in its place).
        """
        with self._lock:
            found = self._done.get(path)
            owner = found is None
            if owner:
                found = self._done[path] = Future()
            if sent:
                self._sent.discard(path)
                self._send()
        return found, owner

    def _settled(self, path: str, found: Any) -> None:
        """``path``'s check ``found`` passed: later reads of the pass need not wait for it."""
        with self._lock:
            if self._done.get(path) is found:
                self._done[path] = _OK

    def read_checked(
        self, path: str, size: int, mtime: float | None, read: Callable[[Verify | None], T]
    ) -> T:
        """A read of ``path`` that also checks it against the plan, with no request of its own.

        For storages whose reads tell the file's state (:attr:`FileSystemSpec.observes`):
        the first read of ``path`` in the pass is called with a ``verify`` callable, which
        the read calls with the state its response reported (raising
        :class:`FileChangedError` when it differs from ``size`` and ``mtime``); the other
        reads are called with ``None``, may run at the same time, and return only once
        that first read found the file unchanged.

        Args:
            path: The file.
            size: Its planned size.
            mtime: Its planned modification time, or ``None``.
            read: Reads the bytes; calls its argument, when given, with ``(size, mtime)``
                reported by the storage, or ``None`` when the file does not exist.

        Raises:
            FileChangedError: the file is not the planned one (on every read of it in the pass).
        """
        self._check_process()
        found, owner = self._claim(path)
        if found is _OK:
            return read(None)
        if not owner:
            try:
                data = read(None)
            except BaseException:
                found.result()  # the file's own check failed: its error says more
                raise
            found.result()
            return data
        verify = functools.partial(compare_state, self.fs, path, size, mtime, manifest=self.manifest)
        try:
            data = read(lambda now: verify(now))
        except BaseException as exc:
            found.set_exception(exc)
            raise
        found.set_result(None)
        self._settled(path, found)
        return data


_CACHE_HINT = (
    " (a dataset built with metadata_cache_check='on_open' trusts its metadata cache: build it "
    "with metadata_cache_check='listing', which lists the files and rewrites a stale cache, or "
    "delete the cache file)"
)


def stale_advice(manifest: str | None) -> str:
    """What to do about a file that is not the planned one.

    Planned from a listing: build the dataset again. Planned from a reshard manifest
    (``manifest`` names it): building again would read the same manifest, so the
    manifest is named as stale.
    """
    if manifest is not None:
        return (
            f"the manifest {manifest!r} is stale (it no longer describes the files next to it): "
            "reshard again, or pass use_manifest=False to list the files and read their footers"
        )
    return (
        "build the dataset again (create_dataloader / StructuredDataset) to plan the new contents"
        + _CACHE_HINT
    )


def _check_now(
    fs: FileSystemSpec,
    path: str,
    size: int,
    mtime: float | None,
    on_request: Callable[[], None] | None = None,
    manifest: str | None = None,
) -> None:
    remote = not fs.is_local
    try:
        now = current_state(fs, path)
        if remote and on_request is not None:
            on_request()
    except FileNotFoundError as exc:
        compare_state(fs, path, size, mtime, None, manifest, cause=exc)
        return
    except OSError as exc:
        where = f" on {fs.endpoint}" if fs.endpoint else ""
        raise ReadError(
            f"cannot check {fs.display(path)!r}{where} against the plan (its size and modification "
            f"time): {describe_failure(exc, fs.deadline)}"
        ) from exc
    compare_state(fs, path, size, mtime, now, manifest)


def compare_state(
    fs: FileSystemSpec,
    path: str,
    size: int,
    mtime: float | None,
    now: tuple[int | None, float | None] | None,
    manifest: str | None = None,
    *,
    cause: BaseException | None = None,
) -> None:
    """Raise :class:`FileChangedError` when ``path`` as it is ``now`` is not the planned file.

    Args:
        fs: The file's filesystem.
        path: The file.
        size: Its planned size.
        mtime: Its planned modification time (``None``: not compared).
        now: ``(size, mtime)`` the storage reports now (either ``None``: not reported),
            or ``None`` when the file does not exist.
        manifest: The reshard manifest it was planned from, if any.
        cause: The error that said the file does not exist.

    Raises:
        FileChangedError: the file was deleted, or its size or time differ.
        IncompatibleOptionsError: a process-local filesystem (memory) seen empty by a
            DataLoader worker that did not fork from the process holding it.
    """
    remote = not fs.is_local
    if now is None:
        if process_local(fs) and multiprocessing.parent_process() is not None:
            raise IncompatibleOptionsError(
                f"{fs.display(path)!r} is not in this process's {_local_kind(fs)}: such a filesystem "
                "holds its files in the memory of one process and does not cross processes, so a "
                "DataLoader worker started with multiprocessing_context='spawn' or 'forkserver' sees "
                "it empty. Pass multiprocessing_context='fork' (the worker starts as a copy of this "
                "process), num_workers=0, or put the files on disk or object storage"
            ) from cause
        advice = (
            stale_advice(manifest)
            if manifest is not None
            else f"build the dataset again to plan the files that exist now{_CACHE_HINT}"
        )
        raise FileChangedError(
            f"{fs.display(path)!r} was deleted after the dataset was built (it was {size} bytes); {advice}"
        ) from cause
    now_size = size if now[0] is None else now[0]
    now_mtime = now[1]
    changed = now_size != size or (
        mtime is not None and now_mtime is not None and not _same_time(mtime, now_mtime, remote)
    )
    if changed:
        raise FileChangedError(
            f"{fs.display(path)!r} changed after the dataset was built: it was {size} bytes, "
            f"modified {_when(mtime)}, when planned, and is {now_size} bytes, modified "
            f"{_when(now_mtime)}, now. The plan's row groups and offsets no longer describe "
            f"it, so it is not read; {stale_advice(manifest)}"
        )


def check_footer(
    shown: str,
    planned: _PlannedGroups,
    meta: pq.FileMetaData,
    *,
    filtered: bool = False,
    manifest: str | None = None,
    columns: Sequence[str] | None = None,
) -> None:
    """Raise :class:`FileChangedError` when a footer's row groups are not the planned ones.

    Compares the file's rows and, for every planned (unpruned) row group, that it exists
    with the planned rows and first row. A file replaced with the same size and
    modification time passes :class:`FileChecks`; its footer tells. Costs no request:
    the reader has the footer in hand.

    Args:
        shown: The file as the user wrote it.
        planned: The planned file (its ``num_rows`` and ``row_groups``).
        meta: The footer read now.
        filtered: The plan counts only rows passing a filter (``count_rows``): then
            only the row groups' existence is compared.
        manifest: The reshard manifest the file was planned from, if any.
        columns: Top-level columns the reader reads from the file: each must be in it.

    Raises:
        FileChangedError: the rows or row groups differ from the plan.
        SchemaMismatchError: a column to read is not in the file (a manifest whose
            schema was edited, or a file replaced with another schema).
    """
    if columns:
        names = meta.schema.to_arrow_schema().names
        missing = [c for c in columns if c not in names]
        if missing:
            where = (
                f"the manifest {manifest!r} lists" if manifest is not None else "the dataset was planned with"
            )
            raise SchemaMismatchError(
                f"{shown!r} has no column {missing[0]!r}, which {where} (its columns: {names}); "
                f"{stale_advice(manifest)}"
            )
    problem = _footer_problem(planned, meta, filtered)
    if problem is not None:
        raise FileChangedError(
            f"{shown!r} is not the file the dataset was planned with: {problem}. It was replaced "
            "after the dataset was built (with the same size and modification time, which a "
            f"copy that keeps times, rsync -t or touch -d gives), so it is not read; {stale_advice(manifest)}"
        )


def _footer_problem(planned: _PlannedGroups, meta: pq.FileMetaData, filtered: bool) -> str | None:
    count = meta.num_row_groups
    if not filtered and planned.num_rows is not None and meta.num_rows != planned.num_rows:
        return f"its footer has {meta.num_rows} rows in {count} row groups, the plan {planned.num_rows}"
    groups = planned.row_groups or ()
    if not groups:
        return None
    last = max(g.index for g in groups)
    if last >= count:
        return f"the plan reads row group {last}, and its footer has {count} row groups"
    if filtered:
        return None
    starts = [0] * count
    for i in range(1, count):
        starts[i] = starts[i - 1] + meta.row_group(i - 1).num_rows
    for g in groups:
        rows = meta.row_group(g.index).num_rows
        if rows != g.num_rows or starts[g.index] != g.first_row:
            return (
                f"its row group {g.index} holds rows [{starts[g.index]}, {starts[g.index] + rows}), "
                f"the plan's [{g.first_row}, {g.first_row + g.num_rows})"
            )
    return None


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
