"""Batches leave a worker in groups; the first group is one batch, so the loop starts at once."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.config import OutputConfig
from torch_dataloader_utils.io.base import ReaderBase
from torch_dataloader_utils.packing import converter_for
from torch_dataloader_utils.runtime.emit import (
    GROUP_MAX_BATCHES,
    BatchParts,
    Positions,
    grouped,
    plain_arrays,
)
from torch_dataloader_utils.runtime.workstats import WorkStats
from torch_dataloader_utils.transfer import JoinedColumn, pack_group


def test_first_group_is_one_batch_then_groups_fill_up() -> None:
    batches = [pa.record_batch({"id": pa.array(range(i * 4, i * 4 + 4))}) for i in range(10)]
    positions = Positions(0, 0, 1)
    positions._starts.append(0)  # one piece, read from its start
    work = WorkStats(ReaderBase(), 1, None)  # type: ignore[arg-type]  # counts nothing
    groups = list(grouped(iter(batches), lambda b: {"id": b.column(0).to_pylist()}, positions, work))
    sizes = [len(g.tag) for g in groups if g.tag]  # (a last, empty group may carry the timers)
    assert sizes[0] == 1  # the first batch travels alone
    assert sum(sizes) == 10
    assert sizes == [1, 2, 4, 3]  # small batches: groups double up to GROUP_MAX_BATCHES
    assert GROUP_MAX_BATCHES > 4


def test_arrow_bytes_measures_every_nth_batch_and_estimates_between() -> None:
    from torch_dataloader_utils.runtime.emit import ArrowBytes

    table = pa.table(
        {"a": pa.array(range(4096), pa.int64()), "s": pa.array([f"v{i:06d}" for i in range(4096)])}
    )
    [whole] = table.combine_chunks().to_batches()
    slices = [whole.slice(i * 64, 64) for i in range(64)]
    measure = ArrowBytes()
    got = [measure(b) for b in slices]
    every = ArrowBytes.EVERY
    for i, (b, n) in enumerate(zip(slices, got, strict=True)):
        if i % every == 0:
            assert n == b.nbytes  # measured
        else:  # estimated at the last measured batch's bytes per row
            base = slices[i - i % every]
            assert n == int(b.num_rows * base.nbytes / base.num_rows)
    assert abs(sum(got) - sum(b.nbytes for b in slices)) <= 0.02 * sum(b.nbytes for b in slices)


def test_groups_without_page_locked_segments_stay_small() -> None:
    """Issue 37: 32 MiB groups raised a CPU loader's peak PSS 1.29x over 0.5.0's; 8 MiB without pinning."""
    import numpy as np

    from torch_dataloader_utils.runtime.emit import GROUP_BYTES, UNPINNED_GROUP_BYTES, group_cap

    assert UNPINNED_GROUP_BYTES == 8 << 20 < GROUP_BYTES  # the page-locked path keeps 32 MiB groups
    mib = pa.array(np.arange(1 << 17, dtype=np.int64))  # 1 MiB per batch
    batches = [pa.record_batch({"id": mib}) for _ in range(24)]
    positions = Positions(0, 0, 1)
    positions._starts.append(0)
    work = WorkStats(ReaderBase(), 1, None)  # type: ignore[arg-type]
    # The main process sizes a full group from the bytes per row (8 bytes here): 8 MiB, or 32 pinned.
    assert group_cap(8.0, 1 << 17) == 8
    assert group_cap(8.0, 1 << 17, pinned=True) == 32
    cap = group_cap(8.0, 1 << 17)
    groups = list(grouped(iter(batches), lambda b: {"id": b.column(0).to_numpy()}, positions, work, cap=cap))
    sizes = [len(g.tag) for g in groups if g.tag]
    assert sizes == [1, 2, 4, 8, 8, 1]  # doubling, then capped at 8 MiB (was 1, 2, 4, 8, 9)


# -- a batch as its parts (a mix's) ------------------------------------------------------
plain_types = st.sampled_from(
    [
        pa.int8(),
        pa.int32(),
        pa.int64(),
        pa.uint8(),
        pa.uint32(),
        pa.float16(),
        pa.float32(),
        pa.float64(),
        pa.bool_(),
    ]
)


@st.composite
def parted_batches(draw: st.DrawFn) -> tuple[list[pa.RecordBatch], np.ndarray | None]:
    """Parts of one batch (the same schema of plain columns, fixed-size lists too) and maybe a row order."""
    types = draw(st.lists(plain_types, min_size=1, max_size=4))
    if draw(st.booleans()):
        types.append(pa.list_(draw(plain_types), draw(st.integers(1, 3))))
    sizes = draw(st.lists(st.integers(0, 9), min_size=1, max_size=4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    parts = []
    for n in sizes:
        columns = {}
        for c, t in enumerate(types):
            fixed = pa.types.is_fixed_size_list(t)
            inner, width = (t.value_type, t.list_size) if fixed else (t, 1)
            raw = rng.integers(0, 100, n * width)
            values = pa.array(
                raw % 2 == 1 if pa.types.is_boolean(inner) else raw.astype(inner.to_pandas_dtype())
            )
            columns[f"c{c}"] = pa.FixedSizeListArray.from_arrays(values, width) if fixed else values
        parts.append(pa.record_batch(columns))
    rows = sum(sizes)
    order = rng.permutation(rows) if draw(st.booleans()) and rows > 1 else None
    return parts, order


@settings(max_examples=80)
@given(parted=parted_batches())
def test_a_batch_joined_in_the_transfer_buffer_is_the_converted_batch(
    parted: tuple[list[pa.RecordBatch], np.ndarray | None],
) -> None:
    """A mix's batch travels as its parts' columns, written once into the buffer: the same tensors
    (dtypes, shapes, values, row order) as converting the joined batch."""
    parts, order = parted
    batch = BatchParts(parts, order)
    arrays = batch.arrays()
    assert arrays is not None
    views = [plain_arrays(p) for p in parts]  # made once per decoded batch, as a mix's lanes do
    assert all(v is not None for v in views)
    made = BatchParts(parts, order, views=views).arrays()  # type: ignore[arg-type]
    assert made is not None
    assert {k: [a.tolist() for a in v] for k, v in made.items()} == {
        k: [a.tolist() for a in v] for k, v in arrays.items()
    }
    sent = {name: JoinedColumn(columns, order) for name, columns in arrays.items()}
    got = pickle.loads(pickle.dumps(pack_group([sent, sent])))
    expected = converter_for(parts[0].schema, OutputConfig()).convert_for_transfer(batch.joined())
    for received in got:
        assert received.keys() == expected.keys()
        for name, tensor in expected.items():
            assert received[name].dtype == tensor.dtype, name
            assert torch.equal(received[name], tensor), name


def test_parts_with_nulls_or_strings_are_converted_as_one_batch() -> None:
    with_nulls = pa.record_batch({"a": pa.array([1, None, 3])})
    assert BatchParts([with_nulls]).arrays() is None
    strings = pa.record_batch({"s": pa.array(["x", "y"])})
    assert BatchParts([strings]).arrays() is None


def test_first_pass_groups_are_sized_from_the_widths_of_the_columns_read(tmp_path: Path) -> None:
    """Before any batch arrived, fixed-width columns read count their width, not the files' bytes.

    The files hold a wide string column that is not read: the estimate was twice the files'
    bytes per row (about 20 times too many here), which made the first pass's groups small.
    """
    import pyarrow.parquet as pq

    from torch_dataloader_utils import create_dataloader
    from torch_dataloader_utils.runtime.passes import files_bytes_per_row

    n = 4096
    table = pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "x": pa.array(np.ones(n, dtype=np.float32)),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(4 * n, dtype=np.float32)), 4),
        "text": pa.array([f"{i:0200d}" for i in range(n)]),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "a.parquet", compression="none")
    _, numeric = create_dataloader(str(tmp_path), columns=["id", "x", "vec"], batch_size=64)
    assert files_bytes_per_row(numeric.order) == 8 + 4 + 16
    _, everything = create_dataloader(str(tmp_path), batch_size=64)
    on_disk = (tmp_path / "a.parquet").stat().st_size / n
    assert (
        files_bytes_per_row(everything.order) == 8 + 4 + 16 + 2 * on_disk
    )  # a string read: as before, plus widths
