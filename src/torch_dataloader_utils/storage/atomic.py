"""Local files written whole or not at all: a temporary file next to the target, renamed over it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["write_atomically"]


def write_atomically(path: str | os.PathLike[str], write: bytes | Callable[[BinaryIO], object]) -> None:
    """Write ``path`` atomically: whole, or not at all.

    ``write`` (bytes, or a function writing to a binary file) goes to a temporary file in
    the same directory, flushed to disk, then renamed over ``path``. A reader sees the old
    file or the whole new one, never a part; the temporary file is removed when writing
    fails. The directory is created when missing.

    Raises:
        OSError: the file could not be written.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(write, bytes):
                f.write(write)
            else:
                write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
