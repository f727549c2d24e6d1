"""FileChecks: each file checked once per pass, remote ones a window ahead of the reads.

Through ``latency://`` (testsupport/latency_fs.py), whose ``info`` calls are counted:
the requests show which checks were sent, and when.
"""

from __future__ import annotations

import pickle
import random
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import testsupport.latency_fs as latency

from torch_dataloader_utils import FileChangedError
from torch_dataloader_utils.plan.types import FileInfo, RowGroup
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.identity import CHECKS_AHEAD, FileChecks, check_footer

FILES = 1000


def _files(root: Path, n: int = FILES) -> dict[str, FileInfo]:
    out = {}
    for i in range(n):
        path = root / f"f{i:04d}"
        path.write_bytes(b"x" * 10)
        st = path.stat()
        out[str(path)] = FileInfo(str(path), st.st_size, mtime=st.st_mtime)
    return out


def _remote(delay: float = 0.0) -> tuple[FileSystemSpec, latency.RequestStats]:
    key = uuid.uuid4().hex
    return FileSystemSpec("latency", {"stats_key": key, "delay": delay}), latency.stats(key)


def _settle(counters: latency.RequestStats, at_least: int, timeout: float = 30.0) -> int:
    """Requests once ``at_least`` were answered and no more came for a moment."""
    deadline = time.monotonic() + timeout
    while counters.requests < at_least and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    return counters.requests


def _read(checks: FileChecks, files: dict[str, FileInfo], path: str, counted: list[int]) -> None:
    info = files[path]
    checks.check(path, info.size, info.mtime, lambda: counted.append(1))


def test_remote_checks_go_a_window_ahead_of_the_reads(tmp_path: Path) -> None:
    files = _files(tmp_path)
    paths = list(files)
    fs, counters = _remote(delay=0.002)
    checks = FileChecks(fs, files)
    counted: list[int] = []
    checks.schedule(iter(paths), lambda: counted.append(1))
    _read(checks, files, paths[0], counted)
    # The window, plus the one sent when the first file was read; not the 1,000 of the pass.
    assert _settle(counters, CHECKS_AHEAD + 1) == CHECKS_AHEAD + 1
    for path in paths[1:]:
        _read(checks, files, path, counted)
    assert _settle(counters, FILES) == FILES  # each file once in the pass
    assert len(counted) == FILES  # every request answered was reported
    for path in paths:  # reads again in the same pass: no request
        _read(checks, files, path, counted)
    assert counters.requests == FILES


def test_each_pass_checks_every_file_again(tmp_path: Path) -> None:
    files = _files(tmp_path, 100)
    fs, counters = _remote()
    checks = FileChecks(fs, files)
    counted: list[int] = []
    for passes in (1, 2):
        checks.schedule(iter(files))
        for path in files:
            _read(checks, files, path, counted)
        assert _settle(counters, 100 * passes) == 100 * passes


def test_a_changed_file_late_in_the_pass_raises_before_it_is_read(tmp_path: Path) -> None:
    files = _files(tmp_path)
    paths = list(files)
    Path(paths[900]).write_bytes(b"y" * 20)
    fs, _ = _remote()
    checks = FileChecks(fs, files)
    counted: list[int] = []
    checks.schedule(iter(paths))
    for path in paths[:900]:
        _read(checks, files, path, counted)
    with pytest.raises(FileChangedError, match=r"it was 10 bytes.*is 20 bytes"):
        _read(checks, files, paths[900], counted)
    with pytest.raises(FileChangedError):  # and on every later read of it in the pass
        _read(checks, files, paths[900], counted)
    _read(checks, files, paths[901], counted)


def test_a_file_read_before_its_check_was_sent_is_checked_then_once(tmp_path: Path) -> None:
    files = _files(tmp_path, 200)
    paths = list(files)
    fs, counters = _remote()
    checks = FileChecks(fs, files)
    counted: list[int] = []
    checks.schedule(iter(paths), lambda: counted.append(1))
    _read(checks, files, paths[-1], counted)  # far beyond the window
    assert _settle(counters, CHECKS_AHEAD + 1) == CHECKS_AHEAD + 1
    for path in paths:
        _read(checks, files, path, counted)
    assert _settle(counters, 200) == 200  # the window skipped it
    assert len(counted) == 200


def test_threads_reading_at_once_check_each_file_once(tmp_path: Path) -> None:
    files = _files(tmp_path, 400)
    paths = list(files)
    fs, counters = _remote(delay=0.001)
    checks = FileChecks(fs, files)
    counted: list[int] = []
    checks.schedule(iter(paths), lambda: counted.append(1))
    errors: list[BaseException] = []

    def reader(seed: int) -> None:
        order = paths[:]
        random.Random(seed).shuffle(order)
        try:
            for path in order:
                _read(checks, files, path, counted)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert _settle(counters, 400) == 400
    assert len(counted) == 400


def test_local_files_are_checked_at_their_first_read_of_each_pass(tmp_path: Path) -> None:
    files = _files(tmp_path, 3)
    paths = list(files)
    checks = FileChecks(FileSystemSpec("file", {}), files)
    checks.schedule(iter(paths))
    Path(paths[2]).write_bytes(b"changed")  # after the pass began, before the file is read
    _read(checks, files, paths[0], [])
    with pytest.raises(FileChangedError, match="changed after the dataset was built"):
        _read(checks, files, paths[2], [])
    Path(paths[0]).write_bytes(b"changed too")
    _read(checks, files, paths[0], [])  # checked already in this pass
    checks.schedule(iter(paths))
    with pytest.raises(FileChangedError):  # the next pass checks it again
        _read(checks, files, paths[0], [])


def test_pickled_checks_start_clean(tmp_path: Path) -> None:
    files = _files(tmp_path, 50)
    fs, counters = _remote()
    checks = FileChecks(fs, files)
    checks.schedule(iter(files))
    _settle(counters, CHECKS_AHEAD)
    copy = pickle.loads(pickle.dumps(checks))
    counted: list[int] = []
    before = counters.requests
    for path in files:
        _read(copy, files, path, counted)
    assert counters.requests - before == 50  # no pass, nothing checked yet: each file once
    with pytest.raises(ValueError, match="ahead must be >= 1"):
        FileChecks(fs, files, ahead=0)


def _footer(tmp_path: Path, rows: int, group: int) -> pq.FileMetaData:
    path = tmp_path / f"f-{rows}-{group}.parquet"
    pq.write_table(pa.table({"id": np.arange(rows)}), path, row_group_size=group)
    return pq.read_metadata(path)


def test_check_footer_compares_row_groups_with_the_plan(tmp_path: Path) -> None:
    planned = FileInfo("a", 10, 100, (RowGroup(0, 0, 50), RowGroup(1, 50, 50)))
    check_footer("a", planned, _footer(tmp_path, 100, 50))  # the planned file
    pruned = FileInfo("a", 10, 100, (RowGroup(1, 50, 50),))  # a group pruned by a filter
    check_footer("a", pruned, _footer(tmp_path, 100, 50))
    with pytest.raises(FileChangedError, match=r"its row group 0 holds rows \[0, 25\), the plan's \[0, 50\)"):
        check_footer("a", planned, _footer(tmp_path, 100, 25))
    with pytest.raises(FileChangedError, match="the plan reads row group 1, and its footer has 1 row groups"):
        check_footer("a", planned, _footer(tmp_path, 100, 100))
    with pytest.raises(FileChangedError, match="its footer has 60 rows in 2 row groups, the plan 100"):
        check_footer("a", planned, _footer(tmp_path, 60, 30))
    # Counted rows (filters with count_rows): only the groups' existence is compared.
    check_footer("a", planned, _footer(tmp_path, 60, 30), filtered=True)
    with pytest.raises(FileChangedError, match=r"manifest '/d/_manifest\.json' is stale"):
        check_footer("a", planned, _footer(tmp_path, 60, 30), manifest="/d/_manifest.json")
