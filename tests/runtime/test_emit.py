"""Batches leave a worker in groups; the first group is one batch, so the loop starts at once."""

from __future__ import annotations

import pyarrow as pa

from torch_dataloader_utils.io.base import ReaderBase
from torch_dataloader_utils.runtime.emit import GROUP_MAX_BATCHES, Positions, grouped
from torch_dataloader_utils.runtime.workstats import WorkStats


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

    from torch_dataloader_utils.runtime.emit import GROUP_BYTES, UNPINNED_GROUP_BYTES

    assert UNPINNED_GROUP_BYTES == 8 << 20 < GROUP_BYTES  # the page-locked path keeps 32 MiB groups
    mib = pa.array(np.arange(1 << 17, dtype=np.int64))  # 1 MiB per batch
    batches = [pa.record_batch({"id": mib}) for _ in range(24)]
    positions = Positions(0, 0, 1)
    positions._starts.append(0)
    work = WorkStats(ReaderBase(), 1, None)  # type: ignore[arg-type]
    groups = list(grouped(iter(batches), lambda b: {"id": b.column(0).to_numpy()}, positions, work))
    sizes = [len(g.tag) for g in groups if g.tag]
    assert sizes == [1, 2, 4, 8, 8, 1]  # doubling, then capped at 8 MiB (was 1, 2, 4, 8, 9)
