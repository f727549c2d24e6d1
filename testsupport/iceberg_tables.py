"""Iceberg tables for tests, benchmarks and the demo: SQLite catalogs and delete-file writers.

pyiceberg 0.12 cannot write delete files through its public API, so
:func:`commit_deletes` writes Parquet delete files, describes them with
``DataFile.from_args`` and commits them in a DELETES manifest through pyiceberg's
fast-append snapshot producer. These are private pyiceberg APIs (as is
``DataScan._plan_manifest_entries`` in :func:`data_files`), which is why they live here,
outside the installed package, and why pyiceberg is pinned in constraints.txt.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog

__all__ = [
    "commit_deletes",
    "data_files",
    "equality_delete_file",
    "make_catalog",
    "position_delete_file",
    "sql_catalog_config",
]

POS_PATH_ID = 2147483546
"""Reserved field id of ``file_path`` in position delete files."""
POS_POS_ID = 2147483545
"""Reserved field id of ``pos`` in position delete files."""


def _manifest_classes() -> tuple[Any, Any]:
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2
    from pyiceberg.table.update.snapshot import _FastAppendFiles

    class DeleteManifestWriter(ManifestWriterV2):  # type: ignore[misc]
        def content(self) -> Any:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    class AppendDeletes(_FastAppendFiles):  # type: ignore[misc]
        def new_manifest_writer(self, spec: Any) -> Any:
            return DeleteManifestWriter(
                spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression
            )

    return DeleteManifestWriter, AppendDeletes


def _write(table: Any, arrow: pa.Table) -> tuple[str, int]:
    path = f"{table.location()}/data/delete-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(path).create() as stream:
        pq.write_table(arrow, stream)
    return path, len(table.io.new_input(path))


def _empty_partition() -> Any:
    from pyiceberg.typedef import Record

    return Record()


def position_delete_file(table: Any, deletes: Mapping[str, Iterable[int]], partition: Any = None) -> Any:
    """Write a position delete file for ``{data_file_path: positions}``; return its ``DataFile``."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    paths: list[str] = []
    positions: list[int] = []
    for data_path in sorted(deletes):
        for pos in sorted({int(p) for p in deletes[data_path]}):
            paths.append(data_path)
            positions.append(pos)
    fields: list[pa.Field[Any]] = [
        pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": str(POS_PATH_ID)}),
        pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": str(POS_POS_ID)}),
    ]
    schema = pa.schema(fields)
    arrow = pa.table([pa.array(paths, pa.string()), pa.array(positions, pa.int64())], schema=schema)
    path, size = _write(table, arrow)
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition if partition is not None else _empty_partition(),
        record_count=len(positions),
        file_size_in_bytes=size,
        spec_id=table.spec().spec_id,
    )


def equality_delete_file(table: Any, rows: Mapping[str, Sequence[Any]], partition: Any = None) -> Any:
    """Write an equality delete file over the named columns (by the table's field ids)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    schema = table.schema()
    fields, arrays, ids = [], [], []
    for name, values in rows.items():
        nested = schema.find_field(name)
        arrow_type = schema_to_pyarrow(schema.select(name)).field(0).type
        fields.append(pa.field(name, arrow_type, metadata={b"PARQUET:field_id": str(nested.field_id)}))
        arrays.append(pa.array(list(values), arrow_type))
        ids.append(nested.field_id)
    path, size = _write(table, pa.table(arrays, schema=pa.schema(fields)))
    return DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition if partition is not None else _empty_partition(),
        record_count=len(arrays[0]),
        file_size_in_bytes=size,
        equality_ids=ids,
        spec_id=table.spec().spec_id,
    )


def commit_deletes(table: Any, delete_files: Sequence[Any]) -> Any:
    """Commit ``delete_files`` as one DELETE snapshot (a DELETES manifest); return the refreshed table."""
    from pyiceberg.table.snapshots import Operation

    _, append_deletes = _manifest_classes()
    with table.transaction() as tx:
        producer = append_deletes(operation=Operation.DELETE, transaction=tx, io=table.io)
        for f in delete_files:
            producer.append_data_file(f)
        producer.commit()
    return table.refresh()


def sql_catalog_config(root: Path) -> dict[str, str]:
    """``catalog_config`` of a SQLite SqlCatalog with its warehouse under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    return {
        "type": "sql",
        "uri": f"sqlite:///{root / 'catalog.db'}",
        "warehouse": f"file://{root / 'warehouse'}",
    }


def make_catalog(config: Mapping[str, str], name: str = "default", namespace: str = "ns") -> SqlCatalog:
    """The SqlCatalog for ``config``, with ``namespace`` created."""
    from pyiceberg.catalog.sql import SqlCatalog

    props = {k: v for k, v in config.items() if k != "type"}
    catalog = SqlCatalog(name, **props)
    catalog.create_namespace_if_not_exists(namespace)
    return catalog


def data_files(table: Any) -> list[str]:
    """Paths of the current snapshot's data files, sorted."""
    from pyiceberg.manifest import DataFileContent as Content

    entries = [e for group in table.scan()._plan_manifest_entries() for e in group]
    return sorted(e.data_file.file_path for e in entries if e.data_file.content == Content.DATA)
