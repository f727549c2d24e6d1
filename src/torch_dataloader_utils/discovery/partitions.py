"""Hive partition values (``key=value`` directories) as typed Arrow scalars."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from torch_dataloader_utils.discovery.listing import ListedFile, parse_hive_keys
from torch_dataloader_utils.errors import SchemaMismatchError
from torch_dataloader_utils.storage.partitions import Partitions

__all__ = ["Partitions", "infer_partitions"]


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
