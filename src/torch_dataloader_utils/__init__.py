"""torch_dataloader_utils: structured data (Parquet, ...) into PyTorch, sharded exactly once.

Quick start::

    from torch_dataloader_utils import StructuredDataset

    loader, dataset = StructuredDataset.create_dataloader(
        path="data/train/", format="parquet", batch_size=1024, num_workers=2, shuffle=True
    )
    for epoch in range(3):
        dataset.set_epoch(epoch)
        for batch in loader:  # dict[str, torch.Tensor]
            ...
"""

from torch_dataloader_utils.config import FileFormat, OutputFormat, SplitKind
from torch_dataloader_utils.errors import (
    ConfigError,
    ConversionError,
    CorruptFileError,
    DataLoaderUtilsError,
    DiscoveryError,
    DistributedConfigError,
    IncompatibleOptionsError,
    NoFilesFoundError,
    NullValueError,
    OverlappingChunksError,
    PathNotFoundError,
    PlanError,
    ReadError,
    SchemaError,
    SchemaMismatchError,
    UnknownColumnError,
)
from torch_dataloader_utils.plan.splits import LegacySplitStrategy, SplitStrategy
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, EpochPlan, FileInfo, RowGroup, World
from torch_dataloader_utils.runtime.dataset import StructuredDataset
from torch_dataloader_utils.runtime.loader import create_dataloader

__version__ = "0.1.0"

__all__ = [
    "Chunk",
    "ChunkUnit",
    "ConfigError",
    "ConversionError",
    "CorruptFileError",
    "DataLoaderUtilsError",
    "DiscoveryError",
    "DistributedConfigError",
    "EpochPlan",
    "FileFormat",
    "FileInfo",
    "IncompatibleOptionsError",
    "LegacySplitStrategy",
    "NoFilesFoundError",
    "NullValueError",
    "OutputFormat",
    "OverlappingChunksError",
    "PathNotFoundError",
    "PlanError",
    "ReadError",
    "RowGroup",
    "SchemaError",
    "SchemaMismatchError",
    "SplitKind",
    "SplitStrategy",
    "StructuredDataset",
    "UnknownColumnError",
    "World",
    "create_dataloader",
]
