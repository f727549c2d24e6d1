"""metadata_cache: a restart reads no footers; a stale or damaged cache is a warning, then rewritten."""

from __future__ import annotations

import os
import uuid
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import testsupport.latency_fs as latency

from tests.fixtures.data import write_parquet_files
from tests.fixtures.s3 import FaultProxy, S3Server
from torch_dataloader_utils import ConfigError, StructuredDataset
from torch_dataloader_utils.config import FileFormat, FileSourceConfig
from torch_dataloader_utils.discovery import discover
from torch_dataloader_utils.discovery.cache import CACHE_KIND, CACHE_VERSION

ROWS = [500, 300, 800, 120]


def _build(root: Path, cache: Path | str, **kwargs: object) -> tuple[StructuredDataset, int, list[str]]:
    """The dataset over ``latency://root``, the requests it made, and the warnings it raised."""
    key = uuid.uuid4().hex
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = StructuredDataset(
            f"latency://{root}",
            storage_options={"stats_key": key},
            metadata_cache=cache,
            split_rows=100,
            **kwargs,  # type: ignore[arg-type]
        )
    return ds, latency.stats(key).requests, [str(w.message) for w in caught if w.category is UserWarning]


def _ids(ds: StructuredDataset) -> np.ndarray:
    return np.sort(np.concatenate([b["id"].numpy() for b in ds]))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_parquet_files(tmp_path / "data", ROWS, row_group_size=[100, 100, 250, 60])
    return tmp_path / "data"


def test_a_warm_cache_reads_no_footers(data: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "meta.arrow"  # its directory is made
    cold, cold_requests, notes = _build(data, cache)
    assert notes == []
    assert cache.exists()
    assert cold_requests == 1 + len(ROWS)  # one listing page (no HEAD before it), every footer
    warm, warm_requests, notes = _build(data, cache)
    assert notes == []
    assert warm_requests == 1  # the listing only: no footer was read
    assert warm.files == cold.files
    assert warm.discovered.metadata is not None
    assert cold.discovered.metadata is not None
    assert warm.discovered.metadata.equals(cold.discovered.metadata)
    assert np.array_equal(_ids(warm), np.arange(sum(ROWS)))
    # Self-describing: an Arrow IPC file saying what it is and what it was built for.
    meta = pa.ipc.open_file(pa.BufferReader(cache.read_bytes())).schema.metadata
    assert meta[b"tdu.kind"] == CACHE_KIND.encode()
    assert meta[b"tdu.version"] == str(CACHE_VERSION).encode()
    assert meta[b"tdu.first_path"] == str(data / "part-0000.parquet").encode()
    assert not [p for p in cache.parent.iterdir() if p.name.endswith(".tmp")]  # written via rename


def test_a_changed_file_makes_it_stale(data: Path, tmp_path: Path) -> None:
    cache = tmp_path / "meta.arrow"
    _build(data, cache)
    # Another row count (and so another size): the cache must not be believed.
    write_parquet_files(tmp_path / "new", [ROWS[0], 50], start_id=0)
    os.replace(tmp_path / "new" / "part-0001.parquet", data / "part-0001.parquet")
    ds, requests, notes = _build(data, cache)
    assert len(notes) == 1
    assert f"metadata_cache={str(cache)!r} is stale" in notes[0]
    assert "part-0001.parquet" in notes[0]
    assert "changed size" in notes[0]
    assert requests == 1 + len(ROWS)  # read again
    assert [f.num_rows for f in ds.files] == [500, 50, 800, 120]
    _, requests, notes = _build(data, cache)  # ... and rewritten
    assert (requests, notes) == (1, [])


def test_a_touched_file_or_a_new_file_makes_it_stale(data: Path, tmp_path: Path) -> None:
    cache = tmp_path / "meta.arrow"
    _build(data, cache)
    path = data / "part-0002.parquet"
    st = path.stat()
    os.utime(path, (st.st_atime, st.st_mtime + 10))
    _, _, notes = _build(data, cache)
    assert len(notes) == 1
    assert "changed mtime" in notes[0]
    assert "part-0002.parquet" in notes[0]
    write_parquet_files(tmp_path / "more", [10], start_id=sum(ROWS))
    os.replace(tmp_path / "more" / "part-0000.parquet", data / "part-0009.parquet")
    ds, _, notes = _build(data, cache)
    assert len(notes) == 1
    assert "1 new" in notes[0]
    assert "part-0009.parquet" in notes[0]
    assert np.array_equal(_ids(ds), np.arange(sum(ROWS) + 10))


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "not a metadata cache file or is damaged"),
        (b"garbage" * 100, "not a metadata cache file or is damaged"),
        ("other-kind", "is not a metadata cache file (kind"),
        ("other-version", "has format version '99'"),
    ],
)
def test_a_damaged_or_foreign_cache_is_a_warning(
    data: Path, tmp_path: Path, content: bytes | str, words: str
) -> None:
    cache = tmp_path / "meta.arrow"
    if content == "other-kind":
        with pa.OSFile(str(cache), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("a", pa.int64())])) as w:
            w.write_table(pa.table({"a": [1]}))
    elif content == "other-version":
        _build(data, cache)
        table = pa.ipc.open_file(pa.BufferReader(cache.read_bytes())).read_all()
        meta = {**(table.schema.metadata or {}), b"tdu.version": b"99"}
        table = table.replace_schema_metadata(meta)
        with pa.OSFile(str(cache), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    else:
        assert isinstance(content, bytes)
        cache.write_bytes(content)
    ds, requests, notes = _build(data, cache)
    assert len(notes) == 1
    assert str(cache) in notes[0]
    assert words in notes[0]
    assert "reading the footers again" in notes[0]
    assert requests == 1 + len(ROWS)
    assert np.array_equal(_ids(ds), np.arange(sum(ROWS)))
    _, requests, notes = _build(data, cache)  # rewritten: valid again
    assert (requests, notes) == (1, [])


def test_the_cache_belongs_to_its_filter(data: Path, tmp_path: Path) -> None:
    cache = tmp_path / "meta.arrow"
    expr = pc.field("id") >= 1000
    pruned, _, _ = _build(data, cache, filters=expr)
    assert [len(f.row_groups or ()) for f in pruned.files] == [0, 0, 4, 2]  # statistics pruned
    again, requests, notes = _build(data, cache, filters=expr)
    assert (requests, notes) == (1, [])
    assert again.files == pruned.files
    _, requests, notes = _build(data, cache)  # no filter: the pruned table must not be used
    assert len(notes) == 1
    assert "was written for filters=" in notes[0]
    assert requests == 1 + len(ROWS)


def test_the_cache_still_checks_the_requested_columns(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_parquet_files(root, [10, 10])
    pq.write_table(pa.table({"id": [1], "x": [0.5], "label": [1], "s": ["a"]}), root / "part-0001.parquet")
    cache = tmp_path / "meta.arrow"
    source = FileSourceConfig(format=FileFormat.PARQUET, columns=["id"], metadata_cache=str(cache))
    discover(str(root), source)  # "x" differs (float64 here), but only "id" is read
    assert cache.exists()
    from torch_dataloader_utils.errors import SchemaMismatchError

    with pytest.raises(SchemaMismatchError, match=r"field 'x' is float.*part-0001\.parquet"):
        discover(str(root), FileSourceConfig(format=FileFormat.PARQUET, metadata_cache=str(cache)))


def test_an_unwritable_cache_is_a_warning(data: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ds, _, notes = _build(data, blocker / "meta.arrow")  # its "directory" is a file
    written = [n for n in notes if "could not be written" in n]
    assert len(written) == 1
    assert "meta.arrow" in written[0]
    assert np.array_equal(_ids(ds), np.arange(sum(ROWS)))


def test_metadata_cache_is_checked(data: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"metadata_cache=12 must be a file path or URL"):
        StructuredDataset(str(data), metadata_cache=12)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"is a directory; pass a file path such as"):
        StructuredDataset(str(data), metadata_cache=tmp_path)
    ds = StructuredDataset(str(data), metadata_cache=tmp_path / "m.arrow")  # a PathLike is fine
    assert ds.files
    assert (tmp_path / "m.arrow").exists()


@pytest.mark.slow
def test_cache_on_s3_skips_footer_requests(s3_server: S3Server, s3_proxy: FaultProxy, tmp_path: Path) -> None:
    local = tmp_path / "src"
    paths = write_parquet_files(local, ROWS, row_group_size=100)
    prefix = s3_server.new_prefix()
    fs = s3_server.fs()
    for p in paths:
        fs.put_file(str(p), f"{prefix}/data/{p.name}")
    options = s3_server.options(endpoint=s3_proxy.endpoint)
    url, cache = f"s3://{prefix}/data", f"s3://{prefix}/cache/meta.arrow"
    s3_proxy.fail_path = "/data/part-"  # count the GETs of data files (footers, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cold = StructuredDataset(url, storage_options=options, metadata_cache=cache)
        assert s3_proxy.requests == len(ROWS)
        assert fs.exists(f"{prefix}/cache/meta.arrow")
        s3_proxy.requests = 0
        warm = StructuredDataset(url, storage_options=options, metadata_cache=cache)
        assert s3_proxy.requests == 0  # no footer was read
        # A transient error on the cache's GET is retried (no warning, no footer read).
        s3_proxy.fail_path, s3_proxy.fail_every, s3_proxy.requests = "/cache/meta.arrow", 2, 1
        retried = StructuredDataset(url, storage_options=options, metadata_cache=cache)
        assert (s3_proxy.failures, s3_proxy.requests) == (1, 3)
        s3_proxy.reset()
    assert warm.files == cold.files == retried.files
    assert np.array_equal(_ids(warm), np.arange(sum(ROWS)))
    # A changed object (new size and ETag) is noticed.
    write_parquet_files(tmp_path / "new", [ROWS[0], 40])
    fs.put_file(str(tmp_path / "new" / "part-0001.parquet"), f"{prefix}/data/part-0001.parquet")
    with pytest.warns(UserWarning, match=r"metadata_cache='s3://.*meta\.arrow' is stale.*part-0001"):
        stale = StructuredDataset(url, storage_options=options, metadata_cache=cache)
    assert [f.num_rows for f in stale.files] == [500, 40, 800, 120]


def test_a_reshard_manifest_comes_first_and_use_manifest_false_uses_the_cache(
    data: Path, tmp_path: Path
) -> None:
    """A resharded directory is read from its manifest (one request): the cache is neither read
    nor written; listed instead (use_manifest=False), the cache works as for any directory."""
    from torch_dataloader_utils import reshard

    dst = tmp_path / "dst"
    reshard(str(data), str(dst), target_file_size="4KiB")
    cache = tmp_path / "meta.arrow"
    ds, requests, notes = _build(dst, cache)
    assert (requests, notes) == (1, [])  # the manifest: no listing, no footer, no cache
    assert ds.discovered.manifest is not None
    assert not cache.exists()
    assert np.array_equal(_ids(ds), np.arange(sum(ROWS)))
    cold, _, notes = _build(dst, cache, use_manifest=False)
    assert notes == []
    assert cache.exists()
    warm, warm_requests, notes = _build(dst, cache, use_manifest=False)
    assert notes == []
    assert warm_requests == 1  # one listing page: no footer
    assert warm.files == cold.files
    assert [f.num_rows for f in warm.files] == [f.num_rows for f in ds.files]
    assert np.array_equal(_ids(warm), np.arange(sum(ROWS)))


def test_on_open_starts_from_the_cache_alone(data: Path, tmp_path: Path) -> None:
    """metadata_cache_check='on_open': no listing at all; the same files and rows as the cold start."""
    cache = tmp_path / "meta.arrow"
    cold, _, _ = _build(data, cache, metadata_cache_check="on_open")  # no cache yet: lists, writes it
    warm, requests, notes = _build(data, cache, metadata_cache_check="on_open")
    assert (requests, notes) == (0, [])  # not even a listing page
    assert warm.files == cold.files
    assert warm.discovered.metadata is not None
    assert cold.discovered.metadata is not None
    assert warm.discovered.metadata.equals(cold.discovered.metadata)
    assert np.array_equal(_ids(warm), np.arange(sum(ROWS)))


def test_on_open_stops_on_a_file_rewritten_since(data: Path, tmp_path: Path) -> None:
    """A file rewritten after the cache was written is never read as the cache describes it."""
    from torch_dataloader_utils import FileChangedError

    cache = tmp_path / "meta.arrow"
    _build(data, cache)
    write_parquet_files(tmp_path / "new", [ROWS[0], 50])
    os.replace(tmp_path / "new" / "part-0001.parquet", data / "part-0001.parquet")
    ds, requests, notes = _build(data, cache, metadata_cache_check="on_open")
    assert (requests, notes) == (0, [])  # trusted: nothing was listed
    with pytest.raises(
        FileChangedError, match=r"part-0001\.parquet.* changed after the dataset was built"
    ) as err:
        _ids(ds)
    assert "build it with metadata_cache_check='listing'" in str(err.value)  # the way out of a stale cache
    # The default check lists, sees the change and reads the footers again.
    ds, _, notes = _build(data, cache)
    assert len(notes) == 1
    assert "stale" in notes[0]
    assert [f.num_rows for f in ds.files] == [500, 50, 800, 120]


def test_on_open_reads_the_cached_files_only(data: Path, tmp_path: Path) -> None:
    """A file added after the cache was written is not read with 'on_open' (documented); it is
    with the default check, which lists."""
    cache = tmp_path / "meta.arrow"
    _build(data, cache)
    write_parquet_files(tmp_path / "more", [10], start_id=sum(ROWS))
    os.replace(tmp_path / "more" / "part-0000.parquet", data / "part-0009.parquet")
    trusted, _, notes = _build(data, cache, metadata_cache_check="on_open")
    assert notes == []
    assert np.array_equal(_ids(trusted), np.arange(sum(ROWS)))
    listed, _, notes = _build(data, cache)
    assert "1 new" in notes[0]
    assert np.array_equal(_ids(listed), np.arange(sum(ROWS) + 10))


def test_on_open_needs_a_cache_written_for_the_same_path(data: Path, tmp_path: Path) -> None:
    """A cache written for another directory is not trusted: the listing shows it is stale."""
    cache = tmp_path / "meta.arrow"
    write_parquet_files(tmp_path / "other", [7, 9])
    _build(tmp_path / "other", cache)
    ds, requests, notes = _build(data, cache, metadata_cache_check="on_open")
    assert len(notes) == 1
    assert "stale" in notes[0]
    assert requests == 1 + len(ROWS)
    assert np.array_equal(_ids(ds), np.arange(sum(ROWS)))


def test_on_open_keeps_hive_partitions(tmp_path: Path) -> None:
    root = tmp_path / "hive"
    for day, rows in (("2026-11-01", [30, 20]), ("2026-11-02", [40])):
        write_parquet_files(root / f"day={day}", rows, start_id=0 if day.endswith("1") else 50)
    cache = tmp_path / "meta.arrow"
    cold, _, _ = _build(root, cache, partitioning="hive")
    warm, requests, notes = _build(root, cache, partitioning="hive", metadata_cache_check="on_open")
    assert (requests, notes) == (0, [])
    days = sorted(d for b in warm for d in b["day"])
    assert days == sorted(d for b in cold for d in b["day"])
    assert days.count("2026-11-02") == 40


def test_metadata_cache_check_is_checked(data: Path) -> None:
    with pytest.raises(ConfigError, match=r"metadata_cache_check='always' is not supported; use 'listing'"):
        StructuredDataset(str(data), metadata_cache_check="always")  # type: ignore[arg-type]
