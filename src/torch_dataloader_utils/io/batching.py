"""Re-batching a stream of record batches to exactly ``batch_size`` rows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa

from torch_dataloader_utils.io.bad import is_standin

__all__ = ["concat_batches", "rebatch", "with_flag"]


def rebatch(
    batches: Iterable[pa.RecordBatch], batch_size: int, drop_last: bool = False
) -> Iterator[pa.RecordBatch]:
    """Yield batches of exactly ``batch_size`` rows; the last may be shorter.

    Batches are cut from the input as zero-copy slices; rows are only copied when an
    output batch is assembled from pieces (across row groups or files), so reading
    large batches and cutting them here costs one copy per boundary, not per batch.

    Args:
        batches: The input stream (any sizes, one schema).
        batch_size: Rows per output batch.
        drop_last: Drop the final short batch instead of yielding it.
    """
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        offset = 0
        if pending:
            need = batch_size - count
            if n < need:
                pending.append(batch)
                count += n
                continue
            pending.append(batch.slice(0, need))
            yield concat_batches(pending)
            pending = []
            count = 0
            offset = need
        if offset == 0 and n == batch_size:
            yield batch
            continue
        while n - offset >= batch_size:
            yield batch.slice(offset, batch_size)
            offset += batch_size
        if offset < n:
            pending.append(batch.slice(offset))
            count = n - offset
    if pending and not drop_last:
        yield concat_batches(pending)


def concat_batches(
    pieces: Sequence[pa.RecordBatch], memory_pool: pa.MemoryPool | None = None
) -> pa.RecordBatch:
    """``pieces`` (one schema) as one record batch: contiguous columns, one copy (none for one piece).

    ``memory_pool``: where the copy is allocated (``None``: Arrow's default pool).
    """
    if len(pieces) == 1:
        return pieces[0]
    concat = getattr(pa, "concat_batches", None)
    if concat is not None:  # pyarrow >= 19
        return concat(pieces, memory_pool=memory_pool)  # type: ignore[no-any-return]
    table = pa.Table.from_batches(pieces).combine_chunks(memory_pool=memory_pool)
    out = table.to_batches()
    return out[0] if out else pa.RecordBatch.from_pylist([], schema=table.schema)


def with_flag(batches: Iterable[pa.RecordBatch], name: str, value: bool) -> Iterator[pa.RecordBatch]:
    """Append a constant boolean column ``name`` to every batch (e.g. ``_is_padding``).

    A stand-in batch (rows of a unit that did not decode, :func:`~.bad.is_standin`) is
    flagged ``True`` whatever ``value`` is.
    """
    for batch in batches:
        flag_value = value or is_standin(batch)
        flag = pa.repeat(pa.scalar(flag_value, pa.bool_()), batch.num_rows)  # no per-row Python list
        yield pa.RecordBatch.from_arrays([*batch.columns, flag], names=[*batch.schema.names, name])
