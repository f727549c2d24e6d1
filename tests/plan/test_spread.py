"""plan.spread: the expected files per batch of a reader's pieces (what plan and inspect print)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.spread import FileSpread, piece_files_per_batch
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit


def chunk(path: str, rows: int) -> Chunk:
    return Chunk(path, 0, rows, ChunkUnit.ROWS, rows, rows * 8)


def test_a_chunk_in_file_order_is_one_file() -> None:
    assert piece_files_per_batch(Piece((chunk("a", 1000),)), 64) == 1.0


def test_a_mix_of_two_equal_files() -> None:
    piece = Piece((chunk("a", 500), chunk("b", 500)), key=(0, 0, 0, 0, 0, 0))
    assert piece_files_per_batch(piece, 1) == pytest.approx(1.0)
    assert piece_files_per_batch(piece, 2) == pytest.approx(1.5)  # 1 + P(second from the other)
    assert piece_files_per_batch(piece, 64) == pytest.approx(2.0)
    same = Piece((chunk("a", 500), chunk("a", 500)), key=(0, 0, 0, 0, 0, 0))
    assert piece_files_per_batch(same, 64) == 1.0  # two streams of one file


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=12), st.integers(1, 4096))
def test_between_one_and_the_files_of_the_piece(rows: list[int], batch: int) -> None:
    piece = Piece(tuple(chunk(f"f{i % 5}", n) for i, n in enumerate(rows)), key=(1, 2, 3, 4, 5, 6))
    value = piece_files_per_batch(piece, batch)
    assert 1.0 - 1e-9 <= value <= min(5, len(rows), batch) + 1e-9


def test_spread_weighs_pieces_by_their_batches() -> None:
    spread = FileSpread(100)
    assert spread.mean is None
    mixed = Piece((chunk("a", 1000), chunk("b", 1000)), key=(0,) * 6)  # 20 batches of ~2 files
    spread.add([mixed, Piece((chunk("c", 2000),))])  # 20 batches of 1 file
    assert spread.mean == pytest.approx(1.5, abs=0.01)
