"""Mid-epoch resumption, as pure planning: the rest of an epoch for any world.

A worker reads its :class:`~.pieces.Piece` list in order, and what the loop consumed is a
cursor ``(piece, offset)`` per worker (:mod:`.pieces`).

Resuming an epoch, segment after segment (each segment is one interrupted pass):

1. the pieces of the pass that was interrupted: the epoch's plan (segment 0, in the
   world it was saved under) or the plan of what the previous pass left;
2. every worker's list cut at its cursor (:func:`~.pieces.remaining`): a chunk read in
   file order is cut exactly at the row when row counts are exact; a window or a mix is
   continued at its offset in the same order (its buffer is re-read, never stored);
3. what remains, worker after worker of rank after rank, is the stream of the next pass,
   dealt over the new world (other ``num_ranks``, other ``num_workers``) by the rule of
   a fresh epoch (:mod:`.deal`), in even homes: rank ``r`` reads rows ``[r * q, (r + 1) *
   q)`` of it (the dropped span aside, the padding after it), then LPT and worker quotas
   (:mod:`.ranks`), then windows or mixes again.

A rank needs only the few previous workers whose remaining rows overlap its ranges, found
from every worker's count of remaining rows: the ``left`` field a state records per worker
(or, for states without it, counted from each previous rank's plan). Without exact row
counts (an uncounted row filter, text files that were not counted) the stream counts
pieces, dealt whole in even runs of pieces, from every previous rank's plan.

Nothing here reads the environment. Pieces and cursors are in :mod:`.pieces`; the state's
format, fingerprint and checks in :mod:`.state`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from torch_dataloader_utils.errors import ResumeStateError
from torch_dataloader_utils.plan.deal import Deal, deal
from torch_dataloader_utils.plan.mixing import RowMixing
from torch_dataloader_utils.plan.pieces import Piece, cut_piece, mix_pieces, remaining, window_pieces
from torch_dataloader_utils.plan.planner import Planner, PlanSpec, Stream
from torch_dataloader_utils.plan.ranks import Span, to_workers
from torch_dataloader_utils.plan.state import RankEntry, Segment, segments_of
from torch_dataloader_utils.plan.types import FileInfo

__all__ = ["PieceSource", "ResumeResult", "Resumer", "group", "segment_pieces"]

Workers = tuple[tuple[Piece, ...], ...]


def group(
    pieces: Sequence[Piece],
    window_rows: int | None,
    mixing: RowMixing | None,
    key: tuple[int, ...],
    files: Mapping[str, FileInfo],
) -> list[Piece]:
    """A worker's pieces as windows (``window_rows``), mixes (``mixing``) or as they are."""
    if window_rows is not None:
        return window_pieces(pieces, window_rows, key)
    return mix_pieces(pieces, mixing, key, files)


class PieceSource:
    """What one worker of an interrupted pass left: its remaining pieces, cut on demand.

    Args:
        items: The pieces, in reading order.
        files: Their files by path.
        exact: Row counts are exact, so a chunk read in file order is cut at a row.
    """

    def __init__(self, items: Sequence[Piece], files: Mapping[str, FileInfo], exact: bool) -> None:
        self.items = items
        self.files = files
        self.exact = exact
        self.rows = np.fromiter(
            (-1 if p.num_rows is None else p.num_rows for p in items), np.int64, len(items)
        )

    def weight(self, item: int) -> int:
        """Balancing weight of a piece."""
        return self.items[item].weight

    def pieces(self, spans: Sequence[Span]) -> list[Piece]:
        """Rows ``[lo, hi)`` of each span's piece (padding flagged on every chunk)."""
        out = []
        for _, item, lo, hi, padding in spans:
            piece = self.items[item]
            if 0 <= hi < self.rows[item]:
                piece = cut_piece(piece, hi, self.files, self.exact)[0]
            if lo > 0:
                piece = cut_piece(piece, lo, self.files, self.exact)[1]
            if padding:
                piece = replace(piece, chunks=tuple(replace(c, padding=True) for c in piece.chunks))
            out.append(piece)
        return out


@dataclass(frozen=True, slots=True)
class ResumeResult:
    """Pieces of every (rank, worker) for the rest of an epoch, and the rows left out.

    Attributes:
        assignments: ``assignments[rank][worker]``: that worker's pieces, in order.
        dropped: Pieces no rank reads (``equal_batches='drop'``; fewer than
            ``num_ranks`` rows).
    """

    assignments: tuple[Workers, ...]
    dropped: tuple[Piece, ...] = ()


class Resumer:
    """The rest of one epoch after a state's segments, planned one rank at a time.

    Args:
        planner: Plans of the dataset (its world is replaced by each segment's).
        epoch: The epoch.
        segments: The state's segments (parsed; plain JSON values are parsed here).
        num_ranks: Ranks of the world to plan for.
        num_workers: Workers of a rank in that world.
        window_rows: Row-shuffle window, or ``None``.
        exact: Row counts are exact (no uncounted row filter), so chunks can be cut at a row.
        mixing: Row mixing (when ``window_rows`` is ``None``), or ``None``.
    """

    def __init__(
        self,
        planner: Planner,
        epoch: int,
        segments: Sequence[Segment | Mapping[str, Any]],
        *,
        num_ranks: int,
        num_workers: Callable[[int], int],
        window_rows: int | None,
        exact: bool,
        mixing: RowMixing | None = None,
    ) -> None:
        self.spec: PlanSpec = planner.spec
        self.epoch = epoch
        self.files: Mapping[str, FileInfo] = planner.files
        self.window_rows = window_rows
        self.mixing = mixing
        self.exact = exact
        self.segments = segments_of(segments)
        self.worlds: list[tuple[int, Callable[[int], int]]] = [
            (s.num_ranks, s.workers_of) for s in self.segments
        ] + [(num_ranks, num_workers)]
        self._planner = planner.for_world(self.worlds[0][0])
        self._seed = self.spec.seed if self.spec.shuffle else 0
        self.ranged = exact and self._planner.rows_known(epoch, max(1, self.worlds[0][1](0)))
        self._pieces: dict[tuple[int, int], Workers] = {}
        self._left: dict[int, np.ndarray[Any, Any]] = {}
        self._rests: dict[tuple[int, int], list[list[Piece]]] = {}
        self._streams: dict[int, tuple[Stream, Deal]] = {}

    @property
    def levels(self) -> int:
        """Index of the pass being planned (the number of segments)."""
        return len(self.worlds) - 1

    def rank(self, rank: int) -> Workers:
        """This world's pieces of ``rank``, per worker.

        Also checks the counts of rows left of the earlier passes' ranks that say they
        had nothing left (see :meth:`_check_empty`).
        """
        found = self.pieces(self.levels, rank)
        if self.ranged:
            self._check_empty(rank)
        return found

    def _check_empty(self, rank: int) -> None:
        """Check the earlier ranks whose state says they had no rows left, a share of them.

        A count of rows left is checked against the rank's cursors when a rank reads
        rows of it (:meth:`_rest`), which covers every count above zero; the rows of a
        rank claiming zero are read by no one, and a rank that finished its pass (after
        the first) is not re-planned, so the counts of the pass before it that its
        share crossed are read by no one either. Rank ``p`` of every earlier pass is
        checked here by rank ``p % num_ranks`` of this one, so the ranks of a job
        together check every claim (a few re-plans each) and none plans them all.
        """
        num_ranks = self.worlds[self.levels][0]
        for level in range(self.levels):
            for prev in range(rank, self.worlds[level][0], num_ranks):
                entry = self._entry(level, prev)
                if entry.done:
                    if level:
                        self.pieces(level, prev)
                elif entry.left is not None and not any(entry.left):
                    self._rest(level, prev)

    def pieces(self, level: int, rank: int) -> Workers:
        """Pieces of ``rank`` in pass ``level`` (0: the epoch's plan), per worker."""
        found = self._pieces.get((level, rank))
        if found is None:
            num_ranks, workers_of = self.worlds[level]
            if not 0 <= rank < num_ranks:
                raise ValueError(f"rank must be in [0, {num_ranks}), got {rank}")
            workers = max(1, workers_of(rank))
            if level == 0:
                plan = self._planner.rank_plan(self.epoch, rank, workers)
                if self.segments:
                    self._entry(0, rank).check_digest(plan.digest, rank)
                pieces = [plan.pieces_for(w) for w in range(workers)]
            else:
                stream, dealt = self._stream(level)
                spans = stream.spans(dealt.ranges(rank))
                equal = self.spec.equal_batches.acts_on(num_ranks)
                bins = to_workers(spans, workers, stream.weight, batch_size=self.spec.batch_size, equal=equal)
                pieces = [stream.pieces(b) for b in bins]
            key = (self._seed, self.epoch, level, rank)
            found = tuple(
                tuple(group(p, self.window_rows, self.mixing, (*key, w), self.files))
                for w, p in enumerate(pieces)
            )
            self._pieces[(level, rank)] = found
        return found

    # -- what a pass left --------------------------------------------------------------
    def _entry(self, level: int, rank: int) -> RankEntry:
        try:
            return self.segments[level].ranks[rank]
        except KeyError:
            raise ResumeStateError(
                f"the resume state has no entry of rank {rank} in segment {level}"
            ) from None

    def _remaining(self, level: int, rank: int) -> list[list[Piece]]:
        """What pass ``level`` left of ``rank``'s pieces, per worker (by the segment's cursors)."""
        entry = self._entry(level, rank)
        workers = self.pieces(level, rank)
        if entry.done:
            return [[] for _ in workers]
        if len(entry.cursors) != len(workers):
            raise ResumeStateError(
                f"rank {rank} has {len(entry.cursors)} worker cursors but planned {len(workers)} workers; "
                "the state is inconsistent"
            )
        return [
            remaining(pieces, cursor, self.files, self.exact)
            for pieces, cursor in zip(workers, entry.cursors, strict=True)
        ]

    def _slots(self, level: int) -> np.ndarray[Any, Any]:
        """Position of each rank's first worker among pass ``level``'s workers (and their total, last)."""
        sizes = [self._entry(level, r).num_workers for r in range(self.worlds[level][0])]
        return np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))

    def left(self, level: int) -> np.ndarray[Any, Any]:
        """Rows pass ``level`` left per (rank, worker), rank after rank, as one array.

        From the state's ``left`` field where it has one (nothing is planned), else
        counted from the rank's pieces and cursors.
        """
        found = self._left.get(level)
        if found is None:
            counts: list[int] = []
            for rank in range(self.worlds[level][0]):
                entry = self._entry(level, rank)
                if entry.done:
                    counts += [0] * entry.num_workers
                elif entry.left is not None:
                    if len(entry.left) != entry.num_workers:
                        raise ResumeStateError(
                            f"rank {rank} of segment {level} has {len(entry.left)} counts of rows left but "
                            f"{entry.num_workers} workers; the state is inconsistent"
                        )
                    counts += entry.left
                else:
                    counts += [_rows(rest) for rest in self._remaining(level, rank)]
            found = self._left[level] = np.asarray(counts, dtype=np.int64)
        return found

    def _rest(self, level: int, rank: int) -> list[list[Piece]]:
        """:meth:`_remaining`, once, checked against the rows left the state says."""
        rest = self._rests.get((level, rank))
        if rest is None:
            rest = self._remaining(level, rank)
            first = int(self._slots(level)[rank])
            left = self.left(level)
            for w, pieces in enumerate(rest):
                have, said = _rows(pieces), int(left[first + w])
                if have != said:
                    raise ResumeStateError(
                        f"the resume state says rank {rank} worker {w} had {said} rows left in "
                        f"segment {level}, but its cursor leaves {have}; the state was edited or saved "
                        "by another version: pass what loader.state_dict() returned, unchanged"
                    )
            self._rests[(level, rank)] = rest
        return rest

    def _stream(self, level: int) -> tuple[Stream, Deal]:
        """What pass ``level - 1`` left, worker after worker, rank after rank, and its deal."""
        found = self._streams.get(level)
        if found is not None:
            return found
        prev, num_ranks = level - 1, self.worlds[level][0]
        slots = self._slots(prev)
        spec = self.spec

        def slot(k: int, rest: Callable[[int, int], list[list[Piece]]]) -> PieceSource:
            rank = int(np.searchsorted(slots, k, side="right")) - 1
            return PieceSource(rest(prev, rank)[k - int(slots[rank])], self.files, self.exact)

        if self.ranged:
            stream = Stream(self.left(prev), lambda k: slot(k, self._rest))
        else:
            if spec.equal_batches.acts_on(num_ranks):
                raise ResumeStateError(
                    "equal_batches needs exact row counts to re-plan the rest of an epoch, but the "
                    "pieces' row counts are unknown; pass equal_batches='off'"
                )
            counts = [len(w) for rank in range(self.worlds[prev][0]) for w in self._remaining(prev, rank)]
            stream = Stream(
                np.asarray(counts, dtype=np.int64), lambda k: slot(k, self._remaining), items=True
            )
        total = int(stream.starts[-1])
        dealt = deal(
            total,
            num_ranks,
            spec.equal_batches,
            shuffle=spec.shuffle,
            seed=spec.seed,
            key=(self.epoch, level),
        )
        stream.spans(dealt.dropped())  # the rows left out: no rank reads them, so check the counts they cross
        self._streams[level] = found = (stream, dealt)
        return found

    def dropped(self) -> tuple[Piece, ...]:
        """Pieces the pass being planned leaves out (``equal_batches='drop'``)."""
        level = self.levels
        if not self.spec.equal_batches.acts_on(self.worlds[level][0]):
            return ()
        if level == 0:
            return tuple(
                Piece.file(c) for c in self._planner.dropped(self.epoch, max(1, self.worlds[0][1](0)))
            )
        stream, dealt = self._stream(level)
        return tuple(stream.pieces(stream.spans(dealt.dropped())))


def _rows(pieces: Sequence[Piece]) -> int:
    return sum(p.num_rows or 0 for p in pieces)


def segment_pieces(
    spec: PlanSpec | Planner,
    epoch: int,
    segments: Sequence[Segment | Mapping[str, Any]],
    *,
    num_ranks: int,
    num_workers: Callable[[int], int],
    window_rows: int | None,
    exact: bool,
    mixing: RowMixing | None = None,
) -> ResumeResult:
    """Pieces of every (rank, worker) after the interrupted ``segments`` of ``epoch``.

    Segment 0 is the epoch's full plan in the world it was saved under (each rank with
    its own ``num_workers``); each later segment is the plan of what the one before
    left. The result is the plan of what the last segment left, over ``num_ranks``
    ranks. With no segments it is the full plan of the epoch. A job's processes plan
    their own rank with :class:`Resumer` instead.

    Args:
        spec: The plan's options (its ``num_ranks`` / ``num_workers`` are replaced), or
            a planner of them.
        epoch: The epoch.
        segments: The state's segments.
        num_ranks: Ranks of the world to plan for.
        num_workers: Workers of a rank in that world.
        window_rows: Row-shuffle window, or ``None``.
        exact: Row counts are exact (no row filter), so chunks can be cut at a row.
        mixing: Row mixing (when ``window_rows`` is ``None``), or ``None``.
    """
    planner = spec if isinstance(spec, Planner) else Planner(spec)
    resumer = Resumer(
        planner,
        epoch,
        segments,
        num_ranks=num_ranks,
        num_workers=num_workers,
        window_rows=window_rows,
        exact=exact,
        mixing=mixing,
    )
    return ResumeResult(tuple(resumer.rank(r) for r in range(num_ranks)), resumer.dropped())
