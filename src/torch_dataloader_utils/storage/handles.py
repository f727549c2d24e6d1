"""Open native input files, owned by the reader that opened them and tied to the file planned.

Opening a native file costs a HEAD request on S3, so a reader keeps the files it reads
open (up to :data:`OPEN_HANDLES`; the least recently used is let go first, and closes
once no read in flight uses it). The handles belong
to one owner, the reader of one dataset (its :class:`~.io.prefetch.ChunkSource`),
never to the process: a dataset built again after a file was replaced opens the file
again, and deleting the dataset (``del loader, dataset``) closes its files, so a deleted
file's disk space is freed. A handle is tied to the size the file was planned with: a
file opened at another size raises :class:`FileChangedError` instead of serving a short
or misplaced read. Reads of one range with no owner (footers while a dataset is being
built) open the file and close it at once.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from typing import Any

from torch_dataloader_utils.errors import FileChangedError
from torch_dataloader_utils.plan.bounded import BoundedDict

__all__ = ["OPEN_HANDLES", "Handles", "too_many_open_files"]

OPEN_HANDLES = 256
"""Native input files one reader keeps open (per process that reads)."""


class Handles:
    """The native input files one reader keeps open (see the module).

    Thread-safe. Pickles empty, and starts empty in a process forked with it: each
    DataLoader worker opens its own files.

    Args:
        size: Files kept open at most (:data:`OPEN_HANDLES`).
    """

    def __init__(self, size: int = OPEN_HANDLES) -> None:
        self._size = size
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        # Dropped handles are not closed here: a read on another thread may still be
        # using one. A native file closes itself when its last reference goes.
        self._open: BoundedDict[str, tuple[int | None, Any]] = BoundedDict(self._size, lru=True)

    def __getstate__(self) -> dict[str, Any]:
        return {"_size": self._size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __len__(self) -> int:
        return len(self._open)

    def get(self, path: str, size: int | None, opener: Callable[[str], Any], shown: str) -> Any:
        """The open file of ``path`` as planned at ``size`` bytes (opened now if needed).

        Args:
            path: The file.
            size: Its planned size (``None``: unknown, not checked).
            opener: Opens ``path`` as a native input file.
            shown: ``path`` as the user wrote it, for messages.

        Raises:
            FileChangedError: the file opened is not ``size`` bytes (it was replaced).
        """
        if self._pid != os.getpid():
            self._reset()  # forked with the parent's handles: they are not this process's
        with self._lock:
            found = self._open.get(path)
            if found is not None and found[0] == size:
                return found[1]
        handle = opener(path)
        if size is not None and handle.size() != size:
            now = handle.size()
            handle.close()
            raise FileChangedError(
                f"{shown!r} changed after the dataset was built: it was {size} bytes when planned "
                f"and is {now} bytes now, so it is not read; build the dataset again to plan "
                "the new contents"
            )
        with self._lock:
            self._open[path] = (size, handle)
        return handle

    def close(self) -> None:
        """Let go of every file kept open (the owner is done with them).

        Each closes once no read is using it: at once, unless a read is in flight.
        """
        if self._pid != os.getpid():
            self._reset()
            return
        with self._lock:
            self._open.clear()


def too_many_open_files(exc: BaseException) -> str | None:
    """Advice for an ``OSError`` saying the process ran out of file descriptors, else ``None``.

    It names the limit (``ulimit -n``) and what the library keeps open, so the message
    is not mistaken for a storage or credentials problem.
    """
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE):
            break
        text = str(cause)
        if "Too many open files" in text:
            break
        cause = cause.__cause__ or cause.__context__
    else:
        return None
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        limit = "unknown"
    return (
        f"this process has run out of file descriptors (its limit, ulimit -n, is {limit}); each "
        f"dataset keeps files open to read them (up to {OPEN_HANDLES} per reading process on "
        "object storage, a few on a local disk), and the footers of many files are read at "
        "once while a dataset is built: raise the limit (ulimit -n 65536, or LimitNOFILE= for "
        "a service), or delete the datasets and loaders no longer used"
    )
