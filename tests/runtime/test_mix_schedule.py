"""Mixture schedules end to end (issue 36): the weights change at a stated step, or at rows seen.

In each stage every batch holds every source's share within a row, and any window of a
rank's batches within ``2 x readers`` rows (readers: reading processes per rank), as with
fixed weights; the switch comes at the stated step (with ``readers`` processes per rank,
at the first step at or after it where a round of their batches starts); and so it stays
after a resume inside either stage, in the same world or another. Ranks and workers are
played in this process (:func:`tests.fixtures.orders.read_pass`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.fixtures.orders import read_pass
from tests.fixtures.recipes import check_shares, compositions, marked, once_per_epoch, switch_step
from torch_dataloader_utils import (
    MixedDataset,
    MixSchedule,
    StateMismatchError,
    create_mixed_dataloader,
    merge_states,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # few chunks per lane, for shuffling

SIZES = {0: 400, 1: 150, 2: 61}  # the mix_sources fixture


def builder(paths: Sequence[str], weights: Any, **options: Any) -> Callable[[int, int, int], MixedDataset]:
    """``build(ranks, rank, workers)``: rank ``rank`` of the mix."""

    def build(ranks: int, rank: int, workers: int) -> MixedDataset:
        return create_mixed_dataloader(
            [{"path": p} for p in paths], weights, num_ranks=ranks, rank=rank, num_workers=workers, **options
        )[1]

    return build


def differ(w0: Sequence[int], w1: Sequence[int], batch_size: int) -> bool:
    """Whether a batch of one stage's weights cannot pass for the other's (4 rows apart)."""
    a = np.asarray(w0) / sum(w0)
    b = np.asarray(w1) / sum(w1)
    return bool(np.abs(a - b).max() * batch_size >= 4)


@pytest.mark.slow
@settings(max_examples=12)
@given(
    data=st.data(),
    w0=st.lists(st.integers(1, 9), min_size=3, max_size=3),
    w1=st.lists(st.integers(1, 9), min_size=3, max_size=3),
    batch_size=st.integers(12, 24),
    switch=st.integers(1, 60),
    before=st.tuples(st.integers(1, 2), st.integers(0, 2)),
    after=st.tuples(st.integers(1, 3), st.integers(0, 2)),
    shuffle=st.booleans(),
)
def test_a_two_stage_schedule_switches_at_its_step_also_after_a_resume(
    mix_sources: list[str],
    data: Any,
    w0: list[int],
    w1: list[int],
    batch_size: int,
    switch: int,
    before: tuple[int, int],
    after: tuple[int, int],
    shuffle: bool,
) -> None:
    assume(differ(w0, w1, batch_size))
    stages = [(0, w0), (switch, w1)]
    options = {"batch_size": batch_size, "shuffle": shuffle, "equal_batches": "pad", "shuffle_seed": 5}
    build = builder(mix_sources, stages, **options)
    ranks, workers = before
    readers = max(1, workers)
    if readers == 1:
        assert switch_step(0, switch, readers) == switch  # one reader per rank: at the step itself
    # Uninterrupted: two epochs; the steps go on from epoch to epoch.
    datasets = [build(ranks, r, workers) for r in range(ranks)]
    whole: list[list[list[list[int]]]] = []
    for epoch in range(2):
        for ds in datasets:
            ds.set_epoch(epoch)
        whole.append([read_pass(ds, workers, unit=marked) for ds in datasets])
    lengths = [len(whole[e][0]) for e in range(2)]
    for e, first in ((0, 0), (1, lengths[0])):
        assert {len(b) for b in whole[e]} == {lengths[e]}  # equal batches on every rank
        for rank in whole[e]:
            check_shares(compositions(rank, 3), first, stages, readers, batch_size)
    # Interrupted inside either stage (every rank at the same step), resumed in `after`.
    epoch = data.draw(st.integers(0, 1), label="epoch")
    stop = data.draw(st.integers(1, lengths[epoch] - 1), label="stop")
    first_step = lengths[0] if epoch else 0
    saving = [build(ranks, r, workers) for r in range(ranks)]
    if epoch:
        for ds in saving:
            read_pass(ds, workers)
            ds.set_epoch(1)
    part = [read_pass(ds, workers, stop, unit=marked) for ds in saving]
    state = merge_states([json.loads(json.dumps(ds.state_dict())) for ds in saving])
    assert state["at"]["stage"] == (1 if first_step >= switch else 0)  # the state records the stage
    resumed = [build(after[0], r, after[1]) for r in range(after[0])]
    for ds in resumed:
        ds.load_state_dict(state)
    rest = [read_pass(ds, after[1], unit=marked) for ds in resumed]
    assert len({len(r) for r in rest}) == 1
    resumed_readers = max(1, after[1])
    if after == before:  # the same world: the same pass goes on, batch for batch (checked above)
        assert [p + r for p, r in zip(part, rest, strict=True)] == whole[epoch]
    else:  # another world: a new pass from the step the job had reached
        for rank in rest:
            check_shares(compositions(rank, 3), first_step + stop, stages, resumed_readers, batch_size)
    # The epoch after goes on from where the resumed pass ended, steps included.
    for ds in resumed:
        ds.set_epoch(epoch + 1)
    later = [read_pass(ds, after[1], unit=marked) for ds in resumed]
    for rank in later:
        check_shares(
            compositions(rank, 3), first_step + stop + len(rest[0]), stages, resumed_readers, batch_size
        )
    ids = [
        i for run in ([*whole[:epoch]], [part], [rest], [later]) for e in run for r in e for b in r for i in b
    ]
    once_per_epoch([i for i in ids if i >= 0], SIZES)


def test_stages_by_rows_start_where_the_job_has_taken_their_rows(mix_sources: list[str]) -> None:
    """Rows seen: every rank together. 2 ranks of 1 lane, batches of 10: a round is 20 rows."""
    schedule = MixSchedule([(0, [1, 1, 1]), (210, [6, 2, 2])], unit="rows")
    build = builder(mix_sources, schedule, batch_size=10, equal_batches="pad")
    batches = [read_pass(build(2, r, 0), 0, unit=marked) for r in range(2)]
    for rank in batches:
        counts = compositions(rank, 3)
        assert counts[:11].max(axis=1).max() <= 4  # [4, 3, 3]-like: 200 rows before round 10, 220 after 11
        assert (counts[11:20] == [6, 2, 2]).all()  # from round 11: its first row is row 220 >= 210
    described = build(2, 0, 0).describe()
    assert [(s["stage"], s["first_batch_per_lane"]) for s in described["stages"]] == [(0, 0), (1, 11)]
    assert described["schedule_unit"] == "rows"


def test_a_function_of_the_step_is_its_list_of_stages(mix_sources: list[str]) -> None:
    """Evaluated in every process where a stage may start: the same batches as the equal list."""
    options = {"batch_size": 12, "shuffle": True, "equal_batches": "pad"}
    listed = builder(mix_sources, [(0, [1, 1, 1]), (17, [5, 3, 1])], **options)
    called = builder(mix_sources, MixSchedule.of(_annealed, every=1), **options)
    for workers in (0, 2):
        assert read_pass(listed(1, 0, workers), workers, unit=marked) == read_pass(
            called(1, 0, workers), workers, unit=marked
        )


def _annealed(step: int) -> list[int]:
    return [1, 1, 1] if step < 17 else [5, 3, 1]


def _other(step: int) -> list[int]:
    return [1, 1, 1] if step < 17 else [1, 3, 5]


def test_a_changed_function_is_a_recipe_change(mix_sources: list[str]) -> None:
    """A function is compared through the weights the state recorded where its pass started."""
    options = {"batch_size": 12, "num_workers": 0}
    loader, dataset = create_mixed_dataloader([{"path": p} for p in mix_sources], _annealed, **options)
    for epoch in range(2):  # epoch 1 starts past step 17: in the second stage
        dataset.set_epoch(epoch)
        for n, _ in enumerate(loader, start=1):
            if epoch and n == 3:
                break
    state = loader.state_dict()
    assert json.loads(state["rank0"])["at"]["weights"] == [5, 3, 1]
    other, _ = create_mixed_dataloader([{"path": p} for p in mix_sources], _other, **options)
    with pytest.raises(StateMismatchError, match=r"gives \[1, 3, 5\] at step .* allow_recipe_change=True"):
        other.load_state_dict(state)
    same, ds = create_mixed_dataloader([{"path": p} for p in mix_sources], _annealed, **options)
    same.load_state_dict(state)
    assert ds.epoch == 1
    assert same.remaining_batches == len(same) - 3
    changed, ds = create_mixed_dataloader(
        [{"path": p} for p in mix_sources], _other, allow_recipe_change=True, **options
    )
    changed.load_state_dict(state)
    assert ds.epoch == 1
    assert ds.describe()["stages"][0]["weights"] == [1, 3, 5]


def test_a_schedule_needs_one_weight_per_source(mix_sources: list[str]) -> None:
    from torch_dataloader_utils import ConfigError

    with pytest.raises(ConfigError, match=r"has 2 weight\(s\) for 3 source\(s\)"):
        create_mixed_dataloader([{"path": p} for p in mix_sources], [(0, [1, 1]), (5, [1, 2])])
    with pytest.raises(ConfigError, match=r"<lambda>\(0\) gives 2 weight\(s\) for 3 source\(s\)"):
        create_mixed_dataloader([{"path": p} for p in mix_sources], lambda step: [1, 1], num_workers=0)
    with pytest.raises(ConfigError, match=r"weights=.*or a schedule"):
        create_mixed_dataloader([{"path": p} for p in mix_sources], "1,1,1")  # type: ignore[arg-type]
