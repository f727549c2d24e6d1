"""0.2.0's ``torch_dataloader_utils.splits.target_size``: re-export of ``TargetSizeSplitStrategy``."""

from torch_dataloader_utils.compat import TargetSizeSplitStrategy

__all__ = ["TargetSizeSplitStrategy"]
