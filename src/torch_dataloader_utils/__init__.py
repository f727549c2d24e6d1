"""torch_dataloader_utils: Parquet, ORC, CSV, JSONL and Iceberg into PyTorch, sharded exactly once.

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

import importlib
from typing import TYPE_CHECKING, Any

from torch_dataloader_utils.compat import (
    DataFileInfo,
    IcebergDataFileInfo,
    RoundRobinSplitStrategy,
    SizeBalancedSplitStrategy,
    Split,
    TargetSizeSplitStrategy,
)
from torch_dataloader_utils.config import (
    BadDataPolicy,
    EqualBatches,
    FeaturePack,
    FileFormat,
    OnExhausted,
    OutputFormat,
    RaggedLayout,
    SequencePack,
    SplitKind,
    StringLayout,
)
from torch_dataloader_utils.errors import (
    BadDataError,
    CheckpointMismatchError,
    ConfigError,
    ConversionError,
    CorruptFileError,
    DataLoaderUtilsError,
    DestinationConflictError,
    DiscoveryError,
    DistributedConfigError,
    FileChangedError,
    IncompatibleOptionsError,
    InferredSchemaError,
    LedgerError,
    MissingDependencyError,
    NoFilesFoundError,
    NullValueError,
    OptionTypeError,
    OverlappingChunksError,
    PathNotFoundError,
    PlanError,
    RankFailedError,
    ReadError,
    RecordBoundaryError,
    ReshardError,
    ResumeStateError,
    SchemaError,
    SchemaMismatchError,
    SourceChangedError,
    StateMismatchError,
    UnknownColumnError,
    UnknownLengthError,
    UnknownOptionError,
)
from torch_dataloader_utils.plan.schedule import MixSchedule, ScheduleUnit, Stage
from torch_dataloader_utils.plan.splits import LegacySplitStrategy, SplitStrategy
from torch_dataloader_utils.plan.state import merge_states
from torch_dataloader_utils.plan.types import (
    Chunk,
    ChunkUnit,
    EpochPlan,
    FileInfo,
    RecordIndex,
    RowGroup,
    World,
)

if TYPE_CHECKING:
    from torch_dataloader_utils.convert import FlatList, PaddedList
    from torch_dataloader_utils.packing import batch_cu_seqlens
    from torch_dataloader_utils.runtime.checkpoint import GatheredState
    from torch_dataloader_utils.runtime.files import StructuredDataset, create_dataloader
    from torch_dataloader_utils.runtime.iceberg import IcebergDataset
    from torch_dataloader_utils.runtime.loader import ResumableDataLoader
    from torch_dataloader_utils.runtime.metrics import (
        LoaderMetrics,
        RankMetrics,
        WorkerMetrics,
        gather_metrics,
    )
    from torch_dataloader_utils.runtime.options import (
        FileLoaderOptions,
        IcebergLoaderOptions,
        MixedLoaderOptions,
    )
    from torch_dataloader_utils.runtime.recipes import MixedDataLoader, MixedDataset, create_mixed_dataloader
    from torch_dataloader_utils.runtime.state import gather_state
    from torch_dataloader_utils.storage.requests import RequestCounts
    from torch_dataloader_utils.tools.ledger import Ledger
    from torch_dataloader_utils.tools.reshard import ReshardReport, reshard

# torch and pyarrow are imported on first use of these names, so that importing the
# pure parts (plan/, config, errors) stays light.
_LAZY = {
    "GatheredState": "torch_dataloader_utils.runtime.checkpoint",
    "FlatList": "torch_dataloader_utils.convert",
    "PaddedList": "torch_dataloader_utils.convert",
    "FileLoaderOptions": "torch_dataloader_utils.runtime.options",
    "IcebergDataset": "torch_dataloader_utils.runtime.iceberg",
    "IcebergLoaderOptions": "torch_dataloader_utils.runtime.options",
    "Ledger": "torch_dataloader_utils.tools.ledger",
    "LoaderMetrics": "torch_dataloader_utils.runtime.metrics",
    "RankMetrics": "torch_dataloader_utils.runtime.metrics",
    "WorkerMetrics": "torch_dataloader_utils.runtime.metrics",
    "gather_metrics": "torch_dataloader_utils.runtime.metrics",
    "MixedDataLoader": "torch_dataloader_utils.runtime.recipes",
    "MixedDataset": "torch_dataloader_utils.runtime.recipes",
    "MixedLoaderOptions": "torch_dataloader_utils.runtime.options",
    "ResumableDataLoader": "torch_dataloader_utils.runtime.loader",
    "ReshardReport": "torch_dataloader_utils.tools.reshard",
    "RequestCounts": "torch_dataloader_utils.storage.requests",
    "StructuredDataset": "torch_dataloader_utils.runtime.files",
    "batch_cu_seqlens": "torch_dataloader_utils.packing",
    "create_dataloader": "torch_dataloader_utils.runtime.files",
    "create_mixed_dataloader": "torch_dataloader_utils.runtime.recipes",
    "gather_state": "torch_dataloader_utils.runtime.state",
    "reshard": "torch_dataloader_utils.tools.reshard",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torch_dataloader_utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.8.2"

__all__ = [
    "BadDataError",
    "BadDataPolicy",
    "CheckpointMismatchError",
    "Chunk",
    "ChunkUnit",
    "ConfigError",
    "ConversionError",
    "CorruptFileError",
    "DataFileInfo",
    "DataLoaderUtilsError",
    "DestinationConflictError",
    "DiscoveryError",
    "DistributedConfigError",
    "EpochPlan",
    "EqualBatches",
    "FeaturePack",
    "FileChangedError",
    "FileFormat",
    "FileInfo",
    "FileLoaderOptions",
    "FlatList",
    "GatheredState",
    "IcebergDataFileInfo",
    "IcebergDataset",
    "IcebergLoaderOptions",
    "IncompatibleOptionsError",
    "InferredSchemaError",
    "Ledger",
    "LedgerError",
    "LegacySplitStrategy",
    "LoaderMetrics",
    "MissingDependencyError",
    "MixSchedule",
    "MixedDataLoader",
    "MixedDataset",
    "MixedLoaderOptions",
    "NoFilesFoundError",
    "NullValueError",
    "OnExhausted",
    "OptionTypeError",
    "OutputFormat",
    "OverlappingChunksError",
    "PaddedList",
    "PathNotFoundError",
    "PlanError",
    "RaggedLayout",
    "RankFailedError",
    "RankMetrics",
    "ReadError",
    "RecordBoundaryError",
    "RecordIndex",
    "RequestCounts",
    "ReshardError",
    "ReshardReport",
    "ResumableDataLoader",
    "ResumeStateError",
    "RoundRobinSplitStrategy",
    "RowGroup",
    "ScheduleUnit",
    "SchemaError",
    "SchemaMismatchError",
    "SequencePack",
    "SizeBalancedSplitStrategy",
    "SourceChangedError",
    "Split",
    "SplitKind",
    "SplitStrategy",
    "Stage",
    "StateMismatchError",
    "StringLayout",
    "StructuredDataset",
    "TargetSizeSplitStrategy",
    "UnknownColumnError",
    "UnknownLengthError",
    "UnknownOptionError",
    "WorkerMetrics",
    "World",
    "batch_cu_seqlens",
    "create_dataloader",
    "create_mixed_dataloader",
    "gather_metrics",
    "gather_state",
    "merge_states",
    "reshard",
]
