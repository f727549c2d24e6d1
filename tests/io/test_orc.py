"""ORC by stripe: exact stripe row counts from the footer, plans that match the reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils import CorruptFileError, StructuredDataset
from torch_dataloader_utils.discovery.orc import stripes_from_tail


def write_orc(path: Path, first_id: int, stripe_rows: list[int]) -> None:
    """One stripe per entry of ``stripe_rows`` (unequal on purpose)."""
    with orc.ORCWriter(str(path), stripe_size=1, batch_size=1 << 20) as writer:  # a stripe per write
        start = first_id
        for n in stripe_rows:
            ids = np.arange(start, start + n, dtype=np.int64)
            writer.write(pa.table({"id": ids, "x": (ids % 13).astype(np.float64)}))
            start += n


STRIPES = [[500, 5000, 20, 3000], [7000], [1, 2, 4000, 100, 100, 2500]]


@pytest.fixture(scope="module")
def orc_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("orc")
    first = 0
    for i, rows in enumerate(STRIPES):
        write_orc(root / f"part-{i}.orc", first, rows)
        first += sum(rows)
    return root


def test_stripes_are_exact(orc_dir: Path) -> None:
    reader = orc.ORCFile(str(orc_dir / "part-0.orc"))
    stripes = stripes_from_tail(reader.reader.serialized_file_tail())
    assert [s[2] for s in stripes] == STRIPES[0]
    assert [reader.read_stripe(i).num_rows for i in range(reader.nstripes)] == STRIPES[0]
    ds = StructuredDataset(str(orc_dir), format="orc", split_rows=1)
    groups = [[g.num_rows for g in f.row_groups or ()] for f in ds.files]
    assert groups == STRIPES


@settings(max_examples=30)
@given(
    split_rows=st.one_of(st.none(), st.integers(1, 12000)),
    num_ranks=st.integers(1, 3),
    workers=st.integers(1, 4),
    batch_size=st.integers(1, 5000),
    shuffle=st.booleans(),
)
def test_planned_rows_equal_read_rows(
    orc_dir: Path, split_rows: int | None, num_ranks: int, workers: int, batch_size: int, shuffle: bool
) -> None:
    ds = StructuredDataset(
        str(orc_dir),
        format="orc",
        split_rows=split_rows,
        num_ranks=num_ranks,
        rank=0,
        batch_size=batch_size,
        shuffle=shuffle,
        output_format="arrow",
    )
    plan = ds.plan(0, num_workers=workers)
    ids: list[int] = []
    for rank in range(num_ranks):
        for worker in range(workers):
            got = [
                i
                for c in plan.chunks_for(rank, worker)
                for b in ds._reader.read(c)
                for i in b["id"].to_pylist()
            ]
            assert plan.rows_for(rank, worker) == len(got)
            ids += got
    dropped = [i for c in plan.dropped for b in ds._reader.read(c) for i in b["id"].to_pylist()]
    assert len(dropped) < num_ranks  # equal_batches='drop' (the default) leaves out < num_ranks rows
    assert sorted(ids + dropped) == list(range(sum(map(sum, STRIPES))))


def test_batch_size_across_stripe_edges(orc_dir: Path) -> None:
    ds = StructuredDataset(str(orc_dir / "part-0.orc"), format="orc", batch_size=333, output_format="arrow")
    sizes = [b.num_rows for b in ds]
    assert sizes[:-1] == [333] * (len(sizes) - 1)
    assert sum(sizes) == sum(STRIPES[0])


def test_columns_filters_partitions(tmp_path: Path) -> None:
    for key, first in (("a", 0), ("b", 1000)):
        (tmp_path / f"k={key}").mkdir()
        write_orc(tmp_path / f"k={key}" / "f.orc", first, [300, 700])
    import pyarrow.compute as pc

    ds = StructuredDataset(
        str(tmp_path),
        format="orc",
        partitioning="hive",
        columns=["id", "k"],
        filters=(pc.field("k") == "b") & (pc.field("x") == 0.0),
        output_format="arrow",
    )
    table = pa.Table.from_batches(list(ds))
    assert table.schema.names == ["id", "k"]
    assert table.column("id").to_pylist() == [i for i in range(1000, 2000) if i % 13 == 0]
    assert set(table.column("k").to_pylist()) == {"b"}


def test_not_an_orc_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.orc"
    path.write_bytes(b"this is not orc at all" * 10)
    with pytest.raises(CorruptFileError, match=r"ORC footer of .*bad\.orc"):
        StructuredDataset(str(path), format="orc")


def test_stripes_from_garbage_tail() -> None:
    with pytest.raises(ValueError, match=r"footer|truncated|wire"):
        stripes_from_tail(b"\x0a\xff")
