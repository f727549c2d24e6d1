"""A reader's open native files: tied to the planned size, bounded, owned, never shared by forks."""

from __future__ import annotations

import errno
import pickle
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from torch_dataloader_utils import FileChangedError
from torch_dataloader_utils.storage.fs import resolve
from torch_dataloader_utils.storage.handles import Handles, too_many_open_files


def _files(tmp_path: Path, n: int) -> list[str]:
    paths = []
    for i in range(n):
        path = tmp_path / f"f{i}.bin"
        path.write_bytes(bytes(range(10)) * (i + 1))
        paths.append(str(path))
    return paths


def test_a_handle_is_reused_only_for_the_size_it_was_opened_for(tmp_path: Path) -> None:
    (path,) = _files(tmp_path, 1)
    opened: list[str] = []

    def opener(p: str) -> object:
        opened.append(p)
        return pafs.LocalFileSystem().open_input_file(p)

    handles = Handles()
    first = handles.get(path, 10, opener, path)
    assert handles.get(path, 10, opener, path) is first
    assert opened == [path]
    with pytest.raises(
        FileChangedError, match=rf"'{path}' changed after the dataset was built: it was 11 bytes"
    ):
        handles.get(path, 11, opener, path)  # planned at another size: opened again, and refused
    assert opened == [path, path]


def test_at_most_size_files_are_kept_and_close_lets_go_of_all(tmp_path: Path) -> None:
    paths = _files(tmp_path, 5)
    handles = Handles(size=3)
    opener = pafs.LocalFileSystem().open_input_file
    for i, path in enumerate(paths):
        handles.get(path, 10 * (i + 1), opener, path)
    assert len(handles) == 3
    handles.close()
    assert len(handles) == 0


def test_handles_pickle_empty(tmp_path: Path) -> None:
    (path,) = _files(tmp_path, 1)
    handles = Handles(size=7)
    handles.get(path, 10, pafs.LocalFileSystem().open_input_file, path)
    copy = pickle.loads(pickle.dumps(handles))
    assert len(copy) == 0
    assert copy._size == 7


def test_read_range_without_handles_opens_and_closes(tmp_path: Path) -> None:
    (path,) = _files(tmp_path, 1)
    fs, local = resolve(path)
    assert fs.read_range(local, 2, 5, 10) == bytes([2, 3, 4])
    handles = Handles()
    assert fs.read_range(local, 0, 3, 10, handles=handles) == bytes([0, 1, 2])
    assert len(handles) == 1
    with pytest.raises(FileChangedError, match="it was 99 bytes when planned and is 10 bytes now"):
        fs.read_range(local, 0, 3, 99, handles=Handles())


def test_too_many_open_files_is_recognized_through_causes() -> None:
    direct = OSError(errno.EMFILE, "Too many open files")
    assert "ulimit -n" in (too_many_open_files(direct) or "")
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = OSError("[errno 24] Too many open files")
    assert too_many_open_files(wrapped) is not None
    assert too_many_open_files(OSError(errno.ENOENT, "No such file")) is None
