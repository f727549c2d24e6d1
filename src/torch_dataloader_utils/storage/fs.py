"""Filesystem resolution: fsspec for URLs, listing and ``storage_options``; pyarrow for bytes.

A :class:`FileSystemSpec` is a picklable value (protocol + storage options). Clients are
built from it lazily, once per process: a client created in the parent is never used
in a forked DataLoader worker (s3fs, for one, refuses to be used after fork).

The bytes of ``s3://`` files go through pyarrow's native ``S3FileSystem`` whenever it
provably reaches what s3fs reaches (:mod:`~torch_dataloader_utils.storage.native_s3`:
every option translated, no mock active, the endpoint botocore resolves); the benchmark
in ``docs/benchmarks.md`` measured it faster than s3fs for ranged reads. Otherwise the
whole path stays on s3fs. Listing always uses fsspec.

A filesystem object the user passed (``filesystem=``) is carried by the spec as a
:class:`GivenFileSystem` (:class:`~torch_dataloader_utils.storage.userfs.UserFileSystem`):
then every client comes from it, and the library builds none.

Every call made through the fsspec client (:meth:`FileSystemSpec.call`, the fsspec
reads of :meth:`FileSystemSpec.read_range`) is bounded by the request's ``deadline``
(:func:`~torch_dataloader_utils.storage.calls.bounded_call`).

No request is sent that a read does not need. On S3 a ranged read is one GET through
the s3fs client's botocore client (:meth:`FileSystemSpec.read_observed`): pyarrow's S3
files send a HEAD when opened (its Python API opens by path, never with the listed
size). The GET's own response tells the file's size and modification time, so checking
a file against the plan costs no request of its own. Parquet footers, thousands at
once at discovery, are read through the native client where it is used
(:attr:`FileSystemSpec.native_footers`): one GET each, no HEAD, at a fraction of
botocore's CPU. Every request is counted by kind
(:mod:`~torch_dataloader_utils.storage.requests`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import fsspec
import pyarrow.fs as pafs

from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.storage.botocore_data import session_with_shared_data
from torch_dataloader_utils.storage.calls import bounded_call, describe_endpoint
from torch_dataloader_utils.storage.handles import Handles
from torch_dataloader_utils.storage.native_s3 import check_native
from torch_dataloader_utils.storage.redact import RedactedRepr, redact
from torch_dataloader_utils.storage.requests import CALL_KINDS, count_bytes, count_request, watch_botocore
from torch_dataloader_utils.storage.timestamps import use_fast_timestamps

__all__ = [
    "METADATA_CONCURRENCY",
    "FileSystemSpec",
    "GivenFileSystem",
    "check_storage_options",
    "native_s3_options",
    "resolve",
]

_LOCAL = frozenset({"file", "local"})
_S3 = frozenset({"s3", "s3a"})
_CLIENTS: dict[tuple[int, str, str], Any] = {}
METADATA_CONCURRENCY = 64
"""Metadata requests (Parquet footers) in flight at once per process, and so the size of
the s3fs (botocore) connection pool, which is 10 unless ``storage_options`` set
``config_kwargs={"max_pool_connections": N}``: a smaller pool would queue the requests."""

# s3fs options that only tune s3fs itself (caches, block sizes): the native client
# does not need them, so they do not stop it from being used.
_S3FS_ONLY_TUNING = frozenset(
    {
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "skip_instance_cache",
        "cache_regions",
        "max_concurrency",
        "fixed_upload_size",
    }
)
# Keywords fsspec itself takes from storage_options before the s3fs constructor sees them.
_CLIENTS_LOCK: list[tuple[int, threading.Lock]] = []


def _client_lock() -> threading.Lock:
    """This process's lock on building clients (a forked child makes its own)."""
    pid = os.getpid()
    if not _CLIENTS_LOCK or _CLIENTS_LOCK[0][0] != pid:
        _CLIENTS_LOCK[:] = [(pid, threading.Lock())]
    return _CLIENTS_LOCK[0][1]


_FSSPEC_KEYWORDS = frozenset(
    {"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"}
)


# s3fs options (top level, and inside client_kwargs) and their pyarrow S3FileSystem names.
_NATIVE_NAMES = {
    "key": "access_key",
    "aws_access_key_id": "access_key",
    "secret": "secret_key",
    "aws_secret_access_key": "secret_key",
    "token": "session_token",
    "aws_session_token": "session_token",
    "region": "region",
    "region_name": "region",
}
_CLIENT_NAMES = {k: v for k, v in _NATIVE_NAMES.items() if k.startswith(("aws_", "region_"))}
_CONFIG_NAMES = {"connect_timeout": "connect_timeout", "read_timeout": "request_timeout"}
_CONFIG_PASSED = ("retries", "max_pool_connections")  # config_kwargs the library's own code handles


def _translated(value: Any, names: Mapping[str, str], passed: Sequence[str] = ()) -> dict[str, Any] | None:
    """``client_kwargs`` / ``config_kwargs`` under their native names (``None``: one has none)."""
    out: dict[str, Any] = {}
    for key, item in dict(value or {}).items():
        if key in names:
            out[names[key]] = float(item) if names is _CONFIG_NAMES else item
        elif key == "endpoint_url" and names is _CLIENT_NAMES:
            out[key] = item
        elif key not in passed:
            return None
    return out


_NESTED: dict[str, tuple[Mapping[str, str], Sequence[str]]] = {
    "client_kwargs": (_CLIENT_NAMES, ()),
    "config_kwargs": (_CONFIG_NAMES, _CONFIG_PASSED),
}


def native_s3_options(options: Mapping[str, Any]) -> dict[str, Any] | None:
    """``pyarrow.fs.S3FileSystem`` keyword arguments equal to s3fs ``options``, or ``None``.

    ``None`` means some option has no native equivalent (a profile, extra request
    arguments, a custom session...): then s3fs must read the bytes too.
    """
    out: dict[str, Any] = {}
    endpoint: str | None = None
    use_ssl = True
    for key, value in options.items():
        if key in _NATIVE_NAMES:
            out[_NATIVE_NAMES[key]] = value
        elif key == "anon":
            out["anonymous"] = bool(value)
        elif key == "endpoint_url":
            endpoint = value
        elif key == "use_ssl":
            use_ssl = bool(value)
        elif key in _NESTED:
            got = _translated(value, *_NESTED[key])
            if got is None:
                return None
            endpoint = got.pop("endpoint_url", endpoint)
            out.update(got)
        elif key not in _S3FS_ONLY_TUNING:
            return None
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        out["endpoint_override"] = parts.netloc
        out["scheme"] = parts.scheme
    elif not use_ssl:
        out["scheme"] = "http"
    # Retries are the library's own (bounded, configurable, naming the byte range):
    # one attempt per call here, so a failure is not retried twice over.
    out["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=1)
    return out


def _with_pool(options: dict[str, Any], connections: int) -> dict[str, Any]:
    """s3fs ``options`` whose connection pool holds ``connections`` (unless the user set one)."""
    config = dict(options.get("config_kwargs") or {})
    if "max_pool_connections" in config:
        return options
    config["max_pool_connections"] = connections
    return {**options, "config_kwargs": config}


class GivenFileSystem(Protocol):
    """A filesystem object the user passed (``filesystem=``), as a spec uses it.

    :class:`~torch_dataloader_utils.storage.userfs.UserFileSystem` is the implementation.
    """

    token: str
    name: str
    protocols: tuple[str, ...]
    is_local: bool
    data_path: str
    kind: str
    """``"fsspec"`` or ``"arrow"`` (a pyarrow filesystem: every read goes through it)."""
    advice: str
    """What to change when its requests time out, for known traps (or ``""``)."""

    @property
    def native(self) -> bool:
        """Whether data bytes go through a pyarrow client."""
        ...

    @property
    def endpoint(self) -> str | None:
        """Where its requests go (``None`` for local files)."""
        ...

    def fsspec(self) -> fsspec.AbstractFileSystem:
        """Its fsspec view in this process."""
        ...

    def arrow(self) -> pafs.FileSystem:
        """Its pyarrow view (the data path) in this process."""
        ...

    def strip(self, path: str) -> str:
        """``path`` as the filesystem names it."""
        ...


def _gcs_client(options: Mapping[str, Any]) -> fsspec.AbstractFileSystem | None:
    """Gcsfs's core class for an endpoint other than Google's (an emulator, a proxy), else ``None``.

    gcsfs's default class first asks Google's gRPC storage-control API for the bucket's
    layout, retrying for a minute per call, and again on every call when it gets no
    answer: an emulator or proxy speaks only the JSON API, so a read took minutes of SSL
    handshake failures. The core class speaks the JSON API alone.
    """
    endpoint = str(options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST") or "")
    host = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}").hostname or ""
    if not endpoint or host.endswith("googleapis.com"):
        return None
    from gcsfs.core import GCSFileSystem

    return GCSFileSystem(**options)


@dataclass(frozen=True, repr=False)
class FileSystemSpec(RedactedRepr):
    """Which filesystem to use, as plain values.

    Attributes:
        protocol: fsspec protocol (``"file"``, ``"s3"``, ``"memory"``, ...).
        storage_options: Keyword arguments for the fsspec filesystem.
        data_path: How data bytes are read: ``"auto"`` (native pyarrow S3 for ``s3``
            when the options translate, else fsspec), ``"fsspec"`` or ``"native"``.
    """

    protocol: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    data_path: str = "auto"
    timeout: float | None = None
    """Connect and read timeout of one request attempt (seconds) on object stores,
    unless ``storage_options`` set their own; ``None`` keeps the clients' defaults."""
    deadline: float | None = None
    """Seconds one call through the fsspec client may take in all (``request_timeout``),
    whatever the client retries inside it; ``None``: no deadline."""
    user: GivenFileSystem | None = None
    """The filesystem object the user passed (``filesystem=``): every client comes from it."""

    @property
    def is_local(self) -> bool:
        """Whether paths are on the local disk (read with the local fast paths)."""
        if self.user is not None:
            return self.user.is_local
        return self.protocol in _LOCAL

    # Derived once per instance (and so once per process: workers unpickle their own copy,
    # without these caches), never on every ranged read.
    @functools.cached_property
    def _options_key(self) -> str:
        user = None if self.user is None else self.user.token
        return repr((self.protocol, sorted(self.storage_options.items()), self.timeout, user))

    @functools.cached_property
    def _native_decision(self) -> tuple[dict[str, Any] | None, str]:
        """The native S3 client's keywords (``None``: bytes through fsspec), and why."""
        if self.user is not None or self.is_local or self.protocol not in _S3:
            return None, ""
        if self.data_path == "fsspec":
            return None, "s3fs (data_path='fsspec')"
        native, why = check_native(native_s3_options(self.storage_options), self.storage_options)
        if native is not None and self.timeout is not None:
            native.setdefault("connect_timeout", self.timeout)
            native.setdefault("request_timeout", self.timeout)
        return native, why

    @property
    def _native_options(self) -> dict[str, Any] | None:
        return self._native_decision[0]

    @property
    def data_path_description(self) -> str:
        """How data bytes are read here, and why (logged at INFO, shown by ``inspect``)."""
        ranged = "; Parquet ranges by direct GETs through s3fs's client (one request each, no HEAD)"
        footers = "; Parquet footers by pyarrow's native S3 client (one GET each, no HEAD)"
        if self.user is not None:
            return (
                f"filesystem= {self.user.data_path}"
                + (ranged if self.observes else "")
                + ("; Parquet footers by that client (one GET each, no HEAD)" if self.native_footers else "")
            )
        if self.is_local:
            return "local files (pyarrow)"
        if self.protocol in _S3:
            return self._native_decision[1] + ranged + (footers if self.native_footers else "")
        return f"fsspec ({self.protocol}; no native client is used for it)"

    def _client_options(self) -> dict[str, Any]:
        """``storage_options`` for the fsspec client, with the request deadline applied.

        On S3 each attempt gets ``timeout`` to connect and to read (botocore's default
        is 60 s each, retried up to 5 times by botocore and 5 times by s3fs: about 7
        minutes against an endpoint that never answers); the library's own retries
        (``retries``, ``request_timeout``) replace botocore's and s3fs's.
        """
        options = dict(self.storage_options)
        if self.protocol in _S3 and self.timeout is not None:
            config = dict(options.get("config_kwargs") or {})
            config.setdefault("connect_timeout", self.timeout)
            config.setdefault("read_timeout", self.timeout)
            config.setdefault("retries", {"total_max_attempts": 1})
            options["config_kwargs"] = config
        elif self.timeout is not None:
            options.update(_attempt_timeouts(self.protocol, options, self.timeout))
        return options

    @property
    def endpoint(self) -> str | None:
        """The storage endpoint requests go to, as a user would name it (secrets hidden)."""
        if self.user is not None:
            return self.user.endpoint
        if self.is_local:
            return None
        return describe_endpoint(self.protocol, self.storage_options)

    @property
    def where_to_fix(self) -> str:
        """Where the endpoint is configured, for error messages."""
        if self.user is not None:
            return f"the filesystem object's settings (filesystem={self.user.name}){self.user.advice}"
        return "endpoint_url in storage_options"

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_options_key", "_native_decision")}

    @property
    def native(self) -> bool:
        """Whether data bytes go through a native pyarrow filesystem (not through fsspec)."""
        if self.user is not None:
            return self.user.native
        return self.is_local or self._native_options is not None

    @property
    def native_footers(self) -> bool:
        """Whether Parquet footers are read through pyarrow's native S3 client (:meth:`arrow`).

        On S3 wherever that client provably reaches what s3fs reaches (the options
        translate, no mock intercepts botocore, the same endpoint:
        :mod:`~torch_dataloader_utils.storage.native_s3`). A footer is then one ranged GET
        of a file opened with its listed size (no HEAD), at a fraction of botocore's CPU
        per request and outside the GIL, so thousands of footers no longer queue on one
        event loop. A ``filesystem=`` object whose data bytes go through a pyarrow S3
        client (a ``pyarrow.fs.S3FileSystem``, or an s3fs object whose options translate)
        has its footers read through that client the same way. Elsewhere
        (``data_path="fsspec"``, another filesystem object, an option with no native
        equivalent) footers are GETs through the fsspec client.
        """
        if self.protocol not in _S3:
            return False
        if self.user is not None:
            return self.user.native and not self.user.is_local
        return self._native_options is not None

    def _key(self, kind: str) -> tuple[int, str, str]:
        return (os.getpid(), kind, self._options_key)

    def fsspec(self) -> fsspec.AbstractFileSystem:
        """This process's fsspec filesystem (listing, ``open``)."""
        if self.user is not None:
            return self.user.fsspec()
        key = self._key("fsspec")
        client = _CLIENTS.get(key)
        if client is None:
            with _client_lock():  # threads asking at once share one client (each costs ~0.1 s)
                client = _CLIENTS.get(key)
                if client is None:
                    client = self._new_fsspec(key)
        return client

    def _new_fsspec(self, key: tuple[int, str, str]) -> Any:
        """A new fsspec client of this spec, kept for this process (under the clients' lock)."""
        # skip_instance_cache: never reuse an instance that came over a fork (a user's
        # own skip_instance_cache is overridden, not passed twice).
        options = {**self._client_options(), "skip_instance_cache": True}
        if self.protocol in _S3:
            options = _with_pool(options, METADATA_CONCURRENCY)
        client = (_gcs_client(options) if self.protocol == "gs" else None) or fsspec.filesystem(
            self.protocol, **options
        )
        if self.protocol in _S3 and self.timeout is not None:
            client.retries = 1  # s3fs's own retry loop: the library's retries replace it
        if self.protocol in _S3:
            _watch_s3fs(client)
        _CLIENTS[key] = client
        return client

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``fsspec().<name>(*args, **kwargs)``, ended at :attr:`deadline` (one request, no retries).

        Counted by kind (:mod:`~.requests`): by the botocore hook on the library's own s3fs
        clients, else as one request of the call's kind (:data:`~.requests.CALL_KINDS`);
        the bytes a ``cat_file`` returned and a ``pipe_file`` sent are counted here.

        Raises:
            fsspec.exceptions.FSTimeoutError: the deadline passed.
        """
        client = self.fsspec()
        watched = getattr(client, _WATCHED, False)
        # A pyarrow filesystem object (behind fsspec's ArrowFSWrapper) opens a file with a
        # HEAD before it reads it: a ``cat_file`` is a HEAD, then a GET when the file exists.
        opens = self.user is not None and self.user.kind == "arrow" and name in ("cat_file", "cat")
        try:
            out = bounded_call(client, name, *args, deadline=self.deadline, **kwargs)
        except BaseException:
            if not watched and name in CALL_KINDS:
                count_request("heads" if opens else CALL_KINDS[name])
            raise
        if opens and not watched:
            count_request("heads")
        received = len(out) if name in ("cat_file", "cat") and isinstance(out, bytes) else 0
        sent = len(args[1]) if name in ("pipe_file", "pipe") and len(args) > 1 else 0
        if watched:
            count_bytes(received, sent)
        elif name in CALL_KINDS:
            count_request(CALL_KINDS[name], received, sent)
        return out

    def start_call(self, name: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any] | None:
        """:meth:`call`, started on the client's event loop and returned at once, or ``None``.

        Only through the library's own asynchronous client, whose every request is
        counted by its botocore hook (s3fs): the result is then the same as
        :meth:`call`'s, whoever waits for it, and cancelling the future stops the call
        (a listing between two pages). The caller bounds its wait (:attr:`deadline`).
        """
        if self.is_local or self.user is not None:
            return None
        client = self.fsspec()
        coroutine = getattr(client, f"_{name}", None)
        if not getattr(client, _WATCHED, False) or not inspect.iscoroutinefunction(coroutine):
            return None
        assert coroutine is not None
        return asyncio.run_coroutine_threadsafe(coroutine(*args, **kwargs), client.loop)

    @property
    def observes(self) -> bool:
        """Whether a read also tells the file's size and modification time (:meth:`read_observed`).

        True on S3 through s3fs (the library's client or a user's s3fs object): the
        response of a ranged GET carries both, so a file is checked against the plan with
        no request of its own. Elsewhere a check costs a metadata request.
        """
        if self.is_local or self.protocol not in _S3:
            return False
        if self.user is not None and self.user.kind != "fsspec":
            return False
        return callable(getattr(self.fsspec(), "_call_s3", None))

    def read_observed(self, path: str, start: int, stop: int) -> tuple[bytes, int | None, float | None]:
        """Bytes ``[start, stop)`` of ``path`` in one GET, with the file's size and time now.

        Only where :attr:`observes`. The size is the total of the response's
        ``Content-Range`` and the time its ``Last-Modified`` (``None`` when absent).
        Ended at :attr:`deadline`; one request, no retries.

        Raises:
            FileNotFoundError: the file does not exist.
            fsspec.exceptions.FSTimeoutError: the deadline passed.
        """
        client = self.fsspec()
        bucket, key, version = client.split_path(path)
        extra = {"VersionId": version} if version else {}

        async def get() -> tuple[bytes, Any, Any]:
            response = await client._call_s3(
                "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{stop - 1}", **extra
            )
            body = response["Body"]
            try:
                data = await body.read()
            finally:
                body.close()
            return data, response.get("ContentRange"), response.get("LastModified")

        from fsspec.asyn import sync

        timeout = self.deadline if self.deadline is not None and self.deadline > 0 else None
        watched = getattr(client, _WATCHED, False)
        try:
            data, content_range, modified = sync(client.loop, get, timeout=timeout)
        except BaseException:
            if not watched:
                count_request("gets")
            raise
        if watched:
            count_bytes(len(data))
        else:
            count_request("gets", len(data))
        size = None
        if isinstance(content_range, str) and "/" in content_range:
            total = content_range.rsplit("/", 1)[1]
            size = int(total) if total.isdigit() else None
        mtime = modified.timestamp() if hasattr(modified, "timestamp") else None
        return bytes(data), size, mtime

    def arrow(self) -> pafs.FileSystem:
        """This process's pyarrow filesystem, for reading data and footers."""
        if self.user is not None:
            return self.user.arrow()
        key = self._key("arrow-native" if self.native else "arrow-fsspec")
        client = _CLIENTS.get(key)
        if client is None:
            if self.is_local:
                client = pafs.LocalFileSystem()
            elif self._native_options is not None:
                client = pafs.S3FileSystem(**self._native_options)
            else:
                client = pafs.PyFileSystem(pafs.FSSpecHandler(self.fsspec()))  # type: ignore[abstract]
            _CLIENTS[key] = client
        return client

    def read_range(
        self,
        path: str,
        start: int,
        stop: int,
        size: int | None = None,
        *,
        metadata: bool = False,
        handles: Handles | None = None,
    ) -> bytes:
        """Bytes ``[start, stop)`` of ``path`` in one request (no retries here).

        On S3 through s3fs (:attr:`observes`): one GET (:meth:`read_observed`), no HEAD.

        Args:
            path: The file on this filesystem.
            start: First byte.
            stop: One past the last byte (clipped to the file's end).
            size: The file's planned size, when known.
            metadata: A one-off read (a footer): on object stores fsspec serves it in one
                GET, where opening a native file would first cost a HEAD request.
            handles: The reader's open files (:class:`~.handles.Handles`), where a native
                file is kept open for the next reads; without them, the file is opened
                for this read and closed.

        Raises:
            FileChangedError: a native file opened now is not ``size`` bytes.
        """
        if stop <= start:
            return b""
        one_get = metadata and not self.is_local and (self.user is None or self.user.kind == "fsspec")
        if self.observes:  # S3: one GET, no HEAD (pyarrow's S3 files send a HEAD when opened)
            return self.read_observed(path, start, stop)[0]
        if self.native and not one_get:
            shown = self.display(path)
            opener = functools.partial(self.open_native, size=size)
            received = 0
            try:
                if handles is not None:
                    handle = handles.get(path, size, opener, shown)
                    data = bytes(handle.read_at(stop - start, start))
                else:
                    with opener(path) as handle:
                        data = bytes(handle.read_at(stop - start, start))
                received = len(data)
            finally:  # a failed request was sent too (and is retried: another request)
                if not self.is_local:
                    count_request("gets", received)
            return data
        data = self.call("cat_file", path, start=start, end=stop)
        return bytes(data)

    def open_native(self, path: str, size: int | None = None) -> Any:
        """``path`` opened through :meth:`arrow` for random access (``size``: as planned).

        Opening a remote file costs a request (a HEAD on S3), counted here: pyarrow's
        Python API opens files by path only (``FileFragment.open`` too, whatever size it
        was given), which is why ranged reads on S3 are direct GETs instead.
        """
        del size
        if not self.is_local:
            count_request("heads")
        return self.arrow().open_input_file(path)

    def display(self, path: str) -> str:
        """``path`` as a URL a user recognizes (with its scheme when not local)."""
        if self.is_local or "://" in path:  # http(s) filesystems keep the whole URL as the path
            return path
        return f"{self.protocol}://{path.lstrip('/')}"


_WATCHED = "_tdu_requests_watched"
"""Set on an s3fs client whose requests the botocore hook counts."""


def _watch_s3fs(client: Any) -> None:
    """Count every request of an s3fs ``client`` (its botocore client and session, now and later).

    Its botocore client is made now (no request is sent). A client that cannot be made
    now is left unwatched: its calls are then counted one request each.
    """
    connect = getattr(client, "set_session", None)
    if connect is None:
        return
    try:
        if getattr(client, "session", False) is None:  # s3fs makes its session in set_session
            client.session = session_with_shared_data(getattr(client, "kwargs", {}))
        from fsspec.asyn import sync

        botocore_client = sync(client.loop, connect)
        watch_botocore(client.session)  # clients made later from the session (other regions)
        watch_botocore(botocore_client.meta.events)
        use_fast_timestamps(client.session, botocore_client)
    except Exception:  # the first request raises it again, as a listing's or a read's error
        return
    setattr(client, _WATCHED, True)


def _attempt_timeouts(protocol: str, options: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Per-attempt timeouts of a GCS or Azure client (unless ``options`` set their own)."""
    if protocol == "gs":
        return {} if "requests_timeout" in options else {"requests_timeout": timeout}
    if protocol == "abfs":
        keys = ("connection_timeout", "read_timeout")
        return {k: max(1, round(timeout)) for k in keys if k not in options}
    return {}


def check_storage_options(protocol: str, options: Mapping[str, Any]) -> None:
    """Refuse ``storage_options`` that the filesystem client would reject at its first request.

    On S3: an option s3fs does not know (it would fail later inside botocore with a
    ``TypeError`` naming no option of ours), and an ``endpoint_url`` that is not an
    ``http(s)://host[:port]`` URL.

    Raises:
        ConfigError: naming the option, its value (secrets hidden) and the fix.
    """
    if protocol not in _S3:
        return
    endpoints = [("endpoint_url", options.get("endpoint_url"))]
    client_kwargs = options.get("client_kwargs")
    if isinstance(client_kwargs, Mapping):
        endpoints.append(("client_kwargs['endpoint_url']", client_kwargs.get("endpoint_url")))
    for name, value in endpoints:
        if value is None:
            continue
        parts = urlsplit(value) if isinstance(value, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"storage_options {name}={redact(value)!r} is not an endpoint URL; pass "
                "'http://host:port' or 'https://host' (the scheme is required)"
            )
    known = _s3fs_keywords()
    if known is None:
        return
    unknown = [k for k in options if k not in known]
    if unknown:
        import difflib

        close = difflib.get_close_matches(str(unknown[0]), sorted(known), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"storage_options has {unknown} that s3fs does not take; {hint}the options are the "
            "arguments of s3fs.S3FileSystem (key, secret, token, endpoint_url, client_kwargs, "
            "config_kwargs, ...); a region goes in client_kwargs={'region_name': ...}"
        )


@functools.cache
def _s3fs_keywords() -> frozenset[str] | None:
    """Every keyword an s3fs filesystem accepts (its own, its session's, fsspec's)."""
    import inspect

    try:
        import s3fs
        from aiobotocore.session import AioSession  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - s3fs is a dependency
        return None
    names = set(_FSSPEC_KEYWORDS)
    for fn in (s3fs.S3FileSystem.__init__, AioSession.__init__):
        names.update(
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"
        )
    return frozenset(names)


def resolve(
    path: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    timeout: float | None = None,
    deadline: float | None = None,
    filesystem: GivenFileSystem | None = None,
) -> tuple[FileSystemSpec, str]:
    """Split a path or URL into its filesystem spec and the filesystem's own path.

    No filesystem client is created here: clients are built lazily, per process, by
    :meth:`FileSystemSpec.fsspec` / :meth:`FileSystemSpec.arrow`.

    Args:
        path: A local path or a URL.
        storage_options: The filesystem's options.
        timeout: Connect and read timeout of one request attempt on object stores.
        deadline: Seconds one call through the fsspec client may take in all.
        filesystem: The user's filesystem object (``filesystem=``): the spec uses it for
            everything; ``path`` may then be a URL of its scheme or a path without one.

    Raises:
        ConfigError: ``storage_options`` the client would reject (see
            :func:`check_storage_options`), or a URL of a scheme ``filesystem`` does not serve.
    """
    if filesystem is not None:
        stripped = filesystem.strip(path)
        spec = FileSystemSpec(
            filesystem.protocols[0], {}, timeout=timeout, deadline=deadline, user=filesystem
        )
        return spec, stripped
    options = dict(storage_options or {})
    protocol, _ = fsspec.core.split_protocol(path)
    cls = fsspec.get_filesystem_class(protocol or "file")
    names = cls.protocol if isinstance(cls.protocol, (tuple, list)) else (cls.protocol,)
    canonical = str(names[0])
    stripped = fsspec.core.strip_protocol(path)
    if canonical in _LOCAL or protocol is None:
        return FileSystemSpec("file", options), os.path.abspath(stripped)
    check_storage_options(canonical, options)
    return FileSystemSpec(canonical, options, timeout=timeout, deadline=deadline), stripped
