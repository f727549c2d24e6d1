"""The engine: one pass machinery that drives any order (:mod:`.orders`), and the planned dataset.

:class:`OrderedDataset` reads what its order says and does the rest alike for every order:
in a worker of the library's loader it converts batches and sends them in groups through
shared memory (:func:`.emit.grouped`); in a DataLoader of the user's own it packs each
batch; in the main process it converts and tags them. It records what the loop consumed
(:class:`Pass`, from :meth:`OrderedDataset.open_pass`), counts and times it, selects epochs,
saves and loads states. It holds only values (pickled cheaply to workers; ``set_epoch``
reaches persistent ones). :class:`PlannedDataset` is one source in the planned or elastic
order; :class:`~torch_dataloader_utils.runtime.recipes.MixedDataset` several, mixed.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset

from torch_dataloader_utils.config import EqualBatches, check_int
from torch_dataloader_utils.errors import IncompatibleOptionsError, ResumeStateError, warn
from torch_dataloader_utils.io.bad import is_standin
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.batching import concat_batches
from torch_dataloader_utils.packing import converter_for
from torch_dataloader_utils.plan.mixing import RowMixing
from torch_dataloader_utils.plan.planner import Planner, RankPlan
from torch_dataloader_utils.plan.splits import RankAwareStrategy, Splitter
from torch_dataloader_utils.plan.state import plain_state
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, FileInfo, World
from torch_dataloader_utils.runtime import env
from torch_dataloader_utils.runtime.elastic import join_converted, join_converted_blocks, joinable
from torch_dataloader_utils.runtime.emit import (
    GROUP_MAX_BATCHES,
    ArrowBytes,
    BatchParts,
    batch_schema,
    group_cap,
    grouped,
    parts_joinable,
)
from torch_dataloader_utils.runtime.ledger import PassLedger
from torch_dataloader_utils.runtime.metrics import MetricsRecorder, RankMetrics, WorkerMetrics, stall_clock
from torch_dataloader_utils.runtime.options import Options
from torch_dataloader_utils.runtime.orders import Joins, Order, Tagger
from torch_dataloader_utils.runtime.orders.elastic import ElasticOrder
from torch_dataloader_utils.runtime.orders.mixed import complete_mix_state
from torch_dataloader_utils.runtime.orders.planned import MAX_AUTO_WORKERS, PlannedOrder, check_options
from torch_dataloader_utils.runtime.orders.source import SourcePlan
from torch_dataloader_utils.runtime.passes import Handoff, Pass, files_bytes_per_row
from torch_dataloader_utils.runtime.progress import Progress
from torch_dataloader_utils.runtime.state import Tagged
from torch_dataloader_utils.runtime.watchdog import watch_parent
from torch_dataloader_utils.runtime.workstats import WorkStats
from torch_dataloader_utils.transfer import JoinedColumn, SegmentPool, pack

__all__ = ["MAX_AUTO_WORKERS", "OrderedDataset", "PlannedDataset", "batch_schema"]


class OrderedDataset(IterableDataset[Any]):
    """The engine: reads any :class:`~torch_dataloader_utils.runtime.orders.Order` (see the module)."""

    _order: Order
    _options: Options

    def _init_engine(
        self, order: Order, options: Options, schema: pa.Schema, sources: Sequence[str] = ()
    ) -> None:
        self._order = order
        self._options = options
        self._schema = schema
        self._converter = converter_for(batch_schema(schema, options.batching.equal_batches), options.output)
        self._join_converted = joinable(options.output, schema)
        self._join_parts = parts_joinable(options.output, schema)
        # Shared memory: set_epoch in the main process reaches persistent workers.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._handoff: Handoff | None = None
        self._warned_repeat = False
        self._source_names = tuple(sources)
        self._source_rows = np.zeros(len(sources), dtype=np.int64)
        self.metrics = MetricsRecorder(options.progress)
        """Per-worker counters of the batches received (see :meth:`get_metrics`)."""
        # Batches of a full hand-off group, set before every pass (persistent workers too).
        self._group_cap = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self.bytes_per_row: float | None = None
        """Arrow bytes per row of the first batches received (sizes later passes' groups)."""
        ledger = options.loader.ledger
        self._ledger = None if ledger is None else PassLedger(ledger, options.world.rank)
        self._loaded: Mapping[str, Any] | None = None
        self._pass: weakref.ref[Pass] | None = None  # weak: a pass holds its dataset

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pass"] = None  # the main process's pass stays there (and a weak reference cannot travel)
        return state

    # -- values -------------------------------------------------------------------------------
    @property
    def order(self) -> Order:
        """How the epochs are read (:mod:`~torch_dataloader_utils.runtime.orders`)."""
        return self._order

    @property
    def options(self) -> Options:
        """The checked options this dataset was built with."""
        return self._options

    @property
    def world(self) -> World:
        """The ranks this dataset plans for."""
        return self._options.world

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the rows read (columns in output order, no padding flag)."""
        return self._schema

    @property
    def num_workers(self) -> int:
        """DataLoader workers the plan is made for (``num_workers=None`` resolved)."""
        return self._order.num_workers

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read next; with ``shuffle=True`` each epoch has its own order.

        Call it before iterating, every epoch, on every rank (as with
        ``DistributedSampler.set_epoch``). Works with persistent workers.
        """
        check_int(epoch, "epoch", 0)
        self._order.set_epoch(epoch)
        self._epoch.fill_(epoch)
        self.reset_metrics()

    def convert_batch(self, batch: pa.RecordBatch, for_transfer: bool = False) -> Any:
        """Convert one record batch as reading does (``for_transfer``: as a DataLoader worker does)."""
        return self._for_transfer(batch) if for_transfer else self._converted(batch)

    # -- passes -------------------------------------------------------------------------------
    def open_pass(self, num_workers: int, transport: SegmentPool | None = None) -> Pass:
        """Main process: a pass over the current epoch starts, read by ``num_workers`` workers.

        The loader of ``create_dataloader`` opens it before its workers start (they pickle
        the dataset, and with it the hand-off: ``transport``, the segments they send batches
        in), calls :meth:`Pass.started` once they did, and :meth:`Pass.finish` /
        :meth:`Pass.end` when the pass is over. The main process plans the pass now: workers
        check that they agree with it (a custom strategy must be a pure function of its
        arguments), and ``state_dict()`` knows each worker's rows without planning while the
        loop waits. Warns once when ``shuffle=True`` and a pass over the same epoch already
        ran to its end with no ``set_epoch`` since: every epoch would repeat one order.
        """
        order, epoch = self._order, self.epoch
        if order.passes.completed_pass and self._options.shuffle.shuffle and not self._warned_repeat:
            self._warned_repeat = True
            warn(
                f"a second pass over epoch {epoch} starts with shuffle=True and no set_epoch() since the "
                "first one ended: it repeats the same order. Call loader.set_epoch(epoch) (or "
                "dataset.set_epoch, or loader.sampler.set_epoch, which Lightning calls) before every epoch"
            )
        progress = order.passes.begin(num_workers, epoch)
        order.prepare(epoch, num_workers)
        handoff = self._handoff = Handoff(transport)
        per_row = self.bytes_per_row or files_bytes_per_row(order)
        pinned = transport is not None and transport.every_size
        cap = group_cap(per_row, self._options.batching.batch_size, pinned)
        self._group_cap.fill_(cap)
        opened = Pass(self, progress, handoff)
        self._pass = weakref.ref(opened)
        if self._ledger is not None:  # the pass's record, before its workers start
            self._ledger.begin(self, epoch, num_workers, cap, self._loaded)
            opened.ledger = self._ledger
        joins = Joins(join_converted, join_converted_blocks, True)
        if not self._join_converted:
            joins = Joins(self._joined, None, False)
        opened._delivery = order.delivery(epoch, num_workers, joins, opened._consume_part)
        self._begin_metrics(epoch, num_workers)
        return opened

    def _begin_metrics(self, epoch: int, num_workers: int) -> None:
        config = self._options.progress
        rank = self.world.rank
        if not Progress.shown_on(config, rank):
            self.metrics.begin(epoch)
            return

        def display() -> Progress:
            total, done = self._order.rows(epoch, num_workers)
            return Progress(config, rank=rank, epoch=epoch, total=total, done=done)

        self.metrics.begin(epoch, display)

    def count_sources(self, rows: Sequence[int]) -> None:
        """Add the rows a consumed batch held of every source (a mix's metrics)."""
        if len(self._source_rows) == len(rows):
            self._source_rows += rows

    # -- metrics ------------------------------------------------------------------------------
    def get_metrics(self) -> list[WorkerMetrics]:
        """Per-worker counters of the batches the loop received since the last call.

        One :class:`~torch_dataloader_utils.runtime.metrics.WorkerMetrics` per worker
        that delivered a batch (``rows_read``, ``batches_read``, ``bytes_read``,
        ``files_read``, ``elapsed_sec``), by worker id; also logs an epoch summary at
        INFO. The counters are then cleared: a second call returns ``[]``.
        ``set_epoch`` and :meth:`reset_metrics` discard them too.
        """
        self._source_rows[:] = 0
        return self.metrics.drain()

    def reset_metrics(self) -> None:
        """Discard the counters collected so far."""
        self._source_rows[:] = 0
        self.metrics.reset()

    def rank_metrics(self) -> RankMetrics:
        """This rank's metrics since the last reset (see ``ResumableDataLoader.metrics``)."""
        dropped = self._order.dropped_rows(self.metrics.epoch)
        metrics = self.metrics.rank_metrics(self.world.rank, self.world.num_ranks, dropped)
        if not self._source_names:
            return metrics
        rows = tuple((n, int(r)) for n, r in zip(self._source_names, self._source_rows.tolist(), strict=True))
        return dataclasses.replace(metrics, rows_by_source=rows)

    # -- lengths ------------------------------------------------------------------------------
    def num_batches(self, epoch: int | None = None, num_workers: int | None = None) -> int:
        """Batches this rank yields in a full pass over ``epoch`` with ``num_workers`` workers.

        The whole epoch's count, also after ``load_state_dict`` (as torchdata's
        ``StatefulDataLoader`` reports ``len()``): trainers read it once and keep it for
        later epochs. The batches left of a resumed or running pass are
        :attr:`remaining_batches`. With ``equal_batches`` on, the count is the same on
        every rank and for any ``num_workers``; otherwise each worker's last batch may be
        short, so it depends on ``num_workers`` (default: the dataset's).

        Raises:
            UnknownLengthError: row counts are unknown before reading (a ``TypeError``).
        """
        epoch = self.epoch if epoch is None else epoch
        return self._order.num_batches(epoch, self.num_workers if num_workers is None else num_workers)

    @property
    def remaining_batches(self) -> int:
        """Batches left in the current epoch from the consumed (or loaded) position.

        During a pass: the batches that pass has still to yield. Between passes: what
        the next pass yields, the rest of the epoch after ``load_state_dict``, or the
        full epoch (``len()``); 0 once a pass ran to its end, until ``set_epoch`` (a new
        pass over the same epoch then reads it whole again).

        Raises:
            UnknownLengthError: row counts are unknown before reading (a ``TypeError``).
        """
        return self._order.remaining(self.epoch)

    def __len__(self) -> int:
        """Batches this rank yields in a full pass over the current epoch (see :meth:`num_batches`)."""
        return self.num_batches()

    # -- reading ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        slot = env.worker_slot()
        if slot.in_worker:
            watch_parent()
        reading = self._order.batches(slot, self.epoch, self._join_converted)
        batches, positions, work = reading.batches, reading.positions, reading.work
        handoff = self._handoff
        if slot.in_worker and handoff is not None:
            # Under the loader of create_dataloader (which flattens groups): several batches
            # per transfer, since each hand-off between processes has a fixed cost; the
            # worker's timers and counters travel with them.
            pool = handoff.transport.writer(slot.id) if handoff.transport is not None else None
            convert = _as_is if reading.parts and not self._join_converted else self._for_transfer
            cap = int(self._group_cap) or GROUP_MAX_BATCHES
            yield from grouped(batches, convert, positions, work, pool, cap)  # type: ignore[arg-type]
            return
        if reading.parts:
            raise IncompatibleOptionsError(
                f"canonical_ranks={self._options.canonical} with {slot.count} DataLoader workers needs the "
                "loader of create_dataloader, which joins the workers' parts of every batch; iterate "
                "that loader, or read with num_workers=0"
            )
        if slot.in_worker:  # a DataLoader of the user's own: no tags, no metrics
            yield from self._plain(batches)
            return
        self.metrics.attach(slot.id, work)
        if handoff is not None:  # the loader of create_dataloader, reading in this process
            yield from self._tagged(batches, positions, work)
            return
        # Iterated directly in the main process: record what the loop consumes here.
        yield from self._consumed_here(self._tagged(batches, positions, work))

    def _consumed_here(self, tagged: Iterator[Tagged]) -> Iterator[Any]:
        """A pass read and consumed in this process (a dataset iterated directly, no loader)."""
        opened = self.open_pass(0)
        self._handoff = None
        completed = False
        try:
            for item in stall_clock(tagged, self.metrics):
                self.metrics.record(item.tag)
                yield opened.consume(item)
            opened.finish()
            completed = True
        finally:
            opened.end()
            self.metrics.finish(completed)

    def _converted(self, batch: Any) -> Any:
        if type(batch) is BatchParts:
            batch = batch.joined()
        return self._converter(batch)

    def _tagged(self, batches: Iterator[Any], positions: Tagger, work: WorkStats) -> Iterator[Tagged]:
        """The batches converted in this process, tagged with their positions, timed in ``work``."""
        collate = self._options.output.collate_fn
        clock = time.perf_counter
        measure = ArrowBytes()
        asked = clock()
        for batch in batches:
            got = clock()
            work.read_sec += got - asked
            work.count_padding(batch)
            tag = positions.tag(batch.num_rows, measure(batch))
            removed = positions.take_removed()
            if removed and self._ledger is not None:  # before the loop receives this batch
                self._ledger.skipped(positions.worker, removed)
            if type(batch) is BatchParts and batch.extra:
                tag = (*tag, *batch.extra)
            out = self._converted(batch)
            if collate is not None:
                out = collate(out)
            asked = clock()
            work.convert_sec += asked - got
            yield Tagged(out, tag)
            asked = clock()

    def _plain(self, batches: Iterator[Any]) -> Iterator[Any]:
        """A worker of a DataLoader of the user's own: each batch packed for its transfer."""
        for batch in batches:
            yield pack(self._for_transfer(batch.joined() if type(batch) is BatchParts else batch))

    def _for_transfer(self, batch: Any) -> Any:
        if type(batch) is BatchParts:
            arrays = batch.arrays() if self._join_parts else None
            if arrays is not None:  # the parts' columns joined in the transfer buffer: one copy
                return {name: JoinedColumn(parts, batch.order) for name, parts in arrays.items()}
            batch = batch.joined()
        collate = self._options.output.collate_fn
        if collate is None:
            return self._converter.convert_for_transfer(batch)
        return collate(self._converter(batch))

    def _joined(self, parts: list[pa.RecordBatch]) -> Any:
        """Parts of a batch read as Arrow: joined and converted here (``collate_fn`` too)."""
        collate = self._options.output.collate_fn
        out = self._converter(concat_batches(parts))
        return out if collate is None else collate(out)

    # -- resume -------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """What a resume state of this dataset is tied to (its data and options)."""
        return self._order.fingerprint()

    def state_dict(self) -> dict[str, Any]:
        """What the training loop has consumed of the current epoch, as plain JSON values.

        Counted in the main process: the batches the loop received (from the loader of
        ``create_dataloader``, or from iterating this dataset in the main process)
        before this call; batches prefetched by workers are not consumed. The state
        holds this rank only; combine ranks with ``merge_states`` or ``gather_state``.
        It is tied to the data and options (``fingerprint``) and is small.
        """
        if env.worker_slot().in_worker:
            raise ResumeStateError(
                "state_dict() was called in a DataLoader worker, which does not know what the "
                "training loop consumed (batches count as consumed when the loop receives them, in "
                "the main process); call loader.state_dict() in the training loop"
            )
        state = self._order.state(self.epoch).to_json()
        if self._ledger is not None:  # the training ledger's step count goes on after a resume
            live = self._pass() if self._pass is not None else None
            handed = live.handed if live is not None and live.ledger is not None else 0
            state["steps"] = {str(self.world.rank): self._ledger.steps_at(handed)}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state: the next pass over its epoch reads only what was not consumed.

        The state must hold every rank (one rank's own state on a single-rank job, else
        ``merge_states([...])`` or ``gather_state``), or, under an initialized
        ``torch.distributed`` process group, be this rank's own state loaded by every
        rank at the same call (the states are then gathered and merged). The rest of the
        epoch is re-planned over this dataset's world, which may have other ``num_ranks``
        and ``num_workers`` than the saved one. Sets :attr:`epoch` to the state's epoch;
        the epoch after it is a normal full epoch. A state that fails a check changes
        nothing.

        Raises:
            ResumeStateError: not a state, another version, or not every rank.
            StateMismatchError: saved for other data or options (says what changed).
        """
        plain = plain_state(state)
        if self._ledger is not None:  # recorded whole: a mix's later passes count from it
            plain = complete_mix_state(plain, self.world.num_ranks)
        self._epoch.fill_(self._order.load(plain))
        if self._ledger is not None:
            self._loaded = plain
            self._ledger.resume_steps(plain, self.world)


def _as_is(batch: Any) -> Any:
    """A worker's part of a batch travels as Arrow, joined and converted in the main process."""
    return batch


class PlannedDataset(OrderedDataset):
    """One source read in the planned order (or, with ``canonical_ranks``, the elastic order).

    Subclasses (files, Iceberg) discover the data, then call :meth:`_init_core`.

    ``equal_batches`` (default ``'drop'``) makes every rank yield the same number of
    batches (see :class:`~torch_dataloader_utils.config.EqualBatches`). It needs exact
    row counts: a source whose counts are not exact (an uncounted row filter) passes
    ``row_count_issue``, a phrase saying why, which then makes ``equal_batches`` on more
    than one rank an error (never a hang) and ``len()`` an :class:`UnknownLengthError`.
    """

    _member = False
    """A source of a mix: discovered only (the mix plans and reads it; no order of its own)."""

    def _init_core(
        self,
        *,
        files: Sequence[FileInfo],
        reader: ChunkReader,
        output_schema: pa.Schema,
        options: Options,
        row_count_issue: str | None,
        identity: Mapping[str, Any],
        table: FileTable | None = None,
        name: str = "the dataset",
    ) -> None:
        super().__init__()
        self._source = SourcePlan(
            files=files,
            table=table,
            reader=reader,
            schema=output_schema,
            options=options,
            row_count_issue=row_count_issue,
            identity=identity,
            name=name,
        )
        if self._member:
            self._options, self._schema = options, output_schema
            return
        check_options(options, row_count_issue)
        self._source.counted_key = True
        workers = options.loader.num_workers
        order: PlannedOrder | ElasticOrder
        if options.canonical is None:
            order = PlannedOrder(self._source, options, workers)
        else:
            order = ElasticOrder(self._source, options, workers)
        self._init_engine(order, options, output_schema)
        order.check()

    @property
    def source(self) -> SourcePlan:
        """The source: its files, reader and output schema, and the planner of its chunks."""
        return self._source

    @property
    def _planned(self) -> PlannedOrder | ElasticOrder:
        return self._order  # type: ignore[return-value]

    @property
    def split_strategy(self) -> Splitter | RankAwareStrategy:
        """The split strategy planned with: the options', or a finer one the row mixing needed."""
        return self._source.strategy

    @property
    def planner(self) -> Planner:
        """The dataset's planner (chunk table built once; plans one rank at a time)."""
        return self._source.planner

    @property
    def file_table(self) -> FileTable:
        """The dataset's files as numpy columns."""
        return self._source.table

    @property
    def files(self) -> Sequence[FileInfo]:
        """The dataset's files (metadata only; each ``FileInfo`` built when read, for large datasets)."""
        return self._source.files

    @property
    def reader(self) -> ChunkReader:
        """Reads one chunk's rows (what every worker runs on its chunks)."""
        return self._source.reader

    @property
    def _reader(self) -> ChunkReader:
        return self._source.reader

    @property
    def equal_batches(self) -> EqualBatches:
        """The equal-batches policy (it acts only with more than one rank)."""
        return self._options.batching.equal_batches

    @property
    def row_shuffle_window(self) -> int | None:
        """Rows shuffled together (the row-level shuffle's window), or ``None``."""
        return self._options.shuffle.row_window

    @property
    def row_mixing(self) -> RowMixing | None:
        """The row interleaving in effect (``shuffle=True`` with ``row_interleave``), or ``None``."""
        return self._options.shuffle.mixing

    def fingerprint(self) -> dict[str, Any]:
        """What a resume state of this dataset is tied to (files digest and options)."""
        return self._source.fingerprint() if self._member else self._order.fingerprint()

    def files_per_batch(
        self, epoch: int = 0, num_workers: int | None = None, ranks: int | None = None
    ) -> float | None:
        """Expected distinct files in a batch of ``epoch``, over the readers of the first ``ranks`` ranks.

        From the plan alone (:mod:`~torch_dataloader_utils.plan.spread`): a batch of a
        piece read in file order holds one file, one of a mix or window the files of its
        chunks in proportion to their rows. ``None`` when no rows are planned (or in
        elastic order, whose batches draw from every stream of their rank).
        """
        order = self._order
        if not isinstance(order, PlannedOrder):
            return None
        return order.files_per_batch(epoch, num_workers, ranks)

    def rank_plan(self, epoch: int | None = None, num_workers: int | None = None) -> RankPlan:
        """This rank's plan of ``epoch`` (default: the current one) for ``num_workers``.

        Planned once per ``(epoch, num_workers)`` in a process: ``len()``, automatic
        worker sizing and reading share it. Only this rank's chunks are built, and
        only when asked (:meth:`RankPlan.chunks_for`). In a DataLoader worker the plan
        is checked against the main process's (a custom strategy that returns other
        chunks for the same arguments is an error).

        Raises:
            PlanError: the split strategy returned invalid, overlapping or
                non-deterministic chunks.
        """
        epoch = self.epoch if epoch is None else epoch
        order = self._order
        if isinstance(order, PlannedOrder):
            return order.rank_plan(epoch, num_workers)
        return self.planner.rank_plan(epoch, self.world.rank, self._planned.readers(num_workers))

    def plan(self, epoch: int | None = None, num_workers: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the current one) for every rank and worker.

        Each rank is planned when its chunks are first read (``plan.assignments[rank]``,
        ``chunks_for``, ``rank_chunks``), so asking for one rank of a large world costs
        one rank's plan; ``all_chunks()`` plans them all. For this process's own rank,
        :meth:`rank_plan` is the cheaper call. In elastic order, every worker's chunks are
        its canonical streams' (fresh) chunks.
        """
        return self._planned.plan(self.epoch if epoch is None else epoch, num_workers)

    def verify_plan(self, epoch: int | None = None, num_workers: int | None = None) -> None:
        """Check that no two chunks of any ranks share a row in ``epoch`` (``plan --verify``).

        For a custom rank-aware strategy it calls the strategy for every rank, the check
        that planning skips in worlds of more than 16 ranks unless ``verify_plan=True``.

        Raises:
            OverlappingChunksError: two chunks share rows (naming both).
            PlanError: the strategy returned invalid chunks.
        """
        self._planned.verify(self.epoch if epoch is None else epoch, num_workers)

    def read_chunk(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """The rows of one planned chunk as Arrow record batches, in file order.

        ``chunk`` is one of this dataset's planned chunks (from :meth:`plan`), or a piece of
        one cut at row granularity (``plan.ranks.cut_chunk``). The batches are what the
        loader reads before batching and conversion: projected to ``columns``, filtered
        by ``filters``, partition columns added, Iceberg deletes applied; their schema is
        :attr:`schema`. Works in any process (tools such as ``reshard`` read chunks in
        their own worker processes); it does not touch the epoch, resume state or metrics.

        Raises:
            ReadError: the chunk cannot be read (file and range named).
        """
        return _without_standins(self.reader.read(chunk))

    def read_chunks(self, chunks: Sequence[Chunk]) -> Iterator[pa.RecordBatch]:
        """The rows of several chunks, one after the other, as :meth:`read_chunk` gives them.

        On remote storage the bytes of the next chunks are fetched while one is decoded
        (``read_ahead_bytes``), as the loader does for a worker's chunks.
        """
        self.reader.schedule(list(chunks))
        for chunk in chunks:
            yield from _without_standins(self.reader.read(chunk))

    def worker_chunks(self) -> tuple[Chunk, ...]:
        """The chunks the calling process (main or DataLoader worker) reads this epoch."""
        return self._planned.worker_chunks(env.worker_slot(), self.epoch)


def _without_standins(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` without the stand-ins of skipped units (reading outside the loader)."""
    return (b for b in batches if not is_standin(b))
