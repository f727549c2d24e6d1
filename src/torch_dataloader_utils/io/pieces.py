"""Reading a :class:`~torch_dataloader_utils.plan.pieces.Piece`: a chunk, part of one, or a window.

A window's chunks are read into one table and its rows taken in the piece's seeded
permutation (the row-level shuffle). Only the window is held in memory, and a window
continued after a resume is rebuilt from its chunks and key, never from a saved buffer.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.batching import with_flag
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.shuffle import permutation

__all__ = ["read_piece"]


def read_piece(
    reader: ChunkReader, piece: Piece, *, flag_column: str | None = None, batch_size: int = 65536
) -> Iterator[pa.RecordBatch]:
    """Yield a piece's rows in its emission order, restricted to ``[lo, hi)``.

    Args:
        reader: Reads one chunk.
        piece: What to read.
        flag_column: When set, a boolean column of that name marks each chunk's
            ``padding`` (``equal_batches='pad'``).
        batch_size: Largest batch yielded from a window.
    """

    def chunk_batches(index: int) -> Iterator[pa.RecordBatch]:
        chunk = piece.chunks[index]
        batches = reader.read(chunk)
        return with_flag(batches, flag_column, chunk.padding) if flag_column else batches

    if piece.key is None:
        yield from _rows_between(chunk_batches(0), piece.lo, piece.hi)
        return
    parts = [b for i in range(len(piece.chunks)) for b in chunk_batches(i) if b.num_rows]
    if not parts:
        return
    table = pa.Table.from_batches(parts)  # take() gathers across chunks: no concatenation copy
    order = permutation(table.num_rows, piece.key[0], piece.key[1], *piece.key[2:])
    order = order[piece.lo : piece.hi]
    if not len(order):
        return
    shuffled = table.take(order.astype(np.int64, copy=False))
    yield from shuffled.to_batches(max_chunksize=batch_size)


def _rows_between(batches: Iterator[pa.RecordBatch], lo: int, hi: int | None) -> Iterator[pa.RecordBatch]:
    if lo == 0 and hi is None:
        yield from batches
        return
    position = 0
    for batch in batches:
        start, stop = position, position + batch.num_rows
        position = stop
        if stop <= lo:
            continue
        if hi is not None and start >= hi:
            break
        a = max(lo, start) - start
        b = (batch.num_rows if hi is None else min(hi, stop) - start) - a
        yield batch if a == 0 and b == batch.num_rows else batch.slice(a, b)
