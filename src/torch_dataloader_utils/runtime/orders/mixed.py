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
from torch_dataloader_utils.errors import ConfigError, IncompatibleOptionsError, warn
from torch_dataloader_utils.io.ahead import read_ahead
from torch_dataloader_utils.plan.blend import Blend, PassPlan, advance, blend_for, integer_weights, plan_pass
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.mixposition import MixState, Segments, SourcePosition
from torch_dataloader_utils.plan.mixstate import merge_mixed_states, partial_mix_state, saved_sources
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

__all__ = ["AHEAD_ROWS", "ORDER_SALT", "MixStart", "MixedOrder", "Sequencer", "complete_mix_state"]

ORDER_SALT = 0x6D6978
"""Keys the row order inside a mixed batch, apart from other draws (the ledger's replay draws it too)."""
_PHASE_SALT = 0x706861  # keys where a pass starts in the blend's cycle

AHEAD_ROWS = 65536
"""Rows of mixed batches the read-ahead thread hands over at once (as a decoded batch of
``create_dataloader``'s read path holds)."""

Start = tuple[SourcePosition, ...]
"""Where every source stands when a pass starts."""


@dataclass(frozen=True)
class MixStart:
    """The start the epochs are counted from: epoch ``epoch`` starts at ``start`` (pass ``segment``).

    Attributes:
        epoch: The epoch of the mix.
        start: Where every source stood when the pass started.
        segment: The pass of the epoch (one more per resume in another world).
        full: Where that epoch's first pass started (in this world), when ``segment > 0``.
        lanes: Batches of the pass every lane of this world had already received (a state
            of the same world: every lane goes on from there), or ``None``.
    """

    epoch: int
    start: Start
    segment: int = 0
    full: Start | None = None
    lanes: tuple[int, ...] | None = None


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
        self.weights = integer_weights(mix.weights)
        self.totals = [_rows(s) for s in sources]
        self._check_rows()
        at_weight = [self.totals[s] / self.weights[s] for s in range(len(sources))]
        if mix.on_exhausted is OnExhausted.CYCLE:  # the longest epoch at its weight ends the mix's
            self.anchor = max(range(len(sources)), key=lambda s: (at_weight[s], -s))
        else:  # the shortest
            self.anchor = min(range(len(sources)), key=lambda s: (at_weight[s], s))
        self.passes = PassLog()
        self._live: Live[MixStart] = Live()
        self._fresh = MixStart(0, tuple(SourcePosition() for _ in sources))
        self._starts: BoundedDict[int, tuple[Start, int]] = BoundedDict(64)
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
    def blend(self) -> Blend:
        """The weights' row-level cycle."""
        return blend_for(self.weights)

    @property
    def readers(self) -> int:
        """Reading processes (lanes) per rank."""
        return max(1, self.num_workers)

    def start_of(self, epoch: int) -> tuple[Start, int]:
        """Where every source stands when ``epoch`` of the mix starts, and its pass number."""
        found = self._starts.get(epoch)
        if found is not None:
            return found
        origin = self.origin
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
        sources = self.sources if sources is None else sources
        position = start[self.anchor]
        epoch_of, segments = position.head()
        limits: list[int | None] = [None] * len(start)
        limits[self.anchor] = sources[self.anchor].rows(epoch_of, segments) - position.skip
        blend = self.blend
        phase = random_offset(blend.period, self.options.shuffle.shuffle_seed, epoch, segment, _PHASE_SALT)
        batching = self.options.batching
        try:
            return plan_pass(blend, batching.batch_size, phase, limits, batching.drop_last)
        except ValueError:
            raise IncompatibleOptionsError(
                f"source {self.names[self.anchor]!r} holds no row for some of the mix's {self.num_lanes} "
                "lanes; every lane needs rows of every source: use fewer workers or ranks, or more data"
            ) from None

    def pass_plan(self, epoch: int) -> PassPlan:
        """The batches of every lane in ``epoch`` of the mix."""
        found = self._plans.get(epoch)
        if found is None:
            start, segment = self.start_of(epoch)
            found = self._plans[epoch] = self._plan(epoch, start, segment)
        return found

    def _advance(self, start: Start, plan: PassPlan) -> Start:
        return tuple(self._moved(s, position, int(plan.taken[s])) for s, position in enumerate(start))

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
            self._full_batches = self._plan(epoch, origin.full, 0).batches
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
        start, segment = self.start_of(epoch)
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
                start[s] if done is None else self._moved(s, start[s], int(done[s])),
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
            "weights": list(self.weights),
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
        start, segment = self.start_of(epoch)
        progress = self.passes.progress
        consumed: dict[int, tuple[int, ...]] = {}
        plan = self.pass_plan(epoch)
        if progress is not None and progress.done and self.world.num_ranks == 1:
            epoch, segment = epoch + 1, 0
            start = self._advance(start, plan)
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
        full = origin.full if segment and epoch == origin.epoch and origin.full is not None else start
        return MixState(
            self.fingerprint(), epoch, segment, start, full, self.world.num_ranks, self.num_lanes, consumed
        )

    def load(self, state: Mapping[str, Any]) -> int:
        """Resume from a (merged) state; returns its epoch. A refused state changes nothing.

        Raises:
            ResumeStateError: not a state of a mix, another version, or not every rank.
            StateMismatchError: saved for other sources or options (says what changed).
        """
        state = complete_mix_state(state, self.world.num_ranks)
        undo = self._adopt_splits(state)
        try:
            return self._load(MixState.parse(state, self.fingerprint()))
        except BaseException:  # a refused state changes nothing
            for s, back in undo:
                back()
                self.sources[s] = LaneSource(self.sources[s].source, self.num_lanes)
            raise

    def _adopt_splits(self, state: Mapping[str, Any]) -> list[tuple[int, Callable[[], None]]]:
        """Every source takes the library's split the state was saved with (it depends on the world)."""
        saved = saved_sources(state)
        if len(saved) != len(self.sources):
            return []
        undo = []
        for s, own in enumerate(saved):
            back = self.sources[s].source.adopt({"fingerprint": own})
            if back is not None:
                undo.append((s, back))
                self.sources[s] = LaneSource(self.sources[s].source, self.num_lanes)
        return undo

    def _load(self, state: MixState) -> int:
        start = tuple(self._checked(s, p) for s, p in enumerate(state.start))
        full = tuple(self._checked(s, p) for s, p in enumerate(state.epoch_start))
        epoch, segment, lanes = state.epoch, state.segment, state.lanes
        saved = self.sources
        if lanes != self.num_lanes:
            saved = [LaneSource(s.source, lanes) for s in self.sources]
        rows = [[p.skip] * lanes for p in start]  # rows of every saved lane read so far
        continued = None
        if state.consumed:
            plan = self._plan(epoch, start, segment, saved)
            received = state.received(plan.batches)
            if all(n == plan.batches for n in received):
                epoch, segment = epoch + 1, 0  # the pass ended on every lane
            elif self._continues(state, received):
                continued = tuple(received)  # the same world: every lane goes on with the same pass
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
            whole = tuple(self._settled(s, _rest(saved[s], p, [p.skip] * lanes)) for s, p in enumerate(full))
        self._live.set(epoch, MixStart(epoch, start, segment, whole, continued))
        self._starts.clear()
        self._plans.clear()
        self._full_batches = None
        self.passes.reset()
        self.pass_plan(epoch)
        return epoch

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

    def describe(self, epoch: int) -> dict[str, Any]:
        """The mix's plan of ``epoch`` as plain values (``plan --json``)."""
        plan = self.pass_plan(epoch)
        start, segment = self.start_of(epoch)
        lanes = self.num_lanes
        sources = []
        for s, name in enumerate(self.names):
            position = start[s]
            sources.append(
                {
                    "name": name,
                    "weight": self.mix.weights[s],
                    "share": float(self.blend.shares[s]),
                    "rows": self.totals[s],
                    "rows_per_lane_epoch": self.sources[s].rows(position.next_epoch, ()),
                    "start": {"epoch": position.head()[0], "rows_read": position.skip},
                    "rows_this_epoch": int(plan.taken[s]) * lanes,
                }
            )
        return {
            "epoch": epoch,
            "pass": segment,
            "on_exhausted": self.mix.on_exhausted.value,
            "anchor": self.names[self.anchor],
            "num_ranks": self.world.num_ranks,
            "lanes": lanes,
            "batch_size": self.options.batching.batch_size,
            "batches_per_lane": plan.batches,
            "batches_per_rank": plan.batches * self.readers,
            "period": self.blend.period,
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
