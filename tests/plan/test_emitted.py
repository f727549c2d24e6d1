"""The rows a piece emits, from the plan alone, against the reference that walks its order."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import layouts, live_row_ids, piece_rows
from torch_dataloader_utils.plan.emitted import emitted_rows
from torch_dataloader_utils.plan.mixing import RowMixing
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.table import FileWithDeletes
from torch_dataloader_utils.plan.types import Chunk, FileInfo


@st.composite
def pieces(draw: st.DrawFn) -> tuple[Piece, dict[str, FileInfo]]:
    """A file-order piece, a window or a mix over chunks of random files (some with deletes).

    Cut to a random ``[lo, hi)``.
    """
    files = {}
    for f in draw(layouts(max_files=4)):
        live = [row for _, row in live_row_ids((f,))]
        if live and draw(st.booleans()):  # deleted positions lie in live row groups only
            deleted = sorted(draw(st.sets(st.sampled_from(live), max_size=len(live))))
            f = FileWithDeletes(
                f.path, f.size, f.num_rows, f.row_groups, deleted=np.asarray(deleted, np.int64)
            )
        files[f.path] = f
    chunks = []
    for f in files.values():
        n = f.num_rows or 0
        cut = draw(st.integers(0, n))
        chunks.extend(Chunk.rows(f, a, b) for a, b in ((0, cut), (cut, n)) if a < b)
    chunks = [c for c in chunks if draw(st.booleans())] or chunks[:1]
    if not chunks:
        chunks = [Chunk.rows(next(iter(files.values())), 0, 0)]
    kind = draw(st.sampled_from(["file", "window", "mix"]))
    key = (draw(st.integers(0, 9)), draw(st.integers(0, 3)), 0, draw(st.integers(0, 2)))
    if kind == "file":
        piece = Piece.file(chunks[0])
    elif kind == "window":
        piece = Piece.window(chunks, key)
    else:
        piece = Piece.mixed(chunks, key, RowMixing(rows=draw(st.integers(1, 40)), streams=len(chunks)))
    total = sum(c.num_rows or 0 for c in piece.chunks)
    lo = draw(st.integers(0, total))
    hi = draw(st.none() | st.integers(lo, total + 3))
    return Piece(piece.chunks, piece.key, lo, hi, piece.mix), files


@given(pieces())
def test_emitted_rows_are_the_rows_reading_the_piece_yields(case: tuple[Piece, dict[str, FileInfo]]) -> None:
    piece, files = case
    got = emitted_rows(piece, files)
    assert len(got) == len(piece.chunks)
    flat = sorted((c.path, int(r)) for c, rows in zip(piece.chunks, got, strict=True) for r in rows)
    assert flat == sorted((path, row) for path, row, _ in piece_rows(piece, files))
    for rows in got:
        assert list(rows) == sorted(set(rows.tolist()))
