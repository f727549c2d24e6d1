"""What trainers read from a loader: ``len()``, the remaining count, ``sampler.set_epoch``.

Issue 28, items 1 and 2. ``len(loader)`` after ``load_state_dict`` was the remaining count
(954 of 1,954 batches), and a trainer that reads it once (Lightning) then trained only
that many batches in every later epoch; nothing called ``dataset.set_epoch`` in trainers
that call ``loader.sampler.set_epoch`` (Lightning), so every epoch repeated epoch 0's
order, silently.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fixtures.data import write_parquet_files
from torch_dataloader_utils import create_dataloader, merge_states
from torch_dataloader_utils.runtime.loader import EpochSampler

ROWS = [300, 170, 430, 100]
TOTAL = sum(ROWS)
OPTIONS: dict[str, Any] = {"batch_size": 16, "split_rows": 60, "shuffle": True, "shuffle_seed": 5}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("trainer-protocol") / "data"
    write_parquet_files(path, ROWS, row_group_size=30, with_strings=False)
    return str(path)


def ids(batch: dict[str, torch.Tensor]) -> list[int]:
    return [int(i) for i in batch["id"]]


@pytest.mark.parametrize("equal_batches", ["drop", "pad", "off"])
@pytest.mark.parametrize(("ranks", "before", "after"), [(1, 2, 0), (2, 0, 2), (3, 1, 1)])
def test_len_is_the_full_epoch_after_load_state_dict(
    root: str, equal_batches: str, ranks: int, before: int, after: int
) -> None:
    """len() is the full epoch's count on every rank after a resume; remaining_batches is the rest."""
    opts = {**OPTIONS, "equal_batches": equal_batches}
    first: list[int] = []
    states = []
    for rank in range(ranks):
        loader, dataset = create_dataloader(root, num_workers=before, num_ranks=ranks, rank=rank, **opts)
        dataset.set_epoch(1)
        full = len(loader)
        it = iter(loader)
        for _ in range(3):
            first += ids(next(it))
        states.append(json.loads(json.dumps(loader.state_dict())))
        del it
    merged = merge_states(states) if ranks > 1 else states[0]
    rest: list[int] = []
    for rank in range(ranks):
        loader, dataset = create_dataloader(root, num_workers=after, num_ranks=ranks, rank=rank, **opts)
        dataset.set_epoch(1)
        full = len(loader)
        loader.load_state_dict(merged)
        assert len(loader) == full, "len() is the whole epoch's count, also after a resume"
        left = loader.remaining_batches
        assert left == full - 3 or equal_batches == "off"  # 'off' deals the rest anew, unevenly
        got = [ids(b) for b in loader]
        assert len(got) == left
        assert loader.remaining_batches == 0  # the pass ran to its end
        rest += [i for b in got for i in b]
        # The next epoch is whole again: len() batches.
        dataset.set_epoch(2)
        assert loader.remaining_batches == len(loader)
        assert sum(1 for _ in loader) == len(loader)
    seen = Counter(first + rest)
    if equal_batches == "pad":
        assert set(seen) == set(range(TOTAL))  # padded rows repeat, every row at least once
    else:
        assert all(n == 1 for n in seen.values())
        assert TOTAL - len(seen) <= 2 * (ranks - 1)  # 'drop' leaves out fewer than num_ranks rows per deal


def test_remaining_batches_counts_down_during_a_pass(root: str) -> None:
    loader, _ = create_dataloader(root, num_workers=2, **OPTIONS)
    full = len(loader)
    assert loader.remaining_batches == full
    for n, _ in enumerate(loader, start=1):
        assert loader.remaining_batches == full - n
    assert n == full


def test_sampler_set_epoch_reaches_the_dataset(root: str) -> None:
    loader, dataset = create_dataloader(root, num_workers=2, **OPTIONS)
    assert isinstance(loader.sampler, EpochSampler)
    assert loader.batch_sampler is None  # batches come whole from the dataset
    orders = []
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        assert dataset.epoch == epoch
        orders.append([i for b in loader for i in ids(b)])
    assert orders[0] != orders[1]
    assert sorted(orders[0]) == sorted(orders[1]) == list(range(TOTAL))
    loader.set_epoch(7)  # HF Trainer and Accelerate call the loader's own set_epoch
    assert dataset.epoch == 7
    with pytest.raises(ValueError, match="sampler attribute should not be set"):
        loader.sampler = None  # type: ignore[assignment]  # as for any DataLoader


def test_lightning_hook_reaches_the_dataset(root: str) -> None:
    """Lightning's own epoch hook (called by its fit and evaluation loops) sets the dataset's epoch."""
    data = pytest.importorskip("lightning.fabric.utilities.data")
    loader, dataset = create_dataloader(root, num_workers=0, **OPTIONS)
    data._set_sampler_epoch(loader, 3)
    assert dataset.epoch == 3


def test_lightning_trainer_gives_each_epoch_its_own_order(root: str, tmp_path: Path) -> None:
    """A real Trainer.fit over 2 epochs: each reads every row once, in a new order, len() batches."""
    pl = pytest.importorskip("lightning.pytorch")

    class Model(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: dict[int, list[int]] = {}

        def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
            self.seen.setdefault(self.current_epoch, []).extend(ids(batch))
            return self.layer(batch["x"].float().unsqueeze(1)).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    loader, _ = create_dataloader(root, num_workers=0, **OPTIONS)
    model = Model()
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers).*")
        trainer.fit(model, train_dataloaders=loader)
    assert sorted(model.seen) == [0, 1]
    assert sorted(model.seen[0]) == sorted(model.seen[1]) == list(range(TOTAL))
    assert model.seen[0] != model.seen[1], "Lightning's sampler.set_epoch reached the dataset"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_second_pass_without_set_epoch_warns_once(root: str, num_workers: int) -> None:
    loader, _ = create_dataloader(root, num_workers=num_workers, **OPTIONS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = [i for b in loader for i in ids(b)]
        second = [i for b in loader for i in ids(b)]
        third = [i for b in loader for i in ids(b)]
    repeats = [w for w in caught if "second pass over epoch 0" in str(w.message)]
    assert len(repeats) == 1
    assert "loader.set_epoch(epoch)" in str(repeats[0].message)
    assert "sampler.set_epoch" in str(repeats[0].message)
    assert first == second == third  # what the warning is about


@pytest.mark.parametrize("how", ["loader", "sampler", "dataset"])
def test_no_warning_when_the_epoch_is_set(root: str, how: str) -> None:
    loader, dataset = create_dataloader(root, num_workers=0, **OPTIONS)
    setters = {"loader": loader.set_epoch, "sampler": loader.sampler.set_epoch, "dataset": dataset.set_epoch}
    setter = setters[how]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for epoch in range(3):
            setter(epoch)
            assert sum(1 for _ in loader) == len(loader)
        setter(2)  # the same epoch again, on purpose: no warning either
        assert sum(1 for _ in loader) == len(loader)


def test_no_warning_without_shuffle_or_after_a_broken_pass(root: str) -> None:
    loader, _ = create_dataloader(root, num_workers=0, **{**OPTIONS, "shuffle": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(loader)
        list(loader)  # shuffle=False: every epoch is the same order anyway
    loader, _ = create_dataloader(root, num_workers=0, **OPTIONS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in loader:
            break  # a pass left early, e.g. a peek
        list(loader)
