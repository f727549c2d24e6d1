"""Storage faults on demand, in front of real storage: an HTTP proxy and a filesystem wrapper.

:class:`FaultProxy` is an HTTP proxy in front of a real S3 server (SeaweedFS or moto):
point ``endpoint_url`` at it. It forwards every request and, while a fault is armed,
damages the ranged ``GET`` requests of data that match it:

* ``"503"``: answers ``503 SlowDown`` (the S3 throttling error) instead;
* ``"reset"``: resets the connection (``SO_LINGER`` 0) before answering;
* ``"cut"``: sends the headers with the full ``Content-Length`` and half the body, then
  closes the connection (a response cut in transit);
* ``"flip"``: sends the whole body at its full length with one byte, at a position drawn
  for each response, changed to ``0xFF`` (damage in transit that the length cannot show;
  two damaged responses of one range differ, as random damage does).

A fault is armed with :meth:`FaultProxy.arm`: which kind, every how many matching
requests (``every=1``: all of them, an outage), and how many at most (``limit``), so a
transient fault (retried, then answered) and a long outage are both expressible.
Listings, ``HEAD`` requests and writes are never damaged.

:class:`FaultyFileSystem` is an fsspec filesystem wrapping another (a ``filesystem=``
object for the library): reads of files fail with ``EIO``, ``EACCES`` or ``MemoryError``
on the same schedule (:meth:`FaultyFileSystem.arm`), counted per process.
"""

from __future__ import annotations

import errno
import http.client
import random
import socket
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

__all__ = ["PROXY_FAULTS", "FaultProxy", "FaultyFileSystem", "Schedule", "start_proxy"]

PROXY_FAULTS = ("503", "reset", "cut", "flip")
"""What :class:`FaultProxy` can do to a response."""
FS_FAULTS = ("eio", "eacces", "memory")
"""What :class:`FaultyFileSystem` can do to a read."""

_SLOW_DOWN = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate. (injected)</Message></Error>"
)


@dataclass
class Schedule:
    """Which matching requests a fault damages, counted across threads.

    Attributes:
        kind: The fault (``""``: none).
        every: Damage every ``every``-th matching request (``1``: all).
        limit: Damage at most this many (``-1``: no limit).
        path: Only requests whose path holds this string (``""``: any).
        after: The first ``after`` matching requests are never damaged (a fault mid-file).
        seen: Matching requests so far.
        damaged: Requests damaged so far.
    """

    kind: str = ""
    every: int = 1
    limit: int = -1
    path: str = ""
    after: int = 0
    seen: int = 0
    damaged: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def arm(self, kind: str, *, every: int = 1, limit: int = -1, path: str = "", after: int = 0) -> None:
        """Start damaging requests (counters reset)."""
        if every < 1:
            raise ValueError(f"every={every} must be >= 1")
        with self.lock:
            self.kind, self.every, self.limit, self.path, self.after = kind, every, limit, path, after
            self.seen = self.damaged = 0

    def disarm(self) -> None:
        """Damage nothing more (the counters stay)."""
        with self.lock:
            self.kind = ""

    def decide(self, target: str) -> str:
        """The fault to apply to a request of ``target`` now (``""``: none); counts it."""
        with self.lock:
            if not self.kind or (self.path and self.path not in target):
                return ""
            self.seen += 1
            counted = self.seen - self.after
            if counted <= 0 or counted % self.every or (0 <= self.limit <= self.damaged):
                return ""
            self.damaged += 1
            return self.kind

    def position(self, length: int) -> int:
        """Where to damage a body of ``length`` bytes (drawn from the damage count: reproducible)."""
        return random.Random(self.damaged * 7919 + length).randrange(length)


class _Armed:
    """What can be armed with a fault: its :class:`Schedule` and the kinds it injects."""

    kinds: tuple[str, ...] = ()

    @property
    def schedule(self) -> Schedule:
        raise NotImplementedError

    def arm(self, kind: str, *, every: int = 1, limit: int = -1, path: str = "", after: int = 0) -> None:
        """Start injecting ``kind`` (see :class:`Schedule`)."""
        if kind not in self.kinds:
            raise ValueError(f"kind={kind!r}: one of {self.kinds}")
        self.schedule.arm(kind, every=every, limit=limit, path=path, after=after)

    def disarm(self) -> None:
        """Inject nothing more."""
        self.schedule.disarm()


class FaultProxy(_Armed):
    """An HTTP proxy in front of ``upstream`` that damages ranged data GETs when armed.

    Attributes:
        endpoint: Where clients connect (``http://127.0.0.1:PORT``).
        schedule: The armed fault (:class:`Schedule`).
        forwarded: Requests forwarded to the upstream server.
    """

    kinds = PROXY_FAULTS

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._schedule = Schedule()
        self.forwarded = 0
        self._server: ThreadingHTTPServer | None = None
        self.endpoint = ""

    @property
    def schedule(self) -> Schedule:
        """The armed fault."""
        return self._schedule

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    host, _, port = proxy.upstream.split("//", 1)[1].partition(":")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _fault(self) -> str:
            ranged = self.command == "GET" and "list-type=" not in self.path and "Range" in self.headers
            return proxy.schedule.decide(self.path) if ranged else ""

        def _reset(self) -> None:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            fault = self._fault()
            if fault == "reset":
                self._reset()
                return
            if fault == "503":
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(_SLOW_DOWN)))
                self.end_headers()
                self.wfile.write(_SLOW_DOWN)
                return
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                proxy.forwarded += 1
            finally:
                conn.close()
            if fault == "flip" and data and resp.status in (200, 206):
                at = proxy.schedule.position(len(data))
                data = data[:at] + (b"\x00" if data[at] == 0xFF else b"\xff") + data[at + 1 :]
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            shown = resp.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", shown or str(len(data)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if fault == "cut" and len(data) > 1:
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self._reset()
                return
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

    return Handler


def start_proxy(upstream: str) -> FaultProxy:
    """A :class:`FaultProxy` in front of ``upstream`` (``http://host:port``), serving on a thread."""
    proxy = FaultProxy(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    proxy._server = server
    proxy.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True).start()
    return proxy


# -- a filesystem whose reads fail ------------------------------------------------------------

_SCHEDULES: dict[str, Schedule] = {}


def fs_schedule(name: str) -> Schedule:
    """The schedule of the :class:`FaultyFileSystem` instances named ``name`` in this process."""
    return _SCHEDULES.setdefault(name, Schedule())


def _raise(kind: str, path: str) -> None:
    if kind == "eio":
        raise OSError(errno.EIO, f"Input/output error (injected): {path}")
    if kind == "eacces":
        raise PermissionError(errno.EACCES, f"Permission denied (injected): {path}")
    raise MemoryError(f"injected: cannot allocate the buffer to read {path}")


class _FaultyFile(fsspec.spec.AbstractBufferedFile):
    def __init__(self, fs: FaultyFileSystem, path: str, **kwargs: Any) -> None:
        super().__init__(fs, path, mode="rb", **kwargs)

    def _fetch_range(self, start: int, end: int) -> bytes:
        fs: FaultyFileSystem = self.fs
        return fs.cat_file(self.path, start=start, end=end)


class FaultyFileSystem(_Armed, AbstractFileSystem):
    """An fsspec filesystem over ``target`` whose file reads fail on a schedule (:func:`fs_schedule`).

    Args:
        target_protocol: The wrapped filesystem's protocol (``"file"``, ``"s3"``...).
        target_options: Its options.
        name: The schedule's name (shared by instances, and by copies in forked workers).
    """

    protocol = "faulty"
    root_marker = "/"
    kinds = FS_FAULTS

    def __init__(
        self,
        target_protocol: str = "file",
        target_options: dict[str, Any] | None = None,
        name: str = "default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.target = fsspec.filesystem(target_protocol, **(target_options or {}))
        self.name = name

    @property
    def schedule(self) -> Schedule:
        """The schedule of this filesystem's faults."""
        return fs_schedule(self.name)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self.target.ls(path, detail=detail, **kwargs)

    def info(self, path: str, **kwargs: Any) -> Any:
        return self.target.info(path, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        fault = self.schedule.decide(str(path))
        if fault:
            _raise(fault, str(path))
        return bytes(self.target.cat_file(path, start=start, end=end, **kwargs))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise ValueError("FaultyFileSystem is read-only")
        return _FaultyFile(self, path, size=self.info(path)["size"], **kwargs)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        stripped = str(path).removeprefix("faulty://")
        return stripped.rstrip("/") or "/"


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)
