"""The last steps every reader applies to a batch: partition columns, row filter, projection."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.storage.partitions import Partitions

__all__ = ["BatchFinisher"]


class BatchFinisher:
    """Adds partition values as constant columns, filters rows, projects to the output.

    Args:
        output_columns: Columns of every output batch, in order.
        partitions: Partition values per file, or ``None``.
        partition_columns: Partition keys to add as columns.
        filters: The row filter, or ``None``.
    """

    def __init__(
        self,
        output_columns: Sequence[str],
        partitions: Partitions | None = None,
        partition_columns: Sequence[str] = (),
        filters: pc.Expression | None = None,
    ) -> None:
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
        return batch
