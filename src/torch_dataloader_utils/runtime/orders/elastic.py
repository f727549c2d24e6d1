"""Elastic order: ``C`` canonical ranks' streams shared by the physical ranks; the only order with a joiner.

The plan is :mod:`~torch_dataloader_utils.plan.elastic`'s: every epoch is planned for
``canonical_ranks`` ranks, canonical rank ``c`` read as a rank of one worker would (its
*stream*), and physical rank ``p`` of ``R`` draws every batch evenly from its ``C / R``
streams. The split is chosen for the ``C`` streams, so the plan, and every global batch,
is the same for any ``R`` dividing ``C`` and any number of workers. A worker reads whole
streams side by side (:func:`~torch_dataloader_utils.runtime.elastic.interleave`); with
several reading workers each yields its part of every batch and the main process joins
the parts (:class:`~torch_dataloader_utils.runtime.elastic.Joiner`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from torch_dataloader_utils.config import PADDING_COLUMN, EqualBatches
from torch_dataloader_utils.errors import warn
from torch_dataloader_utils.io.pieces import MIX_WORKER_READ_ROWS, piece_reads
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.elastic import Canonical
from torch_dataloader_utils.plan.state import Segment
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, WorkerChunks
from torch_dataloader_utils.runtime import env
from torch_dataloader_utils.runtime.elastic import (
    ElasticPlans,
    Joiner,
    StreamPositions,
    interleave,
    part_batches,
)
from torch_dataloader_utils.runtime.options import Options
from torch_dataloader_utils.runtime.orders import Delivery, Joins, Reading
from torch_dataloader_utils.runtime.orders.planned import MAX_AUTO_WORKERS, REPORT_MAX_RANKS, SegmentOrder
from torch_dataloader_utils.runtime.orders.source import SourcePlan
from torch_dataloader_utils.runtime.state import Tagged
from torch_dataloader_utils.runtime.workstats import WorkStats

__all__ = ["ElasticOrder"]


class ElasticOrder(SegmentOrder):
    """Canonical ranks' streams, read interleaved and joined; see the module docstring.

    Args:
        source: The source read (its split chosen here for the canonical streams).
        options: The checked options (``canonical_ranks`` set).
        num_workers: DataLoader workers per rank (``None``: automatic).

    Raises:
        IncompatibleOptionsError: the ranks cannot share the canonical streams evenly.
    """

    def __init__(self, source: SourcePlan, options: Options, num_workers: int | None) -> None:
        assert options.canonical is not None
        world = options.world
        self.layout = Canonical(options.canonical, world.num_ranks, options.batching.batch_size)
        # The split is the canonical streams': the same for every world and every number of
        # workers (a stream mixes its rows across fewer places, see ElasticPlans).
        mixing = options.shuffle.mixing
        streams = None if mixing is None else -(-mixing.streams // self.layout.streams)
        source.choose_split(source.need(self.layout.streams, streams=streams))
        super().__init__(source, options)
        self.streams = self._streams()
        self._plans: BoundedDict[tuple[int, int], EpochPlan] = BoundedDict(4)
        workers = min(env.cpus_per_rank(), self.layout.per_rank, MAX_AUTO_WORKERS)
        self.num_workers = (0 if workers <= 1 else workers) if num_workers is None else num_workers

    def _streams(self) -> ElasticPlans:
        shuffle = self.options.shuffle
        return ElasticPlans(
            self.source.planner,
            self.layout,
            self.world.rank,
            window_rows=shuffle.row_window,
            mixing=shuffle.mixing,
            seed=shuffle.shuffle_seed if shuffle.shuffle else 0,
        )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_plans": BoundedDict(4)}

    def split_changed(self) -> None:
        """The split changed (a loaded state's): the streams are planned again."""
        super().split_changed()
        self.streams = self._streams()
        self._plans.clear()

    # -- planning ------------------------------------------------------------------------------
    def plan(self, epoch: int, num_workers: int | None = None) -> EpochPlan:
        """Every rank's workers' chunks of ``epoch``: their canonical streams' (fresh) chunks."""
        workers = self.readers(num_workers)
        found = self._plans.get((epoch, workers))
        if found is not None:
            return found
        streams, layout = self.streams, self.layout

        def chunks(rank: int, worker: int) -> WorkerChunks:
            mine = layout.of_worker(rank, worker, workers)
            return tuple(c for s in mine for p in streams.fresh(epoch, s) for c in p.chunks)

        plan = self._plans[(epoch, workers)] = EpochPlan(
            epoch=epoch,
            seed=self.options.shuffle.shuffle_seed if self.options.shuffle.shuffle else None,
            num_ranks=self.world.num_ranks,
            num_workers=workers,
            assignments=tuple(
                tuple(chunks(r, w) for w in range(workers)) for r in range(self.world.num_ranks)
            ),
            dropped=streams.planner.dropped(epoch, 1),
        )
        return plan

    def verify(self, epoch: int, num_workers: int | None = None) -> None:
        """Check that no two canonical streams share a row in ``epoch``."""
        self.streams.planner.verify(epoch, 1)

    def digest(self, epoch: int, num_workers: int) -> int | None:
        """A custom strategy's digest of the chunks of this rank's first canonical stream."""
        return self.streams.digest(epoch, self.layout.of_rank(self.world.rank)[0])

    def validate(self, epoch: int, segments: tuple[Segment, ...]) -> object:
        """Plan the rest of every stream of this rank after ``segments`` (raising on a state that misfits)."""
        return self.streams.streams(epoch, segments)

    def piece_rows(self, epoch: int, workers: int, segments: tuple[Segment, ...]) -> list[list[int]] | None:
        """Rows each worker has in a pass: its streams, read interleaved, are one piece."""
        total, done = self.streams.rows(epoch, segments)
        layout = self.layout
        return [
            [len(layout.of_worker(self.world.rank, w, workers)) * (total - done)]
            for w in range(max(1, workers))
        ]

    def _pass_batches(self, epoch: int, workers: int, segments: tuple[Segment, ...] | None) -> int:
        return self.streams.batches(epoch, segments or (), self.options.batching.drop_last)

    def rows(self, epoch: int, num_workers: int) -> tuple[int | None, int]:
        """Rows this rank's loop receives in ``epoch``, and those already consumed."""
        rows, done = self.streams.rows(epoch, self.live(epoch))
        return self.layout.per_rank * rows, self.layout.per_rank * done

    def _dropped(self, epoch: int) -> Sequence[Any]:
        return self.streams.planner.dropped(epoch, 1)

    def worker_chunks(self, slot: env.WorkerSlot, epoch: int) -> WorkerChunks:
        """The chunks the reading process ``slot`` reads in the current pass over ``epoch``."""
        streams = self.streams.of_worker(epoch, self.live(epoch), slot.id, slot.count)
        return tuple(c for pieces in streams for p in pieces for c in p.chunks)

    def next_chunks(self, slot: env.WorkerSlot, epoch: int) -> Sequence[Chunk]:
        """The first chunks of the worker's streams of the next epoch, in turn (its batches draw from all)."""
        streams = self.streams.of_worker(epoch + 1, (), slot.id, slot.count)
        files = self.source.table if self.exact else None
        reads = [[c for piece in stream for c in piece_reads(piece, files)] for stream in streams]
        return [c for turn in itertools.zip_longest(*reads) for c in turn if c is not None]

    # -- reading -------------------------------------------------------------------------------
    def batches(self, slot: env.WorkerSlot, epoch: int, converted_parts: bool = False) -> Reading:
        """This process's streams read side by side: whole batches, or its parts of them."""
        reader = self.source.reader
        ahead = self.decodes_ahead(slot)
        batching = self.options.batching
        flag = PADDING_COLUMN if batching.equal_batches is EqualBatches.PAD else None
        streams = self.streams.of_worker(epoch, self.live(epoch), slot.id, slot.count)
        work = WorkStats(reader, sum(map(len, streams)), flag)
        self._warm_next(slot, epoch)
        joined = slot.in_worker and self.layout.readers(slot.count) > 1
        batches = interleave(
            reader,
            streams,
            self.layout.per_stream,
            drop_last=batching.drop_last,
            flag_column=flag,
            files=self.source.table if self.exact else None,
            mix_read_rows=MIX_WORKER_READ_ROWS,
            # A worker whose parts are joined sends its parts of many batches at once: the
            # main process joins them with one copy per column (Joiner).
            batches=part_batches(self.layout) if joined else 1,
            ahead=ahead,
        )
        positions = StreamPositions(self.passes.token, slot.id, slot.count, rank=self.world.rank)
        return Reading(batches, positions, work, parts=joined)

    def delivery(
        self, epoch: int, num_workers: int, joins: Joins, consume: Callable[[Tagged], Any]
    ) -> Delivery | None:
        """With several reading workers: the joiner of their parts of every batch."""
        layout, rank = self.layout, self.world.rank
        if num_workers < 1 or layout.readers(num_workers) < 2:
            return None
        rows = [
            layout.per_stream * len(layout.of_worker(rank, w, num_workers))
            for w in range(layout.readers(num_workers))
        ]
        return Joiner(rows, joins.one, consume, joins.blocks)

    # -- construction checks -----------------------------------------------------------------
    def check(self) -> None:
        """Log the plan of epoch 0 and warn about layouts that will hurt (rank 0)."""
        readers = self.layout.readers(self.num_workers)
        fix = (
            f"Use num_workers <= {self.layout.per_rank}: in elastic order a worker reads whole canonical "
            f"streams, and each rank has canonical_ranks / num_ranks = {self.layout.per_rank}"
        )
        if self.world.num_ranks <= REPORT_MAX_RANKS:
            self.report(self.plan(0), fix if readers < self.num_workers else self.source.more_chunks())
        elif self.num_workers > 1 and readers < self.num_workers:
            warn(
                f"num_workers={self.num_workers} but rank {self.world.rank} has {readers} canonical "
                f"stream(s) of {self.source.name}: {self.num_workers - readers} worker(s) will read "
                f"nothing. {fix}"
            )
        mixing = self.options.shuffle.mixing
        streams = None if mixing is None else -(-mixing.streams // self.layout.streams)
        need = self.source.need(self.layout.streams, streams=streams, library_only=False)
        short = None if need is None or self.world.rank != 0 else self.source.shortfall(need)
        if need is not None and short is not None:
            chunks = self.source.chunks() or 0
            warn(
                f"shuffle=True mixes the rows of {need.streams} chunks per stream, but {short[0]} the "
                f"{need.readers:,} canonical streams (canonical_ranks={self.layout.streams}) only {chunks:,} "
                f"chunks, about {chunks / need.readers:.1f} each. {short[1]}"
            )
