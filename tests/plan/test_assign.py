"""LPT assignment: every item once, load <= mean + max weight, deterministic ties, order kept."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_dataloader_utils.plan.assign import assign


def _check(weights: list[int], bins: int) -> list[list[int]]:
    """Assign item indices by ``weights`` and check the invariants; return the bins."""
    out = assign(range(len(weights)), bins, weights.__getitem__)
    assert len(out) == bins
    assert sorted(i for b in out for i in b) == list(range(len(weights)))
    for b in out:
        assert b == sorted(b)  # items keep their input order inside a bin
    if weights:
        loads = [sum(weights[i] for i in b) for b in out]
        assert max(loads) <= sum(weights) / bins + max(weights)
    assert assign(range(len(weights)), bins, weights.__getitem__) == out  # deterministic
    return out


@given(st.lists(st.integers(0, 10_000), max_size=60), st.integers(1, 8))
def test_lpt_invariants(weights: list[int], bins: int) -> None:
    _check(weights, bins)


@given(st.lists(st.sampled_from([1, 5, 5, 5, 20]), max_size=40), st.integers(1, 8))
def test_lpt_invariants_with_many_ties(weights: list[int], bins: int) -> None:
    _check(weights, bins)


@given(st.integers(0, 50), st.integers(1, 8), st.integers(1, 100))
def test_equal_weights_are_dealt_round_robin_by_position(n: int, bins: int, w: int) -> None:
    out = _check([w] * n, bins)
    assert out == [list(range(b, n, bins)) for b in range(bins)]


def test_heaviest_first_example() -> None:
    # Heaviest first: 9 -> bin 0, 7 -> bin 1, then 5 and 4 go to the lighter bin each time.
    assert assign(["a", "b", "c", "d"], 2, {"a": 4, "b": 9, "c": 7, "d": 5}.__getitem__) == [
        ["a", "b"],
        ["c", "d"],
    ]


def test_bins_are_returned_even_when_empty() -> None:
    assert assign([], 3, lambda x: 1) == [[], [], []]
    assert assign(["x"], 3, lambda x: 1) == [["x"], [], []]


@pytest.mark.parametrize("bins", [0, -2])
def test_num_bins_must_be_positive(bins: int) -> None:
    with pytest.raises(ValueError, match=rf"num_bins must be >= 1, got {bins}"):
        assign([1], bins, lambda x: x)
