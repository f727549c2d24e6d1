"""Parquet footers on S3: pyarrow's native client, one GET each, no HEAD, counted exactly.

Against a real S3 server (SeaweedFS, else moto) behind the fault proxy, which sees every
request and which client sent it (its ``User-Agent``): footers go through pyarrow's
native client (``aws-sdk-cpp``) wherever it reaches what s3fs reaches, and through s3fs
(``botocore``) otherwise. Either way ``metrics()`` says what the server saw.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from testsupport.s3_server import KEY, SECRET

from tests.bounds import assert_ends_within
from tests.fixtures.s3 import FaultProxy, S3Server
from tests.fixtures.stores import black_hole
from torch_dataloader_utils import FileChangedError, ReadError, create_dataloader
from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.storage.footers import FOOTER_READ_BYTES, read_footer
from torch_dataloader_utils.storage.fs import resolve
from torch_dataloader_utils.storage.requests import RequestCounts
from torch_dataloader_utils.tools.cost import predict_plan

FILES = 12
ROWS = 40  # per file: one row group, every column in one GET


def _parquet(table: pa.Table, **kwargs: Any) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **kwargs)
    return bytes(sink.getvalue().to_pybytes())


def _small(i: int) -> bytes:
    return _parquet(pa.table({"id": np.arange(i * ROWS, (i + 1) * ROWS), "x": np.ones(ROWS)}))


def _wide() -> bytes:
    """One file whose footer is over 64 KiB (60 columns x 20 row groups)."""
    table = pa.table({f"c{i}": np.arange(2000) for i in range(60)})
    return _parquet(table, row_group_size=100)


def _data(server: S3Server) -> str:
    fs = server.fs()
    prefix = server.new_prefix()
    for i in range(FILES):
        fs.pipe_file(f"{prefix}/part-{i:03d}.parquet", _small(i))
    return prefix


def _kinds(counts: RequestCounts) -> Counter[str]:
    found = Counter({"LIST": counts.lists, "HEAD": counts.heads, "GET": counts.gets, "PUT": counts.puts})
    found["other"] = counts.others
    return +found


def _epoch(prefix: str, options: dict[str, Any]) -> tuple[list[int], Any, RequestCounts]:
    loader, dataset = create_dataloader(f"s3://{prefix}", storage_options=options, num_workers=0)
    ids = [int(i) for batch in loader for i in batch["id"].tolist()]
    return ids, dataset, loader.metrics().request_counts


@pytest.mark.slow
def test_a_cold_discovery_reads_each_footer_with_one_native_get_and_no_head(
    s3_server: S3Server, s3_proxy: FaultProxy
) -> None:
    prefix = _data(s3_server)
    s3_proxy.reset()
    ids, dataset, counted = _epoch(prefix, s3_server.options(s3_proxy.endpoint))
    assert sorted(ids) == list(range(FILES * ROWS))
    assert dataset.discovered.fs.native_footers
    # The manifest looked for, the listing, one GET per footer, one GET per file's data.
    assert +s3_proxy.kinds == Counter({"LIST": 1, "GET": 1 + 2 * FILES})
    assert s3_proxy.clients[("GET", "aws-sdk-cpp")] == FILES  # every footer, natively
    assert s3_proxy.clients[("HEAD", "aws-sdk-cpp")] == 0
    assert _kinds(counted) == +s3_proxy.kinds  # metrics() says what the server saw


@pytest.mark.slow
def test_a_native_discovery_parses_each_footer_once(
    s3_server: S3Server, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metadata pyarrow parsed to read a footer is used as it is, not serialized and parsed again.

    Before: every file's footer was parsed twice more (its own, and the first file's for the
    schema comparison), a visible share of a 1,000-file discovery's CPU under the GIL.
    """
    prefix = _data(s3_server)
    parsed: list[int] = []
    real = pq.read_metadata

    def counting(*args: Any, **kwargs: Any) -> Any:
        parsed.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pq, "read_metadata", counting)
    _, dataset = create_dataloader(
        f"s3://{prefix}", storage_options=s3_server.options(s3_proxy.endpoint), num_workers=0
    )
    assert dataset.discovered.fs.native_footers
    assert len(dataset.discovered.files) == FILES
    assert len(parsed) <= 2  # the first file's (the dataset's schema), not 2 per file


@pytest.mark.slow
def test_a_footer_over_64_kib_is_two_native_gets_counted_with_their_bytes(
    s3_server: S3Server, s3_proxy: FaultProxy
) -> None:
    data = _wide()
    length = int.from_bytes(data[-8:-4], "little")
    assert length + 8 > FOOTER_READ_BYTES
    prefix = s3_server.new_prefix()
    s3_server.fs().pipe_file(f"{prefix}/wide.parquet", data)
    config = FetchConfig()
    spec, path = resolve(
        f"s3://{prefix}/wide.parquet",
        s3_server.options(s3_proxy.endpoint),
        timeout=config.attempt_timeout,
        deadline=config.request_timeout,
    )
    assert spec.native_footers
    s3_proxy.reset()
    received: list[int] = []
    footer = read_footer(spec, path, len(data), config, on_request=received.append)
    assert footer == b"PAR1" + data[-(length + 8) :]  # the footer's own bytes
    # pyarrow reads the last 64 KiB, then the whole metadata: two GETs, as counted.
    assert received == [FOOTER_READ_BYTES, length]
    assert +s3_proxy.kinds == Counter({"GET": 2})
    assert s3_proxy.clients[("GET", "aws-sdk-cpp")] == 2


@pytest.mark.slow
def test_a_file_changed_after_native_discovery_is_still_detected(
    s3_server: S3Server, s3_proxy: FaultProxy
) -> None:
    prefix = _data(s3_server)
    s3_proxy.reset()
    loader, _ = create_dataloader(
        f"s3://{prefix}", storage_options=s3_server.options(s3_proxy.endpoint), num_workers=0, shuffle=False
    )
    assert s3_proxy.clients[("GET", "aws-sdk-cpp")] == FILES  # footers read natively (and kept)
    s3_server.fs().pipe_file(f"{prefix}/part-005.parquet", _small(5) + b"\0" * 100)  # same rows, new size
    with pytest.raises(FileChangedError, match="part-005"):
        for _ in loader:
            pass


def _faulty_discovery(server: S3Server, proxy: FaultProxy, status: int) -> tuple[Any, Counter[str]]:
    """A discovery whose every third GET fails with ``status`` (0: a reset); its loader and requests."""
    prefix = _data(server)
    proxy.reset()
    proxy.fail_every, proxy.fail_status, proxy.fail_path = 3, status, prefix.split("/", 1)[1]
    loader, _ = create_dataloader(
        f"s3://{prefix}", storage_options=server.options(proxy.endpoint), num_workers=0, retry_backoff=0.01
    )
    seen = +proxy.kinds
    assert proxy.failures > 0
    assert seen == Counter({"LIST": 1, "GET": 1 + FILES + proxy.failures})  # each failure retried once
    assert proxy.clients[("GET", "aws-sdk-cpp")] == seen["GET"] - 1  # all but the manifest's
    proxy.fail_every = 0
    ids = [int(i) for batch in loader for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(FILES * ROWS))
    return loader, seen


@pytest.mark.slow
def test_server_errors_on_native_footer_gets_are_retried_and_counted_exactly(
    s3_server: S3Server, s3_proxy: FaultProxy
) -> None:
    loader, seen = _faulty_discovery(s3_server, s3_proxy, 503)
    assert _kinds(loader.metrics().request_counts) == +s3_proxy.kinds
    assert seen["GET"] < s3_proxy.kinds["GET"]  # the epoch's reads were counted too


@pytest.mark.slow
def test_reset_connections_on_native_footer_gets_are_retried(
    s3_server: S3Server, s3_proxy: FaultProxy
) -> None:
    """A GET answered by a reset is retried; libcurl resends some itself, unseen by the counts.

    pyarrow's client (libcurl) resends a request once, on its own, when a reused
    connection dies before any answer: the server saw both, ``metrics()`` one. Only a
    server that reads a request and resets the connection without answering makes this
    differ (an idle connection closed by the server never carried the first request).
    """
    loader, _ = _faulty_discovery(s3_server, s3_proxy, 0)
    counted = _kinds(loader.metrics().request_counts)
    assert counted["LIST"] == 1
    assert s3_proxy.kinds["GET"] - s3_proxy.failures <= counted["GET"] <= s3_proxy.kinds["GET"]


@pytest.mark.slow
def test_an_option_with_no_native_equivalent_keeps_footers_on_s3fs(
    s3_server: S3Server, s3_proxy: FaultProxy
) -> None:
    prefix = _data(s3_server)
    s3_proxy.reset()
    options = {**s3_server.options(s3_proxy.endpoint), "s3_additional_kwargs": {}}
    ids, dataset, counted = _epoch(prefix, options)
    assert sorted(ids) == list(range(FILES * ROWS))
    assert not dataset.discovered.fs.native_footers
    assert "no native equivalent" in dataset.discovered.fs.data_path_description
    assert +s3_proxy.kinds == Counter({"LIST": 1, "GET": 1 + 2 * FILES})
    assert s3_proxy.clients[("GET", "aws-sdk-cpp")] == 0
    assert s3_proxy.clients[("GET", "botocore")] == 1 + 2 * FILES
    assert _kinds(counted) == +s3_proxy.kinds


@pytest.mark.slow
def test_a_pyarrow_s3_filesystem_object_reads_footers_with_no_head_and_is_counted_by_kind(
    s3_server: S3Server, s3_proxy: FaultProxy
) -> None:
    """``filesystem=pyarrow.fs.S3FileSystem(...)``: footers through it, sized (no HEAD); metrics = server.

    Before: each footer cost a HEAD and a GET (the file opened by path), and the reshard
    manifest looked for (a HEAD through pyarrow, which found nothing) was counted as a GET.
    Reading a file still costs its HEADs through such an object (pyarrow opens a file by
    path with one; the file is checked with another): per file and epoch, 2 HEADs and its GETs.
    """
    prefix = _data(s3_server)
    client = pafs.S3FileSystem(
        endpoint_override=s3_proxy.endpoint, access_key=KEY, secret_key=SECRET, region="us-east-1"
    )
    s3_proxy.reset()
    loader, dataset = create_dataloader(f"s3://{prefix}", filesystem=client, num_workers=0)
    assert dataset.discovered.fs.native_footers
    assert "footers by that client" in dataset.discovered.fs.data_path_description
    # The manifest looked for (a HEAD, nothing there), the listing, one GET per footer.
    assert +s3_proxy.kinds == Counter({"HEAD": 1, "LIST": 1, "GET": FILES})
    assert _kinds(loader.metrics().request_counts) == +s3_proxy.kinds
    ids = [int(i) for batch in loader for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(FILES * ROWS))
    assert +s3_proxy.kinds == Counter({"HEAD": 1 + 2 * FILES, "LIST": 1, "GET": 2 * FILES})
    assert _kinds(loader.metrics().request_counts) == +s3_proxy.kinds
    assert _kinds(predict_plan(dataset, 0, 0).total()) == +s3_proxy.kinds  # inspect's prediction


@pytest.mark.slow
def test_a_dead_endpoint_fails_a_native_footer_read_within_request_timeout_naming_it(
    s3_server: S3Server,
) -> None:
    config = FetchConfig(retries=1, request_timeout=3)
    with black_hole() as endpoint:
        spec, path = resolve(
            "s3://bucket/data/part-0.parquet",
            s3_server.options(endpoint),
            timeout=config.attempt_timeout,
            deadline=config.request_timeout,
        )
        assert spec.native_footers
        started = time.monotonic()
        with pytest.raises(ReadError) as caught:
            read_footer(spec, path, 1000, config)
        elapsed = time.monotonic() - started
    assert_ends_within(elapsed, 3)
    text = str(caught.value)
    assert endpoint in text
    assert "s3://bucket/data/part-0.parquet" in text
    assert "request_timeout=3" in text
    assert "tdu-test-secret" not in text
