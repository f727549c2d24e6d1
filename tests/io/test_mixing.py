"""Reading mixes: the rows read are exactly the planned order, also when continued mid-mix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.data import write_parquet_files
from tests.strategies import piece_rows
from torch_dataloader_utils.config import FileFormat, FileSourceConfig
from torch_dataloader_utils.discovery import discover
from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.io import parquet
from torch_dataloader_utils.io.helpers import Helpers, helpers
from torch_dataloader_utils.io.pieces import Gather, gathered, piece_reads, read_piece
from torch_dataloader_utils.plan.mixing import RowMixing
from torch_dataloader_utils.plan.pieces import advance, as_pieces, cut_piece, mix_pieces
from torch_dataloader_utils.plan.splits import RowGroupSplit
from torch_dataloader_utils.runtime.readers import make_reader

ROWS = [130, 7, 260, 0, 91]
HELPERS = Helpers(3)


def _setup(root: Path):
    write_parquet_files(root, ROWS, row_group_size=[20, 3, 50, 1, 13], with_strings=True)
    found = discover(str(root), FileSourceConfig(format=FileFormat.PARQUET))
    starts = {}
    total = 0
    for f, n in zip(sorted(found.files, key=lambda f: f.path), ROWS, strict=True):
        starts[f.path] = total
        total += n
    return found, starts


def _ids(batches) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


@settings(max_examples=25)
@given(
    rows=st.integers(1, 200),
    streams=st.integers(1, 6),
    split=st.integers(10, 120),
    seed=st.integers(0, 3),
    data=st.data(),
)
def test_read_mix_is_the_planned_order(tmp_path_factory, rows, streams, split, seed, data):
    root = tmp_path_factory.mktemp("mix")
    found, starts = _setup(root)
    files = {f.path: f for f in found.files}
    reader = make_reader(found, batch_size=16)
    chunks = RowGroupSplit(split_rows=split).split(list(found.files))
    pieces = mix_pieces(as_pieces(chunks), RowMixing(rows, streams), (seed, 1, 0), files)
    everything = _ids(b for p in pieces for b in gathered(read_piece(reader, p, files=files)))
    assert sorted(everything) == list(range(sum(ROWS)))
    for piece in pieces:
        planned = [starts[path] + r for path, r, _ in piece_rows(piece, files)]
        assert _ids(gathered(read_piece(reader, piece, batch_size=16, files=files))) == planned
        # Streams decoded ahead and rounds gathered on helper threads: the same order.
        assert _ids(gathered(read_piece(reader, piece, files=files, helpers=HELPERS))) == planned
        smaller = gathered(read_piece(reader, piece, files=files, mix_read_rows=20))  # smaller decodes
        assert _ids(smaller) == planned
        # Continued after k rows (resume), and cut into a head and a tail (equal batches).
        k = data.draw(st.integers(0, len(planned)))
        rest = advance(piece, k, files, True)
        for given_files in (files, None):  # round jump with exact counts, else skip
            got = [] if rest is None else _ids(gathered(read_piece(reader, rest, files=given_files)))
            assert got == planned[k:]
        if 0 < k < len(planned):
            head, tail = cut_piece(piece, k, files, True)
            assert _ids(gathered(read_piece(reader, head, files=files))) == planned[:k]
            assert _ids(gathered(read_piece(reader, tail, files=files))) == planned[k:]
            # Read-ahead is told the chunks a continued mix opens: the cut streams only.
            opened = piece_reads(tail, files)
            assert sum(c.num_rows or 0 for c in opened) <= sum(c.num_rows or 0 for c in piece.chunks)


def test_padding_flag_follows_each_stream(tmp_path):
    found, starts = _setup(tmp_path)
    files = {f.path: f for f in found.files}
    reader = make_reader(found, batch_size=16)
    chunks = RowGroupSplit(split_rows=60).split(list(found.files))
    padded = [replace(c, padding=i % 2 == 1) for i, c in enumerate(chunks)]
    [piece] = mix_pieces(as_pieces(padded[:4]), RowMixing(32, 4), (0, 0), files)
    planned = piece_rows(piece, files)
    got = [
        (i, flag)
        for b in gathered(read_piece(reader, piece, flag_column="_is_padding", files=files))
        for i, flag in zip(b.column("id").to_pylist(), b.column("_is_padding").to_pylist(), strict=True)
    ]
    assert got == [(starts[p] + r, pad) for p, r, pad in planned]
    assert {flag for _, flag in got} == {True, False}


def test_a_gather_is_done_once_by_whichever_thread_comes_first() -> None:
    table = pa.table({"id": pa.array(range(10), pa.int64())})
    order = np.array([3, 1, 4, 0, 9, 2, 6, 5, 8, 7], dtype=np.int64)
    expected = [4, 0, 9, 2, 6, 5, 8, 7, 3, 1]  # spans (2, 8) then (0, 2)
    lazy = Gather(table, order, ((2, 8), (0, 2)), max_rows=3)
    assert [i for b in lazy.batches() for i in b.column(0).to_pylist()] == expected
    early = Gather(table, order, ((2, 8), (0, 2)), max_rows=3)
    assert early.prepare() is True  # gathered now (the read-ahead thread, waiting)
    assert early.prepare() is False  # done already
    batches = list(early.batches())
    assert [b.num_rows for b in batches] == [3, 3, 2, 2]
    assert [i for b in batches for i in b.column(0).to_pylist()] == expected
    with pytest.raises(RuntimeError, match="taken twice"):
        list(early.batches())


@pytest.mark.parametrize("bad", [10, -1])
def test_a_gather_outside_the_rows_read_raises_instead_of_reading_memory(bad: int) -> None:
    # Arrow's per-column bounds check is off (it measured a third of the gather's
    # time); the positions are checked once, in numpy, instead.
    table = pa.table({"id": pa.array(range(10), pa.int64()), "x": pa.array([0.5] * 10)})
    order = np.array([3, 1, bad, 0], dtype=np.int64)
    with pytest.raises(IndexError, match=r"gather positions outside 0\.\.9"):
        list(Gather(table, order, ((0, 4),)).batches())


def test_helpers_are_per_process_and_sized_by_spare_cpus() -> None:
    assert helpers(0) is None
    assert helpers(-3) is None
    assert helpers(2) is helpers(2)
    assert helpers(100) is helpers(8)  # at most one per stream of the default mixing
    with pytest.raises(ValueError, match="threads must be >= 1"):
        Helpers(0)


def test_a_stream_decoded_on_a_helper_raises_its_error_where_it_is_needed(tmp_path):
    found, _ = _setup(tmp_path)
    files = {f.path: f for f in found.files}
    reader = make_reader(found, batch_size=16)
    chunks = RowGroupSplit(split_rows=40).split(list(found.files))
    (piece, *_) = mix_pieces(as_pieces(chunks), RowMixing(30, 4), (0, 0, 0), files)
    planned = _ids(gathered(read_piece(reader, piece, files=files)))
    bad = piece.chunks[2].path
    Path(bad).write_bytes(Path(bad).read_bytes()[:40])  # truncated since it was planned
    got: list[int] = []

    def read_all() -> None:
        for batch in gathered(read_piece(reader, piece, files=files, helpers=HELPERS)):
            got.extend(batch.column("id").to_pylist())

    with pytest.raises(ReadError, match=Path(bad).name):
        read_all()
    assert got == planned[: len(got)]


def test_stopping_a_mix_early_waits_for_its_helpers(tmp_path):
    found, _ = _setup(tmp_path)
    files = {f.path: f for f in found.files}
    reader = make_reader(found, batch_size=16)
    chunks = RowGroupSplit(split_rows=20).split(list(found.files))
    pieces = mix_pieces(as_pieces(chunks), RowMixing(12, 8), (1, 0, 0), files)
    for _ in range(20):  # stop after the first round, while the next decodes are in flight
        items = read_piece(reader, pieces[0], files=files, helpers=HELPERS)
        next(gathered(items))
        items.close()  # no "generator already executing" from a stream a helper still runs


def test_streams_of_one_file_decode_side_by_side(tmp_path, monkeypatch):
    # Eight streams of one local file, each decoded on a helper with Arrow's threads on:
    # pyarrow's ParquetFile is not safe to read from two threads at once (8 threads
    # iterating one ParquetFile crashed the interpreter here), so each stream reads through
    # a file reader of its own (ParquetReader.for_threads). The race is not deterministic:
    # this test checks the rows; the reader's own files are checked below.
    write_parquet_files(tmp_path, [40_000], row_group_size=200, with_strings=True)
    found = discover(str(tmp_path), FileSourceConfig(format=FileFormat.PARQUET))
    files = {f.path: f for f in found.files}
    monkeypatch.setattr(parquet, "READ_BATCH_ROWS", 16)  # many small decodes, side by side
    reader = make_reader(found, batch_size=16)
    chunks = RowGroupSplit(split_rows=5000).split(list(found.files))
    [piece] = mix_pieces(as_pieces(chunks), RowMixing(64, 8), (0, 0, 0), files)
    assert len({c.path for c in piece.chunks}) == 1 < len(piece.chunks) == 8
    planned = [r for _, r, _ in piece_rows(piece, files)]
    for _ in range(3):
        got = gathered(read_piece(reader, piece, files=files, helpers=Helpers(8), mix_read_rows=16))
        assert _ids(got) == planned


def test_a_reader_for_threads_reads_each_chunk_through_a_file_of_its_own(tmp_path, monkeypatch):
    found, starts = _setup(tmp_path)
    reader = make_reader(found, batch_size=16)
    chunk = RowGroupSplit(split_rows=60).split(list(found.files))[0]
    expected = list(range(starts[chunk.path] + chunk.start, starts[chunk.path] + chunk.stop))
    opened: list[object] = []
    footers: list[bool] = []  # whether each was opened with the footer already read
    real = parquet.pq.ParquetFile

    def recording(*args, **kwargs):
        opened.append(real(*args, **kwargs))
        footers.append(kwargs.get("metadata") is not None)
        return opened[-1]

    monkeypatch.setattr(parquet.pq, "ParquetFile", recording)
    own = reader.for_threads()
    assert own is not reader
    assert reader.decodes_in_threads
    first, second = own.read(chunk), own.read(chunk)
    head = next(first)
    assert _ids([head]) == _ids([next(second)])  # both reading at once
    assert len(opened) == 3  # the cached file (its footer), then one reader per read
    assert opened[1] is not opened[2]
    assert footers == [False, True, True]
    assert _ids([head, *first]) == expected
    second.close()
    assert _ids(reader.read(chunk)) == expected
    assert len(opened) == 3  # the plain reader reads through the cached file
