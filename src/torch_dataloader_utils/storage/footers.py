"""Parquet footers read from storage in one ranged request (two for a large footer).

On S3 the footer is read by pyarrow's native client wherever it provably reaches what
s3fs reaches (:attr:`~torch_dataloader_utils.storage.fs.FileSystemSpec.native_footers`):
the file is opened with its listed size, so the client sends one ranged GET of the
file's last 64 KiB (a second GET of the whole metadata when it is larger) and no HEAD,
spending a fraction of botocore's CPU per request outside the GIL. Elsewhere, and with
the node-local cache, the footer is read with :func:`fetch_range`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.storage.fetch import GaveUp, fetch_range, read_error, retry_call
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.requests import count_request

__all__ = ["FOOTER_READ_BYTES", "NotParquetError", "read_footer", "read_footer_parsed"]

FOOTER_READ_BYTES = 64 * 1024
"""Bytes read from a file's end to get its footer in one request (most footers fit).

pyarrow's own Parquet reader reads as much (its default footer read size), which is
what makes the native path's requests predictable."""


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
    return read_footer_parsed(fs, path, size, config, on_request, fetch)[0]


def read_footer_parsed(
    fs: FileSystemSpec,
    path: str,
    size: int,
    config: FetchConfig,
    on_request: Callable[[int], None] | None = None,
    fetch: Callable[[int, int], bytes] | None = None,
) -> tuple[bytes, pq.FileMetaData | None]:
    """:func:`read_footer`, and the footer already parsed when the read parsed it (else ``None``).

    pyarrow's native client parses the metadata to read it: handing the parsed object on
    spares parsing it again (per file, at thousands of files, a visible part of the
    footers' CPU under the GIL).
    """
    if size < 12:
        raise NotParquetError(f"{size} bytes is too small for a Parquet file")
    if fetch is None and fs.native_footers:
        return _native_footer(fs, path, size, config, on_request)

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
    return b"PAR1" + tail[-(length + 8) :], None


def _native_footer(
    fs: FileSystemSpec,
    path: str,
    size: int,
    config: FetchConfig,
    on_request: Callable[[int], None] | None,
) -> tuple[bytes, pq.FileMetaData]:
    """The footer and its parsed metadata through pyarrow's native S3 client: no HEAD, one GET.

    (Two GETs for a large footer.)

    The file is opened as a fragment of its listed size, which pyarrow's S3 client
    trusts (a file opened by path alone costs a HEAD first). pyarrow's Parquet reader
    reads the last ``FOOTER_READ_BYTES`` (the whole file when smaller) and, when the
    metadata is longer than that, the whole metadata in a second GET: the requests are
    counted by that rule once the metadata is known. A failed attempt is counted as one
    GET (a large footer whose second GET fails sent two). The metadata is written back
    into the buffer :func:`read_footer` returns (the footer's own bytes).
    """
    client = fs.arrow()
    tail = min(size, FOOTER_READ_BYTES)

    def attempt() -> tuple[pa.Buffer, pq.FileMetaData] | NotParquetError:
        fragment: Any = ds.ParquetFileFormat().make_fragment(path, filesystem=client, file_size=size)
        try:
            fragment.ensure_complete_metadata()
        except pa.ArrowInvalid as exc:  # the bytes arrived: they are not a Parquet footer
            _counted(on_request, tail)
            return NotParquetError(str(exc).split(": ", 1)[-1])
        except Exception:
            count_request("gets")  # sent (and retried: another request), received nothing
            raise
        metadata = fragment.metadata
        length = metadata.serialized_size
        _counted(on_request, tail)
        if length + 8 > tail:
            _counted(on_request, length)
        sink = pa.BufferOutputStream()
        metadata.write_metadata_file(sink)
        return sink.getvalue(), metadata

    try:
        got = retry_call(attempt, config)
    except GaveUp as failed:
        raise read_error(fs, path, size - tail, size, failed, config) from failed.error
    if isinstance(got, NotParquetError):
        raise got
    return got[0].to_pybytes(), got[1]


def _counted(on_request: Callable[[int], None] | None, nbytes: int) -> None:
    """Count one GET of ``nbytes`` (in the process's requests, and for the caller)."""
    count_request("gets", nbytes)
    if on_request is not None:
        on_request(nbytes)
