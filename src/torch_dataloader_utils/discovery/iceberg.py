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
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.discovery.columns import check_columns, check_filter, filter_fields
from torch_dataloader_utils.discovery.iceberg_equality import (
    RowFilter,
    equality_positions,
    read_equality_delete,
)
from torch_dataloader_utils.discovery.iceberg_filters import to_iceberg_expression
from torch_dataloader_utils.discovery.parquet import row_groups
from torch_dataloader_utils.errors import ConfigError, CorruptFileError, DiscoveryError, PathNotFoundError
from torch_dataloader_utils.plan.types import RowGroup
from torch_dataloader_utils.storage.iceberg_fs import IcebergFileSystem
from torch_dataloader_utils.storage.iceberg_meta import IcebergFileInfo, IcebergScan
from torch_dataloader_utils.storage.redact import redact
from torch_dataloader_utils.upstream.pyiceberg import manifest_entries

__all__ = [
    "IcebergFileInfo",
    "IcebergScan",
    "discover_iceberg",
    "load_table",
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
    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise PathNotFoundError(f"table={table!r} does not exist in catalog {catalog_name!r}: {exc}") from exc


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


def discover_iceberg(
    tbl: Any,
    *,
    snapshot_id: int | None = None,
    as_of: object = None,
    columns: Sequence[str] | None = None,
    filters: object = None,
    scan_filter: object = None,
    count_filtered: bool = False,
) -> IcebergScan:
    """Plan the scan of ``tbl`` (a pyiceberg ``Table``): data files, row groups, deletes.

    With ``count_filtered`` and ``filters``, the rows of every data file that the filter
    drops are added to its deleted positions (one read of the filter's columns), so row
    counts are exact under the filter; the reader's filter then keeps the same rows.

    Raises:
        ConfigError: bad ``snapshot_id`` / ``as_of`` / ``filters`` / ``scan_filter``.
        UnknownColumnError: ``columns`` or ``filters`` name a missing column.
        DiscoveryError: a data or delete file has a format that cannot be read.
        CorruptFileError: a footer or delete file cannot be read.
    """
    from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression
    from pyiceberg.manifest import DataFileContent
    from pyiceberg.table import ALWAYS_TRUE

    snap = resolve_snapshot(tbl, snapshot_id, as_of)
    metadata = tbl.metadata
    schema = metadata.schema()
    time_travel = snapshot_id is not None or as_of is not None
    if time_travel and snap is not None and snap.schema_id is not None:
        # Time travel reads with the snapshot's schema; the current state with the current one.
        schema = metadata.schema_by_id(snap.schema_id) or schema
    fields = _arrow_fields(schema)
    arrow_schema = pa.schema([pa.field(name, t) for _, name, t in fields])
    output = check_columns(columns, arrow_schema)
    expr = check_filter(filters, arrow_schema)
    filter_names = set(filter_fields(expr, arrow_schema))
    needed = set(output) | filter_names
    read_columns = tuple(name for _, name, _ in fields if name in needed)
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
    fs = IcebergFileSystem(dict(tbl.io.properties))
    name_mapping = _name_mapping(metadata, fields)
    base = {
        "fs": fs,
        "fields": fields,
        "output_columns": tuple(output),
        "read_columns": read_columns,
        "filters": expr,
        "name_mapping": name_mapping,
        "iceberg_filter": iceberg_filter,
    }
    row_filter = None
    if count_filtered and expr is not None:
        row_filter = RowFilter(expr, tuple(f for f in fields if f[1] in filter_names))
    counting = row_filter is not None
    if snap is None:
        return IcebergScan(
            files=(), formats={}, constants={}, snapshot_id=None, filter_counted=counting, **base
        )
    scan = tbl.scan(
        row_filter=iceberg_filter if iceberg_filter is not None else ALWAYS_TRUE, snapshot_id=snap.snapshot_id
    )
    try:
        entries = manifest_entries(scan)
    except ValueError as exc:
        raise ConfigError(f"scan_filter / filters cannot be bound to the table's schema: {exc}") from exc
    specs = metadata.specs()
    data = []
    pos_deletes = []
    eq_deletes = []
    for entry in entries:
        df = entry.data_file
        seq = entry.sequence_number if entry.sequence_number is not None else 0
        if df.content == DataFileContent.DATA:
            data.append((df, seq))
        elif df.content == DataFileContent.POSITION_DELETES:
            pos_deletes.append((df, seq))
        elif df.content == DataFileContent.EQUALITY_DELETES:
            eq_deletes.append((df, seq))
    for df, _ in pos_deletes + eq_deletes:
        if str(df.file_format.value).upper() != "PARQUET":
            raise DiscoveryError(
                f"delete file {df.file_path!r} is {df.file_format.value}; only Parquet delete files are "
                "supported (rewrite the table's deletes, e.g. with Spark's rewrite_position_delete_files)"
            )
    formats = {}
    for df, _ in data:
        fmt = str(df.file_format.value).upper()
        if fmt not in ("PARQUET", "ORC"):
            raise DiscoveryError(
                f"data file {df.file_path!r} is {fmt}; IcebergDataset reads Parquet and ORC data files"
            )
        formats[df.file_path] = fmt
    by_partition: dict[Any, list[tuple[Any, int]]] = defaultdict(list)
    for df, seq in data:
        by_partition[_partition_key(df, specs)].append((df, seq))

    def applicable(delete: Any, delete_seq: int, strict: bool) -> list[Any]:
        key = _partition_key(delete, specs)
        pool = [x for group in by_partition.values() for x in group] if key is None else by_partition[key]
        return [df for df, seq in pool if (seq < delete_seq if strict else seq <= delete_seq)]

    # Position deletes: read each delete file once, keep positions of data files in scope.
    positions: dict[str, list[np.ndarray[Any, Any]]] = defaultdict(list)
    targets = [{df.file_path for df in applicable(d, s, strict=False)} for d, s in pos_deletes]
    work = [(d, t) for (d, _), t in zip(pos_deletes, targets, strict=True) if t]
    for (_d, wanted), table in zip(
        work, _pmap(lambda x: _read_position_deletes(fs, x[0].file_path), work), strict=True
    ):
        column = table.column("file_path").unify_dictionaries().combine_chunks()
        if not pa.types.is_dictionary(column.type):
            column = column.dictionary_encode()
        indices = column.indices.to_numpy(zero_copy_only=False)
        pos = table.column("pos").to_numpy()
        for k, path in enumerate(column.dictionary.to_pylist()):
            if path in wanted:
                positions[path].append(pos[indices == k])
    constants = {df.file_path: _identity_constants(df, specs) for df, _ in data}
    # Equality deletes: read each delete file once, then the equality columns of each
    # data file it applies to, and turn the matching rows into deleted positions.
    equality: dict[str, list[int]] = defaultdict(list)  # data file -> delete indices
    eq_work: list[tuple[str, tuple[int, ...]]] = []
    for d, s in eq_deletes:
        ids = tuple(int(i) for i in (d.equality_ids or ()))
        if not ids:
            raise DiscoveryError(f"equality delete file {d.file_path!r} has no equality_ids")
        applies_to = applicable(d, s, strict=True)
        if applies_to:
            for target in applies_to:
                equality[target.file_path].append(len(eq_work))
            eq_work.append((d.file_path, ids))
    # A counted filter: the filter's columns of every data file are read in the same
    # pass, and the rows it drops join the deleted positions.
    types: dict[int, pa.DataType] = {}
    matchers: list[Any] = []
    if eq_work:
        types = _field_types(metadata, fields, {fid for _, ids in eq_work for fid in ids}, eq_work)
        matchers = _pmap(lambda x: read_equality_delete(fs, x[0], x[1], types, name_mapping), eq_work)
    affected = sorted(set(equality) | (set(formats) if row_filter is not None else set()))
    found = _pmap(
        lambda path: equality_positions(
            fs,
            path,
            formats[path],
            [matchers[k] for k in equality.get(path, ())],
            types,
            name_mapping,
            dict(constants[path]),
            row_filter,
        ),
        affected,
    )
    for path, pos in zip(affected, found, strict=True):
        if len(pos):
            positions[path].append(pos)
    parquet = [df for df, _ in data if formats[df.file_path] == "PARQUET"]
    groups = dict(
        zip(
            (df.file_path for df in parquet),
            _pmap(lambda df: _row_groups(fs, df.file_path), parquet),
            strict=True,
        )
    )
    files = []
    for df, _ in sorted(data, key=lambda x: x[0].file_path):
        path = df.file_path
        deleted = None
        if positions.get(path):
            deleted = np.unique(np.concatenate(positions[path]).astype(np.int64))
            deleted = deleted[(deleted >= 0) & (deleted < df.record_count)]
        if formats[path] == "ORC" and deleted is not None:
            log.info("Iceberg ORC data file %s has deletes: it is read whole", path)
        files.append(
            IcebergFileInfo(
                path,
                int(df.file_size_in_bytes),
                int(df.record_count),
                groups.get(path),
                None,
                deleted=deleted,
                partition=_partition_values(df, specs),
                snapshot_id=snap.snapshot_id,
            )
        )
    return IcebergScan(
        files=tuple(files),
        formats=formats,
        constants={df.file_path: constants[df.file_path] for df, _ in data},
        snapshot_id=snap.snapshot_id,
        delete_files_read=len(work) + len(eq_work),
        equality_files_read=len(equality),
        filter_counted=counting,
        filter_files_read=len(affected) if counting else 0,
        **base,
    )


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
