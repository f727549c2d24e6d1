"""0.2.0's ``torch_dataloader_utils.splits``: re-exports of :mod:`torch_dataloader_utils.compat`."""

from torch_dataloader_utils.compat import (
    DataFileInfo,
    IcebergDataFileInfo,
    RoundRobinSplitStrategy,
    RowRange,
    Shard,
    SizeBalancedSplitStrategy,
    Split,
    TargetSizeSplitStrategy,
)
from torch_dataloader_utils.plan.splits import SplitStrategy

__all__ = [
    "DataFileInfo",
    "IcebergDataFileInfo",
    "RoundRobinSplitStrategy",
    "RowRange",
    "Shard",
    "SizeBalancedSplitStrategy",
    "Split",
    "SplitStrategy",
    "TargetSizeSplitStrategy",
]
