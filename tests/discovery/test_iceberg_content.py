"""Row content hashes and the multiset match behind incremental Iceberg epochs."""

from __future__ import annotations

import decimal
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_dataloader_utils.discovery.iceberg_content import match, row_hashes
from torch_dataloader_utils.errors import DiscoveryError

# Column types an Iceberg table maps to Arrow, and values for each (no NaN: rows are
# compared as Python values here, where NaN != NaN).
_TYPES: list[tuple[pa.DataType, st.SearchStrategy[Any]]] = [
    (pa.int64(), st.integers(-3, 3)),
    (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    (pa.float64(), st.sampled_from([0.0, 1.5, -2.25, 1e300])),
    (pa.bool_(), st.booleans()),
    (pa.string(), st.text(alphabet="ab\u00e9", max_size=4)),
    (pa.binary(), st.binary(max_size=3)),
    (pa.decimal128(9, 2), st.sampled_from([decimal.Decimal("1.10"), decimal.Decimal("-3.00")])),
    (pa.binary(3), st.binary(min_size=3, max_size=3)),
    (pa.list_(pa.int64()), st.lists(st.integers(0, 2) | st.none(), max_size=3)),
    (
        pa.struct([("a", pa.int64()), ("b", pa.string())]),
        st.fixed_dictionaries({"a": st.integers(0, 2), "b": st.sampled_from(["x", ""])}),
    ),
    (
        pa.map_(pa.string(), pa.int64()),
        st.lists(st.tuples(st.sampled_from(["k", "j"]), st.integers(0, 1)), max_size=2),
    ),
]


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    """Small tables of 1-3 columns of random Iceberg-like types, with nulls and repeated rows."""
    kinds = draw(st.lists(st.sampled_from(range(len(_TYPES))), min_size=1, max_size=3))
    n = draw(st.integers(0, 12))
    columns = []
    for k in kinds:
        t, values = _TYPES[k]
        pool = draw(st.lists(st.none() | values, min_size=1, max_size=3))  # few values: repeats
        columns.append(pa.array([draw(st.sampled_from(pool)) for _ in range(n)], t))
    return pa.table(columns, names=[f"c{i}" for i in range(len(columns))])


def _key(value: Any) -> Any:
    """A Python value made hashable and exact (maps as item lists, -0.0 apart from 0.0)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    if isinstance(value, float):
        return ("f", value.hex())
    return value


@given(tables(), st.data())
def test_equal_rows_hash_alike_and_different_rows_apart(table: pa.Table, data: st.DataObject) -> None:
    rows = [tuple(_key(v) for v in row.values()) for row in table.to_pylist()]
    hashes = [tuple(h) for h in row_hashes(table.columns, table.num_rows).tolist()]
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (rows[i] == rows[j]) == (hashes[i] == hashes[j])
    # Chunked, sliced or offset arrays hash their values, not their layout.
    if table.num_rows > 1:
        cut = data.draw(st.integers(1, table.num_rows - 1))
        chunked = [
            pa.chunked_array([*c.slice(0, cut).chunks, *c.slice(cut).chunks], c.type) for c in table.columns
        ]
        assert row_hashes(chunked, table.num_rows).tolist() == [list(h) for h in hashes]
        tail = row_hashes(table.slice(cut).columns, table.num_rows - cut).tolist()
        assert tail == [list(h) for h in hashes[cut:]]


def test_nulls_empties_and_neighbouring_values_differ() -> None:
    columns = [
        pa.array(["ab", "a", "", None, "b"]),
        pa.array([[1], [1, None], [], None, [None]], pa.list_(pa.int64())),
    ]
    hashes = {tuple(h) for h in row_hashes(columns, 5).tolist()}
    assert len(hashes) == 5
    split = row_hashes([pa.array(["ab", "c"])], 2)
    assert not (split == row_hashes([pa.array(["a", "bc"])], 2)).all(axis=1).any()
    assert not (row_hashes([pa.array([0.0])], 1) == row_hashes([pa.array([-0.0])], 1)).all()
    # Order inside a value counts: bytes of a string, items of a list.
    for values in (["ab", "ba"], [[1, 2], [2, 1]], [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}]):
        first, second = row_hashes([pa.array(values)], 2)
        assert (first != second).all()


def test_a_type_without_a_hash_is_a_discovery_error() -> None:
    union = pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array([1]), pa.array(["a"])])
    with pytest.raises(DiscoveryError, match="cannot be compared by content"):
        row_hashes([union], 1)


hash_lists = st.lists(st.integers(0, 4), max_size=12).map(
    lambda v: np.asarray([[x, x * 7] for x in v], dtype=np.uint64).reshape(-1, 2)
)


@given(hash_lists, hash_lists)
def test_match_pairs_each_value_min_times_first_ones_first(removed: np.ndarray, added: np.ndarray) -> None:
    removed_hit, added_hit = match(removed, added)
    left, right = Counter(removed[:, 0].tolist()), Counter(added[:, 0].tolist())
    for value in set(left) | set(right):
        pairs = min(left[value], right[value])
        for side, hit in ((removed, removed_hit), (added, added_hit)):
            where = [i for i in range(len(side)) if side[i, 0] == value]
            assert [i for i in where if hit[i]] == where[:pairs]
