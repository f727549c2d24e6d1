"""Record scanning of line-delimited text (CSV, JSONL), shared by discovery and io.

A record starts at the file's first data byte (after the CSV header) and after every
newline byte that is followed by a non-empty line. Lines end with LF or CR LF; a file
whose lines end with a lone CR (old Mac OS, some exports) uses CR as its newline byte
(:func:`line_end_of`, detected once per file by discovery). Multi-byte UTF-8 characters
never contain the newline byte, so cutting at a newline never splits a character.
Compressed files are recognised by their suffix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "COMPRESSION_SUFFIXES",
    "PIECE_BYTES",
    "SAMPLE_BYTES",
    "TextFileMeta",
    "buffer_source",
    "compression_of",
    "count_records",
    "ends_inside_quotes",
    "iter_pieces",
    "line_end_of",
    "next_line_start",
    "record_starts",
]

COMPRESSION_SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".lz4": "lz4"}
"""File name suffixes of compressed text, and their pyarrow codec names."""
PIECE_BYTES = 4 * 1024**2
"""Bytes parsed at once (rounded to whole lines): bounds memory for large chunks."""
SAMPLE_BYTES = 1024**2
"""Bytes at the head of each file from which column types are inferred (discovery)."""
_SCAN_BYTES = 64 * 1024
_CR = 13
LF = b"\n"
CR = b"\r"


def buffer_source(data: bytes) -> Any:
    """A zero-copy pyarrow reader over ``data`` (typed ``Any``: the stubs want file objects)."""
    return pa.BufferReader(data)


def compression_of(path: str) -> str | None:
    """The pyarrow codec of ``path`` by its suffix, or ``None`` for plain text."""
    lower = path.lower()
    for suffix, codec in COMPRESSION_SUFFIXES.items():
        if lower.endswith(suffix):
            return codec
    return None


@dataclass(frozen=True, slots=True)
class TextFileMeta:
    """What the reader needs to know about one text file besides its ``FileInfo``.

    Attributes:
        compression: pyarrow codec name, or ``None`` for plain text.
        data_start: Offset of the first data byte (after the CSV header line; 0 for JSONL),
            in the decompressed stream for compressed files.
        column_names: CSV: the header's column names; JSONL: empty.
        newline: The byte that ends its lines: LF (lines ending with LF or CR LF) or CR
            (lines ending with a lone CR).
    """

    compression: str | None
    data_start: int
    column_names: tuple[str, ...] = ()
    newline: bytes = LF


def line_end_of(head: bytes) -> bytes:
    """The newline byte of a file that starts with ``head``: CR for lone-CR lines, else LF.

    The first line terminator decides: a CR not followed by LF (and before any LF) means
    the file's lines end with CR alone, as pyarrow also reads them.
    """
    cr = head.find(CR)
    lf = head.find(LF)
    if cr < 0 or (0 <= lf < cr) or cr + 1 == lf or cr + 1 >= len(head):
        return LF
    return CR


def record_starts(
    buf: bytes, offset: int, is_csv: bool, newline: bytes = LF
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """File offsets of the records whose lines lie in ``buf`` (which starts a line).

    Empty lines hold no record: for CSV a line of zero bytes or of carriage returns
    only; for JSONL a line of spaces, tabs and carriage returns only (what pyarrow skips).
    ``newline`` is the file's newline byte (see :func:`line_end_of`).
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    n = len(a)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    nl = np.flatnonzero(a == newline[0])
    starts = np.empty(len(nl) + 1, dtype=np.int64)
    starts[0] = 0
    starts[1:] = nl + 1
    ends = np.empty_like(starts)
    ends[:-1] = nl
    ends[-1] = n
    if starts[-1] >= n:  # buffer ends with a newline: no line after it
        starts, ends = starts[:-1], ends[:-1]
    lengths = ends - starts
    nonempty = lengths > 0
    first = a[np.minimum(starts, n - 1)]
    blank_first = first == _CR
    if not is_csv:
        blank_first |= (first == 32) | (first == 9)
    maybe_blank = nonempty & blank_first
    for i in np.flatnonzero(maybe_blank):
        line = buf[starts[i] : ends[i]]
        if not (line.strip(b"\r") if is_csv else line.strip(b" \t\r")):
            nonempty[i] = False
    return starts[nonempty] + offset


def ends_inside_quotes(line: bytes) -> bool:
    """Whether a CSV line ends inside a quoted field, so its record goes on past the line end.

    Follows the quoting pyarrow's CSV parser uses: a ``"`` opens a quoted field only at
    the start of a field (the line's start or after a ``,``); inside one, ``""`` is a
    quote and a lone ``"`` closes it; elsewhere a ``"`` is an ordinary character.
    """
    inside = False
    pos = 0
    while True:
        q = line.find(b'"', pos)
        if q < 0:
            return inside
        if inside:
            if line[q + 1 : q + 2] == b'"':
                pos = q + 2
                continue
            inside = False
        elif q == 0 or line[q - 1 : q] == b",":
            inside = True
        pos = q + 1


def count_records(buf: bytes, is_csv: bool, newline: bytes = LF) -> int:
    """Records in ``buf`` (whole lines): its non-empty lines, see :func:`record_starts`."""
    return len(record_starts(buf, 0, is_csv, newline))


def iter_pieces(
    read: Callable[[int], bytes],
    first: int,
    stop: float,
    piece_bytes: int = PIECE_BYTES,
    newline: bytes = LF,
) -> Iterator[tuple[int, bytes]]:
    """Whole lines from ``first`` (a line start) up to the one holding byte ``stop - 1``.

    Args:
        read: Reads the next ``n`` bytes of a stream positioned at ``first``
            (``b""`` at the end).
        first: Offset of the first line.
        stop: End of the range; the line crossing it is finished. ``math.inf`` for all.
        piece_bytes: About how many bytes each piece holds (a longer line is one piece).
        newline: The file's newline byte.

    Yields:
        ``(offset, data)`` pieces of whole lines (the file's last line may lack its newline).
    """
    pos = first
    buf = b""
    while True:
        block = read(piece_bytes)
        eof = not block
        buf = buf + block if buf else block
        need = stop - 1 - pos
        if need < len(buf):
            nl = buf.find(newline, max(int(need), 0))
            if nl >= 0:
                yield pos, buf[: nl + 1]
                return
            if eof:
                if buf:
                    yield pos, buf
                return
            continue
        if eof:
            if buf:
                yield pos, buf
            return
        nl = buf.rfind(newline)
        if nl >= 0:
            yield pos, buf[: nl + 1]
            pos += nl + 1
            buf = buf[nl + 1 :]


def next_line_start(read: Callable[[int], bytes], pos: int, newline: bytes = LF) -> int:
    """Offset just after the first newline at or after ``pos`` (stream positioned there)."""
    while True:
        block = read(_SCAN_BYTES)
        if not block:
            return pos
        nl = block.find(newline)
        if nl >= 0:
            return pos + nl + 1
        pos += len(block)
