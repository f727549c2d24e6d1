"""The loader's state: each rank's under a key of its own (``{"rank<r>": JSON}``).

DCP (``torch.distributed.checkpoint``) keeps one copy of an entry whose key is the same on
every rank, and loads into the keys a fresh loader's state names; so the loader's state is
one JSON string per rank, with the same key before and after reading. The two-rank DCP run
is in test_checkpoint_launch.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp

from tests.fixtures.data import WriteParquet
from tests.fixtures.e2e import assert_exactly_once, epoch_ids
from torch_dataloader_utils import ResumeStateError, create_dataloader, gather_state, merge_states

ROWS = [60, 60, 60, 60]
TOTAL = sum(ROWS)
OPTIONS = {"batch_size": 8, "shuffle": True, "shuffle_seed": 3}


@pytest.fixture
def data(write_parquet: WriteParquet) -> str:
    return str(write_parquet(ROWS, row_group_size=20)[0].parent)


def _ranks(data: str, num_ranks: int, num_workers: int = 0) -> list:
    return [
        create_dataloader(data, num_ranks=num_ranks, rank=r, num_workers=num_workers, **OPTIONS)[0]
        for r in range(num_ranks)
    ]


def test_the_state_is_one_json_string_under_the_ranks_key(data: str) -> None:
    loaders = _ranks(data, 2)
    fresh = [loader.state_dict() for loader in loaders]
    assert [list(s) for s in fresh] == [["rank0"], ["rank1"]]
    its = [iter(loader) for loader in loaders]
    for it in its:
        next(it)
    for r, loader in enumerate(loaders):
        state = loader.state_dict()
        assert list(state) == [f"rank{r}"]  # the same single key as the fresh loader's
        assert isinstance(state[f"rank{r}"], str)
        assert json.loads(state[f"rank{r}"]) == loader.dataset.state_dict()
        assert json.loads(state[f"rank{r}"]) != json.loads(fresh[r][f"rank{r}"])


@pytest.mark.parametrize(("after_ranks", "after_workers"), [(2, 0), (1, 2), (3, 1)])
def test_the_ranks_states_merge_by_dict_union(data: str, after_ranks: int, after_workers: int) -> None:
    loaders = _ranks(data, 2)
    its = [iter(loader) for loader in loaders]
    seen = epoch_ids([next(it) for it in its for _ in range(3)])
    states = [loader.state_dict() for loader in loaders]
    union = {**states[0], **states[1]}
    assert merge_states([union]) == merge_states(states)
    assert gather_state(loaders[0]) == loaders[0].dataset.state_dict()  # no process group: plain
    rest = []
    for loader in _ranks(data, after_ranks, after_workers):
        loader.load_state_dict(union)
        rest += epoch_ids(loader)
    assert_exactly_once(seen + rest, range(TOTAL))


def test_one_ranks_state_of_two_is_refused_naming_the_way_to_resize(data: str) -> None:
    loaders = _ranks(data, 2)
    next(iter(loaders[0]))
    with pytest.raises(ResumeStateError, match=r"missing \[1\].*GatheredState"):
        _ranks(data, 1)[0].load_state_dict(loaders[0].state_dict())


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"rank0": "{not json"}, r"entry 'rank0' is not JSON"),
        ({"rank0": "[1, 2]"}, r"entry 'rank0' must be the JSON of an object"),
        ({"rank0": json.dumps({"format": "something else"})}, "not a torch_dataloader_utils resume state"),
    ],
)
def test_a_damaged_entry_is_refused(data: str, state: dict[str, str], match: str) -> None:
    with pytest.raises(ResumeStateError, match=match):
        _ranks(data, 1)[0].load_state_dict(state)


def test_a_dcp_checkpoint_of_the_loader_itself_round_trips(data: str, tmp_path: Path) -> None:
    loader = _ranks(data, 1, num_workers=2)[0]
    it = iter(loader)
    seen = epoch_ids([next(it) for _ in range(5)])
    dcp.save({"data": loader}, checkpoint_id=str(tmp_path / "ckpt"))
    keys = set(dcp.FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata)
    assert keys == {"data.rank0"}
    fresh = _ranks(data, 1, num_workers=0)[0]
    dcp.load({"data": fresh}, checkpoint_id=str(tmp_path / "ckpt"))
    assert_exactly_once(seen + epoch_ids(fresh), range(TOTAL))
