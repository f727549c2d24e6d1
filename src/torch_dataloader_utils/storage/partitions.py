"""Hive partition values (``key=value`` directories) of files: the value type.

Discovery infers them from the listing (:mod:`torch_dataloader_utils.discovery.partitions`);
readers add them to batches as constant columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Partitions"]


@dataclass(frozen=True)
class Partitions:
    """Typed partition values of every file.

    Attributes:
        schema: One field per partition key, typed int64, float64 or string.
        values: For each file path, its values in ``schema`` order (``None`` = null).
    """

    schema: pa.Schema
    values: dict[str, tuple[object, ...]]

    def expression(self, path: str) -> pc.Expression | None:
        """``key == value`` for every key of the file, for pruning with statistics."""
        expr: pc.Expression | None = None
        for f, value in zip(self.schema, self.values.get(path, ()), strict=True):
            term = (
                pc.field(f.name).is_null() if value is None else pc.field(f.name) == pa.scalar(value, f.type)
            )
            expr = term if expr is None else expr & term
        return expr

    def columns(self, path: str, num_rows: int, names: Sequence[str]) -> list[tuple[str, pa.Array[Any]]]:
        """Constant columns of the file's partition values, for the given key names."""
        out = []
        values = self.values[path]
        for i, f in enumerate(self.schema):
            if f.name in names:
                out.append((f.name, pa.repeat(pa.scalar(values[i], f.type), num_rows)))
        return out
