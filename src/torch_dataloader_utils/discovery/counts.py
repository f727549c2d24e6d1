"""Exact row counts under a row filter: a count pass over the filter's columns only.

Equal batches need every chunk's exact row count before reading. A row filter drops
rows inside row groups, so the counts from the footers are only upper bounds. This
pass reads, for every unpruned row group, only the columns the filter needs, and
counts the rows that pass. The files it returns count rows in *filtered
coordinates*: a row's position is its rank among the file's passing rows, so a chunk
``[a, b)`` holds exactly ``b - a`` passing rows and can be cut at any of them. The
Parquet reader reads such chunks by filtering each row group first and slicing after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from torch_dataloader_utils.discovery.partitions import Partitions
from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.plan.types import FileInfo, RowGroup
from torch_dataloader_utils.storage.fs import FileSystemSpec

__all__ = ["COUNT_THREADS", "count_filtered_rows"]

COUNT_THREADS = 8
"""Files counted at once."""


def _count_file(
    fs: FileSystemSpec,
    file: FileInfo,
    filters: pc.Expression,
    data_columns: Sequence[str],
    partitions: Partitions | None,
    partition_columns: Sequence[str],
    footer: bytes | None,
) -> FileInfo:
    groups = file.row_groups or ()
    if not groups:
        return FileInfo(file.path, file.size, 0, (), file.mtime, etag=file.etag)
    try:
        # The footer discovery already read: opening the file does not fetch it again.
        meta = pq.read_metadata(pa.BufferReader(footer)) if footer is not None else None
        pf = pq.ParquetFile(file.path, filesystem=fs.arrow(), metadata=meta)
        kept: list[RowGroup] = []
        first = 0
        for g in groups:
            table = pf.read_row_group(g.index, columns=list(data_columns), use_threads=False)
            if table.num_columns == 0:  # a filter on partition columns only
                table = pa.table({"__rows": pa.nulls(g.num_rows, pa.int8())})
            if partition_columns and partitions is not None:
                for name, array in partitions.columns(file.path, table.num_rows, partition_columns):
                    table = table.append_column(name, array)
            passing = table.filter(filters).num_rows
            if passing:
                kept.append(RowGroup(g.index, first, passing, g.num_bytes))
                first += passing
    except (OSError, pa.ArrowException) as exc:
        raise ReadError(
            f"counting the rows of {fs.display(file.path)!r} that pass filters={filters} failed: {exc}"
        ) from exc
    return FileInfo(file.path, file.size, first, tuple(kept), file.mtime, etag=file.etag)


def count_filtered_rows(
    fs: FileSystemSpec,
    files: Sequence[FileInfo],
    filters: pc.Expression,
    *,
    filter_columns: Sequence[str],
    partitions: Partitions | None,
    partition_columns: Sequence[str],
    footers: Mapping[str, bytes | None] | None = None,
) -> tuple[FileInfo, ...]:
    """The files in filtered coordinates, with the exact passing rows of each row group.

    Args:
        fs: The filesystem.
        files: Parquet files with their unpruned row groups (file coordinates).
        filters: The row filter.
        filter_columns: File columns the filter reads (only these are read).
        partitions: Partition values, when the filter reads partition columns.
        partition_columns: Partition columns the filter reads.
        footers: Footer bytes discovery already read, by path (not fetched again).

    Returns:
        One file per input, row groups without passing rows left out.
    """
    footers = footers or {}
    with ThreadPoolExecutor(max_workers=max(1, min(COUNT_THREADS, len(files)))) as pool:
        return tuple(
            pool.map(
                lambda f: _count_file(
                    fs, f, filters, filter_columns, partitions, partition_columns, footers.get(f.path)
                ),
                files,
            )
        )
