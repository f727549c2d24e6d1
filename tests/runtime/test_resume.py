"""Mid-epoch resume with real DataLoader workers: stop, save as JSON, resume elsewhere."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import IncompatibleOptionsError, ResumeStateError, StateMismatchError
from torch_dataloader_utils.plan.state import merge_states
from torch_dataloader_utils.runtime.loader import ResumableDataLoader

ROWS = [230, 57, 410, 99, 180]
TOTAL = sum(ROWS)
OPTIONS = {"batch_size": 16, "split_rows": 40, "shuffle": True, "shuffle_seed": 5}


@pytest.fixture
def root(write_parquet, tmp_path):
    write_parquet(ROWS, row_group_size=[40, 20, 50, 33, 60], with_strings=False)
    return str(tmp_path / "data")


def ids(batch) -> list[int]:
    return batch["id"].tolist()


def run_until(loader, stop: int) -> list[int]:
    seen: list[int] = []
    for n, batch in enumerate(loader, start=1):
        seen.extend(ids(batch))
        if n == stop:
            break
    return seen


@pytest.mark.parametrize(
    ("before", "after", "extra"),
    [(2, 3, {}), (2, 0, {"row_shuffle_window": 150}), (0, 2, {}), (3, 1, {"row_shuffle_window": 90})],
)
def test_break_save_resume_with_other_workers(root, before, after, extra):
    loader, dataset = StructuredDataset.create_dataloader(root, num_workers=before, **OPTIONS, **extra)
    assert isinstance(loader, ResumableDataLoader)
    dataset.set_epoch(1)
    first = run_until(loader, 9)  # 2 workers prefetch ahead: those batches are not consumed
    state = json.loads(json.dumps(loader.dataset.state_dict()))  # plain JSON
    assert state["epoch"] == 1
    assert len(json.dumps(state)) < 2000
    del loader

    loader2, dataset2 = StructuredDataset.create_dataloader(root, num_workers=after, **OPTIONS, **extra)
    full = len(loader2)
    loader2.load_state_dict(state)
    assert dataset2.epoch == 1
    assert len(loader2) == full  # the whole epoch's count, as trainers expect it
    expected_batches = loader2.remaining_batches
    assert expected_batches < full
    rest = []
    batches = 0
    for batch in loader2:
        rest.extend(ids(batch))
        batches += 1
    assert batches == expected_batches
    assert Counter(first + rest) == Counter(range(TOTAL))  # every row exactly once
    # The resumed pass completed: the state now points at the next epoch, from its start.
    done = loader2.dataset.state_dict()
    assert (done["epoch"], done["segments"]) == (2, [])
    dataset2.set_epoch(2)
    assert sorted(i for b in loader2 for i in ids(b)) == list(range(TOTAL))


def test_resume_twice_in_one_epoch(root):
    loader, _dataset = StructuredDataset.create_dataloader(root, num_workers=2, **OPTIONS)
    first = run_until(loader, 5)
    s1 = loader.dataset.state_dict()
    loader2, _ = StructuredDataset.create_dataloader(root, num_workers=1, **OPTIONS)
    loader2.load_state_dict(s1)
    second = run_until(loader2, 7)
    s2 = json.loads(json.dumps(loader2.dataset.state_dict()))
    assert len(s2["segments"]) == 2
    loader3, _ = StructuredDataset.create_dataloader(root, num_workers=3, **OPTIONS)
    loader3.load_state_dict(s2)
    third = [i for b in loader3 for i in ids(b)]
    assert Counter(first + second + third) == Counter(range(TOTAL))


def test_exception_in_loop_keeps_state_consistent(root):
    loader, _ = StructuredDataset.create_dataloader(root, num_workers=2, **OPTIONS)
    seen: list[int] = []

    def train() -> None:
        for n, batch in enumerate(loader):
            if n == 6:
                raise RuntimeError("boom")  # this batch was received but not used: it counts
            seen.extend(ids(batch))

    with pytest.raises(RuntimeError, match="boom"):
        train()
    state = loader.state_dict()
    loader2, _ = StructuredDataset.create_dataloader(root, num_workers=2, **OPTIONS)
    loader2.load_state_dict(state)
    rest = [i for b in loader2 for i in ids(b)]
    assert len(seen) + len(rest) == TOTAL - 16  # exactly the received batch is missing
    assert not set(seen) & set(rest)


def test_elastic_ranks_with_equal_batches(root):
    """Three ranks (played in one process) stop, their states merge, two ranks resume."""
    opts = {**OPTIONS, "equal_batches": "drop"}
    first: list[int] = []
    states = []
    for rank in range(3):
        loader, _ = StructuredDataset.create_dataloader(
            root, num_workers=rank % 3, num_ranks=3, rank=rank, **opts
        )
        first += run_until(loader, 4)
        states.append(json.loads(json.dumps(loader.state_dict())))
    merged = merge_states(states)
    with pytest.raises(ResumeStateError, match="missing"):
        StructuredDataset(root, num_ranks=2, rank=0, **opts).load_state_dict(states[0])
    rest: list[int] = []
    counts = []
    for rank in range(2):
        loader, _ = StructuredDataset.create_dataloader(
            root, num_workers=2 - rank, num_ranks=2, rank=rank, **opts
        )
        loader.load_state_dict(merged)
        expected = loader.remaining_batches
        got = [ids(b) for b in loader]
        counts.append((len(got), expected))
        rest += [i for b in got for i in b]
    assert counts[0] == counts[1]
    assert counts[0][0] == counts[0][1]
    everything = Counter(first + rest)
    assert all(n == 1 for n in everything.values())
    assert TOTAL - len(everything) <= (3 - 1) + (2 - 1)  # documented drops only


def test_state_of_other_data_is_refused(root, write_parquet, tmp_path):
    loader, _ = StructuredDataset.create_dataloader(root, num_workers=0, **OPTIONS)
    run_until(loader, 2)
    state = loader.state_dict()
    other, _ = StructuredDataset.create_dataloader(root, num_workers=0, **{**OPTIONS, "batch_size": 32})
    with pytest.raises(StateMismatchError, match="option batch_size: 16 in the state, 32 now"):
        other.load_state_dict(state)
    cols, _ = StructuredDataset.create_dataloader(root, num_workers=0, columns=["id"], **OPTIONS)
    with pytest.raises(StateMismatchError, match=r"option columns: \['id', 'x', 'label'\] in the state"):
        cols.load_state_dict(state)
    from tests.fixtures.data import write_parquet_files

    write_parquet_files(tmp_path / "more", [*ROWS, 5], row_group_size=40, with_strings=False)
    more, _ = StructuredDataset.create_dataloader(str(tmp_path / "more"), num_workers=0, **OPTIONS)
    with pytest.raises(StateMismatchError, match="num_files: 5 in the state, 6 now"):
        more.load_state_dict(state)


def test_row_shuffle_mixes_rows_and_is_deterministic(root):
    opts = {**OPTIONS, "row_shuffle_window": 200}
    loader, dataset = StructuredDataset.create_dataloader(root, num_workers=0, **opts)
    a = [i for b in loader for i in ids(b)]
    b = [i for b in loader for i in ids(b)]
    dataset.set_epoch(1)
    c = [i for b in loader for i in ids(b)]
    assert a == b != c
    assert sorted(a) == sorted(c) == list(range(TOTAL))
    plain, _ = StructuredDataset.create_dataloader(root, num_workers=0, row_mixing=None, **OPTIONS)
    chunk_order = [i for b in plain for i in ids(b)]
    # Inside a window rows are mixed: far fewer consecutive ids than with chunk shuffling.
    runs = lambda xs: int(np.sum(np.diff(xs) == 1))  # noqa: E731
    assert runs(a) < runs(chunk_order) / 10


def test_row_shuffle_window_needs_shuffle(root):
    with pytest.raises(IncompatibleOptionsError, match=r"row_shuffle_window=100 .* pass shuffle=True"):
        StructuredDataset(root, row_shuffle_window=100)


def test_dataset_iterated_in_main_process_tracks_itself(root):
    dataset = StructuredDataset(root, batch_size=16, split_rows=40)
    seen = []
    for n, batch in enumerate(dataset, start=1):
        seen.extend(ids(batch))
        if n == 10:
            break
    state = dataset.state_dict()
    again = StructuredDataset(root, batch_size=16, split_rows=40)
    again.load_state_dict(state)
    assert Counter(seen + [i for b in again for i in ids(b)]) == Counter(range(TOTAL))


def test_failed_load_changes_nothing(root):
    """Hostile case: a load_state_dict that raised left the loader failing until rebuilt."""
    loader, dataset = StructuredDataset.create_dataloader(root, num_workers=0, **OPTIONS)
    dataset.set_epoch(2)
    good = json.loads(json.dumps(loader.dataset.state_dict()))
    run_until(loader, 3)
    good = json.loads(json.dumps(loader.dataset.state_dict()))  # 3 batches of epoch 2 consumed
    bad = json.loads(json.dumps(good))
    bad["epoch"] = 7
    bad["segments"][0]["ranks"]["0"]["cursors"] = [[99, 0]]  # past the end of the plan
    with pytest.raises(ResumeStateError):
        loader.load_state_dict(bad)
    assert dataset.epoch == 2  # unchanged by the failed load
    # The loader still works, as if the bad state had never been offered.
    assert sorted(i for b in loader for i in ids(b)) == list(range(TOTAL))
    loader.load_state_dict(good)
    rest = [i for b in loader for i in ids(b)]
    assert len(rest) == TOTAL - 3 * OPTIONS["batch_size"]
