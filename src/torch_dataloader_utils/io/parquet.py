"""Reading Parquet chunks: only the chunk's unpruned row groups and the needed columns."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.io.bad import BadUnit, confirm_unchanged, decode_again, describe
from torch_dataloader_utils.io.base import OpenFiles, ReaderBase, ReaderCounts, ReadRequest
from torch_dataloader_utils.io.prefetch import ChunkSource, FetchStats, column_ranges
from torch_dataloader_utils.plan.types import Chunk, FileInfo, RowGroup
from torch_dataloader_utils.storage.cached import RangeFile
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.handles import too_many_open_files
from torch_dataloader_utils.storage.identity import FileChecks, check_footer, stale_advice

__all__ = ["READ_BATCH_BYTES", "READ_BATCH_ROWS", "ParquetReader", "read_rows"]


READ_BATCH_ROWS = 65536
"""Rows per read (pyarrow's own default), or ``batch_size`` when larger.

Reading in small batches costs pyarrow a per-batch overhead (several times the decode
cost at 1024 rows with threads); :func:`~torch_dataloader_utils.io.batching.rebatch`
cuts the large batches into exact ``batch_size`` batches as zero-copy slices.
"""

READ_BATCH_BYTES = 8 << 20
"""At most about this many decoded bytes per read, but never fewer than ``batch_size`` rows.

:data:`READ_BATCH_ROWS` alone made a read of long rows large: 65,536 documents of 1,024
tokens are 256 MiB decoded, so packing held 6x the memory of a numpy packer reading the
same files (``compare.py``, ``pack``). Short rows (S1's 9 numbers: 72 bytes) still read
65,536 at a time. What a reader holds is then bounded: the column chunks of the row
group being decoded (pyarrow reads them whole) and, besides the batch being converted,
``AHEAD_ITEMS`` decoded reads of about this size.
"""

_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def read_rows(
    metadata: pq.FileMetaData, group: int, columns: Sequence[str] | None, most: int, least: int
) -> int:
    """Rows per read of row group ``group``: ``most``, fewer for long rows (see :data:`READ_BATCH_BYTES`).

    The decoded size of a row is estimated from the footer, for the columns read: a
    fixed-width value as its width times the values (dictionary or run-length encoding
    makes the encoded size smaller), others as their uncompressed encoded size.
    """
    meta = metadata.row_group(group)
    if meta.num_rows <= 0:
        return most
    wanted = None if columns is None else set(columns)
    decoded = 0
    for j in range(meta.num_columns):
        column = meta.column(j)
        if wanted is not None and column.path_in_schema.split(".")[0] not in wanted:
            continue
        width = _WIDTH.get(column.physical_type, 0)
        decoded += max(column.total_uncompressed_size, width * column.num_values)
    per_row = decoded / meta.num_rows
    return most if per_row <= 0 else max(least, min(most, int(READ_BATCH_BYTES // per_row) or 1))


class ParquetReader(ReaderBase):
    """A :class:`ChunkReader` for Parquet files.

    Batches are read with :data:`READ_BATCH_ROWS` rows (or ``batch_size`` when larger);
    the caller re-batches. A chunk ``[start, stop)`` reads the unpruned row groups
    overlapping it; a group only
    partly inside is read and sliced, so chunks may be cut at any row. Partition values
    are added as constant columns before the row filter, and the result is projected to
    the output columns. Filesystem clients are built lazily in the reading process.

    A row group that does not decode is decoded again from its bytes read again from
    storage (:func:`~torch_dataloader_utils.io.bad.decode_again`); when that fails too it
    raises :class:`BadDataError` naming it, or, with ``on_bad_data='skip'`` /
    ``'quarantine'``, is replaced by a stand-in of its rows in the chunk
    (:mod:`~torch_dataloader_utils.io.bad`); row groups are then decoded one at a time.
    Page checksums (CRC-32), where the writer wrote them, are verified.
    """

    def __init__(
        self,
        request: ReadRequest,
        *,
        use_threads: bool = True,
        source: ChunkSource | None = None,
        filtered_positions: bool = False,
    ) -> None:
        self._fs = request.fs
        self._files = request.files
        self._data_columns = list(request.data_columns)
        self._filters = request.filters
        self._finisher = request.finisher()
        self._batch_size = request.batch_size
        self._read_rows = max(request.batch_size, READ_BATCH_ROWS)
        self._use_threads = use_threads
        # Files counted by discovery.counts: row positions count only rows that pass the
        # filter, so a row group is filtered first and sliced after.
        self._filtered_positions = filtered_positions
        self._manifest = request.manifest
        # Local files, kept open (the opener holds no reference to this reader, so the
        # files close as soon as the dataset is deleted).
        self._open = OpenFiles(
            functools.partial(
                _open_checked,
                request.fs,
                request.files,
                filtered_positions,
                request.manifest,
                tuple(request.data_columns),
            )
        )
        # Never read a rewritten file.
        self._checks = FileChecks(request.fs, request.files, manifest=request.manifest)
        # Remote files: bytes come from the source (read-ahead, retries); see io/prefetch.py.
        self._source = source
        self._local_stats = FetchStats()
        self._bad = request.bad()
        self._reads = source.reads if source is not None else request.reads()
        self._schema = request.output_schema
        # Positions count rows before the filter (no filter) or after a counted one: a
        # skipped group's stand-in then has its rows; else (an uncounted filter) none.
        self._exact = request.filters is None or filtered_positions
        self._private_files = False  # see for_threads

    def use_threads(self, on: bool) -> None:
        """Decode with Arrow's thread pool (``True``, the default) or in the calling thread.

        A DataLoader worker whose rank's workers already fill the CPUs reads without
        threads: the pool's hand-offs then only cost time (measured in docs/benchmarks.md).
        """
        self._use_threads = on

    def with_read_rows(self, rows: int) -> ParquetReader:
        """This reader decoding batches of ``rows`` rows (``batch_size`` when larger).

        Used for row mixing, where several chunks are read side by side: smaller decoded
        batches keep the rows held at once (and fresh allocations) small.
        """
        narrow = copy.copy(self)
        narrow._read_rows = max(self._batch_size, rows)
        return narrow

    def schedule(self, chunks: Sequence[Chunk]) -> None:
        """Announce the chunks this process reads next, in order (remote read-ahead).

        Remote files are checked against the plan by the source, as it fetches them.
        """
        if self._source is not None:
            self._source.schedule(chunks)
        else:
            self._checks.schedule(c.path for c in chunks)

    def warm(self, chunks: Sequence[Chunk]) -> None:
        """Fetch ``chunks`` into the node-local cache while the fetch threads are idle (next epoch)."""
        if self._source is not None:
            self._source.warm(chunks)

    @property
    def decodes_in_threads(self) -> bool:
        """Whether several chunks may be decoded at once on other threads (local files).

        Remote files come through the read-ahead fetcher, in the order it was given.
        Use the reader :meth:`for_threads` returns.
        """
        return self._source is None

    def for_threads(self) -> ParquetReader:
        """This reader, each chunk read through a file reader of its own.

        pyarrow's ``ParquetFile`` is not safe to iterate from two threads at once (its
        read cache is shared: "ReadRangeCache did not find matching cache entry"), and
        two streams of a mix may read one file. A chunk's reader shares the cached
        file's parsed footer, so the footer is not read again.
        """
        own = copy.copy(self)
        own._private_files = True
        return own

    @property
    def fetches_ahead(self) -> bool:
        """Whether bytes come from remote storage through a read-ahead fetcher (thread pool)."""
        return self._source is not None

    def io_totals(self) -> tuple[int, int, int, int, float]:
        """``(bytes_fetched, bytes_needed, requests, retries, wait_sec)`` of this process so far.

        Remote files: what the :class:`ChunkSource` fetched. Local files: the column
        chunks read (fetched = needed; no requests; waiting for the disk is part of decoding).
        """
        stats = self._source.stats if self._source is not None else self._local_stats
        return stats.totals()

    def counts(self) -> ReaderCounts:
        """This reader's ``data_cache`` reads and skipped data in this process so far."""
        return ReaderCounts.of(self._reads, self._bad)

    def read(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """Yield the chunk's rows (filtered, projected) in file order."""
        info = self._files[chunk.path]
        groups = info.groups_in(chunk.start, chunk.stop)
        if not groups:
            return
        pf: pq.ParquetFile | None = None
        own: pq.ParquetFile | None = None  # this read's own file reader (for_threads), closed after
        try:
            if self._source is not None:
                pf = self._source.open(chunk)  # the source checks the file (see ChunkSource._read)
            else:
                self._checks.check(chunk.path, info.size, info.mtime)
                pf = self._open.get(chunk.path)
                if self._private_files:
                    pf = own = pq.ParquetFile(
                        chunk.path,
                        filesystem=self._fs.arrow(),
                        metadata=pf.metadata,
                        page_checksum_verification=True,
                    )
                needed = column_ranges(pf.metadata, [g.index for g in groups], self._data_columns)
                nbytes = sum(hi - lo for lo, hi in needed)
                self._local_stats.read(nbytes, nbytes)
            whole = all(chunk.start <= g.first_row and g.stop_row <= chunk.stop for g in groups)
            if self._filtered_positions or self._bad.skipping or not whole:
                yield from self._by_group(pf, chunk, groups)
                return
            done = 0  # rows of the chunk decoded (before the filter)
            raw = pf.iter_batches(
                batch_size=read_rows(
                    pf.metadata, groups[0].index, self._data_columns, self._read_rows, self._batch_size
                ),
                row_groups=[g.index for g in groups],
                columns=self._data_columns,
                use_threads=self._use_threads,
            )
            try:
                for batch in raw:
                    yield self._finish(batch, chunk.path)
                    done += batch.num_rows
            except MemoryError:
                raise
            except (OSError, pa.ArrowException) as exc:
                if too_many_open_files(exc) is not None:
                    raise
                # A group did not decode: the rest of the chunk one group at a time, each
                # that fails decoded again from its bytes read again, or named.
                yield from self._by_group(pf, chunk, groups, skip=done)
        except MemoryError:
            raise  # a unit that does not fit in memory is not bad data, nor a read error
        except (OSError, pa.ArrowException) as exc:
            descriptors = too_many_open_files(exc)
            raise ReadError(
                f"reading {self._fs.display(chunk.path)!r} rows [{chunk.start}, {chunk.stop}) failed: {exc}"
                + ("" if descriptors is None else f": {descriptors}")
            ) from exc
        finally:
            if own is not None:
                own.close()

    def _by_group(
        self, pf: pq.ParquetFile, chunk: Chunk, groups: Sequence[RowGroup], skip: int = 0
    ) -> Iterator[pa.RecordBatch]:
        """The chunk's rows decoded one row group at a time; a group that does not decode is handled.

        ``skip``: rows of the chunk already read (before any filter): reading goes on
        after them. A group that does not decode is decoded again from its bytes read
        again (:func:`decode_again`); when that fails too, it is bad data.
        """
        begin = chunk.start + skip
        for g in groups:
            if g.stop_row <= begin:
                continue
            lo = max(begin, g.first_row) - g.first_row
            hi = min(chunk.stop, g.stop_row) - g.first_row
            try:
                table = pf.read_row_group(g.index, columns=self._data_columns, use_threads=self._use_threads)
            except MemoryError:
                raise
            except (OSError, pa.ArrowException) as exc:
                if too_many_open_files(exc) is not None:
                    raise
                what = f"row group {g.index} of {self._fs.display(chunk.path)!r}"
                again = decode_again(
                    exc,
                    lambda: self._fresh(chunk.path),
                    self._again(pf, g),
                    what,
                    self._unchanged(chunk.path),
                )
                if isinstance(again, BaseException):
                    standin = self._bad_group(pf, chunk, g, hi - lo, again)
                    if standin is not None:
                        yield standin
                    continue
                table = again
            if self._filtered_positions:
                yield from self._filtered_group(table, chunk, g, lo, hi)
                continue
            for batch in table.slice(lo, hi - lo).to_batches(max_chunksize=self._read_rows):
                yield self._finish(batch, chunk.path)

    def _filtered_group(
        self, table: pa.Table, chunk: Chunk, g: RowGroup, lo: int, hi: int
    ) -> Iterator[pa.RecordBatch]:
        """Rows ``[lo, hi)`` of a group in filtered coordinates (see discovery.counts)."""
        parts = [self._finish(b, chunk.path) for b in table.to_batches(max_chunksize=self._batch_size)]
        passing = sum(b.num_rows for b in parts)
        if passing != g.num_rows:
            raise ReadError(
                f"row group {g.index} of {self._fs.display(chunk.path)!r} has {passing} rows passing "
                f"filters={self._filters} but {g.num_rows} were counted when the dataset was built; "
                f"the file changed since then: {stale_advice(self._manifest)}"
            )
        if lo == 0 and hi == g.num_rows:
            yield from parts
        elif parts:
            kept = pa.Table.from_batches(parts).slice(lo, hi - lo)
            yield from kept.to_batches(max_chunksize=self._batch_size)

    # -- data that does not decode -------------------------------------------------------
    def _unit(self, pf: pq.ParquetFile, path: str, g: RowGroup, exc: BaseException, lost: int) -> BadUnit:
        spans = column_ranges(pf.metadata, [g.index], None)
        where = (spans[0][0], max(hi for _, hi in spans)) if spans else None
        rows = None if self._filtered_positions else (g.first_row, g.stop_row)
        return BadUnit(self._fs.display(path), "row_group", g.index, rows, where, describe(exc), lost)

    def _bad_group(
        self, pf: pq.ParquetFile, chunk: Chunk, g: RowGroup, rows: int, exc: BaseException
    ) -> pa.RecordBatch | None:
        """A row group that does not decode (the file checked, its bytes read twice): raise, or skip it.

        Returns its stand-in, or ``None``.

        Raises:
            BadDataError: with ``on_bad_data='raise'``.
        """
        unit = self._unit(pf, chunk.path, g, exc, rows if self._exact else 0)
        reading = f"{self._fs.display(chunk.path)!r} rows [{chunk.start}, {chunk.stop})"
        return self._bad.resolve(unit, exc, reading=reading, padding=chunk.padding, schema=self._schema)

    def _unchanged(self, path: str) -> Callable[[], None]:
        """Raises :class:`FileChangedError` when ``path`` is no longer the planned file."""
        return functools.partial(confirm_unchanged, self._fs, path, self._files[path], self._manifest)

    def _fresh(self, path: str) -> RangeFile:
        info = self._files[path]
        return self._reads.fresh(path, size=info.size, version=info.mtime)

    def _again(self, pf: pq.ParquetFile, g: RowGroup) -> Callable[[Any], pa.Table]:
        """Decodes row group ``g`` from a file read again (the footer of ``pf``, checked already)."""
        metadata, columns = pf.metadata, self._data_columns

        def decode(file: Any) -> pa.Table:
            fresh = pq.ParquetFile(file, metadata=metadata, pre_buffer=False, page_checksum_verification=True)
            return fresh.read_row_group(g.index, columns=columns, use_threads=False)

        return decode

    def _finish(self, batch: pa.RecordBatch, path: str) -> pa.RecordBatch:
        return self._finisher(batch, path)


def _open_checked(
    fs: FileSystemSpec,
    files: Mapping[str, FileInfo],
    filtered: bool,
    manifest: str | None,
    columns: Sequence[str],
    path: str,
) -> pq.ParquetFile:
    """Open a local Parquet file and check its footer against the plan (:func:`check_footer`)."""
    pf = pq.ParquetFile(path, filesystem=fs.arrow(), page_checksum_verification=True)
    try:
        shown = fs.display(path)
        check_footer(shown, files[path], pf.metadata, filtered=filtered, manifest=manifest, columns=columns)
    except BaseException:
        pf.close()
        raise
    return pf
