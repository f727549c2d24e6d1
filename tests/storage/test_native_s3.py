"""Whether pyarrow's native S3 client provably reaches what s3fs reaches (storage/native_s3.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.native_s3 import configured_endpoint, intercepted

OPTIONS = {"key": "k", "secret": "s"}
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE", "AWS_PROFILE")


@pytest.fixture(autouse=True)
def _no_aws_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws/config


def test_under_moto_mock_aws_the_bytes_go_through_s3fs(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.2.0's own S3 tests mock S3 with moto's mock_aws, which the native client never sees."""
    moto = pytest.importorskip("moto")
    assert FileSystemSpec("s3", OPTIONS).native  # outside the mock (moto imported, disabled)
    with moto.mock_aws():
        assert intercepted() is not None
        spec = FileSystemSpec("s3", OPTIONS)
        assert not spec.native
        assert "intercepted" in spec.data_path_description
    assert intercepted() is None


def test_an_untranslatable_option_keeps_the_bytes_on_s3fs() -> None:
    spec = FileSystemSpec("s3", {**OPTIONS, "profile": "dev"})
    assert not spec.native
    assert "no native equivalent" in spec.data_path_description


def test_no_configuration_means_aws_itself() -> None:
    assert configured_endpoint(OPTIONS) is None
    spec = FileSystemSpec("s3", OPTIONS)
    assert spec.native
    assert "endpoint_override" not in spec._native_options  # type: ignore[operator]


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_endpoint_from_the_environment_reaches_the_native_client(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "http://127.0.0.1:9")
    native = FileSystemSpec("s3", OPTIONS)._native_options
    assert native is not None
    assert (native["endpoint_override"], native["scheme"]) == ("127.0.0.1:9", "http")
    # An explicit endpoint_url wins over the environment, as in botocore.
    explicit = FileSystemSpec("s3", {**OPTIONS, "endpoint_url": "http://127.0.0.1:7"})._native_options
    assert explicit is not None
    assert explicit["endpoint_override"] == "127.0.0.1:7"


def test_an_endpoint_from_a_profile_reaches_the_native_client(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "aws-config"
    config.write_text("[profile dev]\nendpoint_url = http://127.0.0.1:8\nregion = eu-west-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "dev")
    spec = FileSystemSpec("s3", OPTIONS)
    native = spec._native_options
    assert native is not None
    assert (native["endpoint_override"], native["region"]) == ("127.0.0.1:8", "eu-west-1")
    assert "configured outside storage_options" in spec.data_path_description
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert configured_endpoint(OPTIONS) is None
