"""rebatch: exact batch sizes, rows in order, zero-copy slices of large reads."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from torch_dataloader_utils.io.batching import rebatch


def _batches(sizes: list[int]) -> list[pa.RecordBatch]:
    out, start = [], 0
    for n in sizes:
        ids = list(range(start, start + n))
        out.append(pa.record_batch({"id": pa.array(ids, pa.int64()), "s": pa.array([str(i) for i in ids])}))
        start += n
    return out


@given(
    sizes=st.lists(st.integers(0, 300), max_size=12),
    batch_size=st.integers(1, 200),
    drop_last=st.booleans(),
)
def test_rebatch_exact_sizes_and_order(sizes: list[int], batch_size: int, drop_last: bool) -> None:
    total = sum(sizes)
    out = list(rebatch(_batches(sizes), batch_size, drop_last))
    full, rest = divmod(total, batch_size)
    expected_sizes = [batch_size] * full + ([rest] if rest and not drop_last else [])
    assert [b.num_rows for b in out] == expected_sizes
    ids = [i for b in out for i in b.column("id").to_pylist()]
    assert ids == list(range(len(ids)))
    assert [s for b in out for s in b.column("s").to_pylist()] == [str(i) for i in ids]


def test_rebatch_slices_large_batches_without_copy() -> None:
    (big,) = _batches([1000])
    out = list(rebatch([big], 100))
    base = big.column("id").buffers()[1].address
    assert [b.column("id").buffers()[1].address for b in out] == [base] * 10
