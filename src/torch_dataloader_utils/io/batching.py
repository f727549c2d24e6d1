"""Re-batching a stream of record batches to exactly ``batch_size`` rows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

__all__ = ["rebatch", "with_flag"]


def rebatch(
    batches: Iterable[pa.RecordBatch], batch_size: int, drop_last: bool = False
) -> Iterator[pa.RecordBatch]:
    """Yield batches of exactly ``batch_size`` rows; the last may be shorter.

    Batches that already have the right size pass through without a copy; rows are
    only copied when a batch is assembled from pieces (across row groups or files).

    Args:
        batches: The input stream (any sizes, one schema).
        batch_size: Rows per output batch.
        drop_last: Drop the final short batch instead of yielding it.
    """
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if not pending and batch.num_rows == batch_size:
            yield batch
            continue
        pending.append(batch)
        count += batch.num_rows
        if count < batch_size:
            continue
        table = pa.Table.from_batches(pending)
        offset = 0
        while count - offset >= batch_size:
            piece = table.slice(offset, batch_size)
            yield _one_batch(piece)
            offset += batch_size
        rest = table.slice(offset)
        pending = rest.to_batches() if rest.num_rows else []
        count = rest.num_rows
    if pending and not drop_last:
        yield _one_batch(pa.Table.from_batches(pending))


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.to_batches()
    if len(batches) == 1:
        return batches[0]
    return table.combine_chunks().to_batches()[0]


def with_flag(batches: Iterable[pa.RecordBatch], name: str, value: bool) -> Iterator[pa.RecordBatch]:
    """Append a constant boolean column ``name`` to every batch (e.g. ``_is_padding``)."""
    for batch in batches:
        flag = pa.array([value] * batch.num_rows, pa.bool_())
        yield pa.RecordBatch.from_arrays([*batch.columns, flag], names=[*batch.schema.names, name])
