"""Hostile case 1: a file rewritten after planning is never read with the old plan.

Before, a Parquet file rewritten with other row groups lost rows silently, one with more
rows was half read, and fewer rows or another column type gave raw pyarrow errors. Every
reader now checks the file's size and modification time when it opens it.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.orc as po
import pyarrow.parquet as pq
import pytest
import testsupport.latency_fs  # noqa: F401  (registers latency://)

from tests.fixtures.iceberg import create_id_table, data_files, id_table
from tests.fixtures.s3 import S3Server
from torch_dataloader_utils import FileChangedError, IcebergDataset, ReadError, create_dataloader

ROWS = 3000


def _parquet(path: Path, ids: pa.Array, row_group_size: int = 250) -> None:
    pq.write_table(pa.table({"id": ids}), path, row_group_size=row_group_size)


REWRITES: dict[str, Callable[[Path], None]] = {
    "same_rows_other_row_groups": lambda p: _parquet(p, pa.array(np.arange(ROWS)), 100),
    "more_rows": lambda p: _parquet(p, pa.array(np.arange(2 * ROWS))),
    "fewer_rows": lambda p: _parquet(p, pa.array(np.arange(ROWS // 3))),
    "other_column_type": lambda p: _parquet(p, pa.array([str(i) for i in range(ROWS)])),
}


def _assert_changed(exc: pytest.ExceptionInfo[BaseException], path: object, before: int, after: int) -> None:
    text = str(exc.value)
    assert str(path) in text
    assert f"it was {before} bytes" in text
    assert f"is {after} bytes" in text
    assert "changed after the dataset was built" in text
    assert "build the dataset again" in text


@pytest.mark.parametrize("rewrite", list(REWRITES))
@pytest.mark.parametrize("num_workers", [0, 2])
def test_case_1_parquet_rewritten_after_planning(tmp_path: Path, rewrite: str, num_workers: int) -> None:
    path = tmp_path / "a.parquet"
    _parquet(path, pa.array(np.arange(ROWS)))
    before = path.stat().st_size
    context = {"multiprocessing_context": "fork"} if num_workers else {}
    loader, _ = create_dataloader(
        str(path), batch_size=100, split_rows=500, num_workers=num_workers, **context
    )
    REWRITES[rewrite](path)
    with pytest.raises(FileChangedError) as exc:
        list(loader)
    _assert_changed(exc, path, before, path.stat().st_size)


def test_a_pass_failed_in_a_worker_has_stopped_its_workers_when_the_error_arrives(tmp_path: Path) -> None:
    """The failed pass's workers are shut down before its error reaches the loop.

    Left to the garbage collector (the traceback holds the pass in a cycle), torch's
    shutdown ran after its queues were finalized: the workers never got their stop and
    ``del loader`` waited 5 s per worker (10 s here, since 0.5.0).
    """
    import multiprocessing

    path = tmp_path / "a.parquet"
    _parquet(path, pa.array(np.arange(ROWS)))
    loader, _ = create_dataloader(
        str(path), batch_size=100, split_rows=500, num_workers=2, multiprocessing_context="fork"
    )
    _parquet(path, pa.array(np.arange(ROWS, dtype=np.float64)))
    with pytest.raises(FileChangedError):
        list(loader)
    assert multiprocessing.active_children() == []


def test_case_1_parquet_rewritten_with_other_row_groups_same_size(tmp_path: Path) -> None:
    """Same size, new modification time: still refused (the time tells)."""
    path = tmp_path / "a.parquet"
    _parquet(path, pa.array(np.arange(ROWS)))
    loader, _ = create_dataloader(str(path), num_workers=0)
    data = path.read_bytes()
    stat = path.stat()
    path.write_bytes(data)  # same bytes, rewritten
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    with pytest.raises(FileChangedError, match="modified"):
        list(loader)


def test_case_1_unchanged_files_read_every_row(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    _parquet(path, pa.array(np.arange(ROWS)))
    loader, _ = create_dataloader(str(path), batch_size=100, split_rows=500, num_workers=0)
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(ROWS))


def test_case_1_deleted_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    _parquet(path, pa.array(np.arange(ROWS)))
    loader, _ = create_dataloader(str(path), num_workers=0)
    path.unlink()
    with pytest.raises(FileChangedError, match="was deleted after the dataset was built"):
        list(loader)


def test_case_1_orc_rewritten_with_other_stripes(tmp_path: Path) -> None:
    path = tmp_path / "a.orc"
    po.write_table(pa.table({"id": np.arange(ROWS)}), path, stripe_size=4096)
    before = path.stat().st_size
    loader, _ = create_dataloader(str(path), format="orc", split_rows=500, num_workers=0)
    po.write_table(pa.table({"id": np.arange(ROWS)}), path, stripe_size=64 * 1024**2)
    with pytest.raises(FileChangedError) as exc:
        list(loader)
    _assert_changed(exc, path, before, path.stat().st_size)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_case_1_text_rewritten_with_more_rows(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"a.{fmt}"

    def write(n: int) -> None:
        if fmt == "csv":
            path.write_text("id\n" + "".join(f"{i}\n" for i in range(n)))
        else:
            path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(n)))

    write(ROWS)
    before = path.stat().st_size
    loader, _ = create_dataloader(str(path), format=fmt, split_bytes=2000, num_workers=0)
    write(2 * ROWS)
    with pytest.raises(FileChangedError) as exc:
        list(loader)
    _assert_changed(exc, path, before, path.stat().st_size)


def test_case_1_iceberg_data_file_overwritten(iceberg_catalog) -> None:
    config, catalog = iceberg_catalog
    table = create_id_table(catalog)
    table.append(id_table(0, 120))
    (location,) = data_files(table)
    ds = IcebergDataset("ns.t", catalog_config=config, split_rows=10)
    local = urlparse(location).path
    pq.write_table(id_table(0, 60), local, row_group_size=10)  # the data file replaced in place
    with pytest.raises(FileChangedError, match="table's metadata"):
        list(ds)


@pytest.mark.slow
def test_case_1_parquet_on_s3_rewritten_with_other_row_groups(s3_server: S3Server, tmp_path: Path) -> None:
    local = tmp_path / "a.parquet"
    _parquet(local, pa.array(np.arange(ROWS)))
    prefix = s3_server.new_prefix()
    fs = s3_server.fs()
    fs.put_file(str(local), f"{prefix}/a.parquet")
    loader, _ = create_dataloader(
        f"s3://{prefix}", storage_options=s3_server.options(), split_rows=500, num_workers=0
    )
    before = local.stat().st_size
    REWRITES["same_rows_other_row_groups"](local)
    fs.put_file(str(local), f"{prefix}/a.parquet")
    with pytest.raises(FileChangedError) as exc:
        list(loader)
    _assert_changed(exc, f"s3://{prefix}/a.parquet", before, local.stat().st_size)
    assert isinstance(exc.value, ReadError)


@pytest.mark.parametrize("in_place", [True, False], ids=["rewritten_in_place", "replaced"])
def test_case_1_persistent_workers_see_a_rewrite_between_epochs(tmp_path: Path, in_place: bool) -> None:
    """Readers keep files open across epochs: each pass checks its files again."""
    path = tmp_path / "a.parquet"
    _parquet(path, pa.array(np.arange(ROWS)))
    loader, dataset = create_dataloader(
        str(path), split_rows=500, num_workers=2, persistent_workers=True, multiprocessing_context="fork"
    )
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(ROWS))
    if in_place:
        REWRITES["same_rows_other_row_groups"](path)
    else:
        new = tmp_path / "new.parquet"
        REWRITES["same_rows_other_row_groups"](new)
        new.replace(path)
    dataset.set_epoch(1)
    with pytest.raises(FileChangedError, match="changed after the dataset was built"):
        list(loader)


@pytest.mark.slow
def test_case_1_s3_persistent_workers_see_a_rewrite_between_epochs(
    s3_server: S3Server, tmp_path: Path
) -> None:
    local = tmp_path / "a.parquet"
    _parquet(local, pa.array(np.arange(ROWS)))
    prefix = s3_server.new_prefix()
    fs = s3_server.fs()
    fs.put_file(str(local), f"{prefix}/a.parquet")
    loader, dataset = create_dataloader(
        f"s3://{prefix}",
        storage_options=s3_server.options(),
        split_rows=500,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
        timeout=60,
    )
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(ROWS))
    REWRITES["fewer_rows"](local)
    fs.put_file(str(local), f"{prefix}/a.parquet")
    dataset.set_epoch(1)
    with pytest.raises(FileChangedError, match="changed after the dataset was built"):
        list(loader)


def test_case_1_remote_orc_kept_open_is_checked_again_next_pass(tmp_path: Path) -> None:
    """An ORC reader keeps files open across passes: a remote one is checked again too.

    Before, the check sent at the start of a pass was only waited for when a file was
    opened, so a file kept open read its old contents after a rewrite without an error.
    """
    root = tmp_path / "data"
    root.mkdir()
    path = root / "a.orc"
    po.write_table(pa.table({"id": np.arange(ROWS)}), path, stripe_size=4096)
    loader, dataset = create_dataloader(
        f"latency://{root}",
        format="orc",
        num_workers=0,
        storage_options={"stats_key": uuid.uuid4().hex},
    )
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(ROWS))
    new = tmp_path / "new.orc"
    po.write_table(pa.table({"id": np.arange(ROWS // 3)}), new, stripe_size=64 * 1024**2)
    new.replace(path)
    dataset.set_epoch(1)
    with pytest.raises(FileChangedError, match="changed after the dataset was built"):
        list(loader)
