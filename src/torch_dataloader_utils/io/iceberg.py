"""Reading chunks of Iceberg data files: columns by field id, deletes applied per chunk.

A chunk ``[a, b)`` of a Parquet data file reads the row groups overlapping it (sliced at
the edges, so chunks may be cut at any row). For each piece the file row positions are
known before any filtering, so the chunk drops exactly the deleted positions in
``[a, b)`` (position and equality deletes alike: discovery has already resolved equality
deletes to positions). Then the row filter runs and the batch is projected.

Columns are matched by Iceberg field id (:mod:`torch_dataloader_utils.storage.iceberg_columns`),
so renamed and reordered columns read correctly from old files; a column a file does
not have is its identity partition value when there is one, else nulls. Files written
without field ids are matched through the table's name mapping (or the current names).
ORC data files are read whole, by column name.

Remote data files go through the node-local ``data_cache`` when one is set (in blocks,
keyed by path, store and size: Iceberg never rewrites a data file in place). A row
group that does not decode is decoded again from its bytes read again from storage
(:func:`~torch_dataloader_utils.io.bad.decode_again`); when that fails too it raises
:class:`BadDataError`, or with ``on_bad_data='skip'`` is replaced by a stand-in of its
live rows (:mod:`~torch_dataloader_utils.io.bad`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.config import BadDataConfig, CacheConfig, FetchConfig
from torch_dataloader_utils.errors import FileChangedError, ReadError
from torch_dataloader_utils.io.bad import BadData, BadUnit, decode_again, describe
from torch_dataloader_utils.io.base import OpenFiles, ReaderBase, ReaderCounts
from torch_dataloader_utils.io.prefetch import FetchStats, column_ranges
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, RowGroup
from torch_dataloader_utils.storage.cache import CacheStats, FileKey, range_cache
from torch_dataloader_utils.storage.cached import RangeFile, open_blocks
from torch_dataloader_utils.storage.fetch import GaveUp, ShortRead, retry_call
from torch_dataloader_utils.storage.iceberg_columns import (
    column_by_id,
    log_once,
    orc_field_ids,
    parquet_field_ids,
)
from torch_dataloader_utils.storage.iceberg_meta import IcebergFileInfo, IcebergScan
from torch_dataloader_utils.storage.identity import check_size
from torch_dataloader_utils.storage.stores import options_identity

__all__ = ["IcebergReader"]


class IcebergReader(ReaderBase):
    """A :class:`ChunkReader` for the data files of an :class:`IcebergScan`."""

    def __init__(
        self,
        scan: IcebergScan,
        batch_size: int,
        use_threads: bool = True,
        *,
        cache: CacheConfig | None = None,
        fetch: FetchConfig | None = None,
        bad_data: BadDataConfig | None = None,
    ) -> None:
        self._cache = cache
        self._fetch = fetch or FetchConfig()
        self._bad = BadData(bad_data)
        self._scan = scan
        self._files: dict[str, IcebergFileInfo] = {f.path: f for f in scan.files}
        self._batch_size = batch_size
        self._use_threads = use_threads
        self._by_name = {name: (fid, t) for fid, name, t in scan.fields}
        self._open = OpenFiles(self._open_parquet)
        self._decoder: ThreadPoolExecutor | None = None
        self._decoder_pid = 0
        self._stats = FetchStats()
        self._cache_stats = CacheStats()

    def io_totals(self) -> tuple[int, int, int, int, float]:
        """``(bytes_fetched, bytes_needed, requests, retries, wait_sec)`` of this process so far.

        Parquet data files: the column chunks of the row groups read (ORC files: not counted).
        """
        return self._stats.totals()

    def counts(self) -> ReaderCounts:
        """This reader's ``data_cache`` reads and skipped data in this process so far."""
        bad = self._bad
        return ReaderCounts(self._cache_stats.totals(), bad.totals(), bad.files(), bad.standin_rows())

    def use_threads(self, on: bool) -> None:
        """Decode with Arrow's thread pool (``True``, the default) or in the calling thread."""
        self._use_threads = on

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_decoder"] = None  # nor threads: made again in the process that reads
        return state

    def _decode_ahead(self) -> ThreadPoolExecutor:
        """One thread that decodes the next row group while this one is finished."""
        # A forked DataLoader worker inherits this object but not its thread: make a new one.
        if self._decoder is None or self._decoder_pid != os.getpid():
            self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tdu-iceberg-decode")
            self._decoder_pid = os.getpid()
        return self._decoder

    # -- files ------------------------------------------------------------------
    def _open_parquet(self, path: str) -> pq.ParquetFile:
        cached = self._cached(path)
        if cached is not None:
            return pq.ParquetFile(cached)
        filesystem, inner = self._scan.fs.resolve(path)
        handle = filesystem.open_input_file(inner)
        check_size(path, self._files[path].size, handle.size())  # the size is known from opening
        return pq.ParquetFile(handle)

    def _key(self, path: str) -> FileKey | None:
        """The cache key of a data file (``None``: no cache, or a local file)."""
        if self._cache is None or not self._cache.enabled or path.startswith(("file:", "/")):
            return None
        store = options_identity(path.partition("://")[0], self._scan.fs.properties)
        return FileKey(path, self._files[path].size, "iceberg", store)

    def _cached(self, path: str) -> Any | None:
        """``path`` read through the node-local cache, or ``None`` (no cache, or a local file)."""
        key = self._key(path)
        if key is None:
            return None
        return open_blocks(self._cache, key, key.size, self._fetcher(path), self._cache_stats)

    def _fresh(self, path: str) -> RangeFile:
        """``path`` read anew from storage (retried; the cache's entries of each read dropped)."""
        key, fetch = self._key(path), self._fetcher(path)
        directory = self._cache.directory if self._cache is not None else None
        size = self._files[path].size

        def fresh(lo: int, hi: int) -> bytes:
            if key is not None and directory is not None and self._cache is not None:
                range_cache(directory, self._cache.data_cache_size).discard(key, lo, hi, self._cache_stats)
            return fetch(lo, min(hi, size))

        return RangeFile(size, fresh, track=True)

    def _fetcher(self, path: str) -> Callable[[int, int], bytes]:
        """Reads bytes ``[lo, hi)`` of ``path`` from storage, retried (one file opened, size checked)."""
        size = self._files[path].size
        opened: list[Any] = []

        def fetch(lo: int, hi: int) -> bytes:
            def attempt() -> bytes:
                if not opened:
                    filesystem, inner = self._scan.fs.resolve(path)
                    handle = filesystem.open_input_file(inner)
                    check_size(path, size, handle.size())
                    opened.append(handle)
                got = bytes(opened[0].read_at(hi - lo, lo))
                if len(got) != hi - lo:
                    raise ShortRead(f"got {len(got)} of {hi - lo} bytes")
                return got

            try:
                data: bytes = retry_call(attempt, self._fetch)
            except GaveUp as failed:
                raise ReadError(
                    f"reading Iceberg data file {path!r} bytes [{lo}, {hi}) failed {failed.how(self._fetch)}"
                ) from failed.error
            return data

        return fetch

    # -- reading ----------------------------------------------------------------
    def read(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """Yield the chunk's live rows (deletes applied, filtered, projected) in file order."""
        info = self._files[chunk.path]
        try:
            if self._scan.formats.get(chunk.path) == "ORC":
                yield from self._read_orc(info, chunk)
                return
            yield from self._read_parquet(info, chunk)
        except MemoryError:
            raise  # a unit that does not fit in memory is not bad data, nor a read error
        except (OSError, pa.ArrowException) as exc:
            raise ReadError(
                f"reading Iceberg data file {chunk.path!r} rows [{chunk.start}, {chunk.stop}) failed: {exc}"
            ) from exc

    def _read_parquet(self, info: IcebergFileInfo, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        pf = self._open.get(info.path)
        start, stop = (0, info.num_rows or 0) if chunk.unit is ChunkUnit.BYTES else (chunk.start, chunk.stop)
        groups = info.groups_in(start, stop)
        names = self._scan.read_columns
        ids = parquet_field_ids(pf.schema_arrow, self._scan.name_mapping, info.path)
        file_cols = [ids[self._by_name[n][0]] for n in names if self._by_name[n][0] in ids]
        pieces = []
        for g in groups:
            lo, hi = max(start, g.first_row), min(stop, g.stop_row)
            if info.deleted_in(lo, hi) < hi - lo:  # else every row of the piece is deleted
                pieces.append((g, lo, hi))
        needed = column_ranges(pf.metadata, [g.index for g, _, _ in pieces], file_cols)
        nbytes = sum(b - a for a, b in needed)
        self._stats.read(nbytes, nbytes)

        def decode(index: int) -> Future[pa.Table]:
            group = pieces[index][0].index
            return self._decode_ahead().submit(
                pf.read_row_group, group, columns=file_cols, use_threads=self._use_threads
            )

        # While one row group's deletes, filter and projection run (one thread), the next
        # group is decoded (pyarrow releases the GIL): the deletes cost no extra wall time.
        pending = decode(0) if pieces else None
        for i, (g, lo, hi) in enumerate(pieces):
            assert pending is not None
            try:
                table = pending.result()
            except MemoryError:
                raise
            except (OSError, pa.ArrowException) as exc:
                pending = decode(i + 1) if i + 1 < len(pieces) else None
                redo = self._again(pf, g.index, file_cols)
                what = f"row group {g.index} of Iceberg data file {info.path!r}"
                again = decode_again(
                    exc, lambda: self._fresh(info.path), redo, what, lambda: self._confirm(info)
                )
                if isinstance(again, BaseException):
                    standin = self._bad_group(info, chunk, g, lo, hi, again)
                    if standin is not None:
                        yield standin
                    continue
                table = again
            else:
                pending = decode(i + 1) if i + 1 < len(pieces) else None
            if lo != g.first_row or hi != g.stop_row:
                table = table.slice(lo - g.first_row, hi - lo)
            # Deletes and filters run once per row-group piece. The piece goes on as
            # one batch: re-batching slices it without copies, where pre-cut batches
            # would be misaligned by the deleted rows and copied again.
            out = self._finish(table, info, names, ids, lo)
            if out.num_rows:
                yield from out.to_batches()

    def _again(self, pf: pq.ParquetFile, group: int, columns: list[str]) -> Any:
        """Decodes row group ``group`` from a file read again (the footer of ``pf``)."""
        metadata = pf.metadata

        def decode(file: Any) -> pa.Table:
            fresh = pq.ParquetFile(file, metadata=metadata, pre_buffer=False, page_checksum_verification=True)
            return fresh.read_row_group(group, columns=columns, use_threads=False)

        return decode

    def _bad_group(
        self, info: IcebergFileInfo, chunk: Chunk, g: RowGroup, lo: int, hi: int, exc: BaseException
    ) -> pa.RecordBatch | None:
        """A row group that does not decode (the file checked, its bytes read twice): raise, or skip it.

        Returns a stand-in of its live rows, or ``None``.

        Raises:
            BadDataError: with ``on_bad_data='raise'``.
        """
        # Live rows: deletes (and a counted filter's dropped rows, among them) taken out.
        exact = self._scan.filters is None or self._scan.filter_counted
        lost = (hi - lo) - info.deleted_in(lo, hi) if exact else 0
        unit = BadUnit(info.path, "row_group", g.index, (g.first_row, g.stop_row), None, describe(exc), lost)
        reading = f"Iceberg data file {info.path!r} rows [{chunk.start}, {chunk.stop})"
        return self._bad.resolve(
            unit, exc, reading=reading, padding=chunk.padding, schema=self._scan.output_schema
        )

    def _confirm(self, info: IcebergFileInfo) -> None:
        """Raise :class:`FileChangedError` if the data file is gone or its size changed."""
        import pyarrow.fs as pafs

        filesystem, inner = self._scan.fs.resolve(info.path)
        try:
            found = filesystem.get_file_info(inner)
        except OSError:
            return  # the storage cannot say: the decoder's error stands
        if found.type == pafs.FileType.NotFound:
            raise FileChangedError(
                f"Iceberg data file {info.path!r} no longer exists; the table changed since the dataset "
                "was built (an expired snapshot?): build the dataset again"
            )
        check_size(info.path, info.size, int(found.size or 0))

    def _read_orc(self, info: IcebergFileInfo, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        import pyarrow.orc as po

        log_once("orc:" + info.path, "Iceberg ORC data file %s is read whole (columns by name)", info.path)
        if chunk.unit is ChunkUnit.ROWS and (chunk.start, chunk.stop) != (0, info.num_rows):
            raise ReadError(
                f"ORC data file {info.path!r} can only be read whole; got rows [{chunk.start}, {chunk.stop})"
            )
        filesystem, inner = self._scan.fs.resolve(info.path)
        with filesystem.open_input_file(inner) as handle:
            check_size(info.path, info.size, handle.size())
            table = po.ORCFile(handle).read()
        names = self._scan.read_columns
        ids = orc_field_ids(table.schema, self._scan.name_mapping)
        table = table.select([ids[self._by_name[n][0]] for n in names if self._by_name[n][0] in ids])
        out = self._finish(table, info, names, ids, 0)
        if out.num_rows:
            yield from out.to_batches()

    def _finish(
        self,
        batch: pa.Table,
        info: IcebergFileInfo,
        names: tuple[str, ...],
        ids: Mapping[int, str],
        first_pos: int,
    ) -> pa.Table:
        """Columns by field id, then deleted positions, filter, projection."""
        n = batch.num_rows
        constants = dict(self._scan.constants.get(info.path, ()))
        arrays = []
        for name in names:
            fid, type_ = self._by_name[name]
            arrays.append(column_by_id(batch, n, fid, type_, ids, constants))
        out = pa.Table.from_arrays(arrays, names=list(names))
        deleted = info.deleted_between(first_pos, first_pos + n)
        if len(deleted):
            keep = np.ones(n, dtype=bool)
            keep[deleted - first_pos] = False
            out = out.filter(pa.array(keep))
        if self._scan.filters is not None and out.num_rows:
            out = out.filter(self._scan.filters)
        if out.schema.names != list(self._scan.output_columns):
            out = out.select(list(self._scan.output_columns))
        return out
