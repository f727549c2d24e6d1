"""Translating a pyarrow filter expression into a pyiceberg expression, for pruning only.

The translation is *conservative*: the pyiceberg expression it returns is true for every
row the pyarrow expression keeps (it may keep more). Whatever cannot be translated
exactly becomes ``AlwaysTrue`` inside an ``and``; an untranslatable part of an ``or`` or
a ``not`` makes the whole ``or`` / ``not`` ``AlwaysTrue``. Literals are translated only
when their type fits the column exactly (an int literal on an int column, a float
literal on a double column, ...): ``id > 2.5`` on a long column is not used for pruning,
since pyiceberg would round the literal. The pyarrow expression is always applied to
rows afterwards, so pruning never changes the result, only the work.

pyarrow offers no public way to walk an expression, so this parses its ``str()``
form, which is stable for the small grammar handled here (comparisons of a field with
a literal, ``and`` / ``or`` / ``invert``, ``is_null``, ``is_valid``, ``is_in``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pyiceberg import expressions as ie
from pyiceberg import types as it
from pyiceberg.schema import Schema

__all__ = ["to_iceberg_expression"]

# pyiceberg's expression constructors accept plain names at runtime; their typed
# signatures want bound terms, so they are called through an untyped alias.
_ie: Any = ie

_NUMBER = re.compile(r"-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf)")


class _Untranslatable(Exception):
    """The expression (or a part of it) has no exact pyiceberg equivalent."""


@dataclass(frozen=True)
class _Lit:
    value: Any
    kind: str  # "int", "float", "str", "bool"


def to_iceberg_expression(filters: Any, schema: Schema) -> ie.BooleanExpression:
    """A pyiceberg expression implied by the pyarrow expression ``filters`` (for pruning).

    Args:
        filters: A ``pyarrow.compute.Expression`` (or ``None``).
        schema: The Iceberg schema the filter's field names refer to.

    Returns:
        An expression that holds for every row ``filters`` keeps; ``AlwaysTrue`` when
        nothing could be translated.
    """
    if filters is None:
        return ie.AlwaysTrue()
    expr, _exact = _Translator(schema).term(str(filters).strip())
    return expr


class _Translator:
    def __init__(self, schema: Schema) -> None:
        self.schema = schema

    def term(self, text: str) -> tuple[ie.BooleanExpression, bool]:
        """(expression, exact) for one balanced term; ``AlwaysTrue`` when untranslatable."""
        try:
            return self._term(text)
        except _Untranslatable:
            return ie.AlwaysTrue(), False

    def _term(self, s: str) -> tuple[ie.BooleanExpression, bool]:
        if s.startswith("invert(") and _extent(s, 6) == len(s):
            negated, exact = self.term(s[7:-1].strip())
            return (_ie.Not(negated), True) if exact else (ie.AlwaysTrue(), False)
        m = _IS_NULL.fullmatch(s)
        if m:
            self._field(m.group(1))
            return _ie.IsNull(m.group(1)), True
        m = _IS_VALID.fullmatch(s)
        if m:
            self._field(m.group(1))
            return _ie.NotNull(m.group(1)), True
        m = _IS_IN.fullmatch(s)
        if m:
            field = self._field(m.group(1))
            raw = m.group(2).strip()
            values = [self._fit(field, _literal(v.strip())) for v in _split_items(raw)] if raw else []
            if not values:
                raise _Untranslatable("empty value set")
            return _ie.In(m.group(1), values), True
        if not (s.startswith("(") and _extent(s, 0) == len(s)):
            raise _Untranslatable(s)
        inner = s[1:-1].strip()
        if inner.startswith("(") or re.match(r"(invert|is_null|is_valid|is_in)\(", inner):
            start = inner.index("(") if not inner.startswith("(") else 0
            end = _extent(inner, start)
            left_text, rest = inner[:end], inner[end:]
            for word in (" and ", " or "):
                if rest.startswith(word):
                    left, left_exact = self.term(left_text.strip())
                    right, right_exact = self.term(rest[len(word) :].strip())
                    if word == " and ":
                        return _ie.And(left, right), left_exact and right_exact
                    if left_exact and right_exact:
                        return _ie.Or(left, right), True
                    return ie.AlwaysTrue(), False
            raise _Untranslatable(inner)
        m = _COMPARISON.fullmatch(inner)
        if m is None:
            raise _Untranslatable(inner)
        name, op, raw = m.group(1), m.group(2), m.group(3)
        value = self._fit(self._field(name), _literal(raw))
        return _CMP[op](name, value), True

    def _field(self, name: str) -> it.NestedField:
        try:
            return self.schema.find_field(name)
        except ValueError as exc:
            raise _Untranslatable(name) from exc

    @staticmethod
    def _fit(field: it.NestedField, lit: _Lit) -> Any:
        """The literal's value when its type fits ``field`` exactly, else untranslatable."""
        t = field.field_type
        if isinstance(t, (it.IntegerType, it.LongType)) and lit.kind == "int":
            return lit.value
        if isinstance(t, it.DoubleType) and lit.kind in ("int", "float"):
            if lit.kind == "int" and abs(lit.value) > 2**53:
                raise _Untranslatable("int literal not exact as double")
            value = float(lit.value)
            if value != value:  # NaN is never used for pruning
                raise _Untranslatable("nan")
            return value
        if isinstance(t, it.StringType) and lit.kind == "str":
            return lit.value
        if isinstance(t, it.BooleanType) and lit.kind == "bool":
            return lit.value
        raise _Untranslatable(f"literal {lit.value!r} does not fit {t}")


_IS_NULL = re.compile(r"is_null\(([A-Za-z_][A-Za-z0-9_]*), \{nan_is_null=false\}\)")
_IS_VALID = re.compile(r"is_valid\(([A-Za-z_][A-Za-z0-9_]*)\)")
_IS_IN = re.compile(
    r"is_in\(([A-Za-z_][A-Za-z0-9_]*), \{value_set=\w+:\[(.*)\], null_matching_behavior=\w+\}\)", re.DOTALL
)
_COMPARISON = re.compile(r"([A-Za-z_][A-Za-z0-9_]*) (==|!=|<=|>=|<|>) (.+)", re.DOTALL)
_CMP: dict[str, Any] = {
    "==": ie.EqualTo,
    "!=": ie.NotEqualTo,
    "<": ie.LessThan,
    "<=": ie.LessThanOrEqual,
    ">": ie.GreaterThan,
    ">=": ie.GreaterThanOrEqual,
}


def _extent(s: str, start: int) -> int:
    """One past the ``)`` that closes the ``(`` at ``s[start]`` (string literals skipped)."""
    depth = 0
    i = start
    while i < len(s):
        ch = s[i]
        if ch == '"':
            i += 1
            while i < len(s) and s[i] != '"':
                i += 2 if s[i] == "\\" else 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _Untranslatable("unbalanced")


def _split_items(raw: str) -> list[str]:
    """Split a printed value set on top-level commas (string literals skipped)."""
    items, current, i = [], [], 0
    while i < len(raw):
        ch = raw[i]
        if ch == '"':
            j = i + 1
            while j < len(raw) and raw[j] != '"':
                j += 2 if raw[j] == "\\" else 1
            current.append(raw[i : j + 1])
            i = j + 1
            continue
        if ch == ",":
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    items.append("".join(current))
    return [x for x in items if x.strip()]


def _literal(raw: str) -> _Lit:
    if raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
        try:
            return _Lit(json.loads(raw), "str")
        except ValueError as exc:
            raise _Untranslatable(raw) from exc
    if raw in ("true", "false"):
        return _Lit(raw == "true", "bool")
    if re.fullmatch(r"-?\d+", raw):
        return _Lit(int(raw), "int")
    if _NUMBER.fullmatch(raw):
        return _Lit(float(raw), "float")
    raise _Untranslatable(raw)
