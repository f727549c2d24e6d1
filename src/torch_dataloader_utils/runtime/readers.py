"""Choosing the reader of a discovered dataset by its format."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from torch_dataloader_utils.config import FetchConfig, FileFormat
from torch_dataloader_utils.discovery.dataset import Discovered
from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.orc import OrcReader
from torch_dataloader_utils.io.parquet import ParquetReader
from torch_dataloader_utils.io.prefetch import ChunkSource
from torch_dataloader_utils.io.text import TextReader

__all__ = ["make_reader"]


def make_reader(found: Discovered, batch_size: int, fetch: FetchConfig | None = None) -> ChunkReader:
    """The :class:`ChunkReader` for ``found.format``.

    Files on remote storage are read through a :class:`ChunkSource` (ranged reads of the
    needed columns, read-ahead, retries); local files are opened directly.
    """
    files = {f.path: f for f in found.files}
    # What every reader needs: which columns to read and how to finish a batch.
    common: dict[str, Any] = {
        "data_columns": found.data_columns,
        "output_columns": found.output_columns,
        "partitions": found.partitions,
        "partition_columns": found.partition_columns,
        "filters": found.filters,
        "batch_size": batch_size,
    }
    if found.format is FileFormat.PARQUET:
        source = None
        if not found.fs.is_local:
            source = ChunkSource(
                found.fs,
                files,
                columns=found.data_columns,
                footers=found.extra.get("parquet_footers"),
                config=fetch,
            )
        return ParquetReader(
            found.fs,
            files,
            **common,
            source=source,
            filtered_positions=bool(found.extra.get("filtered_positions", False)),
        )
    if found.format is FileFormat.ORC:
        return OrcReader(found.fs, files, **common)
    if found.format in (FileFormat.CSV, FileFormat.JSONL):
        options = found.extra["text_options"]
        part_names = set(found.partitions.schema.names) if found.partitions is not None else set()
        data_schema = pa.schema([f for f in found.schema if f.name not in part_names])
        return TextReader(
            found.fs,
            files,
            found.extra["text_meta"],
            format=found.format,
            schema=data_schema,
            **common,
            quoted_newlines=options.quoted_newlines,
            strict_fields=options.schema is None,
        )
    raise ConfigError(f"format={found.format.value!r} has no reader yet")
