"""Per-rank planning through real DataLoaders: custom strategies checked, rows left out said."""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Sequence

import pytest

from tests.fixtures.data import WriteParquet
from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import OverlappingChunksError, PlanError
from torch_dataloader_utils.plan import Chunk, FileInfo

ROWS = [230, 57, 410, 99, 180]
TOTAL = sum(ROWS)


@pytest.fixture
def root(write_parquet: WriteParquet, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    paths = write_parquet(ROWS, row_group_size=[40, 20, 50, 33, 60], with_strings=False)
    return str(paths[0].parent)


def _pieces(files: Sequence[FileInfo]) -> list[Chunk]:
    return [
        Chunk.rows(f, a, min(a + 25, f.num_rows or 0)) for f in files for a in range(0, f.num_rows or 0, 25)
    ]


class Unseeded:
    """Shuffles its chunks with the process's random state: not a function of its arguments."""

    def generate(
        self, files: Sequence[FileInfo], num_workers: int, epoch: int, *, num_ranks: int, rank: int
    ) -> list[Chunk]:
        chunks = _pieces(files)
        random.shuffle(chunks)
        return chunks[rank::num_ranks]


class UnseededOlder:
    """The older signature, also shuffling with the process's random state."""

    def generate(self, files: Sequence[FileInfo], num_workers: int, epoch: int) -> list[Chunk]:
        chunks = _pieces(files)
        random.shuffle(chunks)
        return chunks


class Sharded:
    """A correct rank-aware strategy: 25-row pieces, dealt by rank."""

    def generate(
        self, files: Sequence[FileInfo], num_workers: int, epoch: int, *, num_ranks: int, rank: int
    ) -> list[Chunk]:
        return _pieces(files)[rank::num_ranks]


class NotSharded:
    """Forgets to shard: every rank gets every chunk."""

    def generate(
        self, files: Sequence[FileInfo], num_workers: int, epoch: int, *, num_ranks: int, rank: int
    ) -> list[Chunk]:
        return _pieces(files)


def test_case_5_non_deterministic_strategy_is_refused_in_the_workers(root: str) -> None:
    """Issue 16, case 5: each DataLoader worker drew other chunks: rows lost and read twice."""
    with pytest.warns(UserWarning, match="older generate"):
        loader, dataset = StructuredDataset.create_dataloader(
            root, split_strategy=UnseededOlder(), num_workers=2, batch_size=16, persistent_workers=True
        )
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(TOTAL))  # forked with the plan
    dataset.set_epoch(1)  # persistent workers plan epoch 1 themselves, each drawing other chunks
    with pytest.raises(PlanError, match=r"returned different chunks for the same arguments") as info:
        list(loader)
    message = str(info.value)
    assert "'UnseededOlder'" in message
    assert "a DataLoader worker and the main process of rank 0, epoch 1" in message
    assert "generate() must be a pure function of its arguments" in message


@pytest.mark.parametrize("num_ranks", [1, 3])
def test_case_5_non_deterministic_rank_aware_strategy_fails_at_construction(
    root: str, num_ranks: int
) -> None:
    with pytest.raises(
        PlanError, match=r"'Unseeded' returned different chunks .*two calls for rank 0 of epoch 0"
    ):
        StructuredDataset(root, split_strategy=Unseeded(), num_ranks=num_ranks, rank=0)


def test_rank_aware_strategy_with_equal_batches_in_workers(root: str) -> None:
    ids: list[int] = []
    counts = []
    for rank in range(3):
        loader, _ = StructuredDataset.create_dataloader(
            root, split_strategy=Sharded(), num_ranks=3, rank=rank, num_workers=2, batch_size=10
        )
        batches = [b["id"].tolist() for b in loader]
        counts.append((len(batches), len(loader)))
        ids += [i for b in batches for i in b]
    assert len({c for c, _ in counts}) == 1
    assert all(c == n for c, n in counts)
    assert len(ids) == len(set(ids)) == TOTAL - TOTAL % 3


def test_overlap_check_of_large_worlds_is_an_option(root: str) -> None:
    # 17 ranks: more than are checked automatically; each rank reads what it was given.
    unchecked = StructuredDataset(
        root, split_strategy=NotSharded(), num_ranks=17, rank=3, equal_batches="off"
    )
    with pytest.raises(OverlappingChunksError, match=r"'NotSharded' across 17 ranks reads rows twice"):
        unchecked.verify_plan()  # what `plan --verify` runs
    with pytest.raises(OverlappingChunksError, match=r"'NotSharded' across 17 ranks reads rows twice"):
        StructuredDataset(
            root, split_strategy=NotSharded(), num_ranks=17, rank=3, equal_batches="off", verify_plan=True
        )
    with pytest.raises(OverlappingChunksError, match="across 16 ranks"):
        StructuredDataset(root, split_strategy=NotSharded(), num_ranks=16, rank=3, equal_batches="off")


def test_rows_left_out_without_shuffle_are_logged(root: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils.runtime.dataset"):
        ds = StructuredDataset(root, num_ranks=3, rank=0, batch_size=8, split_rows=40)
    records = [r.getMessage() for r in caplog.records if "equal_batches" in r.getMessage()]
    assert len(records) == 1
    assert "1 row(s) in every epoch (shuffle=False: the last rows of the last rank's share)" in records[0]
    assert "part-0004.parquet rows [59, 60)" in records[0]  # the last chunk of share [2::3]
    assert [(c.start, c.stop) for c in ds.plan(0).dropped] == [(59, 60)]


def test_state_records_rows_left_and_resumes_elsewhere(root: str) -> None:
    opts = {"batch_size": 16, "split_rows": 40, "shuffle": True, "shuffle_seed": 5}
    seen: list[int] = []
    states = []
    for rank in range(2):
        loader, _ = StructuredDataset.create_dataloader(root, num_ranks=2, rank=rank, num_workers=2, **opts)
        for n, batch in enumerate(loader, start=1):
            seen += batch["id"].tolist()
            if n == 3:
                break
        state = loader.dataset.state_dict()
        entry = state["segments"][-1]["ranks"][str(rank)]
        assert len(entry["left"]) == entry["num_workers"] == 2
        states.append(state)
    from torch_dataloader_utils import merge_states

    merged = merge_states(states)
    total_left = sum(sum(e["left"]) for e in merged["segments"][-1]["ranks"].values())
    assert total_left == TOTAL - TOTAL % 2 - len(seen)
    rest: list[int] = []
    for rank in range(3):
        loader, _ = StructuredDataset.create_dataloader(root, num_ranks=3, rank=rank, num_workers=1, **opts)
        loader.load_state_dict(merged)
        rest += [i for b in loader for i in b["id"].tolist()]
    everything = Counter(seen + rest)
    assert all(n == 1 for n in everything.values())
    assert TOTAL - len(everything) <= (2 - 1) + (3 - 1)
