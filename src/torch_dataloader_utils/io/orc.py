"""Reading ORC chunks stripe by stripe: only the chunk's stripes and the needed columns."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.orc as orc

from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.io.base import OpenFiles, ReaderBase, ReadRequest
from torch_dataloader_utils.plan.types import Chunk
from torch_dataloader_utils.storage.identity import FileChecks

__all__ = ["OrcReader"]


def _close(entry: tuple[Any, orc.ORCFile]) -> None:
    """Close an open ORC file's source (a module-level function: the reader pickles to workers)."""
    entry[0].close()


class OrcReader(ReaderBase):
    """A :class:`ChunkReader` for ORC files.

    A chunk ``[start, stop)`` of rows reads the stripes overlapping it; a stripe only
    partly inside is sliced, so chunks may be cut at any row. Batches are at most
    ``batch_size`` rows; the dataset's re-batching makes them exact across stripes.
    """

    def __init__(self, request: ReadRequest) -> None:
        self._fs = request.fs
        self._files = request.files
        self._data_columns = list(request.data_columns)
        self._finish = request.finisher()
        self._batch_size = request.batch_size
        self._open: OpenFiles[tuple[Any, orc.ORCFile]] = OpenFiles(self._open_orc, closer=_close)
        self._checks = FileChecks(request.fs, request.files)  # never read a rewritten file

    def schedule(self, chunks: Sequence[Chunk]) -> None:
        """Announce the chunks this process reads next: remote files are checked meanwhile."""
        self._checks.schedule(c.path for c in chunks)

    def _open_orc(self, path: str) -> tuple[Any, orc.ORCFile]:
        source = self._fs.arrow().open_input_file(path)
        return source, orc.ORCFile(source)

    def read(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """Yield the chunk's rows (filtered, projected) in file order."""
        info = self._files[chunk.path]
        try:
            self._checks.check(chunk.path, info.size, info.mtime)
            reader = self._open.get(chunk.path)[1]
            for g in info.groups_in(chunk.start, chunk.stop):
                lo = max(chunk.start, g.first_row) - g.first_row
                hi = min(chunk.stop, g.stop_row) - g.first_row
                stripe = reader.read_stripe(g.index, columns=self._data_columns)
                if stripe.num_rows != g.num_rows:
                    raise ReadError(
                        f"stripe {g.index} of {self._fs.display(chunk.path)!r} holds {stripe.num_rows} "
                        f"rows but its metadata said {g.num_rows}; was the file rewritten?"
                    )
                table = pa.Table.from_batches([stripe]).slice(lo, hi - lo)
                for batch in table.to_batches(max_chunksize=self._batch_size):
                    yield self._finish(batch, chunk.path)
        except (OSError, pa.ArrowException) as exc:
            raise ReadError(
                f"reading {self._fs.display(chunk.path)!r} rows [{chunk.start}, {chunk.stop}) failed: {exc}"
            ) from exc
