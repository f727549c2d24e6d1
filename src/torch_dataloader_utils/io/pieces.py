"""Reading a :class:`~torch_dataloader_utils.plan.pieces.Piece`: a chunk, part of one, a window, a mix.

A window's chunks are read into one table and its rows taken in the piece's seeded
permutation (``row_shuffle_window``). Only the window is held in memory, and a window
continued after a resume is rebuilt from its chunks and key, never from a saved buffer.

A mix's streams are read side by side, one round at a time
(:mod:`~torch_dataloader_utils.plan.mixing`): the round's rows of every stream (slices
of the batches the reader decoded) are taken in the round's order with one ``take``.
Held at once: one round and every stream's current decoded batch
(``MIX_WORKER_READ_ROWS`` rows in DataLoader workers, where the reader can choose). A
mix continued after a resume starts reading at the round of its cursor when row counts
are exact, else at its start, skipping what was emitted.

With helper threads (:mod:`~torch_dataloader_utils.io.helpers`, when the process has
CPUs to spare), each stream of a mix decodes its next batch on a helper while its
current one is taken (readers that declare ``decodes_in_threads``; a stream then holds
one more decoded batch), the 8 streams' first batches are decoded side by side, and
every round (or window) is gathered on a helper as soon as it is read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.batching import with_flag
from torch_dataloader_utils.io.helpers import Helpers
from torch_dataloader_utils.plan.mixing import MixSchedule
from torch_dataloader_utils.plan.pieces import Piece, ReadMode
from torch_dataloader_utils.plan.shuffle import permutation
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo

__all__ = ["MIX_WORKER_READ_ROWS", "Gather", "gathered", "piece_reads", "read_piece"]

MIX_WORKER_READ_ROWS = 32768
"""Rows per decoded batch of a mix's streams in DataLoader workers, for readers that can
choose (``with_read_rows``). With several streams read side by side, half the usual
65,536-row batches measured about 30 % less CPU in workers (fewer fresh large
allocations: less system time) and halve the rows a mix holds; in the main process the
usual size measured about 7 % faster (docs/benchmarks.md, row mixing)."""

ROUND_POOL = pa.system_memory_pool()
"""Where a mix's rounds are gathered: the C library's allocator, not Arrow's default pool.
A mix allocates a round's columns (about 1 MB per 32,768 rows) and frees them a round
later; from Arrow's default pool (mimalloc) that pattern measured twice the system time
and 10 % more wall time per shuffled read. A window's one large gather stays in the
default pool, which measured faster for it (docs/benchmarks.md, row mixing)."""

WINDOW_YIELD_ROWS = 65536
"""Rows per batch a shuffled window is cut into (zero-copy slices of its gather; cut to
``batch_size`` later)."""


def _gather(table: pa.Table, order: np.ndarray, pool: pa.MemoryPool | None = None) -> pa.Table:
    """``table``'s rows in ``order``: one ``take`` into ``pool``, one chunk per column.

    The positions are checked once here rather than by Arrow for every column: its
    check measured a third of the gather's time (docs/benchmarks.md, row mixing).
    """
    if len(order) and (int(order.min()) < 0 or int(order.max()) >= table.num_rows):
        raise IndexError(f"gather positions outside 0..{table.num_rows - 1}")
    taken = pc.take(table, pa.array(order), boundscheck=False, memory_pool=pool)
    return taken.combine_chunks(memory_pool=pool)


class Gather:
    """Rows read but not yet gathered: a mix's round or a shuffled window.

    :func:`read_piece` hands these on instead of gathering them itself. When
    batches are decoded ahead (:mod:`~torch_dataloader_utils.io.ahead`), the gather is
    done by whichever thread is free first: the converting thread when it reaches the
    item, or the reading thread while it waits for room ahead (:meth:`prepare`). Both
    costs then overlap instead of adding up in one thread.

    Args:
        table: The rows read (zero-copy slices of the decoded batches).
        order: Which rows of ``table``, in which order, are gathered.
        spans: ``(offset, length)`` ranges of the gathered rows, in emission order.
        pool: The memory pool the gather allocates from (``None``: Arrow's default).
        max_rows: Rows per batch at most.
    """

    __slots__ = ("_lock", "_taken", "max_rows", "order", "pool", "spans", "table")

    def __init__(
        self,
        table: pa.Table,
        order: np.ndarray,
        spans: tuple[tuple[int, int], ...],
        pool: pa.MemoryPool | None = None,
        max_rows: int | None = None,
    ) -> None:
        self.table: pa.Table | None = table
        self.order = order
        self.spans = spans
        self.pool = pool
        self.max_rows = max_rows
        self._taken: pa.Table | None = None
        self._lock = threading.Lock()

    def prepare(self) -> bool:
        """Gather now, unless done or under way in another thread: whether this call gathered."""
        if self._taken is not None or not self._lock.acquire(blocking=False):
            return False
        try:
            return self._fill()
        finally:
            self._lock.release()

    def _fill(self) -> bool:
        """Gather, under the lock, unless done: whether this call gathered."""
        if self._taken is not None or self.table is None:
            return False
        self._taken = _gather(self.table, self.order, self.pool)
        self.table = None  # the read rows are no longer needed
        return True

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The gathered rows (gathered here unless already done), the spans as zero-copy batches."""
        with self._lock:
            self._fill()
            taken = self._taken
        if taken is None:
            raise RuntimeError("a Gather's batches were taken twice")
        self._taken = None
        for offset, length in self.spans:
            if length:
                yield from taken.slice(offset, length).to_batches(max_chunksize=self.max_rows)


def gathered(items: Iterable[pa.RecordBatch | Gather]) -> Iterator[pa.RecordBatch]:
    """The batches of :func:`read_piece`'s ``items``, each :class:`Gather` gathered in turn."""
    for item in items:
        if isinstance(item, Gather):
            yield from item.batches()
        else:
            yield item


def read_piece(
    reader: ChunkReader,
    piece: Piece,
    *,
    flag_column: str | None = None,
    batch_size: int = 65536,
    files: Mapping[str, FileInfo] | None = None,
    mix_read_rows: int | None = None,
    helpers: Helpers | None = None,
) -> Iterator[pa.RecordBatch | Gather]:
    """A piece's rows in its emission order, restricted to ``[lo, hi)``, as items.

    Batches, and the shuffles' rows as :class:`Gather` items, gathered by whoever
    takes them (a helper thread first, when there are ``helpers``).

    Args:
        reader: Reads one chunk.
        piece: What to read.
        flag_column: When set, a boolean column of that name marks each chunk's
            ``padding`` (``equal_batches='pad'``).
        batch_size: The loader's batch size: a window's rows are cut into batches of
            ``max(batch_size, WINDOW_YIELD_ROWS)`` rows.
        files: The files by path, given when row counts are exact (no uncounted row
            filter): a continued mix then starts reading at its cursor's round.
        mix_read_rows: Rows per decoded batch of a mix's streams, for readers that can
            choose (``with_read_rows``); ``None`` keeps the reader's own size.
        helpers: Threads of this process with time to spare: they decode a mix's
            streams ahead and gather its rounds (see the module).
    """

    def chunk_batches(index: int) -> Iterator[pa.RecordBatch]:
        chunk = piece.chunks[index]
        batches = reader.read(chunk)
        return with_flag(batches, flag_column, chunk.padding) if flag_column else batches

    if piece.mode is ReadMode.MIX:
        if mix_read_rows is not None:
            reader = reader.with_read_rows(mix_read_rows)
        yield from _read_mix(reader, piece, flag_column, files, helpers)
        return
    if piece.mode is ReadMode.FILE:
        yield from _rows_between(chunk_batches(0), piece.lo, piece.hi)
        return
    parts = [b for i in range(len(piece.chunks)) for b in chunk_batches(i) if b.num_rows]
    if not parts:
        return
    table = pa.Table.from_batches(parts)  # take() gathers across chunks: no concatenation copy
    key = piece.key or (0, 0)  # a window: its permutation key
    order = permutation(table.num_rows, key[0], key[1], *key[2:])
    order = order[piece.lo : piece.hi]
    if not len(order):
        return
    order = order.astype(np.int64, copy=False)
    yield _handed(
        Gather(table, order, ((0, len(order)),), max_rows=max(batch_size, WINDOW_YIELD_ROWS)), helpers
    )


def _handed(gather: Gather, helpers: Helpers | None) -> Gather:
    """``gather``, its gather started on a helper thread when there is one."""
    if helpers is not None:
        helpers.submit(gather.prepare)
    return gather


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


def _schedule(piece: Piece) -> MixSchedule:
    if piece.mix is None or piece.key is None:
        raise TypeError("not a mix")
    return MixSchedule([c.weight for c in piece.chunks], piece.mix.rows, piece.key)


def _start(piece: Piece, schedule: MixSchedule, files: Mapping[str, FileInfo] | None) -> tuple[int, int]:
    """``(round, its first emitted position)`` where reading a mix starts."""
    counts = [c.num_rows for c in piece.chunks]
    if (
        files is None
        or piece.lo == 0
        or any(c.unit is not ChunkUnit.ROWS or c.num_rows is None for c in piece.chunks)
    ):
        return 0, 0
    return schedule.round_at(piece.lo, [int(n or 0) for n in counts])


def _stream_chunks(
    piece: Piece, schedule: MixSchedule, index: int, files: Mapping[str, FileInfo] | None
) -> list[Chunk | None]:
    """The chunk each stream of a mix reads from round ``index`` on (``None``: nothing left)."""
    if index == 0 or files is None:
        return list(piece.chunks)
    out: list[Chunk | None] = []
    for chunk, section in zip(piece.chunks, schedule.sections, strict=True):
        n, skip = chunk.num_rows or 0, int(section) * index
        if skip >= n:
            out.append(None)
        else:
            edge = files[chunk.path].stop_after(chunk.start, skip)
            out.append(Chunk(chunk.path, edge, chunk.stop, ChunkUnit.ROWS, n - skip, 0, chunk.padding))
    return out


def piece_reads(piece: Piece, files: Mapping[str, FileInfo] | None = None) -> list[Chunk]:
    """The chunks reading ``piece`` opens, in the order it opens them (for remote read-ahead)."""
    if piece.mode is not ReadMode.MIX:
        return list(piece.chunks)
    schedule = _schedule(piece)
    index, _ = _start(piece, schedule, files)
    return [c for c in _stream_chunks(piece, schedule, index, files) if c is not None]


def _advance(batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch | None:
    return next(batches, None)


class _Stream:
    """One stream of a mix: its decoded batches, handed out a section at a time.

    With ``helpers``, the next batch is always being decoded on a helper thread (one
    decode in flight per stream, so the stream's iterator never runs in two threads).
    """

    def __init__(self, batches: Iterator[pa.RecordBatch] | None, helpers: Helpers | None = None) -> None:
        self._batches = batches
        self._current: pa.RecordBatch | None = None
        self._offset = 0
        self._helpers = helpers
        self._next: Future[pa.RecordBatch | None] | None = None
        if helpers is not None and batches is not None:
            self._next = helpers.submit(_advance, batches)

    def _pull(self) -> pa.RecordBatch | None:
        """The stream's next decoded batch (``None`` at its end), starting the one after."""
        batches = self._batches
        if batches is None:
            return None
        if self._next is None:
            return next(batches, None)
        batch = self._next.result()
        self._next = (
            None if batch is None or self._helpers is None else self._helpers.submit(_advance, batches)
        )
        return batch

    def close(self) -> None:
        """Stop: wait for a decode in flight, then close the stream's iterator."""
        pending, self._next = self._next, None
        if pending is not None and not pending.cancel():
            pending.exception()  # let it finish; its error (if any) is not this caller's
        batches, self._batches = self._batches, None
        close = getattr(batches, "close", None)
        if close is not None:
            close()

    def take(self, rows: int, out: list[pa.RecordBatch]) -> int:
        """Append up to ``rows`` next rows to ``out`` (zero-copy slices); returns how many."""
        got = 0
        while got < rows:
            if self._current is None or self._offset >= self._current.num_rows:
                if self._batches is None:
                    break
                self._current = self._pull()
                self._offset = 0
                if self._current is None:
                    self._batches = None
                    break
                continue
            n = min(rows - got, self._current.num_rows - self._offset)
            out.append(self._current.slice(self._offset, n))
            self._offset += n
            got += n
        return got


def _read_mix(
    reader: ChunkReader,
    piece: Piece,
    flag_column: str | None,
    files: Mapping[str, FileInfo] | None,
    helpers: Helpers | None = None,
) -> Iterator[Gather]:
    schedule = _schedule(piece)
    index, emitted = _start(piece, schedule, files)
    decoders = helpers if getattr(reader, "decodes_in_threads", False) else None
    if decoders is not None:
        reader = reader.for_threads()  # type: ignore[attr-defined]

    def open_stream(chunk: Chunk | None) -> _Stream:
        if chunk is None:
            return _Stream(None)
        batches = reader.read(chunk)
        return _Stream(with_flag(batches, flag_column, chunk.padding) if flag_column else batches, decoders)

    streams = [open_stream(c) for c in _stream_chunks(piece, schedule, index, files)]
    sections = [int(n) for n in schedule.sections]
    lo, hi = piece.lo, piece.hi
    try:
        while hi is None or emitted < hi:
            parts: list[pa.RecordBatch] = []
            lengths = [stream.take(n, parts) for stream, n in zip(streams, sections, strict=True)]
            size = sum(lengths)
            if not size:
                return
            start, stop = max(lo - emitted, 0), size if hi is None else min(size, hi - emitted)
            if start < stop:
                yield _handed(_round(parts, *schedule.rotation(index, lengths), start, stop), helpers)
            emitted += size
            index += 1
    finally:
        for stream in streams:
            stream.close()


def _round(parts: list[pa.RecordBatch], base: np.ndarray, shift: int, start: int, stop: int) -> Gather:
    """Rows ``[start, stop)`` of a round that emits ``base[shift:] + base[:shift]`` of its pool.

    The pool (the streams' slices) is gathered once in ``base`` order, one ``take``
    across the slices; the rotation is two zero-copy slices of the result, so the
    caller cuts ``batch_size`` batches without copying (but at the two seams).
    """
    size = len(base)
    table = pa.Table.from_batches(parts)
    if start == 0 and stop == size:
        return Gather(table, base, ((shift, size - shift), (0, shift)), ROUND_POOL)
    # a partly read round (resume, equal-batch cut): gather only its rows
    wanted = np.concatenate((base[shift:], base[:shift]))[start:stop]
    return Gather(table, wanted, ((0, stop - start),), ROUND_POOL)
