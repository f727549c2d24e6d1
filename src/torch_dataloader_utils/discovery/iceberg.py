"""Iceberg discovery: the scan planned from the manifests, every delete resolved to positions.

pyiceberg's ``plan_files()`` refuses scans with equality deletes, so the scan is planned
here from the manifest entries pyiceberg has already pruned by partition and column
statistics (:func:`~torch_dataloader_utils.upstream.pyiceberg.manifest_entries`, a private
pyiceberg API, hence the pinned pyiceberg):

* every live DATA entry becomes an :class:`IcebergFileInfo` with its exact row groups
  (read from the Parquet footer, so ``row_group`` splitting works) and the sorted row
  positions deleted from it;
* a position delete file applies to data files of the same partition (or to every
  data file when its spec is unpartitioned) whose data sequence number is ``<=`` its
  own; the delete files are read here, once, and only positions of data files in the
  scan are kept;
* an equality delete file applies to data files of the same partition (or every file
  when unpartitioned) with a data sequence number strictly ``<`` its own. Each is read
  here, once; then the equality columns (only those) of every data file it applies to
  are read, and the positions of the matching rows join the file's deleted positions
  (:mod:`torch_dataloader_utils.discovery.iceberg_equality`).

* with ``count_filtered`` and a row filter, the filter's columns (only those) of every
  data file are read, in the same pass as its equality columns, and the positions of
  the rows the filter drops join the file's deleted positions too.

Row counts (``FileInfo.rows_in``) are therefore the live rows, exact per row range,
whatever kind of delete applies (and, when the filter is counted, exactly the rows that
pass it). Discovery reads data only for equality deletes and counted filters: the
equality and filter columns of the data files concerned, once, in the main process.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.config import IcebergSourceConfig
from torch_dataloader_utils.discovery.columns import check_columns, check_filter, filter_fields
from torch_dataloader_utils.discovery.iceberg_equality import (
    RowFilter,
    equality_positions,
    read_equality_delete,
)
from torch_dataloader_utils.discovery.iceberg_filters import to_iceberg_expression
from torch_dataloader_utils.discovery.parquet import row_groups
from torch_dataloader_utils.errors import (
    ConfigError,
    CorruptFileError,
    DataLoaderUtilsError,
    DiscoveryError,
    PathNotFoundError,
)
from torch_dataloader_utils.plan.types import RowGroup
from torch_dataloader_utils.storage.iceberg_fs import IcebergFileSystem
from torch_dataloader_utils.storage.iceberg_meta import IcebergFileInfo, IcebergScan
from torch_dataloader_utils.storage.redact import redact
from torch_dataloader_utils.upstream.pyiceberg import entry_filter, manifest_entries

__all__ = [
    "IcebergFileInfo",
    "IcebergScan",
    "ScanEntries",
    "ScanRequest",
    "deleted_positions",
    "discover_iceberg",
    "load_table",
    "planned_scan",
    "resolve_snapshot",
    "scan_entries",
    "scan_filter_of",
]

log = logging.getLogger(__name__)

METADATA_THREADS = 16
"""Footers, delete files and equality columns of data files read at once."""

POS_FILE_PATH_ID = 2147483546
POS_POS_ID = 2147483545


def load_table(table: str, catalog_config: Mapping[str, Any] | None) -> Any:
    """Load ``table`` ("ns.table" or "catalog.ns.table") from the catalog ``catalog_config``.

    Raises:
        ConfigError: ``table`` or ``catalog_config`` is malformed, or the catalog cannot
            be loaded.
        PathNotFoundError: the table does not exist.
    """
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    if not isinstance(table, str) or table.count(".") < 1 or any(not p for p in table.split(".")):
        raise ConfigError(
            f"table={table!r} must be 'namespace.table' or 'catalog.namespace.table', e.g. 'db.events'"
        )
    if catalog_config is not None and not isinstance(catalog_config, Mapping):
        raise ConfigError(
            f"catalog_config={redact(catalog_config)!r} must be a dict of pyiceberg catalog properties, "
            "e.g. {'type': 'sql', 'uri': 'sqlite:///catalog.db', 'warehouse': 'file:///wh'}"
        )
    parts = table.split(".")
    if len(parts) >= 3:
        catalog_name, identifier = parts[0], ".".join(parts[1:])
    else:
        catalog_name, identifier = "default", table
    props = {k: str(v) if not isinstance(v, str) else v for k, v in (catalog_config or {}).items()}
    # A "name" property names the catalog (load_catalog's first argument), as in
    # load_catalog(**catalog_config); it wins over the table's catalog part.
    catalog_name = props.pop("name", catalog_name)
    try:
        catalog = load_catalog(catalog_name, **props)
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise ConfigError(
            f"catalog_config for catalog {catalog_name!r} cannot be loaded: {redact(str(exc))}; "
            "pass pyiceberg catalog properties, e.g. "
            "{'type': 'sql', 'uri': 'sqlite:///catalog.db', 'warehouse': ...}"
        ) from exc
    except Exception as exc:  # a database that cannot be opened, a server that is down...
        raise _unreachable(catalog_name, props, exc) from exc
    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise PathNotFoundError(f"table={table!r} does not exist in catalog {catalog_name!r}: {exc}") from exc
    except DataLoaderUtilsError:
        raise
    except Exception as exc:
        raise _unreachable(catalog_name, props, exc) from exc


def _unreachable(name: str, props: Mapping[str, Any], exc: BaseException) -> DiscoveryError:
    """The error for a catalog that cannot be opened or reached, naming its uri (secrets hidden)."""
    kind = f"type={props['type']!r}, " if "type" in props else ""
    return DiscoveryError(
        f"catalog {name!r} ({kind}uri={redact(props.get('uri'))!r}) cannot be opened or "
        f"reached: {type(exc).__name__}: {redact(str(exc))}. Check catalog_config: a SQLite "
        "catalog's file (and its directory) must exist and be readable, a REST catalog's server "
        "must be running and reachable, and the credentials must be right"
    )


def _as_of_ms(as_of: object) -> int:
    if isinstance(as_of, _dt.datetime):
        if as_of.tzinfo is None:
            raise ConfigError(
                f"as_of={as_of!r} has no time zone; pass an aware datetime (e.g. tzinfo=timezone.utc) "
                "or milliseconds since the epoch"
            )
        return int(as_of.timestamp() * 1000)
    if isinstance(as_of, int) and not isinstance(as_of, bool):
        return as_of
    raise ConfigError(
        f"as_of={as_of!r} must be a time-zone aware datetime or an int of milliseconds since the epoch"
    )


def resolve_snapshot(tbl: Any, snapshot_id: int | None, as_of: object) -> Any:
    """The snapshot to read: by id, as of a time, or the current one (``None`` if empty).

    Raises:
        IncompatibleOptionsError: both ``snapshot_id`` and ``as_of`` are given.
        ConfigError: no such snapshot.
    """
    from torch_dataloader_utils.errors import IncompatibleOptionsError

    if snapshot_id is not None and as_of is not None:
        raise IncompatibleOptionsError(
            f"snapshot_id={snapshot_id!r} and as_of={as_of!r} both select a snapshot; pass one of them"
        )
    if snapshot_id is not None:
        if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int):
            raise ConfigError(f"snapshot_id={snapshot_id!r} must be an int snapshot id")
        snap = tbl.snapshot_by_id(snapshot_id)
        if snap is None:
            known = [s.snapshot_id for s in tbl.snapshots()]
            raise ConfigError(f"snapshot_id={snapshot_id} is not a snapshot of the table; known: {known}")
        return snap
    if as_of is not None:
        ms = _as_of_ms(as_of)
        snap = tbl.snapshot_as_of_timestamp(ms)
        if snap is None:
            first = min((s.timestamp_ms for s in tbl.snapshots()), default=None)
            raise ConfigError(
                f"as_of={as_of!r} ({ms} ms) is before the table's first snapshot"
                + (f" ({first} ms)" if first is not None else " (the table has no snapshot)")
            )
        return snap
    return tbl.current_snapshot()


def _arrow_fields(schema: Any) -> tuple[tuple[int, str, pa.DataType], ...]:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    out: list[tuple[int, str, pa.DataType]] = []
    for nf in schema.fields:
        t: pa.DataType = schema_to_pyarrow(schema.select(nf.name), include_field_ids=False).field(0).type
        if pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_large_binary(t):
            t = pa.binary()
        out.append((int(nf.field_id), str(nf.name), t))
    return tuple(out)


def _partition_key(data_file: Any, specs: Mapping[int, Any]) -> tuple[int, tuple[Any, ...]] | None:
    """(spec id, partition values), or ``None`` when the spec is unpartitioned (global)."""
    spec = specs[data_file.spec_id]
    if spec.is_unpartitioned():
        return None
    values = tuple(data_file.partition[i] for i in range(len(spec.fields)))
    return data_file.spec_id, values


def _partition_values(data_file: Any, specs: Mapping[int, Any]) -> dict[str, Any] | None:
    """The partition values of ``data_file`` by partition field name, or ``None`` when unpartitioned."""
    spec = specs[data_file.spec_id]
    if spec.is_unpartitioned():
        return None
    return {pf.name: data_file.partition[i] for i, pf in enumerate(spec.fields)}


def _identity_constants(data_file: Any, specs: Mapping[int, Any]) -> tuple[tuple[int, Any], ...]:
    from pyiceberg.transforms import IdentityTransform

    spec = specs[data_file.spec_id]
    return tuple(
        (pf.source_id, data_file.partition[i])
        for i, pf in enumerate(spec.fields)
        if isinstance(pf.transform, IdentityTransform)
    )


def _row_groups(fs: IcebergFileSystem, location: str) -> tuple[RowGroup, ...]:
    filesystem, path = fs.resolve(location)
    try:
        meta = pq.read_metadata(path, filesystem=filesystem)
    except (OSError, pa.ArrowException) as exc:
        raise CorruptFileError(
            f"cannot read the Parquet footer of Iceberg data file {location!r}: {exc}"
        ) from exc
    return row_groups(meta)


def _read_position_deletes(fs: IcebergFileSystem, location: str) -> pa.Table:
    filesystem, path = fs.resolve(location)
    try:
        # file_path is dictionary-encoded in practice: read it as a dictionary, not as strings.
        return pq.read_table(
            path, filesystem=filesystem, columns=["file_path", "pos"], read_dictionary=["file_path"]
        )
    except (OSError, pa.ArrowException) as exc:
        raise CorruptFileError(f"cannot read Iceberg position delete file {location!r}: {exc}") from exc


def _pmap(fn: Any, items: Sequence[Any]) -> list[Any]:
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(METADATA_THREADS, len(items))) as pool:
        return list(pool.map(fn, items))


def discover_iceberg(tbl: Any, source: IcebergSourceConfig, *, count_filtered: bool = False) -> IcebergScan:
    """Plan the scan of ``tbl`` (a pyiceberg ``Table``): data files, row groups, deletes.

    With ``count_filtered`` and ``source.filters``, the rows of every data file that the
    filter drops are added to its deleted positions (one read of the filter's columns),
    so row counts are exact under the filter; the reader's filter then keeps the same rows.

    Raises:
        ConfigError: bad ``snapshot_id`` / ``as_of`` / ``filters`` / ``scan_filter``.
        UnknownColumnError: ``columns`` or ``filters`` name a missing column.
        DiscoveryError: a data or delete file has a format that cannot be read.
        CorruptFileError: a footer or delete file cannot be read.
    """
    snap = resolve_snapshot(tbl, source.snapshot_id, source.as_of)
    request = ScanRequest.build(tbl, snap, source, count_filtered=count_filtered)
    if snap is None:
        return request.empty()
    return planned_scan(request, scan_entries(tbl, snap, request), snap.snapshot_id)


def scan_entries(
    tbl: Any,
    snap: Any,
    request: ScanRequest,
    manifests: Sequence[Any] | None = None,
    *,
    pruned: bool = True,
) -> ScanEntries:
    """The live manifest entries of snapshot ``snap`` that the request's filter may keep.

    Args:
        tbl: The pyiceberg table.
        snap: The snapshot.
        request: The scan asked for (its pyiceberg filter prunes manifests and files).
        manifests: Plan from these manifest files of ``snap`` only (default: all of them).
        pruned: Prune by the request's filter (``False``: every live entry).

    Raises:
        ConfigError: the filters cannot be bound to the table's schema.
        DiscoveryError: a data or delete file has a format that cannot be read.
    """
    from pyiceberg.table import ALWAYS_TRUE

    expression = request.iceberg_filter if pruned and request.iceberg_filter is not None else ALWAYS_TRUE
    scan = tbl.scan(row_filter=expression, snapshot_id=snap.snapshot_id)
    try:
        found = manifest_entries(scan, manifests)
    except ValueError as exc:
        raise ConfigError(f"scan_filter / filters cannot be bound to the table's schema: {exc}") from exc
    return ScanEntries.of(found, tbl.metadata.specs())


def scan_filter_of(tbl: Any, snap: Any, request: ScanRequest) -> Callable[[Any], bool]:
    """Whether a data file may hold rows the request's filter keeps (partition values, column metrics).

    The test a scan of ``snap`` applies to each manifest entry, for entries read without it.

    Raises:
        ConfigError: the filters cannot be bound to the table's schema.
    """
    from pyiceberg.table import ALWAYS_TRUE

    expression = request.iceberg_filter if request.iceberg_filter is not None else ALWAYS_TRUE
    try:
        return entry_filter(tbl.scan(row_filter=expression, snapshot_id=snap.snapshot_id))
    except ValueError as exc:
        raise ConfigError(f"scan_filter / filters cannot be bound to the table's schema: {exc}") from exc


def planned_scan(request: ScanRequest, entries: ScanEntries, snapshot_id: int, **extra: Any) -> IcebergScan:
    """The scan of ``entries``' data files, with their deletes (and a counted filter) resolved.

    ``extra``: further :class:`IcebergScan` fields (an incremental scan's).

    Raises:
        CorruptFileError: a footer or delete file cannot be read.
    """
    fs = request.fs
    positions, delete_files_read = _position_deletes(fs, entries)
    equality_files, filter_files = _equality_and_filter_deletes(
        fs, request.metadata, entries, request, request.counted_filter, positions
    )
    return IcebergScan(
        files=_data_files(fs, entries, positions, snapshot_id),
        formats=entries.formats,
        constants=entries.constants,
        snapshot_id=snapshot_id,
        delete_files_read=delete_files_read + len(entries.eq_work),
        equality_files_read=equality_files,
        filter_files_read=filter_files,
        **request.scan_fields(),
        **extra,
    )


def deleted_positions(request: ScanRequest, entries: ScanEntries) -> dict[str, np.ndarray[Any, Any]]:
    """The deleted positions (position and equality deletes only) of every data file of ``entries``."""
    positions, _ = _position_deletes(request.fs, entries)
    _equality_and_filter_deletes(request.fs, request.metadata, entries, request, None, positions)
    return {
        df.file_path: _unique(positions.get(df.file_path), int(df.record_count)) for df, _ in entries.data
    }


@dataclass(frozen=True)
class ScanRequest:
    """What the user asked of the table, checked against its schema at the snapshot."""

    fields: tuple[tuple[int, str, pa.DataType], ...]
    output: tuple[str, ...]
    read_columns: tuple[str, ...]
    filters: Any
    filter_names: frozenset[str]
    iceberg_filter: Any
    name_mapping: dict[str, int]
    fs: IcebergFileSystem
    metadata: Any
    count_filtered: bool

    @classmethod
    def build(
        cls, tbl: Any, snap: Any, source: IcebergSourceConfig, *, count_filtered: bool = False
    ) -> ScanRequest:
        """The request of ``source`` against ``tbl`` at snapshot ``snap`` (its schema when time travelling).

        Raises:
            ConfigError: bad ``filters`` / ``scan_filter``.
            UnknownColumnError: ``columns`` or ``filters`` name a missing column.
        """
        from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression

        metadata = tbl.metadata
        schema = metadata.schema()
        time_travel = source.snapshot_id is not None or source.as_of is not None
        if time_travel and snap is not None and snap.schema_id is not None:
            # Time travel reads with the snapshot's schema; the current state with the current one.
            schema = metadata.schema_by_id(snap.schema_id) or schema
        fields = _arrow_fields(schema)
        arrow_schema = pa.schema([pa.field(name, t) for _, name, t in fields])
        output = check_columns(source.columns, arrow_schema)
        expr = check_filter(source.filters, arrow_schema)
        filter_names = frozenset(filter_fields(expr, arrow_schema))
        needed = set(output) | filter_names
        scan_filter = source.scan_filter
        if scan_filter is not None and not isinstance(scan_filter, BooleanExpression):
            raise ConfigError(
                f"scan_filter={scan_filter!r} must be a pyiceberg expression, e.g. "
                "pyiceberg.expressions.GreaterThanOrEqual('day', 10); use filters= for pyarrow expressions"
            )
        iceberg_filter: Any = to_iceberg_expression(expr, schema)
        if scan_filter is not None:
            iceberg_filter = (
                scan_filter if isinstance(iceberg_filter, AlwaysTrue) else And(iceberg_filter, scan_filter)
            )
        return cls(
            fields=fields,
            output=tuple(output),
            read_columns=tuple(name for _, name, _ in fields if name in needed),
            filters=expr,
            filter_names=filter_names,
            iceberg_filter=iceberg_filter,
            name_mapping=_name_mapping(metadata, fields),
            fs=IcebergFileSystem(dict(tbl.io.properties)),
            metadata=metadata,
            count_filtered=count_filtered and expr is not None,
        )

    @property
    def row_filter(self) -> RowFilter | None:
        """The row filter as counted by discovery (its columns), or ``None`` without one."""
        if self.filters is None:
            return None
        return RowFilter(self.filters, tuple(f for f in self.fields if f[1] in self.filter_names))

    @property
    def counted_filter(self) -> RowFilter | None:
        """The row filter when discovery counts it (``count_filtered``), else ``None``."""
        return self.row_filter if self.count_filtered else None

    def scan_fields(self) -> dict[str, Any]:
        """The :class:`IcebergScan` fields that do not depend on the manifests."""
        return {
            "fs": self.fs,
            "fields": self.fields,
            "output_columns": self.output,
            "read_columns": self.read_columns,
            "filters": self.filters,
            "name_mapping": self.name_mapping,
            "iceberg_filter": self.iceberg_filter,
            "filter_counted": self.count_filtered,
        }

    def empty(self, **extra: Any) -> IcebergScan:
        """The scan of a table without a snapshot: no files."""
        return IcebergScan(
            files=(), formats={}, constants={}, snapshot_id=None, **self.scan_fields(), **extra
        )


@dataclass
class ScanEntries:
    """The scan's live manifest entries by kind, with which deletes apply to which data."""

    data: list[tuple[Any, int]]
    pos_deletes: list[tuple[Any, int]]
    eq_deletes: list[tuple[Any, int]]
    specs: Mapping[int, Any]
    formats: dict[str, str] = field(default_factory=dict)
    constants: dict[str, tuple[tuple[int, Any], ...]] = field(default_factory=dict)
    by_partition: dict[Any, list[tuple[Any, int]]] = field(default_factory=lambda: defaultdict(list))
    eq_work: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    """Equality delete files to read: ``(path, equality field ids)``."""
    eq_targets: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Data file -> indices into :attr:`eq_work` of the equality deletes that apply to it."""
    entries: list[Any] = field(default_factory=list)
    """The manifest entries, as given."""

    @classmethod
    def of(cls, entries: Sequence[Any], specs: Mapping[int, Any]) -> ScanEntries:
        """Sort ``entries`` by content, check their formats, index data files by partition.

        Raises:
            DiscoveryError: a delete file is not Parquet, a data file neither Parquet nor
                ORC, or an equality delete file has no equality ids.
        """
        from pyiceberg.manifest import DataFileContent

        out = cls([], [], [], specs, entries=list(entries))
        kinds = {
            DataFileContent.DATA: out.data,
            DataFileContent.POSITION_DELETES: out.pos_deletes,
            DataFileContent.EQUALITY_DELETES: out.eq_deletes,
        }
        for entry in entries:
            seq = entry.sequence_number if entry.sequence_number is not None else 0
            kinds[entry.data_file.content].append((entry.data_file, seq))
        for df, _ in out.pos_deletes + out.eq_deletes:
            if str(df.file_format.value).upper() != "PARQUET":
                raise DiscoveryError(
                    f"delete file {df.file_path!r} is {df.file_format.value}; only Parquet delete files "
                    "are supported (rewrite the table's deletes, e.g. with Spark's "
                    "rewrite_position_delete_files)"
                )
        for df, seq in out.data:
            fmt = str(df.file_format.value).upper()
            if fmt not in ("PARQUET", "ORC"):
                raise DiscoveryError(
                    f"data file {df.file_path!r} is {fmt}; IcebergDataset reads Parquet and ORC data files"
                )
            out.formats[df.file_path] = fmt
            out.constants[df.file_path] = _identity_constants(df, specs)
            out.by_partition[_partition_key(df, specs)].append((df, seq))
        for d, s in out.eq_deletes:
            ids = tuple(int(i) for i in (d.equality_ids or ()))
            if not ids:
                raise DiscoveryError(f"equality delete file {d.file_path!r} has no equality_ids")
            applies_to = out.applicable(d, s, strict=True)
            if applies_to:
                for target in applies_to:
                    out.eq_targets[target.file_path].append(len(out.eq_work))
                out.eq_work.append((d.file_path, ids))
        return out

    def applicable(self, delete: Any, delete_seq: int, strict: bool) -> list[Any]:
        """Data files a delete file applies to: same partition (or any, when global), by sequence.

        Position deletes apply to data files with a sequence number ``<=`` their own,
        equality deletes (``strict``) to those strictly ``<``.
        """
        key = _partition_key(delete, self.specs)
        pool = (
            [x for group in self.by_partition.values() for x in group]
            if key is None
            else self.by_partition[key]
        )
        return [df for df, seq in pool if (seq < delete_seq if strict else seq <= delete_seq)]


def _position_deletes(
    fs: IcebergFileSystem, entries: ScanEntries
) -> tuple[dict[str, list[np.ndarray[Any, Any]]], int]:
    """Deleted positions per data file from every position delete file (each read once).

    Returns:
        ``(positions, delete files read)``; only positions of data files in scope are kept.
    """
    positions: dict[str, list[np.ndarray[Any, Any]]] = defaultdict(list)
    targets = [
        {df.file_path for df in entries.applicable(d, s, strict=False)} for d, s in entries.pos_deletes
    ]
    work = [(d, t) for (d, _), t in zip(entries.pos_deletes, targets, strict=True) if t]
    tables = _pmap(lambda x: _read_position_deletes(fs, x[0].file_path), work)
    for (_d, wanted), table in zip(work, tables, strict=True):
        column = table.column("file_path").unify_dictionaries().combine_chunks()
        if not pa.types.is_dictionary(column.type):
            column = column.dictionary_encode()
        indices = column.indices.to_numpy(zero_copy_only=False)
        pos = table.column("pos").to_numpy()
        for k, path in enumerate(column.dictionary.to_pylist()):
            if path in wanted:
                positions[path].append(pos[indices == k])
    return positions, len(work)


def _equality_and_filter_deletes(
    fs: IcebergFileSystem,
    metadata: Any,
    entries: ScanEntries,
    request: ScanRequest,
    row_filter: RowFilter | None,
    positions: dict[str, list[np.ndarray[Any, Any]]],
) -> tuple[int, int]:
    """Rows matched by equality deletes (and dropped by a counted filter) join ``positions``.

    Each equality delete file is read once; then the equality columns (and a counted
    filter's columns) of every data file concerned are read in one pass per file.

    Returns:
        ``(data files read for equality deletes, data files read for the filter)``.
    """
    types: dict[int, pa.DataType] = {}
    matchers: list[Any] = []
    if entries.eq_work:
        wanted = {fid for _, ids in entries.eq_work for fid in ids}
        types = _field_types(metadata, request.fields, wanted, entries.eq_work)
        matchers = _pmap(
            lambda x: read_equality_delete(fs, x[0], x[1], types, request.name_mapping), entries.eq_work
        )
    affected = sorted(set(entries.eq_targets) | (set(entries.formats) if row_filter is not None else set()))
    found = _pmap(
        lambda path: equality_positions(
            fs,
            path,
            entries.formats[path],
            [matchers[k] for k in entries.eq_targets.get(path, ())],
            types,
            request.name_mapping,
            dict(entries.constants[path]),
            row_filter,
        ),
        affected,
    )
    for path, pos in zip(affected, found, strict=True):
        if len(pos):
            positions[path].append(pos)
    return len(entries.eq_targets), len(affected) if row_filter is not None else 0


def _data_files(
    fs: IcebergFileSystem,
    entries: ScanEntries,
    positions: Mapping[str, list[np.ndarray[Any, Any]]],
    snapshot_id: int,
) -> tuple[IcebergFileInfo, ...]:
    """One :class:`IcebergFileInfo` per data file (sorted by path): row groups and deletes."""
    parquet = [df for df, _ in entries.data if entries.formats[df.file_path] == "PARQUET"]
    groups = dict(
        zip(
            (df.file_path for df in parquet),
            _pmap(lambda df: _row_groups(fs, df.file_path), parquet),
            strict=True,
        )
    )
    files = []
    for df, _ in sorted(entries.data, key=lambda x: x[0].file_path):
        path = df.file_path
        deleted = _unique(positions.get(path), int(df.record_count)) if positions.get(path) else None
        if entries.formats[path] == "ORC" and deleted is not None:
            log.info("Iceberg ORC data file %s has deletes: it is read whole", path)
        files.append(
            IcebergFileInfo(
                path,
                int(df.file_size_in_bytes),
                int(df.record_count),
                groups.get(path),
                None,
                deleted=deleted,
                partition=_partition_values(df, entries.specs),
                snapshot_id=snapshot_id,
            )
        )
    return tuple(files)


def _unique(parts: Sequence[np.ndarray[Any, Any]] | None, num_rows: int) -> np.ndarray[Any, Any]:
    """The sorted, unique positions of ``parts`` inside ``[0, num_rows)``."""
    if not parts:
        return np.empty(0, dtype=np.int64)
    deleted = np.unique(np.concatenate(parts).astype(np.int64))
    return deleted[(deleted >= 0) & (deleted < num_rows)]


def _field_types(
    metadata: Any,
    fields: Sequence[tuple[int, str, pa.DataType]],
    wanted: set[int],
    deletes: Sequence[tuple[str, tuple[int, ...]]],
) -> dict[int, pa.DataType]:
    """Arrow type of each equality field id: the scanned schema's, else the newest schema's that has it.

    Raises:
        DiscoveryError: a field id is in no schema of the table.
    """
    types = {fid: t for fid, _, t in fields if fid in wanted}
    for schema in sorted(metadata.schemas, key=lambda sc: sc.schema_id, reverse=True):
        if wanted <= types.keys():
            break
        for fid, _, t in _arrow_fields(schema):
            if fid in wanted:
                types.setdefault(fid, t)
    missing = sorted(wanted - types.keys())
    if missing:
        paths = [p for p, ids in deletes if set(ids) & set(missing)]
        raise DiscoveryError(
            f"equality delete file(s) {paths} use field id(s) {missing}, which no schema of the table has"
        )
    return types


def _name_mapping(metadata: Any, fields: Sequence[tuple[int, str, pa.DataType]]) -> dict[str, int]:
    """Column name -> field id for files without field ids.

    The table's ``schema.name-mapping.default`` when it has one (as the spec requires),
    else the current column names.
    """
    try:
        nm = metadata.name_mapping()
    except (ValueError, TypeError) as exc:
        raise DiscoveryError(f"the table's schema.name-mapping.default cannot be parsed: {exc}") from exc
    if nm is None:
        return {name: fid for fid, name, _ in fields}
    mapping: dict[str, int] = {}
    for mf in nm:
        if mf.field_id is not None:
            for name in mf.names:
                mapping.setdefault(name, int(mf.field_id))
    return mapping
