"""Which store a filesystem reaches: the identity the node-local cache keys files by.

Two object stores can hold the same bucket and key, with the same size written in the
same second; what tells their bytes apart is where the requests go. The endpoint can be
configured in many places: ``storage_options`` (``endpoint_url``,
``client_kwargs={"endpoint_url": ...}``), the environment (``AWS_ENDPOINT_URL``,
``AWS_ENDPOINT_URL_S3``, an AWS profile's ``endpoint_url``; ``STORAGE_EMULATOR_HOST`` for
GCS), an Azure ``connection_string`` or ``account_name``, a ``filesystem=`` object (an
``s3fs.S3FileSystem(endpoint_url=...)``, a ``pyarrow.fs.S3FileSystem(endpoint_override=...)``,
a ``SubTreeFileSystem`` over either), or Iceberg's catalog properties (``s3.endpoint``).
:func:`store_identity` and :func:`object_identity` read every one of them into one
string, e.g. ``"s3 http://127.0.0.1:9000"`` or
``"pyarrow.SubTreeFileSystem bucket/x/ [s3 http://127.0.0.1:9000]"``.

The identity holds no secret: option values whose names look secret (keys, tokens,
passwords) are left out, a connection string contributes only its account and
endpoints, and passwords inside URLs are hidden. Options that change how requests are
made but not where they go (timeouts, pools, retries) are left out too, so jobs that
tune them share the cache.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from torch_dataloader_utils.storage.calls import describe_endpoint
from torch_dataloader_utils.storage.native_s3 import configured_endpoint
from torch_dataloader_utils.storage.redact import is_secret, redact

__all__ = ["object_identity", "options_identity", "store_identity"]

_WHERE_WORDS = ("endpoint", "host", "port", "scheme", "account", "authority", "url", "project", "namespace")
"""An option whose name holds one of these says where requests go."""
_CONNECTION_PARTS = ("AccountName", "BlobEndpoint", "EndpointSuffix", "DefaultEndpointsProtocol")
"""What an Azure connection string contributes (never its ``AccountKey`` or ``SharedAccessSignature``)."""
_S3 = frozenset({"s3", "s3a"})


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and value != ""


def _where(options: Mapping[str, Any]) -> list[str]:
    """``name=value`` of the options that say where requests go (nested mappings included), sorted."""
    out: list[str] = []
    for name, value in options.items():
        text = str(name)
        if is_secret(text) and "authority" not in text.lower():  # Azure's blob_storage_authority
            continue
        if "connection" in text.lower() and isinstance(value, str):
            parts = dict(p.split("=", 1) for p in value.split(";") if "=" in p)
            out.extend(f"{text}.{k}={parts[k]}" for k in _CONNECTION_PARTS if parts.get(k))
        elif isinstance(value, Mapping):
            out.extend(f"{text}.{item}" for item in _where(value))
        elif _scalar(value) and any(word in text.lower() for word in _WHERE_WORDS):
            out.append(f"{text}={redact(str(value))}")
    return sorted(out)


def options_identity(protocol: str, options: Mapping[str, Any]) -> str:
    """The store ``protocol`` with ``options`` (fsspec ``storage_options``) reaches.

    For S3 with no endpoint in ``options``, the endpoint the environment or an AWS
    profile configures (as botocore resolves it); for GCS, ``STORAGE_EMULATOR_HOST``.
    """
    parts = [protocol, describe_endpoint(protocol, options)]
    if protocol in _S3 and not _where(options):
        configured = configured_endpoint(options)
        if configured is not None:
            parts.append(f"configured={redact(configured[0])}")
    if protocol in ("gs", "gcs") and not _where(options) and os.environ.get("STORAGE_EMULATOR_HOST"):
        parts.append(f"STORAGE_EMULATOR_HOST={os.environ['STORAGE_EMULATOR_HOST']}")
    parts.extend(_where(options))
    return " ".join(dict.fromkeys(parts))  # in order, each once


def _class_name(obj: object) -> str:
    cls = type(obj)
    module = cls.__module__.split(".")[0]
    return f"{module}.{cls.__qualname__}"


def _arrow_identity(filesystem: Any, depth: int) -> str:
    import pyarrow.fs as pafs

    name = _class_name(filesystem)
    handler = getattr(filesystem, "handler", None)
    inner = getattr(handler, "fs", None)
    if inner is not None:  # a PyFileSystem over an fsspec filesystem
        return f"{name} [{object_identity(inner, depth + 1)}]"
    try:
        reduced = filesystem.__reduce__()
        args = tuple(reduced[1])
    except Exception:
        return name
    parts = [name]
    for arg in args:
        if isinstance(arg, pafs.FileSystem):
            parts.append(f"[{object_identity(arg, depth + 1)}]")
        elif isinstance(arg, Mapping):
            parts.extend(_where(arg))
            if isinstance(filesystem, pafs.S3FileSystem) and not arg.get("endpoint_override"):
                configured = configured_endpoint({})
                if configured is not None:  # pyarrow's S3 client reads AWS_ENDPOINT_URL too
                    parts.append(f"configured={redact(configured[0])}")
        elif _scalar(arg):
            parts.append(redact(str(arg)))
    return " ".join(parts)


def object_identity(filesystem: Any, depth: int = 0) -> str:
    """The store a filesystem object (fsspec or pyarrow) reaches, e.g. for ``filesystem=``.

    An fsspec filesystem: its class, protocol and the options that say where its requests
    go (its ``storage_options``, and for s3fs the endpoint the environment configures);
    a pyarrow filesystem: its class and the non-secret arguments it is rebuilt from
    (``endpoint_override``, ``scheme``; a ``SubTreeFileSystem``'s base path and base
    filesystem); anything else: its class.
    """
    import fsspec
    import pyarrow.fs as pafs

    if depth > 4:
        return _class_name(filesystem)
    if isinstance(filesystem, pafs.FileSystem):
        return _arrow_identity(filesystem, depth)
    if isinstance(filesystem, fsspec.AbstractFileSystem):
        protocol = filesystem.protocol
        first = str(protocol[0] if isinstance(protocol, (tuple, list)) else protocol)
        options = dict(getattr(filesystem, "storage_options", {}) or {})
        wrapped = getattr(filesystem, "fs", None)  # a DirFileSystem, a caching wrapper
        inner = (
            f" [{object_identity(wrapped, depth + 1)}]"
            if isinstance(wrapped, fsspec.AbstractFileSystem)
            else ""
        )
        path = getattr(filesystem, "path", None)
        prefix = f" path={path}" if isinstance(path, str) and inner else ""
        return f"{_class_name(filesystem)} {options_identity(first, options)}{prefix}{inner}"
    return _class_name(filesystem)


def store_identity(protocol: str, options: Mapping[str, Any], user: Any | None = None) -> str:
    """The store a filesystem spec reaches: its ``filesystem=`` object's, else its options'.

    ``user``: the :class:`~torch_dataloader_utils.storage.userfs.UserFileSystem` (its
    ``store``, taken when the object was given), or ``None``.
    """
    if user is not None:
        return str(getattr(user, "store", "") or f"filesystem {user.name}")
    return options_identity(protocol, options)
