"""Resolving requested columns and filter expressions against a schema."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.errors import ConfigError, OptionTypeError, UnknownColumnError

__all__ = ["check_columns", "check_filter", "filter_fields"]


def check_columns(columns: Sequence[str] | None, schema: pa.Schema) -> list[str]:
    """The output columns: ``columns`` checked against ``schema``, or every field.

    Raises:
        UnknownColumnError: a column is not in the schema (the message lists them all).
        ConfigError: ``columns`` is not a list of distinct strings.
    """
    if columns is None:
        return list(schema.names)
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise ConfigError(f"columns={columns!r} must be a list of column names, e.g. ['f0', 'label']")
    if len(set(columns)) != len(columns):
        raise ConfigError(f"columns={list(columns)!r} names a column twice")
    if not columns:
        raise ConfigError("columns=[] selects nothing; pass None for every column")
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise UnknownColumnError(
            f"columns={list(columns)!r}: {missing} not found; available columns: {schema.names}"
        )
    return list(columns)


def check_filter(filters: object, schema: pa.Schema) -> pc.Expression | None:
    """Validate ``filters`` as a boolean pyarrow expression over ``schema``.

    Raises:
        OptionTypeError: ``filters`` is not a ``pyarrow.compute.Expression`` (a
            ``TypeError``, as in 0.2.0).
        UnknownColumnError: it references a column that does not exist.
    """
    if filters is None:
        return None
    if not isinstance(filters, pc.Expression):
        raise OptionTypeError(
            f"filters={filters!r} must be a pyarrow.compute.Expression, "
            "e.g. pyarrow.compute.field('label') >= 0"
        )
    try:
        mask = pa.table(schema.empty_table()).filter(filters)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        if "No match for FieldRef" in str(exc):
            raise UnknownColumnError(f"filters={filters}: {exc}; available columns: {schema.names}") from exc
        raise ConfigError(f"filters={filters} cannot be applied to this data: {exc}") from exc
    del mask
    return filters


def filter_fields(filters: pc.Expression | None, schema: pa.Schema) -> list[str]:
    """The top-level fields of ``schema`` that ``filters`` reads.

    Found by elimination: a field is needed when the filter fails on the schema without
    it. This needs no parsing of the expression and handles nested references.
    """
    if filters is None:
        return []
    needed = []
    for i, name in enumerate(schema.names):
        probe = schema.remove(i).empty_table()
        try:
            probe.filter(filters)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            needed.append(name)
    return needed
