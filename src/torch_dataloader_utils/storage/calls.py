"""Remote calls bounded by a deadline, and the endpoint a filesystem's requests go to.

A storage client's own timeouts bound one attempt, and its own retries can add up to
minutes (gcsfs retries 6 times with backoff; its gRPC bucket-type lookup retries for a
minute per call against an endpoint that does not speak gRPC). So every call the library
makes through an fsspec filesystem goes through :func:`bounded_call`: on an asynchronous
filesystem (s3fs, gcsfs, adlfs...) the coroutine is run with a deadline and cancelled at
it, whatever the client does inside (fsspec raises ``FSTimeoutError``, which the
library's retries treat as transient).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch_dataloader_utils.storage.redact import redact

__all__ = ["bounded_call", "describe_endpoint"]


def bounded_call(client: Any, name: str, *args: Any, deadline: float | None, **kwargs: Any) -> Any:
    """``client.<name>(*args, **kwargs)``, ended after ``deadline`` seconds where the client allows.

    On an fsspec ``AsyncFileSystem`` whose ``name`` is the mirror of its coroutine
    ``_<name>`` (not a method a subclass overrode), the coroutine runs on the client's
    loop under ``deadline`` and is cancelled at it. Other filesystems (local, memory,
    pyarrow's wrappers, a subclass's own method) are called as they are.

    Raises:
        fsspec.exceptions.FSTimeoutError: the deadline passed.
    """
    method = getattr(client, name)
    if deadline is not None and deadline > 0:
        coroutine = getattr(client, f"_{name}", None)
        wrapped = getattr(method, "__wrapped__", None)
        if coroutine is not None and inspect.iscoroutinefunction(coroutine) and wrapped == coroutine:
            from fsspec.asyn import sync

            return sync(client.loop, coroutine, *args, timeout=deadline, **kwargs)
    return method(*args, **kwargs)


def _connection_string_endpoint(value: str) -> str | None:
    parts = dict(p.split("=", 1) for p in value.split(";") if "=" in p)
    if "BlobEndpoint" in parts:
        return parts["BlobEndpoint"]
    if "AccountName" in parts:
        suffix = parts.get("EndpointSuffix", "core.windows.net")
        return f"{parts.get('DefaultEndpointsProtocol', 'https')}://{parts['AccountName']}.blob.{suffix}"
    return None


def describe_endpoint(protocol: str, options: Mapping[str, Any]) -> str:
    """The endpoint requests of ``protocol`` with ``options`` go to, as a user would name it.

    Secrets (keys, passwords in URLs) are never shown.
    """
    client_kwargs = options.get("client_kwargs")
    nested = client_kwargs if isinstance(client_kwargs, Mapping) else {}
    for key in ("endpoint_url", "endpoint", "account_url", "account_host"):
        value = options.get(key) or nested.get(key)
        if value:
            text = str(value)
            if key == "account_host" and "://" not in text:
                text = f"https://{text}"
            return str(redact(text))
    connection = options.get("connection_string")
    if isinstance(connection, str) and (found := _connection_string_endpoint(connection)):
        return str(redact(found))
    account = options.get("account_name")
    if account and protocol == "abfs":
        return f"https://{account}.blob.core.windows.net"
    defaults = {
        "s3": "the default AWS S3 endpoint",
        "gs": "https://storage.googleapis.com (the default GCS endpoint)",
        "abfs": "the default Azure Blob endpoint",
    }
    return defaults.get(protocol, f"the {protocol} default endpoint")
