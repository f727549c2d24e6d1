"""Row interleaving: the order in which a worker yields the rows of several chunks read side by side.

(Called *row mixing* until 0.7.0, and ``row_mixing`` is still taken for ``row_interleave``:
a *mix* is now always one of sources, :mod:`.blend`.)

With ``shuffle=True`` a worker does not read its chunks one after the other: it reads a
*mix* of up to ``streams`` chunks (or parts of chunks) side by side and yields their
rows in *rounds*. A round takes the next ``sections[c]`` rows of every stream ``c``
(shares proportional to the streams' sizes, about ``rows`` rows in all) and yields them
in a seeded permutation. So every batch draws rows from all the streams of the mix
(chunks of different files, after the chunk shuffle), and the rows held at once are
one round plus the streams' read buffers, whatever the chunk sizes.

The emission order is a pure function of the streams' row counts, ``rows`` and the
mix's key ``(seed, epoch, segment, rank, worker, mix)``: one permutation of a full
round is drawn per mix and each round uses it rotated by a per-round offset (drawing a
new permutation per round would cost more than reading the rows). A round that some
streams can no longer fill keeps the permutation's order of the slots that are
filled. Given exact row counts, where a round starts in every stream is known without
reading, so a resumed mix starts reading at the round of its cursor
(:meth:`MixSchedule.round_at`).

Pure: stdlib and numpy only; nothing here reads data or the environment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from torch_dataloader_utils.plan.shuffle import permutation
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo, RowGroup

__all__ = [
    "DEFAULT_MIX_ROWS",
    "DEFAULT_MIX_STREAMS",
    "ROUND_ROWS_FLOOR",
    "MixSchedule",
    "RowMixing",
    "round_rows",
    "split_streams",
]

DEFAULT_MIX_ROWS = 32768
"""Rows of one round of the default row interleaving (``row_interleave``)."""
DEFAULT_MIX_STREAMS = 8
"""Chunks (or parts of chunks) a worker reads side by side in the default row mixing."""

_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class RowMixing:
    """How a worker interleaves the rows of several chunks (``shuffle=True`` with ``row_interleave``).

    Attributes:
        rows: Rows per round: the rows mixed together and held at once (besides the
            streams' read buffers).
        streams: Chunks, or parts of chunks, read side by side: every batch draws rows
            from up to this many places of the data.
    """

    rows: int = DEFAULT_MIX_ROWS
    streams: int = DEFAULT_MIX_STREAMS

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"rows must be >= 1, got {self.rows}")
        if self.streams < 1:
            raise ValueError(f"streams must be >= 1, got {self.streams}")


def split_streams(chunks: Sequence[Chunk], streams: int, files: Mapping[str, FileInfo]) -> list[Chunk]:
    """``chunks``, with the largest cut at row-group edges until there are ``streams`` of them.

    A worker with fewer chunks than ``streams`` still mixes rows from several places:
    a chunk of many row groups becomes several streams. Only chunks counted in rows
    whose row groups lie wholly inside them are cut, at the row-group edge nearest
    their middle (never inside a group, which would be decoded twice). The streams
    keep the chunks' order; together they hold exactly the chunks' rows.
    """
    out = list(chunks)
    while len(out) < streams:
        best: tuple[int, tuple[Chunk, Chunk]] | None = None
        most = 1
        for i, chunk in enumerate(out):
            groups = _whole_groups(chunk, files)
            if len(groups) > most:
                halves = _cut_at(chunk, files[chunk.path], groups[len(groups) // 2].first_row)
                if halves is not None:
                    best, most = (i, halves), len(groups)
        if best is None:
            break
        i, halves = best
        out[i : i + 1] = list(halves)
    return out


def _whole_groups(chunk: Chunk, files: Mapping[str, FileInfo]) -> tuple[RowGroup, ...]:
    """The chunk's row groups, when it is counted in rows and holds every one of them whole."""
    if chunk.unit is not ChunkUnit.ROWS or not chunk.num_rows:
        return ()
    groups = files[chunk.path].groups_in(chunk.start, chunk.stop)
    if not groups or groups[0].first_row < chunk.start or groups[-1].stop_row > chunk.stop:
        return ()
    return groups


def _cut_at(chunk: Chunk, file: FileInfo, edge: int) -> tuple[Chunk, Chunk] | None:
    """``chunk`` cut at file position ``edge``, or ``None`` when a side would hold no row."""
    total = chunk.num_rows or 0
    rows = file.rows_in(chunk.start, edge)  # live rows (Iceberg: deletes excluded)
    if not 0 < rows < total:
        return None
    head_bytes = chunk.num_bytes * rows // total
    head = replace(chunk, stop=edge, num_rows=rows, num_bytes=head_bytes)
    tail = replace(chunk, start=edge, num_rows=total - rows, num_bytes=chunk.num_bytes - head_bytes)
    return head, tail


ROUND_ROWS_FLOOR = 1 << 20
"""A round is never sized above ``max(the streams' weight, this)`` rows, whatever ``rows`` says.

A round's permutation and the map of a partly filled round take memory for every slot
of the round (about 40 bytes a slot), rows or not: ``row_mixing=10**8`` over 3,000
rows took 4.3 GB, ``10**9`` a ``MemoryError``. Streams of fewer rows than ``rows`` fill
one round anyway, so a smaller round mixes them the same way. Up to this many rows the
round keeps the size asked for, so the orders of 0.4.0 (and the resume states saved
with them) are unchanged for every ``row_mixing`` up to 1,048,576."""


def round_rows(weights: Sequence[int], rows: int) -> int:
    """Rows of a full round of streams of ``weights``: ``rows``, capped by what the streams hold.

    The weights are row counts when known, else byte sizes (at least a byte per row), so
    their sum bounds the rows a round can hold. The cap is at least
    :data:`ROUND_ROWS_FLOOR` (orders of smaller ``rows`` are unchanged) and at least one
    row per stream.
    """
    held = max(sum(int(w) for w in weights), len(weights), ROUND_ROWS_FLOOR)
    return min(rows, held)


def _splitmix(x: int) -> int:
    """splitmix64's finalizer: a well-mixed 64-bit hash of ``x`` (pure integer arithmetic)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _apportion(weights: Sequence[int], rows: int) -> list[int]:
    """``rows`` shared in proportion to ``weights`` (largest remainders), at least 1 each.

    The shares add up to exactly ``rows`` (when ``rows`` is at least the number of
    weights), so full rounds keep batches aligned: a round of a multiple of
    ``batch_size`` rows ends on a batch edge.
    """
    total = sum(weights)
    if total <= 0:
        weights, total = [1] * len(weights), len(weights)
    parts = [divmod(rows * w, total) for w in weights]  # integers: the same on every machine
    shares = [max(1, q) for q, _ in parts]
    left = rows - sum(shares)
    by_remainder = sorted(range(len(weights)), key=lambda i: (-parts[i][1], i))
    for i in by_remainder[: max(0, left)]:
        shares[i] += 1
    while left < 0 and max(shares, default=1) > 1:  # minimum shares of 1 went over: take back
        shares[shares.index(max(shares))] -= 1
        left += 1
    return shares


class MixSchedule:
    """The rounds of one mix: which rows of every stream each round yields, in what order.

    Args:
        weights: Every stream's weight (its row count when known, else its bytes): a
            round takes rows from the streams in proportion to them.
        rows: Rows per round (:attr:`RowMixing.rows`).
        key: The mix's permutation key ``(seed, epoch, ...)``.
    """

    def __init__(self, weights: Sequence[int], rows: int, key: tuple[int, ...]) -> None:
        rows = round_rows(weights, rows)
        self.sections = np.asarray(_apportion(weights, rows), dtype=np.int64)
        """Rows of every stream in a full round."""
        self.size = int(self.sections.sum())
        """Rows of a full round."""
        self._key = key
        self._order: np.ndarray | None = None  # drawn on first use (resume needs only sections)
        base = len(key)
        for value in key:
            base = _splitmix(base ^ value)
        self._base = base

    def _permutation(self) -> np.ndarray:
        if self._order is None:
            key = self._key
            self._order = permutation(self.size, key[0], key[1], *key[2:])
        return self._order

    def _shift(self, index: int) -> int:
        """The rotation of round ``index``: a hash of the mix's key and the round."""
        return _splitmix(self._base ^ (index + 1)) % max(1, self.size)

    def round_lengths(self, index: int, counts: Sequence[int]) -> np.ndarray:
        """Rows every stream gives to round ``index``, when the streams hold ``counts`` rows."""
        first = self.sections * index
        lengths: np.ndarray = np.clip(np.asarray(counts, dtype=np.int64) - first, 0, self.sections)
        return lengths

    def order(self, index: int, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        """Emission order of round ``index`` as positions in its pool.

        The pool is the round's rows stream by stream: ``lengths[c]`` rows of stream
        ``c``, in the stream's order. Returns an int64 array holding each of
        ``0..sum(lengths)-1`` once: ``base[shift:] + base[:shift]`` of :meth:`rotation`.
        """
        base, shift = self.rotation(index, lengths)
        rotated: np.ndarray = np.concatenate((base[shift:], base[:shift])) if shift else base
        return rotated

    def rotation(self, index: int, lengths: Sequence[int] | np.ndarray) -> tuple[np.ndarray, int]:
        """``(base, shift)``: round ``index`` emits ``base[shift:]`` then ``base[:shift]``.

        ``base`` is the mix's permutation of a full round restricted to the slots the
        streams fill (``lengths[c] <= sections[c]`` rows of stream ``c``), mapped to pool
        positions. For a full round it is the permutation itself (no copy), so a reader
        can gather a round once and yield it rotated as two zero-copy slices.
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        shift = self._shift(index)
        order = self._permutation()
        if np.array_equal(lengths, self.sections):
            return order, shift
        # Slot -> position in this round's pool, or -1 for a slot its stream cannot fill.
        starts = np.cumsum(self.sections) - self.sections
        offset = np.arange(self.size, dtype=np.int64) - np.repeat(starts, self.sections)
        pool_starts = np.repeat(np.cumsum(lengths) - lengths, self.sections)
        pool = np.where(offset < np.repeat(lengths, self.sections), offset + pool_starts, -1)
        mapped = pool[order]
        kept: np.ndarray = mapped[mapped >= 0]
        return kept, int(np.count_nonzero(mapped[:shift] >= 0))

    def round_at(self, position: int, counts: Sequence[int]) -> tuple[int, int]:
        """``(round, first position of that round)`` of the round holding emitted row ``position``.

        Needs the streams' exact row counts. A ``position`` at or past the end gives
        the round after the last one.
        """
        counts_ = np.asarray(counts, dtype=np.int64)
        rounds = self.num_rounds(counts_)
        if rounds == 0:
            return 0, 0
        # Rows emitted before round t: sum over streams of min(count, t * section).
        t = np.arange(rounds + 1, dtype=np.int64)
        before = np.minimum(counts_[None, :], t[:, None] * self.sections[None, :]).sum(axis=1)
        r = int(np.searchsorted(before, position, side="right")) - 1
        return r, int(before[r])

    def num_rounds(self, counts: Sequence[int] | np.ndarray) -> int:
        """Rounds needed for streams of ``counts`` rows."""
        counts_ = np.asarray(counts, dtype=np.int64)
        if not len(counts_):
            return 0
        return int(np.max(-(-counts_ // self.sections)))
