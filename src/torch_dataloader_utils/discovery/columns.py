"""Resolving requested columns and filter expressions against a schema."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.errors import ConfigError, OptionTypeError, UnknownColumnError

__all__ = ["check_columns", "check_filter", "check_filter_type", "filter_fields"]


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
    filters = check_filter_type(filters)
    if filters is None:
        return None
    try:
        mask = pa.table(schema.empty_table()).filter(filters)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        if "No match for FieldRef" in str(exc):
            raise UnknownColumnError(f"filters={filters}: {exc}; available columns: {schema.names}") from exc
        shown = ", ".join(f"{f.name}: {f.type}" for f in list(schema)[:20])
        more = f", ... ({len(schema)} columns)" if len(schema) > 20 else ""
        raise ConfigError(
            f"filters={filters} cannot be applied to this data ({exc}); compare each column with a value "
            f"of its type (a number for a number column, a string for text); the columns: {shown}{more}"
        ) from exc
    del mask
    return filters


def check_filter_type(filters: object) -> pc.Expression | None:
    """``filters`` if it is ``None`` or a ``pyarrow.compute.Expression``; anything else is refused.

    Checked where the options are built, before any file is listed, as 0.2.0 did: a dict
    or a string is a :class:`TypeError` whatever else is wrong (a missing path...).

    Raises:
        OptionTypeError: naming the value, its type and the fix (a ``TypeError`` too).
    """
    if filters is None or isinstance(filters, pc.Expression):
        return filters
    hint = ""
    if isinstance(filters, str):
        hint = " (a string is not parsed: build the expression with pyarrow.compute)"
    elif isinstance(filters, (list, tuple)):
        hint = " (not the list-of-tuples form of pyarrow.parquet)"
    raise OptionTypeError(
        f"filters={filters!r} (a {type(filters).__name__}) must be a pyarrow.compute.Expression{hint}, "
        "e.g. pyarrow.compute.field('label') >= 0"
    )


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
