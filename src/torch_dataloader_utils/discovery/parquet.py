"""Parquet metadata: footers read concurrently, row groups pruned with statistics."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from torch_dataloader_utils.discovery.listing import ListedFile
from torch_dataloader_utils.discovery.partitions import Partitions
from torch_dataloader_utils.errors import CorruptFileError
from torch_dataloader_utils.io.fs import FileSystemSpec
from torch_dataloader_utils.plan.types import FileInfo, RowGroup

__all__ = ["FooterInfo", "read_footers", "METADATA_THREADS"]

METADATA_THREADS = 16
"""Footers read at once (bounded thread pool)."""


@dataclass(frozen=True)
class FooterInfo:
    """What one footer tells: the file (with every row group) and its Arrow schema."""

    file: FileInfo
    schema: pa.Schema
    fragment: Any  # pyarrow.dataset.ParquetFileFragment


def _read_one(fs: FileSystemSpec, listed: ListedFile, partitions: Partitions | None) -> FooterInfo:
    fmt = ds.ParquetFileFormat()
    pexpr = partitions.expression(listed.path) if partitions is not None else None
    try:
        frag: Any = fmt.make_fragment(listed.path, filesystem=fs.arrow(), partition_expression=pexpr)
        frag.ensure_complete_metadata()
        meta = frag.metadata
        schema = frag.physical_schema
    except (OSError, pa.ArrowException) as exc:
        raise CorruptFileError(
            f"cannot read the Parquet footer of {fs.display(listed.path)!r} ({exc}); "
            "is it a Parquet file? Remove it from path or pass format= for its real format"
        ) from exc
    groups = []
    first = 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        nbytes = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        groups.append(RowGroup(i, first, rg.num_rows, nbytes))
        first += rg.num_rows
    info = FileInfo(listed.path, listed.size, meta.num_rows, tuple(groups), listed.mtime)
    return FooterInfo(info, schema, frag)


def read_footers(
    fs: FileSystemSpec, files: Sequence[ListedFile], partitions: Partitions | None
) -> list[FooterInfo]:
    """Every file's footer, read concurrently, in the order of ``files``.

    Raises:
        CorruptFileError: naming the first file whose footer cannot be read.
    """
    if len(files) <= 1:
        return [_read_one(fs, f, partitions) for f in files]
    with ThreadPoolExecutor(max_workers=min(METADATA_THREADS, len(files))) as pool:
        return list(pool.map(lambda f: _read_one(fs, f, partitions), files))


def prune(footer: FooterInfo, filters: pc.Expression, schema: pa.Schema) -> FileInfo:
    """The file with only the row groups whose statistics (or partition) may match."""
    kept = {g.id for g in footer.fragment.subset(filters, schema=schema).row_groups}
    f = footer.file
    assert f.row_groups is not None
    groups = tuple(g for g in f.row_groups if g.index in kept)
    return FileInfo(f.path, f.size, f.num_rows, groups, f.mtime)
