"""Hostile case 8: a file replaced after a dataset read it is read as it is now by a new dataset.

Before, native file handles were kept per process (256), keyed by path and options only:
a new dataset built after ``os.replace`` of a file with one of exactly the same size read
the old file's bytes through the old handle (2,400 of 3,000 rows, no error); a larger or
smaller replacement failed as "not a Parquet footer" or a short read blaming the storage.
The documented recovery from ``FileChangedError`` (build the dataset again) did not
recover. After ``del loader, dataset`` the handles stayed open, so deleted files kept
their disk space. Now a dataset's reader owns its handles (each tied to the size it was
opened for) and they close with it.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.fixtures.data import write_same_size
from tests.fixtures.s3 import S3Server
from torch_dataloader_utils import create_dataloader

ROWS = 1000
SIZE = 8_000
"""Bytes of every file here: originals (1 row group) and replacements (4) are padded to it."""


def _table(start: int) -> pa.Table:
    return pa.table({"id": pa.array(np.arange(start, start + ROWS), pa.int64())})


def _ids(loader: object) -> list[int]:
    return sorted(i for batch in loader for i in batch["id"].tolist())  # type: ignore[attr-defined]


def _write_three(root: Path) -> list[Path]:
    root.mkdir(parents=True)
    paths = [root / f"part-00{i}.parquet" for i in range(3)]
    for i, path in enumerate(paths):
        write_same_size(path, _table(i * ROWS), SIZE, row_group_size=ROWS)
    return paths


def _replacement(tmp: Path, start: int, size: int = SIZE) -> Path:
    """A file of ``size`` bytes holding rows ``start..start+999`` in 4 row groups."""
    path = tmp / f"replacement-{start}.parquet"
    write_same_size(path, _table(start), size, row_group_size=ROWS // 4)
    return path


def _expected(replaced_start: int) -> list[int]:
    kept = [*range(0, ROWS), *range(2 * ROWS, 3 * ROWS)]
    return sorted([*kept, *range(replaced_start, replaced_start + ROWS)])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_case_8_file_replaced_with_same_size_is_read_as_it_is_now_by_a_new_dataset(
    tmp_path: Path, num_workers: int
) -> None:
    paths = _write_three(tmp_path / "data")
    context = {"multiprocessing_context": "fork"} if num_workers else {}
    loader, _ = create_dataloader(str(tmp_path / "data"), num_workers=num_workers, **context)
    assert _ids(loader) == list(range(3 * ROWS))
    os.replace(_replacement(tmp_path, 5000), paths[1])
    assert paths[1].stat().st_size == SIZE
    loader, _ = create_dataloader(str(tmp_path / "data"), num_workers=num_workers, **context)
    assert _ids(loader) == _expected(5000)


@pytest.mark.parametrize("delta", [-300, 300], ids=["smaller", "larger"])
def test_case_8_file_replaced_with_another_size_is_read_by_a_new_dataset(tmp_path: Path, delta: int) -> None:
    """Before: 'not a Parquet footer' or a short read that blamed the storage."""
    paths = _write_three(tmp_path / "data")
    loader, _ = create_dataloader(str(tmp_path / "data"), num_workers=0)
    assert _ids(loader) == list(range(3 * ROWS))
    os.replace(_replacement(tmp_path, 5000, SIZE + delta), paths[1])
    loader, _ = create_dataloader(str(tmp_path / "data"), num_workers=0)
    assert _ids(loader) == _expected(5000)


def _open_under(root: Path) -> list[str]:
    """This process's open file descriptors on files under ``root``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            found.append(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")
def test_case_8_del_loader_and_dataset_closes_their_files(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _write_three(root)
    loader, dataset = create_dataloader(str(root), num_workers=0)
    assert _ids(loader) == list(range(3 * ROWS))
    del loader, dataset
    assert _open_under(root) == []
    gc.collect()
    assert _open_under(root) == []


@pytest.mark.slow
@pytest.mark.parametrize("delta", [0, -300, 300], ids=["same_size", "smaller", "larger"])
def test_case_8_s3_object_overwritten_is_read_as_it_is_now_by_a_new_dataset(
    s3_server: S3Server, tmp_path: Path, delta: int
) -> None:
    """On S3 at num_workers=0, an overwrite (other row groups) read by a new dataset."""
    local = _write_three(tmp_path / "local")
    prefix = s3_server.new_prefix()
    fs = s3_server.fs()
    for path in local:
        fs.put_file(str(path), f"{prefix}/{path.name}")
    url, options = f"s3://{prefix}", s3_server.options()
    loader, _ = create_dataloader(url, storage_options=options, num_workers=0)
    assert _ids(loader) == list(range(3 * ROWS))
    fs.put_file(str(_replacement(tmp_path, 5000, SIZE + delta)), f"{prefix}/part-001.parquet")
    loader, _ = create_dataloader(url, storage_options=options, num_workers=0)
    assert _ids(loader) == _expected(5000)


ULIMIT_SCRIPT = """
import os, resource, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from torch_dataloader_utils import DataLoaderUtilsError, create_dataloader
from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.storage.footers import read_footer
from torch_dataloader_utils.storage.fs import resolve
root, where = sys.argv[1], sys.argv[2]
for i in range(100):
    pq.write_table(pa.table({"id": np.arange(i * 10, i * 10 + 10)}), f"{root}/p{i:03d}.parquet")
loader, dataset = create_dataloader(root, num_workers=0, batch_size=10)
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) - 1, hard))  # none spare
try:
    if where == "footer":  # what building a dataset does for every file
        fs, path = resolve(f"{root}/p000.parquet")
        read_footer(fs, path, os.path.getsize(path), FetchConfig())
    else:
        list(loader)
except DataLoaderUtilsError as exc:
    print(f"{type(exc).__name__}:", exc)
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")
@pytest.mark.parametrize("where", ["footer", "read"])
def test_case_21_open_file_limit_exhausted_names_the_limit(tmp_path: Path, where: str) -> None:
    """Before: "check the path, the credentials and the endpoint" for ``ulimit -n`` exhausted."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", ULIMIT_SCRIPT, str(tmp_path), where],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("ReadError:"), out + done.stderr[-3000:]
    assert "Too many open files" in out
    assert "run out of file descriptors (its limit, ulimit -n, is " in out
    assert "up to 256 per reading process" in out
    assert "raise the limit" in out
    assert "credentials" not in out
