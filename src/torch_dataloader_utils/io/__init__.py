"""Reading data: one reader per format behind the ChunkReader protocol."""

from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.batching import rebatch

__all__ = ["ChunkReader", "rebatch"]
