"""The ledger's promise as a property: for every step of every rank, replay gives the delivered batch.

Random runs (ranks 1-4, workers 0-2, shuffle with row mixing or a window or neither,
elastic order or not) are interrupted and resumed 0-3 times, each time into another
world with other workers. Every rank is iterated in this process, one after the other
(each knows its world from ``num_ranks`` / ``rank``), so no process group is needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.data import write_parquet_files
from torch_dataloader_utils import Ledger, create_dataloader, merge_states

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

GLOBAL_BATCH = 48  # elastic order: the same global batch on 1, 2 or 4 ranks (canonical_ranks=4)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ledger-property") / "data"
    write_parquet_files(root, [190, 77, 240, 131, 58], row_group_size=32, with_strings=False)
    return root


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    """Options, and the worlds of the run's parts: ``(ranks, workers, batches before the stop)``."""
    elastic = draw(st.booleans())
    order = draw(st.sampled_from(["none", "mixing", "window"]))
    options: dict[str, Any] = {
        "shuffle": order != "none" or draw(st.booleans()),
        "shuffle_seed": draw(st.integers(0, 5)),
    }
    if order == "mixing":
        options["row_interleave"] = draw(st.sampled_from([16, 64, 200]))
    if order == "window":
        options["row_shuffle_window"] = draw(st.sampled_from([50, 300]))
    if elastic:
        options["canonical_ranks"] = 4
    ranks = st.sampled_from([1, 2, 4]) if elastic else st.integers(1, 4)
    parts = [
        (draw(ranks), draw(st.integers(0, 2)), draw(st.integers(1, 6)))
        for _ in range(draw(st.integers(0, 3)))
    ]
    parts.append((draw(ranks), draw(st.integers(0, 2)), None))
    return {"options": options, "parts": parts, "elastic": elastic}


def batch_size(run: dict[str, Any], ranks: int) -> int:
    return GLOBAL_BATCH // ranks if run["elastic"] else 16


@settings(max_examples=10)
@given(runs())
def test_every_step_of_every_rank_replays_the_delivered_batch(
    data: Path, tmp_path_factory: Any, run: Any
) -> None:
    ledger = tmp_path_factory.mktemp("ledger")
    delivered: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    state = None
    step = 0  # the trainer's step: every batch is a step
    for ranks, workers, stop in run["parts"]:
        saved, taken = [], 0
        for rank in range(ranks):
            loader, dataset = create_dataloader(
                str(data), batch_size=batch_size(run, ranks), num_ranks=ranks, rank=rank, num_workers=workers,
                ledger=str(ledger), **run["options"],
            )  # fmt: skip
            if state is not None:
                loader.load_state_dict(state)
            epochs = [dataset.epoch] if stop is not None else [dataset.epoch, dataset.epoch + 1]
            taken = 0
            for epoch in epochs:
                dataset.set_epoch(epoch)
                for batch in loader:
                    delivered[(rank, step + taken)] = batch
                    taken += 1
                    if stop is not None and taken == stop:
                        saved.append(loader.state_dict())
                        break
                if stop is not None and taken == stop:
                    break
        if stop is None:
            break
        state = merge_states([json.loads(v) for s in saved for v in s.values()])
        step += taken
    book = Ledger(ledger)
    for (rank, at), batch in delivered.items():
        got = book.rows(at, rank)
        assert list(got) == list(batch)
        for name, value in batch.items():
            assert torch.equal(got[name], value), (rank, at, name)
