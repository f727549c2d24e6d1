"""Issue 28, item 4: row mixing draws from enough chunks, or says why it cannot.

8 files read by 4 ranks x 2 workers gave about 1.3 files per batch with the default
``shuffle=True`` (each reader had one 64 MiB chunk: one file) and 1.0 with
``row_shuffle_window``. When the split is left to the library it now splits finer, down
to single row groups (Parquet) or 1 MiB byte ranges (text), until every reader can mix
the chunks the mixing reads side by side; when the smallest units do not allow that, a
warning gives the figure and the fix.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.data import write_parquet_files
from tests.strategies import piece_rows
from torch_dataloader_utils import StateMismatchError, StructuredDataset, create_dataloader
from torch_dataloader_utils.plan.splits import RowGroupSplit
from torch_dataloader_utils.runtime import env

FILE_ROWS = 4000


def files_of(ids: Any) -> np.ndarray:
    return np.asarray(ids) // FILE_ROWS


def write(tmp_path: Path, groups_per_file: int, files: int = 8) -> str:
    root = tmp_path / "data"
    write_parquet_files(
        root, [FILE_ROWS] * files, row_group_size=FILE_ROWS // groups_per_file, with_strings=False
    )
    return str(root)


def oracle_files_per_batch(dataset: StructuredDataset, workers: int, batch_size: int) -> list[int]:
    """Files of every batch of every worker of ``dataset``'s rank, from the rows its pieces emit."""
    out = []
    for w in range(workers):
        pieces = dataset._planned.worker_pieces(env.WorkerSlot(w, workers, True), dataset.epoch)
        rows = [r for p in pieces for r in piece_rows(p, dataset.file_table)]
        out += [len({r[0] for r in rows[i : i + batch_size]}) for i in range(0, len(rows), batch_size)]
    return out


def test_eight_files_on_four_ranks_by_two_workers_mix_several_files(tmp_path: Path) -> None:
    """Real loaders: rows exactly once, and a batch draws from about 4 files (was about 1.3)."""
    root = write(tmp_path, groups_per_file=4)  # 32 row groups for 8 readers: 4 each at most
    per_batch, seen = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rank in range(4):
            loader, dataset = create_dataloader(
                root, num_ranks=4, rank=rank, num_workers=2, batch_size=256, shuffle=True
            )
            for batch in loader:
                ids = batch["id"].tolist()
                seen += ids
                per_batch.append(len(set(files_of(ids))))
    assert len(seen) == len(set(seen))
    assert len(seen) >= 8 * FILE_ROWS - 3  # 'drop' leaves out fewer than 4 rows
    assert np.mean(per_batch) >= 3.0, np.mean(per_batch)
    assert len(dataset.planner.chunk_table() or ()) == 32  # every row group a chunk
    # 32 row groups cannot give 8 readers the 8 chunks each that the mixing reads: said once.
    said = [str(w.message) for w in caught if "chunks per reader" in str(w.message)]
    assert len(said) == 1
    assert "the files' 32 row groups (stripes), the smallest unit of a chunk, give the 8 readers" in said[0]
    assert "about 4.0 each; a batch draws from about" in said[0]
    assert "smaller row groups" in said[0]


@pytest.mark.parametrize(("ranks", "workers"), [(1, 2), (2, 2), (4, 1)])
def test_enough_row_groups_give_every_reader_its_streams(tmp_path: Path, ranks: int, workers: int) -> None:
    root = write(tmp_path, groups_per_file=16)  # 128 row groups
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # enough units: no warning
        datasets = [
            StructuredDataset(
                root, num_ranks=ranks, rank=r, num_workers=workers, batch_size=200, shuffle=True
            )
            for r in range(ranks)
        ]
    chunks = len(datasets[0].planner.chunk_table() or ())
    assert chunks >= ranks * workers * 8
    files = [n for d in datasets for n in oracle_files_per_batch(d, workers, 200)]
    assert np.mean(files) >= 4.0
    estimate = datasets[0].files_per_batch(0, workers)
    assert estimate is not None
    assert abs(estimate - np.mean(files)) < 1.0  # what plan / inspect print


def test_a_window_spans_chunks_of_several_files(tmp_path: Path) -> None:
    root = write(tmp_path, groups_per_file=16)
    ds = StructuredDataset(root, num_workers=2, batch_size=200, shuffle=True, row_shuffle_window=2000)
    assert ds.split_strategy == RowGroupSplit(split_bytes=ds.split_strategy.split_bytes, split_rows=250)
    assert np.mean(oracle_files_per_batch(ds, 2, 200)) >= 4.0  # was 1.0: one chunk per window


def test_the_users_split_and_unshuffled_reads_are_left_alone(tmp_path: Path) -> None:
    root = write(tmp_path, groups_per_file=16)
    plain = StructuredDataset(root, num_workers=2, shuffle=False)
    assert len(plain.planner.chunk_table() or ()) == 8  # 64 MiB chunks: one per file
    chunk_order = StructuredDataset(root, num_workers=2, shuffle=True, row_mixing=None)
    assert len(chunk_order.planner.chunk_table() or ()) == 8
    with pytest.warns(
        UserWarning, match=r"split_bytes / split_rows give the 2 readers .* only 8 chunks"
    ) as got:
        given = StructuredDataset(root, num_workers=2, shuffle=True, split_rows=FILE_ROWS)
    assert "Lower split_bytes / split_rows" in str(got[0].message)
    assert given.split_strategy == RowGroupSplit(split_bytes=None, split_rows=FILE_ROWS)


def test_a_users_split_down_to_single_row_groups_names_the_row_groups(tmp_path: Path) -> None:
    """Lowering split_rows cannot help once every chunk is one row group: the warning says so."""
    root = write(tmp_path, groups_per_file=1, files=2)
    with pytest.warns(UserWarning, match=r"the files' 2 row groups \(stripes\), the smallest unit") as got:
        StructuredDataset(root, num_workers=2, shuffle=True, split_rows=FILE_ROWS // 4)
    assert "Lower split_bytes / split_rows" not in str(got[0].message)
    assert "reshard" in str(got[0].message)


def test_text_is_split_into_smaller_byte_ranges(tmp_path: Path) -> None:
    root = tmp_path / "text"
    root.mkdir()
    for i in range(2):
        ids = range(i * 200_000, (i + 1) * 200_000)
        (root / f"part-{i}.csv").write_text("id\n" + "".join(f"{j}\n" for j in ids))
    ds = StructuredDataset(str(root), format="csv", num_workers=2, batch_size=512, shuffle=True)
    assert ds.split_strategy.split_bytes == 2**20  # type: ignore[union-attr]  # the text floor
    loader, _ = create_dataloader(str(root), format="csv", num_workers=2, batch_size=512, shuffle=True)
    ids = [i for b in loader for i in b["id"].tolist()]
    assert sorted(ids) == list(range(400_000))


@pytest.mark.parametrize(("before", "after"), [((4, 2), (1, 2)), ((1, 1), (2, 2))])
def test_resume_into_another_world_adopts_the_saved_split(
    tmp_path: Path, before: tuple[int, int], after: tuple[int, int]
) -> None:
    """The automatic split depends on the world; a state carries it, and any world resumes exactly."""
    root = write(tmp_path, groups_per_file=16)
    opts: dict[str, Any] = {"batch_size": 100, "shuffle": True, "shuffle_seed": 9, "equal_batches": "off"}
    ranks, workers = before
    first: list[int] = []
    states = []
    splits = set()
    for rank in range(ranks):
        loader, dataset = create_dataloader(root, num_ranks=ranks, rank=rank, num_workers=workers, **opts)
        splits.add(dataset.split_strategy)
        for n, batch in enumerate(loader, start=1):
            first += batch["id"].tolist()
            if n == 7:
                break
        states.append(json.loads(json.dumps(loader.state_dict())))
    from torch_dataloader_utils import merge_states

    state = merge_states(states)
    ranks, workers = after
    rest: list[int] = []
    for rank in range(ranks):
        loader, dataset = create_dataloader(root, num_ranks=ranks, rank=rank, num_workers=workers, **opts)
        own = dataset.split_strategy
        assert own not in splits  # this world alone would split otherwise
        loader.load_state_dict(state)
        assert {dataset.split_strategy} == splits  # the state's split, adopted
        rest += [i for b in loader for i in b["id"].tolist()]
    assert Counter(first + rest) == Counter(range(8 * FILE_ROWS))


def test_a_refused_state_leaves_the_split_as_it_was(tmp_path: Path) -> None:
    root = write(tmp_path, groups_per_file=16)
    loader, _ = create_dataloader(root, num_ranks=1, rank=0, num_workers=1, batch_size=100, shuffle=True)
    next(iter(loader))
    state = loader.dataset.state_dict()
    other, dataset = create_dataloader(root, num_workers=2, batch_size=50, shuffle=True)
    before = dataset.split_strategy
    with pytest.raises(StateMismatchError, match="option batch_size: 100 in the state, 50 now"):
        other.load_state_dict(state)
    assert dataset.split_strategy == before  # tried with the state's split, then put back
    assert "split_auto" not in state["fingerprint"]["options"]  # 1 reader: 8 chunks were enough
    assert "split_auto" in dataset.fingerprint()["options"]  # 2 readers: split finer
