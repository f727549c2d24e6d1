"""Hostile case 13: secrets never appear in a repr, an error, a log record or a resume state.

The S3 side (``repr(dataset.discovered)``, ``vars(dataset)``, storage options given as
pairs) is in ``tests/storage/test_redact.py``; here: Iceberg catalog properties, the
library's log records, and the errors of the new storage checks.
"""

from __future__ import annotations

import json
import logging
import socket

import pytest

from tests.fixtures.iceberg import create_id_table, id_table
from tests.fixtures.s3 import S3Server
from torch_dataloader_utils import (
    ConfigError,
    DataLoaderUtilsError,
    IcebergDataset,
    PathNotFoundError,
    create_dataloader,
)

SECRET = "wJalrXUtnFEMIsecretvalue"
KEY_ID = "AKIAEXAMPLEKEYID"
TOKEN = "FwoGZXIvYXdzEtokenvalue"


def _clean(text: str) -> None:
    for value in (SECRET, KEY_ID, TOKEN, "urlpassword"):
        assert value not in text, f"{value!r} leaked into {text[:300]!r}"


def test_case_13_iceberg_catalog_properties_never_shown(iceberg_catalog) -> None:
    config, catalog = iceberg_catalog
    table = create_id_table(catalog)
    table.append(id_table(0, 30))
    secret_config = {
        **config,
        "s3.access-key-id": KEY_ID,
        "s3.secret-access-key": SECRET,
        "s3.session-token": TOKEN,
    }
    ds = IcebergDataset("ns.t", catalog_config=secret_config, split_rows=10)
    texts = [repr(vars(ds)), repr(ds.scan), repr(ds.options), json.dumps(ds.state_dict())]
    assert sorted(i for b in ds for i in b["id"].tolist()) == list(range(30))
    with pytest.raises(PathNotFoundError) as missing:
        IcebergDataset("ns.nope", catalog_config=secret_config)
    with pytest.raises(ConfigError) as bad:
        IcebergDataset("ns.t", catalog_config=secret_config, storage_options={"secret": "other" + SECRET})
    texts += [str(missing.value), str(bad.value)]
    for text in texts:
        _clean(text)


@pytest.mark.slow
def test_case_13_log_records_hold_no_secret(s3_server: S3Server, write_parquet, caplog) -> None:
    path = write_parquet([60], row_group_size=20)[0]
    prefix = s3_server.new_prefix()
    s3_server.fs().put_file(str(path), f"{prefix}/{path.name}")
    options = s3_server.options()
    with caplog.at_level(logging.DEBUG, logger="torch_dataloader_utils"):
        loader, dataset = create_dataloader(
            f"s3://{prefix}", storage_options=options, num_workers=0, show_progress=False
        )
        assert sum(len(b["id"]) for b in loader) == 60
        dataset.get_metrics()
    ours = [r for r in caplog.records if r.name.startswith("torch_dataloader_utils")]
    assert ours  # the epoch summary is logged at INFO
    for record in ours:
        text = record.getMessage()
        assert options["key"] not in text
        assert options["secret"] not in text


def test_case_13_storage_errors_hide_url_passwords_and_keys() -> None:
    with socket.socket() as s:  # nobody listens there
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://user:urlpassword@127.0.0.1:{s.getsockname()[1]}"
    options = {"key": KEY_ID, "secret": SECRET, "token": TOKEN, "endpoint_url": endpoint}
    with pytest.raises(DataLoaderUtilsError) as exc:
        create_dataloader("s3://bucket/data", storage_options=options, num_workers=0, retries=0)
    _clean(str(exc.value))
    assert "user:***@127.0.0.1" in str(exc.value)
    with pytest.raises(ConfigError) as bad:  # a malformed endpoint is echoed, its password hidden
        create_dataloader(
            "s3://bucket/data", storage_options={**options, "endpoint_url": "htp://u:urlpassword@host"}
        )
    _clean(str(bad.value))
