"""Filesystem resolution: fsspec for URLs, listing and ``storage_options``; pyarrow for bytes.

A :class:`FileSystemSpec` is a picklable value (protocol + storage options). Clients are
built from it lazily, once per process: a client created in the parent is never used
in a forked DataLoader worker (s3fs, for one, refuses to be used after fork).

The bytes of ``s3://`` files go through pyarrow's native ``S3FileSystem`` whenever the
``storage_options`` translate to it (credentials, endpoint, region, timeouts); the
benchmark in ``docs/benchmarks.md`` measured it faster than s3fs for ranged reads.
Options only s3fs understands keep the whole path on s3fs. Listing always uses fsspec.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import fsspec
import pyarrow.fs as pafs

from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.storage.redact import RedactedRepr, redact

__all__ = ["METADATA_CONCURRENCY", "FileSystemSpec", "check_storage_options", "native_s3_options", "resolve"]

_LOCAL = frozenset({"file", "local"})
_S3 = frozenset({"s3", "s3a"})
_CLIENTS: dict[tuple[int, str, str], Any] = {}
_HANDLES: OrderedDict[tuple[int, str, str], Any] = OrderedDict()
_HANDLES_LOCK = threading.Lock()
_OPEN_HANDLES = 256
"""Open native input files kept per process: opening one costs a HEAD request on S3."""
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

    @property
    def is_local(self) -> bool:
        """Whether paths are on the local disk."""
        return self.protocol in _LOCAL

    # Derived once per instance (and so once per process: workers unpickle their own copy,
    # without these caches), never on every ranged read.
    @functools.cached_property
    def _options_key(self) -> str:
        return repr((self.protocol, sorted(self.storage_options.items()), self.timeout))

    @functools.cached_property
    def _native_options(self) -> dict[str, Any] | None:
        if self.is_local or self.data_path == "fsspec" or self.protocol not in _S3:
            return None
        native = native_s3_options(self.storage_options)
        if native is not None and self.timeout is not None:
            native.setdefault("connect_timeout", self.timeout)
            native.setdefault("request_timeout", self.timeout)
        return native

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
        return options

    @property
    def endpoint(self) -> str | None:
        """The storage endpoint requests go to, as a user would name it (secrets hidden)."""
        if self.is_local:
            return None
        endpoint = self.storage_options.get("endpoint_url") or dict(
            self.storage_options.get("client_kwargs") or {}
        ).get("endpoint_url")
        if endpoint:
            return str(redact(str(endpoint)))
        return (
            "the default AWS S3 endpoint" if self.protocol in _S3 else f"the {self.protocol} default endpoint"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_options_key", "_native_options")}

    @property
    def native(self) -> bool:
        """Whether data bytes go through a native pyarrow filesystem (not through fsspec)."""
        return self.is_local or self._native_options is not None

    def _key(self, kind: str) -> tuple[int, str, str]:
        return (os.getpid(), kind, self._options_key)

    def fsspec(self) -> fsspec.AbstractFileSystem:
        """This process's fsspec filesystem (listing, ``open``)."""
        key = self._key("fsspec")
        client = _CLIENTS.get(key)
        if client is None:
            # skip_instance_cache: never reuse an instance that came over a fork (a user's
            # own skip_instance_cache is overridden, not passed twice).
            options = {**self._client_options(), "skip_instance_cache": True}
            if self.protocol in _S3:
                options = _with_pool(options, METADATA_CONCURRENCY)
            client = fsspec.filesystem(self.protocol, **options)
            if self.protocol in _S3 and self.timeout is not None:
                client.retries = 1  # s3fs's own retry loop: the library's retries replace it
            _CLIENTS[key] = client
        return client

    def arrow(self) -> pafs.FileSystem:
        """This process's pyarrow filesystem, for reading data and footers."""
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
        self, path: str, start: int, stop: int, size: int | None = None, *, metadata: bool = False
    ) -> bytes:
        """Bytes ``[start, stop)`` of ``path`` in one request (no retries here).

        Args:
            path: The file on this filesystem.
            start: First byte.
            stop: One past the last byte (clipped to the file's end).
            size: The file's size, when known.
            metadata: A one-off read (a footer): on object stores fsspec serves it in one
                GET, where opening a native file would first cost a HEAD request.
        """
        if stop <= start:
            return b""
        if self.native and not (metadata and not self.is_local):
            handle = self._handle(path)
            return bytes(handle.read_at(stop - start, start))
        data = self.fsspec().cat_file(path, start=start, end=stop)
        return bytes(data)

    def _handle(self, path: str) -> Any:
        """This process's open native input file of ``path`` (kept in a small LRU)."""
        pid, kind, options = self._key("handle")
        key = (pid, kind, f"{options}|{path}")
        with _HANDLES_LOCK:
            handle = _HANDLES.pop(key, None)
            if handle is not None:
                _HANDLES[key] = handle
                return handle
        handle = self.arrow().open_input_file(path)
        with _HANDLES_LOCK:
            _HANDLES[key] = handle
            while len(_HANDLES) > _OPEN_HANDLES:
                _HANDLES.popitem(last=False)
        return handle

    def display(self, path: str) -> str:
        """``path`` as a URL a user recognizes (with its scheme when not local)."""
        if self.is_local:
            return path
        return f"{self.protocol}://{path.lstrip('/')}"


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
    path: str, storage_options: Mapping[str, Any] | None = None, *, timeout: float | None = None
) -> tuple[FileSystemSpec, str]:
    """Split a path or URL into its filesystem spec and the filesystem's own path.

    No filesystem client is created here: clients are built lazily, per process, by
    :meth:`FileSystemSpec.fsspec` / :meth:`FileSystemSpec.arrow`.

    Args:
        path: A local path or a URL.
        storage_options: The filesystem's options.
        timeout: Connect and read timeout of one request attempt on object stores.

    Raises:
        ConfigError: ``storage_options`` the client would reject (see
            :func:`check_storage_options`).
    """
    options = dict(storage_options or {})
    protocol, _ = fsspec.core.split_protocol(path)
    cls = fsspec.get_filesystem_class(protocol or "file")
    names = cls.protocol if isinstance(cls.protocol, (tuple, list)) else (cls.protocol,)
    canonical = str(names[0])
    stripped = fsspec.core.strip_protocol(path)
    if canonical in _LOCAL or protocol is None:
        return FileSystemSpec("file", options), os.path.abspath(stripped)
    check_storage_options(canonical, options)
    return FileSystemSpec(canonical, options, timeout=timeout), stripped
