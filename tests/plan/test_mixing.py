"""Row mixing: rounds are permutations, mixes keep every row once, the order is a pure function."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import layouts, live_row_ids, piece_rows
from torch_dataloader_utils.plan.mixing import ROUND_ROWS_FLOOR, MixSchedule, RowMixing, split_streams
from torch_dataloader_utils.plan.pieces import Piece, advance, as_pieces, mix_pieces
from torch_dataloader_utils.plan.splits import RowGroupSplit
from torch_dataloader_utils.plan.types import Chunk, FileInfo, RowGroup

mixings = st.builds(RowMixing, rows=st.integers(1, 120), streams=st.integers(1, 5))


@given(
    weights=st.lists(st.integers(0, 500), min_size=1, max_size=6),
    rows=st.integers(1, 300),
    seed=st.integers(0, 3),
    data=st.data(),
)
def test_every_round_is_a_permutation_of_its_pool(weights, rows, seed, data):
    schedule = MixSchedule(weights, rows, (seed, 0, 1))
    if rows >= len(weights):  # full rounds hold exactly `rows` rows (batches stay aligned)
        assert schedule.size == rows
    assert all(s >= 1 for s in schedule.sections)
    counts = [data.draw(st.integers(0, 3 * int(s) + 2)) for s in schedule.sections]
    emitted = 0
    for index in range(schedule.num_rounds(counts)):
        lengths = schedule.round_lengths(index, counts)
        order = schedule.order(index, lengths)
        assert sorted(order.tolist()) == list(range(int(lengths.sum())))
        assert schedule.round_at(emitted, counts) == (index, emitted)
        emitted += int(lengths.sum())
    assert emitted == sum(counts)
    assert schedule.round_at(emitted, counts)[1] == emitted


@given(files=layouts(), mixing=mixings, seed=st.integers(0, 5), split=st.integers(5, 60))
def test_mixes_hold_every_row_once_and_are_deterministic(files, mixing, seed, split):
    by_path = {f.path: f for f in files}
    chunks = RowGroupSplit(split_rows=split).split(files)
    pieces = mix_pieces(as_pieces(chunks), mixing, (seed, 0), by_path)
    rows = [r for p in pieces for r in piece_rows(p, by_path)]
    assert Counter(rows) == Counter((p, r, False) for p, r in live_row_ids(files))
    assert all(len(p.chunks) <= max(mixing.streams, 1) for p in pieces)
    again = mix_pieces(as_pieces(chunks), mixing, (seed, 0), by_path)
    assert again == pieces
    assert [piece_rows(p, by_path) for p in again] == [piece_rows(p, by_path) for p in pieces]
    # A mix continued at any offset emits exactly the rest of its order.
    for piece in pieces:
        order = piece_rows(piece, by_path)
        for k in {0, len(order) // 3, len(order) - 1}:
            rest = advance(piece, k, by_path, True)
            assert (piece_rows(rest, by_path) if rest else []) == order[k:]


def test_streams_are_cut_at_row_group_edges_only():
    groups = tuple(RowGroup(i, 10 * i, 10, 100) for i in range(8))
    big = FileInfo("big", 808, 80, groups)
    one = FileInfo("one", 108, 10, (RowGroup(0, 0, 10, 100),))
    files = {"big": big, "one": one}
    streams = split_streams([Chunk.rows(one), Chunk.rows(big)], 6, files)
    assert len(streams) == 6
    assert streams[0] == Chunk.rows(one)  # one group: never cut
    assert all(c.start % 10 == 0 and c.stop % 10 == 0 for c in streams)
    assert [(c.start, c.stop) for c in streams[1:]] == [(0, 10), (10, 20), (20, 40), (40, 60), (60, 80)]
    assert sum(c.num_rows or 0 for c in streams) == 90
    # A chunk that starts inside a group is not cut (its first group would be read twice).
    part = Chunk.rows(big, 5, 80)
    assert split_streams([part], 4, files) == [part]


def _order_of(seed: int, epoch: int) -> list[tuple[str, int, bool]]:
    groups = tuple(RowGroup(i, 7 * i, 7, 70) for i in range(9))
    files = {p: FileInfo(p, 640, 63, groups) for p in ("a", "b", "c")}
    chunks = [Chunk.rows(files[p], 7 * s, 7 * s + 21) for p in files for s in (0, 3, 6)]
    pieces = mix_pieces(as_pieces(chunks), RowMixing(rows=16, streams=4), (seed, epoch, 0), files)
    return [r for p in pieces for r in piece_rows(p, files)]


def test_order_is_the_same_in_another_process():
    code = (
        "import json; from tests.plan.test_mixing import _order_of; "
        "print(json.dumps([_order_of(3, 1), _order_of(3, 2)]))"
    )
    root = Path(__file__).resolve().parents[2]  # `tests` imports from the repository root
    # This checkout's sources first, as pytest has them (an installed copy may be another's).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=root, env=env
    )
    here = [_order_of(3, 1), _order_of(3, 2)]
    assert json.loads(out.stdout) == [[list(r) for r in o] for o in here]
    assert here[0] != here[1]  # every epoch mixes differently
    assert sorted(here[0]) == sorted(here[1])


def test_rounds_draw_from_every_stream():
    """A batch of a mix holds rows of all its streams, not a run of one chunk."""
    files = {p: FileInfo(p, 8000, 1000, (RowGroup(0, 0, 1000, 8000),)) for p in "abcd"}
    pieces = mix_pieces(as_pieces([Chunk.rows(f) for f in files.values()]), RowMixing(256, 4), (0, 0), files)
    assert len(pieces) == 1
    rows = piece_rows(pieces[0], files)
    for start in range(0, 4000, 64):  # every batch of 64 rows draws from several files
        assert len({path for path, _, _ in rows[start : start + 64]}) >= 3
    positions = np.array([r for _, r, _ in rows])
    assert np.mean(np.diff(positions) == 1) < 0.05  # neighbours are not consecutive file rows


def test_mixing_parameters_are_checked():
    with pytest.raises(ValueError, match="rows must be >= 1"):
        RowMixing(rows=0)
    with pytest.raises(ValueError, match="streams must be >= 1"):
        RowMixing(streams=0)
    assert mix_pieces([Piece((Chunk("a", 0, 5, num_rows=5),))], None, (0,), {}) == [
        Piece((Chunk("a", 0, 5, num_rows=5),))
    ]


@pytest.mark.parametrize("rows", [10**7, 10**9])
def test_a_round_is_sized_by_the_rows_its_streams_hold(rows):
    """``row_mixing`` far above the data: memory by the rows held, not by the option (issue 28, 17)."""
    import tracemalloc

    weights = [1000, 1200, 800]
    tracemalloc.start()
    try:
        schedule = MixSchedule(weights, rows, (3, 1, 0))
        counts = weights
        order = schedule.order(0, schedule.round_lengths(0, counts))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert schedule.size <= max(sum(weights), ROUND_ROWS_FLOOR)
    assert sorted(order.tolist()) == list(range(sum(weights)))
    assert schedule.num_rounds(counts) == 1
    assert peak < 100 << 20  # at most about 48 bytes per slot of a 2**20-row round
    # An option up to the floor keeps its round (and the order of earlier versions).
    assert MixSchedule(weights, ROUND_ROWS_FLOOR, (3, 1, 0)).size == ROUND_ROWS_FLOOR
    assert MixSchedule(weights, 2 * ROUND_ROWS_FLOOR, (3, 1, 0)).size == ROUND_ROWS_FLOOR


def test_a_capped_round_mixes_as_one_round_of_the_option_would():
    """Above the floor, the whole mix is one round: every row once, every stream drawn from."""
    big = [3 * ROUND_ROWS_FLOOR // 4, ROUND_ROWS_FLOOR // 2]
    schedule = MixSchedule(big, 10**12, (0, 0))
    assert schedule.size == sum(big)
    assert schedule.sections.tolist() == big
    order = schedule.order(0, schedule.round_lengths(0, big))
    assert np.array_equal(np.sort(order), np.arange(sum(big)))
    assert 0.3 < np.mean(order[: 1 << 16] < big[0]) < 0.8  # the first rows mix both streams
