"""Reading a worker's pieces and handing its batches over: positions, tags, groups.

Every batch a worker yields carries its position in the worker's plan, so the main
process can record exactly what the training loop consumed (:mod:`.state`):
``(token, worker, workers, piece, offset, rows, nbytes)`` — after this batch, the
worker's first ``piece`` pieces and the first ``offset`` rows of piece ``piece`` have
been yielded; the batch itself holds ``rows`` rows of ``nbytes`` Arrow bytes (counted
by :mod:`.metrics`).

Rows of units that did not decode (``on_bad_data='skip'``) arrive from the readers as
stand-ins flagged in a column (:mod:`~torch_dataloader_utils.io.bad`). Unless they go on
to the loop as padding (``equal_batches='pad'``), :meth:`Positions.read` removes them
and counts them as read: positions stay those of the plan, so a resumed epoch starts at
the same row and meets the same skipped units past its cursor only.

Under the loader of ``create_dataloader``, a worker sends several batches per transfer
(:func:`grouped`), since every hand-off between processes has a fixed cost. Each group
also carries the worker's timers and counters since the previous one (:mod:`.workstats`);
after its last group a worker sends one more item, with no batch, holding the rest.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.io.ahead import read_ahead
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.helpers import Helpers
from torch_dataloader_utils.io.pieces import Gather, gathered, read_piece
from torch_dataloader_utils.plan import lineage
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.types import FileInfo
from torch_dataloader_utils.runtime.state import Tagged
from torch_dataloader_utils.runtime.workstats import WorkStats
from torch_dataloader_utils.transfer import BatchGroup, SegmentWriter, pack_group

__all__ = [
    "FIRST_GROUP_BATCHES",
    "GROUP_BYTES",
    "GROUP_MAX_BATCHES",
    "ArrowBytes",
    "Positions",
    "group_cap",
    "grouped",
]

GROUP_BYTES = 32 << 20
"""A worker under ``create_dataloader``'s loader sends batches in groups of about this size.

A group's size is counted in batches, never in bytes (the loop's order of batches would
then depend on the data, and a training ledger could not replay a step without reading
every batch before it): the main process sets the batches of a full group at the start
of each pass (:func:`group_cap`) from the bytes per row it has received so far, or the
files' bytes per row before the first batch, and every worker follows it.

Every hand-off between a worker and the main process has a fixed cost (queue, pickle,
waking a process and two threads, a shared-memory segment): about 0.5-0.7 ms of the
main process's CPU on the project's 2-core machine, whatever the group's size; with
small batches it dominates, so batches travel several to a transfer. 8 MiB groups left
that cost at about 0.07 s per GB delivered; 32 MiB at a quarter of it (``bench_receive``
in docs/benchmarks.md). In flight at once: about ``(prefetch_factor + 1) * num_workers``
groups, each in a worker's shared-memory segment (see ``runtime.loader.SPARE_SEGMENTS``).
"""

GROUP_MAX_BATCHES = 1024
"""At most this many batches per group."""

FIRST_GROUP_BATCHES = lineage.FIRST_GROUP_BATCHES
"""A worker's first group holds this many batches; each next one twice as many, up to
the pass's :func:`group_cap`. So the first batch of an epoch leaves a worker as soon as
it is read (the loop can start), and later groups are large (few hand-offs)."""


def group_cap(bytes_per_row: float, batch_size: int) -> int:
    """Batches in a full group: about ``GROUP_BYTES`` of them (1 to ``GROUP_MAX_BATCHES``)."""
    per_batch = max(1.0, bytes_per_row * batch_size)
    return int(max(1, min(GROUP_MAX_BATCHES, GROUP_BYTES // per_batch)))


Tag = tuple[int, int, int, int, int, int, int]

log = logging.getLogger(__name__)


class Positions:
    """The rows read from a worker's pieces, so each yielded batch gets its position.

    With DEBUG logging on, every piece read is logged (rank, worker, chunks, rows, time).

    Args:
        token: The live resume state's token (0: none), part of every tag.
        worker: This worker's id.
        workers: Workers reading this epoch.
        rank: This rank (for the DEBUG records).
    """

    def __init__(self, token: int, worker: int, workers: int, rank: int = 0) -> None:
        self._prefix = (token, worker, workers)
        self.worker = worker
        self.rank = rank
        self._starts: list[int] = []
        self._read = 0  # rows of the plan read, stand-ins removed included
        self._emitted = 0
        self._good = 0  # rows read that are not removed stand-ins
        self._skip_at: list[int] = []  # good rows read before each run of removed stand-ins
        self._skipped: list[int] = []  # removed stand-ins up to and including each run
        self._removed: list[tuple[int, int]] = []  # (planned position, rows) removed, not yet taken

    def read(
        self,
        reader: ChunkReader,
        pieces: Sequence[Piece],
        flag_column: str | None,
        batch_size: int,
        files: Mapping[str, FileInfo] | None = None,
        mix_read_rows: int | None = None,
        ahead: bool = False,
        standins: str | None = None,
        helpers: Helpers | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The pieces' batches, in order, counting the rows read before each piece.

        ``standins``: the flag column marking stand-in rows to remove (and the column
        itself), or ``None`` (nothing removed).

        ``files`` (given when row counts are exact) and ``mix_read_rows``: see
        :func:`~torch_dataloader_utils.io.pieces.read_piece`. With ``ahead``, the pieces
        are read by a background thread a few items ahead of the caller
        (:func:`~torch_dataloader_utils.io.ahead.read_ahead`), and each of the shuffles'
        gathers (:class:`~torch_dataloader_utils.io.pieces.Gather`) is done by whichever
        thread is free first. The rows are counted as the caller takes them, so the tags
        are the same either way. ``helpers``: threads with time to spare, which decode a
        mix's streams ahead and gather the shuffles' rows as soon as they are read
        (:mod:`~torch_dataloader_utils.io.helpers`); the order is the same.
        """
        debug = log.isEnabledFor(logging.DEBUG)

        def produce() -> Iterator[tuple[int, pa.RecordBatch | Gather]]:
            for index, piece in enumerate(pieces):
                items = read_piece(
                    reader,
                    piece,
                    flag_column=flag_column,
                    batch_size=batch_size,
                    files=files,
                    mix_read_rows=mix_read_rows,
                    helpers=helpers,
                )
                for item in items:
                    yield index, item

        began = time.perf_counter() if debug else 0.0

        def reach(index: int) -> None:
            """Count pieces up to ``index`` as begun (pieces with no rows too)."""
            nonlocal began
            while len(self._starts) <= index:
                if debug and self._starts:
                    self._log_piece(pieces, began)
                    began = time.perf_counter()
                self._starts.append(self._read)

        items = (
            read_ahead(produce(), name=f"read-ahead-w{self.worker}", prepare=_prepare) if ahead else produce()
        )
        for index, item in items:
            reach(index)
            for batch in gathered((item,)):
                self._read += batch.num_rows
                if standins is not None:
                    batch = self._without_standins(batch, standins)
                    if not batch.num_rows:
                        continue
                yield batch
        reach(len(pieces) - 1)
        if debug and pieces:
            self._log_piece(pieces, began)

    def _log_piece(self, pieces: Sequence[Piece], began: float) -> None:
        """The DEBUG record of the last piece begun, once it is read."""
        index = len(self._starts) - 1
        log.debug(
            "rank %d worker %d read piece %d: %s, %d rows in %.3f s",
            self.rank,
            self.worker,
            index,
            _describe(pieces[index]),
            self._read - self._starts[index],
            time.perf_counter() - began,
        )

    def _without_standins(self, batch: pa.RecordBatch, column: str) -> pa.RecordBatch:
        """``batch`` without its stand-in rows and their flag column; the removed rows noted."""
        flag = batch.column(column)
        kept = batch.drop_columns([column])
        removed = int(pc.sum(flag).as_py() or 0)
        if not removed:
            self._good += batch.num_rows
            return kept
        # Each run of stand-ins is noted at the good rows before it, so a tag counts it
        # once the loop has received a good row after it (positions stay the plan's).
        mask = flag.to_numpy(zero_copy_only=False)
        edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
        first = self._read - batch.num_rows  # the batch's planned position
        self._removed.extend(
            (first + int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2], strict=True)
        )
        for start, stop in zip(edges[::2], edges[1::2], strict=True):
            good_before = self._good + int(start) - int(mask[:start].sum())
            total = (self._skipped[-1] if self._skipped else 0) + int(stop - start)
            if self._skip_at and self._skip_at[-1] == good_before:
                self._skipped[-1] = total
            else:
                self._skip_at.append(good_before)
                self._skipped.append(total)
        self._good += batch.num_rows - removed
        return kept.filter(pc.invert(flag))

    def take_removed(self) -> tuple[tuple[int, int], ...]:
        """The ``(planned position, rows)`` runs removed since the last call (the ledger's skip records)."""
        if not self._removed:
            return ()
        out, self._removed = tuple(self._removed), []
        return out

    def tag(self, rows: int, nbytes: int = 0) -> Tag:
        """The position after a yielded batch of ``rows`` rows (and ``nbytes`` Arrow bytes)."""
        self._emitted += rows
        planned = self._emitted
        if self._skip_at:  # stand-ins removed before the last good row of this batch
            runs = bisect.bisect_left(self._skip_at, self._emitted)
            if runs:
                planned += self._skipped[runs - 1]
        index = bisect.bisect_right(self._starts, planned) - 1
        return (*self._prefix, index, planned - self._starts[index], rows, nbytes)


def _prepare(item: tuple[int, pa.RecordBatch | Gather]) -> bool:
    """The read-ahead thread's work while it waits: a queued shuffle's gather."""
    return isinstance(item[1], Gather) and item[1].prepare()


def _describe(piece: Piece) -> str:
    chunks = piece.chunks
    first = chunks[0]
    text = f"{first.path}[{first.start}:{first.stop})"
    if len(chunks) > 1:
        text += f" and {len(chunks) - 1} more chunks (a shuffle window)"
    if piece.lo or piece.hi is not None:
        text += f" rows [{piece.lo}:{'' if piece.hi is None else piece.hi})"
    return text


class ArrowBytes:
    """The Arrow bytes of each batch of a stream: measured now and then, estimated between.

    pyarrow's ``RecordBatch.nbytes`` walks every buffer of every column: about 17 us for
    a 10-column batch (pyarrow 26, the project's machine), as much as the rest of a
    1,024-row batch's way through the loader. The bytes feed the metrics and the size of
    worker groups, for which a per-row estimate is enough: every ``EVERY``-th batch is
    measured, and the batches between are counted at that batch's bytes per row.
    """

    EVERY = 16

    def __init__(self) -> None:
        self._count = 0
        self._per_row = 0.0

    def __call__(self, batch: pa.RecordBatch) -> int:
        """The bytes of ``batch`` (measured or estimated)."""
        rows = batch.num_rows
        count = self._count
        self._count = count + 1
        if count % self.EVERY == 0 or not self._per_row:
            nbytes = int(batch.nbytes)
            if rows:
                self._per_row = nbytes / rows
            return nbytes
        return int(rows * self._per_row)


def grouped(
    batches: Iterator[pa.RecordBatch],
    convert: Callable[[pa.RecordBatch], Any],
    positions: Positions,
    work: WorkStats,
    pool: SegmentWriter | None = None,
    cap: int = GROUP_MAX_BATCHES,
) -> Iterator[Tagged]:
    """Worker side: tagged batches sent in groups of 1, 2, 4, ... batches, at most ``cap``.

    A group is one :class:`Tagged` whose batch is a packed ``BatchGroup``, whose tag
    is the tuple of the batches' tags and whose ``work`` is what ``work`` counted since
    the previous group; the loader yields the batches one by one. The first groups are
    small (``FIRST_GROUP_BATCHES``, doubling), so the loop gets its first batch without
    waiting for a full group; ``cap`` (:func:`group_cap`) keeps a full group near
    ``GROUP_BYTES``. Group sizes depend on counts only, so the order in which the loop
    meets the workers' batches is a pure function of their batch counts and ``cap``
    (:class:`~torch_dataloader_utils.plan.lineage.Delivery`). After the last group an
    item with an empty group carries the rest of ``work``. Batches made before an error
    still arrive before the error. ``pool``: this worker's segments of the loader's
    :class:`~torch_dataloader_utils.transfer.SegmentPool`.
    """
    pending: list[Any] = []
    tags: list[Tag] = []
    clock = time.perf_counter
    worker = positions.worker
    most = min(FIRST_GROUP_BATCHES, cap)
    measure = ArrowBytes()

    def send() -> Tagged:
        began = clock()
        packed = pack_group(pending, pool)
        work.transfer_sec += clock() - began
        work_delta = (worker, work.delta(), work.files_delta())
        return Tagged(packed, tuple(tags), work_delta, positions.take_removed())  # type: ignore[arg-type]

    try:
        asked = clock()
        for batch in batches:
            got = clock()
            work.read_sec += got - asked
            work.count_padding(batch)
            pending.append(convert(batch))
            tags.append(positions.tag(batch.num_rows, measure(batch)))
            asked = clock()
            work.convert_sec += asked - got
            if len(pending) >= most:
                yield send()
                pending, tags = [], []
                most = min(2 * most, cap)
                asked = clock()
    except Exception:
        if pending:
            yield send()
        raise
    if pending:
        yield send()
    rest = work.delta()
    files = work.files_delta()
    removed = positions.take_removed()
    if any(rest) or files or removed:
        yield Tagged(BatchGroup(), (), (worker, rest, files), removed)
