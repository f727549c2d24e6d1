"""Issue 28, item 16: a loaded resume state, or the consumed position, dropped silently.

* ``load_state_dict(state of epoch 1)`` then ``set_epoch(0)`` read epoch 0 whole and then
  epoch 1 from its start (1,300 consumed rows again), with no warning. Now ``set_epoch``
  to another epoch before any of the loaded state was read warns, with the rows it had
  consumed and the fix (a resumed loop continues at ``dataset.epoch``).
* A full pass over the same loader nested in the training loop (an evaluation over the
  training loader) marked the epoch finished, and the checkpoint then skipped 3,600 rows.
  Now the nested pass is recorded apart: the state keeps describing the training pass,
  and resuming from it reads every row of the epoch once. With ``persistent_workers=True``
  both passes would share the workers: the training pass then raises a clear error when
  it is used again, instead of yielding the other pass's batches.
* ``state_dict()`` in a DataLoader worker returned a state with nothing consumed (workers
  do not see what the loop received). Now it raises ``ResumeStateError`` saying where to
  call it.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, get_worker_info

from tests.fixtures.data import write_parquet_files
from torch_dataloader_utils import (
    IncompatibleOptionsError,
    ResumeStateError,
    StructuredDataset,
    create_dataloader,
)

ROWS = [700, 500, 900, 500]
TOTAL = sum(ROWS)
OPTIONS: dict[str, Any] = {"batch_size": 50, "split_rows": 200, "shuffle": True, "shuffle_seed": 11}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("dropped-state") / "data"
    write_parquet_files(path, ROWS, row_group_size=100, with_strings=False)
    return str(path)


def ids(batch: dict[str, torch.Tensor]) -> list[int]:
    return [int(i) for i in batch["id"]]


def state_after(root: str, epoch: int, batches: int, **extra: Any) -> tuple[dict[str, Any], list[int]]:
    loader, dataset = create_dataloader(root, num_workers=0, **OPTIONS, **extra)
    dataset.set_epoch(epoch)
    seen: list[int] = []
    for n, batch in enumerate(loader, start=1):
        seen += ids(batch)
        if n == batches:
            break
    return json.loads(json.dumps(loader.state_dict())), seen


@pytest.mark.parametrize("other", [0, 2])
def test_28_16_set_epoch_to_another_epoch_after_load_warns_with_the_rows(root: str, other: int) -> None:
    state, _ = state_after(root, 1, 26)  # 1,300 rows of epoch 1 consumed
    loader, dataset = create_dataloader(root, num_workers=0, **OPTIONS)
    loader.load_state_dict(state)
    expected = rf"set_epoch\({other}\) drops the resume state loaded for epoch 1"
    with pytest.warns(UserWarning, match=expected) as got:
        dataset.set_epoch(other)
    message = str(got[0].message)
    assert f"1,300 of this rank's {TOTAL:,} rows of epoch 1 had been consumed" in message
    assert "call set_epoch(1)" in message
    assert sorted(i for b in loader for i in ids(b)) == list(range(TOTAL))  # what it warned about


def test_28_16_set_epoch_of_the_loaded_epoch_keeps_it_quietly(root: str) -> None:
    state, seen = state_after(root, 1, 26)
    loader, dataset = create_dataloader(root, num_workers=2, **OPTIONS)
    loader.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset.set_epoch(1)  # what a resumed loop does: no warning, the state is kept
        rest = [i for b in loader for i in ids(b)]
        assert sorted(seen + rest) == list(range(TOTAL))
        dataset.set_epoch(2)  # the loaded state was read: moving on is quiet
        assert sorted(i for b in loader for i in ids(b)) == list(range(TOTAL))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_28_16_nested_full_pass_does_not_finish_the_epoch(root: str, num_workers: int) -> None:
    """An evaluation over the training loader mid-epoch; the checkpoint after it resumes exactly."""
    loader, dataset = create_dataloader(root, num_workers=num_workers, **OPTIONS)
    dataset.set_epoch(3)
    seen: list[int] = []
    for n, batch in enumerate(loader, start=1):
        seen += ids(batch)
        if n == 10:
            evaluated = [i for b in loader for i in ids(b)]  # nested: a whole pass
            assert sorted(evaluated) == list(range(TOTAL))
        if n == 20:
            break
    state = json.loads(json.dumps(loader.dataset.state_dict()))
    assert state["epoch"] == 3, "the nested pass did not finish the epoch"
    resumed, _ = create_dataloader(root, num_workers=2 - num_workers, **OPTIONS)
    resumed.load_state_dict(state)
    rest = [i for b in resumed for i in ids(b)]
    assert len(seen) == 20 * 50
    assert sorted(seen + rest) == list(range(TOTAL))  # 3,600 rows were skipped before


def test_28_16_nested_pass_with_persistent_workers_ends_the_outer_one_loudly(root: str) -> None:
    loader, _ = create_dataloader(root, num_workers=2, persistent_workers=True, **OPTIONS)
    outer = iter(loader)
    first = [i for _ in range(5) for i in ids(next(outer))]
    evaluated = [i for b in loader for i in ids(b)]
    assert sorted(evaluated) == list(range(TOTAL))
    with pytest.raises(IncompatibleOptionsError, match="ended by a new pass over the same loader"):
        next(outer)
    assert len(first) == 250
    # The loader and its workers still serve new passes.
    loader.set_epoch(1)
    assert sorted(i for b in loader for i in ids(b)) == list(range(TOTAL))


def _state_in_worker(batch: Any) -> Any:
    info = get_worker_info()
    assert info is not None
    return info.dataset.state_dict()  # type: ignore[attr-defined]


def test_28_16_state_dict_in_a_worker_is_refused(root: str) -> None:
    dataset = StructuredDataset(root, **OPTIONS)
    loader = DataLoader(dataset, batch_size=None, num_workers=1, collate_fn=_state_in_worker)
    with pytest.raises(ResumeStateError, match=r"state_dict\(\) was called in a DataLoader worker"):
        next(iter(loader))
