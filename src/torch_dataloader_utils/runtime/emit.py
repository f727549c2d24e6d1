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
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.config import PADDING_COLUMN, EqualBatches, OutputConfig, OutputFormat
from torch_dataloader_utils.errors import IncompatibleOptionsError
from torch_dataloader_utils.io.ahead import read_ahead
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.batching import concat_batches
from torch_dataloader_utils.io.helpers import Helpers
from torch_dataloader_utils.io.pieces import ROUND_POOL, Gather, gathered, read_piece
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
    "UNPINNED_GROUP_BYTES",
    "ArrowBytes",
    "BatchCount",
    "BatchParts",
    "Positions",
    "batch_schema",
    "group_cap",
    "grouped",
    "parts_joinable",
    "plain_arrays",
]

GROUP_BYTES = 32 << 20
"""A worker under ``create_dataloader``'s loader sends batches in groups of about this size
into page-locked segments (``pin_memory=True`` or a CUDA ``device=``; otherwise
``UNPINNED_GROUP_BYTES``).

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

UNPINNED_GROUP_BYTES = 8 << 20
"""The groups' size when the segments are not page-locked (the CPU path).

Each worker's segments hold a group each (``SPARE_SEGMENTS`` plus ``prefetch_factor``
of them), so the group size sets most of the memory in flight: with 32 MiB groups a
CPU loader at ``num_workers=2`` peaked at 1.29x 0.5.0's PSS (``compare.py``, S1), with
8 MiB at 0.99x. The hand-offs that the larger groups save (about 0.05 s per GB delivered)
matter where a GPU waits, which is the page-locked path.
"""

GROUP_MAX_BATCHES = 1024
"""At most this many batches per group."""

FIRST_GROUP_BATCHES = lineage.FIRST_GROUP_BATCHES
"""A worker's first group holds this many batches; each next one twice as many, up to
the pass's :func:`group_cap`. So the first batch of an epoch leaves a worker as soon as
it is read (the loop can start), and later groups are large (few hand-offs)."""


def group_cap(bytes_per_row: float, batch_size: int, pinned: bool = False) -> int:
    """Batches in a full group: about ``GROUP_BYTES`` of them (``UNPINNED_GROUP_BYTES`` unless ``pinned``).

    From 1 to ``GROUP_MAX_BATCHES``.
    """
    per_batch = max(1.0, bytes_per_row * batch_size)
    limit = GROUP_BYTES if pinned else UNPINNED_GROUP_BYTES
    return int(max(1, min(GROUP_MAX_BATCHES, limit // per_batch)))


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


class BatchCount:
    """The positions of a reading process whose batches are planned one by one: batches yielded.

    A tag is ``(token, worker, workers, 0, batches yielded, rows, nbytes)``: the cursor
    counts batches (a mix's lane builds every batch from the plan).

    Args:
        token: The live start's token (0: none), part of every tag.
        worker: This worker's id.
        workers: Workers reading this epoch.
        done: Batches of the pass yielded before this reading began (a resumed lane).
    """

    def __init__(self, token: int, worker: int, workers: int, done: int = 0) -> None:
        self._prefix = (token, worker, workers, 0)
        self.worker = worker
        self.done = done

    def tag(self, rows: int, nbytes: int = 0) -> tuple[int, ...]:
        """The position after a yielded batch of ``rows`` rows (and ``nbytes`` Arrow bytes)."""
        self.done += 1
        return (*self._prefix, self.done, rows, nbytes)

    def take_removed(self) -> tuple[tuple[int, int], ...]:
        """Nothing: a planned batch's stand-ins leave that batch only, never shift later ones."""
        return ()


class BatchParts:
    """One batch as its parts (say, each source's rows of a mixed batch), joined only when used.

    ``order``: the batch's rows are the parts' rows, one after the other, taken in this
    order (``None``: as they are). A worker joins them straight into the buffer that
    carries the batch to the main process (one copy, :class:`~torch_dataloader_utils.transfer.JoinedColumn`);
    elsewhere :meth:`joined` makes the Arrow batch. ``extra``: what the batch's tag carries
    after its counts (a mix: the rows of every source, for the metrics). ``views``: every
    part's columns as numpy arrays already (slices of arrays made once per decoded batch),
    ``None`` for a column that is not plain, or ``None`` when not made.
    """

    __slots__ = ("extra", "num_rows", "order", "parts", "views")

    def __init__(
        self,
        parts: list[pa.RecordBatch],
        order: np.ndarray | None = None,
        extra: tuple[int, ...] = (),
        views: list[list[np.ndarray | None]] | None = None,
    ) -> None:
        self.parts = parts
        self.order = order
        self.extra = extra
        self.views = views
        self.num_rows = sum(p.num_rows for p in parts)

    @property
    def nbytes(self) -> int:
        """The Arrow bytes of the parts."""
        return sum(int(p.nbytes) for p in self.parts)

    def column(self, name: str) -> pa.ChunkedArray[Any]:
        """One column of every part (in the parts' order)."""
        return pa.chunked_array(
            [p.column(name) for p in self.parts], type=self.parts[0].schema.field(name).type
        )

    def arrays(self) -> dict[str, list[np.ndarray]] | None:
        """Every column as its parts' numpy arrays, as the torch output holds them (``None``: not all can be).

        Numbers without nulls (zero-copy), booleans, and fixed-size lists of them (``[rows,
        size, ...]``): the columns a worker joins straight into the transfer buffer
        (:class:`~torch_dataloader_utils.transfer.JoinedColumn`); anything else is
        converted as usual, from :meth:`joined`.
        """
        schema = self.parts[0].schema
        if not _plain_schema(schema):
            return None
        out: dict[str, list[np.ndarray]] = {name: [] for name in schema.names}
        lists = list(out.values())
        if self.views is not None:
            for view in self.views:
                for into, array in zip(lists, view, strict=True):
                    if array is None:
                        return None
                    into.append(array)
            return out
        for part in self.parts:
            for into, column in zip(lists, part.columns, strict=True):
                if column.null_count:
                    return None
                into.append(_plain_array(column))
        return out

    def joined(self) -> pa.RecordBatch:
        """The batch as one Arrow record batch (one copy of the rows)."""
        parts = self.parts
        if self.order is None or self.num_rows < 2:
            return concat_batches(parts, memory_pool=ROUND_POOL)
        taken = pc.take(
            pa.Table.from_batches(parts), pa.array(self.order), boundscheck=False, memory_pool=ROUND_POOL
        )
        return taken.combine_chunks(memory_pool=ROUND_POOL).to_batches()[0]


@functools.lru_cache(maxsize=64)
def _plain_schema(schema: pa.Schema) -> bool:
    """Every column is a number, a boolean or a fixed-size list of them (see :meth:`BatchParts.arrays`)."""

    def plain(t: pa.DataType) -> bool:
        if pa.types.is_fixed_size_list(t):
            return plain(t.value_type)
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)

    return all(plain(f.type) for f in schema)


def plain_arrays(batch: pa.RecordBatch) -> list[np.ndarray | None] | None:
    """Every column of ``batch`` as the numpy array the torch output converts it to.

    ``None`` for a column with nulls; ``None`` in all when the schema is not plain (see
    :meth:`BatchParts.arrays`).
    """
    if not _plain_schema(batch.schema):
        return None
    return [None if c.null_count else _plain_array(c) for c in batch.columns]


def _plain_array(column: Any) -> np.ndarray:
    """``column`` (of a plain type, no nulls) as the numpy array the torch output converts it to."""
    t = column.type
    if pa.types.is_fixed_size_list(t):
        inner = _plain_array(column.flatten())
        return inner.reshape(len(column), t.list_size, *inner.shape[1:])
    array: np.ndarray = column.to_numpy(zero_copy_only=not pa.types.is_boolean(t))
    return array


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
    batches: Iterator[Any],
    convert: Callable[[Any], Any],
    positions: Positions | BatchCount,
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
    tags: list[tuple[int, ...]] = []
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
            tag = positions.tag(batch.num_rows, measure(batch))
            tags.append(tag if type(batch) is not BatchParts or not batch.extra else (*tag, *batch.extra))
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


def batch_schema(schema: pa.Schema, equal: EqualBatches) -> pa.Schema:
    """The schema of every batch: ``schema``, plus the padding flag with ``equal_batches='pad'``.

    Raises:
        IncompatibleOptionsError: the data already has a column of the flag's name.
    """
    if equal is not EqualBatches.PAD:
        return schema
    if PADDING_COLUMN in schema.names:
        raise IncompatibleOptionsError(
            f"equal_batches='pad' adds a column {PADDING_COLUMN!r}, but the data already has one; "
            "rename it or leave it out of columns"
        )
    return schema.append(pa.field(PADDING_COLUMN, pa.bool_(), nullable=False))


def parts_joinable(output: OutputConfig, schema: pa.Schema) -> bool:
    """Whether a batch's parts, converted one by one, can be joined straight into the transfer buffer.

    Torch output of numbers and fixed-size lists, with nothing applied to the whole batch
    (no ``collate_fn``, packing or feature packs): each column is then its parts' tensors
    one after the other (:class:`~torch_dataloader_utils.transfer.JoinedColumn`).
    """
    if output.output_format is not OutputFormat.TORCH or output.collate_fn is not None:
        return False
    if output.pack_sequences is not None or output.pack_features:
        return False

    def plain(t: pa.DataType) -> bool:
        if pa.types.is_fixed_size_list(t):
            return plain(t.value_type)
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)

    return all(plain(f.type) for f in schema)
