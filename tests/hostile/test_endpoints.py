"""Issue 28, items 7 and 15: endpoints that the data path did not honour or did not bound.

7. A GCS endpoint that does not speak the protocol gcsfs expects (gcp-storage-emulator
   speaks the JSON API, not Google's gRPC storage-control API) hung for more than 3
   minutes in SSL handshake retries, past ``request_timeout``.
15. An S3 endpoint from the environment or a profile (``AWS_ENDPOINT_URL``,
   ``AWS_ENDPOINT_URL_S3``, a profile's ``endpoint_url``) was used for listing (s3fs)
   but not for the bytes, which went to amazonaws.com.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testsupport.s3_server import KEY, SECRET, S3Server
from testsupport.stores import GcsServer

from tests.bounds import assert_ends_within
from tests.fixtures.e2e import assert_exactly_once, epoch_ids
from torch_dataloader_utils import DiscoveryError, create_dataloader

ROWS = 240


def _write(fs: object, prefix: str) -> None:
    for i in range(2):
        buf = io.BytesIO()
        ids = pa.array(range(i * ROWS // 2, (i + 1) * ROWS // 2), pa.int64())
        pq.write_table(pa.table({"id": ids}), buf, row_group_size=40)
        fs.pipe_file(f"{prefix}/data/part-{i}.parquet", buf.getvalue())  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_item_7_gcs_endpoint_not_speaking_grpc_reads_within_request_timeout(gcs_server: GcsServer) -> None:
    """The issue's reproduction: hung > 3 minutes; now read at once, each request bounded."""
    prefix = gcs_server.new_prefix()
    _write(gcs_server.fs(), prefix)
    started = time.monotonic()
    loader, _ = create_dataloader(
        f"gs://{prefix}/data/",
        storage_options={"token": "anon", "endpoint_url": gcs_server.endpoint, "project": "test"},
        num_workers=2,
        request_timeout=5,
    )
    assert_exactly_once(epoch_ids(loader), range(ROWS))
    assert time.monotonic() - started < 80  # it hung for minutes; under the test's 90 s timeout


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_item_7_gcsfs_default_object_is_bounded_by_request_timeout_and_says_why(
    gcs_server: GcsServer,
) -> None:
    """The user's own gcsfs object (its default class asks gRPC first) fails in time, with the fix."""
    gcsfs = pytest.importorskip("gcsfs")
    prefix = gcs_server.new_prefix()
    _write(gcs_server.fs(), prefix)
    given = gcsfs.GCSFileSystem(skip_instance_cache=True, **gcs_server.options())
    if type(given).__name__ != "ExtendedGcsFileSystem":
        pytest.skip("this gcsfs has no gRPC bucket-type lookup")
    started = time.monotonic()
    with pytest.raises(DiscoveryError) as caught:
        create_dataloader(f"gs://{prefix}/data/", filesystem=given, num_workers=0, request_timeout=3)
    assert_ends_within(time.monotonic() - started, 3)
    text = str(caught.value)
    assert gcs_server.endpoint in text
    assert "gcsfs.core.GCSFileSystem" in text


def _aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "profile"])
def test_item_15_s3_endpoint_from_the_environment_or_a_profile_is_used_for_the_bytes(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    prefix = s3_server.new_prefix()
    _write(s3_server.fs(), prefix)
    _aws_environment(monkeypatch, tmp_path)
    if where == "profile":
        config = tmp_path / "aws-config"
        config.write_text(f"[profile local]\nendpoint_url = {s3_server.endpoint}\n")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
        monkeypatch.setenv("AWS_PROFILE", "local")
    else:
        monkeypatch.setenv(where, s3_server.endpoint)
    loader, dataset = create_dataloader(
        f"s3://{prefix}/data",
        storage_options={"key": KEY, "secret": SECRET},
        num_workers=2,
        request_timeout=10,
    )
    assert_exactly_once(epoch_ids(loader), range(ROWS))
    spec = dataset.discovered.fs
    assert spec.native
    assert s3_server.endpoint in spec.data_path_description
