"""The rows a piece emits, from the plan alone, against the reference that walks its order."""

from __future__ import annotations

from hypothesis import given

from tests.strategies import cut_pieces, piece_rows
from torch_dataloader_utils.plan.emitted import emitted_rows
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.types import FileInfo


@given(cut_pieces())
def test_emitted_rows_are_the_rows_reading_the_piece_yields(case: tuple[Piece, dict[str, FileInfo]]) -> None:
    piece, files = case
    got = emitted_rows(piece, files)
    assert len(got) == len(piece.chunks)
    flat = sorted((c.path, int(r)) for c, rows in zip(piece.chunks, got, strict=True) for r in rows)
    assert flat == sorted((path, row) for path, row, _ in piece_rows(piece, files))
    for rows in got:
        assert list(rows) == sorted(set(rows.tolist()))
