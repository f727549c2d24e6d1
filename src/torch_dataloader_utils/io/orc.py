"""Reading ORC chunks stripe by stripe: only the chunk's stripes and the needed columns."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.orc as orc

from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.io.bad import BadUnit, confirm_unchanged, decode_again, describe
from torch_dataloader_utils.io.base import OpenFiles, ReaderBase, ReaderCounts, ReadRequest
from torch_dataloader_utils.io.prefetch import Warmer
from torch_dataloader_utils.plan.types import Chunk, RowGroup
from torch_dataloader_utils.storage.cached import RangeFile, fetch_error
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

    A stripe that does not decode is decoded again from its bytes read again from
    storage (:func:`~torch_dataloader_utils.io.bad.decode_again`); when that fails too it
    raises :class:`BadDataError` naming it, or, with ``on_bad_data='skip'`` /
    ``'quarantine'``, is replaced by a stand-in of its rows
    (:mod:`~torch_dataloader_utils.io.bad`). Remote files are read through the node-local
    ``data_cache`` when one is set (in blocks; a file is checked against the plan before
    its first fetch from storage in a pass).
    """

    def __init__(self, request: ReadRequest) -> None:
        self._fs = request.fs
        self._files = request.files
        self._data_columns = list(request.data_columns)
        self._finish = request.finisher()
        self._batch_size = request.batch_size
        self._open: OpenFiles[tuple[Any, orc.ORCFile]] = OpenFiles(self._open_orc, closer=_close)
        self._warmer = Warmer()
        self._checks = FileChecks(request.fs, request.files)  # never read a rewritten file
        self._reads = request.reads()
        self._bad = request.bad()
        self._schema = request.output_schema
        self._exact = request.filters is None

    def schedule(self, chunks: Sequence[Chunk]) -> None:
        """Announce the chunks this process reads next: remote files are checked meanwhile."""
        self._checks.schedule(() if self._reads.active else (c.path for c in chunks))

    def warm(self, chunks: Sequence[Chunk]) -> None:
        """Fetch ``chunks`` into the node-local cache on an idle thread (``data_cache_prefetch``).

        Each chunk's stripes are read from a file of their own through the cache, so the
        blocks a read of the chunk needs (the file's tail, its stripes' columns) are
        cached; what is decoded is dropped. Nothing happens without a cache.
        """
        if self._reads.active:
            self._warmer.submit([functools.partial(self._warm_one, c) for c in chunks])

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Wait for the chunks given to :meth:`warm` so far (tests, benchmarks)."""
        return self._warmer.wait(timeout)

    def _warm_one(self, chunk: Chunk) -> None:
        source, reader = self._open_orc(chunk.path)
        try:
            for g in self._files[chunk.path].groups_in(chunk.start, chunk.stop):
                reader.read_stripe(g.index, columns=self._data_columns)
        finally:
            source.close()

    def counts(self) -> ReaderCounts:
        """This reader's ``data_cache`` reads and skipped data in this process so far."""
        return ReaderCounts.of(self._reads, self._bad)

    def _open_orc(self, path: str) -> tuple[Any, orc.ORCFile]:
        info = self._files[path]
        source = self._reads.open(
            path,
            size=info.size,
            version=info.mtime,
            before_fetch=lambda: self._checks.check(path, info.size, info.mtime),
        )
        try:
            return source, orc.ORCFile(source)
        except (OSError, pa.ArrowException) as exc:
            failed = fetch_error(source)  # pyarrow's ORC reader reports a failed read as its own error
            if isinstance(failed, (ReadError, MemoryError)):
                raise failed from exc
            raise

    def read(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """Yield the chunk's rows (filtered, projected) in file order."""
        info = self._files[chunk.path]
        try:
            if not self._reads.active:
                self._checks.check(chunk.path, info.size, info.mtime)
            source, reader = self._open.get(chunk.path)
            for g in info.groups_in(chunk.start, chunk.stop):
                lo = max(chunk.start, g.first_row) - g.first_row
                hi = min(chunk.stop, g.stop_row) - g.first_row
                try:
                    stripe = reader.read_stripe(g.index, columns=self._data_columns)
                except MemoryError:
                    raise
                except (OSError, pa.ArrowException) as exc:
                    failed = fetch_error(source)
                    if isinstance(failed, MemoryError):
                        raise failed from exc
                    what = f"stripe {g.index} of {self._fs.display(chunk.path)!r}"
                    unchanged = functools.partial(
                        confirm_unchanged, self._fs, chunk.path, self._files[chunk.path]
                    )
                    again = decode_again(
                        exc, lambda: self._fresh(chunk.path), self._again(g), what, unchanged
                    )
                    if isinstance(again, BaseException):
                        standin = self._bad_stripe(chunk, g, hi - lo, again)
                        if standin is not None:
                            yield standin
                        continue
                    stripe = again
                if stripe.num_rows != g.num_rows:
                    raise ReadError(
                        f"stripe {g.index} of {self._fs.display(chunk.path)!r} holds {stripe.num_rows} "
                        f"rows but its metadata said {g.num_rows}; was the file rewritten?"
                    )
                table = pa.Table.from_batches([stripe]).slice(lo, hi - lo)
                for batch in table.to_batches(max_chunksize=self._batch_size):
                    yield self._finish(batch, chunk.path)
        except MemoryError:
            raise  # a stripe that does not fit in memory is not bad data, nor a read error
        except (OSError, pa.ArrowException) as exc:
            raise ReadError(
                f"reading {self._fs.display(chunk.path)!r} rows [{chunk.start}, {chunk.stop}) failed: {exc}"
            ) from exc

    def _fresh(self, path: str) -> RangeFile:
        info = self._files[path]
        return self._reads.fresh(path, size=info.size, version=info.mtime)

    def _again(self, g: RowGroup) -> Callable[[Any], pa.RecordBatch]:
        """Decodes stripe ``g`` from a file read again."""
        columns = self._data_columns

        def decode(file: Any) -> pa.RecordBatch:
            return orc.ORCFile(file).read_stripe(g.index, columns=columns)

        return decode

    def _bad_stripe(self, chunk: Chunk, g: RowGroup, rows: int, exc: BaseException) -> pa.RecordBatch | None:
        """A stripe that does not decode (the file checked, its bytes read twice): raise, or skip it.

        Returns its stand-in, or ``None``.

        Raises:
            BadDataError: with ``on_bad_data='raise'``.
        """
        lost = rows if self._exact else 0
        unit = BadUnit(
            self._fs.display(chunk.path),
            "stripe",
            g.index,
            (g.first_row, g.stop_row),
            None,
            describe(exc),
            lost,
        )
        reading = f"{self._fs.display(chunk.path)!r} rows [{chunk.start}, {chunk.stop})"
        return self._bad.resolve(unit, exc, reading=reading, padding=chunk.padding, schema=self._schema)
