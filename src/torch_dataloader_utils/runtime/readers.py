"""Choosing the reader of a discovered dataset by its format."""

from __future__ import annotations

import pyarrow as pa

from torch_dataloader_utils.config import BadDataConfig, CacheConfig, FetchConfig, FileFormat
from torch_dataloader_utils.discovery.dataset import Discovered
from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.io.base import ChunkReader, ReadRequest
from torch_dataloader_utils.io.orc import OrcReader
from torch_dataloader_utils.io.parquet import ParquetReader
from torch_dataloader_utils.io.prefetch import ChunkSource
from torch_dataloader_utils.io.text import TextReader

__all__ = ["make_reader"]


def make_reader(
    found: Discovered,
    batch_size: int,
    fetch: FetchConfig | None = None,
    *,
    cache: CacheConfig | None = None,
    bad_data: BadDataConfig | None = None,
) -> ChunkReader:
    """The :class:`ChunkReader` for ``found.format``.

    Files on remote storage are read through a :class:`ChunkSource` (ranged reads of the
    needed columns, read-ahead, retries); local files are opened directly. ``cache``: the
    node-local ``data_cache`` every remote read goes through; ``bad_data``: what readers
    do with units that do not decode.
    """
    request = ReadRequest(
        fs=found.fs,
        files=found.table if found.table is not None else {f.path: f for f in found.files},
        data_columns=found.data_columns,
        output_columns=found.output_columns,
        batch_size=batch_size,
        partitions=found.partitions,
        partition_columns=found.partition_columns,
        filters=found.filters,
        output_schema=found.output_schema,
        manifest=found.manifest,
        cache=cache,
        fetch=fetch,
        bad_data=bad_data,
    )
    if found.format is FileFormat.PARQUET:
        filtered = found.filtered_positions
        source = None
        if not found.fs.is_local:
            source = ChunkSource(
                found.fs,
                request.files,
                columns=found.data_columns,
                footers=found.footers,
                config=fetch,
                filtered=filtered,
                manifest=found.manifest,
                reads=request.reads(),
            )
        return ParquetReader(request, source=source, filtered_positions=filtered)
    if found.format is FileFormat.ORC:
        return OrcReader(request)
    if found.format in (FileFormat.CSV, FileFormat.JSONL):
        options, meta = found.text_options, found.text_meta
        if options is None or meta is None:
            raise ConfigError(f"format={found.format.value!r} was discovered without its text metadata")
        part_names = set(found.partitions.schema.names) if found.partitions is not None else set()
        data_schema = pa.schema([f for f in found.schema if f.name not in part_names])
        return TextReader(
            request,
            meta,
            format=found.format,
            schema=data_schema,
            quoted_newlines=options.quoted_newlines,
            strict_fields=options.schema is None,
            inferred=options.schema is None,
        )
    raise ConfigError(f"format={found.format.value!r} has no reader yet")
