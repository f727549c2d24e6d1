"""Elastic order: the same global batches for every number of ranks that divides ``C``.

An epoch is planned for ``C`` *canonical ranks* (``canonical_ranks``): the one dealer
gives every canonical rank the same rows (equal batches), and canonical rank ``c`` reads
them as a rank of one worker would, in windows or mixes keyed by ``c``: its *stream*.
Physical rank ``p`` of ``R`` serves the ``C / R`` streams ``[p * C / R, (p + 1) * C /
R)`` and draws every batch evenly from them: its batch ``t`` is rows ``[t * s, (t + 1) *
s)`` of each of its streams, ``s = batch_size * R / C``. So global batch ``t`` is rows
``[t * s, (t + 1) * s)`` of every stream, for any ``R`` at the same global batch size.

Workers read whole streams (worker ``w`` of a rank reads its streams ``[w::num_workers]``,
contiguous row groups), each yielding its part of every batch; the main process joins
the parts. A resume continues every stream where it stopped: the cursor of the worker
that read it says how many of its rows were consumed, so streams move between ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch_dataloader_utils.errors import IncompatibleOptionsError, ResumeStateError
from torch_dataloader_utils.plan.pieces import Piece, remaining
from torch_dataloader_utils.plan.state import Segment
from torch_dataloader_utils.plan.types import FileInfo

__all__ = ["Canonical", "consumed", "skip_rows"]


@dataclass(frozen=True)
class Canonical:
    """How ``streams`` canonical streams are shared by ``num_ranks`` ranks of ``batch_size`` rows.

    Raises:
        IncompatibleOptionsError: ``num_ranks`` does not divide ``streams``, or the rank's
            streams cannot share ``batch_size`` evenly.
    """

    streams: int
    num_ranks: int
    batch_size: int = 0

    def __post_init__(self) -> None:
        c, r, b = self.streams, self.num_ranks, self.batch_size
        if c % r:
            raise IncompatibleOptionsError(
                f"canonical_ranks={c} cannot be shared by num_ranks={r}: every rank serves the same "
                f"number of canonical streams, so num_ranks must divide canonical_ranks (here one of "
                f"{[d for d in range(1, c + 1) if c % d == 0]}); pick canonical_ranks as a multiple "
                "of every world size the job may run at"
            )
        if b and b % (c // r):
            raise IncompatibleOptionsError(
                f"batch_size={b} on {r} ranks with canonical_ranks={c}: each rank draws every batch "
                f"evenly from its {c // r} canonical streams, so batch_size must be a multiple of "
                f"{c // r} (the global batch, batch_size * num_ranks, is the same for any num_ranks)"
            )

    @property
    def per_rank(self) -> int:
        """Streams of every rank."""
        return self.streams // self.num_ranks

    @property
    def per_stream(self) -> int:
        """Rows of every stream in every batch."""
        return self.batch_size // self.per_rank

    def of_rank(self, rank: int) -> range:
        """The streams of ``rank``."""
        return range(rank * self.per_rank, (rank + 1) * self.per_rank)

    def of_worker(self, rank: int, worker: int, workers: int) -> range:
        """The streams one worker of ``rank`` reads (none when the rank has fewer streams than workers)."""
        return self.of_rank(rank)[worker :: max(1, workers)]

    def readers(self, workers: int) -> int:
        """Workers of a rank that read a stream."""
        return min(max(1, workers), self.per_rank)


def consumed(segments: Sequence[Segment], streams: int, rows: int) -> int:
    """Rows every canonical stream had consumed after ``segments`` (the same for every stream).

    Args:
        segments: The state's interrupted passes.
        streams: Canonical streams.
        rows: Rows of every stream in the epoch.

    Raises:
        ResumeStateError: a cursor is not at a batch edge of its worker's streams, or the
            streams were consumed unevenly (states of ranks saved at different steps).
    """
    done = 0
    for level, segment in enumerate(segments):
        if streams % segment.num_ranks:
            raise ResumeStateError(
                f"resume state segment {level} has {segment.num_ranks} ranks, which cannot share "
                f"{streams} canonical streams; pass what loader.state_dict() returned, unchanged"
            )
        layout = Canonical(streams, segment.num_ranks)
        counts: dict[int, int] = {}
        for rank, entry in segment.ranks.items():
            for worker, (piece, offset) in enumerate(entry.cursors):
                mine = layout.of_worker(rank, worker, entry.num_workers)
                n = len(mine)
                if n and not entry.done and piece == 0 and offset % n:
                    raise ResumeStateError(
                        f"resume state segment {level} rank {rank} worker {worker} consumed {offset} rows "
                        f"of {n} canonical streams: not a whole number of rows per stream; pass what "
                        "loader.state_dict() returned, unchanged"
                    )
                left = rows - done
                for c in mine:
                    counts[c] = left if entry.done or piece else min(offset // n, left)
        seen = sorted(set(counts.values()))
        if len(seen) > 1:
            raise ResumeStateError(
                f"the canonical streams of resume state segment {level} were consumed unevenly "
                f"({seen[0]} to {seen[-1]} rows): elastic order resumes every rank at the same "
                "batch; merge the states every rank saved at the same step"
            )
        done += seen[0] if seen else 0
    return done


def skip_rows(pieces: Sequence[Piece], rows: int, files: Mapping[str, FileInfo]) -> list[Piece]:
    """``pieces`` after their first ``rows`` rows (row counts exact)."""
    for index, piece in enumerate(pieces):
        n = piece.num_rows or 0
        if rows < n:
            return remaining(pieces, (index, rows), files, True)
        rows -= n
    return []
