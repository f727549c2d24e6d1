"""Resharding plans: which source rows go into which output shard (pure).

A reshard job rewrites a dataset into shards of about ``shard_rows`` rows. Its plan is a
function of values alone (chunk row counts, the map phase's run sizes), so every process
of a job, on every machine and in every rerun, computes the same shards and any of them
can (re)write any shard.

* :func:`cut_shards` cuts the source's chunks, in order, into consecutive shards of
  exactly ``shard_rows`` rows (the last one takes the rest), cutting a chunk at row
  granularity where a shard boundary falls inside it.
* :func:`plan_reduce` is the second half of a grouped or partitioned job: the map phase
  writes each task's rows as runs that share a partition and a hash bucket, and the
  reduce shards take whole buckets (``--group-by``: a key never spans two shards) or any
  rows of one partition (``--partition-by`` alone), never mixing partitions.

Both give every source row exactly one shard (tests/plan/test_shards.py proves it with
Hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby

from torch_dataloader_utils.plan.pieces import cut_chunk
from torch_dataloader_utils.plan.types import Chunk, FileInfo

__all__ = ["Run", "ReduceShard", "Segment", "cut_shards", "pack_sizes", "plan_reduce"]


def cut_shards(
    chunks: Sequence[Chunk],
    files: Mapping[str, FileInfo],
    shard_rows: int,
    *,
    rows_of: Callable[[Chunk], int] | None = None,
) -> list[tuple[Chunk, ...]]:
    """Consecutive shards of ``shard_rows`` rows each (the last one holds the rest).

    Args:
        chunks: The source's chunks in a canonical order (the same in every process).
        files: Their files by path (to place cuts among live rows, see :func:`cut_chunk`).
        shard_rows: Rows per shard (>= 1).
        rows_of: Rows of a chunk whose count is unknown (an estimate); such a chunk
            cannot be cut, so it goes whole into the shard it starts in.

    Returns:
        At least one shard (an empty source gives one empty shard). Every row of every
        chunk is in exactly one shard, in chunk order.
    """
    if shard_rows < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    shards: list[tuple[Chunk, ...]] = []
    current: list[Chunk] = []
    have = 0
    for chunk in chunks:
        piece: Chunk | None = chunk
        while piece is not None:
            rows = piece.num_rows
            if rows is None:
                current.append(piece)
                have += rows_of(piece) if rows_of is not None else 0
                piece = None
            elif rows == 0:
                piece = None  # nothing to read (pruned row groups, deleted rows)
            elif have + rows <= shard_rows:
                current.append(piece)
                have += rows
                piece = None
            else:
                head, piece = cut_chunk(piece, files[piece.path], shard_rows - have)
                current.append(head)
                have = shard_rows
            if have >= shard_rows:
                shards.append(tuple(current))
                current, have = [], 0
    if current or not shards:
        shards.append(tuple(current))
    return shards


def pack_sizes(sizes: Sequence[int], target: int) -> list[range]:
    """Consecutive items packed into bins of about ``target`` (each item whole).

    A bin is closed before the next item when adding it would overshoot ``target`` by
    more than the bin is short of it, so every bin but the last ends within half an
    item of ``target``. Empty items join the bin they fall in.
    """
    if target < 1:
        raise ValueError(f"target must be >= 1, got {target}")
    bins: list[range] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if total > 0 and total + size > target and (total + size - target) > (target - total):
            bins.append(range(start, i))
            start, total = i, 0
        total += size
        if total >= target:
            bins.append(range(start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        bins.append(range(start, len(sizes)))
    return bins


@dataclass(frozen=True, slots=True)
class Run:
    """Rows of one map task's output that share a partition and a bucket.

    Attributes:
        task: The map task that wrote it.
        index: Its position among the task's runs (the record batch holding it).
        partition: The partition's index in the job's sorted partition list (0 without
            partitions).
        bucket: The hash bucket of its group key (0 without ``group_by``).
        rows: Rows it holds.
    """

    task: int
    index: int
    partition: int
    bucket: int
    rows: int


@dataclass(frozen=True, slots=True)
class Segment:
    """Rows ``[offset, offset + rows)`` of one run (by task and index)."""

    task: int
    index: int
    offset: int
    rows: int


@dataclass(frozen=True, slots=True)
class ReduceShard:
    """One output shard of a grouped or partitioned job: its partition and its rows."""

    partition: int
    segments: tuple[Segment, ...]

    @property
    def rows(self) -> int:
        """Rows the shard holds."""
        return sum(s.rows for s in self.segments)


def plan_reduce(runs: Sequence[Run], shard_rows: int, *, whole_buckets: bool) -> list[ReduceShard]:
    """The reduce shards of a grouped or partitioned job.

    Shards never mix partitions. With ``whole_buckets`` (``group_by``), consecutive
    buckets of a partition are packed to about ``shard_rows`` rows (:func:`pack_sizes`)
    and a bucket is never split, so rows that share a key stay in one shard. Without it,
    a partition's rows (its runs in task order) are cut into shards of exactly
    ``shard_rows`` rows, the partition's last shard holding the rest.

    Args:
        runs: Every run of every map task (any order).
        shard_rows: Target rows per shard (>= 1).
        whole_buckets: Keep each bucket in one shard.

    Returns:
        Shards ordered by partition, then bucket or row order; each segment of a shard
        in (task, index) order. Every row of every run is in exactly one shard.
    """
    if shard_rows < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    shards: list[ReduceShard] = []
    ordered = sorted((r for r in runs if r.rows > 0), key=lambda r: (r.partition, r.bucket, r.task, r.index))
    for partition, part_runs in groupby(ordered, key=lambda r: r.partition):
        part = list(part_runs)
        if whole_buckets:
            buckets = [list(g) for _, g in groupby(part, key=lambda r: r.bucket)]
            for span in pack_sizes([sum(r.rows for r in b) for b in buckets], shard_rows):
                members = sorted((r for b in buckets[span.start : span.stop] for r in b), key=_task_order)
                segments = tuple(Segment(r.task, r.index, 0, r.rows) for r in members)
                shards.append(ReduceShard(partition, segments))
            continue
        current: list[Segment] = []
        have = 0
        for run in sorted(part, key=_task_order):
            offset = 0
            while offset < run.rows:
                take = min(run.rows - offset, shard_rows - have)
                current.append(Segment(run.task, run.index, offset, take))
                offset += take
                have += take
                if have == shard_rows:
                    shards.append(ReduceShard(partition, tuple(current)))
                    current, have = [], 0
        if current:
            shards.append(ReduceShard(partition, tuple(current)))
    return shards


def _task_order(run: Run) -> tuple[int, int]:
    return (run.task, run.index)
