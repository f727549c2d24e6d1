"""The store identity the node-local cache keys files by: every way to name an endpoint, no secret."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pyarrow.fs as pafs
import pytest

from torch_dataloader_utils.storage.cache import FileKey
from torch_dataloader_utils.storage.stores import object_identity, options_identity

SECRETS = ("AKIASECRETKEYID", "s3cr3t-value", "sess10n-token", "QWNjb3VudEtleQ==")


def _s3fs(endpoint: str) -> object:
    s3fs = pytest.importorskip("s3fs")
    return s3fs.S3FileSystem(
        key=SECRETS[0], secret=SECRETS[1], endpoint_url=endpoint, skip_instance_cache=True
    )


def _arrow(endpoint: str) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(
        endpoint_override=endpoint, scheme="http", access_key=SECRETS[0], secret_key=SECRETS[1]
    )


def _connection(port: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={SECRETS[3]};"
        f"BlobEndpoint=http://127.0.0.1:{port}/acct;"
    )


@pytest.mark.parametrize(
    "pair",
    [
        lambda: [
            options_identity("s3", {"endpoint_url": f"http://127.0.0.1:{p}", "key": SECRETS[0]})
            for p in (1, 2)
        ],
        lambda: [
            options_identity("s3", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{p}"}})
            for p in (1, 2)
        ],
        lambda: [options_identity("abfs", {"connection_string": _connection(p)}) for p in (1, 2)],
        lambda: [options_identity("abfs", {"account_name": name}) for name in ("a", "b")],
        lambda: [object_identity(_s3fs(f"http://127.0.0.1:{p}")) for p in (1, 2)],
        lambda: [object_identity(_arrow(f"127.0.0.1:{p}")) for p in (1, 2)],
        lambda: [
            object_identity(pafs.SubTreeFileSystem("bucket/x", _arrow(f"127.0.0.1:{p}"))) for p in (1, 2)
        ],
        lambda: [
            object_identity(pafs.SubTreeFileSystem(base, _arrow("127.0.0.1:1"))) for base in ("b/x", "b/y")
        ],
    ],
    ids=[
        "endpoint_url",
        "client_kwargs",
        "connection_string",
        "account_name",
        "s3fs",
        "pyarrow",
        "subtree_endpoint",
        "subtree_base",
    ],
)
def test_two_stores_have_two_identities_and_no_secret(pair: object) -> None:
    first, second = pair()  # type: ignore[operator]
    assert first != second
    assert FileKey("s3://b/k", 10, "1.0", first).digest != FileKey("s3://b/k", 10, "1.0", second).digest
    for text in (first, second):
        assert not any(secret in text for secret in SECRETS), text


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_s3_endpoint_from_the_environment_is_part_of_the_identity(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    seen = set()
    for port in (1, 2):
        monkeypatch.setenv(variable, f"http://127.0.0.1:{port}")
        seen.add(options_identity("s3", {"key": "k", "secret": "s"}))
        seen.add(object_identity(pafs.S3FileSystem(access_key="k", secret_key="s")))
    assert len(seen) == 4


def test_tuning_options_do_not_change_the_identity() -> None:
    base = {"endpoint_url": "http://127.0.0.1:1", "key": "k"}
    tuned = {
        **base,
        "config_kwargs": {"read_timeout": 5, "max_pool_connections": 64},
        "default_block_size": 1,
    }
    assert options_identity("s3", base) == options_identity("s3", tuned)


def test_a_local_or_memory_filesystem_object_has_an_identity() -> None:
    assert object_identity(fsspec.filesystem("memory")).startswith("fsspec.MemoryFileSystem memory")
    assert object_identity(pafs.LocalFileSystem()).startswith("pyarrow.LocalFileSystem")
