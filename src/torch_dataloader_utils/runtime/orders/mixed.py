"""The mixed order: several sources mixed by weight, each read exactly once per its own epoch.

Each source is planned for ``lanes = ranks x reading processes per rank`` lanes
(:class:`~torch_dataloader_utils.runtime.lanes.LaneSource`): with equal batches every lane
holds the same rows of each source epoch, so every lane builds the same sequence of batch
compositions (the :class:`~torch_dataloader_utils.plan.blend.PassPlan` of the epoch) from
its own rows, and ranks yield equal batch counts. A reading process is one lane; it
reads its rows of all sources side by side, takes each batch's rows of each source and
hands them on as the batch's parts (:class:`~torch_dataloader_utils.runtime.emit.BatchParts`),
which a DataLoader worker joins straight into the buffer the batch travels in.

Epochs. A source that runs out starts its next epoch; an epoch of the mix ends when its
*anchor* has read its epoch: with ``on_exhausted="cycle"`` the source whose epoch takes
longest at its weight, with ``"stop"`` the one whose epoch is shortest. So every epoch of
the mix reads its anchor exactly once, and has the same length (within a batch). The
other sources go on where they stood in the next epoch of the mix. Where every source
stands when an epoch starts is computed from the epoch before (:meth:`MixedOrder.start_of`),
from the start of training or from the last state loaded, identically in every process.

With several workers the main process hands the lanes' batches to the loop in one order:
batch ``t`` of every lane, lane after lane, then batch ``t + 1`` (:class:`Sequencer`),
whatever order they arrived in. So every lane's last batch (the one that takes what the
anchor has left, filled up by weight) comes at the end of the epoch, and a resumed pass
hands on the same batches in the same order as the uninterrupted one.

Resume. A state records where the pass started and how many batches the loop received
from every lane (:class:`~torch_dataloader_utils.plan.mixposition.MixState`). In the same
world (ranks and lanes), every lane goes on with the same pass from its own batch: the
rest is batch for batch what the uninterrupted run would have read. In another world the
batches become each source's rows consumed per lane, each source's rest is re-dealt by
its own resume planning over the new lanes, and the resumed pass mixes the rests.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch.distributed as dist

from torch_dataloader_utils.config import PADDING_COLUMN, EqualBatches, MixConfig, OnExhausted
from torch_dataloader_utils.errors import (
    ConfigError,
    IncompatibleOptionsError,
    ResumeStateError,
    StateMismatchError,
    warn,
)
from torch_dataloader_utils.io.ahead import read_ahead
from torch_dataloader_utils.plan.blend import Blend, PassPlan, advance, plan_staged_pass
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.mixposition import MixState, Removed, SchedulePoint, Segments, SourcePosition
from torch_dataloader_utils.plan.mixstate import (
    RECIPE_OPT_IN,
    RecipeChange,
    merge_mixed_states,
    partial_mix_state,
    recipe_change,
    saved_sources,
)
from torch_dataloader_utils.plan.schedule import MixSchedule, ScheduleUnit
from torch_dataloader_utils.plan.shuffle import permutation, random_offset
from torch_dataloader_utils.runtime import env, share
from torch_dataloader_utils.runtime.emit import BatchCount, BatchParts, parts_joinable, plain_arrays
from torch_dataloader_utils.runtime.lanes import LaneSource
from torch_dataloader_utils.runtime.options import Options
from torch_dataloader_utils.runtime.orders import Delivery, Joins, Reading
from torch_dataloader_utils.runtime.orders.planned import MAX_AUTO_WORKERS, STANDIN_COLUMN
from torch_dataloader_utils.runtime.orders.source import SourcePlan
from torch_dataloader_utils.runtime.state import Live, PassLog, Tagged
from torch_dataloader_utils.runtime.workstats import WorkStats

__all__ = [
    "AHEAD_ROWS",
    "ORDER_SALT",
    "MixStart",
    "MixedOrder",
    "PassStart",
    "Sequencer",
    "complete_mix_state",
]

ORDER_SALT = 0x6D6978
"""Keys the row order inside a mixed batch, apart from other draws (the ledger's replay draws it too)."""
_PHASE_SALT = 0x706861  # keys where a pass starts in the blend's cycle

AHEAD_ROWS = 65536
"""Rows of mixed batches the read-ahead thread hands over at once (as a decoded batch of
``create_dataloader``'s read path holds)."""

Start = tuple[SourcePosition, ...]
"""Where every source stands when a pass starts."""


@dataclass(frozen=True)
class PassStart:
    """Where a pass starts: every source's position, and the pass's place in the schedule.

    Attributes:
        positions: Where every source stands.
        segment: The pass of its epoch (one more per resume in another world or recipe).
        step: Batches every rank had received since the start of training.
        rows: Rows every rank together had taken since then.
        anchor: The source whose epoch ends the mix's epoch (chosen when the epoch starts).
    """

    positions: Start
    segment: int = 0
    step: int = 0
    rows: int = 0
    anchor: int = 0


@dataclass(frozen=True)
class MixStart:
    """The start the epochs are counted from: epoch ``epoch`` starts at ``start``.

    Attributes:
        epoch: The epoch of the mix.
        start: Where its pass starts.
        full: Where that epoch's first pass started (in this world), when ``start.segment > 0``.
        lanes: Batches of the pass every lane of this world had already received (a state
            of the same world: every lane goes on from there), or ``None``.
        removed: Sources a recipe change left out, by name (kept in every state after it).
    """

    epoch: int
    start: PassStart
    full: PassStart | None = None
    lanes: tuple[int, ...] | None = None
    removed: Mapping[str, Removed] = dataclasses.field(default_factory=dict)


class _LaneRows:
    """One lane's rows of one source: its begun epochs, then whole epochs, as slices.

    With ``arrays``, every decoded batch's columns are also made numpy arrays once (as the
    torch output holds them), and every slice taken comes with its views of them.
    """

    def __init__(
        self,
        source: LaneSource,
        lane: int,
        position: SourcePosition,
        names: Sequence[str],
        arrays: bool = False,
        **read: Any,
    ) -> None:
        self._source = source
        self._lane = lane
        self._names = list(names)
        self._read = read
        self._queue = list(position.entries)
        self._next = position.next_epoch
        self._skip = position.skip
        self._batches: Iterator[pa.RecordBatch] | None = None
        self._current: pa.RecordBatch | None = None
        self._offset = 0
        self._size = 0
        self._arrays = arrays
        self._columns: list[np.ndarray | None] | None = None

    def _open(self) -> Iterator[pa.RecordBatch]:
        if self._queue:
            epoch, segments = self._queue.pop(0)
        else:
            epoch, segments = self._next, ()
            self._next += 1
        skip, self._skip = self._skip, 0
        return self._source.read(epoch, segments, self._lane, skip, **self._read)

    def _load(self) -> pa.RecordBatch | None:
        """The next decoded batch (``None``: this entry ended), its columns in ``names`` order."""
        if self._batches is None:
            self._batches = self._open()
        current = next(self._batches, None)
        self._offset = 0
        if current is None:
            self._batches = None
            self._size = 0
        else:
            if current.schema.names != self._names:
                current = current.select(self._names)
            self._size = current.num_rows
            self._columns = plain_arrays(current) if self._arrays else None
        self._current = current
        return current

    def take(self, rows: int, out: list[pa.RecordBatch], views: list[list[np.ndarray | None] | None]) -> None:
        """Append the next ``rows`` rows to ``out`` (zero-copy slices), and their numpy views to ``views``."""
        empty = 0
        while rows > 0:
            current = self._current
            if current is None or self._offset >= self._size:
                current = self._load()
                if current is None:
                    empty += 1
                    if empty > 2:  # cannot happen with exact counts (checked when built)
                        raise RuntimeError("a source's rows of a lane ended before its planned rows")
                    continue
                empty = 0
            n = min(rows, self._size - self._offset)
            lo, hi = self._offset, self._offset + n
            out.append(current.slice(lo, n))
            columns = self._columns
            views.append(None if columns is None else [None if c is None else c[lo:hi] for c in columns])
            self._offset = hi
            rows -= n


def _runs(items: Iterator[BatchParts], size: int) -> Iterator[list[BatchParts]]:
    """``items`` in lists of ``size`` (the last may be shorter)."""
    run: list[BatchParts] = []
    for item in items:
        run.append(item)
        if len(run) >= size:
            yield run
            run = []
    if run:
        yield run


def _flat(runs: Iterator[list[BatchParts]]) -> Iterator[BatchParts]:
    for run in runs:
        yield from run


class Sequencer:
    """Main process: the lanes' batches handed to the loop in one order, whatever order they came in.

    Batch ``t`` of every lane of the rank, lane after lane, then batch ``t + 1``: a lane
    that began the pass at a later batch (a resumed one) waits for the others to reach
    it. The order depends on the plan alone, so a resumed pass hands on exactly the
    batches the uninterrupted one would have, in the same order; and every lane's last
    batch comes at the end of the epoch.

    Args:
        first: The batch every lane of the rank begins the pass at.
        batches: Batches of every lane in the pass.
    """

    def __init__(self, first: Sequence[int], batches: int) -> None:
        self._next = list(first)
        self._batches = batches
        self._held: list[deque[Tagged]] = [deque() for _ in first]

    def add(self, item: Tagged) -> Iterator[Tagged]:
        """Take one batch of a lane; the batches now due, in the loop's order."""
        self._held[item.tag[1]].append(item)
        return self._due()

    def _due(self) -> Iterator[Tagged]:
        nxt, held = self._next, self._held
        while True:
            lane = min(range(len(nxt)), key=lambda w: (nxt[w], w))
            if nxt[lane] >= self._batches or not held[lane]:
                return
            nxt[lane] += 1
            yield held[lane].popleft()

    def check_done(self) -> None:
        """At the end of a pass: every batch was handed on.

        Raises:
            RuntimeError: a lane sent batches the plan does not have.
        """
        left = [len(q) for q in self._held]
        if any(left):
            raise RuntimeError(f"lanes ended with {left} batches not handed on; the plan is inconsistent")


class MixedOrder:
    """Several sources mixed by weight; see the module docstring.

    Args:
        sources: The sources, discovered (their options carry the mix's shuffle, batch
            size, equal batches and world).
        names: A name per source (metrics, errors).
        mix: The weights, ``on_exhausted`` and ``source_column``.
        options: The mix's options (batching, shuffle, output, loader, world).

    Raises:
        ConfigError: a source has no rows, or the weights do not fit the sources.
        IncompatibleOptionsError: a source's row counts are not exact, equal batches are
            off where lanes must be equal, or a source has fewer rows than lanes.
    """

    def __init__(
        self, sources: Sequence[SourcePlan], names: Sequence[str], mix: MixConfig, options: Options
    ) -> None:
        self.options = options
        self.world = options.world
        self.mix = mix
        self.names = tuple(names)
        workers = options.loader.num_workers
        if workers is None:  # every rank must plan the same lanes: rank 0's choice
            auto = min(env.cpus_per_rank(), MAX_AUTO_WORKERS)
            workers = share.from_rank0(lambda: auto) if self.world.num_ranks > 1 else auto
            workers = 0 if workers <= 1 else workers
        self.num_workers: int = workers
        self.num_lanes = self.world.num_ranks * max(1, workers)
        self._check(sources)
        self._choose_splits(sources)
        self.sources = [LaneSource(s, self.num_lanes) for s in sources]
        self.schedule: MixSchedule = mix.schedule
        self.totals = [_rows(s) for s in sources]
        self._check_rows()
        self.passes = PassLog()
        self._live: Live[MixStart] = Live()
        fresh = tuple(SourcePosition() for _ in sources)
        self._fresh = MixStart(0, PassStart(fresh, anchor=self.anchor_for(self.weights_at(0, 0))))
        self._starts: BoundedDict[int, PassStart] = BoundedDict(64)
        self._plans: BoundedDict[int, PassPlan] = BoundedDict(8)
        self._full_batches: int | None = None
        self.pass_plan(0)  # a layout that cannot be mixed fails here

    # -- checks ---------------------------------------------------------------------------------
    def _check(self, sources: Sequence[SourcePlan]) -> None:
        for name, source in zip(self.names, sources, strict=True):
            issue = source.row_count_issue
            if issue:
                raise IncompatibleOptionsError(
                    f"source {name!r}: a mix needs exact row counts (every batch takes a planned number "
                    f"of rows of each source), but {issue}; pass count_rows=True in the source, or drop "
                    "its row filter"
                )
        if self.num_lanes > 1 and self.options.batching.equal_batches is EqualBatches.OFF:
            raise IncompatibleOptionsError(
                f"equal_batches='off' with {self.num_lanes} lanes ({self.world.num_ranks} rank(s) x "
                f"{max(1, self.num_workers)} reading process(es)): a mix gives every lane the same rows "
                "of each source so that all build the same batches; pass equal_batches='drop' (default) "
                "or 'pad'"
            )

    def _choose_splits(self, sources: Sequence[SourcePlan]) -> None:
        """Every source's split chosen for the mix's lanes; one warning for the mix where it falls short."""
        short = []
        for name, source in zip(self.names, sources, strict=True):
            source.choose_split(source.need(self.num_lanes))
            need = source.need(self.num_lanes, library_only=False)
            found = None if need is None else source.shortfall(need)
            if need is not None and found is not None:
                short.append((name, source.chunks() or 0, need, found))
        if not short or self.world.rank != 0:
            return
        first = short[0][2]
        each = ", ".join(f"{name!r}: {limit} {chunks:,} chunks" for name, chunks, _, (limit, _) in short)
        warn(
            f"shuffle=True mixes the rows of {first.streams} chunks per lane of every source, but the mix's "
            f"{self.num_lanes:,} lanes ({self.world.num_ranks:,} ranks x {max(1, self.num_workers)} workers) "
            f"get fewer of {len(short)} source(s) ({each}). {short[0][3][1]}"
        )

    def _check_rows(self) -> None:
        """Every source gives every lane rows (else an error naming it, when the mix is built)."""
        for s, lane in enumerate(self.sources):
            rows = self.totals[s]
            if not rows:
                raise ConfigError(
                    f"source {self.names[s]!r} has no rows (empty files, or a filter that keeps nothing): "
                    "a mix takes rows of every source in every batch; leave it out of sources"
                )
            if lane.rows(0, ()) < 1:
                raise IncompatibleOptionsError(
                    f"source {self.names[s]!r} has {rows:,} rows for the mix's {self.num_lanes:,} lanes "
                    f"({self.world.num_ranks:,} ranks x {max(1, self.num_workers)} workers), so some lanes "
                    "get none of it and every lane must build the same batches: use fewer workers or ranks, "
                    "or "
                    "more data"
                )

    # -- where every source stands -----------------------------------------------------------
    @property
    def origin(self) -> MixStart:
        """The start the epochs are counted from: the last state loaded, or the start of training."""
        loaded = self._live.get()
        return self._fresh if loaded is None else loaded.start

    @property
    def token(self) -> int:
        """Which loaded state the epochs are counted from (0: the start of training)."""
        return self._live.token

    @property
    def readers(self) -> int:
        """Reading processes (lanes) per rank."""
        return max(1, self.num_workers)

    # -- the schedule ---------------------------------------------------------------------------
    def _units(self, readers: int, lanes: int) -> int:
        """Steps (or rows) of one round of batches: every lane's batch ``t``."""
        if self.schedule.unit is ScheduleUnit.ROWS:
            return lanes * self.options.batching.batch_size
        return readers

    def weights_at(self, step: int, rows: int) -> tuple[int, ...]:
        """The integer weights in force at ``step`` (``rows``, for a schedule by rows)."""
        at = rows if self.schedule.unit is ScheduleUnit.ROWS else step
        return self.schedule.weights_of(self.schedule.index_at(at), len(self.sources))

    def stage_at(self, step: int, rows: int) -> int:
        """The schedule's stage in force at ``step`` (``rows``)."""
        return self.schedule.index_at(rows if self.schedule.unit is ScheduleUnit.ROWS else step)

    def anchor_for(self, weights: Sequence[int]) -> int:
        """The source whose epoch ends the mix's at ``weights``.

        ``cycle``: the longest at its weight; ``stop``: the shortest.
        """
        at_weight = [self.totals[s] / weights[s] for s in range(len(self.sources))]
        if self.mix.on_exhausted is OnExhausted.CYCLE:
            return max(range(len(at_weight)), key=lambda s: (at_weight[s], -s))
        return min(range(len(at_weight)), key=lambda s: (at_weight[s], s))

    def start_of(self, epoch: int) -> PassStart:
        """Where the pass over ``epoch`` of the mix starts."""
        found = self._starts.get(epoch)
        if found is not None:
            return found
        origin = self.origin
        if epoch < origin.epoch:
            raise ConfigError(f"epoch {epoch} precedes epoch {origin.epoch} of the state loaded")
        e = max([k for k in self._starts if origin.epoch <= k < epoch], default=origin.epoch)
        start = self._starts.get(e, origin.start)
        while e < epoch:
            start = self._advance(start, self._plan(e, start))
            e += 1
        self._starts[epoch] = start
        return start

    def _plan(self, epoch: int, start: PassStart, saved: MixState | None = None) -> PassPlan:
        """The pass of ``epoch`` from ``start`` (``saved``: in the world of that state)."""
        lanes = self.num_lanes if saved is None else saved.lanes
        readers = self.readers if saved is None else saved.lanes // saved.num_ranks
        sources = (
            self.sources if lanes == self.num_lanes else [LaneSource(s.source, lanes) for s in self.sources]
        )
        anchor = start.anchor
        position = start.positions[anchor]
        epoch_of, segments = position.head()
        limits: list[int | None] = [None] * len(self.sources)
        limits[anchor] = sources[anchor].rows(epoch_of, segments) - position.skip
        seed = self.options.shuffle.shuffle_seed

        def phase_of(first: int, blend: Blend) -> int:  # where each run starts in its cycle
            if first == 0:
                return random_offset(blend.period, seed, epoch, start.segment, _PHASE_SALT)
            return random_offset(blend.period, seed, epoch, start.segment, first, _PHASE_SALT)

        unit = self.schedule.unit
        base = start.rows if unit is ScheduleUnit.ROWS else start.step
        per_round = self._units(readers, lanes)
        stages = self.schedule.rounds(base, per_round, len(self.sources))
        batching = self.options.batching
        try:
            return plan_staged_pass(stages, batching.batch_size, limits, phase_of, batching.drop_last)
        except ValueError:
            raise IncompatibleOptionsError(
                f"source {self.names[anchor]!r} holds no row for some of the mix's {lanes} "
                "lanes; every lane needs rows of every source: use fewer workers or ranks, or more data"
            ) from None

    def pass_plan(self, epoch: int) -> PassPlan:
        """The batches of every lane in ``epoch`` of the mix."""
        found = self._plans.get(epoch)
        if found is None:
            found = self._plans[epoch] = self._plan(epoch, self.start_of(epoch))
        return found

    def _advance(self, start: PassStart, plan: PassPlan) -> PassStart:
        """Where the next epoch's pass starts, after ``plan`` read from ``start`` to its end."""
        positions = tuple(self._moved(s, p, int(plan.taken[s])) for s, p in enumerate(start.positions))
        step = start.step + plan.batches * self.readers
        rows = start.rows + int(plan.taken.sum()) * self.num_lanes
        return PassStart(positions, 0, step, rows, self.anchor_for(self.weights_at(step, rows)))

    def _moved(self, s: int, position: SourcePosition, rows: int) -> SourcePosition:
        """``position`` of source ``s`` after ``rows`` more rows of every lane."""
        source = self.sources[s]
        lengths = [source.rows(e, segs) for e, segs in position.entries]
        done, whole, skip = advance(lengths, source.rows(position.next_epoch, ()), position.skip, rows)
        return SourcePosition(position.entries[done:], position.next_epoch + whole, skip)

    def first_batches(self, epoch: int) -> list[int]:
        """The batch every lane of this rank begins the current pass over ``epoch`` at."""
        origin, readers = self.origin, self.readers
        if origin.lanes is None or epoch != origin.epoch or len(origin.lanes) != self.num_lanes:
            return [0] * readers
        return list(origin.lanes[self.world.rank * readers : (self.world.rank + 1) * readers])

    # -- the order's protocol ------------------------------------------------------------------
    def prepare(self, epoch: int, num_workers: int) -> None:
        """Main process: a pass starts; its plan is made now (workers plan their own)."""
        self.pass_plan(epoch)

    def num_batches(self, epoch: int, num_workers: int) -> int:
        """Batches this rank yields in a full pass over ``epoch`` of the mix (every rank the same).

        The whole epoch's count, also after ``load_state_dict``: the batches left of a
        resumed or running pass are :meth:`remaining`.
        """
        origin = self.origin
        if epoch != origin.epoch or origin.full is None:
            return self.pass_plan(epoch).batches * self.readers
        if self._full_batches is None:
            self._full_batches = self._plan(epoch, origin.full).batches
        return self._full_batches * self.readers

    def remaining(self, epoch: int) -> int:
        """Batches left of the current pass over ``epoch`` (or of the next one, before it starts)."""
        progress = self.passes.progress
        left = sum(self.pass_plan(epoch).batches - first for first in self.first_batches(epoch))
        if progress is None:
            return left
        return 0 if progress.done else max(0, left - progress.batches)

    def rows(self, epoch: int, num_workers: int) -> tuple[int | None, int]:
        """Rows this rank's loop receives in ``epoch``, and those already consumed."""
        plan = self.pass_plan(epoch)
        total = int(plan.consumed(plan.batches).sum()) * self.readers
        return total, sum(int(plan.consumed(first).sum()) for first in self.first_batches(epoch))

    def digest(self, epoch: int, num_workers: int) -> int | None:
        """``None``: the sources' built-in splits are part of the fingerprint."""
        return None

    def dropped_rows(self, epoch: int) -> int:
        """0: a mix's lanes are counted in each source's own epochs."""
        return 0

    def set_epoch(self, epoch: int) -> None:
        """``epoch`` of the mix is selected (every rank, before iterating).

        Raises:
            ConfigError: ``epoch`` precedes the epoch of the state loaded.
        """
        origin = self.origin
        if epoch < origin.epoch:
            raise ConfigError(
                f"set_epoch({epoch}) precedes epoch {origin.epoch} of the state loaded: the "
                "sources of a mix carry their positions from epoch to epoch, so a dataset that loaded "
                "a state goes forward from it; build a new dataset to start over"
            )
        self.passes.reset()

    def delivery(
        self, epoch: int, num_workers: int, joins: Joins, consume: Callable[[Tagged], Any]
    ) -> Delivery | None:
        """With several workers, the :class:`Sequencer` of their batches."""
        if num_workers < 2:
            return None
        return Sequencer(self.first_batches(epoch), self.pass_plan(epoch).batches)

    # -- reading -------------------------------------------------------------------------------
    def batches(self, slot: env.WorkerSlot, epoch: int, converted_parts: bool = False) -> Reading:
        """The mixed batches of this process's lane, as their sources' parts."""
        readers = self.readers
        if slot.count != readers:
            raise IncompatibleOptionsError(
                f"this mixed dataset was planned for {readers} reading process(es) per rank but is read "
                f"by {slot.count}; build it with num_workers={slot.count} (create_mixed_dataloader "
                "builds the loader that fits)"
            )
        self._live.get()  # in a persistent worker: refused when a state was loaded after it started
        lane = self.world.rank * readers + slot.id
        first = self.first_batches(epoch)[slot.id]
        spare = slot.count < env.cpus_per_rank() if slot.in_worker else env.cpus_per_rank() > 1
        if slot.in_worker:  # as a worker of one source: no Arrow threads when CPUs are full
            for source in self.sources:
                source.source.reader.use_threads(spare)
        batches: Iterator[BatchParts] = self._lane_batches(lane, epoch, first, slot.in_worker)
        ahead = self.options.fetch.decode_ahead
        if spare if ahead is None else ahead:
            # One thread reads every source and joins the batches, ahead of the converting
            # thread, handing them over a few at a time (each hand-over passes the GIL):
            # one thread per source measured more CPU.
            per_item = max(1, AHEAD_ROWS // self.options.batching.batch_size)
            batches = _flat(read_ahead(_runs(batches, per_item), name=f"mix-ahead-l{lane}"))
        flag = PADDING_COLUMN if self.options.batching.equal_batches is EqualBatches.PAD else None
        work = WorkStats([s.source.reader for s in self.sources], 0, flag)
        return Reading(batches, BatchCount(self.token, slot.id, slot.count, first), work)

    def _lane_batches(self, lane: int, epoch: int, first: int, in_worker: bool) -> Iterator[BatchParts]:
        """The mixed batches of ``lane`` in ``epoch`` from batch ``first`` on, as parts."""
        start = self.start_of(epoch)
        segment = start.segment
        plan = self.pass_plan(epoch)
        batching = self.options.batching
        columns = list(self.sources[0].source.schema.names)
        padded = batching.equal_batches is EqualBatches.PAD
        removed = STANDIN_COLUMN if self.options.bad_data.skipping and not padded else None
        flag = PADDING_COLUMN if padded else removed
        if flag is not None:
            columns.append(flag)
        done = plan.consumed(first) if first else None
        # In a worker whose batches go to the transfer buffer as their parts' columns: every
        # decoded batch made numpy arrays once, not every slice of it (see BatchParts.arrays).
        arrays = in_worker and removed is None and parts_joinable(self.options.output, self._schema())
        lanes = [
            _LaneRows(
                source,
                lane,
                start.positions[s] if done is None else self._moved(s, start.positions[s], int(done[s])),
                columns,
                arrays,
                batch_size=batching.batch_size,
                in_worker=in_worker,
                ahead=False,
                flag=flag,
            )
            for s, source in enumerate(self.sources)
        ]
        block = 1024  # batches whose counts are computed at once (vectorized)
        for at in range(first, plan.batches, block):
            for offset, counts in enumerate(plan.counts_of(at, at + block).tolist()):
                yield self._assemble(lanes, counts, (epoch, segment, lane, at + offset), removed)

    def _assemble(
        self, lanes: Sequence[_LaneRows], counts: Sequence[int], key: tuple[int, ...], removed: str | None
    ) -> BatchParts:
        """A batch of a lane: ``counts[s]`` next rows of every source, as its parts (and their order)."""
        tag_column = self.mix.source_column
        parts: list[pa.RecordBatch] = []
        views: list[list[np.ndarray | None] | None] = []
        rows = [0] * len(counts)
        for s, n in enumerate(counts):
            if not n:
                continue
            taken: list[pa.RecordBatch] = []
            first = len(views)
            lanes[s].take(n, taken, views)
            if removed is not None:  # stand-ins of skipped units leave the batch (it is shorter)
                taken = [_without(p, removed) for p in taken]
            for p, view in zip(taken, views[first:], strict=True):
                if not p.num_rows:
                    continue
                if tag_column is not None:  # the source's index beside its rows
                    field = pa.field(tag_column, pa.int32(), nullable=False)
                    p = p.append_column(field, pa.repeat(pa.scalar(s, pa.int32()), p.num_rows))
                    if view is not None:
                        view.append(np.full(p.num_rows, s, dtype=np.int32))
                parts.append(p)
                rows[s] += p.num_rows
        total = sum(rows)
        shuffle = self.options.shuffle
        order = None
        if shuffle.shuffle and total >= 2:  # the batch's rows in a seeded order
            order = permutation(total, shuffle.shuffle_seed, *key, ORDER_SALT)
        if not parts:  # every row of the batch was a skipped unit's
            return BatchParts([pa.RecordBatch.from_pylist([], schema=self._schema())], order, tuple(rows))
        arrays = [v for v in views if v is not None]  # every slice's numpy views, when it has them
        plain = removed is None and len(arrays) == len(parts)
        return BatchParts(parts, order, tuple(rows), arrays if plain else None)

    def _schema(self) -> pa.Schema:
        schema = self.sources[0].source.schema
        column = self.mix.source_column
        if self.options.batching.equal_batches is EqualBatches.PAD:
            schema = schema.append(pa.field(PADDING_COLUMN, pa.bool_(), nullable=False))
        return schema if column is None else schema.append(pa.field(column, pa.int32(), nullable=False))

    # -- resume -------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """What a state of this mix is tied to: every source's fingerprint and the mix's options."""
        batching = self.options.batching
        return {
            "sources": [s.source.fingerprint() for s in self.sources],
            "names": list(self.names),
            "weights": self.schedule.fingerprint(),
            "on_exhausted": self.mix.on_exhausted.value,
            "source_column": self.mix.source_column,
            "batch_size": batching.batch_size,
            "drop_last": batching.drop_last,
            "equal_batches": batching.equal_batches.value,
            "shuffle": self.options.shuffle.shuffle,
            "shuffle_seed": self.options.shuffle.shuffle_seed,
        }

    def state(self, epoch: int) -> MixState:
        """This rank's resume state: where the pass started and what the loop received of it.

        On one rank, a completed pass gives the next epoch's start.
        """
        start = self.start_of(epoch)
        progress = self.passes.progress
        consumed: dict[int, tuple[int, ...]] = {}
        plan = self.pass_plan(epoch)
        if progress is not None and progress.done and self.world.num_ranks == 1:
            epoch += 1
            start, plan = self.start_of(epoch), self.pass_plan(epoch)
        elif progress is not None:
            first = self.first_batches(epoch)
            received = [
                plan.batches if progress.done else progress.cursors.get(w, (0, first[w]))[1]
                for w in range(self.readers)
            ]
            consumed[self.world.rank] = tuple(received)
        elif any(self.first_batches(epoch)):  # a loaded pass not read yet: where its lanes stood
            consumed[self.world.rank] = tuple(self.first_batches(epoch))
        origin = self.origin
        full = origin.full if start.segment and epoch == origin.epoch and origin.full is not None else start
        taken = {n: tuple(int(x) for x in plan.consumed(n)) for c in consumed.values() for n in c}
        at = SchedulePoint(
            start.step,
            start.rows,
            self.stage_at(start.step, start.rows),
            self.weights_at(start.step, start.rows),
        )
        return MixState(
            self.fingerprint(),
            epoch,
            start.segment,
            start.positions,
            full.positions,
            self.world.num_ranks,
            self.num_lanes,
            consumed,
            at=at,
            epoch_at=SchedulePoint(full.step, full.rows),
            anchor=self.names[start.anchor],
            batches=plan.batches,
            taken=taken,
            removed=origin.removed,
        )

    def load(self, state: Mapping[str, Any]) -> int:
        """Resume from a (merged) state; returns its epoch. A refused state changes nothing.

        With ``allow_recipe_change``, a state of other weights or sources (matched by name)
        is taken: see :meth:`_changed`.

        Raises:
            ResumeStateError: not a state of a mix, another version, or not every rank.
            StateMismatchError: saved for other sources or options (says what changed).
        """
        state = complete_mix_state(state, self.world.num_ranks)
        undo = self._adopt_splits(state)
        try:
            return self._load(MixState.parse(state, self.fingerprint(), self.mix.allow_recipe_change))
        except BaseException:  # a refused state changes nothing
            for s, back in undo:
                back()
                self.sources[s] = LaneSource(self.sources[s].source, self.num_lanes)
            raise

    def _adopt_splits(self, state: Mapping[str, Any]) -> list[tuple[int, Callable[[], None]]]:
        """Every source takes the library's split the state was saved with (it depends on the world)."""
        saved = saved_sources(state)
        undo = []
        for s, name in enumerate(self.names):
            own = saved.get(name)
            back = None if own is None else self.sources[s].source.adopt({"fingerprint": own})
            if back is not None:
                undo.append((s, back))
                self.sources[s] = LaneSource(self.sources[s].source, self.num_lanes)
        return undo

    def _load(self, state: MixState) -> int:
        change = recipe_change(state.fingerprint, self.fingerprint(), tuple(state.removed))
        at = state.at
        if not change and at is not None and at.weights is not None:
            # A function's schedule is compared through the weights it gives where the pass started.
            now = self.weights_at(at.step, at.rows)
            if now != at.weights and not self.mix.allow_recipe_change:
                raise StateMismatchError(
                    f"the weights schedule ({self.schedule.describe()}) gives {list(now)} at step "
                    f"{at.step:,} "
                    f"(rows {at.rows:,}), where the state's pass started with {list(at.weights)}: the recipe "
                    f"changed. To go on with the new weights, every source where it stood, pass "
                    f"{RECIPE_OPT_IN} to create_mixed_dataloader"
                )
            change = RecipeChange(weights=now != at.weights)
        loaded = self._changed(state) if change else self._same(state)
        self._live.set(loaded.epoch, loaded)
        self._starts.clear()
        self._plans.clear()
        self._full_batches = None
        self.passes.reset()
        self.pass_plan(loaded.epoch)
        return loaded.epoch

    def _same(self, state: MixState) -> MixStart:
        """The start a state of this recipe gives: the same pass goes on, or its rest is re-dealt."""
        start = tuple(self._checked(s, p) for s, p in enumerate(state.start))
        full = tuple(self._checked(s, p) for s, p in enumerate(state.epoch_start))
        epoch, segment, lanes = state.epoch, state.segment, state.lanes
        at, epoch_at = state.at or SchedulePoint(), state.epoch_at or SchedulePoint()
        anchor = self._anchor_named(state.anchor, at)
        saved = (
            self.sources if lanes == self.num_lanes else [LaneSource(s.source, lanes) for s in self.sources]
        )
        rows = [[p.skip] * lanes for p in start]  # rows of every saved lane read so far
        step, taken = at.step, at.rows
        continued = None
        if state.consumed:
            plan = self._plan(epoch, PassStart(start, segment, at.step, at.rows, anchor), state)
            received = state.received(plan.batches)
            _check_taken(state, plan, received)
            step += self._steps(received, state)
            taken += sum(int(plan.consumed(n).sum()) for n in received)
            if all(n == plan.batches for n in received):
                epoch, segment = epoch + 1, 0  # the pass ended on every lane
                anchor = self.anchor_for(self.weights_at(step, taken))
            elif self._continues(state, received):
                continued = tuple(received)  # the same world: every lane goes on with the same pass
                step, taken = at.step, at.rows
            else:
                segment += 1
            if continued is None:
                for s, position in enumerate(start):
                    rows[s] = [position.skip + int(plan.consumed(n)[s]) for n in received]
        if continued is None:
            # Positions as the sources' own resume segments: they hold for any number of lanes.
            start = tuple(self._settled(s, _rest(saved[s], p, rows[s])) for s, p in enumerate(start))
        whole = None
        if segment:  # where the epoch's first pass started, in this world: len() is that pass's batches
            heads = tuple(self._settled(s, _rest(saved[s], p, [p.skip] * lanes)) for s, p in enumerate(full))
            whole = PassStart(heads, 0, epoch_at.step, epoch_at.rows, anchor)
        return MixStart(
            epoch, PassStart(start, segment, step, taken, anchor), whole, continued, state.removed
        )

    def _changed(self, state: MixState) -> MixStart:
        """The start a state of another recipe gives (``allow_recipe_change``).

        Sources are matched by name. Every source that goes on stands where the saved
        job's lanes left it (its own epochs' rests, re-dealt over this world's lanes); a
        source added back stands where it stood when it was removed; an added one starts
        its first epoch; a removed one is kept in the state, where it stood. The rest of
        the epoch is a new pass of the new recipe (or, when the saved pass had ended on
        every lane, the next epoch).

        Raises:
            ResumeStateError: a version 1 state saved in the middle of a pass (it does
                not record the rows of every source its lanes took).
        """
        if state.consumed and state.batches is None:
            raise ResumeStateError(
                "this resume state was saved by 0.7.0 (version 1) in the middle of a pass: it does not "
                "record the rows of every source its lanes took, which a recipe change needs. Resume it with "
                "its own recipe, save again (any state of this version works), then load that with the new "
                "recipe"
            )
        lanes, batches = state.lanes, state.batches or 0
        received = state.received(batches) if state.consumed else []
        missing = sorted({n for n in received if n not in state.taken})
        if missing:
            raise ResumeStateError(
                f"the mix's resume state field state.taken lacks the batch counts {missing[:10]}; pass what "
                "loader.state_dict() returned"
            )
        at, epoch_at = state.at or SchedulePoint(), state.epoch_at or SchedulePoint()

        def read(i: int, position: SourcePosition) -> list[int]:  # rows every saved lane read of source i
            if not received:
                return [position.skip] * lanes
            return [position.skip + state.taken[n][i] for n in received]

        positions, heads = self._positions_after(state, read)
        removed = {n: r for n, r in state.removed.items() if n not in self.names}
        mine = state.source_fingerprints()
        for i, name in enumerate(state.names):
            if name not in self.names:
                removed[name] = Removed(mine[i], state.start[i], lanes, tuple(read(i, state.start[i])))
        step = at.step + self._steps(received, state)
        rows = at.rows + sum(sum(state.taken[n]) for n in received)
        anchor = self.anchor_for(self.weights_at(step, rows))
        if received and all(n == batches for n in received):  # the saved pass had ended: the next epoch
            return MixStart(state.epoch + 1, PassStart(positions, 0, step, rows, anchor), None, None, removed)
        segment = state.segment + 1 if received else state.segment
        whole = PassStart(heads, 0, epoch_at.step, epoch_at.rows, anchor) if segment else None
        return MixStart(state.epoch, PassStart(positions, segment, step, rows, anchor), whole, None, removed)

    def _positions_after(
        self, state: MixState, read: Callable[[int, SourcePosition], list[int]]
    ) -> tuple[Start, Start]:
        """Where every source of this recipe stands after the saved job, and at the epoch's start.

        ``read(i, position)``: the rows every saved lane read of the state's source ``i``
        from ``position`` on.
        """
        index = {name: i for i, name in enumerate(state.names)}
        positions: list[SourcePosition] = []
        heads: list[SourcePosition] = []
        for s, name in enumerate(self.names):
            i = index.get(name)
            back = state.removed.get(name)
            if i is not None:
                wide = LaneSource(self.sources[s].source, state.lanes)
                at = self._checked(s, state.start[i])
                head = self._checked(s, state.epoch_start[i])
                positions.append(self._settled(s, _rest(wide, at, read(i, at))))
                heads.append(self._settled(s, _rest(wide, head, [head.skip] * state.lanes)))
            elif back is not None:
                wide = LaneSource(self.sources[s].source, back.lanes)
                positions.append(self._settled(s, _rest(wide, self._checked(s, back.position), back.rows)))
                heads.append(positions[-1])
            else:  # added: its first epoch
                positions.append(SourcePosition())
                heads.append(SourcePosition())
        return tuple(positions), tuple(heads)

    def _anchor_named(self, name: str | None, at: SchedulePoint) -> int:
        """The anchor a state names (``None``, a version 1 state: chosen as 0.7.0 did)."""
        if name is None:
            return self.anchor_for(self.weights_at(at.step, at.rows))
        if name not in self.names:
            raise ResumeStateError(
                f"the mix's resume state names the anchor {name!r}, which is not one of its sources "
                f"{list(self.names)}; pass what loader.state_dict() returned"
            )
        return self.names.index(name)

    def _steps(self, received: Sequence[int], state: MixState) -> int:
        """Steps the saving job took in the pass: the most batches a rank received (ranks are equal)."""
        per_rank = state.lanes // state.num_ranks
        return max((sum(received[r : r + per_rank]) for r in range(0, len(received), per_rank)), default=0)

    def _continues(self, state: MixState, received: Sequence[int]) -> bool:
        """Whether every lane can go on with the saved pass: the same world, every rank at the same step.

        Ranks that received different numbers of batches (states saved at different steps)
        would then yield different numbers: their rest is re-dealt instead, equally.
        """
        if state.lanes != self.num_lanes or state.num_ranks != self.world.num_ranks:
            return False
        readers = self.readers
        steps = {sum(received[r * readers : (r + 1) * readers]) for r in range(state.num_ranks)}
        return len(steps) == 1

    def _checked(self, s: int, position: SourcePosition) -> SourcePosition:
        source = self.sources[s]
        entries = tuple((e, source.check(e, segs)) for e, segs in position.entries)
        return dataclasses.replace(position, entries=entries)

    def _settled(self, s: int, position: SourcePosition) -> SourcePosition:
        """``position`` without the begun epochs whose rest gives no row to a lane of this world.

        With ``equal_batches='drop'`` a rest of fewer rows than lanes is left out, as the
        rows an epoch's dealing leaves out.
        """
        source = self.sources[s]
        entries = position.entries
        while entries and source.rows(*entries[0]) == 0:
            entries = entries[1:]
        return dataclasses.replace(position, entries=entries)

    def raw_weights(self, stage: int) -> tuple[float, ...]:
        """Stage ``stage``'s weights as given (a function's: as it returns them)."""
        if self.schedule.function is None:
            return self.schedule.stages[stage].weights
        return tuple(float(w) for w in self.schedule.function(stage * self.schedule.every))

    def describe(self, epoch: int) -> dict[str, Any]:
        """The mix's plan of ``epoch`` as plain values (``plan --json``)."""
        plan = self.pass_plan(epoch)
        start = self.start_of(epoch)
        lanes = self.num_lanes
        first = plan.runs[0]
        given = self.raw_weights(first.stage)
        batch = self.options.batching.batch_size
        fair = first.blend.shares * batch if plan.last == 0 else plan.run_of(plan.last).blend.shares * batch
        sources = []
        for s, name in enumerate(self.names):
            position = start.positions[s]
            per_epoch = self.sources[s].rows(position.next_epoch, ())
            sources.append(
                {
                    "name": name,
                    "weight": given[s],
                    "share": float(first.blend.shares[s]),
                    "rows": self.totals[s],
                    "rows_per_lane_epoch": per_epoch,
                    "start": {"epoch": position.head()[0], "rows_read": position.skip},
                    "rows_this_epoch": int(plan.taken[s]) * lanes,
                    "epochs_this_epoch": int(plan.taken[s]) / max(1, per_epoch),
                    "last_batch_rows": int(plan.last_counts[s]),
                    "last_batch_fill": max(0, int(plan.last_counts[s]) - round(float(fair[s]))),
                }
            )
        return {
            "epoch": epoch,
            "pass": start.segment,
            "on_exhausted": self.mix.on_exhausted.value,
            "anchor": self.names[start.anchor],
            "num_ranks": self.world.num_ranks,
            "lanes": lanes,
            "batch_size": batch,
            "batches_per_lane": plan.batches,
            "batches_per_rank": plan.batches * self.readers,
            "period": first.blend.period,
            "step": start.step,
            "schedule_unit": self.schedule.unit.value,
            "stages": [
                {
                    "stage": run.stage,
                    "first_batch_per_lane": run.first,
                    "first_step": start.step + run.first * self.readers,
                    "weights": [int(w) for w in run.blend.weights],
                }
                for run in plan.runs
            ],
            "sources": sources,
        }


def _rows(source: SourcePlan) -> int:
    """A source's rows: its files' (metadata), or its chunks' (text files counted when built)."""
    rows = int(source.fingerprint()["rows"])
    table = source.planner.chunk_table()
    if rows or table is None:
        return rows
    return int(table.rows[table.rows > 0].sum())


def _without(part: pa.RecordBatch, column: str) -> pa.RecordBatch:
    """``part`` without its stand-in rows and their flag column."""
    flag = part.column(column)
    kept = part.drop_columns([column])
    if not pc.any(flag).as_py():
        return kept
    return kept.filter(pc.invert(flag))


def _rest(source: LaneSource, position: SourcePosition, rows: Sequence[int]) -> SourcePosition:
    """``position`` after lane ``v`` read ``rows[v]`` rows of the source, as the source's own segments.

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


def _check_taken(state: MixState, plan: PassPlan, received: Sequence[int]) -> None:
    """The rows a state says its lanes took agree with its pass (a version 1 state says none).

    Raises:
        ResumeStateError: they do not (a damaged state).
    """
    if state.batches is None:
        return
    for n in sorted(set(received)):
        if state.taken.get(n) != tuple(int(x) for x in plan.consumed(n)) or state.batches != plan.batches:
            raise ResumeStateError(
                f"the mix's resume state says its lanes took {state.taken.get(n)} rows of its sources in "
                f"{n} batches, but its pass takes {[int(x) for x in plan.consumed(n)]}: the state is "
                "damaged; pass what loader.state_dict() returned"
            )


def complete_mix_state(state: Mapping[str, Any], num_ranks: int) -> Mapping[str, Any]:
    """A rank's own state completed with the other ranks' (under an initialized process group)."""
    if (
        num_ranks < 2
        or not partial_mix_state(state)
        or not (dist.is_available() and dist.is_initialized())
        or dist.get_world_size() != num_ranks
    ):
        return state
    states: list[Mapping[str, Any] | None] = [None] * num_ranks
    dist.all_gather_object(states, dict(state))
    return merge_mixed_states([s for s in states if s is not None])
