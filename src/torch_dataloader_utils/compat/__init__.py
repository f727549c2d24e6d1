"""torch-dataloader-utils 0.2.0's public names, adapted onto this library's core.

Nothing here has logic of its own: the inputs (:class:`DataFileInfo`), what a custom
strategy returns (:class:`Split`, :class:`Shard`) and the built-in strategies
(:class:`TargetSizeSplitStrategy`, ...) map onto the planner's chunks and splitters,
so code written for 0.2.0 keeps this library's guarantees (every row exactly once per
epoch, equal batches per rank, exact resume). The module paths 0.2.0 documented
(``torch_dataloader_utils.splits``, ``torch_dataloader_utils.splits.core``, ...)
re-export these names. See ``docs/migrating-from-0.2.md``.
"""

from torch_dataloader_utils.compat.files import DataFileInfo, IcebergDataFileInfo, file_paths
from torch_dataloader_utils.compat.splits import RowRange, Shard, Split
from torch_dataloader_utils.compat.strategies import (
    RoundRobinSplitStrategy,
    SizeBalancedSplitStrategy,
    TargetSizeSplitStrategy,
)
from torch_dataloader_utils.errors import CheckpointMismatchError

__all__ = [
    "CheckpointMismatchError",
    "DataFileInfo",
    "IcebergDataFileInfo",
    "RoundRobinSplitStrategy",
    "RowRange",
    "Shard",
    "SizeBalancedSplitStrategy",
    "Split",
    "TargetSizeSplitStrategy",
    "file_paths",
]
