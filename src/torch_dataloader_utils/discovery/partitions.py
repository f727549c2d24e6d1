"""Hive partition values (``key=value`` directories) as typed Arrow scalars."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.discovery.listing import ListedFile, parse_hive_keys
from torch_dataloader_utils.errors import SchemaMismatchError

__all__ = ["Partitions", "infer_partitions"]


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


def _infer_type(raw: list[str]) -> tuple[pa.DataType, list[object]]:
    try:
        return pa.int64(), [int(v) for v in raw]
    except ValueError:
        pass
    try:
        return pa.float64(), [float(v) for v in raw]
    except ValueError:
        return pa.string(), list(raw)


def infer_partitions(files: Sequence[ListedFile]) -> Partitions:
    """Read ``key=value`` directories and give each key one type across all files.

    A key is int64 if every value is an integer, float64 if every value is a number,
    else string. Every file must have the same keys in the same order.

    Raises:
        SchemaMismatchError: two files have different partition keys.
    """
    per_file = {f.path: parse_hive_keys(f) for f in files}
    keys: list[str] | None = None
    first = ""
    for path, pairs in per_file.items():
        names = [k for k, _ in pairs]
        if keys is None:
            keys, first = names, path
        elif names != keys:
            raise SchemaMismatchError(
                f"partitioning='hive': {first!r} has partition keys {keys} but {path!r} has "
                f"{names}; every file needs the same key=value directories"
            )
    keys = keys or []
    fields = []
    typed: dict[str, list[object]] = {p: [] for p in per_file}
    for i, key in enumerate(keys):
        raw = [pairs[i][1] for pairs in per_file.values()]
        present = [v for v in raw if v is not None]
        dtype, parsed = _infer_type(present)
        it = iter(parsed)
        for path, value in zip(per_file, raw, strict=True):
            typed[path].append(None if value is None else next(it))
        fields.append(pa.field(key, dtype))
    return Partitions(pa.schema(fields), {p: tuple(v) for p, v in typed.items()})
