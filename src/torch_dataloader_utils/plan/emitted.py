"""Which file rows a piece emits: its chunks' live rows, in its emission order, restricted to ``[lo, hi)``.

A worker reads a :class:`~.pieces.Piece` and yields its rows in an order that depends
only on the plan: a chunk's live rows in file order, a window's in the permutation of its
key, a mix's in the rounds of its :class:`~.mixing.MixSchedule`. So the rows a piece
restricted to ``[lo, hi)`` yields are known without reading: :func:`emitted_rows` gives
them as file row positions per chunk. What an interrupted pass left (the pieces after
its cursors) is thereby a set of file rows, which a new plan can read in another order
(an Iceberg epoch continued onto a newer snapshot does).

Only for chunks counted in rows with exact counts (``ChunkUnit.ROWS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from torch_dataloader_utils.plan.mixing import MixSchedule
from torch_dataloader_utils.plan.pieces import Piece, ReadMode
from torch_dataloader_utils.plan.shuffle import permutation
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo

__all__ = ["chunk_rows", "emitted_rows"]

Positions = np.ndarray[Any, np.dtype[np.int64]]


def chunk_rows(chunk: Chunk, file: FileInfo) -> Positions:
    """The file row positions a chunk reads, in file order.

    Its rows in unpruned row groups, less the file's deleted positions (Iceberg deletes).

    Raises:
        ValueError: the chunk is not counted in rows.
    """
    if chunk.unit is not ChunkUnit.ROWS:
        raise ValueError(f"only chunks of rows have known rows, got {chunk}")
    if file.row_groups is None:
        stop = chunk.stop if file.num_rows is None else min(chunk.stop, file.num_rows)
        rows = np.arange(chunk.start, max(chunk.start, stop), dtype=np.int64)
    else:
        parts = [
            np.arange(max(chunk.start, g.first_row), min(chunk.stop, g.stop_row), dtype=np.int64)
            for g in file.groups_in(chunk.start, chunk.stop)
        ]
        rows = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    deleted = getattr(file, "deleted", None)
    if deleted is not None and len(deleted) and len(rows):
        rows = rows[~np.isin(rows, deleted, assume_unique=True)]
    return rows


def emitted_rows(piece: Piece, files: Mapping[str, FileInfo]) -> list[Positions]:
    """The file row positions each chunk of ``piece`` yields within ``[lo, hi)``, sorted.

    One array per chunk of ``piece.chunks``, in that order (a row belongs to the chunk,
    hence the file, it was read from).
    """
    streams = [chunk_rows(c, files[c.path]) for c in piece.chunks]
    sizes = np.asarray([len(s) for s in streams], dtype=np.int64)
    total = int(sizes.sum())
    lo, hi = piece.lo, total if piece.hi is None else min(piece.hi, total)
    if lo <= 0 and hi >= total:
        return streams
    # The emission index of every row of the pool (the streams one after another).
    if piece.mode is ReadMode.FILE:
        emitted = np.arange(total, dtype=np.int64)
    elif piece.mode is ReadMode.WINDOW:
        key = piece.key or (0, 0)
        order = permutation(total, key[0], key[1], *key[2:])
        emitted = np.empty(total, dtype=np.int64)
        emitted[order] = np.arange(total, dtype=np.int64)
    else:
        emitted = _mix_emission(piece, sizes)
    wanted = (emitted >= lo) & (emitted < hi)
    starts = np.concatenate(([0], np.cumsum(sizes)))
    return [s[wanted[starts[i] : starts[i + 1]]] for i, s in enumerate(streams)]


def _mix_emission(piece: Piece, sizes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The emission index of every row of a mix's streams (stream after stream), round by round."""
    if piece.mix is None or piece.key is None:
        raise TypeError("not a mix")
    schedule = MixSchedule([c.weight for c in piece.chunks], piece.mix.rows, piece.key)
    first = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    emitted = np.empty(int(sizes.sum()), dtype=np.int64)
    taken = np.zeros(len(sizes), dtype=np.int64)
    before = 0
    counts = [int(n) for n in sizes]
    for index in range(schedule.num_rounds(sizes)):
        lengths = schedule.round_lengths(index, counts)
        # Pool position -> row of the streams: lengths[c] rows of stream c from taken[c].
        pool = np.concatenate(
            [np.arange(n, dtype=np.int64) + first[c] + taken[c] for c, n in enumerate(lengths) if n]
        )
        order = schedule.order(index, lengths)
        emitted[pool[order]] = before + np.arange(len(order), dtype=np.int64)
        before += len(order)
        taken += lengths
    return emitted
