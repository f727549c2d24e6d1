"""Ranged reads planned from footers, read-ahead within its bound, footers in one request."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import testsupport.latency_fs as latency

from tests.fixtures.data import write_parquet_files
from torch_dataloader_utils import ConfigError, CorruptFileError, create_dataloader
from torch_dataloader_utils.config import FetchConfig, parse_read_ahead
from torch_dataloader_utils.io.ahead import AHEAD_ITEMS
from torch_dataloader_utils.io.prefetch import (
    COALESCE_HOLE,
    FETCH_THREADS,
    READ_AHEAD_CHUNKS,
    ChunkSource,
    PlanOrderPool,
    coalesce,
)
from torch_dataloader_utils.storage.fetch import is_transient
from torch_dataloader_utils.storage.footers import FOOTER_READ_BYTES, read_footer
from torch_dataloader_utils.storage.fs import FileSystemSpec, native_s3_options


def _count_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of every ``info`` request (the readers' checks that a file is unchanged)."""
    checked: list[str] = []
    info = latency.LatencyFileSystem.info

    def counted(self: latency.LatencyFileSystem, path: str, **kwargs: object) -> object:
        checked.append(path)
        return info(self, path, **kwargs)

    monkeypatch.setattr(latency.LatencyFileSystem, "info", counted)
    return checked


def _latency_dataset(root: Path, **kwargs: object) -> tuple[object, object, latency.RequestStats]:
    key = uuid.uuid4().hex
    loader, dataset = create_dataloader(
        f"latency://{root}", storage_options={"stats_key": key}, num_workers=0, **kwargs
    )
    return loader, dataset, latency.stats(key)


@pytest.mark.parametrize("footers_kept", [True, False])
def test_reads_only_projected_columns_of_unpruned_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, footers_kept: bool
) -> None:
    if not footers_kept:  # as for a large dataset: readers fetch the footers themselves
        monkeypatch.setattr("torch_dataloader_utils.discovery.dataset.KEEP_FOOTERS_FILES", 1)
    write_parquet_files(tmp_path, [40000, 30000], row_group_size=5000)
    import pyarrow.compute as pc

    loader, dataset, counters = _latency_dataset(
        tmp_path, columns=["id"], filters=pc.field("id") >= 50000, split_rows=10000, batch_size=2560
    )
    counters.reset()
    ids = np.concatenate([b["id"].numpy() for b in loader])  # type: ignore[attr-defined]
    assert np.array_equal(np.sort(ids), np.arange(50000, 70000))
    source = dataset._reader._source  # type: ignore[attr-defined]
    needed = pieces = 0
    for name in ("part-0000.parquet", "part-0001.parquet"):
        assert (tmp_path / name).stat().st_size > FOOTER_READ_BYTES  # not fetched whole
        meta = pq.read_metadata(tmp_path / name)
        for i in range(meta.num_row_groups):
            col = meta.row_group(i).column(0)  # id
            if col.statistics.max >= 50000:
                needed += col.total_compressed_size
                pieces += 1
    assert source.stats.bytes_needed == needed
    # Only the gaps between needed column chunks closer than the coalescing hole are over-read.
    assert needed <= source.stats.bytes_fetched <= needed + (pieces - 1) * COALESCE_HOLE
    # Footers come with a small dataset's metadata; otherwise the reader fetched the
    # footer of each file it read once (file 0 is pruned whole).
    assert source.stats.footer_requests == (0 if footers_kept else 1)
    assert counters.bytes == source.stats.bytes_fetched + source.stats.footer_bytes
    assert source.stats.misses == 0


def test_read_ahead_stays_within_its_bound(tmp_path: Path) -> None:
    write_parquet_files(tmp_path, [6000], row_group_size=500)
    _loader, dataset, _ = _latency_dataset(tmp_path, split_rows=500, read_ahead_bytes=1)
    source: ChunkSource = dataset._reader._source  # type: ignore[attr-defined]
    chunks = dataset.worker_chunks()  # type: ignore[attr-defined]
    sizes = [sum(hi - lo for lo, hi in coalesce(source.needed_ranges(c))) for c in chunks]

    def fits(first: int, bound: int) -> int:  # how many chunks from `first` fit in `bound`
        n, used = 0, 0
        while first + n < len(sizes) and used + sizes[first + n] <= bound:
            used += sizes[first + n]
            n += 1
        return n

    for bound in (0, sizes[1] - 1, sum(sizes[1:4]), sum(sizes[1:4]) + sizes[4] // 2):
        source.config = FetchConfig(read_ahead_bytes=bound)
        source.schedule(chunks)
        source.open(chunks[0])
        assert sorted(source._pending) == list(range(1, 1 + fits(1, bound)))
        assert sum(f.nbytes for f in source._pending.values()) <= bound
        source.open(chunks[1])  # consuming one frees room for the next
        assert sorted(source._pending) == list(range(2, 2 + fits(2, bound)))
    assert fits(1, sum(sizes[1:4])) == 3
    source.close()


def test_footer_is_one_request_and_large_footers_two(tmp_path: Path) -> None:
    write_parquet_files(tmp_path, [100], row_group_size=10)
    wide = pa.table({f"column_with_a_long_name_{i:04d}": [1, 2] for i in range(1500)})
    pq.write_table(wide, tmp_path / "wide.parquet")
    key = uuid.uuid4().hex
    spec = FileSystemSpec("latency", {"stats_key": key})
    counters = latency.stats(key)
    for name, requests in (("part-0000.parquet", 1), ("wide.parquet", 2)):
        counters.reset()
        path = str(tmp_path / name)
        footer = read_footer(spec, path, (tmp_path / name).stat().st_size, FetchConfig())
        assert counters.requests == requests
        assert pq.read_metadata(pa.BufferReader(footer)).equals(pq.read_metadata(path))


def test_not_parquet_is_a_corrupt_file(tmp_path: Path) -> None:
    (tmp_path / "a.parquet").write_bytes(b"x" * 100)
    with pytest.raises(CorruptFileError, match=r"a\.parquet.*not a Parquet footer"):
        _latency_dataset(tmp_path)


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (ConnectionResetError("reset by peer"), True),
        (TimeoutError("read timed out"), True),
        (OSError("AWS Error SLOW_DOWN during GetObject operation: HTTP response code: 503"), True),
        (OSError("When reading information: AWS Error NETWORK_CONNECTION, curlCode: 56"), True),
        (FileNotFoundError("no such key"), False),
        (PermissionError("AccessDenied: 403"), False),
        (OSError("Cannot read past end of file"), False),
    ],
)
def test_transient_errors_are_told_apart(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_s3_options_translate_to_native_or_fall_back() -> None:
    native = native_s3_options(
        {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://h:9", "region_name": "r"}}
    )
    assert native is not None
    assert (native["access_key"], native["secret_key"], native["endpoint_override"]) == ("k", "s", "h:9")
    assert (native["scheme"], native["region"]) == ("http", "r")
    assert native_s3_options({"profile": "dev"}) is None
    assert native_s3_options({"client_kwargs": {"verify": False}}) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"read_ahead_bytes": -1}, r"read_ahead_bytes=-1 must be >= 0"),
        ({"read_ahead_bytes": "lots"}, r"read_ahead_bytes='lots' is not a size"),
        ({"read_ahead_bytes": True}, r"read_ahead_bytes=True is not a size"),
        ({"retries": -1}, r"retries=-1 must be >= 0"),
        ({"retries": 1.5}, r"retries=1.5 must be an int"),
        ({"retry_backoff": "1s"}, r"retry_backoff='1s' must be a number of seconds"),
        ({"retry_backoff": -0.5}, r"retry_backoff=-0.5 must be a number of seconds"),
    ],
)
def test_fetch_options_are_validated(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    write_parquet_files(tmp_path, [10])
    with pytest.raises(ConfigError, match=message):
        create_dataloader(str(tmp_path), **kwargs)  # type: ignore[arg-type]


def test_read_ahead_accepts_sizes_and_zero() -> None:
    assert FetchConfig(read_ahead_bytes=parse_read_ahead("256MiB")).read_ahead_bytes == 256 * 1024**2
    assert FetchConfig(read_ahead_bytes=parse_read_ahead(0)).read_ahead_bytes == 0
    assert FetchConfig(read_ahead_bytes=parse_read_ahead(None)).read_ahead_bytes == 0
    assert FetchConfig(retry_backoff=1.0).backoff(1) == 1.0
    assert FetchConfig(retry_backoff=1.0).backoff(20) == 10.0


def test_pool_serves_the_earliest_chunk_first() -> None:
    pool = PlanOrderPool(1)
    gate = threading.Event()
    order: list[int] = []
    blocker = pool.submit(0, gate.wait)
    futures = [pool.submit(p, order.append, p) for p in (5, 1, 3, 1)]
    gate.set()
    blocker.result(timeout=10)
    for f in futures:
        f.result(timeout=10)
    assert order == [1, 1, 3, 5]
    pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(0, order.append, 0)


def test_read_ahead_survives_a_fork(tmp_path: Path) -> None:
    """A source inherited by a forked worker (old pid) keeps the plan scheduled in that worker."""
    write_parquet_files(tmp_path, [600, 600, 600], row_group_size=100)
    _loader, dataset, _ = _latency_dataset(tmp_path, split_rows=100)
    source: ChunkSource = dataset._reader._source  # type: ignore[attr-defined]
    chunks = dataset.worker_chunks()  # type: ignore[attr-defined]
    source._pid = -1  # as seen from a DataLoader worker forked after the source was used
    source.schedule(chunks)
    source.open(chunks[0])
    assert sorted(source._pending) == list(range(1, min(len(chunks), 1 + source.ahead_chunks(1))))
    source.close()


def test_a_pass_starts_fetching_as_many_chunks_ahead_as_requests_in_flight_then_more(tmp_path: Path) -> None:
    """Small chunks: 8 ahead at the start (the first batch's chunks first), up to 32 as the pass goes on."""
    write_parquet_files(tmp_path, [100] * 60, row_group_size=100)
    _loader, dataset, _ = _latency_dataset(tmp_path)
    source: ChunkSource = dataset._reader._source  # type: ignore[attr-defined]
    chunks = dataset.worker_chunks()  # type: ignore[attr-defined]
    assert len(chunks) == 60
    source.schedule(chunks)
    source.open(chunks[0])
    assert sorted(source._pending) == list(range(1, 1 + FETCH_THREADS))  # 8, not 32
    for i in range(1, 41):
        source.open(chunks[i])
    assert sorted(source._pending) == list(range(41, 41 + FETCH_THREADS + 41 // 4))
    assert source.ahead_chunks(10_000) == READ_AHEAD_CHUNKS
    source.close()


def test_small_files_come_whole_in_one_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("torch_dataloader_utils.discovery.dataset.KEEP_FOOTERS_FILES", 1)
    write_parquet_files(tmp_path, [300, 200], row_group_size=100)
    assert all(p.stat().st_size < FOOTER_READ_BYTES for p in tmp_path.iterdir())
    loader, dataset, counters = _latency_dataset(tmp_path, split_strategy="file", batch_size=64)
    checks = _count_checks(monkeypatch)
    counters.reset()
    ids = np.concatenate([b["id"].numpy() for b in loader])  # type: ignore[attr-defined]
    assert np.array_equal(np.sort(ids), np.arange(500))
    source: ChunkSource = dataset._reader._source  # type: ignore[attr-defined]
    # the reader's requests: one per file, plus the checks that it is unchanged (counted too)
    assert (source.stats.requests, source.stats.footer_requests, source.stats.misses) == (
        2 + len(checks),
        0,
        0,
    )
    assert len(checks) == 2  # each file checked once: unchanged since the dataset was built
    assert counters.requests - len(checks) == 2  # and read in one request


@pytest.mark.parametrize("footers_kept", [True, False])
def test_first_batch_costs_a_bounded_number_of_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, footers_kept: bool
) -> None:
    """However many files a worker has, the first batch starts at most the read-ahead window."""
    if not footers_kept:
        monkeypatch.setattr("torch_dataloader_utils.discovery.dataset.KEEP_FOOTERS_FILES", 1)
    write_parquet_files(tmp_path, [50] * 120, row_group_size=50, with_strings=False)
    loader, dataset, counters = _latency_dataset(tmp_path, batch_size=64, split_strategy="file")
    assert len(dataset.files) == 120  # type: ignore[attr-defined]
    checks = _count_checks(monkeypatch)
    counters.reset()
    it = iter(loader)
    first = next(it)
    assert len(first["id"]) == 64
    # Two chunks make the first batch; the read-ahead thread may have decoded AHEAD_ITEMS
    # more and be holding one (a chunk each, here), and at most READ_AHEAD_CHUNKS more
    # were started (the checks that files are unchanged run beside them, one per file).
    assert counters.requests - len(checks) <= 2 + AHEAD_ITEMS + 1 + READ_AHEAD_CHUNKS
    source: ChunkSource = dataset._reader._source  # type: ignore[attr-defined]
    assert len(source._pending) <= READ_AHEAD_CHUNKS
    rest = sum(len(b["id"]) for b in it)
    assert 64 + rest == 6000
    assert len(checks) == len(set(checks)) == 120  # each file checked once
    assert counters.requests - len(checks) == 120  # every file read once, whole: no footer request, no miss


def test_s3fs_pool_is_as_large_as_the_footer_concurrency() -> None:
    from torch_dataloader_utils.discovery.parquet import METADATA_THREADS

    # (an endpoint of its own: tests/storage/test_fs.py checks that no client exists for its options)
    opts = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:2"}
    client = FileSystemSpec("s3", opts).fsspec()
    assert client.config_kwargs["max_pool_connections"] == METADATA_THREADS == 64
    mine = FileSystemSpec("s3", {**opts, "config_kwargs": {"max_pool_connections": 7, "read_timeout": 5}})
    assert mine.fsspec().config_kwargs == {"max_pool_connections": 7, "read_timeout": 5}
    assert native_s3_options(mine.storage_options) is not None  # still read natively


def test_forked_workers_fetch_ahead(tmp_path: Path) -> None:
    """In a forked DataLoader worker the next chunks are fetched while one is decoded.

    Evidence from the loader's own metrics, relative (no wall-clock threshold): with
    read-ahead, a worker waits for storage far less than one delay per chunk.
    """
    write_parquet_files(tmp_path, [800] * 4, row_group_size=100)
    delay = 0.05
    loader, _ = create_dataloader(
        f"latency://{tmp_path}",
        storage_options={"delay": delay},
        num_workers=1,
        split_rows=200,
        multiprocessing_context="fork",
    )
    assert sum(len(b["id"]) for b in loader) == 3200  # type: ignore[arg-type]
    [worker] = loader.metrics().ranks[0].workers  # type: ignore[attr-defined]
    assert worker.chunks_done == 16
    assert worker.storage_wait_sec < 0.4 * worker.chunks_done * delay
