"""Incremental Iceberg scans: the rows a snapshot has that an older one did not.

``since_snapshot_id=S1`` with the snapshot read ``S2`` (S1 an ancestor of S2) plans the
data files added by the commits after S1 up to S2 that are still live at S2, with S2's
position and equality deletes (and a counted row filter) resolved on them, as a full
scan does (:func:`~torch_dataloader_utils.discovery.iceberg.planned_scan`). Only the
manifests those commits wrote are read, and only the new files' footers.

What counts as new, exactly: the rows of the data files added since S1 and live at S2
(S2's deletes applied), less, as a multiset compared by content, the rows that the data
files removed since S1 held at S1.

* Without removed files (appends, merge-on-read deletes) nothing is compared: every live
  row of a file added since S1 is new, and no data is read to plan.
* An overwrite, a compaction (``replace``) or a copy-on-write ``delete`` removes files
  and may write their rows again into files it adds; Iceberg format v2 has no row
  identity. Then every file added since S1 is compared (those of appends too: pyiceberg's
  ``overwrite`` commits its new rows as an append after the rewrite): every column of
  each live row is hashed (:mod:`~torch_dataloader_utils.discovery.iceberg_content`)
  and matched with the rows of the removed files at S1; a row with a removed twin moved
  and is not new, the surplus is. The positions of the moved rows join the file's deleted
  positions, so every planned count is exact.
* The files live at S1 and still at S2 are not read at all: their rows were in S1, and
  those S2 deleted are not read either. (A row deleted from such a file by a
  merge-on-read delete and appended again is new.)

Comparing costs one read of every column of the files added since S1 (at S2) and of the
removed files (at S1, with S1's deletes), only when files were removed, and 16 bytes
per row read; a file whose column bounds (in the manifests) meet no file of the other
side on some column cannot hold a twin and is not read
(:mod:`~torch_dataloader_utils.discovery.iceberg_bounds`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from torch_dataloader_utils.config import IcebergSourceConfig
from torch_dataloader_utils.discovery.iceberg import (
    METADATA_THREADS,
    ScanEntries,
    ScanRequest,
    deleted_positions,
    planned_scan,
    resolve_snapshot,
    scan_entries,
    scan_filter_of,
)
from torch_dataloader_utils.discovery.iceberg_bounds import may_match
from torch_dataloader_utils.discovery.iceberg_content import match, row_hashes
from torch_dataloader_utils.discovery.iceberg_equality import data_file_parts
from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.storage.iceberg_columns import column_by_id
from torch_dataloader_utils.storage.iceberg_meta import IcebergDelta, IcebergFileInfo, IcebergScan
from torch_dataloader_utils.upstream.pyiceberg import manifest_entries_with_deleted

__all__ = ["History", "discover_incremental", "live_deletes"]

log = logging.getLogger(__name__)

APPEND = "append"
"""The operation of a commit that only adds rows."""


@dataclass(frozen=True)
class History:
    """The commits after snapshot ``since`` up to snapshot ``until`` (an ancestor line).

    Attributes:
        since: The older snapshot's id.
        until: The newer snapshot's id.
        snapshots: ``(snapshot id, operation)`` of every commit after ``since`` up to
            ``until``, oldest first (``"unknown"`` for a commit without a summary).
        since_sequence: ``since``'s sequence number.
    """

    since: int
    until: int
    snapshots: tuple[tuple[int, str], ...]
    since_sequence: int

    @classmethod
    def between(cls, tbl: Any, since_id: object, until: Any) -> History:
        """The commits of ``tbl`` after ``since_id`` up to snapshot ``until``.

        Raises:
            ConfigError: ``since_id`` is not an int, not a snapshot of the table, or not an
                ancestor of ``until``; or the table has no snapshot to read.
        """
        if isinstance(since_id, bool) or not isinstance(since_id, int):
            raise ConfigError(f"since_snapshot_id={since_id!r} must be an int snapshot id")
        if until is None:
            raise ConfigError(
                f"since_snapshot_id={since_id} needs a snapshot to read, but the table has none"
            )
        metadata = tbl.metadata
        since = metadata.snapshot_by_id(since_id)
        if since is None:
            known = [s.snapshot_id for s in metadata.snapshots]
            raise ConfigError(
                f"since_snapshot_id={since_id} is not a snapshot of the table (expired?); known: {known}"
            )
        line: list[tuple[int, str]] = []
        snap = until
        while snap is not None and snap.snapshot_id != since_id:
            summary = snap.summary
            line.append(
                (snap.snapshot_id, str(summary.operation.value) if summary is not None else "unknown")
            )
            parent = snap.parent_snapshot_id
            snap = metadata.snapshot_by_id(parent) if parent is not None else None
        if snap is None:
            raise ConfigError(
                f"since_snapshot_id={since_id} is not an ancestor of snapshot {until.snapshot_id} (the "
                "snapshot read); pass an older snapshot of the same line of commits (a rollback or a "
                "branch makes another line), or check that the commits between them were not expired"
            )
        return cls(since_id, until.snapshot_id, tuple(reversed(line)), int(since.sequence_number or 0))

    @property
    def ids(self) -> frozenset[int]:
        """The ids of the commits."""
        return frozenset(s for s, _ in self.snapshots)

    def operation(self, snapshot_id: int | None) -> str:
        """The operation of commit ``snapshot_id`` (``"unknown"`` when it is not one of them)."""
        return dict(self.snapshots).get(snapshot_id, "unknown") if snapshot_id is not None else "unknown"

    def manifests(self, tbl: Any, listed: Sequence[Any]) -> dict[str, tuple[Any, list[Any]]]:
        """The data manifests the commits wrote, each read once, every entry (deleted ones too).

        Those still in ``listed`` (the newer snapshot's manifests) list the files added
        since; those of the commits that removed files (even when a later commit wrote
        them again) list the files removed. Returns ``{manifest path: (manifest, entries)}``.
        """
        from pyiceberg.manifest import ManifestContent

        metadata, io, ids = tbl.metadata, tbl.io, self.ids
        wanted = {
            m.manifest_path: m
            for m in listed
            if m.content == ManifestContent.DATA and m.added_snapshot_id in ids
        }
        for snapshot_id, operation in self.snapshots:
            if operation == APPEND:  # an append removes no file
                continue
            for m in metadata.snapshot_by_id(snapshot_id).manifests(io):
                if m.added_snapshot_id == snapshot_id and m.content == ManifestContent.DATA:
                    wanted.setdefault(m.manifest_path, m)
        return {path: (m, manifest_entries_with_deleted(m, io)) for path, m in wanted.items()}

    def removed_entries(self, written: Mapping[str, tuple[Any, list[Any]]]) -> list[Any]:
        """Manifest entries of the data files live at ``since`` that the commits removed (sorted by path).

        ``written``: :meth:`manifests`. Each commit that removes files lists them as
        deleted entries in the manifests it writes; a file added after ``since`` (its file
        sequence number is larger) and removed again was never in ``since``.
        """
        from pyiceberg.manifest import DataFileContent, ManifestEntryStatus

        found: dict[str, Any] = {}
        for _, entries in written.values():
            for entry in entries:
                sequence = entry.file_sequence_number
                if sequence is None:
                    sequence = entry.sequence_number
                if (
                    entry.status == ManifestEntryStatus.DELETED
                    and entry.data_file.content == DataFileContent.DATA
                    and (sequence is None or sequence <= self.since_sequence)
                ):
                    found.setdefault(entry.data_file.file_path, entry)
        return [found[p] for p in sorted(found)]


def discover_incremental(
    tbl: Any, source: IcebergSourceConfig, *, count_filtered: bool = False
) -> IcebergScan:
    """Plan the incremental scan of ``tbl``: the rows the snapshot read has and ``since_snapshot_id`` did not.

    Raises:
        ConfigError: bad ``snapshot_id`` / ``as_of`` / ``since_snapshot_id`` / ``filters``.
        UnknownColumnError: ``columns`` or ``filters`` name a missing column.
        DiscoveryError: a data or delete file has a format that cannot be read, or a
            row has a column that cannot be compared by content.
        CorruptFileError: a footer, delete or data file cannot be read.
    """
    from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

    snap = resolve_snapshot(tbl, source.snapshot_id, source.as_of)
    history = History.between(tbl, source.since_snapshot_id, snap)
    request = ScanRequest.build(tbl, snap, source, count_filtered=count_filtered)
    listed = snap.manifests(tbl.io)
    written = history.manifests(tbl, listed)
    # The files added since and live at the snapshot, pruned as a scan prunes them, and
    # every delete file (an older delete may apply to a file added since).
    keep = scan_filter_of(tbl, snap, request)
    added_entries = [
        e
        for m in listed
        if m.manifest_path in written
        for e in written[m.manifest_path][1]
        if e.status != ManifestEntryStatus.DELETED and e.snapshot_id in history.ids and keep(e.data_file)
    ]
    deletes = scan_entries(tbl, snap, request, [m for m in listed if m.content == ManifestContent.DELETES])
    entries = ScanEntries.of([*added_entries, *deletes.entries], deletes.specs)
    added_by = {
        e.data_file.file_path: e.snapshot_id
        for e in entries.entries
        if e.data_file.content == DataFileContent.DATA
    }
    scan = planned_scan(request, entries, snap.snapshot_id)
    rewritten = tuple(p for p in sorted(added_by) if history.operation(added_by[p]) != APPEND)
    appended = tuple(p for p in sorted(added_by) if p not in set(rewritten))
    delta = IcebergDelta(history.since, history.until, history.snapshots, appended, rewritten)
    removed = history.removed_entries(written)
    if removed:
        added = {df.file_path: df for df, _ in entries.data}
        scan, delta = _compare(tbl, request, history, scan, delta, removed, added)
    return replace(scan, delta=delta)


def _compare(
    tbl: Any,
    request: ScanRequest,
    history: History,
    scan: IcebergScan,
    delta: IcebergDelta,
    removed: Sequence[Any],
    added: Mapping[str, Any],
) -> tuple[IcebergScan, IcebergDelta]:
    """Rows of the added files matched by content with rows of the removed files: not new.

    Only the files whose column bounds may hold a twin of a row of the other side are read
    (:mod:`~torch_dataloader_utils.discovery.iceberg_bounds`).
    """
    from pyiceberg.manifest import ManifestContent

    gone = {e.data_file.file_path: e.data_file for e in removed}
    types = _field_types(tbl.metadata)
    read_added = may_match(added, gone, types)
    read_removed = may_match(gone, {p: added[p] for p in read_added}, types)
    delta = replace(delta, removed=tuple(sorted(gone)))
    if not read_added or not read_removed:
        return scan, delta
    since = tbl.metadata.snapshot_by_id(history.since)
    deletes = scan_entries(
        tbl,
        since,
        request,
        [m for m in since.manifests(tbl.io) if m.content == ManifestContent.DELETES],
        pruned=False,
    )
    kept = [e for e in removed if e.data_file.file_path in read_removed]
    old = ScanEntries.of([*kept, *deletes.entries], deletes.specs)
    old_deleted = deleted_positions(request, old)
    by_path = {f.path: f for f in scan.files}
    sides = [
        [
            (
                df.file_path,
                old.formats[df.file_path],
                old.constants[df.file_path],
                old_deleted[df.file_path],
                int(df.record_count),
            )
            for df, _ in old.data
        ],
        [
            (p, scan.formats[p], scan.constants[p], _deleted(by_path[p]), int(by_path[p].num_rows or 0))
            for p in sorted(read_added)
        ],
    ]
    hashed = [_hash_files(request, side) for side in sides]
    removed_hit, added_hit = match(hashed[0][1], hashed[1][1])
    moved = _split(hashed[0][0], removed_hit, [s[0] for s in sides[0]])
    not_new = _split(hashed[1][0], added_hit, [s[0] for s in sides[1]])
    files = tuple(
        replace(f, deleted=np.union1d(_deleted(f), not_new[f.path])) if len(not_new.get(f.path, ())) else f
        for f in scan.files
    )
    removed_rows = sum(len(p) for p, _ in hashed[0][0])
    log.info(
        "incremental scan since snapshot %d: %d of %d added data file(s) compared by content with %d of %d "
        "removed file(s) (%d rows): %d rows moved, not new",
        history.since,
        len(read_added),
        len(added),
        len(read_removed),
        len(removed),
        removed_rows,
        int(added_hit.sum()),
    )
    return replace(scan, files=files), replace(
        delta,
        removed_rows=removed_rows,
        moved={p: v for p, v in moved.items() if len(v)},
        files_read=len(sides[0]) + len(sides[1]),
    )


def _field_types(metadata: Any) -> dict[int, Any]:
    """The Iceberg type of every top-level field id of the table's schemas (the newest schema's first)."""
    types: dict[int, Any] = {}
    for schema in sorted(metadata.schemas, key=lambda sc: sc.schema_id, reverse=True):
        for nf in schema.fields:
            types.setdefault(int(nf.field_id), nf.field_type)
    return types


def _deleted(info: IcebergFileInfo) -> np.ndarray[Any, Any]:
    return info.deleted if info.deleted is not None else np.empty(0, dtype=np.int64)


FileSide = tuple[str, str, tuple[tuple[int, Any], ...], np.ndarray[Any, Any], int]
"""``(path, format, identity partition constants, deleted positions, rows)`` of a file to hash."""


def _hash_files(
    request: ScanRequest, files: Sequence[FileSide]
) -> tuple[list[tuple[np.ndarray[Any, Any], int]], np.ndarray[Any, Any]]:
    """Every live row of ``files`` hashed: ``([(positions, file index)], hashes)`` in file order."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item: FileSide) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        return _file_hashes(request, *item)

    if len(files) > 1:
        with ThreadPoolExecutor(max_workers=min(METADATA_THREADS, len(files))) as pool:
            results = list(pool.map(one, files))
    else:
        results = [one(f) for f in files]
    positions = [(p, i) for i, (p, _) in enumerate(results)]
    hashes = [h for _, h in results]
    return positions, (np.concatenate(hashes) if hashes else np.empty((0, 2), dtype=np.uint64))


def _file_hashes(
    request: ScanRequest,
    path: str,
    file_format: str,
    constants: tuple[tuple[int, Any], ...],
    deleted: np.ndarray[Any, Any],
    num_rows: int,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The live rows of one data file (not in ``deleted``): their positions and content hashes."""
    fields = request.fields
    consts = dict(constants)

    def all_deleted(first: int, rows: int) -> bool:
        lo, hi = np.searchsorted(deleted, [first, first + rows])
        return bool(hi - lo == rows)

    positions, hashes = [], []
    wanted = [fid for fid, _, _ in fields]
    for first, rows, table, ids in data_file_parts(
        request.fs, path, file_format, wanted, request.name_mapping, skip=all_deleted
    ):
        columns = [column_by_id(table, rows, fid, t, ids, consts) for fid, _, t in fields]
        live = np.ones(rows, dtype=bool)
        lo, hi = np.searchsorted(deleted, [first, first + rows])
        live[deleted[lo:hi] - first] = False
        positions.append(np.flatnonzero(live).astype(np.int64) + first)
        hashes.append(row_hashes(columns, rows)[live])
    if not positions:
        return np.empty(0, dtype=np.int64), np.empty((0, 2), dtype=np.uint64)
    return np.concatenate(positions), np.concatenate(hashes)


def _split(
    positions: Sequence[tuple[np.ndarray[Any, Any], int]], hit: np.ndarray[Any, Any], paths: Sequence[str]
) -> dict[str, np.ndarray[Any, Any]]:
    """The positions of the matched rows of each file (``hit`` runs over the files in order)."""
    out: dict[str, np.ndarray[Any, Any]] = {}
    start = 0
    for pos, index in positions:
        out[paths[index]] = pos[hit[start : start + len(pos)]]
        start += len(pos)
    return out


def live_deletes(
    tbl: Any, snap: Any, request: ScanRequest, paths: Sequence[str]
) -> Mapping[str, np.ndarray[Any, Any]]:
    """The deleted positions at ``snap`` of those of ``paths`` that are live data files at ``snap``.

    Paths that are not live at ``snap`` are left out of the result.
    """
    from pyiceberg.manifest import DataFileContent

    wanted = set(paths)
    entries = scan_entries(tbl, snap, request, pruned=False)
    kept = ScanEntries.of(
        [
            e
            for e in entries.entries
            if e.data_file.content != DataFileContent.DATA or e.data_file.file_path in wanted
        ],
        entries.specs,
    )
    return deleted_positions(request, kept)
