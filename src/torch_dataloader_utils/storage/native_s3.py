"""Whether pyarrow's native S3 client provably reaches the storage s3fs would.

The native client (``pyarrow.fs.S3FileSystem``) reads the files pyarrow's own readers
open (ORC, CSV / JSONL) and Parquet footers (a fragment of the listed size: no HEAD);
Parquet ranges are direct GETs through s3fs's client, since a native file sends a HEAD
when opened. It is a second client: it knows only the
options it is given. It reaches the same storage with
the same credentials only when

* every s3fs option was translated (:func:`~torch_dataloader_utils.storage.fs.native_s3_options`
  returns ``None`` otherwise: a profile, a custom session, extra request arguments...);
* nothing intercepts botocore's requests: moto's ``mock_aws`` (how many users unit-test
  S3 code) answers s3fs from memory, but the native client would go to AWS;
* the endpoint is the one botocore resolves: an endpoint set outside ``storage_options``
  (``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``, a profile's ``endpoint_url`` in the AWS
  config file) is used by s3fs and unknown to the native client, so it is passed to it
  explicitly (as botocore resolved it, with its region).

:func:`check_native` applies these rules and says which path the bytes take and why.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from torch_dataloader_utils.storage.redact import redact

__all__ = ["check_native", "configured_endpoint", "intercepted"]

_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_CONFIG_VARIABLES = ("AWS_CONFIG_FILE", "AWS_PROFILE", "AWS_DEFAULT_PROFILE")
_OTHER_VARIABLES = ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_DEFAULT_REGION", "AWS_REGION")


def intercepted() -> str | None:
    """Why botocore's requests may not reach the network now (an active mock), or ``None``.

    moto registers a ``before-send`` handler in botocore's built-in handlers when it is
    imported, enabled only inside ``mock_aws``; any other such handler (another mocking
    library) is taken as active.
    """
    import sys

    if "botocore.handlers" not in sys.modules:
        return None
    from botocore.handlers import BUILTIN_HANDLERS

    for entry in BUILTIN_HANDLERS:
        event, handler = entry[0], entry[1]
        if event.startswith("before-send") and getattr(handler, "enabled", True):
            name = f"{type(handler).__module__}.{type(handler).__qualname__}"
            return f"botocore's requests are intercepted by {name} (a mock such as moto's mock_aws)"
    return None


def _may_configure_endpoint(environ: Mapping[str, str]) -> bool:
    """Whether the environment or an AWS config file could set an endpoint (cheap; no botocore)."""
    if any(environ.get(name) for name in _ENDPOINT_VARIABLES + _CONFIG_VARIABLES):
        return True
    return os.path.exists(os.path.expanduser(os.path.join("~", ".aws", "config")))


@functools.lru_cache(maxsize=16)
def _botocore_endpoint(
    profile: str | None, region: str | None, environ: tuple[str | None, ...]
) -> tuple[str | None, str | None]:
    """``(endpoint_url, region)`` a botocore S3 client resolves with no explicit endpoint.

    ``environ`` holds the variables botocore reads for it (part of the cache key only).
    """
    import botocore.session

    session = botocore.session.Session(profile=profile)
    client = session.create_client(
        "s3", region_name=region, aws_access_key_id="unused", aws_secret_access_key="unused"
    )
    return client.meta.endpoint_url, client.meta.region_name


def configured_endpoint(options: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """The endpoint (and region) configured outside ``storage_options`` for S3, or ``None``.

    As botocore resolves it, so as s3fs uses it: ``AWS_ENDPOINT_URL_S3``,
    ``AWS_ENDPOINT_URL``, the profile's ``endpoint_url`` or ``services`` section
    (``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` honoured). AWS's own endpoints count as
    none. Asked of botocore only when something could configure one.
    """
    if not _may_configure_endpoint(os.environ):
        return None
    client_kwargs = dict(options.get("client_kwargs") or {})
    profile = options.get("profile")
    region = client_kwargs.get("region_name") or options.get("region_name")
    try:
        endpoint, resolved_region = _botocore_endpoint(
            str(profile) if profile else None,
            str(region) if region else None,
            tuple(os.environ.get(n) for n in _ENDPOINT_VARIABLES + _CONFIG_VARIABLES + _OTHER_VARIABLES),
        )
    except Exception:  # a broken AWS config: s3fs fails the same way, with botocore's message
        return None
    host = urlsplit(endpoint or "").hostname or ""
    if not endpoint or host.endswith(("amazonaws.com", "amazonaws.com.cn")):
        return None
    return endpoint, resolved_region


def check_native(
    native: dict[str, Any] | None, options: Mapping[str, Any]
) -> tuple[dict[str, Any] | None, str]:
    """The native client's keywords if it provably reaches what s3fs reaches, and why (or why not).

    Args:
        native: ``options`` translated to ``pyarrow.fs.S3FileSystem`` keywords, or ``None``
            when some option has no native equivalent.
        options: The s3fs options.

    Returns:
        ``(keywords, reason)``: ``keywords`` is ``None`` when the bytes must go through s3fs.
    """
    if native is None:
        untranslated = sorted(str(k) for k in options if k not in ("key", "secret", "token", "endpoint_url"))
        return None, f"s3fs (an option has no native equivalent: one of {untranslated})"
    why = intercepted()
    if why is not None:
        return None, f"s3fs ({why})"
    if "endpoint_override" in native:
        return (
            native,
            f"pyarrow's native S3 client (endpoint {native['scheme']}://{native['endpoint_override']})",
        )
    configured = configured_endpoint(options)
    if configured is None:
        return native, "pyarrow's native S3 client (AWS's endpoint)"
    endpoint, region = configured
    parts = urlsplit(endpoint)
    out = {**native, "endpoint_override": parts.netloc, "scheme": parts.scheme or "https"}
    if region and "region" not in out:
        out["region"] = region
    shown = redact(endpoint)
    return out, f"pyarrow's native S3 client (endpoint {shown}, configured outside storage_options)"
