"""An epoch interrupted on one Iceberg snapshot, continued onto a newer one (``continue_from``).

A resume state is tied to the snapshot it was saved on. With ``continue_from=state``,
an :class:`~torch_dataloader_utils.IcebergDataset` of a newer snapshot reads, in one
epoch (the state's):

1. the rows the interrupted epoch had left: its plan on the state's snapshot (the same
   options, re-planned as a resume would) cut at the state's cursors, as file rows
   (:func:`~torch_dataloader_utils.plan.emitted.emitted_rows`; equal-batches padding,
   which repeats rows, left out), less the rows deleted since: those a newer delete
   removed from a file still live, and those of a file removed since (a rewrite) that
   no file added since holds again (rows moved by a compaction are read from the file
   they were planned in, which a rewrite leaves in place until the snapshot expires);
2. the rows added since the state's snapshot, as an incremental scan from it finds them
   (:mod:`~torch_dataloader_utils.discovery.iceberg_delta`).

Both become one file table (each file's unread rows as its live rows), planned as a
fresh pass of the state's epoch over the dataset's own ranks and workers: every row once,
equal batches, and a state saved during it resumes on the same continued dataset.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from torch_dataloader_utils.config import IcebergSourceConfig
from torch_dataloader_utils.discovery.iceberg import ScanRequest, resolve_snapshot
from torch_dataloader_utils.discovery.iceberg_delta import discover_incremental, live_deletes
from torch_dataloader_utils.errors import IncompatibleOptionsError, ResumeStateError, StateMismatchError
from torch_dataloader_utils.plan.emitted import emitted_rows
from torch_dataloader_utils.plan.resume import Resumer
from torch_dataloader_utils.plan.state import plain_state
from torch_dataloader_utils.plan.types import Chunk
from torch_dataloader_utils.runtime.options import Options
from torch_dataloader_utils.storage.iceberg_meta import IcebergFileInfo, IcebergScan

Build = Callable[[IcebergSourceConfig, Options], Any]
"""Builds the dataset of a source (``IcebergDataset.from_config``)."""

__all__ = ["Continued", "continue_scan", "state_snapshot"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Continued:
    """What an epoch continued onto a newer snapshot reads (``IcebergDataset.continued``).

    Attributes:
        epoch: The epoch continued (the state's).
        from_snapshot_id: The snapshot the state was saved on.
        from_since_snapshot_id: That epoch's ``since_snapshot_id`` (an incremental epoch), or ``None``.
        snapshot_id: The snapshot it is continued onto.
        rows_left: Rows the interrupted epoch had left to read (padding aside).
        rows_deleted: Of those, rows deleted since: not read.
        rows_new: Rows added since the state's snapshot, read too.
        state_sha256: A digest of the state, which a state saved during this pass is tied to.
    """

    epoch: int
    from_snapshot_id: int
    from_since_snapshot_id: int | None
    snapshot_id: int
    rows_left: int
    rows_deleted: int
    rows_new: int
    state_sha256: str

    def identity(self) -> dict[str, Any]:
        """The JSON values a state saved during the continued pass is tied to."""
        return {
            "epoch": self.epoch,
            "snapshot_id": self.from_snapshot_id,
            "since_snapshot_id": self.from_since_snapshot_id,
            "state_sha256": self.state_sha256,
        }


def state_snapshot(state: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """``(table, snapshot_id, since_snapshot_id)`` a plain resume state was saved for (``None`` if unsaid)."""
    fingerprint = state.get("fingerprint")
    options = fingerprint.get("options") if isinstance(fingerprint, Mapping) else None
    if not isinstance(options, Mapping):
        return None, None, None
    return options.get("table"), options.get("snapshot_id"), options.get("since_snapshot_id")


def continue_scan(
    build: Build, tbl: Any, source: IcebergSourceConfig, options: Options
) -> tuple[IcebergScan, Continued]:
    """The scan of the rest of ``source.continue_from``'s epoch on the snapshot read, and what it holds.

    ``build`` makes the dataset the state was saved on (its snapshot, the same options).

    Raises:
        ResumeStateError: ``continue_from`` is not a resume state of an Iceberg dataset,
            or was saved while continuing an epoch already.
        StateMismatchError: it was saved for another table or other options, or for a
            snapshot that is not an ancestor of the one read.
        IncompatibleOptionsError: the row counts are not exact (an uncounted filter),
            ``since_snapshot_id`` is given too, or the order is elastic (``canonical_ranks``).
    """
    if source.since_snapshot_id is not None:
        raise IncompatibleOptionsError(
            f"continue_from and since_snapshot_id={source.since_snapshot_id} both say which rows to read: "
            "continue_from reads the rest of the state's epoch and the rows added since the state's "
            "snapshot; pass one of them"
        )
    if options.canonical is not None:
        raise IncompatibleOptionsError(
            f"continue_from does not continue epochs in elastic order (canonical_ranks={options.canonical}); "
            "finish the epoch on the state's snapshot (load_state_dict), then go on with the newer one"
        )
    state, old = _old_dataset(build, source, options)
    if old.scan.filters is not None and not old.scan.filter_counted:
        raise IncompatibleOptionsError(
            f"continue_from needs exact row counts to know which rows the epoch had left, but "
            f"filters={old.scan.filters} is not counted (count_rows=False); pass count_rows=True"
        )
    epoch = old.epoch
    rest = _rest(old, epoch)
    snap = resolve_snapshot(tbl, source.snapshot_id, source.as_of)
    new_source = replace(source, since_snapshot_id=old.snapshot_id, continue_from=None)
    new = discover_incremental(tbl, new_source, count_filtered=options.counts_rows)
    request = ScanRequest.build(tbl, snap, new_source)
    live = live_deletes(tbl, snap, request, sorted(rest))
    moved = new.delta.moved if new.delta is not None else {}
    kept: list[IcebergFileInfo] = []
    left = deleted = 0
    for info in old.scan.files:  # one file at a time: a row mask of one file held at once
        parts = rest.get(info.path)
        if not parts:
            continue
        mask = _left_mask(info, parts)
        before = int(mask.sum())
        if info.path in live:
            mask[live[info.path]] = False
        else:  # removed since: its rows moved into a file added since, or deleted
            moved_here = np.zeros(len(mask), dtype=bool)
            moved_here[moved.get(info.path, np.empty(0, np.int64))] = True
            mask &= moved_here
        after = int(mask.sum())
        left += before
        deleted += before - after
        if after:
            kept.append(_only(info, mask))
    new_rows = sum(f.live_rows or 0 for f in new.files)
    continued = Continued(
        epoch=epoch,
        from_snapshot_id=int(old.snapshot_id or 0),
        from_since_snapshot_id=old.since_snapshot_id,
        snapshot_id=int(new.snapshot_id or 0),
        rows_left=left,
        rows_deleted=deleted,
        rows_new=new_rows,
        state_sha256=hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest(),
    )
    log.info(
        "continuing epoch %d of snapshot %s onto snapshot %s: %d rows were left, %d of them deleted "
        "since (not read); %d rows added since",
        epoch,
        continued.from_snapshot_id,
        continued.snapshot_id,
        left,
        deleted,
        new_rows,
    )
    scan = replace(
        new,
        files=(*kept, *new.files),
        formats={**old.scan.formats, **new.formats},
        constants={**old.scan.constants, **new.constants},
    )
    return scan, continued


def _old_dataset(
    build: Build, source: IcebergSourceConfig, options: Options
) -> tuple[Mapping[str, Any], Any]:
    """The dataset the state was saved on (same options, its snapshot), with the state loaded."""
    given = source.continue_from
    if not isinstance(given, Mapping):
        raise ResumeStateError(
            f"continue_from={given!r} must be a resume state (what loader.state_dict() returned, "
            "merged over the ranks)"
        )
    state = plain_state(given)
    table, snapshot_id, since = state_snapshot(state)
    fingerprint = state.get("fingerprint")
    saved = fingerprint.get("options") if isinstance(fingerprint, Mapping) else None
    if isinstance(saved, Mapping) and "continued_from" in saved:
        raise ResumeStateError(
            "continue_from holds a state saved while continuing an epoch onto a newer snapshot "
            "already; finish that pass first (build the same continued dataset and load the state "
            "with load_state_dict), then start the next epoch on the newer snapshot"
        )
    if not isinstance(snapshot_id, int) or isinstance(snapshot_id, bool):
        raise ResumeStateError(
            "continue_from must be a resume state of an IcebergDataset (its fingerprint names the "
            f"snapshot it was saved on); got one without a snapshot id ({snapshot_id!r})"
        )
    if table != source.table:
        raise StateMismatchError(
            f"continue_from was saved for table {table!r}, not {source.table!r}; continue it on its own table"
        )
    old_source = replace(
        source, snapshot_id=snapshot_id, as_of=None, since_snapshot_id=since, continue_from=None
    )
    with warnings.catch_warnings():  # the old plan's layout warnings were given when it was read
        warnings.simplefilter("ignore")
        old = build(old_source, options)
    try:
        old.load_state_dict(state)
    except StateMismatchError as exc:
        raise StateMismatchError(f"continue_from: {exc}") from exc
    return state, old


Part = Chunk | np.ndarray[Any, Any] | None
"""What an interrupted epoch left of a file: a whole chunk, some file rows, or (``None``) every live row."""


def _rest(old: Any, epoch: int) -> dict[str, list[Part]]:
    """What the interrupted epoch had left of each file (padding left out).

    Unread chunks stay chunks (no row positions are built for them); only the pieces a
    cursor cut give file rows (:func:`~torch_dataloader_utils.plan.emitted.emitted_rows`).
    """
    segments = old._planned.passes.live_segments(epoch) or ()
    if not segments:  # nothing read yet: every live row
        return {info.path: [None] for info in old.scan.files}
    files = old.planner.files
    out: dict[str, list[Part]] = {}
    resumer = Resumer(
        old.planner,
        epoch,
        segments,
        num_ranks=1,
        num_workers=lambda rank: 1,
        window_rows=old.row_shuffle_window,
        exact=True,
        mixing=old.row_mixing,
    )
    for pieces in resumer.rank(0):
        for piece in pieces:
            whole = piece.lo == 0 and (piece.hi is None or piece.hi >= (piece.total_rows or 0))
            rows = [None] * len(piece.chunks) if whole else emitted_rows(piece, files)
            for chunk, found in zip(piece.chunks, rows, strict=True):
                if not chunk.padding:
                    out.setdefault(chunk.path, []).append(chunk if found is None else found)
    return out


def _left_mask(info: IcebergFileInfo, parts: list[Part]) -> np.ndarray[Any, Any]:
    """Which rows of a data file the epoch had left: its parts, among the file's live rows."""
    n = int(info.num_rows or 0)
    mask = np.zeros(n, dtype=bool)
    for part in parts:
        if part is None:
            mask[:] = True
        elif isinstance(part, Chunk):
            mask[part.start : part.stop] = True
        else:
            mask[part] = True
    live = np.zeros(n, dtype=bool)
    for g in info.row_groups if info.row_groups is not None else ():
        live[g.first_row : g.stop_row] = True
    if info.row_groups is None:
        live[:] = True
    if info.deleted is not None and len(info.deleted):
        live[info.deleted] = False
    return mask & live


def _only(info: IcebergFileInfo, mask: np.ndarray[Any, Any]) -> IcebergFileInfo:
    """``info`` whose live rows are those of ``mask``: row groups with none left out, the rest deleted."""
    if info.row_groups is None:
        return replace(info, deleted=np.flatnonzero(~mask).astype(np.int64))
    used = tuple(g for g in info.row_groups if mask[g.first_row : g.stop_row].any())
    within = np.zeros(len(mask), dtype=bool)
    for g in used:
        within[g.first_row : g.stop_row] = True
    return replace(info, row_groups=used, deleted=np.flatnonzero(within & ~mask).astype(np.int64))
