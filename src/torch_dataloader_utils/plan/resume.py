"""Mid-epoch resumption, as pure planning: the rest of an epoch for any world.

A worker reads its :class:`~.pieces.Piece` list in order, and what the loop consumed is a
cursor ``(piece, offset)`` per worker (:mod:`.pieces`).

Resuming an epoch:

1. rebuild the pieces of the segment that was interrupted (the full plan of the
   epoch, or a previous resume plan: :func:`segment_pieces`);
2. cut every worker's list at its cursor (:func:`remaining`); a chunk read in file
   order is cut exactly at the row (no re-read) when row counts are exact, a window is
   continued at its offset in the same permutation (its buffer is re-read, never
   stored);
3. deal what remains over the new world (:func:`replan`): other ``num_ranks``, other
   ``num_workers``, equal rows per rank and batch multiples per worker when
   ``equal_batches`` is on (:func:`~.ranks.rank_quota`, :func:`~.ranks.worker_quotas`).

Nothing here reads the environment. Pieces and cursors are in :mod:`.pieces`; the state's
JSON format, fingerprint and checks in :mod:`.state`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

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
from torch_dataloader_utils.plan.planner import PlanSpec, plan_epoch
from torch_dataloader_utils.plan.ranks import fill_quotas_by, rank_quota, worker_quotas
from torch_dataloader_utils.plan.types import EqualBatches, FileInfo

__all__ = ["ResumeResult", "replan", "segment_pieces"]


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


@dataclass(frozen=True, slots=True)
class ResumeResult:
    """Pieces of every (rank, worker) for the rest of an epoch, and the rows left out.

    Attributes:
        assignments: ``assignments[rank][worker]``: that worker's pieces, in order.
        dropped: Pieces no rank reads (``equal_batches='drop'``; fewer than
            ``num_ranks`` rows).
    """

    assignments: tuple[tuple[tuple[Piece, ...], ...], ...]
    dropped: tuple[Piece, ...] = ()


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
    """Deal the remaining pieces of an epoch over a (new) world.

    Pieces are dealt ``[rank::num_ranks]``; with ``equal_batches`` on (and more than one
    rank) every rank then gets exactly :func:`~.ranks.rank_quota` rows, surplus rows
    moving to short ranks at row granularity, and every worker a multiple of
    ``batch_size`` (:func:`~.ranks.worker_quotas`), as in a full epoch. Whole chunks are
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
    per_rank = []
    for rank, share in enumerate(shares):
        workers = max(1, num_workers(rank))
        bins = assign(share, workers, _weight)
        if equal:
            rows = sum(_rows(p) for p in share)
            bins, rest = _fill(bins, worker_quotas(rows, workers, batch_size), files)
            assert not rest, "worker quotas add up to the rank's rows"
        per_rank.append(
            tuple(tuple(_group(b, window_rows, mixing, (*key, rank, w), files)) for w, b in enumerate(bins))
        )
    return ResumeResult(tuple(per_rank), tuple(dropped))


def _weight(piece: Piece) -> int:
    return piece.weight


def _ranks_of(segment: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {int(r): entry for r, entry in segment["ranks"].items()}


def segment_pieces(
    spec: PlanSpec,
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
    its own ``num_workers``); each later segment is the :func:`replan` of what the one
    before left. The result is the replan of what the last segment left, over
    ``num_ranks`` ranks. With no segments it is the full plan of the epoch.

    Args:
        spec: The plan's options (its ``num_ranks`` / ``num_workers`` are replaced).
        epoch: The epoch.
        segments: Merged segments of a state (``{"num_ranks", "ranks": {rank:
            {"num_workers", "cursors", "done"}}}``).
        num_ranks: Ranks of the world to plan for.
        num_workers: Workers of a rank in that world.
        window_rows: Row-shuffle window, or ``None``.
        exact: Row counts are exact (no row filter), so chunks can be cut at a row.
        mixing: Row mixing (when ``window_rows`` is ``None``), or ``None``.
    """
    files = {f.path: f for f in spec.files}
    seed = spec.seed if spec.shuffle else 0
    worlds = [(int(s["num_ranks"]), _workers_of(s)) for s in segments] + [(num_ranks, num_workers)]
    ranks0, workers0 = worlds[0]
    plans = {}
    for w in sorted({max(1, workers0(r)) for r in range(ranks0)}):
        plans[w] = plan_epoch(replace(spec, num_ranks=ranks0, num_workers=w), epoch)
    assignments: list[tuple[tuple[Piece, ...], ...]] = []
    for r in range(ranks0):
        plan = plans[max(1, workers0(r))]
        assignments.append(
            tuple(
                tuple(_group(as_pieces(chunks), window_rows, mixing, (seed, epoch, 0, r, w), files))
                for w, chunks in enumerate(plan.assignments[r])
            )
        )
    result = ResumeResult(tuple(assignments), tuple(as_pieces(plans[max(1, workers0(0))].dropped)))
    for index, segment in enumerate(segments, start=1):
        entries = _ranks_of(segment)
        pool: list[Piece] = []
        for r, workers in enumerate(result.assignments):
            entry = entries[r]
            if entry.get("done"):
                continue
            cursors = entry["cursors"]
            if len(cursors) != len(workers):
                raise ResumeStateError(
                    f"rank {r} has {len(cursors)} worker cursors but planned {len(workers)} workers; "
                    "the state is inconsistent"
                )
            for pieces, cursor in zip(workers, cursors, strict=True):
                pool.extend(remaining(pieces, (int(cursor[0]), int(cursor[1])), files, exact))
        ranks, workers_of = worlds[index]
        result = replan(
            pool,
            files,
            num_ranks=ranks,
            num_workers=workers_of,
            equal_batches=spec.equal_batches,
            batch_size=spec.batch_size,
            window_rows=window_rows,
            key=(seed, epoch, index),
            mixing=mixing,
        )
    return result


def _workers_of(segment: Mapping[str, Any]) -> Callable[[int], int]:
    entries = _ranks_of(segment)
    return lambda r: int(entries[r]["num_workers"])
