"""Resume planning: consumed rows before + rows after = the epoch's rows, exactly once."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.strategies import file_layouts, layouts, live_row_ids, piece_rows
from torch_dataloader_utils.config import EqualBatches
from torch_dataloader_utils.errors import ResumeStateError, StateMismatchError
from torch_dataloader_utils.plan.mixing import RowMixing
from torch_dataloader_utils.plan.pieces import Piece, remaining, window_pieces
from torch_dataloader_utils.plan.planner import Planner, PlanSpec
from torch_dataloader_utils.plan.resume import Resumer, ResumeResult, segment_pieces
from torch_dataloader_utils.plan.splits import FileSplit, RowGroupSplit
from torch_dataloader_utils.plan.state import (
    STATE_FORMAT,
    STATE_VERSION,
    check_state,
    fingerprint,
    merge_states,
)
from torch_dataloader_utils.plan.types import Chunk, FileInfo, RowGroup

STRATEGIES = st.sampled_from([FileSplit(), RowGroupSplit(), RowGroupSplit(split_rows=50)])


@dataclass
class World:
    num_ranks: int
    workers: list[int]

    def of(self, rank: int) -> int:
        return self.workers[rank % len(self.workers)]


worlds = st.builds(World, st.integers(1, 4), st.lists(st.integers(1, 3), min_size=1, max_size=4))


@st.composite
def cursors_for(draw: st.DrawFn, result: ResumeResult) -> dict[str, object]:
    """Random stop points: one cursor per (rank, worker), some ranks done."""
    ranks: dict[str, object] = {}
    for r, workers in enumerate(result.assignments):
        done = draw(st.booleans()) and draw(st.booleans())
        cursors = []
        for pieces in workers:
            i = draw(st.integers(0, len(pieces)))
            n = pieces[i].num_rows if i < len(pieces) else 0
            cursors.append([i, draw(st.integers(0, n or 0))])
        ranks[str(r)] = {"num_workers": len(workers), "cursors": cursors, "done": done}
    return {"num_ranks": len(result.assignments), "ranks": ranks}


def consumed(result: ResumeResult, segment: dict, files: dict[str, FileInfo]) -> list[tuple]:
    out: list[tuple] = []
    for r, workers in enumerate(result.assignments):
        entry = segment["ranks"][str(r)]
        for w, pieces in enumerate(workers):
            i, k = entry["cursors"][w]
            if entry["done"]:
                i, k = len(pieces), 0
            for p in pieces[:i]:
                out.extend(piece_rows(p, files))
            if i < len(pieces):
                out.extend(piece_rows(pieces[i], files)[:k])
    return out


def all_rows(result: ResumeResult, files: dict[str, FileInfo]) -> list[tuple]:
    return [
        row for workers in result.assignments for ps in workers for p in ps for row in piece_rows(p, files)
    ]


def dropped_rows(result: ResumeResult, files: dict[str, FileInfo]) -> list[tuple]:
    return [row for p in result.dropped for row in piece_rows(p, files)]


def check_equal(result: ResumeResult, files, world: World, batch_size: int, policy: EqualBatches) -> None:
    if policy is EqualBatches.OFF or world.num_ranks == 1:
        return
    per_rank = [sum(len(piece_rows(p, files)) for ps in ws for p in ps) for ws in result.assignments]
    assert len(set(per_rank)) == 1
    for workers in result.assignments:
        shorts = [sum(p.num_rows for p in ps) % batch_size for ps in workers]
        assert sum(1 for s in shorts if s) <= 1  # one short batch per rank


@given(
    files=layouts(),
    strategy=STRATEGIES,
    before=worlds,
    middle=worlds,
    after=worlds,
    batch_size=st.integers(1, 20),
    epoch=st.integers(0, 2),
    shuffle=st.booleans(),
    window=st.one_of(st.none(), st.none(), st.integers(1, 120)),
    mixing=st.one_of(st.none(), st.builds(RowMixing, rows=st.integers(1, 120), streams=st.integers(1, 4))),
    policy=st.sampled_from(list(EqualBatches)),
    data=st.data(),
)
def test_resume_reads_every_row_exactly_once(
    files, strategy, before, middle, after, batch_size, epoch, shuffle, window, mixing, policy, data
):
    spec = PlanSpec(
        files=files, strategy=strategy, shuffle=shuffle, seed=7, equal_batches=policy, batch_size=batch_size
    )
    by_path = {f.path: f for f in files}

    def plan(segments, world):
        return segment_pieces(
            spec,
            epoch,
            segments,
            num_ranks=world.num_ranks,
            num_workers=world.of,
            window_rows=window,
            exact=True,
            mixing=mixing,
        )

    first = plan([], before)
    check_equal(first, by_path, before, batch_size, policy)
    seg0 = data.draw(cursors_for(first))
    second = plan([seg0], middle)
    check_equal(second, by_path, middle, batch_size, policy)
    seg1 = data.draw(cursors_for(second))
    third = plan([seg0, seg1], after)
    check_equal(third, by_path, after, batch_size, policy)

    read = consumed(first, seg0, by_path) + consumed(second, seg1, by_path) + all_rows(third, by_path)
    real = Counter((path, row) for path, row, pad in read if not pad)
    dropped = dropped_rows(first, by_path) + dropped_rows(second, by_path) + dropped_rows(third, by_path)
    # Every live row exactly once, except the rows an equal-batches drop left out.
    assert all(n == 1 for n in real.values())
    assert Counter(real) + Counter((p, r) for p, r, _ in dropped) == Counter(live_row_ids(files))
    if policy is EqualBatches.OFF:
        assert not dropped
    else:  # documented drops: fewer than num_ranks rows per (re)plan
        assert len(dropped) <= (before.num_ranks - 1) + (middle.num_ranks - 1) + (after.num_ranks - 1)
    pads = [row for row in read if row[2]]
    if policy is not EqualBatches.PAD:
        assert not pads


@given(files=layouts(), window=st.integers(1, 100), seed=st.integers(0, 5))
def test_windows_keep_rows_and_bound_memory(files, window, seed):
    by_path = {f.path: f for f in files}
    chunks = RowGroupSplit(split_rows=20).split(files)
    pieces = window_pieces([Piece((c,)) for c in chunks], window, (seed, 0))
    assert [c for p in pieces for c in p.chunks] == chunks
    largest = max((c.num_rows for c in chunks), default=0)
    assert all(p.num_rows <= max(window, largest) for p in pieces)
    rows = [r for p in pieces for r in piece_rows(p, by_path)]
    assert Counter(rows) == Counter((p, r, False) for p, r in live_row_ids(files))
    again = window_pieces([Piece((c,)) for c in chunks], window, (seed, 0))
    assert [piece_rows(p, by_path) for p in again] == [piece_rows(p, by_path) for p in pieces]


def test_window_permutation_depends_on_seed_and_epoch():
    f = FileInfo("a", 800, 100, (RowGroup(0, 0, 100, 800),))
    piece = lambda *key: Piece((Chunk.rows(f),), key)  # noqa: E731
    base = piece_rows(piece(1, 0, 0), {"a": f})
    assert base != [("a", i, False) for i in range(100)]
    assert piece_rows(piece(1, 1, 0), {"a": f}) != base
    assert piece_rows(piece(0, 1, 0), {"a": f}) != piece_rows(piece(1, 0, 0), {"a": f})


def test_cursor_past_the_plan_is_an_error():
    f = FileInfo("a", 80, 10)
    with pytest.raises(ResumeStateError, match=r"cursor \[2, 0\] is outside the worker's 1 pieces"):
        remaining([Piece((Chunk.rows(f),))], (2, 0), {"a": f}, True)
    with pytest.raises(ResumeStateError, match="past the 10 rows of piece 0"):
        remaining([Piece((Chunk.rows(f),))], (0, 11), {"a": f}, True)


def _state(fp, epoch=0, segments=None):
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "fingerprint": fp,
        "epoch": epoch,
        "segments": segments or [],
    }


def test_check_state_names_what_changed():
    files = (FileInfo("a", 80, 10), FileInfo("b", 80, 10))
    fp = fingerprint(files, {"batch_size": 4, "columns": None})
    assert check_state(_state(fp), fp)["epoch"] == 0
    grown = fingerprint((FileInfo("a", 80, 10), FileInfo("b", 96, 12)), {"batch_size": 4, "columns": None})
    with pytest.raises(StateMismatchError, match=r"rows: 20 in the state, 22 now; bytes: 160 in the state"):
        check_state(_state(fp), grown)
    touched = fingerprint((FileInfo("a", 80, 10, mtime=5.0), files[1]), {"batch_size": 4, "columns": None})
    with pytest.raises(StateMismatchError, match="paths, sizes or modification times differ"):
        check_state(_state(fp), touched)
    other = fingerprint(files, {"batch_size": 8, "columns": None})
    with pytest.raises(StateMismatchError, match="option batch_size: 4 in the state, 8 now"):
        check_state(_state(fp), other)
    with pytest.raises(ResumeStateError, match="not a torch_dataloader_utils resume state"):
        check_state({"epoch": 1}, fp)
    with pytest.raises(ResumeStateError, match="version 99 is not supported"):
        check_state({**_state(fp), "version": 99}, fp)


def test_merge_states_needs_every_rank_once():
    fp = fingerprint((FileInfo("a", 80, 10),), {})
    seg = lambda r, c: {"num_ranks": 2, "ranks": {str(r): {"num_workers": 1, "cursors": [c]}}}  # noqa: E731
    merged = merge_states([_state(fp, 1, [seg(1, [0, 3])]), _state(fp, 1, [seg(0, [1, 0])])])
    assert merged["segments"][0]["ranks"] == {
        "1": {"num_workers": 1, "cursors": [[0, 3]]},
        "0": {"num_workers": 1, "cursors": [[1, 0]]},
    }
    with pytest.raises(ResumeStateError, match=r"holds ranks \[1\] of a 2-rank job \(missing \[0\]\)"):
        check_state(_state(fp, 1, [seg(1, [0, 3])]), fp)
    with pytest.raises(ResumeStateError, match="different epoch: 1 and 2"):
        merge_states([_state(fp, 1, [seg(0, [0, 0])]), _state(fp, 2, [seg(1, [0, 0])])])
    with pytest.raises(ResumeStateError, match="rank 0 appears twice"):
        merge_states([_state(fp, 1, [seg(0, [0, 0])]), _state(fp, 1, [seg(0, [0, 1])])])
    done = {"num_ranks": 1, "ranks": {"0": {"num_workers": 1, "cursors": [[1, 0]], "done": True}}}
    assert merge_states([_state(fp, 4, [done])]) == _state(fp, 5, [])


def with_left(segment: dict, result: ResumeResult, files: dict[str, FileInfo]) -> dict:
    """The segment as the runtime saves it: with every worker's count of rows left."""
    out = {"num_ranks": segment["num_ranks"], "ranks": {}}
    for r, workers in enumerate(result.assignments):
        entry = dict(segment["ranks"][str(r)])
        if not entry["done"]:
            entry["left"] = [
                sum(p.num_rows for p in remaining(pieces, tuple(c), files, True))
                for pieces, c in zip(workers, entry["cursors"], strict=True)
            ]
        out["ranks"][str(r)] = entry
    return out


@given(
    files=layouts(),
    strategy=STRATEGIES,
    before=worlds,
    middle=worlds,
    after=worlds,
    batch_size=st.integers(1, 20),
    shuffle=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 120)),
    mixing=st.one_of(st.none(), st.builds(RowMixing, rows=st.integers(1, 120), streams=st.integers(1, 4))),
    policy=st.sampled_from(list(EqualBatches)),
    data=st.data(),
)
def test_rows_left_in_the_state_give_the_same_plan_without_planning_other_ranks(
    files, strategy, before, middle, after, batch_size, shuffle, window, mixing, policy, data
):
    """The ``left`` counts a state records replace planning every previous rank."""
    spec = PlanSpec(files, strategy, shuffle=shuffle, seed=3, equal_batches=policy, batch_size=batch_size)
    by_path = {f.path: f for f in files}

    def plan(segments, world):
        return segment_pieces(
            spec,
            1,
            segments,
            num_ranks=world.num_ranks,
            num_workers=world.of,
            window_rows=window,
            exact=True,
            mixing=mixing,
        )

    first = plan([], before)
    seg0 = data.draw(cursors_for(first))
    second = plan([seg0], middle)
    assert plan([with_left(seg0, first, by_path)], middle) == second
    seg1 = data.draw(cursors_for(second))
    third = plan([seg0, seg1], after)
    assert plan([with_left(seg0, first, by_path), with_left(seg1, second, by_path)], after) == third


def test_rows_left_that_disagree_with_the_cursor_are_refused():
    files = (FileInfo("a", 80, 10), FileInfo("b", 80, 10))
    spec = PlanSpec(files, FileSplit(), equal_batches=EqualBatches.DROP, batch_size=2)
    seg = {
        "num_ranks": 1,
        "ranks": {"0": {"num_workers": 1, "cursors": [[0, 3]], "done": False, "left": [5]}},
    }
    with pytest.raises(
        ResumeStateError, match="rank 0 worker 0 had 5 rows left in segment 0, but its cursor leaves 17"
    ):
        segment_pieces(spec, 0, [seg], num_ranks=2, num_workers=lambda r: 1, window_rows=None, exact=True)
    seg["ranks"]["0"]["left"] = [17, 0]
    with pytest.raises(ResumeStateError, match="2 counts of rows left but 1 workers"):
        segment_pieces(spec, 0, [seg], num_ranks=2, num_workers=lambda r: 1, window_rows=None, exact=True)


@given(
    files=file_layouts(),
    before=worlds,
    after=worlds,
    exact=st.booleans(),
    shuffle=st.booleans(),
    data=st.data(),
)
def test_pieces_dealt_whole_when_row_counts_are_unknown(files, before, after, exact, shuffle, data):
    """Text files without counts (or an uncounted filter): pieces are dealt whole."""
    spec = PlanSpec(tuple(files), FileSplit(), shuffle=shuffle, seed=1)

    def plan(segments, world):
        return segment_pieces(
            spec, 0, segments, num_ranks=world.num_ranks, num_workers=world.of, window_rows=None, exact=exact
        )

    first = plan([], before)
    seg0 = data.draw(cursors_for(first))
    second = plan([seg0], after)
    resumer = Resumer(
        Planner(spec), 0, [seg0], num_ranks=1, num_workers=lambda r: 1, window_rows=None, exact=exact
    )
    known = all(f.num_rows is not None or f.size == 0 for f in files)
    assert resumer.ranged == (exact and known)
    if resumer.ranged:
        return
    before_chunks = {c for ws in first.assignments for ps in ws for p in ps for c in p.chunks}
    new = [
        p
        for ws in second.assignments
        for ps in ws
        for p in ps
        if not set(p.chunks) <= before_chunks or not p.whole
    ]
    # Only pieces a cursor stopped inside are cut (once each); the others are dealt whole.
    assert len(new) <= sum(1 for c in seg0["ranks"].values() for cur in c["cursors"] if cur[1])


@settings(max_examples=60)
@given(
    files=layouts(),
    strategy=STRATEGIES,
    before=worlds,
    middle=worlds,
    after=worlds,
    batch_size=st.integers(1, 20),
    shuffle=st.booleans(),
    policy=st.sampled_from(list(EqualBatches)),
    data=st.data(),
)
def test_any_edited_count_of_rows_left_is_refused(
    files, strategy, before, middle, after, batch_size, shuffle, policy, data
):
    """Every ``left`` count is checked by some rank: zero claims, finished ranks, dropped rows."""
    spec = PlanSpec(files, strategy, shuffle=shuffle, seed=5, equal_batches=policy, batch_size=batch_size)
    by_path = {f.path: f for f in files}

    def plan(segments, world):
        return segment_pieces(
            spec, 1, segments, num_ranks=world.num_ranks, num_workers=world.of, window_rows=None, exact=True
        )

    first = plan([], before)
    seg0 = with_left(data.draw(cursors_for(first)), first, by_path)
    second = plan([seg0], middle)
    seg1 = with_left(data.draw(cursors_for(second)), second, by_path)
    segments = [seg0, seg1]
    counts = [
        (s, r, w)
        for s, seg in enumerate(segments)
        for r, entry in seg["ranks"].items()
        for w in range(len(entry.get("left", ())))
    ]
    assume(counts)
    s, r, w = data.draw(st.sampled_from(counts))
    edited = copy.deepcopy(segments)
    true = edited[s]["ranks"][r]["left"][w]
    edited[s]["ranks"][r]["left"][w] = data.draw(st.integers(0, true + 40).filter(lambda n: n != true))
    with pytest.raises(ResumeStateError):  # the count itself, or a cursor it moved out of its pieces
        plan(edited, after)


def test_a_rank_claiming_no_rows_left_is_checked_by_one_rank():
    files = (FileInfo("a", 80, 10), FileInfo("b", 80, 10))
    spec = PlanSpec(files, FileSplit(), equal_batches=EqualBatches.OFF, batch_size=2)
    seg = {
        "num_ranks": 2,
        "ranks": {
            "0": {"num_workers": 1, "cursors": [[0, 3]], "done": False, "left": [7]},
            "1": {"num_workers": 1, "cursors": [[0, 0]], "done": False, "left": [0]},  # really 10
        },
    }

    def resumer():
        return Resumer(
            Planner(spec), 0, [seg], num_ranks=2, num_workers=lambda r: 1, window_rows=None, exact=True
        )

    resumer().rank(0)  # rank 0 of the new world reads rank 0's 7 rows; rank 1 checks rank 1
    with pytest.raises(
        ResumeStateError, match="rank 1 worker 0 had 0 rows left in segment 0, but its cursor leaves 10"
    ):
        resumer().rank(1)


def test_a_state_of_version_1_is_refused_with_what_to_do():
    """Version 2 deals a fresh epoch's dropped and padding rows differently: old cursors cannot resume."""
    fp = fingerprint((FileInfo("a", 80, 10),), {})
    with pytest.raises(
        ResumeStateError, match=r"version 1 was saved by torch-dataloader-utils 0\.5 or earlier"
    ):
        check_state({**_state(fp, 3), "version": 1}, fp)
    with pytest.raises(ResumeStateError, match=r"finish epoch 3 with the version that saved it"):
        check_state({**_state(fp, 3), "version": 1}, fp)
