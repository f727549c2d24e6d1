"""Hostile case 10 and the storage obscure errors: deadlines, dead endpoints, bad options.

Discovery against an S3 endpoint that accepted connections and never answered blocked
for about 7 minutes whatever ``retries`` said, then raised a raw botocore error. Now
every request has a time budget (``request_timeout``, default 30 s, retries included)
and every storage failure names the URL, the endpoint and the fix.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest

from tests.bounds import assert_ends_within
from tests.fixtures.s3 import S3Server
from tests.fixtures.stores import serve, silent
from torch_dataloader_utils import (
    ConfigError,
    DiscoveryError,
    IcebergDataset,
    ReadError,
    create_dataloader,
)
from torch_dataloader_utils.config import DEFAULT_REQUEST_TIMEOUT, FetchConfig
from torch_dataloader_utils.storage.fetch import fetch_range
from torch_dataloader_utils.storage.fs import FileSystemSpec

CREDENTIALS = {"key": "k", "secret": "s"}


def _closing(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.close()


def _resetting(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def _garbage(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.sendall(b"HELLO GARBAGE\r\n\r\n")
    conn.close()


@pytest.fixture
def dead_endpoint() -> Iterator[str]:
    with serve(silent) as endpoint:
        yield endpoint


def _discover(endpoint: str, **options: object) -> None:
    create_dataloader(
        "s3://bucket/data",
        storage_options={**CREDENTIALS, "endpoint_url": endpoint},
        num_workers=0,
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.slow
def test_case_10_dead_endpoint_fails_within_the_default_budget(dead_endpoint: str) -> None:
    started = time.monotonic()
    with pytest.raises(DiscoveryError) as exc:
        _discover(dead_endpoint)
    elapsed = time.monotonic() - started
    assert_ends_within(elapsed, DEFAULT_REQUEST_TIMEOUT)
    text = str(exc.value)
    assert f"on {dead_endpoint}" in text
    assert "s3://bucket/data" in text
    assert "request_timeout=30 s" in text
    assert "ReadTimeoutError" in text


@pytest.mark.parametrize("retries", [0, 2])
def test_case_10_dead_endpoint_with_a_short_budget(dead_endpoint: str, retries: int) -> None:
    started = time.monotonic()
    with pytest.raises(DiscoveryError, match=rf"on {dead_endpoint} failed after \d attempt\(s\)"):
        _discover(dead_endpoint, request_timeout=3, retries=retries)
    assert_ends_within(time.monotonic() - started, 3)


def test_case_10_dead_endpoint_on_a_native_ranged_read(dead_endpoint: str) -> None:
    """The data path (pyarrow's S3 client) has the same budget, and names the endpoint."""
    fs = FileSystemSpec("s3", {**CREDENTIALS, "endpoint_url": dead_endpoint}, timeout=1.0)
    assert fs.native
    started = time.monotonic()
    with pytest.raises(ReadError, match=rf"bytes \[0, 10\) failed after \d attempt.*{dead_endpoint}"):
        fetch_range(fs, "bucket/a.parquet", 0, 10, size=100, config=FetchConfig(request_timeout=3, retries=2))
    assert_ends_within(time.monotonic() - started, 3)


@pytest.mark.parametrize("value", [0, -1, True, "30"])
def test_case_10_request_timeout_is_checked(value: object) -> None:
    with pytest.raises(ConfigError, match=rf"request_timeout={value!r} must be a number of seconds > 0"):
        _discover("http://127.0.0.1:9", request_timeout=value)


# -- obscure errors of storage ------------------------------------------------------------


@pytest.mark.parametrize(
    ("handler", "words"),
    [
        (None, "EndpointConnectionError"),  # nothing listens
        (_closing, "ConnectionClosedError"),
        (_resetting, "Connection"),
        (_garbage, "permanent error: HTTPClientError"),
    ],
    ids=["down", "closing", "resetting", "garbage"],
)
def test_obscure_endpoint_down_closing_resetting_or_garbage(
    handler: Callable[[socket.socket], None] | None, words: str
) -> None:
    serving: contextlib.AbstractContextManager[str]
    if handler is None:
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            serving = contextlib.nullcontext(f"http://127.0.0.1:{s.getsockname()[1]}")
    else:
        serving = serve(handler)
    with serving as endpoint, pytest.raises(DiscoveryError) as exc:
        _discover(endpoint, retries=0)
    text = str(exc.value)
    assert f"listing 's3://bucket/data' on {endpoint}" in text
    assert words in text
    assert "endpoint_url" in text


@pytest.mark.slow
def test_obscure_wrong_s3_credentials(s3_server: S3Server) -> None:
    options = {**s3_server.options(), "secret": "not-the-secret"}
    with pytest.raises(DiscoveryError) as exc:
        create_dataloader(f"s3://{s3_server.new_prefix()}", storage_options=options, num_workers=0)
    text = str(exc.value)
    assert "was refused: PermissionError" in text
    assert "check the credentials (key, secret, token)" in text
    assert "not-the-secret" not in text


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"bogus_option": 1}, r"storage_options has \['bogus_option'\] that s3fs does not take"),
        ({"endpont_url": "http://x:1"}, r"did you mean 'endpoint_url'\?"),
        ({"region_name": "eu-west-1"}, r"a region goes in client_kwargs"),
        ({"endpoint_url": "127.0.0.1:9000"}, r"endpoint_url='127\.0\.0\.1:9000' is not an endpoint URL"),
        ({"endpoint_url": "htp:/x"}, r"the scheme is required"),
        ({"client_kwargs": {"endpoint_url": "localhost"}}, r"client_kwargs\['endpoint_url'\]='localhost'"),
    ],
)
def test_obscure_unknown_s3fs_option_or_malformed_endpoint(options: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        create_dataloader("s3://bucket/data", storage_options={**CREDENTIALS, **options}, num_workers=0)


def test_obscure_sqlite_catalog_that_cannot_be_opened(tmp_path) -> None:
    config = {"type": "sql", "uri": f"sqlite:///{tmp_path}/missing/dir/catalog.db", "warehouse": "file:///x"}
    with pytest.raises(
        DiscoveryError, match=r"catalog 'default' \(type='sql', uri='sqlite:///.*missing.*cannot be"
    ):
        IcebergDataset("ns.t", catalog_config=config)


def test_obscure_rest_catalog_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    config = {"type": "rest", "uri": uri, "credential": "user:topsecret"}
    with pytest.raises(DiscoveryError) as exc:
        IcebergDataset("ns.t", catalog_config=config)
    text = str(exc.value)
    assert f"uri='{uri}'" in text
    assert "REST catalog's server must be running" in text
    assert "topsecret" not in text
