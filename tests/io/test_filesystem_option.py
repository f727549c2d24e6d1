"""``filesystem=``: the user's filesystem object receives every request, in every process.

The data of these tests is reachable only through the object given: an in-memory
filesystem with a store of its own under a scheme fsspec does not know, or an s3fs
object pointing at the local S3 server while no ``storage_options`` say where it is.
Requests are counted on the object (through a file, so DataLoader workers count too).
"""

from __future__ import annotations

import io
import logging
import pickle
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import s3fs
from fsspec.implementations.memory import MemoryFileSystem

from tests.fixtures.e2e import assert_exactly_once, epoch_ids
from tests.fixtures.s3 import S3Server
from torch_dataloader_utils import (
    ConfigError,
    IncompatibleOptionsError,
    OptionTypeError,
    ReadError,
    create_dataloader,
    reshard,
)

ROWS = (150, 90, 60)
TOTAL = sum(ROWS)


def _parquet(start: int, rows: int) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(range(start, start + rows), pa.int64())}), buf, row_group_size=30)
    return buf.getvalue()


def _files() -> list[tuple[str, bytes]]:
    out, start = [], 0
    for i, rows in enumerate(ROWS):
        out.append((f"part-{i}.parquet", _parquet(start, rows)))
        start += rows
    return out


class _Log:
    """Requests appended to a file, one line each (shared with forked workers)."""

    path: ClassVar[Path | None] = None

    @classmethod
    def add(cls, name: str) -> None:
        if cls.path is not None:
            with open(cls.path, "a") as f:
                f.write(name + "\n")

    @classmethod
    def counts(cls) -> Counter[str]:
        assert cls.path is not None
        return Counter(cls.path.read_text().split()) if cls.path.exists() else Counter()


class PrivateMemory(MemoryFileSystem):
    """``privmem://``: memory with a store of its own; fsspec cannot build it from a URL."""

    protocol = ("privmem",)
    store: ClassVar[dict[str, Any]] = {}  # type: ignore[misc]
    pseudo_dirs: ClassVar[list[str]] = [""]  # type: ignore[misc]

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return super()._strip_protocol(path.removeprefix("privmem://") if isinstance(path, str) else path)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> Any:
        _Log.add("cat_file")
        return super().cat_file(path, start=start, end=end, **kwargs)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        _Log.add(f"open-{mode}")
        return super()._open(path, mode, **kwargs)

    def info(self, path: str, **kwargs: Any) -> Any:
        _Log.add("info")
        return super().info(path, **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        _Log.add("ls")
        return super().ls(path, detail=detail, **kwargs)

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        _Log.add("find")
        return super().find(path, *args, **kwargs)

    def exists(self, path: str, **kwargs: Any) -> bool:
        _Log.add("exists")
        return bool(super().exists(path, **kwargs))

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        _Log.add("pipe_file")
        super().pipe_file(path, value, mode=mode, **kwargs)


class CountingS3(s3fs.S3FileSystem):
    """An s3fs subclass counting every S3 API call by name."""

    async def _call_s3(self, method: str, *args: Any, **kwargs: Any) -> Any:
        _Log.add(method)
        return await super()._call_s3(method, *args, **kwargs)


class Unpicklable(PrivateMemory):
    def __reduce__(self) -> Any:
        raise TypeError("this filesystem holds a live connection")


@pytest.fixture
def request_log(tmp_path: Path) -> Any:
    _Log.path = tmp_path / "requests.log"
    yield _Log
    _Log.path = None


@pytest.fixture
def private_memory(request_log: Any) -> PrivateMemory:
    PrivateMemory.store.clear()
    PrivateMemory.pseudo_dirs[:] = [""]
    fs = PrivateMemory(skip_instance_cache=True)
    for name, data in _files():
        fs.pipe_file(f"/data/{name}", data)
    request_log.path.unlink(missing_ok=True)  # count the loader's requests only
    return fs


@pytest.mark.parametrize("num_workers", [0, 2])
def test_memory_filesystem_receives_every_request(
    private_memory: PrivateMemory, request_log: Any, num_workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils"):
        loader, dataset = create_dataloader(
            "privmem://data",
            filesystem=private_memory,
            metadata_cache="/cache/meta.arrow",
            num_workers=num_workers,
            batch_size=40,
            shuffle=True,
        )
        assert_exactly_once(epoch_ids(loader), range(TOTAL))
    assert "/data/part-0.parquet" not in MemoryFileSystem.store  # no library-built memory:// reached it
    counts = request_log.counts()
    assert counts["find"] >= 1, counts  # listing
    assert counts["cat_file"] >= 2 * len(ROWS), counts  # footers and byte reads
    assert counts["info"] >= len(ROWS), counts  # the path, and each file checked before its first read
    assert counts["pipe_file"] == 1  # the metadata cache, written on the object's store
    assert "/cache/meta.arrow" in private_memory.store
    described = dataset.discovered.fs.data_path_description
    assert "PrivateMemory" in described
    assert "PrivateMemory" in caplog.text  # the INFO log says which path the bytes take


def test_resume_and_the_warm_cache_through_the_object(
    private_memory: PrivateMemory, request_log: Any
) -> None:
    options: dict[str, Any] = {"filesystem": private_memory, "metadata_cache": "privmem://cache.arrow"}
    first, _ = create_dataloader("privmem://data", num_workers=0, batch_size=40, shuffle=True, **options)
    it = iter(first)
    seen = epoch_ids([next(it), next(it)])
    state = first.state_dict()
    del it
    before = request_log.counts()
    resumed, _ = create_dataloader(
        "/data", num_workers=2, batch_size=40, shuffle=True, metadata_cache_check="on_open", **options
    )
    resumed.load_state_dict(state)
    assert_exactly_once(seen + epoch_ids(resumed), range(TOTAL))
    assert request_log.counts()["find"] == before["find"]  # the warm cache: no listing


def test_reshard_writes_through_the_object(private_memory: PrivateMemory) -> None:
    report = reshard(
        "privmem://data",
        "privmem://shards",
        filesystem=private_memory,
        target_file_size=1500,
        row_group_rows=25,
    )
    assert report.manifest.num_rows == TOTAL
    assert any(k.startswith("/shards/") for k in private_memory.store)
    loader, dataset = create_dataloader("privmem://shards", filesystem=private_memory, num_workers=0)
    assert dataset.discovered.reshard_manifest is not None
    assert_exactly_once(epoch_ids(loader), range(TOTAL))


@pytest.fixture
def s3_data(s3_server: S3Server) -> str:
    fs = s3_server.fs()
    prefix = s3_server.new_prefix()
    for name, data in _files():
        fs.pipe_file(f"{prefix}/data/{name}", data)
    return prefix


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_s3fs_object_receives_every_request(
    s3_server: S3Server, s3_data: str, request_log: Any, num_workers: int
) -> None:
    fs = CountingS3(skip_instance_cache=True, **s3_server.options())
    # No storage_options: a filesystem the library built would go to AWS and fail.
    loader, dataset = create_dataloader(
        f"s3://{s3_data}/data", filesystem=fs, num_workers=num_workers, batch_size=40, request_timeout=20
    )
    assert_exactly_once(epoch_ids(loader), range(TOTAL))
    counts = request_log.counts()
    assert counts["list_objects_v2"] >= 1
    assert counts["get_object"] >= len(ROWS) * 2  # a footer and the data of every file
    assert counts["head_object"] == 0  # each file checked by its first read's response, not by a HEAD
    described = dataset.discovered.fs.data_path_description
    assert "CountingS3" in described
    assert "pyarrow" not in described  # a subclass: read through it


@pytest.mark.slow
def test_plain_s3fs_object_takes_the_native_path_with_its_options(s3_server: S3Server, s3_data: str) -> None:
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_server.options())
    loader, dataset = create_dataloader(f"{s3_data}/data", filesystem=fs, num_workers=2, batch_size=40)
    assert_exactly_once(epoch_ids(loader), range(TOTAL))
    spec = dataset.discovered.fs
    assert spec.native
    assert "pyarrow's native S3 client" in spec.data_path_description
    assert s3_server.endpoint.split("//")[1] in spec.data_path_description


@pytest.mark.slow
def test_pyarrow_filesystem_object(s3_server: S3Server, s3_data: str) -> None:
    options = s3_server.options()
    fs = pafs.S3FileSystem(
        access_key=options["key"],
        secret_key=options["secret"],
        endpoint_override=s3_server.endpoint.split("//")[1],
        scheme="http",
        region="us-east-1",
    )
    loader, dataset = create_dataloader(f"s3://{s3_data}/data", filesystem=fs, num_workers=2, batch_size=40)
    assert_exactly_once(epoch_ids(loader), range(TOTAL))
    assert "pyarrow filesystem object" in dataset.discovered.fs.data_path_description


def test_options_beside_a_filesystem_object_are_refused(private_memory: PrivateMemory) -> None:
    with pytest.raises(IncompatibleOptionsError, match=r"filesystem=PrivateMemory and storage_options="):
        create_dataloader("privmem://data", filesystem=private_memory, storage_options={"key": "k"})


@pytest.mark.parametrize("value", ["s3", {"protocol": "s3"}, MemoryFileSystem])
def test_not_a_filesystem_instance_is_a_type_error(value: object) -> None:
    with pytest.raises(TypeError, match=r"filesystem=.* not a filesystem instance") as caught:
        create_dataloader("memory://data", filesystem=value)
    assert isinstance(caught.value, OptionTypeError)


def test_a_url_of_another_scheme_is_refused(private_memory: PrivateMemory) -> None:
    with pytest.raises(ConfigError, match=r"path='gs://bkt/data' is a gs:// URL but filesystem=.*privmem://"):
        create_dataloader("gs://bkt/data", filesystem=private_memory)


def test_an_unpicklable_object_works_in_process_and_says_why_not_in_workers(request_log: Any) -> None:
    Unpicklable.store.clear()
    fs = Unpicklable(skip_instance_cache=True)
    for name, data in _files():
        fs.pipe_file(f"/data/{name}", data)
    with pytest.raises(TypeError):
        pickle.dumps(fs)
    loader, _ = create_dataloader("/data", filesystem=fs, num_workers=0, batch_size=40)
    assert_exactly_once(epoch_ids(loader), range(TOTAL))
    loader, _ = create_dataloader("/data", filesystem=fs, num_workers=2, batch_size=40)
    with pytest.raises(
        ConfigError, match=r"cannot be rebuilt in a DataLoader worker.*live connection.*num_workers=0"
    ):
        epoch_ids(loader)


def test_fsspec_local_filesystem_takes_the_local_path(tmp_path: Path) -> None:
    for name, data in _files():
        (tmp_path / name).write_bytes(data)
    loader, dataset = create_dataloader(str(tmp_path), filesystem=fsspec.filesystem("file"), num_workers=0)
    assert_exactly_once(epoch_ids(loader), range(TOTAL))
    assert dataset.discovered.fs.is_local


def test_a_remote_read_error_names_the_object(private_memory: PrivateMemory) -> None:
    loader, _ = create_dataloader("privmem://data", filesystem=private_memory, num_workers=0, batch_size=40)
    del private_memory.store["/data/part-1.parquet"]
    with pytest.raises(ReadError, match=r"privmem://data/part-1\.parquet"):
        epoch_ids(loader)
