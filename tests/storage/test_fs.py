"""Filesystem specs: resolved without building a client; options derived once."""

from __future__ import annotations

import os
import pickle

import pytest
import s3fs

from torch_dataloader_utils.storage import fs as fs_module
from torch_dataloader_utils.storage.fs import FileSystemSpec, resolve

S3_OPTIONS = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:1"}


def test_resolve_builds_no_client() -> None:
    before = dict(s3fs.S3FileSystem._cache)
    spec, path = resolve("s3://bucket/dir/x.parquet", S3_OPTIONS)
    assert (spec.protocol, path) == ("s3", "bucket/dir/x.parquet")
    assert dict(s3fs.S3FileSystem._cache) == before  # no s3fs instance made in this process
    assert not any(key[2] == spec._options_key for key in fs_module._CLIENTS)


@pytest.mark.parametrize(
    ("url", "protocol", "expected"),
    [
        ("s3a://bucket/k", "s3", "bucket/k"),
        ("file:///tmp/x.csv", "file", "/tmp/x.csv"),
        ("rel/data.parquet", "file", os.path.abspath("rel/data.parquet")),
        ("memory://a/b", "memory", "/a/b"),
    ],
)
def test_resolve_splits_protocol_and_path(url: str, protocol: str, expected: str) -> None:
    spec, path = resolve(url)
    assert (spec.protocol, path) == (protocol, expected)


def test_native_options_translated_once_and_not_pickled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = fs_module.native_s3_options

    def counting(options):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(options)

    monkeypatch.setattr(fs_module, "native_s3_options", counting)
    spec = FileSystemSpec("s3", S3_OPTIONS)
    assert spec.native
    assert spec.native
    assert spec._key("x") == spec._key("x")
    assert len(calls) == 1
    clone = pickle.loads(pickle.dumps(spec))  # a worker derives its own, once
    assert "_native_options" not in clone.__dict__
    assert clone == spec
    assert clone.native
    assert len(calls) == 2


@pytest.mark.parametrize(
    "url",
    ["https://127.0.0.1:9/data/x.parquet", "http://127.0.0.1:9/data/x.parquet", "s3://bucket/x.parquet"],
)
def test_urls_are_shown_as_given(url: str) -> None:
    """Issue 28, item 5: ``https://host/x.parquet`` was shown as ``http://https://host/x.parquet``."""
    spec, path = resolve(url, {"anon": True} if url.startswith("s3") else None)
    assert spec.display(path) == url


def test_http_path_error_echoes_the_url() -> None:
    from torch_dataloader_utils import PathNotFoundError, create_dataloader

    with pytest.raises(PathNotFoundError, match=r"path='https://127\.0\.0\.1:9/x\.parquet' does not exist"):
        create_dataloader("https://127.0.0.1:9/x.parquet", retries=0, request_timeout=2)
