"""Issue 33, items 1 and 4-6: the node-local ``data_cache`` served bytes it should not have.

1. The cache key lacked the endpoint when it was configured anywhere but
   ``storage_options["endpoint_url"]``: a job on endpoint B got endpoint A's 1,000 of
   1,000 rows from the cache, with 0 requests and no error. Two real stores (SeaweedFS
   and moto; two Azurite servers) hold the same bucket and key, of the same size,
   written in the same second.
4. An entry's checksum covered its bytes only: an entry copied over another was served
   (5,000 of 40,000 ids duplicated).
5. 15 loaders with 15 cache directories left 15 open descriptors (the ``usage`` file).
6. ``data_cache='~/x'`` made a directory literally named ``~``.
"""

from __future__ import annotations

import gc
import io
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import testsupport.latency_fs  # noqa: F401 - registers latency://
from testsupport.s3_server import BUCKET, KEY, SECRET, S3Server
from testsupport.stores import AzureServer, start_azurite

from tests.fixtures.e2e import assert_exactly_once, epoch_ids
from tests.fixtures.s3 import missing_server
from tests.fixtures.stores import own_server
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.storage import fs as fs_module
from torch_dataloader_utils.storage.cache import CACHE_DIRNAME

ROWS = 1000


def _table(first: int) -> bytes:
    """A Parquet file of ``ROWS`` ids from ``first``: the same size whatever ``first`` is."""
    buf = io.BytesIO()
    ids = pa.array(np.arange(first, first + ROWS, dtype=np.int64))
    pq.write_table(
        pa.table({"id": ids}),
        buf,
        row_group_size=250,
        compression="none",
        use_dictionary=False,
        write_statistics=False,
    )
    return buf.getvalue()


def _same_second(writers: list[Callable[[], Any]], mtimes: Callable[[], list[float]]) -> None:
    """Run ``writers`` until the files they write have the same modification second."""
    for _ in range(20):
        for write in writers:
            write()
        seconds = {int(t) for t in mtimes()}
        if len(seconds) == 1:
            return
        time.sleep(0.05)
    raise AssertionError("could not write both files within one second")


# -- item 1: two S3 stores, one bucket and key ----------------------------------------------


@pytest.fixture(scope="module")
def two_s3(s3_server: S3Server, moto_server: S3Server) -> tuple[S3Server, S3Server]:
    """Two distinct S3 stores (SeaweedFS and moto: moto's servers in one process share their data)."""
    if s3_server.kind == "moto":
        missing_server("two distinct S3 stores need SeaweedFS beside moto")
    return s3_server, moto_server


def _s3_pair(two: tuple[S3Server, S3Server]) -> str:
    """``bucket/prefix``: ids 0..999 on the first store, 1000..1999 on the second, same size and second."""
    prefix = f"{BUCKET}/{uuid.uuid4().hex[:12]}"
    a, b = (server.fs() for server in two)
    name = f"{prefix}/data/part-0.parquet"
    _same_second(
        [lambda: a.pipe_file(name, _table(0)), lambda: b.pipe_file(name, _table(ROWS))],
        lambda: [fs.info(name, refresh=True)["LastModified"].timestamp() for fs in (a, b)],
    )
    return prefix


def _arrow_s3(server: S3Server) -> pafs.S3FileSystem:
    host = server.endpoint.split("://")[1]
    return pafs.S3FileSystem(
        endpoint_override=host, scheme="http", access_key=KEY, secret_key=SECRET, region="us-east-1"
    )


def _s3_job(way: str, server: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``create_dataloader`` keywords reaching ``server`` the ``way`` named."""
    if way == "storage_options":
        return {"path": f"s3://{prefix}/data", "storage_options": server.options()}
    if way == "AWS_ENDPOINT_URL":
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
        # Two jobs of a node (two processes) share the cache; in one process, the clients
        # built for the first endpoint would be reused for the same storage_options.
        monkeypatch.setattr(fs_module, "_CLIENTS", {})
        options = {"key": KEY, "secret": SECRET, "client_kwargs": {"region_name": "us-east-1"}}
        return {"path": f"s3://{prefix}/data", "storage_options": options}
    if way == "s3fs_object":
        return {"path": f"s3://{prefix}/data", "filesystem": server.fs()}
    if way == "pyarrow_object":
        return {"path": f"s3://{prefix}/data", "filesystem": _arrow_s3(server)}
    assert way == "pyarrow_subtree"
    return {"path": "data", "filesystem": pafs.SubTreeFileSystem(prefix, _arrow_s3(server))}


@pytest.mark.slow
@pytest.mark.parametrize(
    "way", ["storage_options", "AWS_ENDPOINT_URL", "s3fs_object", "pyarrow_object", "pyarrow_subtree"]
)
def test_item_1_cache_never_serves_one_s3_endpoints_bytes_to_another(
    two_s3: tuple[S3Server, S3Server],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    way: str,
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    prefix = _s3_pair(two_s3)
    cache = str(tmp_path / "cache")
    seen = []
    for first, server in zip((0, ROWS), two_s3, strict=True):
        job = _s3_job(way, server, prefix, monkeypatch)
        loader, _ = create_dataloader(job.pop("path"), data_cache=cache, num_workers=0, **job)
        assert_exactly_once(epoch_ids(loader), range(first, first + ROWS))
        seen.append(loader.metrics().total)
    assert seen[1].requests > 0  # endpoint B's bytes came from endpoint B
    assert seen[1].cache_hits == 0


@pytest.fixture(scope="module")
def two_azurite(azure_server: AzureServer) -> Iterator[tuple[AzureServer, AzureServer]]:
    """Azurite for the session and a second one: the same account, container and blob names."""
    with own_server(start_azurite, "a second Azurite") as (second, _):
        yield azure_server, second


@pytest.mark.slow
def test_item_1_cache_never_serves_one_azure_accounts_bytes_to_another(
    two_azurite: tuple[AzureServer, AzureServer], tmp_path: Path
) -> None:
    """The endpoint comes from the ``connection_string`` alone."""
    a, b = (server.fs() for server in two_azurite)
    prefix = two_azurite[0].new_prefix()
    name = f"{prefix}/data/part-0.parquet"
    _same_second(
        [lambda: a.pipe_file(name, _table(0)), lambda: b.pipe_file(name, _table(ROWS))],
        lambda: [fs.info(name, refresh=True)["last_modified"].timestamp() for fs in (a, b)],
    )
    cache = str(tmp_path / "cache")
    for first, server in zip((0, ROWS), two_azurite, strict=True):
        loader, _ = create_dataloader(
            f"az://{prefix}/data", storage_options=server.options(), data_cache=cache, num_workers=0
        )
        assert_exactly_once(epoch_ids(loader), range(first, first + ROWS))
    assert loader.metrics().total.cache_hits == 0


# -- item 4: an entry copied over another -------------------------------------------------


def _remote(root: Path, files: int, rows: int) -> str:
    """``files`` Parquet files of the same layout (so their entries have the same ranges)."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        ids = pa.array(np.arange(i * rows, (i + 1) * rows, dtype=np.int64))
        pq.write_table(
            pa.table({"id": ids}),
            root / f"part-{i}.parquet",
            row_group_size=rows // 2,
            compression="none",
            use_dictionary=False,
            write_statistics=False,
        )
    return f"latency://{root}"


def _entries(cache: Path) -> dict[str, list[Path]]:
    """The cache's entries by file folder."""
    out: dict[str, list[Path]] = {}
    for entry in sorted((cache / CACHE_DIRNAME / "files").rglob("*-*")):
        if entry.is_file() and "." not in entry.name:
            out.setdefault(entry.parent.name, []).append(entry)
    return out


def _latency_loader(url: str, cache: Path) -> Any:
    options = {"stats_key": uuid.uuid4().hex}
    loader, _ = create_dataloader(url, storage_options=options, data_cache=str(cache), num_workers=0)
    return loader


@pytest.mark.parametrize("over", ["another_file", "another_range"])
def test_item_4_an_entry_copied_over_another_is_never_served(tmp_path: Path, over: str) -> None:
    rows = 5000
    url = _remote(tmp_path / "data", 8, rows)
    cache = tmp_path / "cache"
    assert_exactly_once(epoch_ids(_latency_loader(url, cache)), range(8 * rows))
    folders = list(_entries(cache).values())
    if over == "another_file":  # the same range of another file (same size: a valid entry)
        source = next(e for e in folders[0] if e.stat().st_size > 4096)
        target = next(e for e in folders[1] if e.name == source.name)
    else:  # another range of the same file with the same length
        by_size: dict[int, list[Path]] = {}
        for entry in folders[0]:
            by_size.setdefault(entry.stat().st_size, []).append(entry)
        source, target = next(group for group in by_size.values() if len(group) > 1)[:2]
    shutil.copyfile(source, target)
    loader = _latency_loader(url, cache)
    assert_exactly_once(epoch_ids(loader), range(8 * rows))  # before: 5,000 ids twice
    assert loader.metrics().total.requests > 0  # the damaged entry was fetched again


# -- items 5 and 6: descriptors and ``~`` --------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_item_5_loaders_with_their_own_cache_directories_leave_no_descriptor_open(tmp_path: Path) -> None:
    url = _remote(tmp_path / "data", 2, 400)
    epoch_ids(_latency_loader(url, tmp_path / "warm"))  # imports and thread pools: once
    gc.collect()
    before = _open_fds()
    for i in range(15):
        loader = _latency_loader(url, tmp_path / f"cache-{i}")
        assert_exactly_once(epoch_ids(loader), range(800))
        del loader
    gc.collect()
    assert _open_fds() - before < 3  # before: 15 more (each cache's usage file, kept open)


def test_item_6_data_cache_expands_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _remote(tmp_path / "data", 2, 400)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    loader, _ = create_dataloader(
        url, storage_options={"stats_key": "item-6"}, data_cache="~/tdu-cache", num_workers=0
    )
    assert_exactly_once(epoch_ids(loader), range(800))
    assert (home / "tdu-cache" / CACHE_DIRNAME / "usage").is_file()
    assert not (work / "~").exists()  # before: a directory literally named "~"


# -- items 2 and 3: damaged responses and generations --------------------------------------


def _generation(path: Path, first: int, rows: int, mtime: int) -> None:
    """``rows`` ids from ``first`` in 4 row groups (one layout and size for any ``first``), at ``mtime``."""
    pq.write_table(
        pa.table({"id": pa.array(np.arange(first, first + rows, dtype=np.int64))}),
        path,
        row_group_size=rows // 4,
        compression="none",
        use_dictionary=False,
        write_statistics=False,
    )
    os.utime(path, (mtime, mtime))


def test_item_3_a_same_size_rewrite_in_the_same_second_never_mixes_generations(tmp_path: Path) -> None:
    """No ETag, a modification time in whole seconds: the cached ranges are checked once per process."""
    root, cache = tmp_path / "data", tmp_path / "cache"
    root.mkdir()
    path = root / "part-0.parquet"
    _generation(path, 0, 4000, 1_700_000_000)
    options = {"stats_key": uuid.uuid4().hex}
    half, _ = create_dataloader(
        f"latency://{root}", storage_options=options, data_cache=str(cache), num_ranks=2, rank=0,
        split_rows=1000, num_workers=0,
    )  # fmt: skip
    assert len(epoch_ids(half)) == 2000  # half of the old generation's ranges are cached
    size = path.stat().st_size
    _generation(path, 4000, 4000, 1_700_000_000)  # rewritten: same size, same second
    assert path.stat().st_size == size
    loader, _ = create_dataloader(
        f"latency://{root}", storage_options=options, data_cache=str(cache), num_workers=0
    )
    assert_exactly_once(epoch_ids(loader), range(4000, 8000))  # before: 2,000 old ids, 2,000 new


@pytest.mark.slow
def test_item_3_s3_keys_versions_by_etag(s3_server: S3Server, tmp_path: Path) -> None:
    """A rewrite of the same size in the same second on S3: its ETag differs, and so does its key."""
    fs = s3_server.fs()
    for _ in range(15):
        prefix = f"{BUCKET}/{uuid.uuid4().hex[:12]}"
        name = f"{prefix}/data/part-0.parquet"
        fs.pipe_file(name, _table(0))
        first = fs.info(name, refresh=True)["LastModified"]
        cache = str(tmp_path / uuid.uuid4().hex)
        half, _ = create_dataloader(
            f"s3://{prefix}/data", storage_options=s3_server.options(), data_cache=cache, num_ranks=2,
            rank=0, split_rows=250, num_workers=0,
        )  # fmt: skip
        assert len(epoch_ids(half)) == ROWS // 2
        fs.pipe_file(name, _table(ROWS))
        if fs.info(name, refresh=True)["LastModified"] == first:
            break
    else:
        pytest.skip("could not rewrite the file within the second it was written")
    loader, _ = create_dataloader(
        f"s3://{prefix}/data", storage_options=s3_server.options(), data_cache=cache, num_workers=0
    )
    assert_exactly_once(epoch_ids(loader), range(ROWS, 2 * ROWS))  # before: half the old ids


@pytest.mark.slow
def test_item_2_a_damaged_whole_object_is_checked_against_its_etag_before_it_is_cached(
    s3_server: S3Server, storage_faults: Any, tmp_path: Path
) -> None:
    """ORC has no checksum of its own: a flipped byte that still decodes was cached and served forever."""
    import pyarrow.orc as orc

    ids = np.arange(ROWS, dtype=np.int64)
    buf = io.BytesIO()
    orc.write_table(pa.table({"id": ids, "x": ids * 0.5}), buf)
    prefix = f"{BUCKET}/{uuid.uuid4().hex[:12]}"
    s3_server.fs().pipe_file(f"{prefix}/data/part-0.orc", buf.getvalue())
    loader, _ = create_dataloader(
        f"s3://{prefix}/data", format="orc", storage_options=s3_server.options(storage_faults.endpoint),
        data_cache=str(tmp_path / "cache"), num_workers=0, output_format="numpy", retry_backoff=0.01,
    )  # fmt: skip
    storage_faults.arm("flip", every=1, limit=1)
    try:
        epochs = [[(int(i), float(x)) for b in loader for i, x in zip(b["id"], b["x"], strict=True)]]
    finally:
        storage_faults.disarm()
    assert storage_faults.schedule.damaged == 1
    epochs.append([(int(i), float(x)) for b in loader for i, x in zip(b["id"], b["x"], strict=True)])
    for rows in epochs:  # before: a wrong value (or a row lost) in every epoch, from the cache
        assert sorted(rows) == [(i, i * 0.5) for i in range(ROWS)]
