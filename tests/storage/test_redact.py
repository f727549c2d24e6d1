"""Hostile case 13: secrets never appear in a repr, an error or a resume state of ours."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.s3 import S3Server
from torch_dataloader_utils import ConfigError, create_dataloader
from torch_dataloader_utils.config import FileSourceConfig, IcebergSourceConfig
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.iceberg_fs import IcebergFileSystem
from torch_dataloader_utils.storage.redact import HIDDEN, redact

SECRETS = {
    "key": "AKIAEXAMPLEKEYID",
    "secret": "wJalrXUtnFEMIsecretvalue",
    "token": "FwoGZXIvYXdzEtokenvalue",
    "client_kwargs": {"aws_secret_access_key": "nestedsecretvalue", "region_name": "eu-west-1"},
    "endpoint_url": "http://user:urlpassword@127.0.0.1:9",
}
VALUES = (
    "AKIAEXAMPLEKEYID",
    "wJalrXUtnFEMIsecretvalue",
    "FwoGZXIvYXdzEtokenvalue",
    "nestedsecretvalue",
    "urlpassword",
)


def _clean(text: str) -> None:
    for value in VALUES:
        assert value not in text, f"{value!r} leaked into {text!r}"


def test_redact_keeps_names_and_hides_values() -> None:
    shown = redact(SECRETS)
    assert shown["key"] == shown["secret"] == shown["token"] == HIDDEN
    assert shown["client_kwargs"] == {"aws_secret_access_key": HIDDEN, "region_name": "eu-west-1"}
    assert shown["endpoint_url"] == f"http://user:{HIDDEN}@127.0.0.1:9"
    iceberg = {"s3.access-key-id": "AKIAEXAMPLEKEYID", "s3.secret-access-key": "x", "uri": "sqlite:///c.db"}
    assert redact(iceberg) == {
        "s3.access-key-id": HIDDEN,
        "s3.secret-access-key": HIDDEN,
        "uri": "sqlite:///c.db",
    }
    assert redact([("secret", "wJalrXUtnFEMIsecretvalue"), ("anon", False)]) == [
        ("secret", HIDDEN),
        ("anon", False),
    ]


def test_value_reprs_hide_secrets() -> None:
    _clean(repr(FileSystemSpec("s3", SECRETS)))
    _clean(repr(FileSourceConfig(storage_options=SECRETS)))
    _clean(
        repr(IcebergSourceConfig(table="db.t", catalog_config={"s3.secret-access-key": "nestedsecretvalue"}))
    )
    _clean(repr(IcebergFileSystem({"s3.secret-access-key": "nestedsecretvalue"})))
    assert "'region_name': 'eu-west-1'" in repr(FileSystemSpec("s3", SECRETS))  # names and plain values stay


def test_storage_options_as_pairs_error_hides_secrets(tmp_path) -> None:
    """storage_options given as a list of pairs was echoed, secrets included, in the ConfigError."""
    with pytest.raises(ConfigError) as exc:
        create_dataloader(str(tmp_path), storage_options=list(SECRETS.items()))  # type: ignore[arg-type]
    _clean(str(exc.value))
    assert "storage_options=" in str(exc.value)
    assert "must be a dict" in str(exc.value)


@pytest.mark.slow
def test_dataset_on_s3_shows_no_secret(s3_server: S3Server, write_parquet) -> None:
    """repr(dataset.discovered) and vars(dataset) printed the S3 key, secret and token."""
    path = write_parquet([50], row_group_size=25)[0]
    prefix = s3_server.new_prefix()
    s3_server.fs().put_file(str(path), f"{prefix}/{path.name}")
    options = s3_server.options()
    secrets = (options["key"], options["secret"])
    loader, dataset = create_dataloader(f"s3://{prefix}", storage_options=options, num_workers=0)
    texts = [
        repr(dataset.discovered),
        repr(vars(dataset)),
        repr(dataset.options),
        json.dumps(loader.state_dict()),
    ]
    for text in texts:
        for secret in secrets:
            assert secret not in text
    assert sum(len(b["id"]) for b in loader) == 50
