"""Parquet footers read from storage in one ranged request (two for a large footer)."""

from __future__ import annotations

from collections.abc import Callable

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.storage.fetch import fetch_range
from torch_dataloader_utils.storage.fs import FileSystemSpec

__all__ = ["FOOTER_READ_BYTES", "NotParquetError", "read_footer"]

FOOTER_READ_BYTES = 64 * 1024
"""Bytes read from a file's end to get its footer in one request (most footers fit)."""


class NotParquetError(ValueError):
    """The bytes at a file's end are not a Parquet footer."""


def read_footer(
    fs: FileSystemSpec,
    path: str,
    size: int,
    config: FetchConfig,
    on_request: Callable[[int], None] | None = None,
    fetch: Callable[[int, int], bytes] | None = None,
) -> bytes:
    """The file's footer, usually in one ranged request of its last ``FOOTER_READ_BYTES``.

    ``on_request`` is called with the bytes received after every request. ``fetch(start,
    stop)``, when given, reads the bytes instead of :func:`fetch_range` (the node-local
    cache, :mod:`~torch_dataloader_utils.storage.cached`).

    Returns:
        A small buffer that pyarrow reads as a Parquet file with no row data
        (``PAR1`` + metadata + length + ``PAR1``): ``pq.read_metadata`` and
        ``ParquetFileFormat.make_fragment`` accept it as they are.

    Raises:
        NotParquetError: the file is too short or has no Parquet magic at its end.
        ReadError: the bytes could not be fetched.
    """
    if size < 12:
        raise NotParquetError(f"{size} bytes is too small for a Parquet file")

    def get(start: int, stop: int) -> bytes:
        if fetch is not None:
            return fetch(start, stop)
        return fetch_range(
            fs, path, start, stop, size=size, config=config, metadata=True, on_request=on_request
        )

    tail = get(max(0, size - FOOTER_READ_BYTES), size)
    if tail[-4:] != b"PAR1":
        what = "an encrypted footer" if tail[-4:] == b"PARE" else f"magic bytes {tail[-4:]!r}"
        raise NotParquetError(f"the file ends with {what}, not a Parquet footer ('PAR1')")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size:
        raise NotParquetError(f"the footer length {length} does not fit in a file of {size} bytes")
    if length + 8 > len(tail):
        head = get(size - 8 - length, size - len(tail))
        tail = head + tail
    return b"PAR1" + tail[-(length + 8) :]
