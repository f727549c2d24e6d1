"""ByteRangeSplit and RecordIndex: pure planning of text files."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_dataloader_utils import ConfigError
from torch_dataloader_utils.plan import ByteRangeSplit, Chunk, ChunkUnit, FileInfo, RecordIndex


@st.composite
def indexed_files(draw: st.DrawFn) -> FileInfo:
    size = draw(st.integers(0, 5000))
    block = draw(st.integers(1, 700))
    n = -(-size // block)
    counts = tuple(draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)))
    indexed = draw(st.booleans())
    return FileInfo(f"f{size}-{block}", size, records=RecordIndex(block, counts) if indexed else None)


@given(files=st.lists(indexed_files(), max_size=4, unique_by=lambda f: f.path), split=st.integers(1, 6000))
def test_ranges_tile_each_file_and_carry_exact_counts(files: list[FileInfo], split: int) -> None:
    chunks = ByteRangeSplit(split).split(files)
    for f in files:
        mine = [c for c in chunks if c.path == f.path]
        assert all(c.unit is ChunkUnit.BYTES for c in mine)
        if f.records is None:
            # a contiguous cover of [0, size), in steps of split_bytes
            expected = [(s, min(f.size, s + split)) for s in range(0, f.size, split)]
            assert [(c.start, c.stop) for c in mine] == expected
            assert all(c.num_rows is None for c in mine)
        else:
            assert sum(c.num_rows or 0 for c in mine) == f.records.total
            assert all(c.num_rows and c.num_rows > 0 for c in mine)
            for c in mine:
                assert c.start % f.records.block_bytes == 0


def test_unsplittable_file_is_one_chunk() -> None:
    f = FileInfo("a.csv.gz", 10_000, splittable=False, records=RecordIndex(10_000, (77,)))
    assert ByteRangeSplit(100).split([f]) == [Chunk("a.csv.gz", 0, 10_000, ChunkUnit.BYTES, 77, 10_000)]


def test_record_index_needs_block_edges() -> None:
    index = RecordIndex(10, (1, 2, 3))
    assert index.records_in(0, 25, 25) == 6
    assert index.records_in(10, 20, 25) == 2
    assert index.records_in(5, 20, 25) is None
    assert Chunk.bytes(FileInfo("x", 25, records=index), 0, 10).num_rows == 1


@pytest.mark.parametrize("bad", [0, -5, True, 1.5, "1MiB"])
def test_bad_split_bytes(bad: object) -> None:
    with pytest.raises(ConfigError, match="split_bytes="):
        ByteRangeSplit(bad)  # type: ignore[arg-type]
