"""Sequence packing as index arithmetic: where every token of a batch's documents goes.

A batch's documents arrive as Arrow's list layout: ``offsets`` (document ``d`` is tokens
``[offsets[d], offsets[d + 1])`` of the flat values). :func:`pack_offsets` says, for
every token kept, its index in the values (``source``), its slot in the packed rows
(``dest``, row ``dest // seq_len``) and its position in its document, plus the rows'
segment boundaries (``cu_seqlens``). The caller then moves the values with one fancy
index (:mod:`torch_dataloader_utils.packing`); nothing is done per token in Python.

Two ways to pack, both greedy in stream order within the batch:

* ``split=True``: the documents are laid end to end and cut every ``seq_len`` tokens,
  so every row is full but the batch's last; a document crossing a row's end continues
  at the next row's start (two segments). No arithmetic per document.
* ``split=False`` ("next fit"): a document that does not fit the rest of the current
  row starts the next row, whose rest is padding; only a document longer than
  ``seq_len`` is cut into ``seq_len``-token pieces. The placement is one integer loop
  over the documents (no token is touched in it).

A token's position (``position_ids``) is its position in its segment: 0 where a
document starts and where a row starts, so a document continued from the previous row
counts from 0 again, and positions stay below ``seq_len``. A segment sees only itself
(``cu_seqlens``), so the continuation is, to the model, a document of its own; and the
rule that a segment starts where the position is 0 (how padding-free attention in
Hugging Face models finds the segments of a packed row) holds in every row.

With ``truncate`` a document keeps only its first ``seq_len`` tokens. Padding fills
the end of a row and forms a segment of its own in ``cu_seqlens``, so the boundaries of
every row run from 0 to ``seq_len`` (the varlen kernels see every slot). A batch whose
documents hold no token packs into one row of padding.

Pure: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Packing", "pack_offsets"]


@dataclass(frozen=True)
class Packing:
    """Where the tokens of one batch's documents go.

    Attributes:
        rows: Packed rows (at least 1).
        kept: Tokens kept (placed in the rows).
        source: int64, for every token kept: its index in the flat values; ``None`` when
            every token is kept, in order (``arange(kept)``: no gather needed).
        dest: int64, its slot in the packed rows (``rows * seq_len`` slots, row-major);
            ``None`` for ``arange(kept)`` (the tokens end to end from slot 0).
        position: int32, its position in its segment (0 where a document or a row
            starts; below ``seq_len``).
        cu_values: int32, every row's segment boundaries, row after row (each from 0 to
            ``seq_len``).
        cu_offsets: int32 ``[rows + 1]``: row ``r``'s boundaries are
            ``cu_values[cu_offsets[r]:cu_offsets[r + 1]]``.
    """

    rows: int
    kept: int
    source: np.ndarray | None
    dest: np.ndarray | None
    position: np.ndarray
    cu_values: np.ndarray
    cu_offsets: np.ndarray


def _ranges(starts: np.ndarray, lengths: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """``concat(arange(s, s + n) for s, n in zip(starts, lengths))``, vectorized, as ``dtype``."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=dtype)
    first = np.cumsum(lengths) - lengths
    out: np.ndarray = np.arange(total, dtype=dtype)
    out += np.repeat((starts - first).astype(dtype), lengths)
    return out


def _positions(total: int, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Positions in their segments of ``total`` tokens laid end to end (segments at ``starts``).

    One running sum over the output: 1 everywhere, and at a segment's first token the
    step back to 0 (``1 - length`` of the segment before); no temporary of its size.
    """
    position = np.ones(total, dtype=np.int32)
    if total:
        position[starts[1:]] = 1 - lengths[:-1]
        position[0] = 0
        np.cumsum(position, out=position)
    return position


def _pieces(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Documents cut into pieces of at most ``seq_len``: ``(document, offset in it, length)``."""
    counts = np.maximum(-(-lengths // seq_len), 0)
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    index = _ranges(np.zeros(len(lengths), dtype=np.int64), counts)
    offset = index * seq_len
    length = np.minimum(lengths[doc] - offset, seq_len)
    return doc, offset, length


def _next_fit(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, int]:
    """Slots where pieces of at most ``seq_len`` start, placed in order (next fit), and the rows."""
    starts = np.empty(len(lengths), dtype=np.int64)
    row, fill = 0, 0
    for i, n in enumerate(lengths.tolist()):
        if fill + n > seq_len:
            row, fill = row + 1, 0
        starts[i] = row * seq_len + fill
        fill += n
    return starts, row + 1


def _boundaries(points: np.ndarray, rows: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row segment boundaries from the slots where segments start or end."""
    inner = np.unique(points[(points % seq_len) != 0])
    row = inner // seq_len
    counts = np.bincount(row, minlength=rows).astype(np.int64) + 2
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.int32)
    values[offsets[:-1]] = 0
    values[offsets[1:] - 1] = seq_len
    rank = np.arange(len(inner), dtype=np.int64) - np.searchsorted(row, row, side="left")
    values[offsets[row] + 1 + rank] = inner - row * seq_len
    return values, offsets.astype(np.int32)


def pack_offsets(offsets: np.ndarray, seq_len: int, *, split: bool = True, truncate: bool = False) -> Packing:
    """Pack the documents of Arrow list ``offsets`` (int, from 0) into rows of ``seq_len`` slots.

    Args:
        offsets: ``[documents + 1]`` non-decreasing ints starting at 0.
        seq_len: Slots per row (>= 1).
        split: Documents may continue in the next row (else: next fit, see the module).
        truncate: Keep only each document's first ``seq_len`` tokens.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    if truncate:
        lengths = np.minimum(lengths, seq_len)
    source: np.ndarray | None
    dest: np.ndarray | None
    if split:
        # Every token kept, in order, end to end: only the positions need computing.
        source = _ranges(offsets[:-1], lengths) if truncate else None
        kept = int(lengths.sum())
        dest = None
        rows = max(1, -(-kept // seq_len))
        nonempty = lengths > 0
        starts = (np.cumsum(lengths) - lengths)[nonempty]
        points = np.concatenate((starts, [kept]))
        # Segments: the documents' tokens cut where a document or a row starts.
        cuts = np.union1d(starts, np.arange(0, kept, seq_len))
        position = _positions(kept, cuts, np.diff(np.append(cuts, kept)))
    else:
        doc, offset, length = _pieces(lengths, seq_len)
        placed, rows = _next_fit(length, seq_len)
        source = _ranges(offsets[doc] + offset, length)
        position = _ranges(np.zeros(len(length), dtype=np.int64), length, np.int32)  # pieces fit a row
        dest = _ranges(placed, length)
        kept = len(dest)
        points = np.concatenate((placed, placed + length))
    cu_values, cu_offsets = _boundaries(points, rows, seq_len)
    return Packing(
        rows=rows,
        kept=kept,
        source=source,
        dest=dest,
        position=position,
        cu_values=cu_values,
        cu_offsets=cu_offsets,
    )
