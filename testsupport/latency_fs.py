"""An fsspec filesystem that adds a fixed latency to every request and counts them.

``latency://<path>`` wraps another fsspec filesystem (local files by default): every
request (``info``, ``ls``, each page of 1,000 entries of ``find``, each ranged read)
sleeps ``delay`` seconds first, as a round trip to an object store would, and is
counted with the bytes it returns. The library reaches it through ``storage_options``
exactly as it reaches S3; the raw pyarrow baseline reaches it through
``pyarrow.fs.PyFileSystem(FSSpecHandler(...))``, so both pay the same price per request.

Counters live per process under ``stats_key`` (see :func:`stats`). With ``request_log``
(a file path), every ranged read also appends ``"<pid> <path> <start> <end>"`` to that
file, so requests made by several processes (ranks, DataLoader workers) can be counted
together (:func:`logged_requests`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

__all__ = ["LatencyFileSystem", "RequestStats", "logged_requests", "stats"]


@dataclass
class RequestStats:
    """Requests and bytes seen by every LatencyFileSystem sharing one ``stats_key``."""

    requests: int = 0
    bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int) -> None:
        with self.lock:
            self.requests += 1
            self.bytes += nbytes

    def reset(self) -> None:
        with self.lock:
            self.requests = 0
            self.bytes = 0


_STATS: dict[str, RequestStats] = {}


def stats(key: str = "default") -> RequestStats:
    """The counters of ``stats_key`` in this process."""
    return _STATS.setdefault(key, RequestStats())


class LatencyFileSystem(AbstractFileSystem):
    """fsspec filesystem adding ``delay`` seconds to every request of ``target``."""

    protocol = "latency"
    root_marker = "/"

    def __init__(
        self,
        delay: float = 0.0,
        target_protocol: str = "file",
        target_options: dict[str, Any] | None = None,
        stats_key: str = "default",
        request_log: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.latency = float(delay)
        self.target = fsspec.filesystem(target_protocol, **(target_options or {}))
        self.counters = stats(stats_key)
        self.request_log = request_log

    def _request(self, nbytes: int = 0) -> None:
        if self.latency > 0:
            time.sleep(self.latency)
        self.counters.add(nbytes)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._request()
        out: dict[str, Any] = self.target.info(path)
        return out

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        self._request()
        return self.target.ls(path, detail=detail)

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        found = self.target.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=True)
        for _ in range(max(1, math.ceil(len(found) / 1000))):  # one listing request per page
            self._request()
        return found if detail else sorted(found)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        data: bytes = self.target.cat_file(path, start=start, end=end)
        self._request(len(data))
        if self.request_log is not None:
            line = f"{os.getpid()} {path} {start} {end}\n".encode()
            fd = os.open(self.request_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line)  # one write with O_APPEND: lines of processes never interleave
            finally:
                os.close(fd)
        return data

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        if mode != "rb":
            raise NotImplementedError("latency:// is read-only")
        return _LatencyFile(self, path, mode, block_size=block_size or "default", **kwargs)


def logged_requests(request_log: str) -> list[tuple[int, str, int, int]]:
    """The ranged reads appended to ``request_log``: ``(pid, path, start, end)`` each."""
    out = []
    with open(request_log) as fh:
        for line in fh:
            pid, path, start, end = line.split()
            out.append((int(pid), path, int(start), int(end)))
    return out


class _LatencyFile(AbstractBufferedFile):  # type: ignore[misc]
    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs.cat_file(self.path, start=start, end=end)  # type: ignore[no-any-return]


fsspec.register_implementation("latency", LatencyFileSystem, clobber=True)
