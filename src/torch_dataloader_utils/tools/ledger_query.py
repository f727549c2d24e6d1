"""The ledger's reverse questions: which steps saw a row, and which deleted rows were trained on.

Both map rows to steps without reading the training data in full:

* :func:`where` (``torch-dataloader-utils ledger DIR --where "id = 123"``): the chunks the
  passes read are pruned first by the plan (only chunks some pass read) and by
  statistics (the source built again with the condition as its row filter, so its
  discovery drops the Parquet row groups whose min/max exclude it and, for Iceberg, the
  data files whose manifest bounds do); only the chunks left are read, each once, and
  the condition is evaluated on their rows.
* :func:`deleted` (``--deleted SNAPSHOT``): the rows of the Iceberg table that a later
  snapshot no longer has (deleted by position or equality deletes, or in files removed
  by an overwrite or a copy-on-write delete, less the rows such a commit wrote again:
  :mod:`~torch_dataloader_utils.discovery.iceberg_delta`), found from the table's
  metadata; their positions map to the steps that read them with no data read.

A row is reported for every step that delivered it and counts: steps a later pass
superseded (a resume from an earlier checkpoint) are left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.errors import LedgerError
from torch_dataloader_utils.plan.emitted import chunk_rows
from torch_dataloader_utils.plan.lineage import positions_of
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit
from torch_dataloader_utils.tools.replay import LedgerPass, PassReplay, check_files

__all__ = ["Passes", "Sighting", "deleted", "sightings", "where"]

Offsets = np.ndarray[Any, np.dtype[np.int64]]
Passes = Iterable[tuple[LedgerPass, PassReplay]]
"""The passes a question covers, each with its replay (``Ledger.replays``)."""


@dataclasses.dataclass(frozen=True, order=True)
class Sighting:
    """One row delivered at one step.

    Attributes:
        step: The step.
        rank: The rank.
        position: The row's position in the batch.
        file: Its file.
        offset: Its position among the rows its chunk reads.
        file_row: Its row in the file (``-1`` where unknown: a text file's record).
        epoch: The epoch of the pass.
        padding: The row was a repeat (``equal_batches='pad'``).
    """

    step: int
    rank: int
    position: int
    file: str
    offset: int
    file_row: int
    epoch: int
    padding: bool


def _key(chunk: Chunk) -> tuple[Any, ...]:
    return (chunk.path, chunk.start, chunk.stop, chunk.unit.value, chunk.skip, chunk.num_rows)


def sightings(
    passes: Passes, offsets_of: Callable[[LedgerPass, PassReplay, Chunk], Offsets]
) -> list[Sighting]:
    """Every delivered step holding a row ``offsets_of`` finds (offsets in a chunk's read stream)."""
    out: list[Sighting] = []
    for ledger_pass, replay in passes:
        out.extend(_pass_sightings(ledger_pass, replay, offsets_of))
    return sorted(out)


def _pass_sightings(
    ledger_pass: LedgerPass,
    replay: PassReplay,
    offsets_of: Callable[[LedgerPass, PassReplay, Chunk], Offsets],
) -> list[Sighting]:
    out: list[Sighting] = []
    end = ledger_pass.last_step
    for stream_id, stream in enumerate(replay.streams):
        for piece_id, piece in enumerate(stream.pieces):
            for c, chunk in enumerate(piece.chunks):
                wanted = offsets_of(ledger_pass, replay, chunk)
                if not len(wanted):
                    continue
                emitted = positions_of(piece, c, wanted)
                inside = (emitted >= piece.lo) & (emitted < (piece.hi if piece.hi is not None else np.inf))
                for at, offset in zip(emitted[inside].tolist(), wanted[inside].tolist(), strict=True):
                    sighting = _sighting(replay, stream_id, piece_id, int(at), c, int(offset))
                    if sighting is not None and (end is None or sighting.step < end):
                        out.append(sighting)
    return out


def _sighting(
    replay: PassReplay, stream_id: int, piece_id: int, emitted: int, c: int, offset: int
) -> Sighting | None:
    """The step delivering emission position ``emitted`` of a piece, or ``None`` (removed, dropped)."""
    stream = replay.streams[stream_id]
    position = stream.position(piece_id, emitted)
    if position is None:
        return None
    index, within = divmod(position, stream.batch_size)
    if index >= stream.num_batches:
        return None  # the short last batch left out (drop_last)
    if replay.elastic is None:
        step = replay.record.step + replay.delivery.step_of(stream_id, index)
        at = within
    else:  # every stream gives its rows of batch ``index``, stream after stream
        step = replay.record.step + index
        at = within + sum(
            min(s.batch_size, max(0, s.rows - index * s.batch_size)) for s in replay.streams[:stream_id]
        )
    piece = stream.pieces[piece_id]
    chunk = piece.chunks[c]
    file_row = -1
    if chunk.unit is ChunkUnit.ROWS and replay.exact_rows:
        rows = chunk_rows(chunk, replay.table[chunk.path])
        file_row = int(rows[offset]) if offset < len(rows) else -1
    return Sighting(
        step,
        replay.record.rank,
        at,
        chunk.path,
        offset + chunk.skip,
        file_row,
        replay.record.epoch,
        chunk.padding,
    )


# -- where ---------------------------------------------------------------------------------------


def where(passes: Passes, condition: pc.Expression, *, prune: bool = True) -> list[Sighting]:
    """Every step of ``passes`` that delivered a row meeting ``condition``.

    ``prune=False`` reads every chunk the passes read (no statistics; to compare).

    Raises:
        LedgerError: the source cannot be built again (see :meth:`Ledger.read`).
    """
    return sightings(passes, _Matcher(condition, prune))


class _Matcher:
    """Rows of a chunk meeting a condition: candidates pruned by statistics, each chunk read once."""

    def __init__(self, condition: pc.Expression, prune: bool = True) -> None:
        self.condition = condition
        self.prune = prune
        self.found: dict[tuple[Any, ...], Offsets] = {}
        self.candidates: dict[str, Mapping[str, Any]] = {}
        self.chunks_read = 0

    def __call__(self, ledger_pass: LedgerPass, replay: PassReplay, chunk: Chunk) -> Offsets:
        key = (replay.record.config, *_key(chunk))
        hit = self.found.get(key)
        if hit is None:
            hit = self.found[key] = self._match(replay, chunk)
        return hit

    def _match(self, replay: PassReplay, chunk: Chunk) -> Offsets:
        if not self._may_match(replay, chunk):
            return np.empty(0, dtype=np.int64)
        self.chunks_read += 1
        dataset = replay.query_dataset
        check_files(replay.table, replay.record, dataset.file_table, [chunk.path])
        parts = [b for b in dataset.read_chunk(chunk) if b.num_rows]
        if not parts:
            return _none()
        return np.flatnonzero(_mask(pa.Table.from_batches(parts), self.condition)).astype(np.int64)

    def _may_match(self, replay: PassReplay, chunk: Chunk) -> bool:
        """Whether statistics leave the chunk a candidate (its file's row groups that may match)."""
        if not self.prune:
            return True
        pruned = self.candidates.get(replay.record.config)
        if pruned is None:
            pruned = self.candidates[replay.record.config] = replay.pruned_groups(self.condition)
        if chunk.path not in pruned:
            return False
        groups = pruned[chunk.path]
        if groups is None or chunk.unit is not ChunkUnit.ROWS:
            return True  # no statistics (text) or the whole file is a candidate
        return any(first < chunk.stop and first + rows > chunk.start for first, rows in groups)


def _none() -> Offsets:
    return np.empty(0, dtype=np.int64)


def _mask(table: pa.Table, condition: pc.Expression) -> np.ndarray[Any, Any]:
    """Whether each row of ``table`` meets ``condition`` (null: no)."""
    import pyarrow.dataset as pads

    scanned = pads.dataset(table.append_column("__row", pa.array(np.arange(table.num_rows))))
    rows = scanned.to_table(filter=condition, columns=["__row"]).column("__row").to_numpy()
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[rows] = True
    return mask


# -- deleted -------------------------------------------------------------------------------------


def deleted(passes: Passes, snapshot_id: int) -> list[Sighting]:
    """Every step of ``passes`` that trained on a row the Iceberg snapshot ``snapshot_id`` no longer has.

    For every pass that read an older snapshot of the table, the rows of that snapshot
    deleted by ``snapshot_id`` (position or equality deletes, files removed less the rows
    written again) are found from the table's metadata, then mapped to the steps that
    delivered them.

    Raises:
        LedgerError: the ledger's passes read no Iceberg table, or ``snapshot_id`` is not
            a later snapshot of theirs (an ancestor line).
    """
    from torch_dataloader_utils.tools.ledger_audit import audit_deleted

    cache: dict[tuple[str, Any], Mapping[str, Offsets]] = {}

    def offsets_of(ledger_pass: LedgerPass, replay: PassReplay, chunk: Chunk) -> Offsets:
        source = replay.source
        if source.get("type") != "iceberg":
            raise LedgerError(
                f"--deleted audits an Iceberg table, but rank {replay.record.rank}'s pass from step "
                f"{replay.record.step} read files ({source.get('path')!r})"
            )
        key = (replay.record.config, replay.record.files[0])
        gone = cache.get(key)
        if gone is None:
            gone = cache[key] = audit_deleted(replay, snapshot_id)
        positions = gone.get(chunk.path)
        if positions is None or not len(positions) or chunk.unit is not ChunkUnit.ROWS:
            return _none()
        rows = chunk_rows(chunk, replay.table[chunk.path])
        return np.flatnonzero(np.isin(rows, positions)).astype(np.int64)

    return sightings(passes, offsets_of)
