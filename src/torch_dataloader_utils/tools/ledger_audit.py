"""The Iceberg audit: the rows of the snapshot a pass read that a later snapshot no longer has.

For a pass that read snapshot ``S1`` and a later snapshot ``S2`` (``S1`` an ancestor):

* a data file still live at ``S2`` lost the positions deleted at ``S2`` and not at ``S1``
  (position and equality deletes, resolved as a scan resolves them:
  :func:`~torch_dataloader_utils.discovery.iceberg_delta.live_deletes`);
* a data file removed since ``S1`` (an overwrite, a compaction, a copy-on-write delete)
  lost its rows live at ``S1``, less those a commit since wrote again into a file it
  added (matched by content: the ``moved`` rows of
  :class:`~torch_dataloader_utils.storage.iceberg_meta.IcebergDelta`).

Only the table's metadata is read, and the content of files removed and added since
when files were removed (as an incremental scan does); none of the training data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from torch_dataloader_utils.config import IcebergSourceConfig
from torch_dataloader_utils.discovery.iceberg import ScanRequest, load_table
from torch_dataloader_utils.discovery.iceberg_delta import discover_incremental, live_deletes
from torch_dataloader_utils.errors import ConfigError, LedgerError
from torch_dataloader_utils.tools.replay import PassReplay

__all__ = ["audit_deleted"]

Positions = np.ndarray[Any, np.dtype[np.int64]]


def audit_deleted(replay: PassReplay, snapshot_id: int) -> Mapping[str, Positions]:
    """``{data file: positions}`` of the rows of the pass's snapshot that ``snapshot_id`` no longer has.

    Raises:
        LedgerError: ``snapshot_id`` is not a later snapshot of the pass's table.
    """
    source = replay.source
    since = source.get("snapshot_id")
    if since is None or since == snapshot_id:
        return {}
    given = replay.reading_keywords()
    table_name = source["table"]
    tbl = load_table(table_name, given.get("catalog_config"))
    snap = tbl.metadata.snapshot_by_id(snapshot_id)
    if snap is None:
        known = [s.snapshot_id for s in tbl.metadata.snapshots]
        raise LedgerError(
            f"--deleted {snapshot_id} is not a snapshot of {table_name!r}; its snapshots: {known}"
        )
    request_source = IcebergSourceConfig(
        table=table_name,
        catalog_config=given.get("catalog_config"),
        snapshot_id=snapshot_id,
        since_snapshot_id=since,
    )
    try:
        scan = discover_incremental(tbl, request_source)
    except ConfigError as exc:
        raise LedgerError(
            f"the rows snapshot {snapshot_id} deleted since snapshot {since} (which rank "
            f"{replay.record.rank}'s pass from step {replay.record.step} read) cannot be found: {exc}"
        ) from exc
    delta = scan.delta
    removed = set(delta.removed if delta is not None else ())
    moved = delta.moved if delta is not None else {}
    table = replay.table
    out: dict[str, Positions] = {}
    live = [table.path(i) for i in range(len(table)) if table.path(i) not in removed]
    request = ScanRequest.build(tbl, snap, request_source)
    now = live_deletes(tbl, snap, request, live)
    for i in range(len(table)):
        path = table.path(i)
        before = table.deleted_of(i)
        if path in removed:
            rows = int(table.rows[i])
            gone = np.setdiff1d(np.arange(rows, dtype=np.int64), before, assume_unique=True)
            gone = np.setdiff1d(gone, moved.get(path, np.empty(0, dtype=np.int64)), assume_unique=True)
        else:
            gone = np.setdiff1d(np.asarray(now.get(path, ()), dtype=np.int64), before, assume_unique=True)
        if len(gone):
            out[path] = gone
    return out
