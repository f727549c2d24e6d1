"""The seam between planning and reading: the ChunkReader protocol."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import pyarrow as pa

from torch_dataloader_utils.plan.types import Chunk

__all__ = ["ChunkReader"]


@runtime_checkable
class ChunkReader(Protocol):
    """Reads one chunk's rows as record batches, already projected and filtered."""

    def read(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """Yield the chunk's rows, in file order, as batches of the output schema."""
        ...
