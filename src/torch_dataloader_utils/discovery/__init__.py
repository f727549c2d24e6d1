"""Discovery: metadata only. Lists files and reads footers; never reads data pages."""

from torch_dataloader_utils.discovery.dataset import Discovered, discover

__all__ = ["Discovered", "discover"]
