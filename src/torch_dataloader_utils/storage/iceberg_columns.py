"""Iceberg columns by field id, shared by the chunk reader and equality-delete resolution.

A data file's columns are matched to the table schema by Iceberg field id (the Parquet
``field_id`` of each column), so renamed and reordered columns read correctly from old
files; a file written without field ids is matched through the table's name mapping.
A column a file does not have is its identity partition value when there is one, else
nulls; a column of an older, narrower type is cast (promoted) to the schema's type.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

__all__ = ["column_by_id", "log_once", "orc_field_ids", "parquet_field_ids"]

log = logging.getLogger("torch_dataloader_utils.io.iceberg")

_FIELD_ID = b"PARQUET:field_id"
_logged: set[str] = set()


def log_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` at INFO the first time ``key`` is seen in this process."""
    if key not in _logged:
        _logged.add(key)
        log.info(message, *args)


def parquet_field_ids(schema: pa.Schema, name_mapping: Mapping[str, int], path: str) -> dict[int, str]:
    """Field id -> column name in a Parquet file's schema (top-level columns).

    Files without field ids are matched through ``name_mapping`` (logged once per file).
    """
    out: dict[int, str] = {}
    for f in schema:
        raw = (f.metadata or {}).get(_FIELD_ID)
        if raw is not None:
            out[int(raw)] = f.name
    if not out:
        log_once("nm:" + path, "Iceberg data file %s has no field ids: columns matched by name", path)
        for f in schema:
            fid = name_mapping.get(f.name)
            if fid is not None:
                out[fid] = f.name
    return out


def orc_field_ids(schema: pa.Schema, name_mapping: Mapping[str, int]) -> dict[int, str]:
    """Field id -> column name in an ORC file's schema (matched by name)."""
    return {name_mapping[n]: n for n in schema.names if n in name_mapping}


def column_by_id(
    table: pa.Table,
    num_rows: int,
    field_id: int,
    type_: pa.DataType,
    ids: Mapping[int, str],
    constants: Mapping[int, Any],
) -> pa.ChunkedArray[Any] | pa.Array[Any]:
    """The column ``field_id`` of ``table`` (``num_rows`` rows) as ``type_``.

    Args:
        table: Columns read from the data file.
        num_rows: The table's rows (also when it has no columns).
        field_id: The Iceberg field id wanted.
        type_: The schema's Arrow type for it (older files are cast to it).
        ids: Field id -> column name in the file (:func:`parquet_field_ids`).
        constants: Identity partition values of the file, by field id.
    """
    if field_id in ids:
        column = table.column(ids[field_id])
        return column if column.type.equals(type_) else column.cast(type_)
    if field_id in constants:
        return pa.repeat(pa.scalar(constants[field_id], type_), num_rows)  # type: ignore[call-overload,no-any-return]
    return pa.nulls(num_rows, type_)  # type: ignore[call-overload,no-any-return]
