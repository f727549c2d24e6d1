"""Pieces: the unit of work a worker reads, in order, and where a cursor points in it.

A worker reads a list of :class:`Piece` values in order. Every piece has a read mode
(:class:`ReadMode`): one chunk in file order (``FILE``), a *window*: a few consecutive
chunks read together whose rows are emitted in a seeded permutation
(``row_shuffle_window``), or a *mix*: a few chunks read side by side whose rows are
emitted in seeded rounds (row mixing, :mod:`.mixing`). A piece may be restricted to the
rows ``[lo, hi)`` of its emission order. So every row a worker yields sits at a position
``(piece index, row offset)`` of its list, and what the training loop has consumed is a
*cursor* per worker: the pieces before ``piece`` are done, and the first ``offset`` rows
of ``piece`` are done (:func:`remaining` cuts a list at a cursor).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from torch_dataloader_utils.errors import ResumeStateError
from torch_dataloader_utils.plan.mixing import RowMixing, split_streams
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo

__all__ = [
    "Cursor",
    "Piece",
    "ReadMode",
    "advance",
    "as_pieces",
    "cut_chunk",
    "cut_piece",
    "mix_pieces",
    "remaining",
    "window_pieces",
]

Cursor = tuple[int, int]
"""``(piece index, rows consumed of that piece)`` for one worker."""


class ReadMode(enum.Enum):
    """How a :class:`Piece`'s rows are read and in which order they are emitted."""

    FILE = "file"
    """One chunk, its rows in file order."""
    WINDOW = "window"
    """Consecutive chunks read into one table, rows emitted in a seeded permutation."""
    MIX = "mix"
    """Chunks read side by side, rows emitted in seeded rounds (:mod:`.mixing`)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows a worker emits: one chunk in file order, a shuffled window, or a mix of chunks.

    Build one with :meth:`file`, :meth:`window` or :meth:`mixed`; the read mode follows
    from what it is given and is checked (a ``FILE`` piece has one chunk and no key, a
    ``MIX`` piece a key and a :class:`~.mixing.RowMixing`).

    Attributes:
        chunks: The chunks read (a mix's streams); exactly one in ``FILE`` mode.
        key: Seed of the row permutation of a window or a mix (``(seed, epoch, segment,
            rank, worker, index)``), or ``None`` in ``FILE`` mode.
        lo: First emitted row (in emission order) that belongs to the piece.
        hi: One past the last emitted row, or ``None`` for "to the end".
        mix: How a mix's rows are emitted (:class:`~.mixing.MixSchedule`); ``None`` but
            in ``MIX`` mode.
        mode: The read mode.
    """

    chunks: tuple[Chunk, ...]
    key: tuple[int, ...] | None = None
    lo: int = 0
    hi: int | None = None
    mix: RowMixing | None = None
    mode: ReadMode = field(init=False, repr=False)

    def __post_init__(self) -> None:
        mode = ReadMode.FILE if self.key is None else ReadMode.WINDOW if self.mix is None else ReadMode.MIX
        if self.key is None and (len(self.chunks) != 1 or self.mix is not None):
            raise ValueError(f"a piece without a key reads one chunk in file order, got {self.chunks}")
        object.__setattr__(self, "mode", mode)

    @classmethod
    def file(cls, chunk: Chunk) -> Piece:
        """One chunk in file order."""
        return cls((chunk,))

    @classmethod
    def window(cls, chunks: Sequence[Chunk], key: tuple[int, ...]) -> Piece:
        """Chunks read together, their rows emitted in the permutation of ``key``."""
        return cls(tuple(chunks), key)

    @classmethod
    def mixed(cls, chunks: Sequence[Chunk], key: tuple[int, ...], mixing: RowMixing) -> Piece:
        """Chunks read side by side, their rows emitted in the rounds of ``mixing`` and ``key``."""
        return cls(tuple(chunks), key, mix=mixing)

    @property
    def total_rows(self) -> int | None:
        """Rows of all its chunks, before ``lo`` / ``hi``, or ``None`` if unknown."""
        total = 0
        for chunk in self.chunks:
            if chunk.num_rows is None:
                return None
            total += chunk.num_rows
        return total

    @property
    def num_rows(self) -> int | None:
        """Rows the piece emits, or ``None`` if unknown."""
        total = self.total_rows
        if total is None:
            return None if self.hi is None else self.hi - self.lo
        return min(total, total if self.hi is None else self.hi) - self.lo

    @property
    def weight(self) -> int:
        """Balancing weight: rows when known, else bytes."""
        rows = self.num_rows
        return rows if rows is not None else sum(c.num_bytes for c in self.chunks)

    @property
    def whole(self) -> bool:
        """One whole chunk in file order (it can join a window)."""
        return self.mode is ReadMode.FILE and self.lo == 0 and self.hi is None

    @property
    def padding(self) -> bool:
        """All its chunks repeat rows read elsewhere (``equal_batches='pad'``)."""
        return all(c.padding for c in self.chunks)


def as_pieces(chunks: Sequence[Chunk]) -> list[Piece]:
    """Every chunk as a piece read in file order."""
    return [Piece.file(c) for c in chunks]


def _exact(chunk: Chunk) -> bool:
    return chunk.unit is ChunkUnit.ROWS and chunk.num_rows is not None


def window_pieces(pieces: Sequence[Piece], window_rows: int | None, key: tuple[int, ...]) -> list[Piece]:
    """Group runs of consecutive whole chunks into windows of at most ``window_rows`` rows.

    A window closes before the chunk that would take it over ``window_rows`` (a chunk
    larger than that forms a window alone), so the rows held at once are at most
    ``max(window_rows, largest chunk)``. Pieces that are not whole chunks (continued
    windows, partly read chunks) stay as they are. Window ``j`` gets the key
    ``(*key, j)``. ``window_rows=None`` returns ``pieces`` unchanged.
    """
    if window_rows is None:
        return list(pieces)
    out: list[Piece] = []
    group: list[Chunk] = []
    rows = 0

    def close() -> None:
        nonlocal group, rows
        if group:
            out.append(Piece.window(group, (*key, len(out))))
        group, rows = [], 0

    for piece in pieces:
        if not piece.whole:
            close()
            out.append(piece)
            continue
        chunk = piece.chunks[0]
        n = chunk.weight
        if group and rows + n > window_rows:
            close()
        group.append(chunk)
        rows += n
    close()
    return out


def mix_pieces(
    pieces: Sequence[Piece], mixing: RowMixing | None, key: tuple[int, ...], files: Mapping[str, FileInfo]
) -> list[Piece]:
    """Group runs of consecutive whole chunks into mixes of ``mixing.streams`` chunks.

    A run shorter than that (the worker's last chunks, or a worker with few chunks) has
    its largest chunks cut at row-group edges into more streams (:func:`~.mixing.split_streams`).
    Pieces that are not whole chunks (continued mixes, partly read chunks) stay as they
    are. Mix ``j`` gets the key ``(*key, j)``. ``mixing=None`` returns ``pieces`` unchanged.
    """
    if mixing is None:
        return list(pieces)
    out: list[Piece] = []
    group: list[Chunk] = []

    def close() -> None:
        nonlocal group
        if group:
            streams = split_streams(group, mixing.streams, files)
            out.append(Piece.mixed(streams, (*key, len(out)), mixing))
        group = []

    for piece in pieces:
        if not piece.whole:
            close()
            out.append(piece)
            continue
        group.append(piece.chunks[0])
        if len(group) >= mixing.streams:
            close()
    close()
    return out


def cut_chunk(chunk: Chunk, file: FileInfo, rows: int) -> tuple[Chunk, Chunk]:
    """Cut ``chunk`` after its first ``rows`` live rows: ``(head, tail)``.

    Rows of pruned row groups (and, for Iceberg, deleted positions) are not counted, so
    the cut lands after the ``rows``-th row that will actually be read. Bytes are shared
    in proportion to rows. A byte range cannot be cut at a record without reading it:
    both halves read the range and keep their own window of its records (``skip``).

    Raises:
        ValueError: ``rows`` is not strictly between 0 and the chunk's row count.
    """
    total = chunk.num_rows
    if total is None or not 0 < rows < total:
        raise ValueError(f"can only cut a chunk of {total} rows after 1..{(total or 1) - 1} rows, got {rows}")
    head_bytes = chunk.num_bytes * rows // total
    tail_bytes = chunk.num_bytes - head_bytes
    if chunk.unit is ChunkUnit.BYTES:
        return (
            replace(chunk, num_rows=rows, num_bytes=head_bytes),
            replace(chunk, skip=chunk.skip + rows, num_rows=total - rows, num_bytes=tail_bytes),
        )
    at = file.stop_after(chunk.start, rows)  # FileInfo knows the positions of no live row
    return (
        Chunk(chunk.path, chunk.start, at, ChunkUnit.ROWS, rows, head_bytes, chunk.padding),
        Chunk(chunk.path, at, chunk.stop, ChunkUnit.ROWS, total - rows, tail_bytes, chunk.padding),
    )


def cut_piece(piece: Piece, rows: int, files: Mapping[str, FileInfo], exact: bool) -> tuple[Piece, Piece]:
    """``(head, tail)``: the piece's first ``rows`` emitted rows and the rest.

    A whole chunk with exact row counts is cut into two chunks (each reads only its
    own rows); anything else becomes two row ranges of the same emission order.
    """
    if piece.whole and exact and _exact(piece.chunks[0]):
        head, tail = cut_chunk(piece.chunks[0], files[piece.chunks[0].path], rows)
        return Piece.file(head), Piece.file(tail)
    stop = piece.lo + rows
    return replace(piece, hi=stop), replace(piece, lo=stop)


def advance(piece: Piece, rows: int, files: Mapping[str, FileInfo], exact: bool) -> Piece | None:
    """What is left of ``piece`` after its first ``rows`` rows were consumed."""
    n = piece.num_rows
    if rows <= 0:
        return piece if n != 0 else None
    if n is not None and rows >= n:
        return None
    return cut_piece(piece, rows, files, exact)[1]


def remaining(
    pieces: Sequence[Piece], cursor: Cursor, files: Mapping[str, FileInfo], exact: bool
) -> list[Piece]:
    """A worker's pieces not yet consumed, given its cursor ``(piece, offset)``.

    Raises:
        ResumeStateError: the cursor points past the worker's pieces.
    """
    index, offset = cursor
    if index < 0 or offset < 0 or index > len(pieces) or (index == len(pieces) and offset):
        raise ResumeStateError(
            f"cursor {list(cursor)} is outside the worker's {len(pieces)} pieces; the state does not "
            "belong to this plan (was it saved by another version, or edited?)"
        )
    if index == len(pieces):
        return []
    n = pieces[index].num_rows
    if n is not None and offset > n:
        raise ResumeStateError(
            f"cursor {list(cursor)} is past the {n} rows of piece {index}; the state does not "
            "belong to this plan"
        )
    rest = advance(pieces[index], offset, files, exact)
    return ([rest] if rest is not None else []) + [p for p in pieces[index + 1 :] if p.num_rows != 0]
