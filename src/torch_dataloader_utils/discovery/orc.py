"""ORC metadata: one :class:`RowGroup` per stripe, with exact row counts.

pyarrow exposes the number of stripes but not their sizes; dividing ``nrows`` by
``nstripes`` can misplace twice the load when stripes differ. The exact counts are in
the file footer's ``StripeInformation`` entries (ORC specification, ``orc_proto.proto``:
``Footer.stripes = 3``; ``StripeInformation.offset = 1, indexLength = 2, dataLength = 3,
footerLength = 4, numberOfRows = 5``). pyarrow hands over the decompressed file tail
(``ORCReader.serialized_file_tail()``, a ``FileTail`` message whose ``footer = 2``),
and the few fields needed are decoded here with a minimal protobuf wire reader.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.orc as orc

from torch_dataloader_utils.discovery.listing import ListedFile
from torch_dataloader_utils.discovery.parquet import FooterInfo
from torch_dataloader_utils.errors import CorruptFileError
from torch_dataloader_utils.plan.types import FileInfo, RowGroup
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.upstream.pyarrow import orc_file_tail

__all__ = ["StripeInfo", "read_orc_footers", "stripes_from_tail"]

_THREADS = 16
StripeInfo = tuple[int, int, int]
"""``(offset, length_on_disk, num_rows)`` of one stripe."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field_number, wire_type, value)`` of a protobuf message, in order."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated message")
        yield number, wire, value


def stripes_from_tail(tail: bytes) -> list[StripeInfo]:
    """The stripes listed in a serialized ORC ``FileTail``, in file order.

    Raises:
        ValueError: the bytes are not a well-formed tail.
    """
    footer = next((v for n, w, v in _fields(tail) if n == 2 and w == 2), None)
    if not isinstance(footer, bytes):
        raise ValueError("the ORC file tail has no footer")
    stripes = []
    for number, wire, value in _fields(footer):
        if number != 3 or wire != 2 or not isinstance(value, bytes):
            continue
        info = {n: v for n, w, v in _fields(value) if w == 0}
        length = sum(int(info.get(k, 0)) for k in (2, 3, 4))
        stripes.append((int(info.get(1, 0)), length, int(info.get(5, 0))))
    return stripes


def _read_one(fs: FileSystemSpec, listed: ListedFile) -> FooterInfo:
    try:
        with fs.arrow().open_input_file(listed.path) as source:
            reader = orc.ORCFile(source)
            schema = reader.schema
            num_rows = reader.nrows
            nstripes = reader.nstripes
            stripes = stripes_from_tail(orc_file_tail(reader))
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise CorruptFileError(
            f"cannot read the ORC footer of {fs.display(listed.path)!r} ({exc}); is it an ORC "
            "file? Remove it from path or pass format= for its real format"
        ) from exc
    if len(stripes) != nstripes or sum(s[2] for s in stripes) != num_rows:
        raise CorruptFileError(
            f"the stripe list of {fs.display(listed.path)!r} ({len(stripes)} stripes, "
            f"{sum(s[2] for s in stripes)} rows) disagrees with its footer ({nstripes} stripes, "
            f"{num_rows} rows); the file may be damaged"
        )
    groups = []
    first = 0
    for i, (_, length, rows) in enumerate(stripes):
        groups.append(RowGroup(i, first, rows, length))
        first += rows
    info = FileInfo(listed.path, listed.size, num_rows, tuple(groups), listed.mtime, etag=listed.etag)
    return FooterInfo(info, schema, None)


def read_orc_footers(fs: FileSystemSpec, files: Sequence[ListedFile]) -> list[FooterInfo]:
    """Every ORC file's schema and stripes, read concurrently, in the order of ``files``.

    Raises:
        CorruptFileError: naming the first file whose footer cannot be read.
    """
    if len(files) <= 1:
        return [_read_one(fs, f) for f in files]
    with ThreadPoolExecutor(max_workers=min(_THREADS, len(files))) as pool:
        return list(pool.map(lambda f: _read_one(fs, f), files))
