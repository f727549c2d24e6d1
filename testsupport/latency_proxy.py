"""A TCP proxy that adds a fixed latency to every HTTP request and counts them by kind.

Put it in front of a real S3 server (SeaweedFS, moto) and point every client at it: the
library's requests and a raw pyarrow loop's then pay the same round trip. Each piece
of a request a client sends (a request line and its headers, usually one piece) waits
``delay`` seconds before it is forwarded, as a round trip to a distant store would;
answers stream back at once. Request lines are counted by kind (``LIST``: a GET of a
bucket, ``HEAD``, ``GET``, ``PUT``: PUT or POST, ``other``), from the bytes the clients
send, so the counts are what the server receives.

    proxy = LatencyProxy("127.0.0.1", 8333, delay=0.020)
    endpoint = proxy.start()        # "http://127.0.0.1:PORT"
    ...
    proxy.counts()                  # Counter({"GET": 64, "LIST": 1})
    proxy.stop()
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter

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
        self.host, self.port, self.delay = host, port, delay
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None

    def counts(self) -> Counter[str]:
        """Requests received so far, by kind."""
        with self._lock:
            return Counter(self._counts)

    def reset(self) -> None:
        """Forget the counts."""
        with self._lock:
            self._counts.clear()

    def start(self) -> str:
        """Serve on a free port of 127.0.0.1; returns the endpoint URL."""
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", 0, limit=1 << 20)
            )
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="latency-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        """Stop serving: close the connections, end the thread."""
        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._thread = None

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

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
                found = _REQUEST.findall(data)
                if found:
                    with self._lock:
                        for method, target in found:
                            self._counts[_kind(method, target)] += 1
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
