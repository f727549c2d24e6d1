"""Training-data recipes: several sources mixed by weight, exactly once per source epoch.

:func:`create_mixed_dataloader` reads several sources (directories of files, Iceberg
tables) as one dataset. Every batch takes rows of each source in proportion to its
weight, within one row (:mod:`~torch_dataloader_utils.plan.blend`), and every source is
read without replacement: each of its rows once per *its own* epoch.

How it is read. Each source is discovered and planned by its own
:class:`~torch_dataloader_utils.runtime.dataset.PlannedDataset`, for ``lanes = ranks x
reading processes per rank`` lanes (:mod:`.lanes`): with equal batches every lane
holds the same rows of each source epoch, so every lane builds the same sequence of
batch compositions (the :class:`~torch_dataloader_utils.plan.blend.PassPlan` of the
epoch) from its own streams, and ranks yield equal batch counts. A worker of the
DataLoader is one lane; it reads its streams of all sources side by side, takes each
batch's rows of each source, joins them (in a seeded order with ``shuffle=True``),
adds the source index column when asked, and converts the batch.

Positions carry over. A source that runs out starts its next epoch (``cycle``) or ends
the mix's epoch (``stop``); the other sources go on where they stood in the next
epoch of the mix. Where every source stands when an epoch of the mix starts is
computed from the epoch before (:meth:`MixedDataset.start_of`), from the start of
training or from the last state loaded, identically in every process.

Resume. A state records where the pass started (every source: the rest of epochs it
had begun, as its own resume segments, then its next whole epoch) and how many batches
the loop received from every lane. Loading it turns the batches into each source's
rows consumed per lane, so each source's rest is re-dealt by its own resume planning,
over any number of ranks and workers; the resumed pass then mixes the rests.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from torch_dataloader_utils.config import (
    PADDING_COLUMN,
    EqualBatches,
    FileFormat,
    MixConfig,
    OnExhausted,
    check_int,
)
from torch_dataloader_utils.errors import (
    ConfigError,
    IncompatibleOptionsError,
    ResumeStateError,
    SchemaMismatchError,
)
from torch_dataloader_utils.io.ahead import read_ahead
from torch_dataloader_utils.io.base import ChunkReader, IoTotals, ReaderBase, ReaderCounts
from torch_dataloader_utils.io.batching import concat_batches
from torch_dataloader_utils.io.pieces import ROUND_POOL
from torch_dataloader_utils.packing import converter_for
from torch_dataloader_utils.plan.blend import Blend, PassPlan, advance, blend_for, integer_weights, plan_pass
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.mixposition import Segments, SourcePosition, position_of
from torch_dataloader_utils.plan.mixstate import (
    MIX_STATE_FORMAT,
    MIX_STATE_VERSION,
    check_mix_state,
    merge_mixed_states,
)
from torch_dataloader_utils.plan.shuffle import permutation, random_offset
from torch_dataloader_utils.plan.state import plain_state
from torch_dataloader_utils.plan.types import Chunk, World
from torch_dataloader_utils.runtime import env
from torch_dataloader_utils.runtime.dataset import (
    MAX_AUTO_WORKERS,
    PlannedDataset,
    batch_schema,
    consumed_here,
)
from torch_dataloader_utils.runtime.emit import ArrowBytes, grouped
from torch_dataloader_utils.runtime.files import StructuredDataset, source_paths
from torch_dataloader_utils.runtime.iceberg import IcebergDataset
from torch_dataloader_utils.runtime.lanes import LaneSource
from torch_dataloader_utils.runtime.loader import ResumableDataLoader, build_loader
from torch_dataloader_utils.runtime.metrics import MetricsRecorder, RankMetrics, WorkerMetrics
from torch_dataloader_utils.runtime.options import (
    FileReadOptions,
    IcebergReadOptions,
    MixedLoaderOptions,
    Options,
    build_options,
    file_source,
    iceberg_source,
)
from torch_dataloader_utils.runtime.progress import Progress
from torch_dataloader_utils.runtime.state import Tagged
from torch_dataloader_utils.runtime.watchdog import watch_parent
from torch_dataloader_utils.runtime.workstats import WorkStats
from torch_dataloader_utils.transfer import pack

__all__ = ["MixTracker", "MixedDataLoader", "MixedDataset", "create_mixed_dataloader"]

_ORDER_SALT = 0x6D6978  # keys the row order inside a mixed batch, apart from other draws
_PHASE_SALT = 0x706861  # keys where a pass starts in the blend's cycle


# -- where every source stands -------------------------------------------------------------
Start = tuple[SourcePosition, ...]
"""Where every source stands when a pass starts."""


@dataclass(frozen=True)
class _Origin:
    """The start the epochs are counted from: epoch ``epoch`` starts at ``start`` (pass ``segment``).

    ``full``: where that epoch's first pass started (in this world), when ``segment > 0``.
    """

    epoch: int
    start: Start
    segment: int = 0
    token: int = 0
    full: Start | None = None


# -- the batches of one lane ----------------------------------------------------------------
class _LaneStream:
    """One lane's rows of one source: its begun epochs, then whole epochs, as slices."""

    def __init__(
        self, source: LaneSource, lane: int, position: SourcePosition, names: Sequence[str], **read: Any
    ) -> None:
        self._source = source
        self._lane = lane
        self._names = list(names)
        self._read = read
        self._queue = [(e, s) for e, s in position.entries]
        self._next = position.next_epoch
        self._skip = position.skip
        self._batches: Iterator[pa.RecordBatch] | None = None
        self._current: pa.RecordBatch | None = None
        self._offset = 0
        self._size = 0

    def _open(self) -> Iterator[pa.RecordBatch]:
        if self._queue:
            epoch, segments = self._queue.pop(0)
        else:
            epoch, segments = self._next, ()
            self._next += 1
        skip, self._skip = self._skip, 0
        return self._source.read(epoch, segments, self._lane, skip, **self._read)

    def take(self, rows: int, out: list[pa.RecordBatch]) -> None:
        """Append the next ``rows`` rows to ``out`` (zero-copy slices, columns in ``names`` order)."""
        empty = 0
        while rows > 0:
            current = self._current
            if current is None or self._offset >= self._size:
                if self._batches is None:
                    self._batches = self._open()
                current = self._current = next(self._batches, None)
                self._offset = 0
                if current is None:
                    self._batches = None
                    self._size = 0
                    empty += 1
                    if empty > 2:  # cannot happen with exact counts; never loop forever
                        raise RuntimeError("a source's lane stream ended before its planned rows")
                    continue
                empty = 0
                if current.schema.names != self._names:
                    current = self._current = current.select(self._names)
                self._size = current.num_rows
            n = min(rows, self._size - self._offset)
            out.append(current.slice(self._offset, n))
            self._offset += n
            rows -= n


class _Tagger:
    """Tags a lane's batches ``(token, worker, workers, 0, batches done, rows, nbytes)``."""

    def __init__(self, token: int, worker: int, workers: int, done: int = 0) -> None:
        self._prefix = (token, worker, workers, 0)
        self.worker = worker
        self.done = done

    def tag(self, rows: int, nbytes: int = 0) -> tuple[int, ...]:
        self.done += 1
        return (*self._prefix, self.done, rows, nbytes)


class _IoTotals(ReaderBase):
    """The I/O counters of several readers, summed (what :class:`WorkStats` asks of a reader)."""

    def __init__(self, readers: Sequence[ChunkReader]) -> None:
        self._readers = list(readers)

    def read(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """Not a reader of its own: each source reads its chunks."""
        raise TypeError("the I/O counters of a mix read no chunk")

    def io_totals(self) -> IoTotals | None:
        """The readers' counters, summed (``None`` when none counts)."""
        found = [t for t in (r.io_totals() for r in self._readers) if t is not None]
        if not found:
            return None
        sums = [sum(t[i] for t in found) for i in range(5)]
        return (int(sums[0]), int(sums[1]), int(sums[2]), int(sums[3]), float(sums[4]))

    def counts(self) -> ReaderCounts | None:
        """The readers' cache and bad-data counters, summed (``None`` when none counts)."""
        found = [c for c in (r.counts() for r in self._readers) if c is not None]
        return sum(found[1:], found[0]) if found else None


AHEAD_ROWS = 65536
"""Rows of mixed batches the read-ahead thread hands over at once (as a decoded batch of
``create_dataloader``'s read path holds)."""


def _runs(items: Iterator[pa.RecordBatch], size: int) -> Iterator[list[pa.RecordBatch]]:
    """``items`` in lists of ``size`` (the last may be shorter)."""
    run: list[pa.RecordBatch] = []
    for item in items:
        run.append(item)
        if len(run) >= size:
            yield run
            run = []
    if run:
        yield run


def _flat(runs: Iterator[list[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
    for run in runs:
        yield from run


# -- what the loop consumed -------------------------------------------------------------------
class _MixProgress:
    """Batches the loop received from every lane of this rank in one pass.

    Attributes:
        workers: Reading processes of the pass (lanes of this rank).
        plan: The pass's plan (batches of every lane).
        received: Batches the loop received from each lane.
        batches: Batches the loop received in all.
        done: The pass ran to its end.
        running: The pass has not ended yet (not exhausted, closed, or failed).
        tracked: The pass is the one the resume state describes (not one nested in it).
    """

    BLOCK = 1024
    """Batches whose rows per source are computed at once."""

    def __init__(self, workers: int, plan: PassPlan, tracked: bool = True) -> None:
        self.workers = workers
        self.plan = plan
        self.received = [0] * workers
        self.batches = 0
        self.done = False
        self.running = True
        self.tracked = tracked
        self._block = -1
        self._counts = np.zeros((0, plan.blend.num_sources), dtype=np.int64)

    def counts(self, t: int) -> np.ndarray:
        """Rows of every source in batch ``t`` of a lane (blocks of them computed at once)."""
        block, at = divmod(t, self.BLOCK)
        if block != self._block:
            self._counts = self.plan.counts_of(block * self.BLOCK, (block + 1) * self.BLOCK)
            self._block = block
        counts: np.ndarray = self._counts[at]
        return counts

    @property
    def remaining(self) -> int:
        """Batches of this rank the pass has still to yield."""
        return 0 if self.done else max(0, self.plan.batches * self.workers - self.batches)


class MixTracker:
    """The resume bookkeeping of a mixed dataset (the protocol the loader calls)."""

    def __init__(self, dataset: MixedDataset) -> None:
        self._dataset = dataset
        self.tagging = False
        """Set while a loader from create_mixed_dataloader iterates: batches are then tagged."""
        self.progress: _MixProgress | None = None
        """The tracked pass (the one the resume state describes)."""
        self.rows = np.zeros(len(dataset.source_names), dtype=np.int64)
        """Rows the loop received per source since the metrics were last reset."""

    def __getstate__(self) -> dict[str, Any]:
        return {"_dataset": self._dataset, "tagging": self.tagging, "progress": None, "rows": self.rows}

    @property
    def token(self) -> int:
        """Which origin is current (0: the start of training)."""
        return self._dataset.origin_token

    def begin(self, num_workers: int, epoch: int) -> _MixProgress:
        """Start recording a pass over ``epoch``.

        A pass started while the tracked one still runs (e.g. an evaluation over the
        training loader) gets its own, untracked record: the state keeps describing the
        outer pass.
        """
        current = self.progress
        nested = current is not None and current.running and not current.done
        progress = _MixProgress(max(1, num_workers), self._dataset.pass_plan(epoch), tracked=not nested)
        if not nested:
            self.progress = progress
        return progress

    def consume(self, item: Any, progress: _MixProgress | None = None) -> Any:
        """Main process: record a tagged batch as received by ``progress``'s pass; return the batch."""
        if not isinstance(item, Tagged):
            return item
        progress = self.progress if progress is None else progress
        if progress is not None:
            worker, done = int(item.tag[1]), int(item.tag[4])
            progress.received[worker] = done
            progress.batches += 1
            self.rows += progress.counts(done - 1)
        return item.batch

    def finish(self, progress: _MixProgress | None = None) -> None:
        """``progress``'s pass (default: the tracked one) ran to its end."""
        progress = self.progress if progress is None else progress
        if progress is not None:
            progress.done = True

    @staticmethod
    def end(progress: _MixProgress) -> None:
        """``progress``'s pass ended (exhausted, closed or failed): a later pass is not nested in it."""
        progress.running = False


# -- the dataset ------------------------------------------------------------------------------
class MixedDataset(IterableDataset[Any]):
    """Several sources read as one, mixed by weight; see :func:`create_mixed_dataloader`.

    Args:
        sources: The sources, discovered (each a :class:`PlannedDataset` with the mix's
            shuffle, batch size, equal batches and world).
        names: A name per source (metrics, errors).
        mix: The weights, ``on_exhausted`` and ``source_column``.
        options: The mix's options (batching, shuffle, output, loader, world).

    Raises:
        IncompatibleOptionsError: a source's row counts are not exact, or equal
            batches are off where lanes must be equal.
        SchemaMismatchError: the sources' columns differ.
    """

    def __init__(
        self, sources: Sequence[PlannedDataset], names: Sequence[str], mix: MixConfig, options: Options
    ) -> None:
        super().__init__()
        if len(sources) != len(mix.weights):
            raise ConfigError(
                f"weights={list(mix.weights)!r} has {len(mix.weights)} weight(s) for {len(sources)} "
                "source(s); give one weight per source"
            )
        self._options = options
        self._mix = mix
        self._names = tuple(names)
        workers = options.loader.num_workers
        self._num_workers = min(env.cpus_per_rank(), MAX_AUTO_WORKERS) if workers is None else workers
        if workers is None and self._num_workers <= 1:
            self._num_workers = 0
        lanes = options.world.num_ranks * max(1, self._num_workers)
        self._check_sources(sources, lanes)
        self._sources = [LaneSource(s, lanes) for s in sources]
        self._columns = list(sources[0].schema.names)
        self._schema = self._aligned_schema(sources)
        self._converter = converter_for(
            batch_schema(self._schema, options.batching.equal_batches), options.output
        )
        self._weights = integer_weights(mix.weights)
        self._totals = [int(s.fingerprint()["rows"]) for s in sources]
        # The source whose epoch takes longest at its weight ends an epoch of the mix (cycle).
        self._anchor = max(range(len(sources)), key=lambda s: (self._totals[s] / self._weights[s], -s))
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._origin_token = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        fresh = tuple(SourcePosition() for _ in sources)
        self._origin = _Origin(0, fresh)
        self._starts: BoundedDict[int, tuple[Start, int]] = BoundedDict(64)
        self._plans: BoundedDict[int, PassPlan] = BoundedDict(8)
        self._full_batches: int | None = None
        self._state = MixTracker(self)
        self.metrics = MetricsRecorder(options.progress)
        """Per-worker counters of the batches received (see :meth:`get_metrics`)."""
        self.transport: Any = None
        """Set by the loader while its workers start: the segments they send batches in."""
        self.num_batches(0)  # plans epoch 0 now: a layout that cannot be mixed fails here

    # -- checks ----------------------------------------------------------------------------
    def _check_sources(self, sources: Sequence[PlannedDataset], lanes: int) -> None:
        equal = self._options.batching.equal_batches
        for name, source in zip(self._names, sources, strict=True):
            issue = source._row_count_issue
            if issue:
                raise IncompatibleOptionsError(
                    f"source {name!r}: a mix needs exact row counts (every batch takes a planned number "
                    f"of rows of each source), but {issue}; pass count_rows=True in the source, or drop "
                    "its row filter"
                )
        if lanes > 1 and equal is EqualBatches.OFF:
            raise IncompatibleOptionsError(
                f"equal_batches='off' with {lanes} lanes ({self._options.world.num_ranks} rank(s) x "
                f"{max(1, self._num_workers)} reading process(es)): a mix gives every lane the same rows "
                "of each source so that all build the same batches; pass equal_batches='drop' (default) "
                "or 'pad'"
            )

    def _aligned_schema(self, sources: Sequence[PlannedDataset]) -> pa.Schema:
        first = sources[0].schema
        for name, source in zip(self._names[1:], sources[1:], strict=True):
            schema = source.schema
            if set(schema.names) != set(first.names):
                raise SchemaMismatchError(
                    f"source {name!r} has columns {sorted(schema.names)}, source {self._names[0]!r} "
                    f"{sorted(first.names)}: a mix's sources must give the same columns. Pass "
                    "columns=[...] (to create_mixed_dataloader or in each source) to read the columns "
                    "they share"
                )
            for field in first:
                other = schema.field(field.name).type
                if other != field.type:
                    raise SchemaMismatchError(
                        f"column {field.name!r} is {other} in source {name!r} and {field.type} in source "
                        f"{self._names[0]!r}; cast it when writing the data, or leave it out of columns"
                    )
        column = self._mix.source_column
        if column is None:
            return first
        if column in first.names:
            raise IncompatibleOptionsError(
                f"source_column={column!r} is also a column of the data; pick another name"
            )
        return first.append(pa.field(column, pa.int32(), nullable=False))

    # -- values ----------------------------------------------------------------------------
    @property
    def options(self) -> Options:
        """The mix's checked options."""
        return self._options

    @property
    def mix(self) -> MixConfig:
        """The weights, ``on_exhausted`` and ``source_column``."""
        return self._mix

    @property
    def source_names(self) -> tuple[str, ...]:
        """The sources' names, in order."""
        return self._names

    @property
    def sources(self) -> tuple[PlannedDataset, ...]:
        """The sources' datasets, in order."""
        return tuple(s.dataset for s in self._sources)

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the mixed rows (the source column included, no padding flag)."""
        return self._schema

    @property
    def world(self) -> World:
        """The ranks the mix plans for."""
        return self._options.world

    @property
    def num_workers(self) -> int:
        """DataLoader workers per rank (each a lane of its own)."""
        return self._num_workers

    @property
    def num_lanes(self) -> int:
        """Lanes: ranks x reading processes per rank."""
        return self.world.num_ranks * max(1, self._num_workers)

    @property
    def anchor(self) -> int:
        """The source whose epoch ends an epoch of the mix with ``on_exhausted='cycle'``."""
        return self._anchor

    @property
    def blend(self) -> Blend:
        """The weights' row-level cycle."""
        return blend_for(self._weights)

    @property
    def epoch(self) -> int:
        """The epoch of the mix the next iteration reads."""
        return int(self._epoch.item())

    @property
    def origin_token(self) -> int:
        """Which loaded state the epochs are counted from (0: the start of training)."""
        return int(self._origin.token)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the mix to read next (every rank, before iterating).

        The sources' positions carry over from epoch to epoch: epoch ``e`` starts where
        epoch ``e - 1``'s plan ends, counted from the start of training or from the last
        state loaded.

        Raises:
            ConfigError: ``epoch`` precedes the epoch of the state loaded.
        """
        check_int(epoch, "epoch", 0)
        if epoch < self._origin.epoch:
            raise ConfigError(
                f"set_epoch({epoch}) precedes epoch {self._origin.epoch} of the state loaded: the "
                "sources of a mix carry their positions from epoch to epoch, so a dataset that loaded "
                "a state goes forward from it; build a new dataset to start over"
            )
        self._epoch.fill_(epoch)
        self._state.progress = None
        self.reset_metrics()

    def convert_batch(self, batch: pa.RecordBatch, for_transfer: bool = False) -> Any:
        """Convert one mixed record batch as reading does."""
        return self._for_transfer(batch) if for_transfer else self._converter(batch)

    # -- planning --------------------------------------------------------------------------
    def start_of(self, epoch: int) -> tuple[Start, int]:
        """Where every source stands when ``epoch`` of the mix starts, and its pass number."""
        found = self._starts.get(epoch)
        if found is not None:
            return found
        origin = self._origin
        if epoch < origin.epoch:
            raise ConfigError(f"epoch {epoch} precedes epoch {origin.epoch} of the state loaded")
        e = max([k for k in self._starts if origin.epoch <= k < epoch], default=origin.epoch)
        start, segment = self._starts.get(e, (origin.start, origin.segment))
        while e < epoch:
            start = self._advance(start, self._plan(e, start, segment))
            e, segment = e + 1, 0
        self._starts[epoch] = (start, segment)
        return start, segment

    def _plan(
        self, epoch: int, start: Start, segment: int, sources: Sequence[LaneSource] | None = None
    ) -> PassPlan:
        """The pass of ``epoch`` from ``start`` (``sources``: planned for another world)."""
        sources = self._sources if sources is None else sources
        blend = self.blend
        cycle = self._mix.on_exhausted is OnExhausted.CYCLE
        limits: list[int | None] = []
        for s, position in enumerate(start):
            if s == self._anchor or not cycle:
                epoch_of, segments = position.head()
                limits.append(sources[s].rows(epoch_of, segments) - position.skip)
            else:
                limits.append(None)
        seed = self._options.shuffle.shuffle_seed
        phase = random_offset(blend.period, seed, epoch, segment, _PHASE_SALT)
        batching = self._options.batching
        try:
            return plan_pass(blend, batching.batch_size, phase, limits, batching.drop_last)
        except ValueError:
            empty = [self._names[s] for s, n in enumerate(limits) if n is not None and n < 1]
            raise IncompatibleOptionsError(
                f"source(s) {empty} hold no row for some of the mix's {self.num_lanes} lanes; every lane "
                "needs rows of every source: use fewer workers or ranks, or more data"
            ) from None

    def pass_plan(self, epoch: int | None = None) -> PassPlan:
        """The batches of every lane in ``epoch`` (default: the current one) of the mix."""
        epoch = self.epoch if epoch is None else epoch
        found = self._plans.get(epoch)
        if found is None:
            start, segment = self.start_of(epoch)
            found = self._plan(epoch, start, segment)
            self._plans[epoch] = found
        return found

    def _advance(self, start: Start, plan: PassPlan) -> Start:
        out = []
        for s, position in enumerate(start):
            source = self._sources[s]
            lengths = [source.rows(e, segs) for e, segs in position.entries]
            first_fresh = position.next_epoch
            done, whole, skip = advance(
                lengths, source.rows(first_fresh, ()), position.skip, int(plan.taken[s])
            )
            out.append(SourcePosition(position.entries[done:], first_fresh + whole, skip))
        return tuple(out)

    def num_batches(self, epoch: int | None = None) -> int:
        """Batches this rank yields in a full pass over ``epoch`` of the mix (every rank the same).

        The whole epoch's count, also after ``load_state_dict`` (as ``len()`` of
        ``create_dataloader``'s loader): the batches left of a resumed or running pass are
        :attr:`remaining_batches`.
        """
        epoch = self.epoch if epoch is None else epoch
        origin = self._origin
        readers = max(1, self._num_workers)
        if epoch != origin.epoch or origin.full is None:
            return self.pass_plan(epoch).batches * readers
        if self._full_batches is None:
            self._full_batches = self._plan(epoch, origin.full, 0).batches
        return self._full_batches * readers

    @property
    def remaining_batches(self) -> int:
        """Batches left in the current epoch of the mix from the consumed (or loaded) position.

        During a pass, what it has still to yield; after ``load_state_dict``, the resumed
        rest of the epoch; otherwise the full epoch (``len()``); 0 once a pass ran to its
        end, until ``set_epoch``.
        """
        progress = self._state.progress
        if progress is None:
            return self.pass_plan().batches * max(1, self._num_workers)
        return progress.remaining

    def __len__(self) -> int:
        """Batches this rank yields in a full pass over the current epoch (see :meth:`num_batches`)."""
        return self.num_batches()

    # -- the loader's protocol -------------------------------------------------------------
    def begin_pass(self, num_workers: int) -> _MixProgress:
        """Main process: a pass over the current epoch starts; returns its record."""
        return self._state.begin(num_workers, self.epoch)

    joins = False
    """Nothing is joined in the main process: the loader hands batches over as they came."""

    def deliver(self, item: Any, progress: _MixProgress) -> Iterable[Any]:
        """Main process: a batch received from a worker, on its way to the loop (as it came)."""
        return (item,)

    def delivered(self) -> None:
        """Main process: the pass ended (nothing is joined in the main process)."""

    def describe(self, epoch: int | None = None) -> dict[str, Any]:
        """The mix's plan of ``epoch`` as plain values (``plan --json``)."""
        epoch = self.epoch if epoch is None else epoch
        plan = self.pass_plan(epoch)
        start, segment = self.start_of(epoch)
        lanes = self.num_lanes
        sources = []
        for s, name in enumerate(self._names):
            position = start[s]
            sources.append(
                {
                    "name": name,
                    "weight": self._mix.weights[s],
                    "share": float(self.blend.shares[s]),
                    "rows": self._totals[s],
                    "rows_per_lane_epoch": self._sources[s].rows(position.next_epoch, ()),
                    "start": {"epoch": position.head()[0], "rows_read": position.skip},
                    "rows_this_epoch": int(plan.taken[s]) * lanes,
                }
            )
        return {
            "epoch": epoch,
            "pass": segment,
            "on_exhausted": self._mix.on_exhausted.value,
            "anchor": self._names[self._anchor],
            "num_ranks": self.world.num_ranks,
            "lanes": lanes,
            "batch_size": self._options.batching.batch_size,
            "batches_per_lane": plan.batches,
            "batches_per_rank": plan.batches * max(1, self._num_workers),
            "period": self.blend.period,
            "sources": sources,
        }

    # -- reading ---------------------------------------------------------------------------
    def _lane_batches(self, lane: int, epoch: int, in_worker: bool) -> Iterator[pa.RecordBatch]:
        """The mixed record batches of ``lane`` in ``epoch`` (before conversion)."""
        start, segment = self.start_of(epoch)
        plan = self.pass_plan(epoch)
        batch_size = self._options.batching.batch_size
        columns = self._columns
        if self._options.batching.equal_batches is EqualBatches.PAD:
            columns = [*columns, PADDING_COLUMN]
        streams = [
            _LaneStream(
                source, lane, start[s], columns, batch_size=batch_size, in_worker=in_worker, ahead=False
            )
            for s, source in enumerate(self._sources)
        ]
        tag_column = self._mix.source_column
        block = 1024  # batches whose counts are computed at once (vectorized)
        for first in range(0, plan.batches, block):
            for offset, counts in enumerate(plan.counts_of(first, first + block).tolist()):
                yield self._assemble(streams, counts, epoch, segment, lane, first + offset, tag_column)

    def _assemble(
        self,
        streams: Sequence[_LaneStream],
        counts: Sequence[int],
        epoch: int,
        segment: int,
        lane: int,
        t: int,
        tag_column: str | None,
    ) -> pa.RecordBatch:
        """Batch ``t`` of a lane: ``counts[s]`` next rows of every source, joined (and shuffled)."""
        shuffle = self._options.shuffle
        parts: list[pa.RecordBatch] = []
        for s, n in enumerate(counts):
            if n:
                first = len(parts)
                streams[s].take(n, parts)
                if tag_column is not None:  # the source's index beside its rows
                    field = pa.field(tag_column, pa.int32(), nullable=False)
                    index = pa.scalar(s, pa.int32())
                    parts[first:] = [
                        p.append_column(field, pa.repeat(index, p.num_rows)) for p in parts[first:]
                    ]
        rows = sum(counts)
        if not shuffle.shuffle or rows < 2:
            return concat_batches(parts, memory_pool=ROUND_POOL)
        # The slices gathered straight into the batch's seeded order: one copy, as a join.
        order = permutation(rows, shuffle.shuffle_seed, epoch, segment, lane, t, _ORDER_SALT)
        taken = pc.take(
            pa.Table.from_batches(parts), pa.array(order), boundscheck=False, memory_pool=ROUND_POOL
        )
        return taken.combine_chunks(memory_pool=ROUND_POOL).to_batches()[0]

    def __iter__(self) -> Iterator[Any]:
        slot = env.worker_slot()
        if slot.in_worker:
            watch_parent()
        readers = max(1, self._num_workers)
        if slot.count != readers:
            raise IncompatibleOptionsError(
                f"this mixed dataset was planned for {readers} reading process(es) per rank but is read "
                f"by {slot.count}; build it with num_workers={slot.count} (create_mixed_dataloader "
                "builds the loader that fits)"
            )
        if slot.in_worker and self._state.token != int(self._origin_token.item()):
            raise ResumeStateError(
                "load_state_dict() was called after this loader's persistent workers started, so they "
                "cannot see the state; create a new loader (or persistent_workers=False) and load the "
                "state before the first iteration"
            )
        epoch = self.epoch
        lane = self.world.rank * readers + slot.id
        spare = slot.count < env.cpus_per_rank() if slot.in_worker else env.cpus_per_rank() > 1
        for source in self._sources:  # as a worker of one source: no Arrow threads when CPUs are full
            if slot.in_worker:
                source.dataset.reader.use_threads(spare)
        ahead = self._options.fetch.decode_ahead
        batches = self._lane_batches(lane, epoch, slot.in_worker)
        if spare if ahead is None else ahead:
            # One thread reads every source and joins the batches, ahead of the converting
            # thread, handing them over a few at a time (each hand-over passes the GIL):
            # one thread per source measured more CPU.
            per_item = max(1, AHEAD_ROWS // self._options.batching.batch_size)
            batches = _flat(read_ahead(_runs(batches, per_item), name=f"mix-ahead-l{lane}"))
        flag = PADDING_COLUMN if self._options.batching.equal_batches is EqualBatches.PAD else None
        work = WorkStats(_IoTotals([s.dataset.reader for s in self._sources]), 0, flag)
        tagger = _Tagger(self._state.token, slot.id, slot.count)
        tagging = self._state.tagging
        if slot.in_worker and tagging:
            pool = self.transport.writer(slot.id) if self.transport is not None else None
            yield from grouped(batches, self._for_transfer, tagger, work, pool)  # type: ignore[arg-type]
            return
        if slot.in_worker:  # a DataLoader of the user's own: no tags
            yield from (pack(self._for_transfer(b)) for b in batches)
            return
        self.metrics.attach(slot.id, work)
        if tagging:
            yield from self._tagged(batches, tagger, work)
            return
        progress = self._state.begin(1, epoch)
        self.begin_metrics(0)
        yield from consumed_here(self._tagged(batches, tagger, work), self._state, progress, self.metrics)

    def _tagged(
        self, batches: Iterator[pa.RecordBatch], tagger: _Tagger, work: WorkStats
    ) -> Iterator[Tagged]:
        measure = ArrowBytes()
        for batch in batches:
            work.count_padding(batch)
            tag = tagger.tag(batch.num_rows, measure(batch))
            out = self._converter(batch)
            collate = self._options.output.collate_fn
            yield Tagged(out if collate is None else collate(out), tag)

    def _for_transfer(self, batch: pa.RecordBatch) -> Any:
        collate = self._options.output.collate_fn
        if collate is None:
            return self._converter.convert_for_transfer(batch)
        return collate(self._converter(batch))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        return state

    # -- metrics ---------------------------------------------------------------------------
    def begin_metrics(self, num_workers: int) -> None:
        """A pass starts (main process): note it, show progress."""
        epoch = self.epoch
        config = self._options.progress
        rank = self.world.rank
        if not Progress.shown_on(config, rank):
            self.metrics.begin(epoch)
            return
        total = int(self.pass_plan(epoch).consumed(self.pass_plan(epoch).batches).sum())
        rows = total * max(1, self._num_workers)
        self.metrics.begin(epoch, lambda: Progress(config, rank=rank, epoch=epoch, total=rows, done=0))

    def rank_metrics(self) -> RankMetrics:
        """This rank's metrics since the last reset, with the rows received per source."""
        base = self.metrics.rank_metrics(self.world.rank, self.world.num_ranks, 0)
        rows = tuple((n, int(r)) for n, r in zip(self._names, self._state.rows.tolist(), strict=True))
        return dataclasses.replace(base, rows_by_source=rows)

    def get_metrics(self) -> list[WorkerMetrics]:
        """Per-worker counters since the last call (then cleared), as ``PlannedDataset.get_metrics``."""
        self._state.rows[:] = 0
        return self.metrics.drain()

    def reset_metrics(self) -> None:
        """Discard the counters collected so far."""
        self._state.rows[:] = 0
        self.metrics.reset()

    # -- resume ----------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """What a state of this mix is tied to: every source's fingerprint and the mix's options."""
        batching = self._options.batching
        return {
            "sources": [s.dataset.fingerprint() for s in self._sources],
            "names": list(self._names),
            "weights": list(self._weights),
            "on_exhausted": self._mix.on_exhausted.value,
            "source_column": self._mix.source_column,
            "batch_size": batching.batch_size,
            "drop_last": batching.drop_last,
            "equal_batches": batching.equal_batches.value,
            "shuffle": self._options.shuffle.shuffle,
            "shuffle_seed": self._options.shuffle.shuffle_seed,
        }

    def state_dict(self) -> dict[str, Any]:
        """This rank's resume state: where the pass started and what the loop received of it.

        Plain JSON values. Merge the ranks' states with ``merge_states`` (or
        ``gather_state``). On one rank, a completed pass gives the next epoch's start.
        """
        epoch = self.epoch
        start, segment = self.start_of(epoch)
        progress = self._state.progress
        consumed: dict[str, list[int]] = {}
        if progress is not None and progress.done and self.world.num_ranks == 1:
            epoch, segment = epoch + 1, 0
            start = self._advance(start, progress.plan)
        elif progress is not None:
            received = [progress.plan.batches] * progress.workers if progress.done else progress.received
            consumed[str(self.world.rank)] = list(received)
        origin = self._origin
        full = origin.full if segment and epoch == origin.epoch and origin.full is not None else start
        return {
            "format": MIX_STATE_FORMAT,
            "version": MIX_STATE_VERSION,
            "fingerprint": self.fingerprint(),
            "epoch": epoch,
            "segment": segment,
            "start": [p.as_json() for p in start],
            "epoch_start": [p.as_json() for p in full],
            "num_ranks": self.world.num_ranks,
            "lanes": self.num_lanes,
            "consumed": consumed,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a (merged) state: the next pass reads what the loop did not receive.

        The rest of every source's begun epochs is re-dealt over this dataset's lanes,
        which may be other ranks and workers than the saved ones. A state whose pass
        every lane finished resumes at the next epoch.

        Raises:
            ResumeStateError: not a state of a mix, another version, or not every rank.
            StateMismatchError: saved for other sources or options (says what changed).
        """
        state = _complete(plain_state(state), self.world.num_ranks)
        previous = self._adopt_splits(state)
        try:
            self._load(state)
        except BaseException:  # a refused state changes nothing
            for s, undo in previous:
                undo()
                self._sources[s] = LaneSource(self._sources[s].dataset, self.num_lanes)
            raise

    def _adopt_splits(self, state: Mapping[str, Any]) -> list[tuple[int, Callable[[], None]]]:
        """Every source takes the automatic split ``state`` was saved with (it depends on the world).

        Returns how to undo each change. A source whose split is the user's is left as it is
        (a state of another split is then a mismatch, as for ``create_dataloader``).
        """
        fingerprint = state.get("fingerprint") if isinstance(state, Mapping) else None
        saved = fingerprint.get("sources") if isinstance(fingerprint, Mapping) else None
        if not isinstance(saved, list) or len(saved) != len(self._sources):
            return []
        undo: list[tuple[int, Callable[[], None]]] = []
        for s, (source, own) in enumerate(zip(self._sources, saved, strict=True)):
            dataset = source.dataset
            previous = dataset._adopt_split({"fingerprint": own})
            if previous is not None:
                undo.append((s, functools.partial(dataset._use_split, *previous)))
                self._sources[s] = LaneSource(dataset, self.num_lanes)
        return undo

    def _load(self, state: Mapping[str, Any]) -> None:
        plain = check_mix_state(state, self.fingerprint())
        epoch, segment = int(plain["epoch"]), int(plain["segment"])
        start = tuple(
            self._checked(s, position_of(p, f"state.start[{s}]")) for s, p in enumerate(plain["start"])
        )
        full = tuple(
            self._checked(s, position_of(p, f"state.epoch_start[{s}]"))
            for s, p in enumerate(plain["epoch_start"])
        )
        lanes = int(plain["lanes"])
        saved = self._sources
        if lanes != self.num_lanes:
            saved = [LaneSource(s.dataset, lanes) for s in self._sources]
        consumed: dict[str, list[int]] = plain["consumed"]
        rows = [[p.skip] * lanes for p in start]  # rows of every saved lane's stream read so far
        if consumed:
            plan = self._plan(epoch, start, segment, saved)
            received = _received(consumed, int(plain["num_ranks"]), lanes, plan.batches)
            for s, position in enumerate(start):
                rows[s] = [position.skip + int(plan.consumed(n)[s]) for n in received]
            if all(n == plan.batches for n in received):
                epoch, segment = epoch + 1, 0  # the pass ended on every lane
            else:
                segment += 1
        # Positions as the sources' own resume segments: they hold for any number of lanes.
        start = tuple(
            self._settled(s, _rest(saved[s], position, rows[s])) for s, position in enumerate(start)
        )
        # Where the epoch's first pass started, in this world: len() is that pass's batches.
        whole = None
        if segment:
            whole = tuple(
                self._settled(s, _rest(saved[s], position, [position.skip] * lanes))
                for s, position in enumerate(full)
            )
        token = int(torch.randint(1, 2**62, ()).item())
        self._origin = _Origin(epoch, start, segment, token, whole)
        self._origin_token.fill_(token)
        self._starts.clear()
        self._plans.clear()
        self._full_batches = None
        self._state.progress = None
        self._epoch.fill_(epoch)
        self.pass_plan(epoch)

    def _checked(self, s: int, position: SourcePosition) -> SourcePosition:
        source = self._sources[s]
        entries = tuple((e, source.check(e, segs)) for e, segs in position.entries)
        return dataclasses.replace(position, entries=entries)

    def _settled(self, s: int, position: SourcePosition) -> SourcePosition:
        """``position`` without the begun epochs whose rest gives no row to a lane of this world.

        With ``equal_batches='drop'`` a rest of fewer rows than lanes is left out, as the
        rows an epoch's dealing leaves out.
        """
        source = self._sources[s]
        entries = position.entries
        while entries and source.rows(*entries[0]) == 0:
            entries = entries[1:]
        return dataclasses.replace(position, entries=entries)


def _received(consumed: Mapping[str, Any], num_ranks: int, lanes: int, batches: int) -> list[int]:
    """Batches received from every saved lane, rank after rank, from a state's ``consumed``."""
    if sorted(consumed) != sorted(str(r) for r in range(num_ranks)):
        missing = sorted(set(range(num_ranks)) - {int(r) for r in consumed if r.isdigit()})
        raise ResumeStateError(
            f"the mix's resume state holds ranks {sorted(consumed)[:20]} of a {num_ranks}-rank job (missing "
            f"{missing[:20]}); merge the states of all ranks first (merge_states, or gather_state)"
        )
    per_rank = lanes // num_ranks
    received: list[int] = []
    for rank in range(num_ranks):
        counts = consumed[str(rank)]
        if (
            not isinstance(counts, list)
            or len(counts) != per_rank
            or not all(type(n) is int and 0 <= n <= batches for n in counts)
        ):
            raise ResumeStateError(
                f"the mix's resume state gives rank {rank} the batch counts {str(counts)[:60]}: expected "
                f"{per_rank} counts from 0 to {batches}; pass what loader.state_dict() returned"
            )
        received.extend(counts)
    return received


def _rest(source: LaneSource, position: SourcePosition, rows: Sequence[int]) -> SourcePosition:
    """``position`` after lane ``v`` read ``rows[v]`` rows of its stream, as the source's own segments.

    Every begun epoch that some lane has not finished keeps a segment saying what each
    lane read of it (:meth:`LaneSource.segment`), so its rest can be re-dealt over any
    number of lanes; epochs every lane finished are left out.
    """
    entries: list[tuple[int, Segments]] = []
    queue = list(position.entries)
    next_epoch = position.next_epoch
    begin = 0
    while queue or any(r > begin for r in rows):
        if queue:
            epoch, segments = queue.pop(0)
        else:
            epoch, segments = next_epoch, ()
            next_epoch += 1
        length = source.rows(epoch, segments)
        read = [min(max(r - begin, 0), length) for r in rows]
        if not any(read):
            entries.append((epoch, segments))
        elif min(read) < length:
            entries.append((epoch, (*segments, source.segment(epoch, segments, read))))
        begin += length
    return SourcePosition(tuple(entries), next_epoch, 0)


def _complete(state: Mapping[str, Any], num_ranks: int) -> Mapping[str, Any]:
    """A rank's own state completed with the other ranks' (under an initialized process group)."""
    if (
        not isinstance(state, Mapping)
        or state.get("format") != MIX_STATE_FORMAT
        or not isinstance(state.get("consumed"), Mapping)
        or not state["consumed"]
        or len(state["consumed"]) >= state.get("num_ranks", 0)
        or num_ranks < 2
        or not (dist.is_available() and dist.is_initialized())
        or dist.get_world_size() != num_ranks
    ):
        return state
    states: list[Mapping[str, Any] | None] = [None] * num_ranks
    dist.all_gather_object(states, dict(state))
    return merge_mixed_states([s for s in states if s is not None])


# -- the public entry point ---------------------------------------------------------------------
class MixedDataLoader(ResumableDataLoader):
    """The DataLoader of :func:`create_mixed_dataloader` (see :class:`ResumableDataLoader`).

    ``metrics()`` also gives the rows received per source (``rows_by_source``).
    """

    dataset: MixedDataset  # type: ignore[assignment]


_FILE_KEYS = {"path", "format", "files"}
_ICEBERG_KEYS = {"table"}
_MIX_ONLY = {
    "batch_size",
    "drop_last",
    "shuffle",
    "shuffle_seed",
    "equal_batches",
    "num_ranks",
    "rank",
    "num_workers",
    "output_format",
    "null_fill",
    "collate_fn",
    "ragged",
    "pad_value",
    "max_length",
    "strings",
    "pack_features",
    "pack_sequences",
    "show_progress",
    "progress_interval_sec",
    "progress_all_ranks",
    "decode_ahead",
    "on_exhausted",
    "source_column",
}
"""Options of the mix as a whole: they cannot differ between sources."""


def _source_name(spec: Mapping[str, Any], index: int) -> str:
    name = spec.get("name")
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"sources[{index}] name={name!r} must be a non-empty str")
        return name
    if "table" in spec:
        return str(spec["table"])
    path = spec.get("path")
    if isinstance(path, (str, os.PathLike)):
        return pathlib.PurePosixPath(os.fspath(path).rstrip("/")).name or os.fspath(path)
    return f"source{index}"


def _build_source(
    spec: object, index: int, shared: Mapping[str, Any], options: Options
) -> tuple[PlannedDataset, str]:
    """One source of a mix, discovered (``shared``: the mix's keywords each source inherits)."""
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"sources[{index}]={spec!r} must be a mapping of source options, e.g. "
            "{'path': 'data/web/', 'format': 'parquet'} or {'table': 'db.books', 'catalog_config': {...}}"
        )
    name = _source_name(spec, index)
    given = {k: v for k, v in spec.items() if k != "name"}
    inside = sorted(set(given) & _MIX_ONLY)
    if inside:
        raise IncompatibleOptionsError(
            f"sources[{index}] ({name!r}) sets {inside}: these are options of the whole mix (every "
            "batch holds rows of every source); pass them to create_mixed_dataloader instead"
        )
    is_table = "table" in given
    if is_table and set(given) & _FILE_KEYS:
        raise ConfigError(
            f"sources[{index}] ({name!r}) gives both table= and path=; a source is one or the other"
        )
    if not is_table and "path" not in given and "files" not in given:
        raise ConfigError(
            f"sources[{index}]={dict(spec)!r} names no data: give 'path' (files) or 'table' (Iceberg)"
        )
    allowed = IcebergReadOptions if is_table else FileReadOptions
    keys = allowed.__required_keys__ | allowed.__optional_keys__
    values: dict[str, Any] = {**{k: v for k, v in shared.items() if k in keys}, **given}
    values.setdefault("count_rows", True)  # a mix needs exact counts on every lane
    mix_keys = {
        "batch_size": options.batching.batch_size,
        "drop_last": options.batching.drop_last,
        "equal_batches": options.batching.equal_batches,
        "shuffle": options.shuffle.shuffle,
        "shuffle_seed": options.shuffle.shuffle_seed,
        "num_ranks": options.world.num_ranks,
        "rank": options.world.rank,
        "num_workers": 0,
        "output_format": "arrow",
    }
    if is_table:
        table = values.pop("table")
        source = iceberg_source(table, values)
        built = build_options(
            {**values, **mix_keys}, IcebergReadOptions, "create_mixed_dataloader", FileFormat.PARQUET
        )
        return IcebergDataset.from_config(source, built), name
    path, files = values.pop("path", None), values.pop("files", None)
    file_format = values.pop("format", "parquet")
    source_cfg = file_source(file_format, values)
    built = build_options(
        {**values, **mix_keys}, FileReadOptions, "create_mixed_dataloader", source_cfg.format
    )
    return StructuredDataset.from_config(source_paths(path, files), source_cfg, built), name


def create_mixed_dataloader(
    sources: Sequence[Mapping[str, Any]],
    weights: Sequence[float],
    **options: Unpack[MixedLoaderOptions],
) -> tuple[MixedDataLoader, MixedDataset]:
    """Several sources read as one, every batch mixing them by weight, exactly once per source epoch.

    Args:
        sources: One mapping per source: the options ``StructuredDataset`` takes
            (``path``, ``format``, ``columns``, ``filters``, ``storage_options``,
            ``partitioning``, ``split_bytes``, ...) or ``IcebergDataset`` takes
            (``table``, ``catalog_config``, ``snapshot_id``, ...), and optionally a
            ``name`` (metrics, errors; default: the directory or table name).
        weights: One weight > 0 per source: each batch holds ``weight / sum(weights)``
            of its rows from the source, within one row.
        **options: The mix's options, shared by every source: batching, shuffling,
            output, ranks, workers (:class:`~torch_dataloader_utils.runtime.options.MixedLoaderOptions`);
            ``on_exhausted`` (``"cycle"``, default, or ``"stop"``) and
            ``source_column``. A read option given here (``columns``, ``split_bytes``,
            ``storage_options``, ...) is the default of every source.

    Returns:
        ``(loader, dataset)``. Call ``dataset.set_epoch(epoch)`` before each epoch;
        ``loader.state_dict()`` / ``load_state_dict()`` resume mid-epoch on any number
        of ranks and workers; ``loader.metrics().rows_by_source`` counts the rows
        received per source (``docs/recipes.md``).

    Raises:
        ConfigError: a source or weight is invalid (named).
        SchemaMismatchError: the sources' columns differ (read the shared ones with ``columns``).
        IncompatibleOptionsError: an option of the whole mix set in a source, or a layout
            the mix cannot read (unknown row counts, ``equal_batches='off'`` with lanes).
    """
    given: dict[str, Any] = dict(options)
    if isinstance(sources, (str, bytes, Mapping)) or not isinstance(sources, Sequence) or not sources:
        raise ConfigError(
            f"sources={sources!r} must be a non-empty list of source mappings, e.g. "
            "[{'path': 'data/web/'}, {'path': 'data/books/'}]"
        )
    mix = MixConfig(
        weights=tuple(weights) if isinstance(weights, Sequence) and not isinstance(weights, str) else weights,
        on_exhausted=given.pop("on_exhausted", OnExhausted.CYCLE),
        source_column=given.pop("source_column", None),
    )
    built = build_options(given, MixedLoaderOptions, "create_mixed_dataloader", FileFormat.PARQUET)
    shared = {k: v for k, v in given.items() if k not in _MIX_ONLY}
    found = [_build_source(spec, i, shared, built) for i, spec in enumerate(sources)]
    dataset = MixedDataset([d for d, _ in found], [n for _, n in found], mix, built)
    loader = build_loader(MixedDataLoader, dataset, dataset.num_workers, built.loader)
    return loader, dataset
