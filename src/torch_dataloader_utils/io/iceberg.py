"""Reading chunks of Iceberg data files: columns by field id, deletes applied per chunk.

A chunk ``[a, b)`` of a Parquet data file reads the row groups overlapping it (sliced at
the edges, so chunks may be cut at any row). For each piece the file row positions are
known before any filtering, so the chunk drops exactly the position deletes in
``[a, b)``. Equality delete files are read once per process (cached) and compared on
their equality field ids. Then the row filter runs and the batch is projected.

Columns are matched by Iceberg field id (the Parquet ``field_id`` of each column), so
renamed and reordered columns read correctly from old files; a column a file does not
have is its identity partition value when there is one, else nulls. Files written
without field ids are matched through the table's name mapping (or the current names).
ORC data files are read whole, by column name.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from torch_dataloader_utils.discovery.iceberg import EqualityDelete, IcebergFileInfo, IcebergScan
from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit

__all__ = ["IcebergReader"]

log = logging.getLogger(__name__)

_OPEN_FILES = 4
_FIELD_ID = b"PARQUET:field_id"
_logged: set[str] = set()


def _log_once(key: str, message: str, *args: object) -> None:
    if key not in _logged:
        _logged.add(key)
        log.info(message, *args)


class IcebergReader:
    """A :class:`ChunkReader` for the data files of an :class:`IcebergScan`."""

    def __init__(self, scan: IcebergScan, batch_size: int = 65536, use_threads: bool = True) -> None:
        self._scan = scan
        self._files: dict[str, IcebergFileInfo] = {f.path: f for f in scan.files}
        self._batch_size = batch_size
        self._use_threads = use_threads
        self._by_name = {name: (fid, t) for fid, name, t in scan.fields}
        self._by_id = {fid: (name, t) for fid, name, t in scan.fields}
        self._open: OrderedDict[str, pq.ParquetFile] = OrderedDict()
        self._eq_cache: dict[tuple[str, tuple[int, ...]], pa.Table] = {}
        self.delete_file_reads = 0
        """Equality delete files read by this process (for tests and observability)."""

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()  # open files and caches never cross a process boundary
        state["_eq_cache"] = {}
        state["delete_file_reads"] = 0
        return state

    # -- files ------------------------------------------------------------------
    def _parquet(self, path: str) -> pq.ParquetFile:
        pf = self._open.pop(path, None)
        if pf is None:
            filesystem, inner = self._scan.fs.resolve(path)
            pf = pq.ParquetFile(inner, filesystem=filesystem)
        self._open[path] = pf
        while len(self._open) > _OPEN_FILES:
            self._open.popitem(last=False)
        return pf

    def _id_to_column(self, schema: pa.Schema, path: str) -> dict[int, str]:
        """Field id -> column name in a data file's schema (top-level columns)."""
        out: dict[int, str] = {}
        for f in schema:
            raw = (f.metadata or {}).get(_FIELD_ID)
            if raw is not None:
                out[int(raw)] = f.name
        if not out:
            _log_once("nm:" + path, "Iceberg data file %s has no field ids: columns matched by name", path)
            for f in schema:
                fid = self._scan.name_mapping.get(f.name)
                if fid is not None:
                    out[fid] = f.name
        return out

    # -- reading ----------------------------------------------------------------
    def read(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """Yield the chunk's live rows (deletes applied, filtered, projected) in file order."""
        info = self._files[chunk.path]
        try:
            if self._scan.formats.get(chunk.path) == "ORC":
                yield from self._read_orc(info, chunk)
                return
            yield from self._read_parquet(info, chunk)
        except (OSError, pa.ArrowException) as exc:
            raise ReadError(
                f"reading Iceberg data file {chunk.path!r} rows [{chunk.start}, {chunk.stop}) failed: {exc}"
            ) from exc

    def _needed(self, path: str) -> list[str]:
        names = list(self._scan.read_columns)
        for delete in self._scan.equality_deletes.get(path, ()):
            for fid in delete.field_ids:
                name = self._by_id[fid][0] if fid in self._by_id else None
                if name is None:
                    raise ReadError(
                        f"equality delete file {delete.path!r} uses field id {fid}, which is not in the "
                        "scanned schema; read the current snapshot or a snapshot whose schema has it"
                    )
                if name not in names:
                    names.append(name)
        return names

    def _read_parquet(self, info: IcebergFileInfo, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        pf = self._parquet(info.path)
        start, stop = (0, info.num_rows or 0) if chunk.unit is ChunkUnit.BYTES else (chunk.start, chunk.stop)
        groups = info.groups_in(start, stop)
        names = self._needed(info.path)
        ids = self._id_to_column(pf.schema_arrow, info.path)
        file_cols = [ids[self._by_name[n][0]] for n in names if self._by_name[n][0] in ids]
        for g in groups:
            lo = max(start, g.first_row)
            hi = min(stop, g.stop_row)
            if info.deleted_in(lo, hi) == hi - lo:
                continue  # every row of the piece is deleted
            table = pf.read_row_group(g.index, columns=file_cols, use_threads=self._use_threads)
            if lo != g.first_row or hi != g.stop_row:
                table = table.slice(lo - g.first_row, hi - lo)
            # Deletes and filters run once per row-group piece. The piece goes on as
            # one batch: re-batching slices it without copies, where pre-cut batches
            # would be misaligned by the deleted rows and copied again.
            out = self._finish(table, info, names, ids, lo)
            if out.num_rows:
                yield from out.to_batches()

    def _read_orc(self, info: IcebergFileInfo, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        import pyarrow.orc as po

        _log_once("orc:" + info.path, "Iceberg ORC data file %s is read whole (columns by name)", info.path)
        if chunk.unit is ChunkUnit.ROWS and (chunk.start, chunk.stop) != (0, info.num_rows):
            raise ReadError(
                f"ORC data file {info.path!r} can only be read whole; got rows [{chunk.start}, {chunk.stop})"
            )
        filesystem, inner = self._scan.fs.resolve(info.path)
        with filesystem.open_input_file(inner) as handle:
            table = po.ORCFile(handle).read()
        names = self._needed(info.path)
        ids = {self._scan.name_mapping[n]: n for n in table.schema.names if n in self._scan.name_mapping}
        table = table.select([ids[self._by_name[n][0]] for n in names if self._by_name[n][0] in ids])
        out = self._finish(table, info, names, ids, 0)
        if out.num_rows:
            yield from out.to_batches()

    def _finish(
        self,
        batch: pa.Table,
        info: IcebergFileInfo,
        names: Sequence[str],
        ids: Mapping[int, str],
        first_pos: int,
    ) -> pa.Table:
        """Columns by field id, then position deletes, equality deletes, filter, projection."""
        n = batch.num_rows
        constants = dict(self._scan.constants.get(info.path, ()))
        arrays = []
        for name in names:
            fid, t = self._by_name[name]
            if fid in ids:
                column = batch.column(ids[fid])
                if not column.type.equals(t):
                    column = column.cast(t)
            elif fid in constants:
                column = pa.repeat(pa.scalar(constants[fid], t), n)  # type: ignore[call-overload]
            else:
                column = pa.nulls(n, t)  # type: ignore[call-overload]
            arrays.append(column)
        out = pa.Table.from_arrays(arrays, names=list(names))
        keep: np.ndarray[Any, Any] | None = None
        deleted = info.deleted_between(first_pos, first_pos + n)
        if len(deleted):
            keep = np.ones(n, dtype=bool)
            keep[deleted - first_pos] = False
        for delete in self._scan.equality_deletes.get(info.path, ()):
            hit = self._equality_mask(out, delete)
            keep = ~hit if keep is None else keep & ~hit
        if keep is not None:
            out = out.filter(pa.array(keep))
        if self._scan.filters is not None and out.num_rows:
            out = out.filter(self._scan.filters)
        if out.schema.names != list(self._scan.output_columns):
            out = out.select(list(self._scan.output_columns))
        return out

    # -- equality deletes ---------------------------------------------------------
    def _equality_table(self, delete: EqualityDelete) -> pa.Table:
        key = (delete.path, delete.field_ids)
        table = self._eq_cache.get(key)
        if table is None:
            filesystem, inner = self._scan.fs.resolve(delete.path)
            pf = pq.ParquetFile(inner, filesystem=filesystem)
            ids = self._id_to_column(pf.schema_arrow, delete.path)
            cols = []
            names = []
            for fid in delete.field_ids:
                if fid not in ids:
                    raise ReadError(f"equality delete file {delete.path!r} has no column with field id {fid}")
                name = self._by_id[fid][0]
                cols.append(ids[fid])
                names.append(name)
            raw = pf.read(columns=cols)
            arrays = [
                raw.column(c).cast(self._by_id[fid][1]) for c, fid in zip(cols, delete.field_ids, strict=True)
            ]
            table = pa.table(arrays, names=names)
            self._eq_cache[key] = table
            self.delete_file_reads += 1
        return table

    def _equality_mask(self, batch: pa.Table, delete: EqualityDelete) -> np.ndarray[Any, Any]:
        """Rows of ``batch`` equal (null-safe, per the spec) to some row of the delete file."""
        deletes = self._equality_table(delete)
        n = batch.num_rows
        if deletes.num_rows == 0 or n == 0:
            return np.zeros(n, dtype=bool)
        names = deletes.schema.names
        if len(names) == 1:
            values = deletes.column(0).combine_chunks()
            return pc.is_in(batch.column(names[0]), value_set=values, skip_nulls=False).to_numpy(  # type: ignore[no-any-return]
                zero_copy_only=False
            )
        # Several columns: code each column by its position among the delete file's
        # distinct values (nulls match nulls), then compare one mixed-radix key per row.
        data_key = np.zeros(n, dtype=np.int64)
        delete_key = np.zeros(deletes.num_rows, dtype=np.int64)
        present = np.ones(n, dtype=bool)
        radix = 1
        for name in names:
            distinct = pc.unique(deletes.column(name).combine_chunks())
            size = len(distinct) + 1
            if radix * size >= 2**62:
                return self._equality_mask_slow(batch, deletes)
            codes = pc.index_in(batch.column(name), value_set=distinct, skip_nulls=False)
            present &= codes.is_valid().to_numpy(zero_copy_only=False)
            data_key += radix * codes.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            dcodes = pc.index_in(deletes.column(name), value_set=distinct, skip_nulls=False)
            delete_key += radix * dcodes.to_numpy(zero_copy_only=False).astype(np.int64)
            radix *= size
        return present & np.isin(data_key, delete_key)

    @staticmethod
    def _equality_mask_slow(batch: pa.Table, deletes: pa.Table) -> np.ndarray[Any, Any]:
        keys = set(zip(*(deletes.column(n).to_pylist() for n in deletes.schema.names), strict=True))
        rows = zip(*(batch.column(n).to_pylist() for n in deletes.schema.names), strict=True)
        return np.fromiter((r in keys for r in rows), dtype=bool, count=batch.num_rows)
