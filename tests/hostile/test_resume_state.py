"""Hostile cases 9 and 11: resume states are validated against a schema before anything runs.

A hand-edited state that was type-valid (a cursor ``[true, true]``, ``epoch: true``,
``done: "yes"``, a duplicated segment) was accepted and re-read or skipped rows; one
claiming ``num_workers=10**9`` grew the process to 24 GB. Now every state is either read
exactly or refused with :class:`ResumeStateError` (:class:`StateMismatchError` for other
data), before anything is planned or allocated, and a refused state changes nothing.
"""

from __future__ import annotations

import copy
import json
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.fixtures.data import write_parquet_files
from tests.strategies import piece_rows
from torch_dataloader_utils import ResumeStateError, StateMismatchError, StructuredDataset, merge_states

ROWS = [130, 70, 100]
TOTAL = sum(ROWS)
OPTIONS: dict[str, Any] = {"batch_size": 16, "split_rows": 40, "shuffle": True, "shuffle_seed": 3}
LOAD_BYTES = 32 * 1024**2
"""Most memory (traced by tracemalloc) a load of any state may allocate."""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("resume-hostile") / "data"
    write_parquet_files(path, ROWS, row_group_size=20, with_strings=False)
    return str(path)


def _ids(batches: Iterator[Any]) -> list[int]:
    return [i for b in batches for i in b["id"].tolist()]


def _consume(dataset: StructuredDataset, batches: int) -> list[int]:
    seen: list[int] = []
    for n, batch in enumerate(dataset, start=1):
        seen.extend(batch["id"].tolist())
        if n == batches:
            break
    return seen


@pytest.fixture(scope="module")
def states(root: str) -> dict[str, dict[str, Any]]:
    """Valid states of epoch 1: one rank, two merged ranks, and one resumed twice."""
    one = StructuredDataset(root, **OPTIONS)
    one.set_epoch(1)
    _consume(one, 4)
    two = []
    for rank in range(2):
        ds = StructuredDataset(root, num_ranks=2, rank=rank, **OPTIONS)
        ds.set_epoch(1)
        _consume(ds, 2 + rank)
        two.append(ds.state_dict())
    again = StructuredDataset(root, **OPTIONS)
    again.load_state_dict(one.state_dict())
    _consume(again, 3)
    return {
        "one_rank": json.loads(json.dumps(one.state_dict())),
        "two_ranks": json.loads(json.dumps(merge_states(two))),
        "resumed_twice": json.loads(json.dumps(again.state_dict())),
    }


@pytest.fixture(scope="module")
def dataset(root: str) -> StructuredDataset:
    return StructuredDataset(root, **OPTIONS)


def _expected_rest(dataset: StructuredDataset, state: dict[str, Any]) -> list[int]:
    """The ids the state leaves to read, from the pure plan (not from reading)."""
    first_id, start = {}, 0
    for info, n in zip(dataset.files, ROWS, strict=True):
        first_id[info.path] = start
        start += n
    files = {f.path: f for f in dataset.files}
    pieces = dataset._planned.pieces(state["epoch"], 1, state["segments"])
    return sorted(
        first_id[p] + r for worker in pieces for piece in worker for p, r, _ in piece_rows(piece, files)
    )


def _load_traced(dataset: StructuredDataset, state: object) -> int:
    """Load ``state``; returns the peak of memory traced during the load."""
    tracemalloc.start()
    try:
        dataset.load_state_dict(state)  # type: ignore[arg-type]
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < LOAD_BYTES, f"loading a resume state allocated {peak} bytes"
    return peak


def test_valid_states_resume_exactly(root: str, states: dict[str, dict[str, Any]]) -> None:
    one = StructuredDataset(root, **OPTIONS)
    one.set_epoch(1)
    consumed = _consume(one, 4)
    again = StructuredDataset(root, **OPTIONS)
    _load_traced(again, states["one_rank"])
    assert Counter(consumed + _ids(iter(again))) == Counter(range(TOTAL))
    for state in states.values():
        ds = StructuredDataset(root, **OPTIONS)
        _load_traced(ds, state)
        rest = _ids(iter(ds))
        assert sorted(rest) == _expected_rest(ds, state)
        assert len(set(rest)) == len(rest)


# -- case 9: type-valid hand edits -----------------------------------------------------------


def _edit(state: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    edited = copy.deepcopy(state)
    change(edited)
    return edited


def _cursor(state: dict[str, Any], value: object) -> None:
    state["segments"][0]["ranks"]["0"]["cursors"][0] = value


CASE_9 = {
    "cursor_of_booleans": (lambda s: _cursor(s, [True, True]), r"cursors\[0\]\[0\] must be an int"),
    "epoch_true": (lambda s: s.__setitem__("epoch", True), r"state\.epoch must be an int"),
    "done_yes": (
        lambda s: s["segments"][0]["ranks"]["0"].__setitem__("done", "yes"),
        r"\.done must be true or false, got 'yes'",
    ),
    "duplicated_segment": (
        lambda s: s["segments"].append(copy.deepcopy(s["segments"][0])),
        r"segment 2 says it is segment 0: segments are duplicated or out of order",
    ),
    "cursor_of_one_value": (lambda s: _cursor(s, [3]), r"cursors\[0\] must be a list of 2 items"),
    "rank_key_not_canonical": (
        lambda s: s["segments"][0]["ranks"].__setitem__("00", s["segments"][0]["ranks"].pop("0")),
        r"rank written as a plain decimal",
    ),
    "missing_cursors": (
        lambda s: s["segments"][0]["ranks"]["0"].pop("cursors"),
        r"missing \['cursors'\]",
    ),
    "unknown_key": (lambda s: s["segments"][0].__setitem__("cursor", [0, 0]), r"unknown \['cursor'\]"),
    "fingerprint_rows_true": (lambda s: s["fingerprint"].__setitem__("rows", True), r"fingerprint\.rows"),
    "negative_offset": (lambda s: _cursor(s, [0, -1]), r"must be an int in \[0, "),
    "offset_past_the_data": (lambda s: _cursor(s, [0, 10**6]), r"more than the dataset holds \(\d+\)"),
    "left_of_two_counts": (
        lambda s: s["segments"][0]["ranks"]["0"].__setitem__("left", [0, 0]),
        r"num_workers=1 but 2 counts of rows left \(one per worker",
    ),
    "left_past_the_data": (
        lambda s: s["segments"][0]["ranks"]["0"].__setitem__("left", [10**6]),
        r"has 1000000 rows left, more than the dataset holds",
    ),
    "left_of_booleans": (
        lambda s: s["segments"][0]["ranks"]["0"].__setitem__("left", [True]),
        r"\.left\[0\] must be an int",
    ),
    "left_zero_claim": (
        lambda s: s["segments"][0]["ranks"]["0"].__setitem__("left", [0]),
        r"rank 0 worker 0 had 0 rows left in segment 0, but its cursor leaves \d+",
    ),
    "two_file_digests": (
        lambda s: s["fingerprint"].__setitem__("files_sha256", s["fingerprint"]["files_digest"]),
        r"must hold one digest of the files",
    ),
}


@pytest.mark.parametrize("name", list(CASE_9))
def test_case_9_hand_edited_state_is_refused(
    dataset: StructuredDataset, states: dict[str, Any], name: str
) -> None:
    change, words = CASE_9[name]
    base = states["resumed_twice"] if name == "duplicated_segment" else states["one_rank"]
    bad = _edit(base, change)
    before = (dataset.epoch, dataset.state_dict())
    with pytest.raises(ResumeStateError, match=words) as exc:
        _load_traced(dataset, bad)
    assert "loader.state_dict()" in str(exc.value) or "merge" in str(exc.value)
    assert (dataset.epoch, dataset.state_dict()) == before  # a failed load changes nothing


def test_case_9_duplicated_segment_of_the_real_chain_is_refused(
    dataset: StructuredDataset, states: dict[str, Any]
) -> None:
    twice = states["resumed_twice"]
    assert [s["index"] for s in twice["segments"]] == [0, 1]
    swapped = _edit(twice, lambda s: s["segments"].reverse())
    with pytest.raises(ResumeStateError, match="duplicated or out of order"):
        dataset.load_state_dict(swapped)


# -- case 11: sizes bounded before anything is allocated -----------------------------------


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (("num_workers",), 10**9, r"num_workers must be an int in \[1, 1024\], got 1000000000"),
        (("num_workers",), 1000, r"num_workers=1000 but 1 cursors"),
        (("num_ranks",), 10**9, r"num_ranks must be an int in \[1, 65536\]"),
        (("num_ranks",), 60_000, r"holds ranks \[0\] of a 60000-rank job"),
    ],
)
def test_case_11_huge_claims_are_refused_before_allocation(
    dataset: StructuredDataset, states: dict[str, Any], path: tuple[str, ...], value: int, words: str
) -> None:
    def change(s: dict[str, Any]) -> None:
        segment = s["segments"][0]
        target = segment if path == ("num_ranks",) else segment["ranks"]["0"]
        target[path[0]] = value

    with pytest.raises(ResumeStateError, match=words):
        _load_traced(dataset, _edit(states["one_rank"], change))


def test_case_11_many_ranks_with_one_wide_rank_are_refused(
    dataset: StructuredDataset, states: dict[str, Any]
) -> None:
    """A small state (3,071 cursors) whose re-planning would build 2,099,200 slots."""

    def change(s: dict[str, Any]) -> None:
        narrow = {"num_workers": 1, "cursors": [[0, 0]], "done": False}
        wide = {"num_workers": 1024, "cursors": [[0, 0]] * 1024, "done": False}
        ranks = {str(r): narrow for r in range(2047)} | {"2047": wide}
        s["segments"][0] = {"num_ranks": 2048, "ranks": ranks, "index": 0}

    with pytest.raises(ResumeStateError, match=r"would build 2099200 plan slots, more than 1048576"):
        _load_traced(dataset, _edit(states["one_rank"], change))


def test_case_11_state_of_other_data_is_a_mismatch(
    dataset: StructuredDataset, states: dict[str, Any]
) -> None:
    bad = _edit(states["one_rank"], lambda s: s["fingerprint"].__setitem__("rows", TOTAL + 1))
    with pytest.raises(StateMismatchError, match=rf"rows: {TOTAL + 1} in the state, {TOTAL} now"):
        dataset.load_state_dict(bad)


def test_non_json_state_is_refused(dataset: StructuredDataset, states: dict[str, Any]) -> None:
    bad = _edit(states["one_rank"], lambda s: s.__setitem__("epoch", {1, 2}))
    with pytest.raises(ResumeStateError, match="only JSON values"):
        dataset.load_state_dict(bad)


# -- the fuzz test ----------------------------------------------------------------------------

ODD_VALUES = st.sampled_from(
    [
        True,
        False,
        None,
        "yes",
        "0",
        1.5,
        float("nan"),
        -1,
        0,
        1,
        2,
        7,
        10**9,
        2**70,
        [],
        {},
        [True, True],
        [0],
    ]
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.extend(_paths(item, (*prefix, i)))
    return out


def _parent(state: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        state = state[key]
    return state


@st.composite
def mutated_states(draw: st.DrawFn, states: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    state = copy.deepcopy(states[draw(st.sampled_from(sorted(states)))])
    done: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(state) if p]
        path = draw(st.sampled_from(paths))
        parent = _parent(state, path)
        kind = draw(st.sampled_from(["replace", "delete", "extra", "duplicate", "swap", "sibling"]))
        if kind == "replace":
            parent[path[-1]] = copy.deepcopy(draw(ODD_VALUES))
        elif kind == "delete":
            del parent[path[-1]]
        elif kind == "extra" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "cursor", "0", "1"]))] = copy.deepcopy(draw(ODD_VALUES))
        elif kind == "duplicate" and isinstance(parent, list):
            parent.insert(draw(st.integers(0, len(parent))), copy.deepcopy(parent[path[-1]]))
        elif kind == "swap" and isinstance(parent, list) and len(parent) > 1:
            parent.reverse()
        elif kind == "sibling" and isinstance(parent, dict) and len(parent) > 1:
            other = draw(st.sampled_from([k for k in parent if k != path[-1]]))
            parent[path[-1]] = copy.deepcopy(parent[other])
        else:
            continue
        done.append(f"{kind} {list(path)}")
    return state, done


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_resume_state_is_read_exactly_or_refused(
    dataset: StructuredDataset, states: dict[str, dict[str, Any]], data: st.DataObject
) -> None:
    state, mutations = data.draw(mutated_states(states), label="state")
    before = (dataset.epoch, dataset.state_dict())
    try:
        _load_traced(dataset, json.loads(json.dumps(state)))
    except ResumeStateError:  # StateMismatchError and CheckpointMismatchError derive from it
        event("refused")
        assert (dataset.epoch, dataset.state_dict()) == before, mutations
        return
    event("loaded")
    checked = dataset._planned.passes.loaded
    segments = checked.segments if checked is not None else ()
    expected = _expected_rest(dataset, {"epoch": dataset.epoch, "segments": segments})
    rest = sorted(_ids(iter(dataset)))
    assert rest == expected, mutations
    assert len(set(rest)) == len(rest)
    assert set(rest) <= set(range(TOTAL))
