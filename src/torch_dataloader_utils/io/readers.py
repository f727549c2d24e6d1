"""Choosing the reader of a discovered dataset by its format."""

from __future__ import annotations

from torch_dataloader_utils.config import FileFormat
from torch_dataloader_utils.discovery.dataset import Discovered
from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.parquet import ParquetReader

__all__ = ["make_reader"]


def make_reader(found: Discovered, batch_size: int) -> ChunkReader:
    """The :class:`ChunkReader` for ``found.format``."""
    files = {f.path: f for f in found.files}
    if found.format is FileFormat.PARQUET:
        return ParquetReader(
            found.fs,
            files,
            data_columns=found.data_columns,
            output_columns=found.output_columns,
            partitions=found.partitions,
            partition_columns=found.partition_columns,
            filters=found.filters,
            batch_size=batch_size,
        )
    raise ConfigError(f"format={found.format.value!r} has no reader yet")
