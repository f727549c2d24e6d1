"""Schemas that differ only in NOT NULL declarations, as Spark and others write them.

Spark marks a column ``NOT NULL`` in the files of one job and nullable in another, so
files of one dataset can disagree on nullability alone. Such files hold the same data
types: discovery unifies them to the nullable type (:func:`nullable_type`), and readers
relabel each batch to that schema without copying (:func:`same_but_nullability`).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["nullable_type", "same_but_nullability"]


def nullable_type(t: Any) -> pa.DataType:
    """``t`` with every nested field nullable (list items, struct fields, map values)."""
    out: pa.DataType
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        item = t.value_field.with_type(nullable_type(t.value_type)).with_nullable(True)
        if pa.types.is_fixed_size_list(t):
            out = pa.list_(item, t.list_size)
        else:
            out = pa.large_list(item) if pa.types.is_large_list(t) else pa.list_(item)
        return out
    if pa.types.is_struct(t):
        return pa.struct(
            [
                t.field(i).with_type(nullable_type(t.field(i).type)).with_nullable(True)
                for i in range(t.num_fields)
            ]
        )
    if pa.types.is_map(t):
        item = t.item_field.with_type(nullable_type(t.item_type)).with_nullable(True)
        out = pa.map_(t.key_field, item, t.keys_sorted)  # type: ignore[call-overload]
        return out
    out = t
    return out


def same_but_nullability(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether ``a`` and ``b`` are the same type once every NOT NULL is dropped."""
    return a.equals(b) or nullable_type(a).equals(nullable_type(b))
