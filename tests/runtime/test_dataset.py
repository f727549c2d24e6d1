"""StructuredDataset through a real DataLoader: paths, filters, output formats, nulls,
storage options on a non-local filesystem, and custom split strategies.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from tests.fixtures.data import WriteParquet
from tests.fixtures.e2e import TOKEN, TokenMemoryFileSystem, assert_exactly_once, epoch_ids, upload
from torch_dataloader_utils import Chunk, FileInfo, NullValueError, StructuredDataset, create_dataloader
from torch_dataloader_utils.errors import OverlappingChunksError

# -- paths -----------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path, write_parquet: WriteParquet) -> Path:
    """data/part-0000..0002 (ids 0-209), plus markers, hidden files and symlinks."""
    from tests.fixtures.data import write_parquet_files

    root = tmp_path / "tree"
    write_parquet_files(root / "a", [50, 60], row_group_size=20)  # ids 0-109
    write_parquet_files(root / "b" / "deep", [100], row_group_size=30, start_id=110)  # ids 110-209
    (root / "_SUCCESS").write_bytes(b"")
    (root / "a" / "_metadata").write_bytes(b"not parquet")
    (root / "a" / ".part-0000.parquet.crc").write_bytes(b"crc")
    (root / "b" / "part-0000.parquet.crc").write_bytes(b"crc")
    (root / ".staging").mkdir()
    (root / ".staging" / "junk.parquet").write_bytes(b"junk")
    outside = tmp_path / "outside"
    write_parquet_files(outside, [5, 7], start_id=210)  # ids 210-221
    os.symlink(outside, root / "linked")  # directory symlink
    os.symlink(outside / "part-0000.parquet", root / "file-link.parquet")  # file symlink -> ids 210-214 again
    return root


def test_directory_recursive_skips_markers_follows_symlinks(tree: Path) -> None:
    loader, dataset = create_dataloader(str(tree), num_workers=2, batch_size=32, columns=["id"])
    names = sorted(Path(f.path).relative_to(tree).as_posix() for f in dataset.files)
    assert names == [
        "a/part-0000.parquet",
        "a/part-0001.parquet",
        "b/deep/part-0000.parquet",
        "file-link.parquet",
        "linked/part-0000.parquet",
        "linked/part-0001.parquet",
    ]
    ids = epoch_ids(loader)
    # file-link.parquet is a second path to linked/part-0000.parquet: two files, read twice.
    assert sorted(ids) == sorted([*range(222), *range(210, 215)])


def test_single_file(tree: Path) -> None:
    loader, _ = create_dataloader(str(tree / "a" / "part-0001.parquet"), num_workers=0, batch_size=16)
    assert_exactly_once(epoch_ids(loader), range(50, 110))


def test_glob(tree: Path) -> None:
    loader, _ = create_dataloader(str(tree / "**" / "part-*.parquet"), num_workers=0, batch_size=16)
    assert_exactly_once(epoch_ids(loader), [*range(210), *range(210, 222)])


def test_list_of_paths(tree: Path) -> None:
    paths = [str(tree / "a" / "part-0000.parquet"), str(tree / "b"), str(tree / "a" / "part-0000.parquet")]
    loader, dataset = create_dataloader(paths, num_workers=0, batch_size=16)
    assert len(dataset.files) == 2
    assert_exactly_once(epoch_ids(loader), [*range(50), *range(110, 210)])


# -- filters ---------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_filters_are_exact_on_a_column_not_in_columns(write_parquet: WriteParquet, num_workers: int) -> None:
    paths = write_parquet([300, 200], row_group_size=50)
    expr = (pc.field("label") == 3) & (pc.field("id") >= 120)
    loader, dataset = create_dataloader(
        str(paths[0].parent), columns=["id", "x"], filters=expr, num_workers=num_workers, batch_size=10
    )
    assert [[g.index for g in f.row_groups or ()] for f in dataset.files] == [[2, 3, 4, 5], [0, 1, 2, 3]]
    batches = list(loader)
    for b in batches:
        assert list(b) == ["id", "x"]
    assert_exactly_once(
        [i for b in batches for i in b["id"].tolist()], [i for i in range(120, 500) if i % 7 == 3]
    )
    sizes = [len(b["id"]) for b in batches]
    assert sum(s != 10 for s in sizes) <= max(1, num_workers), "filtered rows are re-batched to full batches"


def test_filter_excluding_everything_yields_nothing(write_parquet: WriteParquet) -> None:
    paths = write_parquet([100], row_group_size=10)
    with pytest.warns(UserWarning, match="excludes every row group"):
        loader, _ = create_dataloader(str(paths[0]), filters=pc.field("id") < 0, num_workers=0)
    assert list(loader) == []


# -- output formats --------------------------------------------------------------------------


@pytest.fixture
def typed(tmp_path: Path) -> Path:
    n = 50
    ids = np.arange(n, dtype=np.int64)
    table = pa.table(
        {
            "id": ids,
            "f": ids.astype(np.float32) / 2,
            "flag": ids % 2 == 0,
            "ts": pa.array(ids * 1000, pa.int64()).cast(pa.timestamp("ms")),
            "day": pa.array(ids.astype(np.int32), pa.int32()).cast(pa.date32()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float32)), 3),
            "seq": pa.array([list(range(i % 4)) for i in ids], pa.list_(pa.int64())),
            "name": pa.array([f"n{i}" for i in ids]),
        }
    )
    d = tmp_path / "typed"
    d.mkdir()
    pq.write_table(table.slice(0, 23), d / "a.parquet", row_group_size=10)
    pq.write_table(table.slice(23), d / "b.parquet", row_group_size=10)
    return d


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_output_types_and_values(typed: Path, num_workers: int) -> None:
    loader, _ = create_dataloader(str(typed), num_workers=num_workers, batch_size=16)
    seen = []
    for b in loader:
        assert type(b) is dict
        ids = b["id"]
        assert ids.dtype == torch.int64
        assert torch.equal(b["f"], ids.to(torch.float32) / 2)
        assert b["flag"].dtype == torch.bool
        assert torch.equal(b["flag"], ids % 2 == 0)
        assert b["ts"].dtype == torch.int64
        assert torch.equal(b["ts"], ids * 1000)
        assert b["day"].dtype == torch.int32
        assert b["day"].tolist() == ids.tolist()
        assert b["vec"].shape == (len(ids), 3)
        assert torch.equal(b["vec"], ids.to(torch.float32).unsqueeze(1).expand(-1, 3))
        assert b["seq"].is_nested  # a jagged nested tensor (ragged="jagged", the default)
        assert [t.tolist() for t in b["seq"].unbind()] == [list(range(i % 4)) for i in ids.tolist()]
        assert b["name"] == [f"n{i}" for i in ids.tolist()]
        seen.extend(ids.tolist())
    assert_exactly_once(seen, range(50))


def test_numpy_output(typed: Path) -> None:
    loader, _ = create_dataloader(str(typed), num_workers=0, batch_size=50, output_format="numpy")
    (b,) = list(loader)
    assert isinstance(b["id"], np.ndarray)
    assert b["id"].tolist() == list(range(50))
    assert b["vec"].shape == (50, 3)
    assert b["name"].dtype == object
    assert b["seq"].dtype == object


@pytest.mark.parametrize("num_workers", [0, 2])
def test_arrow_output(typed: Path, num_workers: int) -> None:
    loader, dataset = create_dataloader(
        str(typed), num_workers=num_workers, batch_size=20, output_format="arrow"
    )
    batches = list(loader)
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert all(b.schema == dataset.discovered.output_schema for b in batches)
    table = pa.Table.from_batches(batches).sort_by("id")
    assert table.column("name").to_pylist() == [f"n{i}" for i in range(50)]
    assert table.column("ts").type == pa.timestamp("ms")


def test_dict_output(typed: Path) -> None:
    loader, _ = create_dataloader(
        str(typed), num_workers=0, batch_size=50, output_format="dict", columns=["id", "day"]
    )
    (b,) = list(loader)
    assert b["id"] == list(range(50))
    assert b["day"][1] == dt.date(1970, 1, 2)


# -- nulls -----------------------------------------------------------------------------------


@pytest.fixture
def with_nulls(tmp_path: Path) -> Path:
    d = tmp_path / "nulls"
    d.mkdir()
    weights = pa.array([None if i % 10 == 5 else float(i) for i in range(40)])
    pq.write_table(
        pa.table({"id": pa.array(range(40), pa.int64()), "w": weights}), d / "n.parquet", row_group_size=10
    )
    return d


@pytest.mark.parametrize("num_workers", [0, 2])
def test_null_in_numeric_column_is_an_error_naming_it(with_nulls: Path, num_workers: int) -> None:
    loader, _ = create_dataloader(str(with_nulls), num_workers=num_workers, batch_size=8, split_rows=10)
    with pytest.raises(NullValueError, match=r"column 'w' has 1 null"):
        list(loader)


@pytest.mark.parametrize("null_fill", [-1.0, {"w": -1.0}])
def test_null_fill(with_nulls: Path, null_fill: object) -> None:
    loader, _ = create_dataloader(
        str(with_nulls), num_workers=2, batch_size=8, null_fill=null_fill, split_rows=10
    )
    got = {}
    for b in loader:
        assert b["w"].dtype == torch.float64
        got.update(zip(b["id"].tolist(), b["w"].tolist(), strict=True))
    assert got == {i: (-1.0 if i % 10 == 5 else float(i)) for i in range(40)}


def test_nulls_filtered_out_need_no_fill(with_nulls: Path) -> None:
    loader, _ = create_dataloader(
        str(with_nulls), filters=pc.field("w").is_valid(), num_workers=0, batch_size=8
    )
    assert_exactly_once(epoch_ids(loader), [i for i in range(40) if i % 10 != 5])


# -- storage_options on a non-local filesystem -----------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_storage_options_reach_listing_footers_and_workers(
    write_parquet: WriteParquet, tokmem: TokenMemoryFileSystem, num_workers: int
) -> None:
    paths = write_parquet([130, 70, 55], row_group_size=[40, 20, 55])
    upload(tokmem, paths, paths[0].parent, "/bucket/train")
    tokmem.pipe_file("/bucket/train/_SUCCESS", b"")
    loaders = [
        create_dataloader(
            "tokmem://bucket/train/",
            storage_options={"token": TOKEN},
            num_workers=num_workers,
            batch_size=32,
            shuffle=True,
            split_rows=40,
            num_ranks=2,
            rank=r,
            filters=pc.field("id") >= 20,
            equal_batches="off",
        )
        for r in range(2)
    ]
    for epoch in range(2):
        ids = []
        for loader, dataset in loaders:
            dataset.set_epoch(epoch)
            ids.extend(epoch_ids(loader))
        assert_exactly_once(ids, range(20, 255))


def test_missing_storage_options_fail_in_listing(
    write_parquet: WriteParquet, tokmem: TokenMemoryFileSystem
) -> None:
    paths = write_parquet([10])
    upload(tokmem, paths, paths[0].parent, "/bucket/t")
    from torch_dataloader_utils import DiscoveryError

    with pytest.raises(
        DiscoveryError,
        match=r"'tokmem://bucket/t' .* was refused: PermissionError: .*needs storage_options"
        r".*check the credentials",
    ):
        create_dataloader("tokmem://bucket/t", num_workers=0)


def test_remote_missing_path(tokmem: TokenMemoryFileSystem) -> None:
    from torch_dataloader_utils import PathNotFoundError

    with pytest.raises(PathNotFoundError, match=r"tokmem://.*nothing.*storage_options"):
        create_dataloader("tokmem://bucket/nothing", storage_options={"token": TOKEN})


# -- custom split strategies -----------------------------------------------------------------


class HalfFiles:
    """Current signature: each file cut in two; rank r takes chunks r, r + num_ranks, ..."""

    def generate(
        self, files: Sequence[FileInfo], num_workers: int, epoch: int, *, num_ranks: int, rank: int
    ) -> list[Chunk]:
        chunks = []
        for f in files:
            assert f.num_rows is not None
            mid = f.num_rows // 2
            chunks += [Chunk.rows(f, 0, mid), Chunk.rows(f, mid, f.num_rows)] if mid else [Chunk.rows(f)]
        return chunks[rank::num_ranks]


class OldWholeFiles:
    """Older signature: every file as one chunk, for the whole dataset."""

    def generate(self, files: Sequence[FileInfo], num_workers: int, epoch: int) -> list[Chunk]:
        return [Chunk.rows(f) for f in files]


class EveryRankEverything:
    """A broken current-signature strategy: every rank gets every chunk."""

    def generate(
        self, files: Sequence[FileInfo], num_workers: int, epoch: int, *, num_ranks: int, rank: int
    ) -> list[Chunk]:
        return [Chunk.rows(f) for f in files]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_custom_strategy_current_signature(write_parquet: WriteParquet, num_workers: int) -> None:
    paths = write_parquet([101, 60, 33], row_group_size=16)
    ids = []
    for r in range(3):
        loader, _ = create_dataloader(
            str(paths[0].parent),
            split_strategy=HalfFiles(),
            num_workers=num_workers,
            num_ranks=3,
            rank=r,
            batch_size=8,
            equal_batches="off",
        )
        ids += epoch_ids(loader)
    assert_exactly_once(ids, range(194))


def test_custom_strategy_older_signature_is_sharded_with_a_warning(write_parquet: WriteParquet) -> None:
    paths = write_parquet([40, 30, 20, 10])
    ids = []
    for r in range(2):
        with pytest.warns(UserWarning, match=r"older generate\(files, num_workers, epoch\) signature"):
            loader, _ = create_dataloader(
                str(paths[0].parent),
                split_strategy=OldWholeFiles(),
                num_workers=2,
                num_ranks=2,
                rank=r,
                batch_size=8,
            )
        rank_ids = epoch_ids(loader)
        assert 0 < len(rank_ids) < 100, "each rank reads a share, never the whole dataset"
        ids += rank_ids
    assert_exactly_once(ids, range(100))


def test_custom_strategy_overlapping_ranks_is_rejected_at_construction(write_parquet: WriteParquet) -> None:
    paths = write_parquet([40, 30])
    with pytest.raises(OverlappingChunksError, match="across 2 ranks"):
        create_dataloader(str(paths[0].parent), split_strategy=EveryRankEverything(), num_ranks=2, rank=0)


# -- the dataset object ----------------------------------------------------------------------


def test_dataset_without_dataloader(write_parquet: WriteParquet) -> None:
    paths = write_parquet([30, 20], row_group_size=10)
    dataset = StructuredDataset(str(paths[0].parent), batch_size=15, num_ranks=1, rank=0)
    assert [len(b["id"]) for b in dataset] == [15, 15, 15, 5]
    assert dataset.plan(0).num_workers == 1
    assert dataset.epoch == 0
    dataset.set_epoch(4)
    assert dataset.epoch == 4


def test_plan_matches_what_workers_read(write_parquet: WriteParquet) -> None:
    paths = write_parquet([90, 45, 70], row_group_size=15)
    loader, dataset = create_dataloader(
        str(paths[0].parent), num_workers=2, split_rows=30, shuffle=True, batch_size=1000, num_ranks=2, rank=1
    )
    dataset.set_epoch(2)
    plan = dataset.plan()
    assert plan.epoch == 2
    planned = [plan.rows_for(1, w) for w in range(2)]
    got = sorted(len(b["id"]) for b in loader)
    assert got == sorted(p for p in planned if p)
