"""ParquetReader: exact rows per chunk; pruned row groups and unneeded columns never read."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.fixtures.data import WriteParquet
from tests.fixtures.e2e import (
    TOKEN,
    TokenMemoryFileSystem,
    assert_exactly_once,
    column_chunk_range,
    corrupt,
    epoch_ids,
    upload,
)
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.config import FileFormat, FileSourceConfig
from torch_dataloader_utils.discovery import Discovered, discover
from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.parquet import ParquetReader
from torch_dataloader_utils.io.prefetch import COALESCE_HOLE
from torch_dataloader_utils.plan.types import Chunk
from torch_dataloader_utils.runtime.readers import make_reader


def _reader(found: Discovered, batch_size: int = 1000) -> ParquetReader:
    reader = make_reader(found, batch_size)
    assert isinstance(reader, ParquetReader)
    assert isinstance(reader, ChunkReader)
    return reader


def _ids(reader: ParquetReader, chunk: Chunk) -> list[int]:
    return [i for b in reader.read(chunk) for i in b.column("id").to_pylist()]


def test_whole_and_partial_row_group_chunks(write_parquet: WriteParquet) -> None:
    path = write_parquet([100], row_group_size=30)[0]
    found = discover(str(path), FileSourceConfig(format=FileFormat.PARQUET))
    f = found.files[0]
    reader = _reader(found, batch_size=7)
    assert _ids(reader, Chunk.rows(f)) == list(range(100))
    assert _ids(reader, Chunk.rows(f, 30, 60)) == list(range(30, 60)), "exactly one group"
    assert _ids(reader, Chunk.rows(f, 25, 65)) == list(range(25, 65)), "cut inside two groups"
    assert _ids(reader, Chunk.rows(f, 99, 100)) == [99]
    # The reader reads large pieces (rebatch cuts them to batch_size without copying).
    batches = list(reader.read(Chunk.rows(f, 0, 30)))
    assert sum(b.num_rows for b in batches) == 30


def test_long_rows_are_read_a_few_mib_at_a_time(tmp_path: Path) -> None:
    """Issue 37: 65,536 rows per read made a read of 4 KiB documents 256 MiB (packing held 6x its floor)."""
    from torch_dataloader_utils.io.parquet import READ_BATCH_BYTES, READ_BATCH_ROWS

    rows, tokens = 6000, 1024  # 4 KiB of int32 tokens per row; one row group
    values = pa.array(np.arange(rows * tokens, dtype=np.int32) % 50_000)
    offsets = pa.array(np.arange(0, rows * tokens + 1, tokens, dtype=np.int32))
    table = pa.table({"id": np.arange(rows), "tokens": pa.ListArray.from_arrays(offsets, values)})
    pq.write_table(table, tmp_path / "long.parquet", row_group_size=rows)
    found = discover(str(tmp_path), FileSourceConfig(format=FileFormat.PARQUET))
    f = found.files[0]
    decoded = 4 * tokens + 8  # an int64 id and 1,024 int32 tokens per row
    reads = [b.num_rows for b in _reader(found, batch_size=16).read(Chunk.rows(f))]
    assert sum(reads) == rows
    # About READ_BATCH_BYTES decoded (the lists' levels add a little); 6,000 rows before.
    assert READ_BATCH_BYTES // (1.1 * decoded) <= max(reads) <= READ_BATCH_BYTES // decoded
    reads = [b.num_rows for b in _reader(found, batch_size=3000).read(Chunk.rows(f))]
    assert reads == [3000, 3000]  # never fewer rows than batch_size
    # Short rows keep READ_BATCH_ROWS per read.
    pq.write_table(pa.table({"id": np.arange(70_000)}), tmp_path / "long.parquet", row_group_size=70_000)
    found = discover(str(tmp_path), FileSourceConfig(format=FileFormat.PARQUET))
    reads = [b.num_rows for b in _reader(found, batch_size=16).read(Chunk.rows(found.files[0]))]
    assert max(reads) == READ_BATCH_ROWS


def test_output_is_projected_and_filtered(write_parquet: WriteParquet) -> None:
    path = write_parquet([100], row_group_size=30)[0]
    found = discover(
        str(path),
        FileSourceConfig(format=FileFormat.PARQUET, columns=["x", "id"], filters=pc.field("label") == 3),
    )
    reader = _reader(found)
    batches = list(reader.read(Chunk.rows(found.files[0])))
    assert all(b.schema.names == ["x", "id"] for b in batches)
    ids = [i for b in batches for i in b.column("id").to_pylist()]
    assert ids == [i for i in range(100) if i % 7 == 3]


def test_chunk_of_only_pruned_groups_reads_nothing(write_parquet: WriteParquet) -> None:
    path = write_parquet([100], row_group_size=10)[0]
    found = discover(str(path), FileSourceConfig(format=FileFormat.PARQUET, filters=pc.field("id") < 10))
    f = found.files[0]
    reader = _reader(found)
    assert _ids(reader, Chunk(f.path, 50, 100)) == []
    assert _ids(reader, Chunk(f.path, 0, 100)) == list(range(10))


def test_reader_pickles_without_open_files(write_parquet: WriteParquet) -> None:
    path = write_parquet([20])[0]
    found = discover(str(path), FileSourceConfig(format=FileFormat.PARQUET))
    reader = _reader(found)
    assert _ids(reader, Chunk.rows(found.files[0])) == list(range(20))
    assert reader._open, "a file handle is cached after reading"
    clone = pickle.loads(pickle.dumps(reader))
    assert not clone._open
    assert _ids(clone, Chunk.rows(found.files[0])) == list(range(20))


def test_read_error_names_file_and_rows(write_parquet: WriteParquet) -> None:
    path = write_parquet([100], row_group_size=50)[0]
    found = discover(str(path), FileSourceConfig(format=FileFormat.PARQUET, columns=["id"]))
    corrupt(path, [column_chunk_range(path, 1, "id")])
    reader = _reader(found)
    assert _ids(reader, Chunk.rows(found.files[0], 0, 50)) == list(range(50))
    with pytest.raises(ReadError, match=rf"reading '{path}' rows \[50, 100\) failed"):
        _ids(reader, Chunk.rows(found.files[0], 50, 100))


# -- never reading what is not needed: proven with corrupted bytes ------------------------


def _sorted_file(path: Path, rows: int = 8000, group: int = 1000) -> Path:
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table(
        {
            "id": ids,
            "label": (ids % 5).astype(np.int64),
            "payload": pa.array([f"p{i}" * 20 for i in ids]),
            "extra": ids.astype(np.float64),
        }
    )
    pq.write_table(table, path, row_group_size=group, use_dictionary=False)
    return path


@pytest.mark.filterwarnings("ignore:num_workers=2 but rank 0 has only 1 chunk")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pruned_row_groups_are_never_decoded(tmp_path: Path, num_workers: int) -> None:
    path = _sorted_file(tmp_path / "f.parquet")
    # Groups hold ids [0,1000), [1000,2000), ...; the filter keeps only group 2.
    expr = (pc.field("id") >= 2100) & (pc.field("id") < 2300)
    columns = ["id", "label", "payload", "extra"]
    corrupt(path, [column_chunk_range(path, g, c) for g in (0, 1, 3, 4, 5, 6, 7) for c in columns])
    loader, dataset = create_dataloader(str(path), filters=expr, num_workers=num_workers, batch_size=64)
    assert [g.index for g in dataset.files[0].row_groups or ()] == [2]
    assert_exactly_once(epoch_ids(loader), range(2100, 2300))
    # The corruption is real: without the filter the same read fails.
    unfiltered, _ = create_dataloader(str(path), num_workers=0, batch_size=64)
    with pytest.raises(ReadError, match=r"f\.parquet"):
        epoch_ids(unfiltered)


@pytest.mark.filterwarnings("ignore:num_workers=2 but rank 0 has only 1 chunk")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_unneeded_columns_are_never_decoded(tmp_path: Path, num_workers: int) -> None:
    path = _sorted_file(tmp_path / "f.parquet")
    corrupt(path, [column_chunk_range(path, g, c) for g in range(8) for c in ("payload", "extra")])
    # Output "id", filter on "label" (not in columns): neither corrupted column is needed.
    loader, dataset = create_dataloader(
        str(path), columns=["id"], filters=pc.field("label") == 2, num_workers=num_workers, batch_size=100
    )
    assert dataset.discovered.data_columns == ("id", "label")
    seen = []
    for batch in loader:
        assert list(batch) == ["id"]
        seen.extend(batch["id"].tolist())
    assert_exactly_once(seen, range(2, 8000, 5))
    for bad in ("payload", "extra"):
        loader, _ = create_dataloader(str(path), columns=["id", bad], num_workers=0)
        with pytest.raises(ReadError):
            epoch_ids(loader)


# -- never reading what is not needed: proven with recorded byte ranges -------------------


def _overlaps(reads: list[tuple[str, int, int]], path: str, lo: int, hi: int) -> bool:
    return any(p == path and off < hi and lo < off + n for p, off, n in reads)


def test_requested_byte_ranges_skip_pruned_groups_and_unneeded_columns(
    tmp_path: Path, tokmem: TokenMemoryFileSystem
) -> None:
    # Groups of 10,000 rows: the unneeded columns between two groups' needed ones are wider
    # than the coalescing hole (64 KiB), so they are never read (a narrower gap would be).
    local = _sorted_file(tmp_path / "f.parquet", rows=80_000, group=10_000)
    gap = column_chunk_range(local, 1, "extra")[1] - column_chunk_range(local, 1, "payload")[0]
    assert gap > COALESCE_HOLE
    (remote,) = upload(tokmem, [local], tmp_path, "/bucket/t")
    loader, _ = create_dataloader(
        "tokmem://bucket/t",
        storage_options={"token": TOKEN},
        columns=["id"],
        filters=(pc.field("id") >= 15_000) & (pc.field("label") == 0),
        num_workers=0,
        batch_size=128,
    )
    TokenMemoryFileSystem.reads.clear()
    assert_exactly_once(epoch_ids(loader), range(15_000, 80_000, 5))
    size = tokmem.size(remote)
    # Discovery hands the footer to the reader, so reading never fetches the file's tail
    # again (pyarrow would read up to 64 KiB of it); every read is a column chunk.
    tail = [r for r in TokenMemoryFileSystem.reads if r[1] + r[2] == size]
    reads = [r for r in TokenMemoryFileSystem.reads if r[1] + r[2] != size]
    assert len(tail) <= 1, "the footer is read at most once per opened file"
    assert reads, "the data came through the fsspec filesystem"
    for column in ("id", "label"):
        assert _overlaps(reads, remote, *column_chunk_range(local, 1, column)), f"group 1 {column} is read"
    for group in range(8):
        for column in ("payload", "extra"):
            lo, hi = column_chunk_range(local, group, column)
            assert not _overlaps(reads, remote, lo, hi), f"unneeded column {column} of group {group} read"
    for group in (0,):
        for column in ("id", "label", "payload", "extra"):
            lo, hi = column_chunk_range(local, group, column)
            assert not _overlaps(reads, remote, lo, hi), f"pruned group {group} ({column}) read"
