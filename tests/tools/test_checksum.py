"""Checksums of columns and of whole rows: order- and batching-independent, and they see moved values."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from torch_dataloader_utils.tools.checksum import Checksums


def _table(n: int) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    return pa.table({"id": ids, "x": ids * 0.5, "s": pa.array([f"r{i}" if i % 7 else None for i in ids])})


def _sums(*parts: pa.Table | pa.RecordBatch) -> Checksums:
    out = Checksums()
    for part in parts:
        out.add(part)
    return out


@given(n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1), cut=st.integers(0, 300))
def test_the_same_rows_in_any_order_and_batching_give_the_same_checksums(n: int, seed: int, cut: int) -> None:
    table = _table(n)
    shuffled = table.take(np.random.default_rng(seed).permutation(n))
    cut = min(cut, n)
    # Another column order and int32 ids (same values): equal too.
    other = shuffled.select(["s", "x", "id"]).set_column(2, "id", shuffled.column("id").cast(pa.int32()))
    split = Checksums.total([_sums(other.slice(0, cut)), _sums(other.slice(cut))])
    assert split == _sums(table)
    assert not _sums(table).differences(split)


def test_values_moved_between_rows_change_only_the_whole_row_checksum() -> None:
    table = _table(100)
    x = table.column("x").to_numpy().copy()
    x[:10] = x[:10][::-1]  # every column keeps its values; rows 0-9 do not
    moved = table.set_column(1, "x", pa.array(x))
    a, b = _sums(table), _sums(moved)
    assert a.columns == b.columns
    assert a.whole_rows != b.whole_rows
    assert a.differences(b) == [
        "every column holds the same values, but not in the same rows: values were moved "
        "between rows (the whole-row checksum differs)"
    ]


def test_a_changed_value_is_named_by_its_column() -> None:
    table = _table(50)
    changed = table.set_column(1, "x", pa.array(np.r_[[99.0], table.column("x").to_numpy()[1:]]))
    assert _sums(table).differences(_sums(changed)) == [
        "column 'x' holds other values in the output (checksum differs)"
    ]
