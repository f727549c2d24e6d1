"""0.2.0's ``torch_dataloader_utils.splits.core``: the split records and the strategy protocol."""

from torch_dataloader_utils.compat import DataFileInfo, IcebergDataFileInfo, RowRange, Shard, Split
from torch_dataloader_utils.plan.splits import SplitStrategy

__all__ = ["DataFileInfo", "IcebergDataFileInfo", "RowRange", "Shard", "Split", "SplitStrategy"]
