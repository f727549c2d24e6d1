"""Ranged reads with retries: every request for remote bytes goes through :func:`fetch_range`.

Transient errors (HTTP 500/502/503/504/429, connection reset, timeouts, a response cut
short, ``EIO`` from a filesystem) are retried with exponential backoff (``FetchConfig``)
within the request's time budget (``request_timeout``, :func:`retry_call`); a permanent
failure (a missing file, denied access), or retries or time spent, raises
:class:`ReadError` naming the file, the byte range and the endpoint. A memory error is
never retried nor translated: it is raised as it is.
"""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Callable
from typing import TypeVar

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.errors import DataLoaderUtilsError, ReadError
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.handles import Handles, too_many_open_files
from torch_dataloader_utils.storage.redact import redact

__all__ = [
    "CREDENTIALS_FIX",
    "GaveUp",
    "ShortRead",
    "describe_failure",
    "fetch_range",
    "is_transient",
    "lacks_credentials",
    "read_error",
    "retry_call",
]

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
    "payload is not completed",  # aiohttp: a response body cut short (s3fs, gcsfs, adlfs)
    "not enough data",
    "content-length",
    "contentlength",
    "response ended prematurely",
)


_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.EBUSY,
        errno.EAGAIN,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        121,
    }
)
"""``errno`` of ``OSError``s worth a retry (121 is EREMOTEIO: s3fs's HTTP 500; EBUSY its 503;
EIO a filesystem's I/O error, often a network filesystem's hiccup)."""


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the request that raised ``exc`` may succeed.

    Missing files and denied access are permanent; connection errors, timeouts and
    server errors (HTTP 5xx, throttling) are transient, whichever client raised them:
    the error itself or the one it was translated from (s3fs turns HTTP 503 into an
    ``OSError`` of ``errno.EBUSY`` caused by botocore's error) decides.
    """
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            break
        if _looks_transient(seen):
            return True
        seen = seen.__cause__
    return False


CREDENTIALS_FIX = (
    "pass key and secret (and token, for temporary credentials) in storage_options, set "
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, or pass "
    "anon=True for a public bucket"
)
"""What to do when a client found no credentials (see :func:`lacks_credentials`)."""


def lacks_credentials(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was translated from) says the client found no credentials.

    botocore raises ``NoCredentialsError`` ("Unable to locate credentials") or
    ``PartialCredentialsError`` before sending anything, whatever the endpoint.
    """
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return False
        text = f"{type(seen).__name__} {seen}".lower()
        if "nocredentials" in text or "partialcredentials" in text or "unable to locate credentials" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _looks_transient(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    name = type(exc).__name__.lower()
    if any(word in name for word in ("timeout", "connection", "disconnected")):
        return True
    text = str(exc).lower()
    return bool(_TRANSIENT_STATUS.search(text)) or any(word in text for word in _TRANSIENT_WORDS)


class ShortRead(ConnectionError):
    """A response ended before the requested range did (a cut connection): transient."""


T = TypeVar("T")


def describe_failure(exc: BaseException, deadline: float | None = None) -> str:
    """``"TypeName: message"`` of a failed request, secrets hidden.

    A timeout with no message of its own says what ran out (``deadline``: the request's
    time budget, ``request_timeout``).
    """
    text = redact(str(exc)).strip()
    name = type(exc).__name__
    if not text and isinstance(exc, TimeoutError):
        budget = "" if deadline is None else f"request_timeout={deadline:g} s, "
        text = f"no answer within the request's deadline ({budget}retries included)"
    return f"{name}: {text}" if text else name


class GaveUp(Exception):
    """A request failed for good: a permanent error, or its retries or time budget spent.

    Attributes:
        error: The last error.
        attempts: Attempts made.
        seconds: Seconds spent, waits included.
        transient: Whether the last error was transient (so more time could help).
    """

    def __init__(self, error: BaseException, attempts: int, seconds: float, transient: bool) -> None:
        super().__init__(str(error))
        self.error, self.attempts, self.seconds, self.transient = error, attempts, seconds, transient

    def how(self, config: FetchConfig) -> str:
        """``"after 3 attempt(s) in 12.5 s (retries=4, request_timeout=30 s): ..."``."""
        cause = describe_failure(self.error, config.request_timeout)
        if not self.transient:
            return f"with a permanent error: {cause}"
        return (
            f"after {self.attempts} attempt(s) in {self.seconds:.1f} s (retries={config.retries}, "
            f"request_timeout={config.request_timeout:g} s): {cause}"
        )


def retry_call(call: Callable[[], T], config: FetchConfig, on_retry: Callable[[], None] | None = None) -> T:
    """``call()``, retrying transient errors with backoff within the request's time budget.

    A retry is made while retries are left and it could end within
    ``config.request_timeout`` of the first attempt (its wait plus as long as the failed
    attempt took): so an endpoint that never answers costs about ``request_timeout``,
    not ``retries`` times the clients' own timeouts. ``on_retry`` is called before every
    retry (the metrics count them).

    Raises:
        DataLoaderUtilsError: as raised by ``call`` (never retried).
        MemoryError: as raised by ``call`` (never retried).
        GaveUp: the last error, when it was permanent or the retries or time are spent.
    """
    started = time.monotonic()
    attempt = 0
    while True:
        began = time.monotonic()
        try:
            return call()
        except (DataLoaderUtilsError, MemoryError):
            raise
        except Exception as exc:
            attempt += 1
            now = time.monotonic()
            transient = is_transient(exc)
            wait = config.backoff(attempt)
            late = (now - started) + wait + (now - began) > config.request_timeout
            if not transient or attempt > config.retries or late:
                raise GaveUp(exc, attempt, now - started, transient) from exc
            if on_retry is not None:
                on_retry()
            time.sleep(wait)


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
    handles: Handles | None = None,
    verify: Callable[[tuple[int | None, float | None] | None], None] | None = None,
) -> bytes:
    """Bytes ``[start, stop)`` of ``path``, retrying transient errors with backoff.

    Args:
        fs: The filesystem.
        path: The file.
        start: First byte.
        stop: One past the last byte (clipped to ``size`` when it is known).
        size: The file's size, when known.
        config: Retries, backoff and the request's time budget.
        on_request: Called with the bytes received after every successful request.
        on_retry: Called before every retry of a request that failed transiently.
        metadata: A one-off metadata read (see :meth:`FileSystemSpec.read_range`).
        handles: The reader's open files (see :meth:`FileSystemSpec.read_range`).
        verify: Where the storage's responses tell the file's state
            (:attr:`FileSystemSpec.observes`): the read is one GET through
            :meth:`FileSystemSpec.read_observed`, and ``verify`` is called with the
            ``(size, mtime)`` it reported, or with ``None`` when the file does not exist;
            it raises when the file is not the planned one.

    Raises:
        ReadError: naming the file, the byte range and the endpoint, when the error is
            permanent or the retries or time budget are spent; or the process's limit
            of open files, when that was the error.
        FileChangedError: the file opened is not ``size`` bytes.
    """
    if size is not None:
        stop = min(stop, size)

    def attempt() -> bytes:
        if verify is not None and stop > start:
            try:
                data, now_size, now_mtime = fs.read_observed(path, start, stop)
            except FileNotFoundError as exc:
                verify(None)  # raises: the file was deleted
                raise exc
            verify((now_size, now_mtime))
        else:
            data = fs.read_range(path, start, stop, size, metadata=metadata, handles=handles)
        if size is not None and len(data) != stop - start:
            raise ShortRead(f"got {len(data)} of {stop - start} bytes")
        if on_request is not None:
            on_request(len(data))
        return data

    try:
        return retry_call(attempt, config, on_retry)
    except GaveUp as failed:
        raise read_error(fs, path, start, stop, failed, config) from failed.error


def read_error(
    fs: FileSystemSpec, path: str, start: int, stop: int, failed: GaveUp, config: FetchConfig
) -> ReadError:
    """The :class:`ReadError` of bytes ``[start, stop)`` of ``path`` whose request gave up.

    It names the file, the byte range and the endpoint, and says the fix: the process's
    limit of open files, the credentials, the endpoint's reachability (with the retries
    and time spent) or, for a permanent error, the path and the options.
    """
    endpoint = fs.endpoint or "its storage"
    descriptors = too_many_open_files(failed.error)
    where = "in storage_options" if fs.user is None else f"of filesystem={fs.user.name}"
    advice = "" if fs.user is None else fs.user.advice
    if descriptors is not None:
        hint = f": {descriptors}"
    elif lacks_credentials(failed.error):
        hint = f"; no credentials were found: {CREDENTIALS_FIX}"
    elif failed.transient:
        hint = f"; check that {endpoint} is up and reachable, or raise retries= / request_timeout="
        hint += advice
    else:
        hint = f"; check the path, the credentials and the endpoint ({endpoint}) {where}"
    return ReadError(
        f"reading {fs.display(path)!r} bytes [{start}, {stop}) failed {failed.how(config)}{hint}"
    )
