"""The weighted blend: every prefix within a row of its share, windows within 2, passes that end right."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies_recipes import float_weights, int_weights
from torch_dataloader_utils.plan.blend import (
    MAX_PERIOD,
    Blend,
    advance,
    apportion,
    integer_weights,
    plan_pass,
)


@given(int_weights)
def test_every_prefix_of_the_cycle_is_within_one_row_of_its_share(weights: list[int]) -> None:
    blend = Blend(weights)
    n = np.arange(1, blend.period + 1)
    k = len(weights)
    bound = 1 - 1 / (2 * k - 2) if k > 1 else 0
    for s, w in enumerate(weights):
        counts = np.cumsum(blend.sequence == s)
        assert counts[-1] == w
        assert np.abs(counts - n * w / blend.period).max() <= bound + 1e-9


@given(int_weights, st.integers(1, 300), st.integers(0, 10_000), st.integers(1, 120))
def test_any_window_of_batches_is_within_two_rows_of_its_share(
    weights: list[int], batch_size: int, phase: int, window: int
) -> None:
    blend = Blend(weights)
    for first in (0, 3, 17):
        lo = phase + first * batch_size
        rows = blend.between(lo, lo + window * batch_size)
        exact = window * batch_size * np.asarray(weights) / blend.period
        assert rows.sum() == window * batch_size
        assert np.abs(rows - exact).max() < 2


@given(int_weights, st.integers(0, 5000), st.integers(0, 5000))
def test_count_is_additive_over_laps(weights: list[int], a: int, b: int) -> None:
    blend = Blend(weights)
    lo, hi = min(a, b), max(a, b) + 3 * blend.period
    assert (blend.between(lo, hi) == blend.count(hi) - blend.count(lo)).all()
    assert (blend.count(lo + blend.period) - blend.count(lo) == np.asarray(weights)).all()


@given(float_weights)
def test_integer_weights_keep_the_proportions(weights: list[float]) -> None:
    ints = integer_weights(weights)
    assert len(ints) == len(weights)
    assert min(ints) >= 1
    assert sum(ints) <= MAX_PERIOD
    shares = np.asarray(ints) / sum(ints)
    wanted = np.asarray(weights) / sum(weights)
    # Fractions with denominators up to 1000, then (rarely) a cycle of at most MAX_PERIOD.
    assert np.abs(shares - wanted).max() < 2e-3 + 1 / MAX_PERIOD * len(weights) * 2


def test_integer_weights_of_common_forms() -> None:
    assert integer_weights([50, 30, 15, 5]) == (10, 6, 3, 1)
    assert integer_weights([0.5, 0.3, 0.15, 0.05]) == (10, 6, 3, 1)
    assert integer_weights([1 / 3, 2 / 3]) == (1, 2)
    assert integer_weights([7]) == (1,)


@pytest.mark.parametrize("bad", [[], [0.0], [-1], [float("nan")], [float("inf")], [True]])
def test_integer_weights_reject_what_is_not_a_weight(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="weight"):
        integer_weights(bad)


@given(st.integers(0, 500), st.lists(st.integers(0, 9), min_size=1, max_size=6))
def test_apportion_adds_up_and_follows_the_weights(total: int, weights: list[int]) -> None:
    if sum(weights) == 0:
        with pytest.raises(ValueError, match="more than 0"):
            apportion(total, weights)
        return
    shares = apportion(total, weights)
    assert sum(shares) == total
    for share, w in zip(shares, weights, strict=True):
        assert abs(share - total * w / sum(weights)) < 1


@given(
    int_weights,
    st.integers(1, 64),
    st.integers(0, 1000),
    st.data(),
    st.booleans(),
)
def test_a_pass_takes_full_batches_until_a_limited_source_runs_out(
    weights: list[int], batch_size: int, phase: int, data: st.DataObject, drop_last: bool
) -> None:
    blend = Blend(weights)
    limits = data.draw(
        st.lists(st.none() | st.integers(1, 2000), min_size=len(weights), max_size=len(weights)).filter(
            lambda ls: any(n is not None for n in ls)
        )
    )
    plan = plan_pass(blend, batch_size, phase, limits, drop_last)
    counts = [plan.counts(t) for t in range(plan.last + 1)]
    total = np.sum(counts, axis=0)
    assert (total == plan.taken).all()
    for s, n in enumerate(limits):
        if n is not None:
            assert total[s] <= n  # a limited source never gives more than it has
    assert any(n is not None and total[s] == n for s, n in enumerate(limits))  # one ran out
    for t, c in enumerate(counts):
        if t < plan.last:
            assert c.sum() == batch_size  # every batch but the last is full and on schedule
            assert (c == blend.between(phase + t * batch_size, phase + (t + 1) * batch_size)).all()
    # The last batch is full unless every source that could fill it ran out.
    if counts[-1].sum() < batch_size:
        assert all(n is not None and total[s] == n for s, n in enumerate(limits))
        assert plan.batches == (plan.last if drop_last else plan.last + 1)
    else:
        assert plan.batches == plan.last + 1
    for t in range(plan.batches + 1):
        done = plan.consumed(t)
        expected = total if t >= plan.batches else np.sum(counts[:t], axis=0)
        assert (done == expected).all()


def test_plan_pass_rejects_a_pass_without_end() -> None:
    with pytest.raises(ValueError, match="limit"):
        plan_pass(Blend([1, 1]), 8, 0, [None, None])
    with pytest.raises(ValueError, match="limit"):
        plan_pass(Blend([1, 1]), 8, 0, [0, None])


@given(st.lists(st.integers(1, 50), max_size=4), st.integers(1, 50), st.integers(0, 200), st.integers(0, 500))
def test_advance_walks_partial_then_whole_epochs(
    lengths: list[int], fresh: int, skip: int, rows: int
) -> None:
    lengths = [max(n, 1) for n in lengths]
    skip = min(skip, lengths[0] - 1) if lengths else min(skip, fresh - 1)
    done, whole, at = advance(lengths, fresh, skip, rows)
    stream = [*lengths, *[fresh] * (whole + 2)]
    consumed = sum(stream[: done + whole]) + at
    assert consumed == skip + rows
    head = lengths[done] if done < len(lengths) else fresh
    assert 0 <= at < head
    assert whole == 0 or done == len(lengths)
