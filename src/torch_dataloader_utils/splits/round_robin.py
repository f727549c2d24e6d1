"""0.2.0's ``torch_dataloader_utils.splits.round_robin``: re-export of ``RoundRobinSplitStrategy``."""

from torch_dataloader_utils.compat import RoundRobinSplitStrategy

__all__ = ["RoundRobinSplitStrategy"]
