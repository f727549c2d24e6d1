"""Hypothesis strategies for ragged Arrow columns (lists with null lists, null items, slices)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import strategies as st

__all__ = ["list_arrays"]


@st.composite
def list_arrays(draw: st.DrawFn) -> pa.Array:  # type: ignore[type-arg]
    """Random ``list<int32>`` / ``large_list<float64>`` arrays with null lists, null items and slices."""
    item = draw(st.sampled_from([pa.int32(), pa.float64()]))
    value = st.integers(-(2**31), 2**31 - 1) if item == pa.int32() else st.floats(allow_nan=False, width=64)
    rows = draw(
        st.lists(st.one_of(st.none(), st.lists(st.one_of(st.none(), value), max_size=6)), max_size=25)
    )
    kind = draw(st.sampled_from([pa.list_, pa.large_list]))
    array = pa.array(rows, kind(item))
    start = draw(st.integers(0, len(array)))
    return array.slice(start, draw(st.integers(0, len(array) - start)))
