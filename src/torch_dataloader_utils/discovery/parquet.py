"""Parquet metadata: footers read concurrently, row groups pruned with statistics."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.discovery.listing import ListedFile
from torch_dataloader_utils.discovery.partitions import Partitions
from torch_dataloader_utils.errors import CorruptFileError
from torch_dataloader_utils.plan.types import FileInfo, RowGroup
from torch_dataloader_utils.storage.footers import NotParquetError, read_footer
from torch_dataloader_utils.storage.fs import FileSystemSpec

__all__ = ["FooterInfo", "read_footers", "METADATA_THREADS"]

METADATA_THREADS = 64
"""Footers read at once (bounded thread pool). Each is one ranged request, mostly
waiting on the network: 2,000 footers at 10 ms each take about 0.3 s with 64."""


@dataclass(frozen=True)
class FooterInfo:
    """What one footer tells: the file (with every row group) and its Arrow schema.

    Plain values (picklable), so one rank can read the footers and send them to all.

    Attributes:
        file: The file with all its row groups.
        schema: Its Arrow schema.
        footer: The footer as a small Parquet buffer (see ``io.prefetch.read_footer``);
            ``None`` for ORC files.
        partition_expression: The file's partition values, for pruning.
    """

    file: FileInfo
    schema: pa.Schema
    footer: bytes | None
    partition_expression: pc.Expression | None = None

    def fragment(self) -> Any:
        """A ``ParquetFileFragment`` over the footer alone (statistics, no data)."""
        if self.footer is None:
            raise ValueError(f"{self.file.path!r} has no Parquet footer")
        frag: Any = ds.ParquetFileFormat().make_fragment(
            pa.BufferReader(self.footer),  # type: ignore[arg-type]
            partition_expression=self.partition_expression,
        )
        frag.ensure_complete_metadata()
        return frag


def row_groups(meta: pq.FileMetaData) -> tuple[RowGroup, ...]:
    """Every row group of a Parquet footer: first row, rows and compressed bytes."""
    groups = []
    first = 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        nbytes = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        groups.append(RowGroup(i, first, rg.num_rows, nbytes))
        first += rg.num_rows
    return tuple(groups)


def _read_one(
    fs: FileSystemSpec, listed: ListedFile, partitions: Partitions | None, fetch: FetchConfig
) -> FooterInfo:
    pexpr = partitions.expression(listed.path) if partitions is not None else None
    try:
        footer = read_footer(fs, listed.path, listed.size, fetch)
        meta = pq.read_metadata(pa.BufferReader(footer))
        schema = meta.schema.to_arrow_schema()
    except (NotParquetError, OSError, pa.ArrowException) as exc:
        raise CorruptFileError(
            f"cannot read the Parquet footer of {fs.display(listed.path)!r} ({exc}); "
            "is it a Parquet file? Remove it from path or pass format= for its real format"
        ) from exc
    info = FileInfo(listed.path, listed.size, meta.num_rows, row_groups(meta), listed.mtime)
    return FooterInfo(info, schema, footer, pexpr)


def read_footers(
    fs: FileSystemSpec,
    files: Sequence[ListedFile],
    partitions: Partitions | None,
    fetch: FetchConfig | None = None,
) -> list[FooterInfo]:
    """Every file's footer, each in one ranged request, concurrently, in the order of ``files``.

    Raises:
        CorruptFileError: naming the first file whose footer cannot be read.
        ReadError: a footer could not be fetched (retries spent); file and range named.
    """
    config = fetch or FetchConfig()
    if len(files) <= 1:
        return [_read_one(fs, f, partitions, config) for f in files]
    with ThreadPoolExecutor(max_workers=min(METADATA_THREADS, len(files))) as pool:
        return list(pool.map(lambda f: _read_one(fs, f, partitions, config), files))


def prune(footer: FooterInfo, filters: pc.Expression, schema: pa.Schema) -> FileInfo:
    """The file with only the row groups whose statistics (or partition) may match."""
    kept = {g.id for g in footer.fragment().subset(filters, schema=schema).row_groups}
    f = footer.file
    assert f.row_groups is not None
    groups = tuple(g for g in f.row_groups if g.index in kept)
    return FileInfo(f.path, f.size, f.num_rows, groups, f.mtime)
