"""Batches leave a worker in groups; the first group is one batch, so the loop starts at once."""

from __future__ import annotations

import pyarrow as pa

from torch_dataloader_utils.runtime.emit import GROUP_MAX_BATCHES, Positions, grouped
from torch_dataloader_utils.runtime.workstats import WorkStats


def test_first_group_is_one_batch_then_groups_fill_up() -> None:
    batches = [pa.record_batch({"id": pa.array(range(i * 4, i * 4 + 4))}) for i in range(10)]
    positions = Positions(0, 0, 1)
    positions._starts.append(0)  # one piece, read from its start
    work = WorkStats(None, 1, None)
    groups = list(grouped(iter(batches), lambda b: {"id": b.column(0).to_pylist()}, positions, work))
    sizes = [len(g.tag) for g in groups if g.tag]  # (a last, empty group may carry the timers)
    assert sizes[0] == 1  # the first batch travels alone
    assert sum(sizes) == 10
    assert sizes == [1, 2, 4, 3]  # small batches: groups double up to GROUP_MAX_BATCHES
    assert GROUP_MAX_BATCHES > 4
