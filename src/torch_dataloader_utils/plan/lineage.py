"""Lineage: which planned rows make batch ``k`` of a pass, computed from the plan alone.

A pass is read by ``W`` reading processes (DataLoader workers, or the main process).
Each reads its :class:`~.pieces.Piece` list and yields its rows in the pieces' emission
order (:func:`emission`): a chunk in file order, a window in the permutation of its key,
a mix in the rounds of its :class:`~.mixing.MixSchedule`. Its rows are cut into batches of
``batch_size`` rows, the last one short (or dropped with ``drop_last``). So the rows of a
worker's batch ``j`` are a run of its stream (:class:`WorkerStream`), and which worker's
batch the loop receives at step ``s`` of the pass follows from every worker's batch count
and the hand-off groups' sizes (:class:`Delivery`), both known before reading.

Rows of units that did not decode (``on_bad_data='skip'``, without padding) are removed
from a worker's stream; they are given to :class:`WorkerStream` as *removed runs* of the
planned stream (the ledger records them as they happen), so later batches shift exactly.

Pure: stdlib and numpy only; nothing here reads data or the environment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torch_dataloader_utils.plan.emitted import chunk_rows
from torch_dataloader_utils.plan.mixing import MixSchedule
from torch_dataloader_utils.plan.pieces import Piece, ReadMode
from torch_dataloader_utils.plan.shuffle import permutation
from torch_dataloader_utils.plan.types import ChunkUnit, FileInfo

__all__ = [
    "FIRST_GROUP_BATCHES",
    "Delivery",
    "Span",
    "WorkerStream",
    "emission",
    "positions_of",
    "stream_rows",
]

Ints = np.ndarray[Any, np.dtype[np.int64]]

FIRST_GROUP_BATCHES = 1
"""Batches in a worker's first hand-off group of a pass; each next group holds twice as
many, up to the pass's cap (the same rule as ``runtime.emit.grouped``)."""


def emission(piece: Piece, lo: int | None = None, hi: int | None = None) -> tuple[Ints, Ints]:
    """The rows a piece emits at emission positions ``[lo, hi)`` (default: the piece's own), in order.

    Returns ``(chunk, offset)``: for every emitted row, the index of its chunk in
    ``piece.chunks`` and its offset in that chunk's read stream (the chunk's live rows
    in file order, after deletes and the row filter). ``lo`` and ``hi`` are positions of
    the piece's whole emission order (``piece.lo`` and ``piece.hi`` are one such range).

    Raises:
        ValueError: a chunk's row count is unknown (rows are then known only by reading).
    """
    sizes = _sizes(piece)
    total = int(sizes.sum())
    start = piece.lo if lo is None else lo
    stop = (total if piece.hi is None else min(piece.hi, total)) if hi is None else min(hi, total)
    stop = max(start, stop)
    if piece.mode is ReadMode.FILE:
        pool = np.arange(start, stop, dtype=np.int64)
    elif piece.mode is ReadMode.WINDOW:
        key = piece.key or (0, 0)
        pool = permutation(total, key[0], key[1], *key[2:])[start:stop].astype(np.int64)
    else:
        pool = _mix_pool(piece, sizes, start, stop)
    firsts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    chunk = np.searchsorted(firsts, pool, side="right").astype(np.int64) - 1
    if len(sizes) == 1:
        chunk[:] = 0
    return chunk, pool - firsts[chunk]


def _sizes(piece: Piece) -> Ints:
    rows = [c.num_rows for c in piece.chunks]
    if any(n is None for n in rows):
        raise ValueError(
            f"the rows of {piece.chunks[0].path!r} are not counted: they are known only by reading"
        )
    return np.asarray(rows, dtype=np.int64)


def _mix_pool(piece: Piece, sizes: Ints, start: int, stop: int) -> Ints:
    """Pool positions (the streams one after another) of a mix's emitted rows ``[start, stop)``."""
    if piece.mix is None or piece.key is None or start >= stop:
        return np.empty(0, dtype=np.int64)
    schedule = MixSchedule([c.weight for c in piece.chunks], piece.mix.rows, piece.key)
    counts = [int(n) for n in sizes]
    firsts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    index, before = schedule.round_at(start, counts)
    out: list[Ints] = []
    while before < stop:
        lengths = schedule.round_lengths(index, counts)
        size = int(lengths.sum())
        if not size:
            break
        taken = np.minimum(sizes, schedule.sections * index)
        pool = np.concatenate(
            [np.arange(n, dtype=np.int64) + firsts[c] + taken[c] for c, n in enumerate(lengths) if n]
        )
        rows = pool[schedule.order(index, lengths)]
        out.append(rows[max(0, start - before) : stop - before])
        before += size
        index += 1
    return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def positions_of(piece: Piece, chunk: int, offsets: Ints) -> Ints:
    """The emission positions (of the piece's whole order) of rows ``offsets`` of chunk ``chunk``.

    The inverse of :func:`emission`, computed for those rows only: a window's permutation,
    or the rounds of a mix that hold them.

    Raises:
        ValueError: a chunk's row count is unknown.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = _sizes(piece)
    firsts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    if piece.mode is ReadMode.FILE:
        return offsets
    if piece.mode is ReadMode.WINDOW:
        key = piece.key or (0, 0)
        order = permutation(int(sizes.sum()), key[0], key[1], *key[2:])
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.arange(len(order), dtype=np.int64)
        return inverse[firsts[chunk] + offsets]  # type: ignore[no-any-return]
    if piece.mix is None or piece.key is None:
        raise TypeError("not a mix")
    schedule = MixSchedule([c.weight for c in piece.chunks], piece.mix.rows, piece.key)
    section = int(schedule.sections[chunk])
    out = np.empty(len(offsets), dtype=np.int64)
    rounds = offsets // max(1, section)
    counts = [int(n) for n in sizes]
    for r in np.unique(rounds).tolist():
        lengths = schedule.round_lengths(r, counts)
        order = schedule.order(r, lengths)
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.arange(len(order), dtype=np.int64)
        before = int(np.minimum(sizes, schedule.sections * r).sum())
        mine = rounds == r
        pool = int(lengths[:chunk].sum()) + offsets[mine] - section * r
        out[mine] = before + inverse[pool]
    return out


def stream_rows(chunk_index: Ints, offsets: Ints, piece: Piece, files: Mapping[str, FileInfo]) -> Ints:
    """File row positions of emitted rows (``(chunk, offset)`` of :func:`emission`); ``-1`` where unknown.

    Known for chunks counted in rows (Parquet row groups, ORC stripes, Iceberg data
    files): the chunk's live rows in file order. A byte range's rows are its records,
    counted from the range's first record: ``-1`` (its offset says which).
    """
    out = np.full(len(offsets), -1, dtype=np.int64)
    for c, chunk in enumerate(piece.chunks):
        mask = chunk_index == c
        if not mask.any() or chunk.unit is not ChunkUnit.ROWS:
            continue
        rows = chunk_rows(chunk, files[chunk.path])
        wanted = offsets[mask]
        inside = wanted < len(rows)
        picked = np.full(len(wanted), -1, dtype=np.int64)
        picked[inside] = rows[wanted[inside]]
        out[mask] = picked
    return out


@dataclass(frozen=True, slots=True)
class Span:
    """A run of one piece's emitted rows: positions ``[lo, hi)`` of the piece's emission order.

    Attributes:
        piece: Index of the piece in the worker's list.
        lo: First emission position (of the piece's whole order, as ``Piece.lo``).
        hi: One past the last.
    """

    piece: int
    lo: int
    hi: int


class WorkerStream:
    """One reading process's rows in a pass: its pieces one after another, cut into batches.

    Args:
        pieces: The pieces it reads, in order (after the pass's start state).
        batch_size: Rows per batch.
        drop_last: Its last, short batch is dropped.
        removed: ``(planned position, rows)`` runs of its planned stream that were removed
            (stand-ins of skipped units), sorted by position.

    Raises:
        ValueError: a piece's row count is unknown.
    """

    def __init__(
        self,
        pieces: Sequence[Piece],
        batch_size: int,
        drop_last: bool,
        removed: Sequence[tuple[int, int]] = (),
    ) -> None:
        rows = [p.num_rows for p in pieces]
        if any(n is None for n in rows):
            raise ValueError("a piece's row count is unknown: its batches are known only by reading")
        self.pieces = tuple(pieces)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._starts = np.concatenate(([0], np.cumsum([int(n or 0) for n in rows]))).astype(np.int64)
        runs = sorted((int(a), int(n)) for a, n in removed if n > 0)
        self._run_at = np.asarray([a for a, _ in runs], dtype=np.int64)
        self._run_rows = np.asarray([n for _, n in runs], dtype=np.int64)
        self.planned_rows = int(self._starts[-1])
        self.rows = self.planned_rows - int(self._run_rows.sum())

    @property
    def num_batches(self) -> int:
        """Batches it yields."""
        full, rest = divmod(self.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def planned(self, good: int) -> int:
        """The planned position of the ``good``-th kept row (removed runs skipped)."""
        at = good
        for start, rows in zip(self._run_at.tolist(), self._run_rows.tolist(), strict=True):
            if start <= at:
                at += rows
            else:
                break
        return at

    def batch(self, index: int) -> list[Span]:
        """The spans of batch ``index`` of this worker, in order.

        Raises:
            IndexError: it yields fewer batches.
        """
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} of a worker that yields {self.num_batches}")
        first = index * self.batch_size
        last = min(first + self.batch_size, self.rows)
        return self.spans(first, last)

    def spans(self, first: int, last: int) -> list[Span]:
        """The spans holding kept rows ``[first, last)`` of the stream."""
        out: list[Span] = []
        runs = [(int(a), int(a + n)) for a, n in zip(self._run_at, self._run_rows, strict=True)]
        a, b = self.planned(first), self.planned(last - 1) + 1 if last > first else self.planned(first)
        cuts = [a]
        for lo, hi in runs:  # a removed run inside the range splits it
            if a < lo < b:
                cuts.extend((lo, hi))
        cuts.append(b)
        for lo, hi in zip(cuts[::2], cuts[1::2], strict=True):
            out.extend(self._piece_spans(lo, hi))
        return out

    def _piece_spans(self, lo: int, hi: int) -> list[Span]:
        out: list[Span] = []
        starts = self._starts
        p = int(np.searchsorted(starts, lo, side="right")) - 1
        while lo < hi and p < len(self.pieces):
            end = min(hi, int(starts[p + 1]))
            if end > lo:
                base = self.pieces[p].lo - int(starts[p])
                out.append(Span(p, lo + base, end + base))
            lo = end
            p += 1
        return out

    def position(self, piece: int, offset: int) -> int | None:
        """Kept-row position of emission position ``offset`` of piece ``piece`` (``None``: removed)."""
        planned = int(self._starts[piece]) + offset - self.pieces[piece].lo
        before = 0
        for start, rows in zip(self._run_at.tolist(), self._run_rows.tolist(), strict=True):
            if planned >= start + rows:
                before += rows
            elif planned >= start:
                return None
        return planned - before


class Delivery:
    """Which worker's batch the loop receives at every step of a pass.

    Each worker sends its batches in groups: ``FIRST_GROUP_BATCHES``, twice as many in the
    next, up to ``cap`` (every group after that). The DataLoader takes one group of every
    worker in turn (a worker that has sent all its batches drops out), so step ``s`` is a
    pure function of every worker's batch count and ``cap``.

    Args:
        batches: Every worker's batch count in the pass.
        cap: The most batches in a group (``None``: one stream, no workers).
    """

    def __init__(self, batches: Sequence[int], cap: int | None) -> None:
        self.batches = np.asarray(batches, dtype=np.int64)
        self.total = int(self.batches.sum())
        self.cap = cap
        if len(self.batches) > 1 and (cap is None or cap < 1):
            raise ValueError(f"several workers' batches need a group cap >= 1, got {cap}")
        if cap is None or len(self.batches) <= 1:
            self._before = np.zeros(1, dtype=np.int64)
            self._size = np.asarray([max(1, int(self.batches.max(initial=0)))], dtype=np.int64)
            return
        most = int(self.batches.max(initial=0))
        sizes: list[int] = []
        size, held = FIRST_GROUP_BATCHES, 0
        while held < most and size < cap:
            sizes.append(size)
            held += size
            size *= 2
        if held < most:
            sizes.extend([cap] * (-(-(most - held) // cap)))
        self._size = np.asarray(sizes or [1], dtype=np.int64)
        self._before = np.concatenate(([0], np.cumsum(self._size)[:-1])).astype(np.int64)

    def _steps_before(self, rounds: Ints) -> Ints:
        """Steps before round ``r`` (every worker's groups of the earlier rounds), per ``r``."""
        before = self._before[rounds]
        return np.minimum(self.batches[None, :], before[:, None]).sum(axis=1)  # type: ignore[no-any-return]

    def locate(self, step: int) -> tuple[int, int]:
        """``(worker, its batch index)`` of step ``step`` of the pass.

        Raises:
            IndexError: the pass has fewer steps.
        """
        if not 0 <= step < self.total:
            raise IndexError(f"step {step} of a pass of {self.total} batches")
        if len(self.batches) == 1:
            return 0, step
        rounds = np.arange(len(self._size), dtype=np.int64)
        before = self._steps_before(rounds)
        r = int(np.searchsorted(before, step, side="right")) - 1
        left = step - int(before[r])
        first = int(self._before[r])
        for worker, count in enumerate(self.batches.tolist()):
            size = min(max(count - first, 0), int(self._size[r]))
            if left < size:
                return worker, first + left
            left -= size
        raise AssertionError("unreachable: the rounds hold every step")

    def step_of(self, worker: int, index: int) -> int:
        """The step of the pass at which worker ``worker``'s batch ``index`` is received."""
        if len(self.batches) == 1:
            return index
        r = int(np.searchsorted(self._before, index, side="right")) - 1
        first = int(self._before[r])
        steps = int(self._steps_before(np.asarray([r]))[0])
        for w in range(worker):
            steps += min(max(int(self.batches[w]) - first, 0), int(self._size[r]))
        return steps + index - first
