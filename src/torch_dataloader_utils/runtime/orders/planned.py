"""The planned order: every rank's share of an epoch, dealt by the planner, read by its workers in pieces.

Each rank plans only its own share (:class:`~torch_dataloader_utils.plan.planner.Planner`),
spreads it over its workers (equal batches for any number of workers), and a worker reads
its pieces one after the other: chunks in file order, windows of the row shuffle or
mixes of the row mixing. A resume state is a cursor ``(piece, offset)`` per worker per
interrupted pass (a *segment*); the rest of an epoch after them is planned again for any
world (:class:`~torch_dataloader_utils.plan.resume.Resumer`).

:class:`SegmentOrder` is what the planned and the elastic order share: a source, and
resume states of segments (:class:`~torch_dataloader_utils.runtime.state.ResumeTracker`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from torch_dataloader_utils.config import PADDING_COLUMN, EqualBatches
from torch_dataloader_utils.errors import IncompatibleOptionsError, UnknownLengthError, warn
from torch_dataloader_utils.io.batching import rebatch
from torch_dataloader_utils.io.helpers import Helpers, helpers
from torch_dataloader_utils.io.pieces import MIX_WORKER_READ_ROWS, piece_reads
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.planner import Planner, RankPlan, nondeterministic
from torch_dataloader_utils.plan.resume import Resumer, group
from torch_dataloader_utils.plan.spread import SPREAD_RANKS, FileSpread
from torch_dataloader_utils.plan.state import ResumeState, Segment, saved_options, segments_of
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, WorkerChunks
from torch_dataloader_utils.runtime import env
from torch_dataloader_utils.runtime.emit import Positions
from torch_dataloader_utils.runtime.options import Options
from torch_dataloader_utils.runtime.orders import Delivery, Joins, Reading
from torch_dataloader_utils.runtime.orders.source import SourcePlan
from torch_dataloader_utils.runtime.report import report_plan
from torch_dataloader_utils.runtime.state import ResumeTracker, Tagged, complete_state
from torch_dataloader_utils.runtime.workstats import WorkStats

__all__ = [
    "MAX_AUTO_WORKERS",
    "REPORT_MAX_RANKS",
    "STANDIN_COLUMN",
    "PlannedOrder",
    "SegmentOrder",
    "check_options",
]

log = logging.getLogger("torch_dataloader_utils.runtime.dataset")
"""The dataset's logger, as before orders were values (what users and tests listen to)."""

MAX_AUTO_WORKERS = 8
"""Upper bound of ``num_workers=None`` (auto)."""

REPORT_MAX_RANKS = 256
"""Worlds of up to this many ranks get the plan summary and layout warnings on rank 0 when built."""

STANDIN_COLUMN = "__tdu_standin"
"""The flag column marking the rows of skipped units inside a worker (never reaches the loop)."""


def _batches_of(rows: Sequence[int | None], batch_size: int, drop_last: bool, unknown: str) -> int:
    """Batches of readers of ``rows`` rows each (each reader's last batch may be short)."""
    total = 0
    for count in rows:
        if count is None:
            raise UnknownLengthError(unknown)
        full, rest = divmod(count, batch_size)
        total += full + (1 if rest and not drop_last else 0)
    return total


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


def check_options(options: Options, row_count_issue: str | None) -> None:
    """The options one source is read with fit its data (counts for equal batches, bad data).

    Raises:
        IncompatibleOptionsError: naming the options that cannot be combined, and the fix.
    """
    _check_counts(options, row_count_issue)
    _check_bad_data(options)


class SegmentOrder:
    """What the planned and the elastic order share: a source, and resume states of segments.

    Args:
        source: The source read.
        options: Its checked options (world, batching, shuffle, ...).
    """

    def __init__(self, source: SourcePlan, options: Options) -> None:
        self.source = source
        self.options = options
        self.world = options.world
        self.passes = ResumeTracker(
            source.table, source.tied_options(), self.world, options.shuffle.shuffle_seed
        )
        self.num_workers = 0

    # -- to be given by each order ----------------------------------------------------------
    def _pass_batches(self, epoch: int, workers: int, segments: tuple[Segment, ...] | None) -> int:
        raise NotImplementedError

    def rows(self, epoch: int, num_workers: int) -> tuple[int | None, int]:
        """Rows this rank's loop receives in ``epoch`` (``None``: unknown), and those already consumed."""
        raise NotImplementedError

    def validate(self, epoch: int, segments: tuple[Segment, ...]) -> object:
        """Plan the rest of ``epoch`` after ``segments`` (raising on a state that does not fit)."""
        raise NotImplementedError

    def piece_rows(self, epoch: int, workers: int, segments: tuple[Segment, ...]) -> list[list[int]] | None:
        """Rows of each piece of each worker of this rank in a pass (``None``: a count is unknown)."""
        raise NotImplementedError

    def digest(self, epoch: int, num_workers: int) -> int | None:
        """A custom strategy's digest of the chunks this rank's fresh pass reads (a state records it)."""
        raise NotImplementedError

    def split_changed(self) -> None:
        """The source's split changed: what was planned with the old one is dropped."""
        self.passes.set_option("split_auto", self.source.split_auto)

    # -- shared ------------------------------------------------------------------------------
    def readers(self, num_workers: int | None = None) -> int:
        """Reading processes per rank in a plan: the workers, or 1 (the main process)."""
        return max(1, self.num_workers if num_workers is None else num_workers)

    @property
    def exact(self) -> bool:
        """Row counts are known before reading."""
        return self.source.row_count_issue is None

    def fingerprint(self) -> dict[str, Any]:
        """What a resume state of this order is tied to (files digest and options)."""
        return self.passes.fingerprint()

    def live(self, epoch: int) -> tuple[Segment, ...]:
        """The loaded state's segments of ``epoch`` (``()``: a full epoch)."""
        return self.passes.live_segments(epoch) or ()

    def num_batches(self, epoch: int, num_workers: int) -> int:
        """Batches this rank yields in a full pass over ``epoch`` with ``num_workers`` workers.

        Raises:
            UnknownLengthError: row counts are unknown before reading (a ``TypeError``).
        """
        return self._pass_batches(epoch, self.readers(num_workers), None)

    def remaining(self, epoch: int) -> int:
        """Batches left of the current pass over ``epoch`` (or of the next one, before it starts)."""
        progress = self.passes.progress
        if progress is None:
            return self._pass_batches(epoch, self.readers(), self.passes.live_segments(epoch))
        if progress.done:
            return 0
        total = self._pass_batches(epoch, progress.num_workers, progress.base or None)
        return max(0, total - progress.batches)

    def unknown(self) -> UnknownLengthError | None:
        """The error of a length asked where row counts are unknown, else ``None``."""
        issue = self.source.row_count_issue
        if not issue:
            return None
        return UnknownLengthError(
            f"the number of batches is unknown before reading: {issue}. Iterate to count, or drop the "
            "row filter to get len()"
        )

    def set_epoch(self, epoch: int) -> None:
        """``epoch`` is selected: a state loaded for another epoch and not read yet is dropped (warned)."""
        loaded = self.passes.unread_loaded_epoch()
        if loaded is not None and loaded != epoch:
            self._warn_dropped_state(loaded, epoch)
        self.passes.on_set_epoch(epoch)

    def _warn_dropped_state(self, loaded: int, epoch: int) -> None:
        consumed = ""
        try:
            total, done = self.rows(loaded, self.readers())
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
        warn(
            f"set_epoch({epoch}) drops the resume state loaded for epoch {loaded} before any of it was "
            f"read{consumed}: {what}. A resumed loop continues at the state's epoch: call "
            f"set_epoch({loaded}) (dataset.epoch after load_state_dict) and count epochs from there"
        )

    def state(self, epoch: int) -> ResumeState:
        """This rank's resume state: what the loop consumed of ``epoch``."""
        return self.passes.state(epoch, self.piece_rows, self.digest)

    def load(self, state: Mapping[str, Any]) -> int:
        """Resume from a state (completed with the other ranks' under a process group); returns its epoch.

        Raises:
            ResumeStateError: not a state, another version, or not every rank.
            StateMismatchError: saved for other files or options (says what changed).
        """
        state = complete_state(state, self.world)
        self._check_counted(state)
        undo = self.source.adopt(state)
        if undo is not None:
            self.split_changed()
        try:
            return self.passes.load(state, self.validate)
        except BaseException:
            if undo is not None:  # a refused state changes nothing
                undo()
                self.split_changed()
            raise

    def _check_counted(self, state: Mapping[str, Any]) -> None:
        """A state's text chunks and cursors were made with (or without) counted rows: so must ours.

        Raises:
            IncompatibleOptionsError: the state's text rows were counted and ours are not, or
                the other way round (its chunks and cursors would point at other rows).
        """
        saved = saved_options(state)
        ours = self.passes.fingerprint()["options"].get("rows_counted")
        if saved is None or ours is None or "rows_counted" not in saved or saved["rows_counted"] == ours:
            return
        then = saved["rows_counted"]
        fix = (
            f"Build it with count_rows={then!r} to resume the state"
            if then
            else "Resume it where the rows are not counted either (count_rows=False; on one rank, or with "
            "equal_batches='off'), and save states to be resumed on other numbers of ranks with "
            "count_rows=True (rows counted when the dataset is built)"
        )
        raise IncompatibleOptionsError(
            f"the resume state was saved with the text files' rows {'counted' if then else 'not counted'} "
            f"(count_rows={then!r}, or its default on that many ranks), and this dataset's are "
            f"{'counted' if ours else 'not'}: chunks and cursors would point at other records. {fix}"
        )

    def delivery(
        self, epoch: int, num_workers: int, joins: Joins, consume: Callable[[Tagged], Any]
    ) -> Delivery | None:
        """Nothing stands between the workers and the loop: batches go as they came."""
        return None

    def dropped_rows(self, epoch: int) -> int:
        """Rows equal batches leave out of ``epoch`` (for the metrics)."""
        if not self.options.equalized or not self.exact:
            return 0
        return sum(c.num_rows or 0 for c in self._dropped(epoch))

    def _dropped(self, epoch: int) -> Sequence[Any]:
        return self.source.planner.dropped(epoch, self.readers())

    def _warm_next(self, slot: env.WorkerSlot, epoch: int) -> None:
        """Warm the node-local cache with this worker's first chunks of the next epoch (idle threads)."""
        count = self.options.cache.data_cache_prefetch
        if not count:
            return
        try:
            chunks = list(self.next_chunks(slot, epoch))
        except Exception as exc:  # best effort: never stop the epoch being read
            log.debug("no cache warming for epoch %d: %s", epoch + 1, exc)
            return
        self.source.reader.warm(chunks[:count])

    def next_chunks(self, slot: env.WorkerSlot, epoch: int) -> Sequence[Chunk]:
        """The chunks the reading process ``slot`` reads first in the epoch after ``epoch``, in order."""
        raise NotImplementedError

    def decodes_ahead(self, slot: env.WorkerSlot) -> bool:
        """Whether ``slot`` decodes ahead of its caller (it has a CPU to spare, or was told to).

        Workers that already fill the rank's CPUs decode in their own thread, and only
        when asked (``decode_ahead``); their reader then uses no Arrow threads either.
        """
        spare = slot.count < env.cpus_per_rank() if slot.in_worker else env.cpus_per_rank() > 1
        if slot.in_worker:
            self.source.reader.use_threads(spare)
        ahead = self.options.fetch.decode_ahead
        return spare if ahead is None else ahead

    def report(self, plan: EpochPlan, more_chunks: str) -> None:
        """Log ``plan`` and its layout issues on rank 0 (``more_chunks``: how the data gives more chunks)."""
        shuffle = self.options.shuffle
        report_plan(
            plan,
            self.source.table,
            rank=self.world.rank,
            shuffle=shuffle.shuffle,
            row_window=shuffle.rows_mixed,
            batch_size=self.options.batching.batch_size,
            name=self.source.name,
            more_chunks=more_chunks,
        )

    def prepare(self, epoch: int, num_workers: int) -> None:
        """Main process: a pass starts; what ``state_dict()`` needs of it is planned now."""
        self.piece_rows(epoch, self.readers(num_workers), self.live(epoch))
        self.passes.fingerprint()


class PlannedOrder(SegmentOrder):
    """Every rank's share of an epoch, spread over its workers in pieces; see the module docstring.

    Args:
        source: The source read (its split may be made finer for the row mixing here).
        options: The checked options.
        num_workers: DataLoader workers per rank (``None``: automatic).
    """

    def __init__(self, source: SourcePlan, options: Options, num_workers: int | None) -> None:
        # The split is chosen for this world's readers: ranks x the workers asked for
        # (``None``: the most the automatic choice may pick, a constant, as the CPUs may differ
        # between nodes); under a process group every rank takes rank 0's figure.
        readers = options.world.num_ranks * (MAX_AUTO_WORKERS if num_workers is None else max(1, num_workers))
        source.choose_split(source.need(readers), shared=True)
        super().__init__(source, options)
        # What the main process planned for an epoch, for its DataLoader workers (shared
        # memory, so persistent workers see it): [epoch + 1, num_workers, digest of a custom
        # strategy's chunks]; and, for a rank-aware strategy with equal batches, every rank's rows.
        self._digest = torch.zeros(3, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._totals: torch.Tensor | None = None
        if self.planner.rank_aware and options.equalized:
            self._totals = torch.zeros(self.world.num_ranks + 1, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._plans: BoundedDict[tuple[int, int], EpochPlan] = BoundedDict(4)
        self._resumers: BoundedDict[tuple[int, int, int], Resumer] = BoundedDict(4)
        self._piece_rows: BoundedDict[tuple[int, int, int], list[list[int]] | None] = BoundedDict(4)
        self._last_rows: tuple[tuple[Segment, ...], int, int, list[list[int]] | None] | None = None
        self._logged: set[int] = set()
        self.num_workers = self._auto_workers() if num_workers is None else num_workers

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Workers plan their own epoch; do not ship plans (the planner keeps its chunk table).
        for name in ("_plans", "_resumers", "_piece_rows"):
            state[name] = BoundedDict(4)
        state["_last_rows"] = None
        return state

    @property
    def planner(self) -> Planner:
        """The source's planner (chunk table built once; plans one rank at a time)."""
        return self.source.planner

    def split_changed(self) -> None:
        """The split changed (a loaded state's): every plan made with the old one is dropped."""
        super().split_changed()
        for cache in (self._plans, self._resumers, self._piece_rows):
            cache.clear()
        self._last_rows = None
        self._logged = set()

    def _auto_workers(self) -> int:
        """Workers for ``num_workers=None``: CPUs per rank, at most one per chunk, at most 8.

        One worker would only add a process hop, so 1 becomes 0 (read in the main process).
        """
        chunks = self.rank_plan(0, num_workers=1).share_size
        workers = min(env.cpus_per_rank(), chunks, MAX_AUTO_WORKERS)
        return 0 if workers <= 1 else workers

    # -- planning ------------------------------------------------------------------------------
    def rank_plan(self, epoch: int, num_workers: int | None = None) -> RankPlan:
        """This rank's plan of ``epoch`` for ``num_workers`` (checked against the main process's in a worker).

        Raises:
            PlanError: the split strategy returned invalid, overlapping or
                non-deterministic chunks.
        """
        workers = self.readers(num_workers)
        in_worker = env.worker_slot().in_worker
        totals = None
        if self._totals is not None and int(self._totals[0]) == epoch + 1:
            totals = self._totals[1:].tolist()
        plan = self.planner.rank_plan(epoch, self.world.rank, workers, totals=totals, verify=not in_worker)
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
                self._totals[1:] = torch.as_tensor(self.planner.totals(epoch, plan.num_workers))
                self._totals[0] = epoch + 1
            return
        published = self._digest.tolist()
        if published[:2] == [epoch + 1, plan.num_workers] and published[2] != digest:
            raise nondeterministic(
                self.planner.spec.strategy.name,
                f"a DataLoader worker and the main process of rank {self.world.rank}, epoch {epoch}",
            )

    def _log_left_out(self, epoch: int, workers: int) -> None:
        """Say which rows equal batches leave out (``'drop'``) or repeat (``'pad'``)."""
        self._logged.add(epoch)
        if not self.options.equalized or self.world.rank != 0:
            return
        shuffle = self.options.shuffle.shuffle
        level = logging.DEBUG if shuffle else logging.INFO
        if not log.isEnabledFor(level):
            return
        policy = self.options.batching.equal_batches
        chunks = self.planner.dropped(epoch, workers) if policy is EqualBatches.DROP else ()
        if policy is EqualBatches.PAD:
            chunks = self.planner.padding(epoch, workers)
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

    def plan(self, epoch: int, num_workers: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` for every rank and worker (each rank planned when first read)."""
        workers = self.readers(num_workers)
        key = (epoch, workers)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.planner.epoch_plan(epoch, workers)
        return plan

    def verify(self, epoch: int, num_workers: int | None = None) -> None:
        """Check that no two chunks of any ranks share a row in ``epoch`` (``plan --verify``)."""
        self.planner.verify(epoch, self.readers(num_workers))

    def digest(self, epoch: int, num_workers: int) -> int | None:
        """A custom strategy's digest of the chunks this rank's fresh pass reads (a state records it)."""
        return self.rank_plan(epoch, num_workers).digest

    def validate(self, epoch: int, segments: tuple[Segment, ...]) -> object:
        """Plan the rest of ``epoch`` after ``segments`` (raising on a state that does not fit).

        Raises:
            IncompatibleOptionsError: the state's passes dealt equal rows to several ranks,
                and this dataset's row counts are unknown (text files not counted).
        """
        saved = max(s.num_ranks for s in segments)
        policy = self.options.batching.equal_batches
        table = self.planner.chunk_table()
        if saved > 1 and policy is not EqualBatches.OFF and table is not None and (table.rows < 0).any():
            raise IncompatibleOptionsError(
                f"the resume state was saved on {saved} ranks with equal_batches={policy.value!r}, whose "
                "plan deals exact row counts, but this dataset's row counts are unknown (its text files "
                "were not counted: one rank counts only when asked); build it with count_rows=True to "
                "resume the state"
            )
        return self.pieces(epoch, self.readers(), segments)

    def _resumer(self, epoch: int, workers: int, segments: tuple[Segment, ...]) -> Resumer:
        key = (epoch, workers, hash(segments))
        found = self._resumers.get(key)
        if found is None or found.levels != len(segments):
            shuffle = self.options.shuffle
            found = Resumer(
                self.planner,
                epoch,
                segments,
                num_ranks=self.world.num_ranks,
                num_workers=lambda rank: workers,
                window_rows=shuffle.row_window,
                exact=self.exact,
                mixing=shuffle.mixing,
            )
            self._resumers[key] = found
        return found

    def pieces(
        self, epoch: int, workers: int, segments: Sequence[Segment | Mapping[str, Any]]
    ) -> tuple[tuple[Piece, ...], ...]:
        """This rank's pieces per worker after the resumed ``segments``."""
        return self._resumer(epoch, workers, segments_of(segments)).rank(self.world.rank)

    def reader_pieces(self, epoch: int, rank: int, worker: int, workers: int) -> tuple[Piece, ...]:
        """The pieces worker ``worker`` of ``workers`` of ``rank`` reads in a full pass over ``epoch``."""
        if rank == self.world.rank:
            plan = self.rank_plan(epoch, workers)
        else:
            plan = self.planner.rank_plan(epoch, rank, workers)
        pieces = plan.pieces_for(worker)
        # Only this worker's windows / mixes, keyed as the Resumer keys segment 0.
        shuffle = self.options.shuffle
        key = (shuffle.shuffle_seed if shuffle.shuffle else 0, epoch, 0, rank, worker)
        return tuple(group(pieces, shuffle.row_window, shuffle.mixing, key, self.source.table))

    def worker_pieces(self, slot: env.WorkerSlot, epoch: int) -> tuple[Piece, ...]:
        """What the reading process ``slot`` reads of the current pass over ``epoch``."""
        segments = self.passes.live_segments(epoch)
        if segments:
            return self.pieces(epoch, slot.count, segments)[slot.id]
        return self.reader_pieces(epoch, self.world.rank, slot.id, slot.count)

    def worker_chunks(self, slot: env.WorkerSlot, epoch: int) -> WorkerChunks:
        """The chunks the reading process ``slot`` reads in a full pass over ``epoch``."""
        return self.rank_plan(epoch, slot.count).chunks_for(slot.id)

    def files_per_batch(self, epoch: int, num_workers: int | None, ranks: int | None) -> float | None:
        """Expected distinct files in a batch of ``epoch``, over the readers of the first ``ranks`` ranks."""
        workers = self.readers(num_workers)
        count = self.world.num_ranks if ranks is None else min(ranks, self.world.num_ranks)
        spread = FileSpread(self.options.batching.batch_size)
        for rank in range(count):
            spread.add_all([self.reader_pieces(epoch, rank, w, workers) for w in range(workers)])
        return spread.mean

    def piece_rows(self, epoch: int, workers: int, segments: tuple[Segment, ...]) -> list[list[int]] | None:
        """Rows of each piece of each worker of this rank (``None`` if a count is unknown).

        What ``state_dict()`` turns into the rows each worker has left; computed once per pass.
        """
        workers = max(1, workers)
        last = self._last_rows
        if last is not None and last[0] is segments and last[1:3] == (epoch, workers):
            return last[3]  # state_dict() during a pass: no hashing of the segments
        key = (epoch, workers, hash(segments))
        if key in self._piece_rows:
            self._last_rows = (segments, epoch, workers, self._piece_rows[key])
            return self._piece_rows[key]
        shuffle = self.options.shuffle
        counts: list[list[int | None]]
        if not segments and shuffle.row_window is None and shuffle.mixing is None:
            plan = self.rank_plan(epoch, workers)  # a piece is a chunk: no pieces built
            counts = [plan.piece_rows(w) for w in range(workers)]
        else:
            counts = [[p.num_rows for p in ps] for ps in self.pieces(epoch, workers, segments)]
        rows = (
            None
            if any(n is None for ps in counts for n in ps)
            else [[int(n or 0) for n in ps] for ps in counts]
        )
        self._piece_rows[key] = rows
        self._last_rows = (segments, epoch, workers, rows)
        return rows

    def _pass_batches(self, epoch: int, workers: int, segments: tuple[Segment, ...] | None) -> int:
        """Batches of a pass over ``epoch`` by ``workers`` readers: whole, or after ``segments``."""
        error = self.unknown()
        if error is not None:
            raise error
        if segments:
            rows: list[int | None] = [
                None if any(p.num_rows is None for p in pieces) else sum(p.num_rows or 0 for p in pieces)
                for pieces in self.pieces(epoch, workers, segments)
            ]
            unknown = "the number of batches left in this resumed epoch is unknown"
        else:
            plan = self.rank_plan(epoch, workers)
            rows = [plan.rows_for(w) for w in range(plan.num_workers)]
            unknown = (
                "the number of batches is unknown before reading: this format's row counts "
                "are not in its metadata (byte-range chunks). Iterate to count"
            )
        batching = self.options.batching
        return _batches_of(rows, batching.batch_size, batching.drop_last, unknown)

    def rows(self, epoch: int, num_workers: int) -> tuple[int | None, int]:
        """Rows this rank's loop receives in ``epoch`` (``None``: unknown), and those already consumed."""
        if not self.exact:
            return None, 0
        batching = self.options.batching
        workers = self.readers(num_workers)

        def delivered(rows: list[int | None]) -> int | None:
            if any(r is None for r in rows):
                return None
            size = batching.batch_size
            return sum((r or 0) // size * size if batching.drop_last else (r or 0) for r in rows)

        plan = self.rank_plan(epoch, workers)
        total = delivered([plan.rows_for(w) for w in range(plan.num_workers)])
        segments = self.passes.live_segments(epoch)
        if total is None or not segments:
            return total, 0
        left = delivered(
            [
                None if any(p.num_rows is None for p in pieces) else sum(p.num_rows or 0 for p in pieces)
                for pieces in self.pieces(epoch, workers, segments)
            ]
        )
        return total, 0 if left is None else max(0, total - left)

    # -- reading -------------------------------------------------------------------------------
    def _helpers(self, slot: env.WorkerSlot) -> Helpers | None:
        """Threads for a shuffle's decoding and gathers, when this process has CPUs to spare.

        A worker gets its share of the rank's CPUs less its own thread; the main process
        all of them less its own and the read-ahead thread. None on small machines.
        """
        shuffle = self.options.shuffle
        if shuffle.mixing is None and shuffle.row_window is None:
            return None
        cpus = env.cpus_per_rank()
        return helpers(cpus // slot.count - 1 if slot.in_worker else cpus - 2)

    def next_chunks(self, slot: env.WorkerSlot, epoch: int) -> Sequence[Chunk]:
        """The chunks the reading process ``slot`` reads first in the epoch after ``epoch``, in order."""
        return self.rank_plan(epoch + 1, slot.count).chunks_for(slot.id)

    def batches(self, slot: env.WorkerSlot, epoch: int, converted_parts: bool = False) -> Reading:
        """The batches the reading process ``slot`` reads of the current pass over ``epoch``."""
        reader = self.source.reader
        ahead = self.decodes_ahead(slot)
        files = self.source.table if self.exact else None
        batching = self.options.batching
        padded = batching.equal_batches is EqualBatches.PAD
        flag = PADDING_COLUMN if padded else None
        pieces = self.worker_pieces(slot, epoch)
        work = WorkStats(reader, len(pieces), flag)  # before any request of this pass
        reader.schedule([c for piece in pieces for c in piece_reads(piece, files)])  # remote: ahead
        self._warm_next(slot, epoch)
        # Rows of skipped units: flagged as padding (kept), or flagged to be removed.
        removed = STANDIN_COLUMN if self.options.bad_data.skipping and not padded else None
        positions = Positions(self.passes.token, slot.id, slot.count, rank=self.world.rank)
        read: Iterator[Any] = positions.read(
            reader,
            pieces,
            flag or removed,
            batching.batch_size,
            files,
            MIX_WORKER_READ_ROWS if slot.in_worker else None,
            ahead=ahead,
            standins=removed,
            helpers=self._helpers(slot),
        )
        return Reading(rebatch(read, batching.batch_size, batching.drop_last), positions, work)

    # -- construction checks -----------------------------------------------------------------
    def check(self) -> None:
        """Log the plan of epoch 0 and warn about layouts that will hurt (rank 0).

        The summary covers every rank, so rank 0 plans them all once: up to
        :data:`REPORT_MAX_RANKS` ranks. A larger world is summarized by the ``plan``
        command instead; each rank then only warns about its own idle workers.
        """
        chunks = self.rank_plan(0).share_size  # this rank's plan, checked (a custom strategy too)
        if self.world.num_ranks <= REPORT_MAX_RANKS:
            self.report(self.plan(0), self.source.more_chunks())
        elif self.num_workers > 1 and chunks < self.num_workers:
            warn(
                f"num_workers={self.num_workers} but rank {self.world.rank} has only {chunks} chunk(s) of "
                f"{self.source.name} in epoch 0: {self.num_workers - chunks} worker(s) will read "
                f"nothing. {self.source.more_chunks()}, or lower num_workers"
            )
        self._check_mixing()

    def _check_mixing(self) -> None:
        """Warn (rank 0) when the readers get fewer chunks than the row mixing draws from."""
        workers = self.readers()
        need = self.source.need(self.world.num_ranks * workers, library_only=False)
        if need is None or self.world.rank != 0:
            return
        short = self.source.shortfall(need)
        if short is None:
            return
        limit, fix = short
        chunks = self.source.chunks() or 0
        mean = self.files_per_batch(0, workers, SPREAD_RANKS)
        figure = "" if mean is None else f"; a batch draws from about {mean:.1f} files"
        warn(
            f"shuffle=True mixes the rows of {need.streams} chunks per reader, but {limit} the "
            f"{need.readers:,} readers ({self.world.num_ranks:,} ranks x {workers} workers) only "
            f"{chunks:,} chunks, about {chunks / need.readers:.1f} each{figure}. {fix}"
        )
