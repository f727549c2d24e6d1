"""rebatch: exact batch sizes across input boundaries; zero-copy pass-through."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_dataloader_utils.io.batching import rebatch


def _batches(sizes: list[int]) -> list[pa.RecordBatch]:
    out = []
    start = 0
    for n in sizes:
        ids = pa.array(range(start, start + n), pa.int64())
        out.append(
            pa.RecordBatch.from_arrays(
                [ids, pa.array([f"s{i}" for i in range(start, start + n)])], ["id", "s"]
            )
        )
        start += n
    return out


def _ids(batches: list[pa.RecordBatch]) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


def test_batches_of_the_right_size_pass_through_without_copy() -> None:
    inputs = _batches([4, 4, 4])
    out = list(rebatch(inputs, 4))
    assert len(out) == 3
    for a, b in zip(inputs, out, strict=True):
        assert a is b, "the very same batch object is yielded"
        assert a.column(0).buffers()[1].address == b.column(0).buffers()[1].address


def test_slices_of_one_large_batch_share_its_memory() -> None:
    (big,) = _batches([10])
    out = list(rebatch([big], 4))
    assert [b.num_rows for b in out] == [4, 4, 2]
    base = big.column(0).buffers()[1].address
    for k, b in enumerate(out):
        assert b.column(0).buffers()[1].address == base, "a slice of one input is a view, not a copy"
        assert b.column(0).offset == 4 * k


def test_pieces_are_combined_across_boundaries() -> None:
    out = list(rebatch(_batches([3, 1, 5, 2, 6]), 4))
    assert [b.num_rows for b in out] == [4, 4, 4, 4, 1]
    assert _ids(out) == list(range(17))
    assert out[1].column("s").to_pylist() == ["s4", "s5", "s6", "s7"]


def test_drop_last() -> None:
    out = list(rebatch(_batches([3, 3, 3]), 4, drop_last=True))
    assert [b.num_rows for b in out] == [4, 4]
    assert _ids(out) == list(range(8))


def test_drop_last_with_exact_multiple_keeps_everything() -> None:
    out = list(rebatch(_batches([5, 3]), 4, drop_last=True))
    assert _ids(out) == list(range(8))


def test_empty_batches_are_skipped() -> None:
    out = list(rebatch(_batches([0, 2, 0, 2, 0]), 4))
    assert [b.num_rows for b in out] == [4]
    assert list(rebatch(_batches([0, 0]), 4)) == []
    assert list(rebatch([], 4)) == []


def test_full_batch_after_pending_rows_is_not_reordered() -> None:
    # A batch of exactly batch_size must not overtake rows already pending.
    out = list(rebatch(_batches([2, 4, 2]), 4))
    assert _ids(out) == list(range(8))
    assert [b.num_rows for b in out] == [4, 4]


def test_output_is_a_single_record_batch_per_step() -> None:
    out = list(rebatch(_batches([1, 1, 1, 1, 1]), 3))
    assert all(isinstance(b, pa.RecordBatch) for b in out)
    assert [b.num_rows for b in out] == [3, 2]


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=40), max_size=25),
    batch_size=st.integers(min_value=1, max_value=50),
    drop_last=st.booleans(),
)
def test_property_exact_sizes_and_order(sizes: list[int], batch_size: int, drop_last: bool) -> None:
    total = sum(sizes)
    out = list(rebatch(_batches(sizes), batch_size, drop_last))
    kept = total - (total % batch_size if drop_last else 0)
    assert _ids(out) == list(range(kept))
    assert all(b.num_rows == batch_size for b in out[:-1])
    if out:
        assert 0 < out[-1].num_rows <= batch_size
        if drop_last:
            assert out[-1].num_rows == batch_size
    assert all(b.schema.names == ["id", "s"] for b in out)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_tiny_batch_sizes(batch_size: int) -> None:
    out = list(rebatch(_batches([3, 2]), batch_size))
    assert [b.num_rows for b in out] == [batch_size] * (5 // batch_size) + (
        [5 % batch_size] if 5 % batch_size else []
    )
    assert _ids(out) == list(range(5))
