"""The ledger replays a mix with a schedule and a mix whose recipe changed at a checkpoint (issue 36).

A pass's record holds the state it started from and the config of the mix that read it
(its weights as given: a list, a schedule's stages, or a function's name), so every step
of a scheduled mix, and of the passes after a recipe change (other weights or schedule,
a source added or removed, on another number of ranks and workers), replays the batch
the loop received. A function of the step cannot be recorded: the replay is given it again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tools.test_ledger import assert_same
from torch_dataloader_utils import Ledger, LedgerError, MixSchedule, create_mixed_dataloader, merge_states

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # few chunks per lane, for shuffling

FIRST = (["web", "code", "math"], [(0, [1, 1, 1]), (6, [4, 1, 1])])
"""The first run's recipe: a 2-stage schedule, switching at step 6."""
CHANGES = {
    "weights": (["web", "code", "math"], [1, 2, 3]),
    "schedule": (["web", "code", "math"], [(0, [1, 1, 1]), (9, [1, 1, 4])]),
    "added": (["web", "books", "code", "math"], [(0, [1, 1, 1, 1]), (6, [4, 1, 1, 1])]),
    "removed": (["web", "math"], [(0, [1, 1]), (6, [4, 1])]),
}
"""The recipes the job goes on with, by the change."""


def _loader(
    pool: dict[str, str], recipe: tuple[list[str], Any], world: tuple[int, int, int], ledger: Path
) -> Any:
    names, weights = recipe
    ranks, rank, workers = world
    return create_mixed_dataloader(
        [{"path": pool[n]} for n in names],
        weights,
        batch_size=12,
        shuffle=True,
        num_ranks=ranks,
        rank=rank,
        num_workers=workers,
        ledger=str(ledger),
        source_column="source",
        allow_recipe_change=True,
    )


@pytest.mark.slow
@settings(max_examples=8)
@given(
    change=st.sampled_from(sorted(CHANGES)),
    before=st.tuples(st.integers(1, 2), st.integers(0, 2)),
    after=st.tuples(st.integers(1, 2), st.integers(0, 2)),
    stop=st.integers(1, 12),
)
def test_every_step_of_a_scheduled_and_changed_mix_replays(
    mix_pool: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    change: str,
    before: tuple[int, int],
    after: tuple[int, int],
    stop: int,
) -> None:
    ledger = tmp_path_factory.mktemp("ledger")
    delivered: dict[tuple[int, int], Any] = {}
    saved = []
    for rank in range(before[0]):  # the first run, interrupted at step `stop` (or its epoch's end)
        loader, dataset = _loader(mix_pool, FIRST, (before[0], rank, before[1]), ledger)
        dataset.set_epoch(0)
        for taken, batch in enumerate(loader):
            delivered[(rank, taken)] = batch
            if taken + 1 == stop:
                break
        saved.append(loader.state_dict())
    state = merge_states([json.loads(v) for s in saved for v in s.values()])
    steps = min(stop, len(loader))
    for rank in range(after[0]):  # the job goes on with another recipe, to the end of the next epoch
        loader, dataset = _loader(mix_pool, CHANGES[change], (after[0], rank, after[1]), ledger)
        loader.load_state_dict(state)
        taken = steps
        for epoch in (dataset.epoch, dataset.epoch + 1):
            dataset.set_epoch(epoch)
            for batch in loader:
                delivered[(rank, taken)] = batch
                taken += 1
    book = Ledger(ledger)
    for (rank, step), batch in delivered.items():
        assert_same(book.rows(step, rank), batch)


def annealed(step: int) -> list[int]:
    return [1, 1] if step < 4 else [3, 1]


def test_a_function_of_the_step_is_given_again_to_replay(mix_pool: dict[str, str], tmp_path: Path) -> None:
    loader, _ = create_mixed_dataloader(
        [{"path": mix_pool["web"]}, {"path": mix_pool["code"]}],
        MixSchedule.of(annealed, every=2),
        batch_size=8,
        num_workers=0,
        ledger=str(tmp_path),
    )
    batches = list(loader)
    with pytest.raises(
        LedgerError, match=r"the function 'annealed' of the step.*Ledger\(DIR, weights=function\)"
    ):
        Ledger(tmp_path).rows(0, 0)
    book = Ledger(tmp_path, weights=annealed)
    for step in (0, 3, 4, len(batches) - 1):
        assert_same(book.rows(step, 0), batches[step])
