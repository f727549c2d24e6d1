"""Row mixing through real DataLoaders: on by default with shuffle=True, exactly once, resumable."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow.compute as pc
import pytest

from torch_dataloader_utils import StructuredDataset, create_dataloader
from torch_dataloader_utils.errors import ConfigError, StateMismatchError
from torch_dataloader_utils.runtime import env

ROWS = [300, 120, 410, 250, 180, 90]
STARTS = np.cumsum([0, *ROWS])
TOTAL = sum(ROWS)


@pytest.fixture
def root(write_parquet, tmp_path):
    write_parquet(ROWS, row_group_size=[50, 40, 41, 25, 60, 30], with_strings=False)
    return str(tmp_path / "data")


def file_of(ids) -> np.ndarray:
    return np.searchsorted(STARTS, np.asarray(ids), side="right") - 1


def batches_of(loader) -> list[list[int]]:
    return [b["id"].tolist() for b in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_mixes_rows_of_several_files_in_every_batch(root, num_workers):
    loader, _ = create_dataloader(root, batch_size=32, num_workers=num_workers, shuffle=True, split_rows=50)
    mixed = batches_of(loader)
    assert sorted(i for b in mixed for i in b) == list(range(TOTAL))
    files_per_batch = [len(set(file_of(b))) for b in mixed]
    assert np.median(files_per_batch) >= 3
    chunks, _ = create_dataloader(
        root, batch_size=32, num_workers=num_workers, shuffle=True, split_rows=50, row_mixing=None
    )
    plain = batches_of(chunks)
    assert sorted(i for b in plain for i in b) == list(range(TOTAL))
    consecutive = lambda bs: np.mean([d == 1 for b in bs for d in np.diff(b)])  # noqa: E731
    assert consecutive(plain) > 0.9  # chunk order only: runs of file rows
    assert consecutive(mixed) < 0.1


def test_mixing_is_deterministic_and_changes_every_epoch(root):
    opts = {"batch_size": 16, "num_workers": 2, "shuffle": True, "shuffle_seed": 3}
    loader, dataset = create_dataloader(root, **opts)
    a = batches_of(loader)
    again, _ = create_dataloader(root, **opts)
    assert batches_of(again) == a
    dataset.set_epoch(1)
    b = batches_of(loader)
    assert b != a
    assert sorted(i for x in b for i in x) == list(range(TOTAL))


@pytest.mark.parametrize(("before", "after"), [(2, 1), (0, 2), (1, 0)])
def test_resume_with_mixing_and_an_uncounted_filter(root, before, after):
    """Counts are not exact: a continued mix is re-read from its start and skipped, exactly once."""
    opts = {
        "batch_size": 16,
        "shuffle": True,
        "shuffle_seed": 2,
        "split_rows": 60,
        "filters": pc.field("label") != 3,
        "count_rows": False,
        "equal_batches": "off",
        "row_mixing": 40,
    }
    expected = [i for i in range(TOTAL) if i % 7 != 3]
    loader, _ = StructuredDataset.create_dataloader(root, num_workers=before, **opts)
    first: list[int] = []
    for n, batch in enumerate(loader, start=1):
        first.extend(batch["id"].tolist())
        if n == 11:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    loader2, _ = StructuredDataset.create_dataloader(root, num_workers=after, **opts)
    loader2.load_state_dict(state)
    rest = [i for b in loader2 for i in b["id"].tolist()]
    assert Counter(first + rest) == Counter(expected)


def test_state_with_mixing_does_not_resume_without_it(root):
    loader, _ = StructuredDataset.create_dataloader(root, num_workers=0, batch_size=16, shuffle=True)
    next(iter(loader))
    state = loader.dataset.state_dict()
    opts = {"num_workers": 0, "batch_size": 16, "shuffle": True}
    other, _ = StructuredDataset.create_dataloader(root, row_mixing=None, **opts)
    with pytest.raises(StateMismatchError, match="option row_mixing: 32768 in the state, None now"):
        other.load_state_dict(state)


@pytest.mark.parametrize("bad", [0, -5, "big", 2.5, True])
def test_row_mixing_is_checked(root, bad):
    with pytest.raises(ConfigError, match=rf"row_mixing={bad!r} must be"):
        StructuredDataset(root, shuffle=True, row_mixing=bad)


def test_window_options_take_precedence(root):
    ds = StructuredDataset(root, shuffle=True, row_shuffle_window=100)
    assert (ds.row_shuffle_window, ds.row_mixing) == (100, None)
    ds = StructuredDataset(root, shuffle_buffer_size=100)
    assert (ds.row_shuffle_window, ds.row_mixing) == (100, None)
    assert StructuredDataset(root, shuffle=False).row_mixing is None
    assert StructuredDataset(root, shuffle=True).row_mixing is not None


@pytest.mark.parametrize(("before", "after", "ranks"), [(2, 1, 1), (0, 2, 1), (1, 0, 2)])
def test_resume_with_mixing_and_exact_counts_in_another_world(root, before, after, ranks):
    """Rows left per worker are counted over mixes (the pieces the cursors point into)."""
    opts = {"batch_size": 16, "shuffle": True, "shuffle_seed": 4, "split_rows": 60, "row_mixing": 40}
    opts["equal_batches"] = "off"  # every row is read by some rank (none dropped)
    loader, _ = StructuredDataset.create_dataloader(root, num_workers=before, **opts)
    first: list[int] = []
    for n, batch in enumerate(loader, start=1):
        first.extend(batch["id"].tolist())
        if n == 60:  # past every worker's first mix
            break
    state = json.loads(json.dumps(loader.dataset.state_dict()))
    assert all(c[0] >= 1 for s in state["segments"] for e in s["ranks"].values() for c in e["cursors"])
    assert all("left" in e for s in state["segments"] for e in s["ranks"].values())
    rest: list[int] = []
    for rank in range(ranks):
        again, _ = StructuredDataset.create_dataloader(
            root, num_workers=after, num_ranks=ranks, rank=rank, **opts
        )
        again.load_state_dict(state)
        rest += [i for b in again for i in b["id"].tolist()]
    assert Counter(first + rest) == Counter(range(TOTAL))


@pytest.fixture
def many_cpus(monkeypatch):
    """A rank with 16 CPUs: readers get helper threads (forked workers inherit the patch)."""
    monkeypatch.setattr(env, "cpus_per_rank", lambda: 16)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_helper_threads_change_nothing_but_when_the_work_is_done(root, monkeypatch, num_workers):
    opts = {
        "batch_size": 16,
        "shuffle": True,
        "shuffle_seed": 5,
        "split_rows": 50,
        "num_workers": num_workers,
    }
    monkeypatch.setattr(env, "cpus_per_rank", lambda: 2)
    plain, dataset = create_dataloader(root, **opts)
    assert dataset._planned._helpers(env.worker_slot()) is None
    expected = batches_of(plain)
    monkeypatch.setattr(env, "cpus_per_rank", lambda: 16)
    loader, dataset = create_dataloader(root, **opts)
    assert dataset._planned._helpers(env.worker_slot()) is not None
    got = batches_of(loader)
    assert got == expected  # the same batches as a rank with 2 CPUs reads
    assert sorted(i for b in got for i in b) == list(range(TOTAL))


@pytest.mark.parametrize("extra", [{}, {"row_shuffle_window": 150}], ids=["mixing", "window"])
def test_resume_with_helper_threads_is_exact(root, many_cpus, extra):
    opts = {"batch_size": 16, "shuffle": True, "shuffle_seed": 2, "split_rows": 60, "equal_batches": "off"}
    opts.update(extra)
    loader, _ = StructuredDataset.create_dataloader(root, num_workers=2, **opts)
    first: list[int] = []
    for n, batch in enumerate(loader, start=1):
        first.extend(batch["id"].tolist())
        if n == 40:
            break
    state = loader.state_dict()
    again, _ = StructuredDataset.create_dataloader(root, num_workers=0, **opts)
    again.load_state_dict(state)
    rest = [i for b in again for i in b["id"].tolist()]
    assert Counter(first + rest) == Counter(range(TOTAL))
