"""Equal batches through real DataLoaders; lengths; ranks passed explicitly (Horovod path)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest
import torch

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import ConfigError, IncompatibleOptionsError, UnknownLengthError

# Deliberately uneven: 7 files, row groups of different sizes.
ROWS = [1300, 170, 940, 55, 610, 333, 20]
TOTAL = sum(ROWS)


@pytest.fixture
def uneven(write_parquet, monkeypatch) -> Path:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    paths = write_parquet(ROWS, row_group_size=[200, 50, 300, 55, 100, 111, 20], with_strings=False)
    return paths[0].parent


def read_rank(path: Path, num_ranks: int, rank: int, workers: int, **kw: object):
    """Like a Horovod job: size and rank passed explicitly (hvd.size(), hvd.rank())."""
    kw.setdefault("split_rows", 150)
    loader, dataset = StructuredDataset.create_dataloader(
        str(path), num_ranks=num_ranks, rank=rank, num_workers=workers, **kw
    )
    batches = list(loader)
    return loader, dataset, batches


@pytest.mark.parametrize("epoch", [0, 1])
def test_drop_every_rank_same_batches_with_different_worker_counts(uneven, epoch):
    num_ranks, batch_size = 3, 64
    counts, ids, lengths = [], [], []
    for rank, workers in zip(range(num_ranks), [0, 2, 1], strict=True):
        loader, dataset = StructuredDataset.create_dataloader(
            str(uneven),
            num_ranks=num_ranks,
            rank=rank,
            num_workers=workers,
            batch_size=batch_size,
            shuffle=True,
            shuffle_seed=5,
            split_rows=150,
        )
        dataset.set_epoch(epoch)
        lengths.append(len(loader))
        batches = list(loader)
        counts.append(len(batches))
        ids.extend(int(i) for b in batches for i in b["id"])
    dropped = TOTAL % num_ranks
    assert len(set(counts)) == 1
    assert counts == lengths
    assert counts[0] == -(-(TOTAL // num_ranks) // batch_size)
    assert len(ids) == len(set(ids)) == TOTAL - dropped
    assert set(ids) <= set(range(TOTAL))


def test_pad_flags_repeated_rows(uneven):
    num_ranks, batch_size = 4, 100
    counts, real, pad = [], [], []
    for rank in range(num_ranks):
        _, _, batches = read_rank(
            uneven, num_ranks, rank, rank % 3, batch_size=batch_size, equal_batches="pad"
        )
        counts.append(len(batches))
        for b in batches:
            flag = b["_is_padding"]
            assert flag.dtype == torch.bool
            real.extend(b["id"][~flag].tolist())
            pad.extend(b["id"][flag].tolist())
    assert len(set(counts)) == 1
    assert sorted(real) == list(range(TOTAL))
    assert len(pad) == (-TOTAL) % num_ranks
    assert set(pad) <= set(range(TOTAL))


def test_off_keeps_uneven_counts(uneven):
    counts = [
        len(read_rank(uneven, 3, r, 0, batch_size=64, equal_batches="off", split_rows=None)[2])
        for r in range(3)
    ]
    assert len(set(counts)) > 1  # what the default prevents


def test_one_rank_reads_everything_with_len(uneven):
    loader, dataset, batches = read_rank(uneven, 1, 0, 2, batch_size=128)
    assert len(loader) == len(dataset) == len(batches)
    assert sorted(int(i) for b in batches for i in b["id"]) == list(range(TOTAL))


def test_row_filter_without_counting_on_many_ranks_is_a_clear_error(uneven):
    with pytest.raises(
        IncompatibleOptionsError, match=r"equal_batches='drop' needs exact row counts.*filters.*count_rows"
    ):
        StructuredDataset(str(uneven), filters=pc.field("label") == 3, num_ranks=2, rank=0, count_rows=False)


@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_row_filter_counted_gives_equal_batches_and_exact_rows(uneven, policy):
    """filters on a data column: a count pass makes counts exact, so equal batches hold."""
    num_ranks, batch_size = 3, 16
    expr = (pc.field("label") == 3) | (pc.field("id") < 40)
    expected = {i for i in range(TOTAL) if i % 7 == 3 or i < 40}
    counts, lengths, ids, pads = [], [], [], 0
    for rank, workers in zip(range(num_ranks), [2, 0, 1], strict=True):
        loader, dataset = StructuredDataset.create_dataloader(
            str(uneven), filters=expr, num_ranks=num_ranks, rank=rank, num_workers=workers,
            batch_size=batch_size, shuffle=True, shuffle_seed=3, split_rows=150, equal_batches=policy,
        )  # fmt: skip
        dataset.set_epoch(1)
        lengths.append(len(loader))
        batches = list(loader)
        counts.append(len(batches))
        for b in batches:
            keep = ~b["_is_padding"] if policy == "pad" else torch.ones(len(b["id"]), dtype=torch.bool)
            pads += int((~keep).sum())
            ids.extend(int(i) for i in b["id"][keep])
            assert all(int(i) in expected for i in b["id"])  # padding repeats real rows
    assert len(set(counts)) == 1, counts
    assert counts == lengths
    assert len(ids) == len(set(ids))
    missing = expected - set(ids)
    assert set(ids) <= expected
    if policy == "drop":
        assert len(missing) == len(expected) % num_ranks
    else:
        assert not missing
        assert pads == (-len(expected)) % num_ranks


def test_row_filter_len_is_a_type_error_and_off_works(uneven):
    ds = StructuredDataset(
        str(uneven), filters=pc.field("label") == 3, num_ranks=2, rank=1, equal_batches="off"
    )
    with pytest.raises(UnknownLengthError, match="unknown before reading") as err:
        len(ds)
    assert isinstance(err.value, TypeError)
    batches = list(torch.utils.data.DataLoader(ds, batch_size=None))
    assert all((b["label"] == 3).all() for b in batches)


def test_bad_equal_batches_value_names_the_choices(uneven):
    with pytest.raises(ConfigError, match=r"equal_batches='even'.*'drop', 'pad', 'off'"):
        StructuredDataset(str(uneven), equal_batches="even")
    with pytest.raises(ConfigError, match=r"equal_batches=True is ambiguous"):
        StructuredDataset(str(uneven), equal_batches=True)  # type: ignore[arg-type]


def test_dropped_rows_rotate_with_the_shuffle(uneven):
    def dropped(epoch: int) -> set[int]:
        ds = StructuredDataset(str(uneven), num_ranks=3, rank=0, shuffle=True, split_rows=150)
        plan = ds.plan(epoch)
        rows: set[tuple[str, int]] = set()
        for c in plan.dropped:
            rows |= {(c.path, p) for p in range(c.start, c.stop)}
        return rows

    assert len(dropped(0)) == TOTAL % 3 == 2
    assert len({frozenset(dropped(e)) for e in range(5)}) > 1


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_text_on_many_ranks_counts_records_by_default(tmp_path, fmt):
    """CSV / JSONL over several ranks: count_rows=None counts, so equal batches just work."""
    rows = 1234
    path = tmp_path / f"data.{fmt}"
    if fmt == "csv":
        path.write_text("id,x\n" + "".join(f"{i},{i * 0.5}\n" for i in range(rows)))
    else:
        path.write_text("".join(f'{{"id": {i}, "x": {i * 0.5}}}\n' for i in range(rows)))
    counts, ids = [], []
    for rank in range(3):
        loader, _ = StructuredDataset.create_dataloader(
            str(path),
            format=fmt,
            split_bytes=700,
            num_ranks=3,
            rank=rank,
            num_workers=rank % 2 * 2,
            batch_size=32,
        )
        batches = list(loader)
        assert len(loader) == len(batches)
        counts.append(len(batches))
        ids.extend(int(i) for b in batches for i in b["id"])
    assert len(set(counts)) == 1
    assert len(ids) == len(set(ids)) == rows - rows % 3
