"""S3 timestamps parsed without dateutil give botocore's instants, for both forms S3 sends."""

from __future__ import annotations

import datetime as dt
import time
from email.utils import format_datetime

import pytest
from botocore.parsers import DEFAULT_TIMESTAMP_PARSER
from hypothesis import given
from hypothesis import strategies as st

from tests.fixtures.s3 import S3Server
from torch_dataloader_utils.storage.fs import resolve
from torch_dataloader_utils.storage.identity import mtime_of
from torch_dataloader_utils.storage.timestamps import parse_timestamp

instants = st.datetimes(
    min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=st.just(dt.UTC)
)


@given(instants, st.sampled_from(["seconds", "milliseconds", "microseconds"]))
def test_iso_8601_in_utc_is_botocores_instant(when: dt.datetime, precision: str) -> None:
    text = when.replace(tzinfo=None).isoformat(timespec=precision) + "Z"  # as in a listing's XML
    got = parse_timestamp(text)
    assert got.tzinfo is not None
    assert got.timestamp() == DEFAULT_TIMESTAMP_PARSER(text).timestamp()


@given(instants)
def test_the_http_date_is_botocores_instant(when: dt.datetime) -> None:
    text = format_datetime(when.replace(microsecond=0), usegmt=True)  # as in a Last-Modified header
    got = parse_timestamp(text)
    assert got.timestamp() == DEFAULT_TIMESTAMP_PARSER(text).timestamp()


@pytest.mark.parametrize("value", ["2026-11-28T01:43:28+02:00", "1764294208", 1764294208, "Sat, 28 Nov 2026"])
def test_other_forms_are_left_to_botocore(value: object) -> None:
    assert parse_timestamp(value).timestamp() == DEFAULT_TIMESTAMP_PARSER(value).timestamp()


@pytest.mark.slow
def test_the_librarys_s3_client_lists_with_it_and_a_users_client_is_left_alone(s3_server: S3Server) -> None:
    prefix = s3_server.new_prefix()
    s3_server.fs().pipe_file(f"{prefix}/a.parquet", b"x" * 10)
    spec, root = resolve(f"s3://{prefix}", s3_server.options())
    client = spec.fsspec()
    parser = client._s3._response_parser
    assert parser._timestamp_parser is parse_timestamp  # listings and every GET's Last-Modified
    listed = spec.call("find", root, withdirs=False, detail=True)
    (only,) = listed.values()
    assert mtime_of(only) == pytest.approx(time.time(), abs=120)
    users = s3_server.fs()  # a user's own s3fs object: not changed
    users.ls(prefix)
    assert users.s3._response_parser._timestamp_parser is not parse_timestamp
