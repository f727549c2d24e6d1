"""Ranged reads with retries: every request for remote bytes goes through :func:`fetch_range`.

Transient errors (HTTP 500/502/503/504/429, connection reset, timeouts) are retried with
exponential backoff (``FetchConfig``); a permanent failure, or retries spent, raises
:class:`ReadError` naming the file and the byte range.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.storage.fs import FileSystemSpec

__all__ = ["fetch_range", "is_transient"]

_TRANSIENT_STATUS = re.compile(r"\b(500|502|503|504|429)\b")
_TRANSIENT_WORDS = (
    "slowdown",
    "slow_down",
    "internalerror",
    "internal_failure",
    "serviceunavailable",
    "service_unavailable",
    "service unavailable",
    "throttl",
    "connection reset",
    "connection aborted",
    "connection refused",
    "broken pipe",
    "timed out",
    "timeout",
    "network_connection",
    "server disconnected",
    "curl error",
    "unexpected eof",
    "incomplete read",
    "temporarily unavailable",
)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the request that raised ``exc`` may succeed.

    Missing files and denied access are permanent; connection errors, timeouts and
    server errors (HTTP 5xx, throttling) are transient, whichever client raised them.
    """
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    name = type(exc).__name__.lower()
    if any(word in name for word in ("timeout", "connection", "disconnected")):
        return True
    text = str(exc).lower()
    return bool(_TRANSIENT_STATUS.search(text)) or any(word in text for word in _TRANSIENT_WORDS)


class _ShortRead(ConnectionError):
    """A response ended before the requested range did (a cut connection)."""


def fetch_range(
    fs: FileSystemSpec,
    path: str,
    start: int,
    stop: int,
    *,
    size: int | None,
    config: FetchConfig,
    on_request: Callable[[int], None] | None = None,
    on_retry: Callable[[], None] | None = None,
    metadata: bool = False,
) -> bytes:
    """Bytes ``[start, stop)`` of ``path``, retrying transient errors with backoff.

    Args:
        fs: The filesystem.
        path: The file.
        start: First byte.
        stop: One past the last byte (clipped to ``size`` when it is known).
        size: The file's size, when known.
        config: Retries and backoff.
        on_request: Called with the bytes received after every successful request.
        on_retry: Called before every retry of a request that failed transiently.
        metadata: A one-off metadata read (see :meth:`FileSystemSpec.read_range`).

    Raises:
        ReadError: naming the file and the byte range, when the error is permanent or
            the retries are spent.
    """
    if size is not None:
        stop = min(stop, size)
    attempt = 0
    while True:
        try:
            data = fs.read_range(path, start, stop, size, metadata=metadata)
            if size is not None and len(data) != stop - start:
                raise _ShortRead(f"got {len(data)} of {stop - start} bytes")
            if on_request is not None:
                on_request(len(data))
            return data
        except Exception as exc:
            if isinstance(exc, ReadError):
                raise
            attempt += 1
            transient = is_transient(exc)
            if not transient or attempt > config.retries:
                tries = f"{attempt} attempt(s)" if transient else "a permanent error"
                hint = (
                    "; raise retries= or check the store's health"
                    if transient
                    else "; check the path, the credentials and the endpoint in storage_options"
                )
                raise ReadError(
                    f"reading {fs.display(path)!r} bytes [{start}, {stop}) failed after {tries}: "
                    f"{type(exc).__name__}: {exc}{hint}"
                ) from exc
            if on_retry is not None:
                on_retry()
            time.sleep(config.backoff(attempt))
