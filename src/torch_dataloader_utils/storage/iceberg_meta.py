"""What Iceberg discovery hands the reader: data files with their deletes, and the scan.

Value types only (no I/O): :mod:`torch_dataloader_utils.discovery.iceberg` produces them,
:mod:`torch_dataloader_utils.io.iceberg` reads by them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from torch_dataloader_utils.plan.table import FileWithDeletes
from torch_dataloader_utils.storage.iceberg_fs import IcebergFileSystem

__all__ = ["IcebergDelta", "IcebergFileInfo", "IcebergScan"]


@dataclass(frozen=True, slots=True)
class IcebergFileInfo(FileWithDeletes):
    """A data file of an Iceberg scan: a :class:`FileInfo` whose counts exclude deleted rows.

    The row arithmetic (``live_rows``, ``rows_in``, ``deleted_in``, ``stop_after``) is the
    planner's :class:`~torch_dataloader_utils.plan.table.FileWithDeletes`; planners that
    cut chunks at a row count (equal batches) cut at ``stop_after`` rather than at
    ``start + rows``, which would count deleted positions as rows.

    Attributes:
        deleted: Sorted, unique file row positions removed by position and equality
            deletes (8 bytes per deleted row).
        partition: The file's partition values by partition field name (``None`` when
            the table is unpartitioned), for custom split strategies (0.2.0's
            ``IcebergDataFileInfo.partition``).
        snapshot_id: The snapshot the file was planned from.
    """

    partition: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    snapshot_id: int | None = field(default=None, compare=False, repr=False)

    def deleted_between(self, start: int, stop: int) -> np.ndarray[Any, Any]:
        """The deleted positions in ``[start, stop)``, sorted."""
        if self.deleted is None or len(self.deleted) == 0:
            return np.empty(0, dtype=np.int64)
        lo, hi = np.searchsorted(self.deleted, [start, stop])
        return self.deleted[lo:hi]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class IcebergDelta:
    """What an incremental scan counted as new: the commits between two snapshots, the files they changed.

    Kept with the scan (``IcebergScan.delta``) so that what a pass read can be told
    file by file: which files were new in full, which were compared by content, which
    left the table.

    Attributes:
        since_snapshot_id: The older snapshot (its rows are not new).
        snapshot_id: The snapshot read.
        snapshots: ``(snapshot id, operation)`` of every commit after ``since_snapshot_id``
            up to ``snapshot_id``, oldest first.
        appended: Data files added by ``append`` commits and live at ``snapshot_id``.
        rewritten: Data files added by other commits (``overwrite``, ``replace``,
            ``delete``) and live at ``snapshot_id``. When files were removed, the rows of
            both kinds are compared by content with the rows of ``removed``: a row with
            a removed twin is not new.
        removed: Data files live at ``since_snapshot_id`` and no longer at ``snapshot_id``.
        removed_rows: Live rows at ``since_snapshot_id`` of the removed files read to
            compare (those whose column bounds may hold a twin of an added row).
        moved: Per removed file, the positions of its rows whose content an added file
            holds again (moved, not deleted), sorted.
        files_read: Data files read to compare rows by content (added and removed; a
            file whose column bounds rule out any twin is not read).
    """

    since_snapshot_id: int
    snapshot_id: int
    snapshots: tuple[tuple[int, str], ...]
    appended: tuple[str, ...] = ()
    rewritten: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    removed_rows: int = 0
    moved: Mapping[str, np.ndarray[Any, Any]] = field(default_factory=dict, repr=False)
    files_read: int = 0

    @property
    def moved_rows(self) -> int:
        """Rows of added files that are not new: their content was in a removed file."""
        return sum(len(v) for v in self.moved.values())


@dataclass(frozen=True)
class IcebergScan:
    """Everything planning and reading need to know about an Iceberg scan.

    Attributes:
        fs: Builds filesystems from the table's FileIO properties in each process.
        files: One :class:`IcebergFileInfo` per data file, sorted by path.
        formats: File format (``"PARQUET"``, ``"ORC"``) of each data file.
        constants: Identity partition values of each data file, by field id.
        fields: ``(field_id, name, arrow type)`` of every column of the scan's schema.
        output_columns: Columns of every batch, in order.
        read_columns: Columns read from data files (outputs plus those the filter needs).
        filters: The pyarrow row filter, or ``None``.
        name_mapping: Column name -> field id for data files written without field ids.
        snapshot_id: The snapshot read, or ``None`` for an empty table.
        iceberg_filter: The pyiceberg expression used for pruning.
        delete_files_read: Delete files (position and equality) read to plan the scan,
            each once.
        equality_files_read: Data files whose equality columns were read to resolve
            equality deletes, each once.
        filter_counted: Whether the rows ``filters`` drops are among each file's deleted
            positions, so that row counts are exact under the filter.
        filter_files_read: Data files whose filter columns were read to count the
            filter, each once (in the same pass as their equality columns).
        delta: An incremental scan's commits and changed files (``since_snapshot_id``),
            else ``None``.
    """

    fs: IcebergFileSystem
    files: tuple[IcebergFileInfo, ...]
    formats: Mapping[str, str]
    constants: Mapping[str, tuple[tuple[int, Any], ...]]
    fields: tuple[tuple[int, str, pa.DataType], ...]
    output_columns: tuple[str, ...]
    read_columns: tuple[str, ...]
    filters: Any
    name_mapping: Mapping[str, int]
    snapshot_id: int | None
    iceberg_filter: Any = None
    delete_files_read: int = 0
    equality_files_read: int = 0
    filter_counted: bool = False
    filter_files_read: int = 0
    delta: IcebergDelta | None = None

    @property
    def schema(self) -> pa.Schema:
        """Arrow schema of every column of the table (at the scanned snapshot)."""
        return pa.schema([pa.field(name, t) for _, name, t in self.fields])

    @property
    def output_schema(self) -> pa.Schema:
        """Schema of every batch."""
        by_name = {name: t for _, name, t in self.fields}
        return pa.schema([pa.field(n, by_name[n]) for n in self.output_columns])
