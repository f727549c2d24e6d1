"""Mid-epoch resumption, as pure planning: the rest of an epoch for any world.

A worker reads its :class:`~.pieces.Piece` list in order, and what the loop consumed is a
cursor ``(piece, offset)`` per worker (:mod:`.pieces`).

Resuming an epoch, segment after segment (each segment is one interrupted pass):

1. the pieces of the pass that was interrupted: the epoch's plan (segment 0, in the
   world it was saved under) or the replan of what the previous pass left;
2. every worker's list cut at its cursor (:func:`~.pieces.remaining`): a chunk read in
   file order is cut exactly at the row when row counts are exact; a window is
   continued at its offset in the same permutation (its buffer is re-read, never stored);
3. what remains, worker after worker of rank after rank, is the *pool*, dealt over the
   new world (other ``num_ranks``, other ``num_workers``).

With exact row counts the pool is dealt as contiguous row ranges: rank ``r`` gets rows
``[r * q, (r + 1) * q)`` of it, ``q`` rows each with ``equal_batches`` on (``'drop'``
first leaves out ``pool % num_ranks`` rows, a span at an offset drawn from ``(seed,
epoch, segment)`` when shuffling, else the last ones; ``'pad'`` ends the pool with
``-pool % num_ranks`` rows repeated from it), ``ceil(pool / num_ranks)`` with it off.
A rank then needs only the few previous ranks whose remaining rows overlap its range,
found from every worker's count of remaining rows: the ``left`` field a state records
per worker (or, for states without it, counted from each previous rank's plan). Then
LPT and, with equal batches, worker quotas that are multiples of ``batch_size``.

Without exact row counts (a row filter that was not counted, text files that were not)
pieces are dealt whole, ``[rank::num_ranks]``, from every previous rank's plan.

Nothing here reads the environment. Pieces and cursors are in :mod:`.pieces`; the state's
JSON format, fingerprint and checks in :mod:`.state`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from torch_dataloader_utils.errors import ResumeStateError
from torch_dataloader_utils.plan.assign import assign
from torch_dataloader_utils.plan.mixing import RowMixing
from torch_dataloader_utils.plan.pieces import (
    Piece,
    as_pieces,
    cut_piece,
    mix_pieces,
    remaining,
    window_pieces,
)
from torch_dataloader_utils.plan.planner import _DROP_SALT, _PAD_SALT, Planner, PlanSpec
from torch_dataloader_utils.plan.ranks import fill_quotas_by, rank_quota, worker_quotas
from torch_dataloader_utils.plan.shuffle import random_offset
from torch_dataloader_utils.plan.types import EqualBatches, FileInfo

__all__ = ["ResumeResult", "Resumer", "replan", "segment_pieces"]

Workers = tuple[tuple[Piece, ...], ...]


def _fill(
    bins: Sequence[Sequence[Piece]], quotas: Sequence[int], files: Mapping[str, FileInfo]
) -> tuple[list[list[Piece]], list[Piece]]:
    """:func:`~.ranks.fill_quotas` for pieces: exact quotas, cutting at row granularity."""
    return fill_quotas_by(bins, quotas, rows=_rows, cut=lambda piece, n: cut_piece(piece, n, files, True))


def _rows(piece: Piece) -> int:
    n = piece.num_rows
    if n is None:
        raise ResumeStateError(
            "equal_batches needs exact row counts to re-plan the rest of an epoch, but a piece of "
            f"{piece.chunks[0].path!r} has an unknown row count; pass equal_batches='off'"
        )
    return n


def _group(
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


def _padded(piece: Piece) -> Piece:
    return replace(piece, chunks=tuple(replace(c, padding=True) for c in piece.chunks))


def _weight(piece: Piece) -> int:
    return piece.weight


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


def _deal_workers(
    share: Sequence[Piece],
    files: Mapping[str, FileInfo],
    *,
    workers: int,
    equal: bool,
    batch_size: int,
    window_rows: int | None,
    mixing: RowMixing | None,
    key: tuple[int, ...],
) -> Workers:
    """LPT over ``workers``, worker quotas with equal batches, then windows or mixes."""
    bins = assign(share, workers, _weight)
    if equal:
        rows = sum(_rows(p) for p in share)
        bins, rest = _fill(bins, worker_quotas(rows, workers, batch_size), files)
        assert not rest, "worker quotas add up to the rank's rows"
    return tuple(tuple(_group(b, window_rows, mixing, (*key, w), files)) for w, b in enumerate(bins))


def replan(
    pool: Sequence[Piece],
    files: Mapping[str, FileInfo],
    *,
    num_ranks: int,
    num_workers: Callable[[int], int],
    equal_batches: EqualBatches,
    batch_size: int,
    window_rows: int | None = None,
    key: tuple[int, ...] = (),
    mixing: RowMixing | None = None,
) -> ResumeResult:
    """Deal remaining pieces whole, ``[rank::num_ranks]`` (row counts not exact).

    With ``equal_batches`` on (and more than one rank) every rank then gets exactly
    :func:`~.ranks.rank_quota` rows, surplus rows moving to short ranks at row
    granularity, and every worker a multiple of ``batch_size``. Whole chunks are
    regrouped into windows when ``window_rows`` is set, else into mixes when ``mixing``
    is (keys ``(*key, rank, worker, j)``).

    Args:
        pool: The remaining pieces, in a canonical order (rank, worker, piece).
        files: The files of the pieces, by path.
        num_ranks: Ranks of the new world.
        num_workers: Workers of a rank (ranks may differ), at least 1.
        equal_batches: The equal-batches policy.
        batch_size: Rows per batch.
        window_rows: Row-shuffle window, or ``None``.
        key: Prefix of the windows' permutation keys.
        mixing: Row mixing (when ``window_rows`` is ``None``), or ``None``.
    """
    shares = [list(pool[r::num_ranks]) for r in range(num_ranks)]
    equal = equal_batches.acts_on(num_ranks)
    dropped: list[Piece] = []
    if equal:
        pad = equal_batches is EqualBatches.PAD
        total = sum(_rows(p) for p in pool)
        quota = rank_quota(total, num_ranks, pad)
        shares, dropped = _fill(shares, [quota] * num_ranks, files)
        if pad:
            stream = [p for p in pool if _rows(p)]
            for share in shares:
                short = quota - sum(_rows(p) for p in share)
                for piece in stream:
                    if short <= 0:
                        break
                    n = _rows(piece)
                    take = piece if n <= short else cut_piece(piece, short, files, True)[0]
                    share.append(_padded(take))
                    short -= min(n, short)
    per_rank = tuple(
        _deal_workers(
            share,
            files,
            workers=max(1, num_workers(rank)),
            equal=equal,
            batch_size=batch_size,
            window_rows=window_rows,
            mixing=mixing,
            key=(*key, rank),
        )
        for rank, share in enumerate(shares)
    )
    return ResumeResult(per_rank, tuple(dropped))


def _ranks_of(segment: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {int(r): entry for r, entry in segment["ranks"].items()}


def _slice(pieces: Sequence[Piece], lo: int, hi: int, files: Mapping[str, FileInfo]) -> list[Piece]:
    """Rows ``[lo, hi)`` of a list of pieces (exact row counts), cutting at row granularity."""
    out: list[Piece] = []
    position = 0
    for piece in pieces:
        n = _rows(piece)
        a, b = max(lo, position), min(hi, position + n)
        if a < b:
            part = piece
            if b - position < n:
                part = cut_piece(part, b - position, files, True)[0]
            if a > position:
                part = cut_piece(part, a - position, files, True)[1]
            out.append(part)
        position += n
        if position >= hi:
            break
    return out


class Resumer:
    """The rest of one epoch after a state's segments, planned one rank at a time.

    Args:
        planner: Plans of the dataset (its world is replaced by each segment's).
        epoch: The epoch.
        segments: Merged segments of a state (``{"num_ranks", "ranks": {rank:
            {"num_workers", "cursors", "done", "left"?}}}``).
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
        segments: Sequence[Mapping[str, Any]],
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
        self._entries = [_ranks_of(s) for s in segments]
        self.worlds: list[tuple[int, Callable[[int], int]]] = [
            (int(s["num_ranks"]), _workers_of(s)) for s in segments
        ] + [(num_ranks, num_workers)]
        self._planner = planner.for_world(self.worlds[0][0])
        self._seed = self.spec.seed if self.spec.shuffle else 0
        workers0 = max(1, self.worlds[0][1](0))
        self.ranged = exact and self._planner.rows_known(epoch, workers0)
        self._pieces: dict[tuple[int, int], Workers] = {}
        self._left: dict[int, np.ndarray[Any, Any]] = {}
        self._legacy: dict[int, ResumeResult] = {}
        self._rests: dict[tuple[int, int], list[list[Piece]]] = {}
        self._slots: dict[int, np.ndarray[Any, Any]] = {}

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
                given = entry.get("left")
                if entry.get("done"):
                    if level:
                        self.pieces(level, prev)
                elif given is not None and not any(given):
                    self._rest(level, prev)

    def pieces(self, level: int, rank: int) -> Workers:
        """Pieces of ``rank`` in pass ``level`` (0: the epoch's plan), per worker."""
        key = (level, rank)
        found = self._pieces.get(key)
        if found is None:
            num_ranks, workers_of = self.worlds[level]
            if not 0 <= rank < num_ranks:
                raise ValueError(f"rank must be in [0, {num_ranks}), got {rank}")
            workers = max(1, workers_of(rank))
            if level == 0:
                found = self._first(rank, workers)
            elif self.ranged:
                found = self._ranged(level, rank, workers)
            else:
                found = self._whole(level).assignments[rank]
            self._pieces[key] = found
        return found

    def _first(self, rank: int, workers: int) -> Workers:
        plan = self._planner.rank_plan(self.epoch, rank, workers)
        return tuple(
            tuple(
                _group(
                    as_pieces(plan.chunks_for(w)),
                    self.window_rows,
                    self.mixing,
                    (self._seed, self.epoch, 0, rank, w),
                    self.files,
                )
            )
            for w in range(workers)
        )

    # -- remaining rows of a pass -----------------------------------------------------
    def _remaining(self, level: int, rank: int) -> list[list[Piece]]:
        """What pass ``level`` left of ``rank``'s pieces, per worker (by the segment's cursors)."""
        entry = self._entry(level, rank)
        workers = self.pieces(level, rank)
        if entry.get("done"):
            return [[] for _ in workers]
        cursors = entry["cursors"]
        if len(cursors) != len(workers):
            raise ResumeStateError(
                f"rank {rank} has {len(cursors)} worker cursors but planned {len(workers)} workers; "
                "the state is inconsistent"
            )
        return [
            remaining(pieces, (int(c[0]), int(c[1])), self.files, self.exact)
            for pieces, c in zip(workers, cursors, strict=True)
        ]

    def _entry(self, level: int, rank: int) -> Mapping[str, Any]:
        try:
            return self._entries[level][rank]
        except KeyError:
            raise ResumeStateError(
                f"the resume state has no entry of rank {rank} in segment {level}"
            ) from None

    def left(self, level: int) -> np.ndarray[Any, Any]:
        """Rows pass ``level`` left per (rank, worker), rank after rank, as one array.

        From the state's ``left`` field where it has one (nothing is planned), else
        counted from the rank's pieces and cursors.
        """
        found = self._left.get(level)
        if found is not None:
            return found
        num_ranks = self.worlds[level][0]
        counts: list[int] = []
        for rank in range(num_ranks):
            entry = self._entry(level, rank)
            workers = max(1, int(entry["num_workers"]))
            if entry.get("done"):
                counts += [0] * workers
            elif entry.get("left") is not None:
                given = [int(n) for n in entry["left"]]
                if len(given) != workers:
                    raise ResumeStateError(
                        f"rank {rank} of segment {level} has {len(given)} counts of rows left but "
                        f"{workers} workers; the state is inconsistent"
                    )
                counts += given
            else:
                counts += [sum(_rows(p) for p in rest) for rest in self._remaining(level, rank)]
        found = np.asarray(counts, dtype=np.int64)
        self._left[level] = found
        return found

    def _first_slot(self, level: int) -> np.ndarray[Any, Any]:
        """Index in :meth:`left` of each rank's first worker (and the total, last)."""
        found = self._slots.get(level)
        if found is not None:
            return found
        num_ranks = self.worlds[level][0]
        sizes = [max(1, int(self._entry(level, r)["num_workers"])) for r in range(num_ranks)]
        out = np.zeros(num_ranks + 1, dtype=np.int64)
        np.cumsum(sizes, out=out[1:])
        self._slots[level] = out
        return out

    def _pool(self, level: int, lo: int, hi: int) -> list[Piece]:
        """Rows ``[lo, hi)`` of what pass ``level`` left (worker after worker, rank after rank)."""
        left = self.left(level)
        slots = self._first_slot(level)
        starts = np.zeros(len(left) + 1, dtype=np.int64)
        np.cumsum(left, out=starts[1:])
        out: list[Piece] = []
        first = max(0, int(np.searchsorted(starts, lo, side="right")) - 1)
        for k in range(first, len(left)):
            a, b = int(starts[k]), int(starts[k + 1])
            if a >= hi:
                break
            if b <= lo:
                continue
            rank = int(np.searchsorted(slots, k, side="right")) - 1
            rest = self._rest(level, rank)
            out += _slice(rest[k - int(slots[rank])], max(lo, a) - a, min(hi, b) - a, self.files)
        return out

    def _rest(self, level: int, rank: int) -> list[list[Piece]]:
        """:meth:`_remaining`, once, checked against the rows left the state says."""
        key = (level, rank)
        rest = self._rests.get(key)
        if rest is None:
            rest = self._remaining(level, rank)
            first = int(self._first_slot(level)[rank])
            left = self.left(level)
            for w, pieces in enumerate(rest):
                have = sum(_rows(p) for p in pieces)
                said = int(left[first + w])
                if have != said:
                    raise ResumeStateError(
                        f"the resume state says rank {rank} worker {w} had {said} rows left in "
                        f"segment {level}, but its cursor leaves {have}; the state was edited or saved "
                        "by another version: pass what loader.state_dict() returned, unchanged"
                    )
            self._rests[key] = rest
        return rest

    def _ranged(self, level: int, rank: int, workers: int) -> Workers:
        prev = level - 1
        num_ranks = self.worlds[level][0]
        total = int(self.left(prev).sum())
        spec = self.spec
        equal = spec.equal_batches.acts_on(num_ranks)
        pad = equal and spec.equal_batches is EqualBatches.PAD
        span = (total, total)
        pad_rows = pad_offset = 0
        if equal and pad:
            pad_rows = -total % num_ranks
            quota = (total + pad_rows) // num_ranks
            if spec.shuffle and total and pad_rows:
                pad_offset = random_offset(total, spec.seed, self.epoch, _PAD_SALT, level)
        elif equal:
            k = total % num_ranks
            quota = (total - k) // num_ranks
            offset = total - k
            if spec.shuffle and k:
                offset = random_offset(total - k + 1, spec.seed, self.epoch, _DROP_SALT, level)
            span = (offset, offset + k)
        else:
            quota = -(-total // num_ranks)
        lo, hi = rank * quota, (rank + 1) * quota
        share: list[Piece] = []
        width = span[1] - span[0]
        if width:  # the rows left out: no rank reads them, so check the counts they cross here
            self._pool(prev, *span)
        for a, b in ((lo, min(hi, span[0])), (max(lo, span[0]) + width, hi + width)):
            a, b = max(a, 0), min(b, total)
            if a < b:
                share += self._pool(prev, a, b)
        if pad_rows:
            a, b = max(lo, total) - total, min(hi, total + pad_rows) - total
            while a < b and total:
                s = (pad_offset + a) % total
                n = min(b - a, total - s)
                share += [_padded(p) for p in self._pool(prev, s, s + n)]
                a += n
        return _deal_workers(
            share,
            self.files,
            workers=workers,
            equal=equal,
            batch_size=spec.batch_size,
            window_rows=self.window_rows,
            mixing=self.mixing,
            key=(self._seed, self.epoch, level, rank),
        )

    def dropped(self) -> tuple[Piece, ...]:
        """Pieces the pass being planned leaves out (``equal_batches='drop'``)."""
        level = self.levels
        spec = self.spec
        num_ranks = self.worlds[level][0]
        if level == 0:
            if not spec.equal_batches.acts_on(num_ranks):
                return ()
            return tuple(as_pieces(self._planner.dropped(self.epoch, max(1, self.worlds[0][1](0)))))
        if not self.ranged:
            return self._whole(level).dropped
        if spec.equal_batches is not EqualBatches.DROP or not spec.equal_batches.acts_on(num_ranks):
            return ()
        total = int(self.left(level - 1).sum())
        k = total % num_ranks
        if not k:
            return ()
        offset = total - k
        if spec.shuffle:
            offset = random_offset(total - k + 1, spec.seed, self.epoch, _DROP_SALT, level)
        return tuple(self._pool(level - 1, offset, offset + k))

    def _whole(self, level: int) -> ResumeResult:
        """Pass ``level`` dealt from whole pieces of every previous rank (row counts not exact)."""
        found = self._legacy.get(level)
        if found is None:
            prev = level - 1
            pool = [
                p
                for rank in range(self.worlds[prev][0])
                for rest in self._remaining(prev, rank)
                for p in rest
            ]
            num_ranks, workers_of = self.worlds[level]
            found = replan(
                pool,
                self.files,
                num_ranks=num_ranks,
                num_workers=workers_of,
                equal_batches=self.spec.equal_batches,
                batch_size=self.spec.batch_size,
                window_rows=self.window_rows,
                mixing=self.mixing,
                key=(self._seed, self.epoch, level),
            )
            self._legacy[level] = found
        return found


def segment_pieces(
    spec: PlanSpec | Planner,
    epoch: int,
    segments: Sequence[Mapping[str, Any]],
    *,
    num_ranks: int,
    num_workers: Callable[[int], int],
    window_rows: int | None,
    exact: bool,
    mixing: RowMixing | None = None,
) -> ResumeResult:
    """Pieces of every (rank, worker) after the interrupted ``segments`` of ``epoch``.

    Segment 0 is the epoch's full plan in the world it was saved under (each rank with
    its own ``num_workers``); each later segment is the replan of what the one before
    left. The result is the replan of what the last segment left, over ``num_ranks``
    ranks. With no segments it is the full plan of the epoch. A job's processes plan
    their own rank with :class:`Resumer` instead.

    Args:
        spec: The plan's options (its ``num_ranks`` / ``num_workers`` are replaced), or
            a planner of them.
        epoch: The epoch.
        segments: Merged segments of a state (``{"num_ranks", "ranks": {rank:
            {"num_workers", "cursors", "done"}}}``).
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


def _workers_of(segment: Mapping[str, Any]) -> Callable[[int], int]:
    entries = _ranks_of(segment)

    def workers(rank: int) -> int:
        try:
            return int(entries[rank]["num_workers"])
        except KeyError:
            raise ResumeStateError(f"the resume state has no entry of rank {rank}") from None

    return workers
