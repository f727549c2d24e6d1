"""Mixture schedules as values: their checks, and where each stage starts in a pass's rounds."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies_recipes import schedule_starts
from torch_dataloader_utils import ConfigError, MixSchedule, ScheduleUnit, Stage
from torch_dataloader_utils.plan.blend import blend_for, plan_pass, plan_staged_pass


def test_a_schedule_is_stages_or_a_function() -> None:
    listed = MixSchedule([(0, [0.6, 0.3, 0.1]), (50_000, [0.4, 0.4, 0.2])])
    assert listed.stages == (Stage(0, (0.6, 0.3, 0.1)), Stage(50_000, (0.4, 0.4, 0.2)))
    assert listed.unit is ScheduleUnit.STEP
    assert listed.num_sources == 3
    assert [listed.index_at(v) for v in (0, 49_999, 50_000, 10**12)] == [0, 0, 1, 1]
    assert listed.fingerprint() == {"unit": "step", "stages": [[0, [6, 3, 1]], [50_000, [2, 2, 1]]]}
    assert MixSchedule([(0, [3, 1])]).fingerprint() == [3, 1]  # fixed weights: as states of 0.7.0 hold
    rows = MixSchedule([Stage(0, (1, 1)), Stage(10**9, (1, 3))], unit="rows")
    assert rows.unit is ScheduleUnit.ROWS
    assert rows.index_at(10**9) == 1
    function = MixSchedule.of(lambda step: [1, 1] if step < 500 else [1, 3], every=100)
    assert function.num_sources is None
    assert function.index_at(450) == 4
    assert [function.weights_of(k, 2) for k in (4, 5)] == [(1, 1), (1, 3)]
    assert function.fingerprint() == {"unit": "step", "every": 100, "function": True}
    assert pickle.loads(pickle.dumps(listed)) == listed


@pytest.mark.parametrize(
    ("stages", "says"),
    [
        ([], "non-empty list of \\(start, weights\\)"),
        ([(5, [1, 1])], "stage 0 starts at 5: the first stage starts at 0"),
        ([(0, [1, 1]), (0, [1, 2])], "stage 1 starts at 0, not after stage 0"),
        ([(0, [1, 1]), (-3, [1, 2])], "stage 1 starts at -3: a start is an int >= 0"),
        ([(0, [1, 1]), (10, [1, 2, 3])], "stage 1 has 3 weight\\(s\\), stage 0 2"),
        ([(0, [1, 0])], "stage 0's weights=\\[1, 0\\]: every weight must be a finite number > 0"),
        ([(0, "ab")], "stage 0's weights='ab' must be a non-empty list"),
        ([[0, [1], 3]], "stage 0=\\[0, \\[1\\], 3\\] must be a pair"),
        ([(0.5, [1])], "stage 0 starts at 0.5"),
    ],
)
def test_a_bad_schedule_is_named(stages: list[object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        MixSchedule(stages)  # type: ignore[arg-type]


def test_bad_units_functions_and_their_values_are_named() -> None:
    with pytest.raises(ConfigError, match=r"unit='tokens' is not a schedule unit; use 'step'.*or 'rows'"):
        MixSchedule([(0, [1])], unit="tokens")
    with pytest.raises(ConfigError, match="every=0 must be an int >= 1"):
        MixSchedule.of(lambda step: [1], every=0)
    bad = MixSchedule.of(lambda step: [1, -1] if step >= 20 else [1, 1], every=10)
    with pytest.raises(ConfigError, match=r"function .*<lambda>\(20\)=\[1, -1\]: every weight must be"):
        list(itertools.islice(bad.rounds(0, 10, 2), 3))
    with pytest.raises(ConfigError, match=r"<lambda>\(0\) gives 2 weight\(s\) for 3 source\(s\)"):
        bad.weights_of(0, 3)


@given(
    starts=schedule_starts,
    base=st.integers(0, 400),
    per_round=st.integers(1, 7),
)
def test_a_stage_starts_at_the_first_round_at_or_after_its_start(
    starts: list[int], base: int, per_round: int
) -> None:
    """Round ``t`` of a pass begins at ``base + t * per_round``: it runs the stage in force there."""
    schedule = MixSchedule([(s, [1 + i, 1]) for i, s in enumerate(starts)])
    items = list(itertools.takewhile(lambda x: x[0] < 200, schedule.rounds(base, per_round, 2)))
    assert items[0][0] == 0
    for (first, stage, weights), nxt in zip(items, [*items[1:], None], strict=True):
        assert weights == schedule.weights_of(stage, 2)
        for t in range(first, 200 if nxt is None else nxt[0]):  # every round of the item runs its stage
            assert schedule.index_at(base + t * per_round) == stage
        if nxt is not None:
            assert nxt[0] > first
            assert nxt[1] > stage


@given(
    weights=st.lists(st.lists(st.integers(1, 9), min_size=3, max_size=3), min_size=1, max_size=4),
    starts=st.lists(st.integers(1, 40), min_size=3, max_size=3),
    batch_size=st.integers(3, 30),
    anchor_rows=st.integers(1, 2_000),
    phases=st.integers(0, 1_000),
)
def test_a_staged_pass_keeps_every_runs_proportions(
    weights: list[list[int]], starts: list[int], batch_size: int, anchor_rows: int, phases: int
) -> None:
    """Within a run, any window of batches is within 2 rows of the run's shares; ``consumed`` adds up."""
    firsts = sorted(set(starts))[: len(weights) - 1]
    stages = [(0, 0, tuple(weights[0]))] + [
        (f, i + 1, tuple(w)) for i, (f, w) in enumerate(zip(firsts, weights[1:], strict=False))
    ]
    plan = plan_staged_pass(
        stages, batch_size, [anchor_rows, None, None], lambda f, b: (phases + f) % b.period
    )
    counts = plan.counts_of(0, plan.batches)
    assert plan.batches == plan.last + 1  # not drop_last: the last batch is yielded
    assert (counts.sum(axis=1) == batch_size).all()  # full: the others fill what the anchor lacks
    assert int(counts[:, 0].sum()) == int(plan.taken[0]) == anchor_rows  # the anchor, exactly
    assert (counts.sum(axis=0) == plan.taken).all()
    for n in range(plan.batches + 1):
        assert (plan.consumed(n) == counts[:n].sum(axis=0)).all()
    ends = [r.first for r in plan.runs[1:]] + [plan.last]
    for run, end in zip(plan.runs, ends, strict=True):
        shares = run.blend.shares * batch_size
        sums = np.vstack([np.zeros(3), np.cumsum(counts[run.first : end], axis=0)])
        for size in range(1, end - run.first + 1):  # every window of `size` batches at once
            windows = sums[size:] - sums[:-size]
            assert np.abs(windows - size * shares).max() < 2, (run.first, size)
        assert plan.run_of(run.first) == run


def test_one_stage_is_the_pass_of_fixed_weights() -> None:
    blend = blend_for((5, 3, 2))
    fixed = plan_pass(blend, 16, 7, [500, None, None])
    staged = plan_staged_pass([(0, 0, (5, 3, 2))], 16, [500, None, None], lambda f, b: 7)
    assert (fixed.counts_of(0, fixed.batches) == staged.counts_of(0, staged.batches)).all()
    assert fixed.batches == staged.batches
    assert (fixed.taken == staged.taken).all()


def test_an_endless_function_of_equal_weights_ends_with_its_anchor() -> None:
    """A function evaluated at every step is read only up to the batch where the pass ends."""
    calls = []

    def weights(step: int) -> list[int]:
        calls.append(step)
        return [1, 1]

    schedule = MixSchedule.of(weights)
    plan = plan_staged_pass(schedule.rounds(0, 1, 2), 10, [100, None], lambda f, b: 0)
    assert plan.batches == 20
    assert len(plan.runs) == 1
    assert max(calls) <= 21
