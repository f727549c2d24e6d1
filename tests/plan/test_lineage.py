"""Lineage from the plan alone: a piece's emission order, a worker's batches, the loop's step order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import cut_pieces, piece_rows
from torch_dataloader_utils.plan.lineage import Delivery, WorkerStream, emission, positions_of, stream_rows
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo


@given(cut_pieces())
def test_emission_is_the_order_reading_the_piece_yields(case: tuple[Piece, dict[str, FileInfo]]) -> None:
    piece, files = case
    chunk, offsets = emission(piece)
    rows = stream_rows(chunk, offsets, piece, files)
    got = [(piece.chunks[c].path, int(r)) for c, r in zip(chunk.tolist(), rows.tolist(), strict=True)]
    assert got == [(path, row) for path, row, _ in piece_rows(piece, files)]


@given(cut_pieces(), st.data())
def test_emission_of_a_range_is_that_slice_of_the_whole_order(
    case: tuple[Piece, dict[str, FileInfo]], data: st.DataObject
) -> None:
    piece, _ = case
    total = sum(c.num_rows or 0 for c in piece.chunks)
    whole_chunk, whole_offsets = emission(piece, 0, total)
    lo = data.draw(st.integers(0, total))
    hi = data.draw(st.integers(lo, total))
    chunk, offsets = emission(piece, lo, hi)
    assert chunk.tolist() == whole_chunk[lo:hi].tolist()
    assert offsets.tolist() == whole_offsets[lo:hi].tolist()


@given(cut_pieces())
def test_positions_of_inverts_emission(case: tuple[Piece, dict[str, FileInfo]]) -> None:
    piece, _ = case
    total = sum(c.num_rows or 0 for c in piece.chunks)
    chunk, offsets = emission(piece, 0, total)
    for c in range(len(piece.chunks)):
        mine = chunk == c
        assert positions_of(piece, c, offsets[mine]).tolist() == np.flatnonzero(mine).tolist()


def test_emission_needs_counted_rows() -> None:
    chunk = Chunk("a.csv", 0, 100, ChunkUnit.BYTES, None, 100)
    with pytest.raises(ValueError, match="not counted"):
        emission(Piece.file(chunk))


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[int], int, bool, list[tuple[int, int]]]:
    """Piece row counts, a batch size, drop_last and removed runs of the planned stream."""
    rows = draw(st.lists(st.integers(0, 40), min_size=1, max_size=6))
    total = sum(rows)
    runs: list[tuple[int, int]] = []
    at = 0
    while at < total and draw(st.booleans()):
        start = draw(st.integers(at, total - 1))
        n = draw(st.integers(1, total - start))
        runs.append((start, n))
        at = start + n + 1
    return rows, draw(st.integers(1, 17)), draw(st.booleans()), runs


@given(streams())
def test_worker_batches_are_its_kept_rows_cut_by_batch_size(
    case: tuple[list[int], int, bool, list[tuple[int, int]]],
) -> None:
    rows, batch_size, drop_last, runs = case
    pieces = [Piece.file(Chunk(f"f{i}", 0, n, ChunkUnit.ROWS, n, n)) for i, n in enumerate(rows)]
    stream = WorkerStream(pieces, batch_size, drop_last, runs)
    # The reference: every planned row as (piece, offset), the removed runs taken out, cut.
    planned = [(p, o) for p, n in enumerate(rows) for o in range(n)]
    removed = {a + k for a, n in runs for k in range(n)}
    kept = [row for i, row in enumerate(planned) if i not in removed]
    batches = [kept[i : i + batch_size] for i in range(0, len(kept), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    assert stream.num_batches == len(batches)
    for index, expected in enumerate(batches):
        got = [(s.piece, o) for s in stream.batch(index) for o in range(s.lo, s.hi)]
        assert got == expected
        for position, (p, o) in enumerate(expected):
            assert stream.position(p, o) == index * batch_size + position
    for i in removed:
        assert stream.position(*planned[i]) is None
    with pytest.raises(IndexError):
        stream.batch(len(batches))


def reference_order(batches: list[int], cap: int) -> list[tuple[int, int]]:
    """Groups of 1, 2, 4, ... batches (at most ``cap``) per worker, one group of each worker in turn."""
    groups: list[list[list[int]]] = []
    for count in batches:
        mine, size, at = [], 1, 0
        while at < count:
            mine.append(list(range(at, min(count, at + size))))
            at += size
            size = min(2 * size, cap)
        groups.append(mine)
    out = []
    for r in range(max((len(g) for g in groups), default=0)):
        for w, mine in enumerate(groups):
            if r < len(mine):
                out.extend((w, k) for k in mine[r])
    return out


@given(st.lists(st.integers(0, 300), min_size=2, max_size=5), st.integers(1, 64))
def test_delivery_follows_the_groups_round_robin(batches: list[int], cap: int) -> None:
    delivery = Delivery(batches, cap)
    expected = reference_order(batches, cap)
    assert delivery.total == len(expected)
    for step, (worker, index) in enumerate(expected):
        assert delivery.locate(step) == (worker, index)
        assert delivery.step_of(worker, index) == step
    with pytest.raises(IndexError):
        delivery.locate(len(expected))


def test_one_reading_process_delivers_its_batches_in_order() -> None:
    delivery = Delivery([7], None)
    assert [delivery.locate(s) for s in range(7)] == [(0, s) for s in range(7)]
    with pytest.raises(ValueError, match="group cap"):
        Delivery([3, 4], None)
