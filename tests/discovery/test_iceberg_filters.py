"""pyarrow filter -> pyiceberg expression: exact where types fit, AlwaysTrue where not."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg import expressions as ie
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    FloatType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
)

from torch_dataloader_utils.discovery.iceberg_filters import to_iceberg_expression

SCHEMA = Schema(
    NestedField(1, "id", LongType()),
    NestedField(2, "x", DoubleType()),
    NestedField(3, "s", StringType()),
    NestedField(4, "b", BooleanType()),
    NestedField(5, "t", TimestampType()),
    NestedField(6, "f", FloatType()),
)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (pc.field("id") > 2, ie.GreaterThan("id", 2)),
        (pc.field("id") != 3, ie.NotEqualTo("id", 3)),
        (pc.field("x") <= -1.5e-7, ie.LessThanOrEqual("x", -1.5e-7)),
        (pc.field("x") == 2, ie.EqualTo("x", 2.0)),
        (pc.field("s") == 'a "q"', ie.EqualTo("s", 'a "q"')),
        (pc.field("b") == True, ie.EqualTo("b", True)),  # noqa: E712
        (pc.field("id").isin([1, 2]), ie.In("id", [1, 2])),
        (pc.field("s").isin(["a", "b,c"]), ie.In("s", ["a", "b,c"])),
        (pc.field("id").is_null(), ie.IsNull("id")),
        (pc.field("id").is_valid(), ie.NotNull("id")),
        (~(pc.field("id") < 5), ie.Not(ie.LessThan("id", 5))),
        ((pc.field("id") > 1) | (pc.field("s") == "z"), ie.Or(ie.GreaterThan("id", 1), ie.EqualTo("s", "z"))),
        # Untranslatable parts of an "and" are dropped; the rest still prunes.
        ((pc.field("id") > 2.5) & (pc.field("id") < 9), ie.And(ie.AlwaysTrue(), ie.LessThan("id", 9))),
        (
            (pc.field("t") > pa.scalar(1, pa.timestamp("us"))) & (pc.field("s") == "a"),
            ie.And(ie.AlwaysTrue(), ie.EqualTo("s", "a")),
        ),
    ],
)
def test_translates_exactly(expr: pc.Expression, expected: ie.BooleanExpression) -> None:
    assert to_iceberg_expression(expr, SCHEMA) == expected


@pytest.mark.parametrize(
    "expr",
    [
        pc.field("id") > 2.5,  # pyiceberg would round the literal: never prune on it
        ~(pc.field("id") > 2.5),
        (pc.field("id") > 2.5) | (pc.field("id") < 1),
        pc.field("f") > 0.1,  # float32 column: a double literal is not exact
        pc.field("s") == 1,
        pc.field("missing") == 1,
        pc.field("id").isin([1, None]),
        pc.field("id") + 1 > 3,
        pc.field("x").is_nan(),
    ],
)
def test_untranslatable_filters_never_prune(expr: pc.Expression) -> None:
    assert to_iceberg_expression(expr, SCHEMA) == ie.AlwaysTrue()


def test_none_is_always_true() -> None:
    assert to_iceberg_expression(None, SCHEMA) == ie.AlwaysTrue()
