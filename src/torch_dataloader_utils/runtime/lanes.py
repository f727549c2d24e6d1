"""A source read in equal *lanes*: every reading process of every rank a share of its own.

A mix (:mod:`.recipes`) builds each batch from several sources at once, and every
reading process must build the same batches from its own rows. So each source is
planned for ``num_lanes = num_ranks x readers per rank`` lanes, as if every reading
process were a rank with one worker: with equal batches every lane holds exactly the
same rows of each epoch (``'drop'`` leaves out fewer than ``num_lanes`` rows, ``'pad'``
repeats as many), and the rest of an interrupted epoch is re-dealt equally over any
other number of lanes by the source's own resume planning.

An *entry* of a lane's rows is one epoch of the source, whole (no segments) or the
rest of an interrupted one (the segments of the source's own resume state, which say
what every lane consumed). This module is the one place a mix meets the planner's
pieces and cursors (:mod:`~torch_dataloader_utils.plan.resume`,
:mod:`~torch_dataloader_utils.plan.pieces`); everything else speaks of rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from torch_dataloader_utils.io.pieces import MIX_WORKER_READ_ROWS, piece_reads
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.mixposition import Segments
from torch_dataloader_utils.plan.pieces import Piece, remaining
from torch_dataloader_utils.plan.resume import Resumer
from torch_dataloader_utils.plan.state import ResumeState, Segment
from torch_dataloader_utils.runtime.emit import Positions
from torch_dataloader_utils.runtime.orders.source import SourcePlan
from torch_dataloader_utils.runtime.state import EpochProgress

__all__ = ["LaneSource"]


class LaneSource:
    """One source of a mix, planned for ``num_lanes`` lanes.

    Args:
        source: The source (discovered once; its planner's chunk table is shared).
        num_lanes: Lanes of the world: ranks x reading processes per rank.
    """

    def __init__(self, source: SourcePlan, num_lanes: int) -> None:
        self.source = source
        self.num_lanes = num_lanes
        self._planner = source.planner.for_world(num_lanes)
        self._resumers: BoundedDict[tuple[int, Segments], Resumer] = BoundedDict(8)
        self._rows: BoundedDict[tuple[int, Segments], int] = BoundedDict(64)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_resumers"], state["_rows"] = BoundedDict(8), BoundedDict(64)
        return state

    def _resumer(self, epoch: int, segments: Segments) -> Resumer:
        key = (epoch, segments)
        found = self._resumers.get(key)
        if found is None:
            shuffle = self.source.options.shuffle
            found = Resumer(
                self._planner,
                epoch,
                segments,
                num_ranks=self.num_lanes,
                num_workers=lambda rank: 1,
                window_rows=shuffle.row_window,
                exact=True,
                mixing=shuffle.mixing,
            )
            self._resumers[key] = found
        return found

    def pieces(self, epoch: int, segments: Segments, lane: int) -> tuple[Piece, ...]:
        """What ``lane`` reads of the entry ``(epoch, segments)``, in order."""
        return self._resumer(epoch, segments).rank(lane)[0]

    def rows(self, epoch: int, segments: Segments) -> int:
        """Rows of the entry ``(epoch, segments)`` on every lane (lanes are equal)."""
        key = (epoch, segments)
        found = self._rows.get(key)
        if found is None:
            found = sum(p.num_rows or 0 for p in self.pieces(epoch, segments, 0))
            self._rows[key] = found
        return found

    @staticmethod
    def cursor(pieces: Sequence[Piece], rows: int) -> tuple[int, int]:
        """The cursor ``(piece, offset)`` after the first ``rows`` rows of ``pieces``."""
        for index, piece in enumerate(pieces):
            n = piece.num_rows or 0
            if rows < n:
                return index, rows
            rows -= n
        return len(pieces), 0

    def segment(self, epoch: int, segments: Segments, consumed: Sequence[int]) -> Segment:
        """The resume-state segment saying lane ``v`` consumed ``consumed[v]`` rows of the entry."""
        ranks = {}
        for lane, rows in enumerate(consumed):
            pieces = self.pieces(epoch, segments, lane)
            total = sum(p.num_rows or 0 for p in pieces)
            progress = EpochProgress(1, cursors={0: self.cursor(pieces, rows)}, done=rows >= total)
            ranks[lane] = progress.entry([[p.num_rows or 0 for p in pieces]])
        return Segment(self.num_lanes, ranks, len(segments))

    def check(self, epoch: int, segments: Segments) -> Segments:
        """``segments`` checked as the source's own resume state of ``epoch`` (and planned once).

        Raises:
            ResumeStateError: not valid segments of a resume state.
            StateMismatchError: saved for other data or options than the source's.
        """
        expected = self.source.fingerprint()
        # Through the state's JSON: the checks between a state's fields run on parsing.
        state = ResumeState.parse(ResumeState(epoch, expected, segments).to_json())
        checked = state.check_against(expected).segments
        if checked:
            self.rows(epoch, checked)  # plans the rest: a cursor past its pieces fails here
        return checked

    def read(
        self,
        epoch: int,
        segments: Segments,
        lane: int,
        skip: int,
        *,
        batch_size: int,
        in_worker: bool,
        ahead: bool,
        flag: str | None,
    ) -> Iterator[pa.RecordBatch]:
        """The rows of ``lane``'s entry ``(epoch, segments)`` after its first ``skip`` rows.

        ``flag``: a boolean column marking padding and stand-ins of skipped units, or ``None``.
        """
        pieces: Sequence[Piece] = self.pieces(epoch, segments, lane)
        files = self.source.table
        if skip:
            pieces = remaining(pieces, self.cursor(pieces, skip), files, True)
        reader = self.source.reader
        # Remote storage: the next chunks are fetched ahead (a no-op for local files).
        reader.schedule([c for piece in pieces for c in piece_reads(piece, files)])
        positions = Positions(0, lane, self.num_lanes)
        mix_rows = MIX_WORKER_READ_ROWS if in_worker else None
        yield from positions.read(reader, pieces, flag, batch_size, files, mix_rows, ahead=ahead)
