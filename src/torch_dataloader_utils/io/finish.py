"""The last steps every reader applies to a batch: partition columns, row filter, projection."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.storage.partitions import Partitions
from torch_dataloader_utils.storage.schemas import same_but_nullability

__all__ = ["BatchFinisher"]


class BatchFinisher:
    """Adds partition values as constant columns, filters rows, projects to the output.

    Args:
        output_columns: Columns of every output batch, in order.
        partitions: Partition values per file, or ``None``.
        partition_columns: Partition keys to add as columns.
        filters: The row filter, or ``None``.
        schema: The dataset's output schema: batches of files that differ from it only in
            NOT NULL declarations are relabelled to it (no copy), so batches of every
            file can be joined.
    """

    def __init__(
        self,
        output_columns: Sequence[str],
        partitions: Partitions | None = None,
        partition_columns: Sequence[str] = (),
        filters: pc.Expression | None = None,
        schema: pa.Schema | None = None,
    ) -> None:
        self._schema = schema
        self._output_columns = list(output_columns)
        self._partitions = partitions
        self._partition_columns = list(partition_columns)
        self._filters = filters

    def __call__(self, batch: pa.RecordBatch, path: str) -> pa.RecordBatch:
        """The finished batch of rows read from ``path``."""
        if self._partition_columns and self._partitions is not None:
            arrays = list(batch.columns)
            names = list(batch.schema.names)
            for name, array in self._partitions.columns(path, batch.num_rows, self._partition_columns):
                arrays.append(array)
                names.append(name)
            batch = pa.RecordBatch.from_arrays(arrays, names=names)
        if self._filters is not None:
            batch = batch.filter(self._filters)
        if batch.schema.names != self._output_columns:
            batch = batch.select(self._output_columns)
        target = self._schema
        if target is not None and not batch.schema.equals(target) and _relabel(batch.schema, target):
            batch = batch.cast(target)
        return batch


def _relabel(schema: pa.Schema, target: pa.Schema) -> bool:
    """Whether ``schema`` is ``target`` but for NOT NULL declarations."""
    return schema.names == target.names and all(
        same_but_nullability(a.type, b.type) for a, b in zip(schema, target, strict=True)
    )
