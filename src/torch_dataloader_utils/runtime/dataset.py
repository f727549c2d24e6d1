"""The source-agnostic core: plan -> this worker's pieces -> read -> re-batch -> convert.

The dataset holds only values (file metadata, an :class:`~.options.Options`) and a
shared-memory epoch counter, so it pickles cheaply to DataLoader workers, and
``set_epoch`` reaches persistent workers too. Sources (files, Iceberg) discover their
data and hand the core its files, a reader and the output schema.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset

from torch_dataloader_utils.config import PADDING_COLUMN, EqualBatches, check_int
from torch_dataloader_utils.errors import IncompatibleOptionsError, ResumeStateError, UnknownLengthError
from torch_dataloader_utils.io.bad import is_standin
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.batching import concat_batches, rebatch
from torch_dataloader_utils.io.helpers import Helpers, helpers
from torch_dataloader_utils.io.pieces import MIX_WORKER_READ_ROWS, piece_reads
from torch_dataloader_utils.packing import converter_for
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.elastic import Canonical
from torch_dataloader_utils.plan.mixing import RowMixing
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.planner import Planner, PlanSpec, RankPlan, nondeterministic
from torch_dataloader_utils.plan.resume import Resumer, group
from torch_dataloader_utils.plan.splits import RankAwareStrategy, Splitter
from torch_dataloader_utils.plan.spread import SPREAD_RANKS, FileSpread
from torch_dataloader_utils.plan.state import Segment, plain_state, segments_of
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, FileInfo, WorkerChunks, World
from torch_dataloader_utils.runtime import env, share
from torch_dataloader_utils.runtime.elastic import (
    ElasticPlans,
    Joiner,
    StreamPositions,
    interleave,
    join_converted,
    join_converted_blocks,
    joinable,
    part_batches,
)
from torch_dataloader_utils.runtime.emit import ArrowBytes, Positions, grouped
from torch_dataloader_utils.runtime.metrics import MetricsRecorder, RankMetrics, WorkerMetrics, stall_clock
from torch_dataloader_utils.runtime.options import Options
from torch_dataloader_utils.runtime.progress import Progress
from torch_dataloader_utils.runtime.report import report_plan
from torch_dataloader_utils.runtime.split_choice import (
    MIN_TEXT_SPLIT_BYTES,
    finer_split,
    need_of,
    strategy_for,
)
from torch_dataloader_utils.runtime.state import EpochProgress, ResumeTracker, Tagged, complete_state
from torch_dataloader_utils.runtime.watchdog import watch_parent
from torch_dataloader_utils.runtime.workstats import WorkStats
from torch_dataloader_utils.transfer import SegmentPool, pack

__all__ = ["MAX_AUTO_WORKERS", "PlannedDataset", "consumed_here"]

log = logging.getLogger(__name__)

MAX_AUTO_WORKERS = 8
"""Upper bound of ``num_workers=None`` (auto)."""

REPORT_MAX_RANKS = 256
"""Worlds of up to this many ranks get the plan summary and layout warnings on rank 0 when built."""

STANDIN_COLUMN = "__tdu_standin"
"""The flag column marking the rows of skipped units inside a worker (never reaches the loop)."""


def _check_counts(options: Options, row_count_issue: str | None) -> None:
    """Equal batches need exact row counts (else ranks could yield different batch counts)."""
    if options.equalized and row_count_issue:
        raise IncompatibleOptionsError(
            f"equal_batches={options.batching.equal_batches.value!r} needs exact row counts, but "
            f"{row_count_issue}, so the {options.world.num_ranks} ranks' row counts are unknown "
            "before reading and they could yield different numbers of batches (a DDP job would "
            "hang). Mask those rows in the training step instead, rewrite the data already "
            "filtered, or pass equal_batches='off' and handle uneven inputs yourself "
            "(torch.distributed.algorithms.Join)"
        )


def _check_bad_data(options: Options) -> None:
    """Skipping bad data with equal_batches='drop' on several ranks could unbalance the ranks."""
    drop = options.batching.equal_batches is EqualBatches.DROP
    if options.bad_data.skipping and drop and (options.equalized or options.canonical is not None):
        ranks = options.world.num_ranks
        where = f"{ranks} ranks" if options.canonical is None else f"canonical_ranks={options.canonical}"
        raise IncompatibleOptionsError(
            f"on_bad_data={options.bad_data.on_bad_data.value!r} with equal_batches='drop' on "
            f"{where}: the rows of a skipped unit would leave its rank with "
            "fewer batches than the others (a DDP job would hang). Pass equal_batches='pad': the "
            f"skipped rows are then replaced, in place, by rows flagged in {PADDING_COLUMN!r} (mask "
            "them as padding), or equal_batches='off' to let the ranks' batch counts differ"
        )


def _tied_options(options: Options, identity: Mapping[str, Any]) -> dict[str, Any]:
    """The options a resume state is tied to (part of its fingerprint), as JSON-ready values."""
    batching, shuffle = options.batching, options.shuffle
    strategy = repr(options.strategy)
    if " at 0x" in strategy:
        strategy = f"{type(options.strategy).__module__}.{type(options.strategy).__qualname__}"
    if options.canonical is None:
        size: dict[str, Any] = {"batch_size": batching.batch_size}
    else:  # elastic order: any world at the same global batch
        size = {
            "canonical_ranks": options.canonical,
            "global_batch_size": batching.batch_size * options.world.num_ranks,
        }
    return {
        "split_strategy": strategy,
        "shuffle": shuffle.shuffle,
        "shuffle_seed": shuffle.shuffle_seed,
        **size,
        "drop_last": batching.drop_last,
        "equal_batches": batching.equal_batches.value,
        "row_shuffle_window": shuffle.row_window,
        # Only when in effect: states of unshuffled (or chunk-only) reads stay valid.
        **({} if shuffle.mixing is None else {"row_mixing": shuffle.mixing.rows}),
        **identity,
    }


def _plan_spec(table: FileTable, options: Options) -> PlanSpec:
    """What every plan of the dataset depends on (workers are given per plan)."""
    batching, shuffle = options.batching, options.shuffle
    return PlanSpec(
        files=table,
        strategy=options.strategy,
        num_ranks=options.world.num_ranks,
        num_workers=1,
        shuffle=shuffle.shuffle,
        seed=shuffle.shuffle_seed,
        equal_batches=batching.equal_batches,
        batch_size=batching.batch_size,
        verify=options.split.verify_plan,
    )


def _elastic_plans(planner: Planner, options: Options) -> ElasticPlans | None:
    """Elastic order's plans of this rank (``canonical_ranks``), or ``None``."""
    if options.canonical is None:
        return None
    shuffle, world = options.shuffle, options.world
    return ElasticPlans(
        planner,
        Canonical(options.canonical, world.num_ranks, options.batching.batch_size),
        world.rank,
        window_rows=shuffle.row_window,
        mixing=shuffle.mixing,
        seed=shuffle.shuffle_seed if shuffle.shuffle else 0,
    )


def _as_is(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A worker's part of a batch travels as Arrow, joined and converted in the main process."""
    return batch


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


_P = TypeVar("_P")
_P_contra = TypeVar("_P_contra", contravariant=True)


class PassRecord(Protocol[_P_contra]):
    """What records a pass's consumption (``ResumeTracker``, or a mix's tracker)."""

    def consume(self, item: Any, progress: _P_contra) -> Any:
        """Record ``item`` as consumed by ``progress``'s pass; return the batch."""
        ...

    def finish(self, progress: _P_contra) -> None:
        """``progress``'s pass ran to its end."""
        ...

    def end(self, progress: _P_contra) -> None:
        """``progress``'s pass ended (exhausted, closed or failed)."""
        ...


def consumed_here(
    tagged: Iterator[Tagged], record: PassRecord[_P], progress: _P, metrics: MetricsRecorder
) -> Iterator[Any]:
    """A pass read and consumed in this process (a dataset iterated directly, no loader).

    Each batch is recorded as consumed when the loop takes it, the loop's wait is timed,
    and the pass is finished (or ended early) in the record and the metrics.
    """
    completed = False
    try:
        for item in stall_clock(tagged, metrics):
            metrics.record(item.tag)
            yield record.consume(item, progress)
        record.finish(progress)
        completed = True
    finally:
        record.end(progress)
        metrics.finish(completed)


class PlannedDataset(IterableDataset[Any]):
    """Source-agnostic core: plans each epoch and reads this worker's chunks.

    Subclasses (files, Iceberg) discover the data, then call :meth:`_init_core`.

    ``equal_batches`` (default ``'drop'``) makes every rank yield the same number of
    batches (see :class:`~torch_dataloader_utils.config.EqualBatches`). It needs exact
    row counts: a source whose counts are not exact (an uncounted row filter) passes
    ``row_count_issue``, a phrase saying why, which then makes ``equal_batches`` on more
    than one rank an error (never a hang) and ``len()`` an :class:`UnknownLengthError`.
    """

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
    ) -> None:
        super().__init__()
        batching = options.batching
        _check_counts(options, row_count_issue)
        _check_bad_data(options)
        self._files = files if table is not None else tuple(files)
        self._options = options
        self._reader = reader
        self._schema = output_schema
        self._converter = converter_for(batch_schema(output_schema, batching.equal_batches), options.output)
        self._row_count_issue = row_count_issue
        # Shared memory: set_epoch in the main process reaches persistent workers.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        # ``table``: the same files as columns when discovery has them (no pass over objects).
        if table is not None and len(table) != len(self._files):
            raise ValueError(f"a file table of {len(table)} files for {len(self._files)} files")
        self._table = table if table is not None else FileTable.from_infos(self._files)
        self._planner = Planner(_plan_spec(self._table, options))
        self._split_auto = self._choose_split()
        self._state = ResumeTracker(
            self._table,
            {
                **_tied_options(options, identity),
                # Only when the library split finer for the mixing (see split_choice).
                **({} if self._split_auto is None else {"split_auto": self._split_auto}),
            },
            options.world,
            options.shuffle.shuffle_seed,
        )
        self._elastic = _elastic_plans(self._planner, options)
        self._joiner: Joiner | None = None
        self._joining: EpochProgress | None = None  # the pass the joiner records in
        # Elastic order's parts of a batch: converted by the workers and concatenated, or Arrow.
        self._join_converted = joinable(options.output, output_schema)
        # What the main process planned for an epoch, for its DataLoader workers (shared
        # memory, so persistent workers see it): [epoch + 1, num_workers, digest of a custom
        # strategy's chunks]; and, for a rank-aware strategy with equal batches, every rank's rows.
        self._digest = torch.zeros(3, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._totals: torch.Tensor | None = None
        if self._planner.rank_aware and options.equalized:
            self._totals = torch.zeros(options.world.num_ranks + 1, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._plans: BoundedDict[tuple[int, int], EpochPlan] = BoundedDict(4)
        self._resumers: BoundedDict[tuple[int, int, int], Resumer] = BoundedDict(4)
        self._piece_rows: BoundedDict[tuple[int, int, int], list[list[int]] | None] = BoundedDict(4)
        self._last_rows: tuple[tuple[Segment, ...], int, int, list[list[int]] | None] | None = None
        self._logged: set[int] = set()
        self._warned_repeat = False
        self.metrics = MetricsRecorder(options.progress)
        """Per-worker counters of the batches received (see :meth:`get_metrics`)."""
        self.transport: SegmentPool | None = None
        """Set by the loader while its workers start: the segments they send batches in."""
        workers = options.loader.num_workers
        self._num_workers = self._auto_workers() if workers is None else workers
        self._check_plan()
        self._check_mixing()

    # -- the split --------------------------------------------------------------
    def _choose_split(self) -> dict[str, int] | None:
        """Split finer than the default when the row mixing needs more chunks; the sizes chosen.

        Only when the split is left to the library (see :mod:`.split_choice`). The readers
        are this world's ranks times the workers asked for (``num_workers=None``: the most
        the automatic choice may pick, a constant, as the CPUs may differ between nodes);
        under a process group every rank takes rank 0's figure, so all plan alike.
        """
        workers = self._options.loader.num_workers
        need = need_of(self._options, MAX_AUTO_WORKERS if workers is None else max(1, workers))
        table = self._planner.chunk_table()
        if need is None or table is None:
            return None
        if self.world.num_ranks > 1:
            chosen = need
            need = share.from_rank0(lambda: chosen)
        if need.met_by(table):
            return None
        strategy, sizes = finer_split(self._options.strategy, self._table, need)
        self._planner = Planner(dataclasses.replace(self._planner.spec, strategy=strategy))
        log.info(
            "split %s for the row mixing: %d readers (ranks x workers) mix %d chunks each, and the default "
            "split gives %d chunks",
            ", ".join(f"{k}={v:,}" for k, v in sizes.items()),
            need.readers,
            need.streams,
            len(table),
        )
        return sizes

    @property
    def split_strategy(self) -> Splitter | RankAwareStrategy:
        """The split strategy planned with: the options', or a finer one the row mixing needed."""
        return self._planner.spec.strategy

    def _use_split(self, strategy: Splitter | RankAwareStrategy, sizes: dict[str, int] | None) -> None:
        """Plan with ``strategy`` from now on (a loaded state's automatic split); caches dropped."""
        self._planner = Planner(dataclasses.replace(self._planner.spec, strategy=strategy))
        self._elastic = _elastic_plans(self._planner, self._options)
        self._split_auto = sizes
        self._state.set_option("split_auto", sizes)
        self._plans.clear()
        self._resumers.clear()
        self._piece_rows.clear()
        self._last_rows = None
        self._logged = set()

    def _adopt_split(self, state: Mapping[str, Any]) -> tuple[Splitter | RankAwareStrategy, Any] | None:
        """Take the automatic split ``state`` was saved with, when ours differs; returns ours."""
        workers = self._options.loader.num_workers
        if need_of(self._options, max(1, workers or 1)) is None:
            return None  # the split is the user's: a state of another split is a mismatch
        fingerprint = state.get("fingerprint") if isinstance(state, Mapping) else None
        saved = fingerprint.get("options") if isinstance(fingerprint, Mapping) else None
        if not isinstance(saved, Mapping) or "split_strategy" not in saved:
            return None
        sizes = saved.get("split_auto")
        if sizes == self._split_auto:
            return None
        strategy = strategy_for(self._options.strategy, sizes)
        if strategy is None:
            return None
        previous = (self._planner.spec.strategy, self._split_auto)
        self._use_split(strategy, dict(sizes) if sizes is not None else None)
        log.info(
            "the resume state was saved with split %s; this dataset reads with it", sizes or "by default"
        )
        return previous

    def _check_mixing(self) -> None:
        """Warn (rank 0) when the readers get fewer chunks than the row mixing draws from."""
        workers = self._readers(None)
        need = need_of(self._options, workers, library_only=False)
        table = self._planner.chunk_table()
        if need is None or table is None or self.world.rank != 0 or len(table) >= need.chunks:
            return
        mean = self.files_per_batch(0, workers, ranks=SPREAD_RANKS)
        figure = "" if mean is None else f"; a batch draws from about {mean:.1f} files"
        split = self._options.split
        groups = int(np.diff(self._table.group_offsets)[self._table.has_groups].sum())
        given = split.split_bytes is not None or split.split_rows is not None
        if given and not (groups and len(table) >= groups):  # a lower split would give more chunks
            limit = "split_bytes / split_rows give"
            fix = "Lower split_bytes / split_rows, or leave them out: the library then splits as needed"
        elif groups:
            limit = f"the files' {groups:,} row groups (stripes), the smallest unit of a chunk, give"
            fix = (
                "Rewrite the files with smaller row groups, or into more files (`torch-dataloader-utils "
                "reshard`), or read with fewer workers"
            )
        else:
            limit = f"the {len(self._table):,} files give"
            fix = (
                "Split the data into more files (compressed files and CSV with quoted_newlines are read "
                f"whole; byte ranges are at least {MIN_TEXT_SPLIT_BYTES // 2**20} MiB), or use fewer workers"
            )
        warnings.warn(
            f"shuffle=True mixes the rows of {need.streams} chunks per reader, but {limit} the "
            f"{need.readers:,} readers ({self.world.num_ranks:,} ranks x {workers} workers) only "
            f"{len(table):,} chunks, about {len(table) / need.readers:.1f} each{figure}. {fix}",
            UserWarning,
            stacklevel=5,
        )

    def files_per_batch(
        self, epoch: int = 0, num_workers: int | None = None, ranks: int | None = None
    ) -> float | None:
        """Expected distinct files in a batch of ``epoch``, over the readers of the first ``ranks`` ranks.

        From the plan alone (:mod:`~torch_dataloader_utils.plan.spread`): a batch of a
        piece read in file order holds one file, one of a mix or window the files of its
        chunks in proportion to their rows. ``None`` when no rows are planned.
        """
        workers = self._readers(num_workers)
        count = self.world.num_ranks if ranks is None else min(ranks, self.world.num_ranks)
        spread = FileSpread(self._options.batching.batch_size)
        for rank in range(count):
            spread.add_all([self._reader_pieces(epoch, rank, w, workers) for w in range(workers)])
        return spread.mean

    # -- values -----------------------------------------------------------------
    @property
    def options(self) -> Options:
        """The checked options this dataset was built with."""
        return self._options

    @property
    def world(self) -> World:
        """The ranks this dataset plans for."""
        return self._options.world

    @property
    def files(self) -> Sequence[FileInfo]:
        """The dataset's files (metadata only; each ``FileInfo`` built when read, for large datasets)."""
        return self._files

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the rows read (columns in output order, no padding flag)."""
        return self._schema

    @property
    def reader(self) -> ChunkReader:
        """Reads one chunk's rows (what every worker runs on its chunks)."""
        return self._reader

    def convert_batch(self, batch: pa.RecordBatch, for_transfer: bool = False) -> Any:
        """Convert one record batch as reading does (``for_transfer``: as a DataLoader worker does)."""
        return self._for_transfer(batch) if for_transfer else self._converter(batch)

    @property
    def num_workers(self) -> int:
        """DataLoader workers the plan is made for (``num_workers=None`` resolved)."""
        return self._num_workers

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
        """The row mixing in effect (``shuffle=True`` with ``row_mixing``), or ``None``."""
        return self._options.shuffle.mixing

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
        loaded = self._state.unread_loaded_epoch()
        if loaded is not None and loaded != epoch:
            self._warn_dropped_state(loaded, epoch)
        self._epoch.fill_(epoch)
        self._state.on_set_epoch(epoch)
        self.metrics.reset()

    def _warn_dropped_state(self, loaded: int, epoch: int) -> None:
        """``set_epoch(epoch)`` drops a state loaded for epoch ``loaded`` before any of it was read."""
        consumed = ""
        try:
            total, done = self._progress_rows(loaded, self._readers(None))
        except Exception:  # a figure for the message only
            total, done = None, 0
        if total is not None:
            consumed = f" ({done:,} of this rank's {total:,} rows of epoch {loaded} had been consumed)"
        what = (
            f"epoch {epoch} is read in full and the rest of epoch {loaded} is never read"
            if epoch > loaded
            else f"epoch {epoch} is read in full, then epoch {loaded} from its start: its consumed rows "
            "are read again"
        )
        warnings.warn(
            f"set_epoch({epoch}) drops the resume state loaded for epoch {loaded} before any of it was "
            f"read{consumed}: {what}. A resumed loop continues at the state's epoch: call "
            f"set_epoch({loaded}) (dataset.epoch after load_state_dict) and count epochs from there",
            UserWarning,
            stacklevel=3,
        )

    def begin_pass(self, num_workers: int) -> EpochProgress:
        """Main process: a pass over the current epoch starts; returns its record.

        Warns once when ``shuffle=True`` and a pass over the same epoch already ran to its
        end with no ``set_epoch`` since: every epoch would repeat one order.
        """
        state = self._state
        if state.completed_pass and self._options.shuffle.shuffle and not self._warned_repeat:
            self._warned_repeat = True
            warnings.warn(
                f"a second pass over epoch {self.epoch} starts with shuffle=True and no set_epoch() "
                "since the first one ended: it repeats the same order. Call loader.set_epoch(epoch) "
                "(or dataset.set_epoch, or loader.sampler.set_epoch, which Lightning calls) before "
                "every epoch",
                UserWarning,
                stacklevel=4,
            )
        return state.begin(num_workers, self.epoch)

    # -- metrics ----------------------------------------------------------------
    def get_metrics(self) -> list[WorkerMetrics]:
        """Per-worker counters of the batches the loop received since the last call.

        One :class:`~torch_dataloader_utils.runtime.metrics.WorkerMetrics` per worker
        that delivered a batch (``rows_read``, ``batches_read``, ``bytes_read``,
        ``files_read``, ``elapsed_sec``), by worker id; also logs an epoch summary at
        INFO. The counters are then cleared: a second call returns ``[]``.
        ``set_epoch`` and :meth:`reset_metrics` discard them too.
        """
        return self.metrics.drain()

    def reset_metrics(self) -> None:
        """Discard the counters collected so far."""
        self.metrics.reset()

    def begin_metrics(self, num_workers: int) -> None:
        """A pass over the current epoch starts (main process): plan it, note it, show progress.

        The main process plans this rank's epoch before its DataLoader workers do, so
        that they can check they agree with it (a custom strategy must be a pure
        function of its arguments), and so that ``state_dict()`` knows each worker's
        rows without planning while the loop waits.
        """
        epoch = self.epoch
        workers = self._readers(num_workers)
        segments = self._state.live_segments(epoch)
        self._rows_per_piece(epoch, workers, segments or ())
        self._state.fingerprint()
        self._joiner = None
        if self._elastic is not None and num_workers > 0 and self._elastic.layout.readers(num_workers) > 1:
            join = join_converted if self._join_converted else self._joined
            layout, rank = self._elastic.layout, self.world.rank
            rows = [
                layout.per_stream * len(layout.of_worker(rank, w, num_workers))
                for w in range(layout.readers(num_workers))
            ]
            blocks = join_converted_blocks if self._join_converted else None
            self._joiner = Joiner(rows, join, self._consume_part, blocks)
        config = self._options.progress
        rank = self.world.rank
        if not Progress.shown_on(config, rank):
            self.metrics.begin(epoch)
            return

        def display() -> Progress:
            total, done = self._progress_rows(epoch, workers)
            return Progress(config, rank=rank, epoch=epoch, total=total, done=done)

        self.metrics.begin(epoch, display)

    def _progress_rows(self, epoch: int, workers: int) -> tuple[int | None, int]:
        """Rows this rank's loop receives in ``epoch`` (``None``: unknown), and those already consumed."""
        if self._row_count_issue:
            return None, 0
        batching = self._options.batching

        def delivered(rows: list[int | None]) -> int | None:
            if any(r is None for r in rows):
                return None
            size = batching.batch_size
            return sum((r or 0) // size * size if batching.drop_last else (r or 0) for r in rows)

        segments = self._state.live_segments(epoch)
        if self._elastic is not None:
            rows, done = self._elastic.rows(epoch, segments or ())
            return self._elastic.layout.per_rank * rows, self._elastic.layout.per_rank * done
        plan = self.rank_plan(epoch, workers)
        total = delivered([plan.rows_for(w) for w in range(plan.num_workers)])
        if total is None or not segments:
            return total, 0
        left = delivered(
            [
                None if any(p.num_rows is None for p in pieces) else sum(p.num_rows or 0 for p in pieces)
                for pieces in self._pieces(epoch, workers, segments)
            ]
        )
        return total, 0 if left is None else max(0, total - left)

    def rank_metrics(self) -> RankMetrics:
        """This rank's metrics since the last reset (see ``ResumableDataLoader.metrics``)."""
        dropped = 0
        if self._options.equalized and not self._row_count_issue:
            workers = self._readers(None)
            planner = self._planner if self._elastic is None else self._elastic.planner
            dropped = sum(c.num_rows or 0 for c in planner.dropped(self.metrics.epoch, workers))
        return self.metrics.rank_metrics(self.world.rank, self.world.num_ranks, dropped)

    # -- planning ---------------------------------------------------------------
    def _readers(self, num_workers: int | None) -> int:
        """Reading processes per rank in a plan: the DataLoader's workers, or 1 (the main process).

        ``None`` means the dataset's own ``num_workers``.
        """
        return max(1, self._num_workers if num_workers is None else num_workers)

    @property
    def planner(self) -> Planner:
        """The dataset's planner (chunk table built once; plans one rank at a time)."""
        return self._planner

    @property
    def file_table(self) -> FileTable:
        """The dataset's files as numpy columns."""
        return self._table

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
        workers = self._readers(num_workers)
        in_worker = env.worker_slot().in_worker
        totals = None
        if self._totals is not None and int(self._totals[0]) == epoch + 1:
            totals = self._totals[1:].tolist()
        plan = self._planner.rank_plan(epoch, self.world.rank, workers, totals=totals, verify=not in_worker)
        if plan.digest is not None:
            self._check_digest(plan, in_worker)
        if not in_worker and epoch not in self._logged:
            self._log_left_out(epoch, workers)
        return plan

    def _check_digest(self, plan: RankPlan, in_worker: bool) -> None:
        """Main process: publish the custom strategy's chunks digest; worker: compare."""
        epoch, digest = plan.epoch, plan.digest
        if not in_worker:
            self._digest[0], self._digest[1], self._digest[2] = epoch + 1, plan.num_workers, digest
            if self._totals is not None:
                self._totals[1:] = torch.as_tensor(self._planner.totals(epoch, plan.num_workers))
                self._totals[0] = epoch + 1
            return
        published = self._digest.tolist()
        if published[:2] == [epoch + 1, plan.num_workers] and published[2] != digest:
            raise nondeterministic(
                self._planner.spec.strategy.name,
                f"a DataLoader worker and the main process of rank {self.world.rank}, epoch {epoch}",
            )

    def _log_left_out(self, epoch: int, workers: int) -> None:
        """Say which rows equal batches leave out (``'drop'``) or repeat (``'pad'``)."""
        self._logged.add(epoch)
        if not self._options.equalized or self.world.rank != 0:
            return
        shuffle = self._options.shuffle.shuffle
        level = logging.DEBUG if shuffle else logging.INFO
        if not log.isEnabledFor(level):
            return
        policy = self.equal_batches
        chunks = self._planner.dropped(epoch, workers) if policy is EqualBatches.DROP else ()
        if policy is EqualBatches.PAD:
            chunks = self._planner.padding(epoch, workers)
        rows = sum(c.num_rows or 0 for c in chunks)
        if not rows:
            return
        what = "leaves out" if policy is EqualBatches.DROP else "repeats"
        where = ", ".join(
            f"{c.path} {'records' if c.unit.value == 'bytes' else 'rows'} "
            + (
                f"[{c.start}, {c.stop})"
                if c.unit.value == "rows"
                else f"{c.skip}..{c.skip + (c.num_rows or 0)} of bytes [{c.start}, {c.stop})"
            )
            for c in chunks
        )
        when = (
            f"in epoch {epoch} (other rows in other epochs: shuffle=True)"
            if shuffle
            else "in every epoch (shuffle=False: the last rows of the last rank's share)"
            if policy is EqualBatches.DROP
            else "in every epoch (shuffle=False: the first rows of rank 0's share)"
        )
        log.log(
            level,
            "equal_batches=%r %s %d row(s) %s to give each of %d ranks the same number: %s",
            policy.value,
            what,
            rows,
            when,
            self.world.num_ranks,
            where,
        )

    def verify_plan(self, epoch: int | None = None, num_workers: int | None = None) -> None:
        """Check that no two chunks of any ranks share a row in ``epoch`` (``plan --verify``).

        For a custom rank-aware strategy it calls the strategy for every rank, the check
        that planning skips in worlds of more than 16 ranks unless ``verify_plan=True``.

        Raises:
            OverlappingChunksError: two chunks share rows (naming both).
            PlanError: the strategy returned invalid chunks.
        """
        epoch = self.epoch if epoch is None else epoch
        self._planner.verify(epoch, self._readers(num_workers))

    def plan(self, epoch: int | None = None, num_workers: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the current one) for every rank and worker.

        Each rank is planned when its chunks are first read (``plan.assignments[rank]``,
        ``chunks_for``, ``rank_chunks``), so asking for one rank of a large world costs
        one rank's plan; ``all_chunks()`` plans them all. For this process's own rank,
        :meth:`rank_plan` is the cheaper call.
        """
        epoch = self.epoch if epoch is None else epoch
        workers = self._readers(num_workers)
        key = (epoch, workers)
        plan = self._plans.get(key)
        if plan is None:
            plan = (
                self._planner.epoch_plan(epoch, workers)
                if self._elastic is None
                else self._elastic_plan(epoch, workers)
            )
            self._plans[key] = plan
        return plan

    def _elastic_plan(self, epoch: int, workers: int) -> EpochPlan:
        """Elastic order: every rank's workers' chunks, their canonical streams' (fresh) chunks."""
        assert self._elastic is not None
        elastic, layout = self._elastic, self._elastic.layout

        def chunks(rank: int, worker: int) -> WorkerChunks:
            streams = layout.of_worker(rank, worker, workers)
            return tuple(c for s in streams for p in elastic.fresh(epoch, s) for c in p.chunks)

        return EpochPlan(
            epoch=epoch,
            seed=self._options.shuffle.shuffle_seed if self._options.shuffle.shuffle else None,
            num_ranks=self.world.num_ranks,
            num_workers=workers,
            assignments=tuple(
                tuple(chunks(r, w) for w in range(workers)) for r in range(self.world.num_ranks)
            ),
            dropped=elastic.planner.dropped(epoch, 1),
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Workers plan their own epoch; do not ship plans (the planner keeps its chunk table).
        for name in ("_plans", "_resumers", "_piece_rows"):
            state[name] = BoundedDict(4)
        state["_last_rows"] = None
        return state

    def _auto_workers(self) -> int:
        """Workers for ``num_workers=None``: CPUs per rank, at most one per chunk, at most 8.

        One worker would only add a process hop, so 1 becomes 0 (read in the main process).
        """
        # Elastic order: a worker reads whole canonical streams, at most one per stream.
        chunks = (
            self.rank_plan(0, num_workers=1).share_size
            if self._elastic is None
            else self._elastic.layout.per_rank
        )
        workers = min(env.cpus_per_rank(), chunks, MAX_AUTO_WORKERS)
        return 0 if workers <= 1 else workers

    def _check_plan(self) -> None:
        """Log the plan of epoch 0 and warn about layouts that will hurt (rank 0).

        The summary covers every rank, so rank 0 plans them all once: up to
        :data:`REPORT_MAX_RANKS` ranks. A larger world is summarized by the ``plan``
        command instead; each rank then only warns about its own idle workers.
        """
        shuffle = self._options.shuffle
        if self._elastic is None:
            chunks = self.rank_plan(0).share_size  # this rank's plan, checked (a custom strategy too)
        else:
            chunks = self._elastic.layout.readers(self._num_workers)  # workers reading streams
        if self.world.num_ranks <= REPORT_MAX_RANKS:
            report_plan(
                self.plan(0),
                self._table,
                rank=self.world.rank,
                shuffle=shuffle.shuffle,
                row_window=shuffle.rows_mixed,
                batch_size=self._options.batching.batch_size,
            )
            return
        if self._num_workers > 1 and chunks < self._num_workers:
            warnings.warn(
                f"num_workers={self._num_workers} but rank {self.world.rank} has only "
                f"{chunks} chunk(s) in epoch 0: {self._num_workers - chunks} worker(s) "
                "will read nothing. Lower split_bytes / split_rows or num_workers.",
                UserWarning,
                stacklevel=5,
            )

    def _plan_digest(self, epoch: int, workers: int) -> int | None:
        """A custom strategy's digest of the chunks this rank's fresh pass reads (a state records it)."""
        if self._elastic is not None:
            return self._elastic.digest(epoch, self._elastic.layout.of_rank(self.world.rank)[0])
        return self.rank_plan(epoch, workers).digest

    def _validate(self, epoch: int, segments: tuple[Segment, ...]) -> object:
        """Plan the rest of ``epoch`` after ``segments`` (raising on a state that does not fit)."""
        if self._elastic is not None:
            return self._elastic.streams(epoch, segments)
        return self._pieces(epoch, self._num_workers, segments)

    def _resumer(self, epoch: int, workers: int, segments: tuple[Segment, ...]) -> Resumer:
        key = (epoch, workers, hash(segments))
        found = self._resumers.get(key)
        if found is None or found.levels != len(segments):
            found = Resumer(
                self._planner,
                epoch,
                segments,
                num_ranks=self.world.num_ranks,
                num_workers=lambda rank: workers,
                window_rows=self.row_shuffle_window,
                exact=self._row_count_issue is None,
                mixing=self.row_mixing,
            )
            self._resumers[key] = found
        return found

    def _pieces(
        self, epoch: int, workers: int, segments: Sequence[Segment | Mapping[str, Any]]
    ) -> tuple[tuple[Piece, ...], ...]:
        """This rank's pieces per worker after the resumed ``segments`` (or with a row window)."""
        return self._resumer(epoch, workers, segments_of(segments)).rank(self.world.rank)

    def _worker_pieces(self, slot: env.WorkerSlot, epoch: int) -> tuple[Piece, ...]:
        segments = self._state.live_segments(epoch)
        if segments:
            return self._pieces(epoch, slot.count, segments)[slot.id]
        return self._reader_pieces(epoch, self.world.rank, slot.id, slot.count)

    def _reader_pieces(self, epoch: int, rank: int, worker: int, workers: int) -> tuple[Piece, ...]:
        """The pieces worker ``worker`` of ``workers`` of ``rank`` reads in a full pass over ``epoch``."""
        if rank == self.world.rank:
            plan = self.rank_plan(epoch, workers)
        else:
            plan = self._planner.rank_plan(epoch, rank, workers)
        pieces = plan.pieces_for(worker)
        # Only this worker's windows / mixes, keyed as the Resumer keys segment 0.
        shuffle = self._options.shuffle
        key = (shuffle.shuffle_seed if shuffle.shuffle else 0, epoch, 0, rank, worker)
        return tuple(group(pieces, self.row_shuffle_window, self.row_mixing, key, self._table))

    def _rows_per_piece(
        self, epoch: int, workers: int, segments: tuple[Segment, ...]
    ) -> list[list[int]] | None:
        """Rows of each piece of each worker of this rank (``None`` if a count is unknown).

        What ``state_dict()`` turns into the rows each worker has left; computed once
        per pass.
        """
        workers = max(1, workers)
        last = self._last_rows
        if last is not None and last[0] is segments and last[1:3] == (epoch, workers):
            return last[3]  # state_dict() during a pass: no hashing of the segments
        key = (epoch, workers, hash(segments))
        if key in self._piece_rows:
            self._last_rows = (segments, epoch, workers, self._piece_rows[key])
            return self._piece_rows[key]
        rows: list[list[int]] | None = []
        counts: list[list[int | None]]
        if self._elastic is not None:  # a worker's streams, read interleaved: one piece
            total, done = self._elastic.rows(epoch, segments)
            layout = self._elastic.layout
            counts = [
                [len(layout.of_worker(self.world.rank, w, workers)) * (total - done)] for w in range(workers)
            ]
        elif not segments and self.row_shuffle_window is None and self.row_mixing is None:
            plan = self.rank_plan(epoch, workers)  # a piece is a chunk: no pieces built
            counts = [plan.piece_rows(w) for w in range(workers)]
        else:
            counts = [[p.num_rows for p in ps] for ps in self._pieces(epoch, workers, segments)]
        if any(n is None for ps in counts for n in ps):
            rows = None
        else:
            rows = [[int(n or 0) for n in ps] for ps in counts]
        self._piece_rows[key] = rows
        self._last_rows = (segments, epoch, workers, rows)
        return rows

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
        return self._pass_batches(epoch, self._readers(num_workers), None)

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
        epoch = self.epoch
        progress = self._state.progress
        if progress is None:
            workers = self._readers(None)
            return self._pass_batches(epoch, workers, self._state.live_segments(epoch))
        if progress.done:
            return 0
        total = self._pass_batches(epoch, progress.num_workers, progress.base or None)
        return max(0, total - progress.batches)

    def _pass_batches(self, epoch: int, workers: int, segments: tuple[Segment, ...] | None) -> int:
        """Batches of a pass over ``epoch`` by ``workers`` readers: whole, or after ``segments``."""
        if self._row_count_issue:
            raise UnknownLengthError(
                f"the number of batches is unknown before reading: {self._row_count_issue}. "
                "Iterate to count, or drop the row filter to get len()"
            )
        if self._elastic is not None:
            return self._elastic.batches(epoch, segments or (), self._options.batching.drop_last)
        if segments:
            rows: list[int | None] = [
                None if any(p.num_rows is None for p in pieces) else sum(p.num_rows or 0 for p in pieces)
                for pieces in self._pieces(epoch, workers, segments)
            ]
            unknown = "the number of batches left in this resumed epoch is unknown"
        else:
            plan = self.rank_plan(epoch, workers)
            rows = [plan.rows_for(w) for w in range(plan.num_workers)]
            unknown = (
                "the number of batches is unknown before reading: this format's row counts "
                "are not in its metadata (byte-range chunks). Iterate to count"
            )
        total = 0
        for count in rows:
            if count is None:
                raise UnknownLengthError(unknown)
            full, rest = divmod(count, self._options.batching.batch_size)
            total += full + (1 if rest and not self._options.batching.drop_last else 0)
        return total

    def __len__(self) -> int:
        """Batches this rank yields in a full pass over the current epoch (see :meth:`num_batches`)."""
        return self.num_batches()

    # -- reading ----------------------------------------------------------------
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
        return _without_standins(self._reader.read(chunk))

    def read_chunks(self, chunks: Sequence[Chunk]) -> Iterator[pa.RecordBatch]:
        """The rows of several chunks, one after the other, as :meth:`read_chunk` gives them.

        On remote storage the bytes of the next chunks are fetched while one is decoded
        (``read_ahead_bytes``), as the loader does for a worker's chunks.
        """
        self._reader.schedule(list(chunks))
        for chunk in chunks:
            yield from _without_standins(self._reader.read(chunk))

    def worker_chunks(self) -> tuple[Chunk, ...]:
        """The chunks the calling process (main or DataLoader worker) reads this epoch."""
        slot = env.worker_slot()
        if self._elastic is not None:
            segments = self._state.live_segments(self.epoch) or ()
            streams = self._elastic.of_worker(self.epoch, segments, slot.id, slot.count)
            return tuple(c for pieces in streams for p in pieces for c in p.chunks)
        return self.rank_plan(self.epoch, slot.count).chunks_for(slot.id)

    def __iter__(self) -> Iterator[Any]:
        slot = env.worker_slot()
        if slot.in_worker:
            watch_parent()
        epoch = self.epoch
        batches, positions, work = self._reads(slot, epoch)
        # Elastic order with several reading workers: each yields its part of every batch,
        # as Arrow, and the main process joins and converts them (Joiner).
        joined = self._elastic is not None and slot.in_worker and self._elastic.layout.readers(slot.count) > 1
        tagging = self._state.tagging
        if slot.in_worker and tagging:
            # Under the loader of create_dataloader (which flattens groups): several
            # batches per transfer, since each hand-off between processes has a fixed
            # cost; the worker's timers and counters travel with them.
            pool = self.transport.writer(slot.id) if self.transport is not None else None
            convert = _as_is if joined and not self._join_converted else self._for_transfer
            yield from grouped(batches, convert, positions, work, pool)
            return
        if joined:
            raise IncompatibleOptionsError(
                f"canonical_ranks={self._options.canonical} with {slot.count} DataLoader workers needs the "
                "loader of create_dataloader, which joins the workers' parts of every batch; iterate "
                "that loader, or read with num_workers=0"
            )
        if slot.in_worker:  # a DataLoader of the user's own: no tags, no metrics
            yield from self._plain(batches)
            return
        self.metrics.attach(slot.id, work)
        if tagging:  # the loader of create_dataloader, reading in this process
            yield from self._tagged(batches, positions, work)
            return
        # Iterated directly in the main process: record what the loop consumes here.
        progress = self.begin_pass(1)
        self.begin_metrics(0)
        yield from consumed_here(self._tagged(batches, positions, work), self._state, progress, self.metrics)

    def _warm_next(self, slot: env.WorkerSlot, epoch: int) -> None:
        """Warm the node-local cache with this worker's first chunks of the next epoch (idle threads).

        Elastic order: the first chunks of the worker's streams, taken in turn (its
        batches draw from every stream at once).
        """
        count = self._options.cache.data_cache_prefetch
        if not count:
            return
        try:
            if self._elastic is None:
                chunks = list(self.rank_plan(epoch + 1, slot.count).chunks_for(slot.id))
            else:
                streams = self._elastic.of_worker(epoch + 1, (), slot.id, slot.count)
                files = None if self._row_count_issue else self._table
                reads = [[c for piece in stream for c in piece_reads(piece, files)] for stream in streams]
                chunks = [c for turn in itertools.zip_longest(*reads) for c in turn if c is not None]
        except Exception as exc:  # best effort: never stop the epoch being read
            log.debug("no cache warming for epoch %d: %s", epoch + 1, exc)
            return
        self._reader.warm(chunks[:count])

    def _helpers(self, slot: env.WorkerSlot) -> Helpers | None:
        """Threads for a shuffle's decoding and gathers, when this process has CPUs to spare.

        A worker gets its share of the rank's CPUs less its own thread; the main process
        all of them less its own and the read-ahead thread. None on small machines.
        """
        if self.row_mixing is None and self.row_shuffle_window is None:
            return None
        cpus = env.cpus_per_rank()
        spare = cpus // slot.count - 1 if slot.in_worker else cpus - 2
        return helpers(spare)

    def _reads(
        self, slot: env.WorkerSlot, epoch: int
    ) -> tuple[Iterator[pa.RecordBatch], Positions, WorkStats]:
        """This process's batches of ``epoch``, their positions, and its counters."""
        # Workers that already fill this rank's CPUs decode in their own thread, and
        # only when asked; with a CPU to spare, batches are decoded ahead of the caller.
        spare = slot.count < env.cpus_per_rank() if slot.in_worker else env.cpus_per_rank() > 1
        if slot.in_worker:
            self._reader.use_threads(spare)
        ahead = self._options.fetch.decode_ahead
        ahead = spare if ahead is None else ahead
        files = None if self._row_count_issue else self._table
        batching = self._options.batching
        padded = batching.equal_batches is EqualBatches.PAD
        flag = PADDING_COLUMN if padded else None
        mix_rows = MIX_WORKER_READ_ROWS if slot.in_worker else None
        token = self._state.token
        if self._elastic is not None:
            streams = self._elastic.of_worker(
                epoch, self._state.live_segments(epoch) or (), slot.id, slot.count
            )
            work = WorkStats(self._reader, sum(map(len, streams)), flag)
            part = self._elastic.layout.per_stream
            joined = slot.in_worker and self._elastic.layout.readers(slot.count) > 1
            batches = interleave(
                self._reader,
                streams,
                part,
                drop_last=batching.drop_last,
                flag_column=flag,
                files=files,
                mix_read_rows=MIX_WORKER_READ_ROWS,
                # A worker whose parts are joined sends its parts of many batches at once:
                # the main process joins them with one copy per column (Joiner).
                batches=part_batches(self._elastic.layout) if joined else 1,
                ahead=ahead,
            )
            self._warm_next(slot, epoch)
            return batches, StreamPositions(token, slot.id, slot.count, rank=self.world.rank), work
        pieces = self._worker_pieces(slot, epoch)
        work = WorkStats(self._reader, len(pieces), flag)  # before any request of this pass
        self._reader.schedule([c for piece in pieces for c in piece_reads(piece, files)])  # remote: ahead
        self._warm_next(slot, epoch)
        # Rows of skipped units: flagged as padding (kept), or flagged to be removed.
        removed = STANDIN_COLUMN if self._options.bad_data.skipping and not padded else None
        positions = Positions(token, slot.id, slot.count, rank=self.world.rank)
        read = positions.read(
            self._reader,
            pieces,
            flag or removed,
            batching.batch_size,
            files,
            mix_rows,
            ahead=ahead,
            standins=removed,
            helpers=self._helpers(slot),
        )
        return rebatch(read, batching.batch_size, batching.drop_last), positions, work

    @property
    def joins(self) -> bool:
        """Main process: this pass joins workers' parts into batches (:meth:`deliver` is needed)."""
        return self._joiner is not None

    def deliver(self, item: Any, progress: EpochProgress) -> Iterable[Any]:
        """Main process: a batch received from a worker, on its way to the loop.

        A plain batch is returned as it came (tagged: the loop's hand-over records it in
        ``progress``). In elastic order with several reading workers an item is a
        worker's part of a batch: the batches it completes, joined and converted, are
        returned, each recorded in ``progress`` when it is made.
        """
        joiner = self._joiner
        if joiner is None or not isinstance(item, Tagged):
            return (item,)
        self._joining = progress
        return joiner.add(item)  # an iterator: each batch made (and consumed) when asked for

    def _consume_part(self, part: Tagged) -> Any:
        """Elastic order: record a worker's part of a joined batch in the pass being joined."""
        return self._state.consume(part, self._joining)

    def delivered(self) -> None:
        """Main process: the pass ended; every worker's part was joined into a batch."""
        if self._joiner is not None:
            self._joiner.check_done()

    def _joined(self, parts: list[pa.RecordBatch]) -> Any:
        """Parts of a batch read as Arrow: joined and converted here (``collate_fn`` too)."""
        collate = self._options.output.collate_fn
        out = self._converter(concat_batches(parts))
        return out if collate is None else collate(out)

    def _tagged(
        self, batches: Iterator[pa.RecordBatch], positions: Positions, work: WorkStats
    ) -> Iterator[Tagged]:
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
            out = self._converter(batch)
            if collate is not None:
                out = collate(out)
            asked = clock()
            work.convert_sec += asked - got
            yield Tagged(out, tag)
            asked = clock()

    def _plain(self, batches: Iterator[pa.RecordBatch]) -> Iterator[Any]:
        """A worker of a DataLoader of the user's own: each batch packed for its transfer."""
        collate = self._options.output.collate_fn
        for batch in batches:
            if collate is None:
                # Strings travel as Arrow buffers in the batch's one buffer (transfer.pack).
                yield pack(self._converter.convert_for_transfer(batch))
            else:
                yield pack(collate(self._converter(batch)))

    def _for_transfer(self, batch: pa.RecordBatch) -> Any:
        collate = self._options.output.collate_fn
        if collate is None:
            return self._converter.convert_for_transfer(batch)
        return collate(self._converter(batch))

    # -- resume -----------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """What a resume state of this dataset is tied to (files digest and options)."""
        return self._state.fingerprint()

    def state_dict(self) -> dict[str, Any]:
        """What the training loop has consumed of the current epoch, as plain JSON values.

        Counted in the main process: the batches the loop received (from the loader of
        ``create_dataloader``, or from iterating this dataset in the main process)
        before this call; batches prefetched by workers are not consumed. The state
        holds this rank only; combine ranks with ``merge_states`` or ``gather_state``.
        It is tied to the files and options (``fingerprint``) and is small: a cursor
        ``(piece, row offset)`` per worker, per interrupted segment of the epoch.
        """
        if env.worker_slot().in_worker:
            raise ResumeStateError(
                "state_dict() was called in a DataLoader worker, which does not know what the "
                "training loop consumed (batches count as consumed when the loop receives them, in "
                "the main process); call loader.state_dict() in the training loop"
            )
        return self._state.state_dict(self.epoch, self._rows_per_piece, self._plan_digest)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state: the next pass over its epoch reads only what was not consumed.

        The state must hold every rank (one rank's own state on a single-rank job, else
        ``merge_states([...])`` or ``gather_state``), or, under an initialized
        ``torch.distributed`` process group, be this rank's own state loaded by every
        rank at the same call (the states are then gathered and merged, see
        :func:`~torch_dataloader_utils.runtime.state.complete_state`). The rest of the epoch is
        re-planned over this dataset's world, which may have other ``num_ranks`` and
        ``num_workers`` than the saved one. Sets :attr:`epoch` to the state's epoch;
        the epoch after it is a normal full epoch. A state that fails a check changes
        nothing.

        Raises:
            ResumeStateError: not a state, another version, or not every rank.
            StateMismatchError: saved for other files or options (says what changed).
        """
        state = complete_state(plain_state(state), self.world)
        previous = self._adopt_split(state)
        try:
            epoch = self._state.load(state, self._validate)
        except BaseException:
            if previous is not None:  # a refused state changes nothing
                self._use_split(*previous)
            raise
        self._epoch.fill_(epoch)


def _without_standins(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` without the stand-ins of skipped units (reading outside the loader)."""
    return (b for b in batches if not is_standin(b))
