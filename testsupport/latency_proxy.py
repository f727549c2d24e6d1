"""A TCP proxy that adds a fixed latency to every HTTP request and counts them by kind.

Put it in front of a real S3 server (SeaweedFS, moto) and point every client at it: the
library's requests and a raw pyarrow loop's then pay the same round trip. Each piece
of a request a client sends (a request line and its headers, usually one piece) waits
``delay`` seconds before it is forwarded, as a round trip to a distant store would;
answers stream back at once. Request lines are counted by kind (``LIST``: a GET of a
bucket, ``HEAD``, ``GET``, ``PUT``: PUT or POST, ``other``), from the bytes the clients
send, so the counts are what the server receives.

The proxy runs in a process of its own (``python -m testsupport.latency_proxy``), driven
over its standard input: a network adds latency without taking the client's
interpreter, so the proxy must not either (in a thread of the measured process it held
the GIL for every request it forwarded, which the library's Python threads then waited
for and pyarrow's native threads did not).

    proxy = LatencyProxy("127.0.0.1", 8333, delay=0.020)
    endpoint = proxy.start()        # "http://127.0.0.1:PORT"
    ...
    proxy.counts()                  # Counter({"GET": 64, "LIST": 1})
    proxy.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

__all__ = ["LatencyProxy"]

_REQUEST = re.compile(rb"^(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/1\.[01]\r\n", re.MULTILINE)


def _kind(method: bytes, target: bytes) -> str:
    key = target.split(b"?", 1)[0].strip(b"/").partition(b"/")[2]
    if method == b"GET":
        return "GET" if key else "LIST"
    if method in (b"PUT", b"POST"):
        return "PUT"
    return "HEAD" if method == b"HEAD" else "other"


class LatencyProxy:
    """See the module docstring.

    Args:
        host: The server's host.
        port: The server's port.
        delay: Seconds added to every request.
    """

    def __init__(self, host: str, port: int, delay: float = 0.0) -> None:
        self.host, self.port, self._delay = host, port, delay
        self._child: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def _ask(self, command: str) -> str:
        if self._child is None or self._child.stdin is None or self._child.stdout is None:
            raise RuntimeError("the latency proxy is not started")
        with self._lock:
            self._child.stdin.write(command + "\n")
            self._child.stdin.flush()
            answer = self._child.stdout.readline()
        if not answer:
            raise RuntimeError(f"the latency proxy exited (code {self._child.poll()})")
        return answer.strip()

    @property
    def delay(self) -> float:
        """Seconds added to every request (set it at any time; the next request pays it)."""
        return self._delay

    @delay.setter
    def delay(self, value: float) -> None:
        self._delay = value
        if self._child is not None:
            self._ask(f"delay {value!r}")

    def counts(self) -> Counter[str]:
        """Requests received so far, by kind."""
        return Counter(json.loads(self._ask("counts")))

    def reset(self) -> None:
        """Forget the counts."""
        self._ask("reset")

    def start(self) -> str:
        """Serve on a free port of 127.0.0.1 (in a child process); returns the endpoint URL."""
        root = str(Path(__file__).resolve().parents[1])
        self._child = subprocess.Popen(
            [sys.executable, "-m", "testsupport.latency_proxy", self.host, str(self.port), repr(self._delay)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        return self._ask("endpoint")

    def stop(self) -> None:
        """Stop serving: the child closes its connections and exits."""
        if self._child is None:
            return
        with contextlib.suppress(RuntimeError, OSError):
            self._ask("stop")
        try:
            self._child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        self._child = None


class _Proxy:
    """The child process's proxy: an asyncio server, driven by commands on stdin."""

    def __init__(self, host: str, port: int, delay: float) -> None:
        self.host, self.port, self.delay = host, port, delay
        self.counts: Counter[str] = Counter()
        self.server: asyncio.base_events.Server | None = None

    async def main(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=1 << 20)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            command, _, arg = line.strip().partition(" ")
            if command == "endpoint":
                answer = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
            elif command == "delay":
                self.delay = float(arg)
                answer = "ok"
            elif command == "counts":
                answer = json.dumps(dict(self.counts))
            elif command == "reset":
                self.counts.clear()
                answer = "ok"
            else:  # "stop", or the parent's end of the pipe closed (no one to answer)
                self.server.close()
                if command == "stop":
                    print("ok", flush=True)
                return
            print(answer, flush=True)

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        try:
            server_in, server_out = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        except OSError:
            client_out.close()
            return
        upstream = asyncio.ensure_future(self._requests(client_in, server_out))
        try:
            await self._pipe(server_in, client_out)
        finally:
            upstream.cancel()
            await asyncio.gather(upstream, return_exceptions=True)
            client_out.close()
            server_out.close()

    async def _requests(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Client to server: each piece waits ``delay``; request lines are counted."""
        try:
            while data := await source.read(1 << 16):
                for method, target in _REQUEST.findall(data):
                    self.counts[_kind(method, target)] += 1
                if self.delay > 0:
                    await asyncio.sleep(self.delay)
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass
        finally:
            sink.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Server to client, as it comes."""
        try:
            while data := await source.read(1 << 20):
                sink.write(data)
                await sink.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass


if __name__ == "__main__":
    host, port, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    asyncio.run(_Proxy(host, port, delay).main())
