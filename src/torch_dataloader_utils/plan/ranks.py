"""Dealing an epoch's chunks out to ranks, and the equal-batches policy.

Slicing ``[rank::num_ranks]`` keeps chunks whole but gives ranks different row counts;
a DDP loop whose ranks run out of batches at different times hangs in its next
collective. :func:`equalize_ranks` then moves rows between ranks so every rank holds
exactly the same number, cutting chunks at row granularity, and
:func:`worker_quotas` / :func:`fill_quotas` spread a rank's rows over its workers in
multiples of the batch size, so the rank's batch count does not depend on how many
workers it has (ranks may have different ``num_workers``):

* every worker's quota is a multiple of ``batch_size``, except that one worker of the
  rank also takes the rank's remainder ``rows % batch_size``;
* so a rank yields ``ceil(rows / batch_size)`` batches (``floor`` with ``drop_last``).

All of it is computed from chunk row counts alone, identically on every rank.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from torch_dataloader_utils.errors import PlanError
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo

__all__ = [
    "cut_chunk",
    "equalize_ranks",
    "fill_quotas",
    "fill_quotas_by",
    "rank_quota",
    "slice_for_rank",
    "take_rows",
    "worker_quotas",
]

T = TypeVar("T")


def slice_for_rank(items: Sequence[T], num_ranks: int, rank: int) -> list[T]:
    """Rank ``rank``'s share of ``items``: every ``num_ranks``-th item from ``rank`` on.

    Applied after the shuffle, so each rank's share changes from epoch to epoch while
    the shares stay disjoint and together cover every item.
    """
    if not 0 <= rank < num_ranks:
        raise ValueError(f"rank must be in [0, {num_ranks}), got {rank}")
    return list(items[rank::num_ranks])


def _rows(chunk: Chunk, what: str) -> int:
    if chunk.num_rows is None:
        raise PlanError(
            f"{what} needs exact row counts, but chunk {chunk.path!r} [{chunk.start}, {chunk.stop}) "
            f"{chunk.unit.value} has an unknown row count; use a format whose row counts are "
            "known (Parquet, ORC, Iceberg) or pass equal_batches='off'"
        )
    return chunk.num_rows


def cut_chunk(chunk: Chunk, file: FileInfo, rows: int) -> tuple[Chunk, Chunk]:
    """Cut ``chunk`` after its first ``rows`` live rows: ``(head, tail)``.

    Rows of pruned row groups (and, for Iceberg, deleted positions) are not counted, so
    the cut lands after the ``rows``-th row that will actually be read.
    Bytes are shared in proportion to rows.

    Raises:
        ValueError: ``rows`` is not strictly between 0 and the chunk's row count.
    """
    total = _rows(chunk, "cutting a chunk")
    if not 0 < rows < total:
        raise ValueError(f"can only cut a chunk of {total} rows after 1..{total - 1} rows, got {rows}")
    head_bytes = chunk.num_bytes * rows // total
    if chunk.unit is ChunkUnit.BYTES:
        # A byte range cannot be cut at a record without reading it: both halves read
        # the range and keep their own window of its records.
        return (
            replace(chunk, num_rows=rows, num_bytes=head_bytes),
            replace(
                chunk, skip=chunk.skip + rows, num_rows=total - rows, num_bytes=chunk.num_bytes - head_bytes
            ),
        )
    # FileInfo knows which positions hold no live row (pruned groups, deletes).
    position = file.stop_after(chunk.start, rows)
    head = Chunk(chunk.path, chunk.start, position, ChunkUnit.ROWS, rows, head_bytes, chunk.padding)
    tail = Chunk(
        chunk.path,
        position,
        chunk.stop,
        ChunkUnit.ROWS,
        total - rows,
        chunk.num_bytes - head_bytes,
        chunk.padding,
    )
    return head, tail


def fill_quotas(
    bins: Sequence[Sequence[Chunk]], quotas: Sequence[int], files: Mapping[str, FileInfo]
) -> tuple[list[list[Chunk]], list[Chunk]]:
    """Give every bin exactly its quota of rows, moving as few rows as possible.

    Each bin keeps its chunks, in order, up to its quota (cutting the chunk that
    crosses it); what is over goes to a pool, in bin order, which then tops up the
    bins under quota, in bin order, again cutting at row granularity.

    Args:
        bins: Chunks with known row counts, per bin, in reading order.
        quotas: Rows each bin must end with.
        files: The files of the chunks, by path (to place cuts among live rows).

    Returns:
        ``(bins, left_over)``: the new bins, and the pool rows no bin took. A bin ends
        short of its quota only when the pool runs dry.
    """
    return fill_quotas_by(
        bins,
        quotas,
        rows=lambda chunk: _rows(chunk, "equal_batches"),
        cut=lambda chunk, n: cut_chunk(chunk, files[chunk.path], n),
    )


def fill_quotas_by(
    bins: Sequence[Sequence[T]],
    quotas: Sequence[int],
    *,
    rows: Callable[[T], int],
    cut: Callable[[T, int], tuple[T, T]],
) -> tuple[list[list[T]], list[T]]:
    """:func:`fill_quotas` for any item with a row count and a cut (chunks, resume pieces)."""
    if len(bins) != len(quotas):
        raise ValueError(f"{len(bins)} bins but {len(quotas)} quotas")
    kept: list[list[T]] = []
    have: list[int] = []
    pool: deque[T] = deque()
    for items, quota in zip(bins, quotas, strict=True):
        out: list[T] = []
        total = 0
        for item in items:
            n = rows(item)
            if total >= quota and n > 0:
                pool.append(item)
            elif total + n <= quota:
                out.append(item)
                total += n
            else:
                head, tail = cut(item, quota - total)
                out.append(head)
                pool.append(tail)
                total = quota
        kept.append(out)
        have.append(total)
    for out, total, quota in zip(kept, have, quotas, strict=True):
        while total < quota and pool:
            item = pool.popleft()
            n = rows(item)
            if n <= quota - total:
                out.append(item)
                total += n
            else:
                head, tail = cut(item, quota - total)
                out.append(head)
                pool.appendleft(tail)
                total = quota
    return kept, [item for item in pool if rows(item)]


def take_rows(chunks: Sequence[Chunk], rows: int, files: Mapping[str, FileInfo]) -> list[Chunk]:
    """The first ``rows`` rows of ``chunks`` (cut at row granularity), in order."""
    out: list[Chunk] = []
    for chunk in chunks:
        if rows <= 0:
            break
        n = _rows(chunk, "equal_batches")
        if n == 0:
            continue
        if n <= rows:
            out.append(chunk)
        else:
            out.append(cut_chunk(chunk, files[chunk.path], rows)[0])
        rows -= min(n, rows)
    return out


def rank_quota(total: int, num_ranks: int, pad: bool) -> int:
    """Rows per rank: ``total // num_ranks`` (drop) or ``ceil(total / num_ranks)`` (pad)."""
    return -(-total // num_ranks) if pad else total // num_ranks


def equalize_ranks(
    shares: Sequence[Sequence[Chunk]], files: Mapping[str, FileInfo], *, pad: bool
) -> tuple[list[list[Chunk]], list[Chunk]]:
    """Give every rank exactly the same number of rows.

    Ranks over :func:`rank_quota` hand their surplus rows to ranks under it (see
    :func:`fill_quotas`). With ``pad=False`` the rows no rank takes (fewer than
    ``num_ranks``: the tail of the surplus pool) are dropped; they follow the shuffled
    chunk order, so they change with the epoch when shuffling is on. With ``pad=True``
    ranks still short repeat the first rows of the epoch (rank 0's first chunks) as
    chunks marked ``padding``; fewer than ``num_ranks`` rows are repeated in all.

    Args:
        shares: Each rank's chunks (known row counts), in reading order.
        files: The files of the chunks, by path.
        pad: Pad short ranks instead of dropping the remainder.

    Returns:
        ``(shares, dropped)``: the equalized shares and the dropped row ranges.

    Raises:
        PlanError: a chunk's row count is unknown.
    """
    total = sum(_rows(c, "equal_batches") for share in shares for c in share)
    quota = rank_quota(total, len(shares), pad)
    stream = [c for share in shares for c in share]
    kept, dropped = fill_quotas(shares, [quota] * len(shares), files)
    if pad:
        for out in kept:
            short = quota - sum(c.num_rows or 0 for c in out)
            if short > 0:
                out.extend(_as_padding(c) for c in take_rows(stream, short, files))
    return kept, dropped


def _as_padding(chunk: Chunk) -> Chunk:
    return Chunk(chunk.path, chunk.start, chunk.stop, chunk.unit, chunk.num_rows, chunk.num_bytes, True)


def worker_quotas(rows: int, num_workers: int, batch_size: int) -> list[int]:
    """Rows per worker so that a rank's batch count does not depend on ``num_workers``.

    The rank's ``rows // batch_size`` full batches are dealt round-robin to workers;
    the remainder ``rows % batch_size`` (the rank's only short batch) goes to the first
    worker with one full batch fewer than the others (worker 0 when all are even).
    The rank then yields ``ceil(rows / batch_size)`` batches for any ``num_workers``.
    """
    if num_workers < 1 or batch_size < 1:
        raise ValueError(f"num_workers and batch_size must be >= 1, got {num_workers}, {batch_size}")
    full, rest = divmod(rows, batch_size)
    base, extra = divmod(full, num_workers)
    quotas = [(base + (w < extra)) * batch_size for w in range(num_workers)]
    quotas[extra] += rest
    return quotas
