"""Equality deletes turned into row positions, once, when an Iceberg scan is planned.

An equality delete file removes every row of the data files it applies to whose values
on its equality columns (by field id) equal one of its rows; nulls match nulls, per the
Iceberg spec. Discovery reads each equality delete file once (:func:`read_equality_delete`),
then reads only the equality columns of each affected data file, a row group at a time,
and returns the positions of the rows that match (:func:`equality_positions`). Those
positions are merged with the file's position deletes, so the reader drops them as it
drops position deletes and every planned row count is exact.

A row filter is resolved the same way when exact counts are wanted: the rows that fail
it join the deleted positions (:class:`RowFilter`), read in the same pass over the
data file as its equality columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from torch_dataloader_utils.errors import CorruptFileError, DiscoveryError
from torch_dataloader_utils.storage.iceberg_columns import column_by_id, orc_field_ids, parquet_field_ids
from torch_dataloader_utils.storage.iceberg_fs import IcebergFileSystem

__all__ = ["EqualityMatcher", "RowFilter", "data_file_parts", "equality_positions", "read_equality_delete"]

Column: TypeAlias = "pa.Array[Any] | pa.ChunkedArray[Any]"


class EqualityMatcher:
    """Finds the rows equal (null-safe) to some row of one equality delete file.

    Args:
        field_ids: The delete file's equality field ids.
        deletes: Its rows, one column per field id (in that order), cast to the
            scanned schema's types.
    """

    def __init__(self, field_ids: tuple[int, ...], deletes: pa.Table) -> None:
        self.field_ids = field_ids
        self._deletes = deletes
        self._distinct = [pc.unique(deletes.column(i).combine_chunks()) for i in range(deletes.num_columns)]
        # Several columns: each column is coded by its position among the delete file's
        # distinct values (nulls match nulls), and a row by one mixed-radix key.
        self._keys: np.ndarray[Any, Any] | None = None
        radix = 1
        keys = np.zeros(deletes.num_rows, dtype=np.int64)
        for i, distinct in enumerate(self._distinct):
            size = len(distinct) + 1
            if radix * size >= 2**62:
                return  # too many combinations for an int64 key: match row tuples instead
            codes = pc.index_in(deletes.column(i), value_set=distinct, skip_nulls=False)
            keys += radix * codes.to_numpy(zero_copy_only=False).astype(np.int64)
            radix *= size
        self._keys = np.unique(keys)

    @property
    def num_rows(self) -> int:
        """Rows of the delete file."""
        return int(self._deletes.num_rows)

    def mask(self, columns: Sequence[Column], num_rows: int) -> np.ndarray[Any, Any]:
        """Which of ``num_rows`` rows (the equality columns, in ``field_ids`` order) are deleted."""
        if self._deletes.num_rows == 0 or num_rows == 0:
            return np.zeros(num_rows, dtype=bool)
        if len(columns) == 1:
            hit = pc.is_in(columns[0], value_set=self._distinct[0], skip_nulls=False)
            return hit.to_numpy(zero_copy_only=False).astype(bool, copy=False)
        if self._keys is None:
            wanted = set(zip(*(c.to_pylist() for c in self._deletes.columns), strict=True))
            rows = zip(*(c.to_pylist() for c in columns), strict=True)
            return np.fromiter((r in wanted for r in rows), dtype=bool, count=num_rows)
        key = np.zeros(num_rows, dtype=np.int64)
        present = np.ones(num_rows, dtype=bool)
        radix = 1
        for column, distinct in zip(columns, self._distinct, strict=True):
            codes = pc.index_in(column, value_set=distinct, skip_nulls=False)
            present &= codes.is_valid().to_numpy(zero_copy_only=False)
            key += radix * codes.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            radix *= len(distinct) + 1
        return present & np.isin(key, self._keys)


def read_equality_delete(
    fs: IcebergFileSystem,
    location: str,
    field_ids: tuple[int, ...],
    types: Mapping[int, pa.DataType],
    name_mapping: Mapping[str, int],
) -> EqualityMatcher:
    """Read an equality delete file's equality columns (by field id, cast to ``types``).

    Raises:
        CorruptFileError: the file cannot be read.
        DiscoveryError: the file has no column with one of ``field_ids``.
    """
    filesystem, path = fs.resolve(location)
    try:
        pf = pq.ParquetFile(path, filesystem=filesystem)
        ids = parquet_field_ids(pf.schema_arrow, name_mapping, location)
        missing = [fid for fid in field_ids if fid not in ids]
        if missing:
            raise DiscoveryError(
                f"equality delete file {location!r} has no column with field id(s) {missing} "
                f"(its equality_ids are {list(field_ids)})"
            )
        raw = pf.read(columns=[ids[fid] for fid in field_ids], use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise CorruptFileError(f"cannot read Iceberg equality delete file {location!r}: {exc}") from exc
    arrays = [raw.column(ids[fid]).cast(types[fid]) for fid in field_ids]
    return EqualityMatcher(field_ids, pa.table(arrays, names=[str(fid) for fid in field_ids]))


@dataclass(frozen=True)
class RowFilter:
    """A row filter to resolve to deleted positions: the rows that fail it.

    Attributes:
        expression: The pyarrow expression.
        fields: ``(field_id, name, arrow type)`` of each column it reads, named as the
            expression names them.
    """

    expression: pc.Expression
    fields: tuple[tuple[int, str, pa.DataType], ...]


_POSITION = "__tdu_position"


def _failing(
    expression: pc.Expression,
    columns: Sequence[tuple[str, Column]],
    num_rows: int,
) -> np.ndarray[Any, Any]:
    """Which of ``num_rows`` rows ``expression`` drops (false or null), as the reader's filter does."""
    names = [name for name, _ in columns]
    position = _POSITION
    while position in names:
        position += "_"
    table = pa.Table.from_arrays(
        [c for _, c in columns] + [pa.array(np.arange(num_rows, dtype=np.int64))],
        names=[*names, position],
    )
    kept = table.filter(expression).column(position).to_numpy()
    fail = np.ones(num_rows, dtype=bool)
    fail[kept] = False
    return fail


def data_file_parts(
    fs: IcebergFileSystem,
    location: str,
    file_format: str,
    wanted: Sequence[int],
    name_mapping: Mapping[str, int],
    skip: Callable[[int, int], bool] | None = None,
) -> Iterator[tuple[int, int, pa.Table, Mapping[int, str]]]:
    """The columns ``wanted`` (field ids) of a data file, a row group at a time (ORC: whole).

    Yields ``(first row position, rows, table, ids)``: the table holds the wanted columns
    the file has (by file column name), ``ids`` maps field ids to those names. With
    ``skip``, a row group for which ``skip(first, rows)`` is true is not read.

    Raises:
        CorruptFileError: the data file cannot be read.
    """
    filesystem, path = fs.resolve(location)
    try:
        if file_format == "ORC":
            import pyarrow.orc as po

            with filesystem.open_input_file(path) as handle:
                orc = po.ORCFile(handle)
                ids = orc_field_ids(orc.schema, name_mapping)
                table = orc.read(columns=[ids[fid] for fid in wanted if fid in ids])
            yield 0, orc.nrows, table, ids
            return
        pf = pq.ParquetFile(path, filesystem=filesystem)
        ids = parquet_field_ids(pf.schema_arrow, name_mapping, location)
        names = [ids[fid] for fid in wanted if fid in ids]
        first = 0
        for i in range(pf.num_row_groups):
            rows = pf.metadata.row_group(i).num_rows
            if skip is None or not skip(first, rows):
                yield first, rows, pf.read_row_group(i, columns=names, use_threads=False), ids
            first += rows
    except (OSError, pa.ArrowException) as exc:
        raise CorruptFileError(f"cannot read the columns of Iceberg data file {location!r}: {exc}") from exc


def equality_positions(
    fs: IcebergFileSystem,
    location: str,
    file_format: str,
    matchers: Sequence[EqualityMatcher],
    types: Mapping[int, pa.DataType],
    name_mapping: Mapping[str, int],
    constants: Mapping[int, Any],
    row_filter: RowFilter | None = None,
) -> np.ndarray[Any, Any]:
    """Sorted row positions of data file ``location`` deleted by any of ``matchers`` or ``row_filter``.

    Reads only the equality columns (and the filter's columns), matched by field id and
    promoted exactly as the chunk reader does (a column the file lacks is its identity
    partition value, else nulls). Parquet files are read a row group at a time. With
    ``row_filter``, the rows it drops (false or null) count as deleted, so counts of
    the remaining rows are exact.

    Raises:
        CorruptFileError: the data file cannot be read.
    """
    filter_fields = row_filter.fields if row_filter is not None else ()
    wanted = sorted({fid for m in matchers for fid in m.field_ids} | {fid for fid, _, _ in filter_fields})
    filter_types = {fid: t for fid, _, t in filter_fields}
    found: list[np.ndarray[Any, Any]] = []

    def column(table: pa.Table, num_rows: int, fid: int, ids: Mapping[int, str]) -> Column:
        return column_by_id(table, num_rows, fid, filter_types.get(fid) or types[fid], ids, constants)

    for first, num_rows, table, ids in data_file_parts(fs, location, file_format, wanted, name_mapping):
        hit = np.zeros(num_rows, dtype=bool)
        for m in matchers:
            hit |= m.mask([column(table, num_rows, fid, ids) for fid in m.field_ids], num_rows)
        if row_filter is not None:
            columns = [(name, column(table, num_rows, fid, ids)) for fid, name, _ in filter_fields]
            hit |= _failing(row_filter.expression, columns, num_rows)
        found.append(np.flatnonzero(hit).astype(np.int64) + first)
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)
