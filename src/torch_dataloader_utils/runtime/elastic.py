"""Elastic order at run time: a rank's canonical streams read interleaved, workers' parts joined.

The plan is in :mod:`~torch_dataloader_utils.plan.elastic`. Here: which pieces every
stream of this rank still holds (:class:`ElasticPlans`), a worker reading its streams
side by side into its part of every batch (:func:`interleave`), and the main process
joining the parts of every batch when several workers read (:class:`Joiner`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from torch_dataloader_utils.config import OutputConfig, OutputFormat, StringLayout
from torch_dataloader_utils.io.ahead import read_ahead
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.batching import concat_batches as concat
from torch_dataloader_utils.io.pieces import Gather, gathered, piece_reads, read_piece
from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.elastic import Canonical, consumed, skip_rows
from torch_dataloader_utils.plan.mixing import RowMixing
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.planner import Planner
from torch_dataloader_utils.plan.resume import group
from torch_dataloader_utils.plan.state import Segment
from torch_dataloader_utils.plan.types import FileInfo
from torch_dataloader_utils.runtime.emit import Positions
from torch_dataloader_utils.runtime.state import Tagged

__all__ = [
    "ElasticPlans",
    "Joiner",
    "StreamPositions",
    "interleave",
    "join_converted",
    "join_converted_blocks",
    "joinable",
    "part_batches",
]


class ElasticPlans:
    """This rank's canonical streams, fresh or resumed (what each still holds), cached per pass.

    Args:
        planner: The dataset's planner (its world is replaced by the canonical one).
        layout: How the canonical streams are shared by this job's ranks.
        rank: This rank.
        window_rows: Row-shuffle window, or ``None``.
        mixing: Row mixing (when ``window_rows`` is ``None``), or ``None``.
        seed: The shuffle seed when shuffling (the windows' and mixes' keys), else 0.
    """

    def __init__(
        self,
        planner: Planner,
        layout: Canonical,
        rank: int,
        *,
        window_rows: int | None,
        mixing: RowMixing | None,
        seed: int,
    ) -> None:
        self.planner = planner.for_world(layout.streams)
        self.layout = layout
        self.rank = rank
        self.window_rows = window_rows
        # Every batch draws from every stream of its rank already: a stream mixes its own
        # rows across fewer places, so that a worker holds one decoded batch per place.
        self.mixing = mixing and replace(mixing, streams=-(-mixing.streams // layout.streams))
        self.seed = seed
        self._found: BoundedDict[tuple[int, int], tuple[dict[int, list[Piece]], int, int]] = BoundedDict(4)

    @property
    def files(self) -> Mapping[str, FileInfo]:
        """The dataset's files by path."""
        return self.planner.files

    def fresh(self, epoch: int, stream: int) -> list[Piece]:
        """Canonical stream ``stream`` of ``epoch``: its rank's plan, read by one worker."""
        pieces = self.planner.rank_plan(epoch, stream, 1).pieces_for(0)
        return group(pieces, self.window_rows, self.mixing, (self.seed, epoch, 0, stream, 0), self.files)

    def digest(self, epoch: int, stream: int) -> int | None:
        """A custom strategy's digest of the chunks of canonical stream ``stream``'s plan."""
        return self.planner.rank_plan(epoch, stream, 1).digest

    def _resolve(self, epoch: int, segments: tuple[Segment, ...]) -> tuple[dict[int, list[Piece]], int, int]:
        key = (epoch, hash(segments))
        found = self._found.get(key)
        if found is None:
            streams = {c: self.fresh(epoch, c) for c in self.layout.of_rank(self.rank)}
            rows = sum(p.num_rows or 0 for p in next(iter(streams.values())))
            done = consumed(segments, self.layout.streams, rows)
            if segments:  # saved ranks whose first stream is one of this rank's: their digests
                saved = Canonical(self.layout.streams, segments[0].num_ranks)
                for rank, entry in segments[0].ranks.items():
                    if saved.of_rank(rank)[0] in streams:
                        entry.check_digest(self.digest(epoch, saved.of_rank(rank)[0]), rank)
            streams = {c: skip_rows(pieces, done, self.files) for c, pieces in streams.items()}
            found = self._found[key] = (streams, rows, done)
        return found

    def streams(self, epoch: int, segments: tuple[Segment, ...]) -> dict[int, list[Piece]]:
        """What every stream of this rank holds after ``segments``."""
        return self._resolve(epoch, segments)[0]

    def rows(self, epoch: int, segments: tuple[Segment, ...]) -> tuple[int, int]:
        """``(rows of every stream in the epoch, rows of every stream consumed before this pass)``."""
        _, rows, done = self._resolve(epoch, segments)
        return rows, done

    def of_worker(
        self, epoch: int, segments: tuple[Segment, ...], worker: int, workers: int
    ) -> list[list[Piece]]:
        """What one worker reads: its streams' pieces, stream by stream."""
        streams = self.streams(epoch, segments)
        return [streams[c] for c in self.layout.of_worker(self.rank, worker, workers)]

    def batches(self, epoch: int, segments: tuple[Segment, ...], drop_last: bool) -> int:
        """Batches this rank yields in the rest of ``epoch`` (the same on every rank)."""
        rows, done = self.rows(epoch, segments)
        full, rest = divmod(rows - done, self.layout.per_stream)
        return full + (1 if rest and not drop_last else 0)


def interleave(
    reader: ChunkReader,
    streams: Sequence[Sequence[Piece]],
    per_stream: int,
    *,
    drop_last: bool,
    flag_column: str | None,
    files: Mapping[str, FileInfo] | None,
    mix_read_rows: int | None,
    batches: int = 1,
    ahead: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Every batch's ``per_stream`` rows of each stream, stream after stream.

    The streams hold the same number of rows, so every batch but the last is full. The
    rows of ``batches`` consecutive batches are yielded together, one batch after the
    other (a worker's parts of several batches: a few rows of every batch, sent at once).
    With ``ahead``, a thread (:func:`~torch_dataloader_utils.io.ahead.read_ahead`) decodes
    the streams, gathers their shuffles and joins the rounds of batches (one gather
    each: :func:`_rounds`); this thread only cuts the rounds into batches, as zero-copy
    slices.
    """
    lists = [[c for p in pieces for c in piece_reads(p, files)] for pieces in streams]
    longest = max(map(len, lists), default=0)  # remote chunks fetched ahead, as they are opened
    reader.schedule([chunks[k] for k in range(longest) for chunks in lists if k < len(chunks)])
    if mix_read_rows is not None:  # several streams read side by side: smaller decoded batches
        reader = reader.with_read_rows(mix_read_rows)

    def items(pieces: Sequence[Piece]) -> Iterator[pa.RecordBatch | Gather]:
        for piece in pieces:
            yield from read_piece(
                reader, piece, flag_column=flag_column, files=files, mix_read_rows=mix_read_rows
            )

    taken = _round_robin([items(pieces) for pieces in streams])
    queues: list[deque[pa.RecordBatch | Gather | None]] = [deque() for _ in streams]

    def rows(i: int) -> Iterator[pa.RecordBatch]:
        """Stream ``i``'s rows, taking the shared source's items as they come."""
        while True:
            while not queues[i]:
                got = next(taken, None)
                if got is None:
                    return
                queues[got[0]].append(got[1])
            item = queues[i].popleft()
            if item is None:  # the stream is read to its end
                return
            yield from gathered((item,))

    def decode_ahead(_: object) -> bool:
        """While the rounds made wait: a queued shuffle gathered, else a stream's next item read.

        At most one item a stream is read ahead; else every stream would need its next
        item in the same round (they are used up at the same pace), and the round wait.
        """
        for queue in queues:
            if any(isinstance(item, Gather) and item.prepare() for item in queue):
                return True
        if sum(map(len, queues)) >= len(queues):
            return False
        got = next(taken, None)
        if got is None:
            return False
        queues[got[0]].append(got[1])
        return True

    held = [_Held(rows(i)) for i in range(len(streams))]
    blocks = _rounds(held, per_stream, drop_last=drop_last, group=batches)
    if ahead:  # a thread decodes, gathers and joins the rounds; this one only cuts them
        blocks = read_ahead(blocks, name="read-ahead-streams", prepare=decode_ahead)
    yield from _cut(blocks, batches * per_stream * len(streams))


ROUND_ROWS = 65536
"""Rows of the batches one round of :func:`interleave` makes with one gather (at least
one group of batches): fewer rounds mean fewer calls, larger ones more memory held."""


class _Held:
    """One stream's decoded rows not yet used, taken from its iterator as they are needed."""

    __slots__ = ("ended", "parts", "rows", "source")

    def __init__(self, source: Iterator[pa.RecordBatch]) -> None:
        self.source = source
        self.parts: deque[pa.RecordBatch] = deque()
        self.rows = 0
        self.ended = False

    def fill(self, rows: int) -> None:
        """Hold at least ``rows`` rows, or all the stream has left."""
        while self.rows < rows and not self.ended:
            batch = next(self.source, None)
            if batch is None:
                self.ended = True
            elif batch.num_rows:
                self.parts.append(batch)
                self.rows += batch.num_rows

    def take(self, rows: int) -> list[pa.RecordBatch]:
        """The first ``rows`` rows held (fewer when fewer are held), as zero-copy slices."""
        out: list[pa.RecordBatch] = []
        while rows and self.parts:
            first = self.parts[0]
            if first.num_rows <= rows:
                out.append(self.parts.popleft())
            else:
                out.append(first.slice(0, rows))
                self.parts[0] = first.slice(rows)
            rows -= out[-1].num_rows
            self.rows -= out[-1].num_rows
        return out


def _rounds(
    held: Sequence[_Held], per_stream: int, *, drop_last: bool, group: int, round_rows: int = ROUND_ROWS
) -> Iterator[pa.RecordBatch]:
    """Blocks of batches of ``per_stream`` rows of every stream, stream after stream.

    A round takes the next ``k`` batches' rows of every stream (as many as every stream
    holds decoded, at most ``round_rows`` rows, a multiple of ``group``) and puts them
    in batch order with one gather: a block of ``k`` batches. Only the last block may
    hold fewer than ``group`` batches (then the last one may be short: the streams' last
    rows); it is joined by copying.

    Raises:
        ValueError: the streams hold different numbers of whole batches.
    """
    n, s = len(held), per_stream
    if not n:  # a worker with no stream of its rank to read
        return
    size = n * s
    most = max(group, round_rows // size // group * group)
    orders: BoundedDict[int, pa.Array[Any]] = BoundedDict(4)
    pending: list[pa.RecordBatch] = []  # the last batches: fewer than a group
    while True:
        for h in held:
            h.fill(s * most)
        k = min(min(h.rows for h in held) // s, most)
        if k >= group:
            k -= k % group
        if k == 0:
            break
        order = orders.get(k)
        if order is None:
            order = orders[k] = pa.array(_order(n, k, s))
        table = pa.Table.from_batches([b for h in held for b in h.take(k * s)])
        block = concat(pc.take(table, order, boundscheck=False).combine_chunks().to_batches())
        if k % group:  # fewer than a group held: the streams' last whole batches
            pending.append(block)
        else:
            yield block
    if any(h.rows >= s or not h.ended for h in held):
        raise ValueError(f"streams ended unevenly: {[h.rows for h in held]} rows left, {s} per batch")
    last = [b for h in held for b in h.take(s)]
    rows = sum(b.num_rows for b in last)
    if rows and not (drop_last and rows < size):
        pending.append(concat(last))
    if pending:
        yield concat(pending)


def _cut(blocks: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Every block cut into batches of ``rows`` rows (its last may be shorter), zero-copy."""
    for block in blocks:
        for start in range(0, block.num_rows, rows):
            yield block.slice(start, rows)


def _order(streams: int, batches: int, per_stream: int) -> np.ndarray:
    """Where every batch's rows are in ``streams`` runs of ``batches * per_stream`` rows.

    The runs lie one after the other; the positions are batch after batch, and in a
    batch ``per_stream`` rows of each run, run after run.
    """
    run = batches * per_stream
    grid = (
        np.arange(streams, dtype=np.int64)[None, :, None] * run
        + np.arange(batches, dtype=np.int64)[:, None, None] * per_stream
        + np.arange(per_stream, dtype=np.int64)[None, None, :]
    )
    return grid.reshape(-1)


def _round_robin(
    sources: Sequence[Iterator[pa.RecordBatch | Gather]],
) -> Iterator[tuple[int, pa.RecordBatch | Gather | None]]:
    """``(stream, item)``: an item of every stream in turn; ``(stream, None)`` when one ends."""
    live = list(range(len(sources)))
    while live:
        for i in list(live):
            item = next(sources[i], None)
            if item is None:
                live.remove(i)
            yield i, item


JOIN_ROWS = 65536
"""Rows of a rank's batches whose parts a joined worker sends as one part: the main
process joins each column of that many rows with one copy (:class:`Joiner`)."""


def part_batches(layout: Canonical) -> int:
    """Batches a worker's part holds when the main process joins the workers' parts.

    The same for every worker of the rank (the parts of every worker then cover the same
    batches): about :data:`JOIN_ROWS` rows of the rank's batches.
    """
    return max(1, JOIN_ROWS // max(1, layout.batch_size))


class StreamPositions(Positions):
    """The positions of a worker reading interleaved streams: one piece, the rows it yielded."""

    def __init__(self, token: int, worker: int, workers: int, rank: int = 0) -> None:
        super().__init__(token, worker, workers, rank)
        self._starts.append(0)


def joinable(output: OutputConfig, schema: pa.Schema) -> bool:
    """Whether converted parts of a batch can be joined as they are (else they travel as Arrow).

    Tensors, arrays and lists of rows are joined by concatenation: the torch and numpy
    outputs without ``collate_fn``, whose columns are numbers, fixed-size lists or
    strings as lists. Others (variable-length lists, Arrow or dict output, a
    ``collate_fn``) are joined as Arrow and converted in the main process.
    """
    if output.output_format not in (OutputFormat.TORCH, OutputFormat.NUMPY) or output.collate_fn is not None:
        return False
    for field in schema:
        t = field.type
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
            return False
        if (
            pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
        ) and output.strings not in (
            None,
            StringLayout.LIST,
        ):
            return False
        if pa.types.is_struct(t) or pa.types.is_map(t) or pa.types.is_dictionary(t):
            return False
    return True


def join_converted(parts: Sequence[Any]) -> Any:
    """One batch of converted parts: tensors, arrays and lists concatenated, key by key."""
    out: dict[str, Any] = {}
    for key, first in parts[0].items():
        values = [p[key] for p in parts]
        if isinstance(first, torch.Tensor):
            out[key] = torch.cat(values)
        elif isinstance(first, np.ndarray):
            out[key] = np.concatenate(values)
        elif isinstance(first, list):
            out[key] = [x for v in values for x in v]
        else:
            raise TypeError(f"cannot join parts of column {key!r} of type {type(first).__name__}")
    return out


def join_converted_blocks(parts: Sequence[Any], batches: int) -> list[Any]:
    """``batches`` batches of converted parts that each hold their rows of every one of them.

    Part ``w`` holds ``batches`` equal runs of rows, batch after batch; batch ``t`` is
    run ``t`` of every part, part after part. Every tensor or array column is joined
    with one copy (the parts side by side as ``(batches, rows, ...)`` blocks), and every
    batch is a view of it.
    """
    columns: dict[str, Any] = {}
    for key, first in parts[0].items():
        values = [p[key] for p in parts]
        if isinstance(first, torch.Tensor):
            columns[key] = torch.cat([v.reshape(batches, -1, *v.shape[1:]) for v in values], dim=1)
        elif isinstance(first, np.ndarray):
            columns[key] = np.concatenate([v.reshape(batches, -1, *v.shape[1:]) for v in values], axis=1)
        elif isinstance(first, list):
            sizes = [len(v) // batches for v in values]
            columns[key] = [
                [x for v, n in zip(values, sizes, strict=True) for x in v[t * n : (t + 1) * n]]
                for t in range(batches)
            ]
        else:
            raise TypeError(f"cannot join parts of column {key!r} of type {type(first).__name__}")
    return [{key: column[t] for key, column in columns.items()} for t in range(batches)]


def _rows_of(part: Any) -> int:
    return part.num_rows if isinstance(part, pa.RecordBatch) else len(next(iter(part.values())))


def _piece(part: Any, lo: int, hi: int) -> Any:
    """Rows ``[lo, hi)`` of a part: an Arrow batch, or converted columns (views, no copy)."""
    if isinstance(part, pa.RecordBatch):
        return part.slice(lo, hi - lo)
    return {key: value[lo:hi] for key, value in part.items()}


class Joiner:
    """Main process: every batch joined from the parts of the workers that read streams.

    A worker's parts arrive in order, in the DataLoader's order of workers; a part holds
    the worker's rows of a few consecutive batches, batch after batch. Batch ``t`` is the
    worker's rows of it from every reading worker, in worker order. Each batch is made
    and its parts' positions recorded as consumed when the loop asks for it.

    Args:
        rows: Rows of every batch each reading worker holds (the last batch may hold fewer).
        join: One batch of the workers' rows of it (converted ones concatenated, or Arrow
            ones joined and converted).
        consume: Records a part's position as consumed.
        join_blocks: All the batches of parts that hold whole batches, given the parts and
            the number of batches (one copy per column: :func:`join_converted_blocks`),
            or ``None`` to join batch by batch.
    """

    def __init__(
        self,
        rows: Sequence[int],
        join: Callable[[list[Any]], Any],
        consume: Callable[[Tagged], Any],
        join_blocks: Callable[[list[Any], int], list[Any]] | None = None,
    ) -> None:
        self._rows = list(rows)
        self._parts: list[deque[Tagged]] = [deque() for _ in rows]
        self._join = join
        self._consume = consume
        self._join_blocks = join_blocks

    def add(self, item: Tagged) -> Iterator[Any]:
        """Take one worker's part; the batches it completes, made one by one when asked for."""
        self._parts[item.tag[1]].append(item)
        while all(self._parts):
            parts = [q.popleft() for q in self._parts]
            total = [_rows_of(p.batch) for p in parts]
            count = -(-total[0] // self._rows[0])
            whole = all(n == count * size for n, size in zip(total, self._rows, strict=True))
            blocks = None
            if self._join_blocks is not None and count > 1 and whole:
                blocks = self._join_blocks([p.batch for p in parts], count)
            for j in range(count):
                pieces = []
                for part, n, size in zip(parts, total, self._rows, strict=True):
                    lo, hi = j * size, min((j + 1) * size, n)
                    tag = (*part.tag[:4], part.tag[4] - n + hi, hi - lo, 0)  # the worker's cursor after it
                    self._consume(Tagged(None, tag))
                    if blocks is None:
                        pieces.append(_piece(part.batch, lo, hi))
                yield self._join(pieces) if blocks is None else blocks[j]

    def check_done(self) -> None:
        """At the end of a pass: every part was joined (workers yielded as many parts).

        Raises:
            RuntimeError: a worker yielded more parts than another.
        """
        left = [len(q) for q in self._parts]
        if any(left):
            raise RuntimeError(
                f"workers ended with {left} parts of batches not joined; the plan is inconsistent"
            )
