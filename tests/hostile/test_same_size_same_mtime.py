"""Hostile case 20: a file replaced with the same size and the same modification time.

``touch -d``, ``rsync -t`` or a copy that keeps times leave a replaced file with the
planned size and time, so the metadata cache and the per-file check both took it for
the planned file: 25,000 of 30,000 rows were read with no error, or a raw ``IndexError``
came out of pyarrow. A Parquet reader opens the file's footer anyway; it now compares
the footer's row groups with the plan and raises ``FileChangedError``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import testsupport.latency_fs  # noqa: F401  (registers latency://)

from tests.fixtures.data import write_same_size
from torch_dataloader_utils import FileChangedError, create_dataloader

ROWS = 10_000
SIZE = 90_000
"""Bytes of every file: originals (2 row groups) and replacements are padded to it."""


def _table(start: int) -> pa.Table:
    return pa.table({"id": pa.array(np.arange(start, start + ROWS), pa.int64())})


def _write(root: Path) -> list[Path]:
    root.mkdir(parents=True)
    paths = [root / f"part-{i}.parquet" for i in range(3)]
    for i, path in enumerate(paths):
        write_same_size(path, _table(i * ROWS), SIZE, row_group_size=ROWS // 2)
    return paths


def _replace_keeping_size_and_time(path: Path, row_group_size: int, tmp: Path) -> None:
    """Replace ``path`` with other rows in other row groups, same size, same modification time."""
    stat = path.stat()
    new = tmp / f"new-{uuid.uuid4().hex}.parquet"
    write_same_size(new, _table(50_000), SIZE, row_group_size=row_group_size)
    os.replace(new, path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # touch -d / rsync -t
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)


def _assert_refused(exc: pytest.ExceptionInfo[FileChangedError], path: object) -> None:
    text = str(exc.value)
    assert f"{str(path)!r} is not the file the dataset was planned with" in text
    assert "row group" in text or "rows" in text
    assert "same size and modification time" in text
    assert "build the dataset again" in text


# 4 row groups of 2,500: the plan's two groups of 5,000 read 5,000 rows (25,000 of 30,000);
# 1 row group of 10,000: the plan's second group does not exist (an IndexError before).
LAYOUTS = {"four_row_groups": ROWS // 4, "one_row_group": ROWS}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_case_20_metadata_cache_and_per_file_check_defeated(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "data"
    paths = _write(root)
    cache = tmp_path / "meta.arrow"
    loader, _ = create_dataloader(str(root), metadata_cache=str(cache), num_workers=0)
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(3 * ROWS))
    _replace_keeping_size_and_time(paths[1], LAYOUTS[layout], tmp_path)
    loader, _ = create_dataloader(str(root), metadata_cache=str(cache), num_workers=0)  # cache still valid
    with pytest.raises(FileChangedError) as exc:
        list(loader)
    _assert_refused(exc, paths[1])


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_case_20_replaced_after_planning_with_same_size_and_time(
    tmp_path: Path, layout: str, num_workers: int
) -> None:
    root = tmp_path / "data"
    paths = _write(root)
    context = {"multiprocessing_context": "fork"} if num_workers else {}
    loader, _ = create_dataloader(str(root), num_workers=num_workers, **context)
    _replace_keeping_size_and_time(paths[1], LAYOUTS[layout], tmp_path)
    with pytest.raises(FileChangedError) as exc:
        list(loader)
    _assert_refused(exc, paths[1])


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_case_20_remote_footer_fetched_by_the_reader_is_compared(tmp_path: Path, layout: str) -> None:
    """Remote files read through the fetcher (footers not kept by discovery: a cache was used)."""
    root = tmp_path / "data"
    paths = _write(root)
    options = {"stats_key": uuid.uuid4().hex}
    cache = tmp_path / "meta.arrow"
    url = f"latency://{root}"
    loader, _ = create_dataloader(url, storage_options=options, metadata_cache=str(cache), num_workers=0)
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(3 * ROWS))
    _replace_keeping_size_and_time(paths[1], LAYOUTS[layout], tmp_path)
    loader, _ = create_dataloader(url, storage_options=options, metadata_cache=str(cache), num_workers=0)
    with pytest.raises(FileChangedError) as exc:
        list(loader)
    _assert_refused(exc, f"latency://{str(paths[1]).lstrip('/')}")


def test_case_20_unchanged_files_pass_the_footer_check(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _write(root)
    loader, _ = create_dataloader(str(root), split_rows=2000, num_workers=0)
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(3 * ROWS))
