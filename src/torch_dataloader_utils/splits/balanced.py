"""0.2.0's ``torch_dataloader_utils.splits.balanced``: re-export of ``SizeBalancedSplitStrategy``."""

from torch_dataloader_utils.compat import SizeBalancedSplitStrategy

__all__ = ["SizeBalancedSplitStrategy"]
