"""Rank slicing ``[rank::num_ranks]``: disjoint shares that cover everything, evenly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import num_ranks
from torch_dataloader_utils.plan.ranks import slice_for_rank


@given(st.integers(0, 100), num_ranks)
def test_shares_are_disjoint_cover_everything_and_are_even(n: int, ranks: int) -> None:
    items = list(range(n))
    shares = [slice_for_rank(items, ranks, r) for r in range(ranks)]
    flat = [i for share in shares for i in share]
    assert sorted(flat) == items  # disjoint and complete
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # lower ranks get the extra item
    for share in shares:
        assert share == sorted(share)  # each share keeps the input order


def test_slice_example() -> None:
    assert slice_for_rank("abcdefg", 3, 1) == ["b", "e"]
    assert slice_for_rank([], 4, 3) == []


@pytest.mark.parametrize(("ranks", "rank"), [(4, 4), (4, -1), (1, 1)])
def test_rank_out_of_range(ranks: int, rank: int) -> None:
    with pytest.raises(ValueError, match=rf"rank must be in \[0, {ranks}\), got {rank}"):
        slice_for_rank([1, 2, 3], ranks, rank)
