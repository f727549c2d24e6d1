"""Reading data: one reader per format behind the ChunkReader protocol."""

from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.batching import rebatch
from torch_dataloader_utils.io.fs import FileSystemSpec, resolve

__all__ = ["ChunkReader", "FileSystemSpec", "rebatch", "resolve"]
