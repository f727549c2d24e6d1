"""create_dataloader end to end through a real torch DataLoader (fork workers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.fixtures.data import WriteParquet
from tests.fixtures.e2e import assert_exactly_once, batch_ids, epoch_ids
from torch_dataloader_utils import StructuredDataset, create_dataloader
from torch_dataloader_utils.runtime.dataset import MAX_AUTO_WORKERS

# Uneven files and row groups: 1,037 rows in 4 files, row groups of 1 to 64 rows.
ROWS = [300, 1, 437, 299]
GROUPS = [64, 1, 50, 33]
TOTAL = sum(ROWS)


@pytest.fixture
def data(write_parquet: WriteParquet) -> Path:
    paths = write_parquet(ROWS, row_group_size=GROUPS)
    return paths[0].parent


def _loaders(path: Path, num_ranks: int, **kwargs: object) -> list[tuple[object, StructuredDataset]]:
    return [
        create_dataloader(str(path), num_ranks=num_ranks, rank=r, **kwargs)  # type: ignore[arg-type]
        for r in range(num_ranks)
    ]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("num_ranks", [1, 3])
def test_every_row_exactly_once_across_ranks_and_epochs(
    data: Path, num_workers: int, shuffle: bool, num_ranks: int
) -> None:
    loaders = _loaders(
        data,
        num_ranks,
        num_workers=num_workers,
        batch_size=37,
        shuffle=shuffle,
        shuffle_seed=7,
        split_rows=100,
        equal_batches="off",  # whole chunks per rank: nothing dropped (drop/pad: test_equal_batches)
    )
    orders = []
    for epoch in range(2):
        ids: list[int] = []
        per_rank = []
        for loader, dataset in loaders:
            dataset.set_epoch(epoch)
            rank_ids = epoch_ids(loader)  # type: ignore[arg-type]
            assert rank_ids, "every rank gets rows"
            per_rank.append(rank_ids)
            ids.extend(rank_ids)
        assert_exactly_once(ids, range(TOTAL))
        orders.append(per_rank)
    if shuffle:
        assert orders[0] != orders[1], "set_epoch with shuffle=True must change the order"
    else:
        assert orders[0] == orders[1], "without shuffle every epoch reads the same order"


def test_same_epoch_same_order_is_deterministic(data: Path) -> None:
    a, da = create_dataloader(str(data), num_workers=2, batch_size=50, shuffle=True, split_rows=64)
    b, db = create_dataloader(str(data), num_workers=2, batch_size=50, shuffle=True, split_rows=64)
    da.set_epoch(3)
    db.set_epoch(3)
    assert epoch_ids(a) == epoch_ids(b)


def test_shuffle_seed_changes_order(data: Path) -> None:
    a, _ = create_dataloader(str(data), num_workers=0, batch_size=50, shuffle=True, shuffle_seed=1)
    b, _ = create_dataloader(str(data), num_workers=0, batch_size=50, shuffle=True, shuffle_seed=2)
    ia, ib = epoch_ids(a), epoch_ids(b)
    assert sorted(ia) == sorted(ib) == list(range(TOTAL))
    assert ia != ib


def test_persistent_workers_reshuffle_on_set_epoch(data: Path) -> None:
    loader, dataset = create_dataloader(
        str(data),
        num_workers=2,
        persistent_workers=True,
        batch_size=40,
        shuffle=True,
        split_rows=64,
        num_ranks=1,
        rank=0,
    )
    orders = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        ids = epoch_ids(loader)
        assert_exactly_once(ids, range(TOTAL))
        orders.append(ids)
    assert loader._iterator is not None, "workers persisted between epochs"
    assert orders[0] != orders[1] != orders[2]
    assert orders[0] != orders[2]


def test_persistent_workers_match_fresh_workers(data: Path) -> None:
    kwargs = {"num_workers": 2, "batch_size": 40, "shuffle": True, "split_rows": 64}
    persistent, pds = create_dataloader(str(data), persistent_workers=True, **kwargs)  # type: ignore[arg-type]
    fresh, fds = create_dataloader(str(data), **kwargs)  # type: ignore[arg-type]
    for epoch in (0, 1):
        pds.set_epoch(epoch)
        fds.set_epoch(epoch)
        assert sorted(map(tuple, _batches(persistent))) == sorted(map(tuple, _batches(fresh)))


def _batches(loader: object) -> list[list[int]]:
    return [batch_ids(b) for b in loader]  # type: ignore[attr-defined]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_full_except_each_workers_last(data: Path, num_workers: int) -> None:
    loader, _dataset = create_dataloader(str(data), num_workers=num_workers, batch_size=64, split_rows=100)
    sizes = [len(batch_ids(b)) for b in loader]
    assert sum(sizes) == TOTAL
    short = [s for s in sizes if s != 64]
    assert len(short) <= max(1, num_workers)
    assert all(0 < s < 64 for s in short)
    # With one reader there is exactly one short batch, and it is the last one.
    if num_workers == 0:
        assert sizes[:-1] == [64] * (len(sizes) - 1)
        assert sizes[-1] == TOTAL % 64


@pytest.mark.parametrize("num_workers", [0, 2])
def test_drop_last_drops_each_workers_short_batch(data: Path, num_workers: int) -> None:
    loader, dataset = create_dataloader(
        str(data), num_workers=num_workers, batch_size=64, split_rows=100, drop_last=True
    )
    batches = [batch_ids(b) for b in loader]
    assert batches
    assert all(len(b) == 64 for b in batches)
    rows_per_worker = [dataset.plan(0).rows_for(0, w) for w in range(max(1, num_workers))]
    expected = sum((r or 0) // 64 * 64 for r in rows_per_worker)
    ids = [i for b in batches for i in b]
    assert len(ids) == len(set(ids)) == expected


def test_batches_span_row_group_and_file_boundaries(data: Path) -> None:
    # Files hold 300, 1, 437, 299 rows in groups of 64, 1, 50, 33: batches of 100 must
    # be assembled from several groups and several files.
    loader, _ = create_dataloader(str(data), num_workers=0, batch_size=100, split_strategy="file")
    batches = [batch_ids(b) for b in loader]
    assert [len(b) for b in batches] == [100] * 10 + [37]
    assert [i for b in batches for i in b] == list(range(TOTAL))
    assert batches[2] == list(range(200, 300))
    assert batches[3] == list(range(300, 400)), "batch spans files 0 -> 1 -> 2"


def test_collate_fn_is_applied_in_workers(data: Path) -> None:
    def collate(batch: dict[str, object]) -> dict[str, object]:
        ids = batch["id"]
        assert isinstance(ids, torch.Tensor)
        return {"id": ids, "twice": ids * 2, "n": torch.tensor([len(ids)])}

    loader, _ = create_dataloader(
        str(data), num_workers=2, batch_size=64, columns=["id", "x"], collate_fn=collate
    )
    seen = []
    for batch in loader:
        assert set(batch) == {"id", "twice", "n"}
        assert torch.equal(batch["twice"], batch["id"] * 2)
        assert int(batch["n"]) == len(batch["id"])
        seen.extend(batch["id"].tolist())
    assert_exactly_once(seen, range(TOTAL))


def test_worker_batches_arrive_as_plain_dict_with_correct_values(data: Path) -> None:
    loader, _ = create_dataloader(str(data), num_workers=2, batch_size=100, columns=["id", "x", "label", "s"])
    ids: list[int] = []
    for batch in loader:
        assert type(batch) is dict
        assert list(batch) == ["id", "x", "label", "s"]
        for name in ("id", "x", "label"):
            assert type(batch[name]) is torch.Tensor
        assert batch["id"].dtype == torch.int64
        assert batch["x"].dtype == torch.float32
        assert torch.equal(batch["x"], (batch["id"] * 0.5).to(torch.float32))
        assert torch.equal(batch["label"], batch["id"] % 7)
        assert batch["s"] == [f"row-{i}" for i in batch["id"].tolist()]
        ids.extend(batch["id"].tolist())
    assert_exactly_once(ids, range(TOTAL))


def test_auto_num_workers(data: Path) -> None:
    loader, _dataset = create_dataloader(str(data), num_workers=None, batch_size=100, split_rows=64)
    assert 0 <= loader.num_workers <= MAX_AUTO_WORKERS
    assert loader.num_workers != 1
    assert_exactly_once(epoch_ids(loader), range(TOTAL))


def test_auto_num_workers_single_chunk_reads_in_main_process(write_parquet: WriteParquet) -> None:
    paths = write_parquet([50])
    loader, _ = create_dataloader(str(paths[0]), num_workers=None, batch_size=10)
    assert loader.num_workers == 0
    assert_exactly_once(epoch_ids(loader), range(50))


def test_classmethod_create_dataloader(data: Path) -> None:
    loader, dataset = StructuredDataset.create_dataloader(str(data), num_workers=0, batch_size=500)
    assert isinstance(dataset, StructuredDataset)
    assert_exactly_once(epoch_ids(loader), range(TOTAL))


def test_dataloader_passthrough_options(data: Path) -> None:
    loader, _ = create_dataloader(
        str(data), num_workers=2, prefetch_factor=3, timeout=30, pin_memory=False, batch_size=200
    )
    assert loader.prefetch_factor == 3
    assert loader.timeout == 30
    assert_exactly_once(epoch_ids(loader), range(TOTAL))


@pytest.mark.slow
def test_spawn_workers_with_persistent_workers_and_set_epoch(data: Path) -> None:
    # spawn (the default on macOS; forkserver is Python 3.14's default on Linux) pickles
    # the dataset to each worker: it must hold no closures.
    loader, dataset = create_dataloader(
        str(data),
        num_workers=2,
        multiprocessing_context="spawn",
        persistent_workers=True,
        batch_size=64,
        shuffle=True,
        split_rows=100,
        timeout=120,
    )
    orders = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        ids = epoch_ids(loader)
        assert_exactly_once(ids, range(TOTAL))
        orders.append(ids)
    assert orders[0] != orders[1]
