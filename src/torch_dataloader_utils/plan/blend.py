"""Weighted blending of sources: how many rows of each source every batch of a mix takes.

A mix reads several sources at once. Each *lane* (one reading process of one rank) has
its own stream of every source, and every lane builds the same batches from them:
batch ``t`` of a pass takes :meth:`PassPlan.counts` rows of each source, the same on
every lane of every rank, so all ranks yield equal batch counts and the rank's batches
do not depend on its neighbours.

The counts come from one row-level sequence per set of weights (:class:`Blend`): a
cycle of ``period`` slots holding source ``s`` exactly ``weights[s]`` times, ordered so
that among its first ``n`` slots every source holds within 1 slot of ``n * weights[s]
/ period`` (Tijdeman's chairman assignment; the bound is ``1 - 1 / (2k - 2)`` for
``k`` sources). Batch ``t`` takes slots ``[phase + t * B, phase + (t + 1) * B)`` of the
repeated cycle, the ``phase`` drawn from ``(seed, epoch, segment)``. So in *any*
window of consecutive batches a source's rows are within 2 rows of the window's rows
times its share: the proportions hold per batch up to one row, and they never drift.

A pass ends when a *limited* source, the mix's anchor, runs out (:func:`plan_pass`): with
``cycle`` the source whose epoch takes longest at its weight, with ``stop`` the one whose
epoch takes shortest (the others start their next epoch as they run out). The last batch
takes what the exhausted source has left and fills the rest from the others, by weight, so
it stays full.

Positions (:func:`advance`) are counted per lane: every source's rows on a lane are
a list of partly read epochs followed by whole ones, and a pass moves each source
along them by the rows it took.

Pure: stdlib and numpy only; nothing here reads data or the environment.
"""

from __future__ import annotations

import bisect
import functools
import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from torch_dataloader_utils.errors import ConfigError

__all__ = [
    "MAX_PERIOD",
    "WEIGHT_DENOMINATOR",
    "Blend",
    "PassPlan",
    "Run",
    "Stages",
    "advance",
    "apportion",
    "blend_for",
    "integer_weights",
    "plan_pass",
    "plan_staged_pass",
]

MAX_PERIOD = 1 << 16
"""Slots of a blend's cycle at most; weights whose exact cycle is longer are rounded to it
(a share then moves by less than ``1 / MAX_PERIOD``: under 2 rows in 100 batches of 1,024)."""
WEIGHT_DENOMINATOR = 1000
"""Weights are taken as fractions with denominators up to this (``0.3`` is ``3/10``, ``1/3`` is ``1/3``)."""


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` shared in proportion to ``weights`` (largest remainders; ties to the lowest index)."""
    whole = sum(weights)
    if whole <= 0:
        raise ValueError(f"weights must add up to more than 0, got {list(weights)}")
    parts = [divmod(total * w, whole) for w in weights]
    shares = [q for q, _ in parts]
    for i in sorted(range(len(weights)), key=lambda i: (-parts[i][1], i))[: total - sum(shares)]:
        shares[i] += 1
    return shares


def integer_weights(weights: Sequence[float]) -> tuple[int, ...]:
    """The weights as the smallest integers in the same proportions (a cycle of at most ``MAX_PERIOD``).

    Each weight is taken as a fraction with a denominator up to :data:`WEIGHT_DENOMINATOR`
    (``0.3`` is ``3/10``). Weights too small for that (``[1, 0.0004]``) are taken relative to
    the largest, with denominators up to :data:`MAX_PERIOD`, so a source keeps its share
    down to ``1 / MAX_PERIOD``. Any real number is taken (numpy scalars too).

    Raises:
        ConfigError: a weight is not a finite number > 0, there is none, or a share is
            below ``1 / MAX_PERIOD`` (a cycle could not hold it).
    """
    if not weights:
        raise ConfigError("there must be at least one weight")
    values: list[float] = []
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w <= 0:
            raise ConfigError(f"weights must be finite numbers > 0, got {w!r}")
        values.append(float(w))
    fractions = [Fraction(w).limit_denominator(WEIGHT_DENOMINATOR) for w in values]
    if not all(fractions):  # too small for the usual denominators: relative to the largest
        largest = max(values)
        fractions = [Fraction(w / largest).limit_denominator(MAX_PERIOD) for w in values]
        if not all(fractions):
            small = [w for w, f in zip(values, fractions, strict=True) if not f]
            raise ConfigError(
                f"weights={[float(w) for w in weights]}: a source's share of {small[0] / sum(values):.3g} is "
                f"below the smallest a mix keeps, 1/{MAX_PERIOD:,} of the rows (its rows within one row per "
                f"cycle of {MAX_PERIOD:,}); raise that weight, or leave the source out"
            )
    scale = math.lcm(*(f.denominator for f in fractions))
    ints = [int(f * scale) for f in fractions]
    common = math.gcd(*ints)
    ints = [i // common for i in ints]
    if sum(ints) > MAX_PERIOD:
        ints = [max(1, s) for s in apportion(MAX_PERIOD - len(ints), ints)]
        common = math.gcd(*ints)
        ints = [i // common for i in ints]
    return tuple(ints)


def _chairman(weights: Sequence[int]) -> np.ndarray:
    """A cycle holding source ``s`` ``weights[s]`` times, every prefix within 1 of its share.

    Tijdeman's rule, in integers: at slot ``n`` (1-based) the sources whose deficit
    ``n * w_s / P - count_s`` is at least ``c = 1 / (2k - 2)`` are eligible, and the one
    with the earliest deadline ``(count_s + 1 - c) * P / w_s`` takes the slot.
    """
    k, period = len(weights), sum(weights)
    if k == 1:
        return np.zeros(period, dtype=np.int16)
    scale = 2 * k - 2  # c = 1 / scale
    counts = [0] * k
    out = np.empty(period, dtype=np.int16)
    for n in range(1, period + 1):
        best = -1
        for s, w in enumerate(weights):
            if (n * w - counts[s] * period) * scale < period:
                continue  # deficit below c: not eligible
            # deadline_s < deadline_best  <=>  a_s * w_best < a_best * w_s, a = (count + 1) * scale - 1
            if (
                best < 0
                or ((counts[s] + 1) * scale - 1) * weights[best] < ((counts[best] + 1) * scale - 1) * w
            ):
                best = s
        if best < 0:  # cannot happen (Tijdeman); kept total for safety
            best = max(range(k), key=lambda s: n * weights[s] - counts[s] * period)
        counts[best] += 1
        out[n - 1] = best
    return out


class Blend:
    """The row-level cycle of a set of integer weights (see the module docstring).

    Args:
        weights: Integer weights > 0 (:func:`integer_weights`), one per source.
    """

    def __init__(self, weights: Sequence[int]) -> None:
        if not weights or any(w < 1 for w in weights):
            raise ValueError(f"weights must be ints >= 1, got {list(weights)}")
        self.weights = np.asarray(weights, dtype=np.int64)
        """Slots of every source in one cycle."""
        self.period = int(self.weights.sum())
        """Slots of one cycle."""
        self.sequence = _chairman([int(w) for w in weights])
        """The source of every slot of the cycle."""
        self._slots = [np.flatnonzero(self.sequence == s) for s in range(len(weights))]

    @property
    def num_sources(self) -> int:
        """Sources blended."""
        return len(self.weights)

    @property
    def shares(self) -> np.ndarray:
        """Every source's share of the rows (``weights / period``)."""
        shares: np.ndarray = self.weights / self.period
        return shares

    def count(self, n: int) -> np.ndarray:
        """Slots of every source among the first ``n`` slots of the repeated cycle (``n >= 0``)."""
        laps, rest = divmod(n, self.period)
        counts: np.ndarray = self.weights * laps + np.array(
            [int(np.searchsorted(slots, rest)) for slots in self._slots], dtype=np.int64
        )
        return counts

    def between(self, lo: int, hi: int) -> np.ndarray:
        """Slots of every source among slots ``[lo, hi)``."""
        between: np.ndarray = self.count(hi) - self.count(lo)
        return between

    def counts_at(self, n: np.ndarray) -> np.ndarray:
        """:meth:`count` of every slot index in ``n`` (int64, >= 0): ``[len(n), sources]``."""
        laps, rest = np.divmod(np.asarray(n, dtype=np.int64), self.period)
        counts: np.ndarray = laps[:, None] * self.weights[None, :]
        for s, slots in enumerate(self._slots):
            counts[:, s] += np.searchsorted(slots, rest)
        return counts


@functools.lru_cache(maxsize=32)
def blend_for(weights: tuple[int, ...]) -> Blend:
    """The :class:`Blend` of ``weights``, built once per process (its cycle takes up to 0.3 s)."""
    return Blend(weights)


@dataclass(frozen=True)
class Run:
    """Batches of a pass taken from one blend: from batch ``first`` to the next run's first.

    Attributes:
        first: The run's first batch.
        blend: The weights' cycle.
        phase: Slot of the cycle where the run starts.
        stage: The schedule's stage the run starts in (0 for fixed weights).
    """

    first: int
    blend: Blend
    phase: int
    stage: int = 0


@dataclass(frozen=True)
class PassPlan:
    """Rows of every source in every batch of one pass of a lane (the same on every lane).

    Attributes:
        runs: The pass's runs, in order: a run per stage of other weights (one with fixed
            weights); batch ``t`` of run ``r`` takes the slots ``[phase + (t - first) *
            batch_size, ...)`` of its blend's repeated cycle.
        batch_size: Rows per batch.
        last: Index of the pass's last batch (the one where a limited source runs out).
        last_counts: Rows of every source in that batch.
        batches: Batches yielded: ``last + 1``, or ``last`` when a short last batch is
            dropped (``drop_last``).
        taken: Rows of every source the whole pass takes (a dropped batch's too).
    """

    runs: tuple[Run, ...]
    batch_size: int
    last: int
    last_counts: np.ndarray
    batches: int
    taken: np.ndarray

    @property
    def blend(self) -> Blend:
        """The first run's blend (the only one with fixed weights)."""
        return self.runs[0].blend

    @property
    def phase(self) -> int:
        """Slot of the first run's cycle where the pass starts."""
        return self.runs[0].phase

    def run_of(self, t: int) -> Run:
        """The run batch ``t`` belongs to."""
        return self.runs[bisect.bisect_right([r.first for r in self.runs], t) - 1]

    def counts(self, t: int) -> np.ndarray:
        """Rows of every source in batch ``t`` (``0 <= t < batches``)."""
        if t == self.last:
            return self.last_counts
        run = self.run_of(t)
        start = run.phase + (t - run.first) * self.batch_size
        return run.blend.between(start, start + self.batch_size)

    def counts_of(self, first: int, stop: int) -> np.ndarray:
        """Rows of every source in batches ``[first, stop)``: ``[stop - first, sources]`` (vectorized)."""
        stop = min(stop, self.batches)
        if stop <= first:
            return np.zeros((0, self.blend.num_sources), dtype=np.int64)
        parts = []
        ends = [r.first for r in self.runs[1:]] + [stop]
        for run, end in zip(self.runs, ends, strict=True):
            lo, hi = max(first, run.first), min(stop, end)
            if lo >= hi:
                continue
            edges = run.phase + (np.arange(lo, hi + 1, dtype=np.int64) - run.first) * self.batch_size
            parts.append(np.diff(run.blend.counts_at(edges), axis=0))
        counts: np.ndarray = np.concatenate(parts)
        if first <= self.last < stop:
            counts[self.last - first] = self.last_counts
        return counts

    def consumed(self, batches: int) -> np.ndarray:
        """Rows of every source in the pass's first ``batches`` batches (all of it at its end)."""
        if batches >= self.batches:
            return self.taken
        out = np.zeros(self.blend.num_sources, dtype=np.int64)
        ends = [r.first for r in self.runs[1:]] + [batches]
        for run, end in zip(self.runs, ends, strict=True):
            n = min(batches, end) - run.first
            if n > 0:
                out += run.blend.between(run.phase, run.phase + n * self.batch_size)
        return out

    @property
    def short(self) -> bool:
        """The last batch has fewer than ``batch_size`` rows (every source ran out at once)."""
        return int(self.last_counts.sum()) < self.batch_size


def _runs_out(blend: Blend, batch_size: int, phase: int, source: int, rows: int) -> int:
    """The first batch ``t`` whose end reaches ``rows`` rows of ``source`` (``rows >= 1``)."""

    def taken(t: int) -> int:
        return int(blend.between(phase, phase + t * batch_size)[source])

    weight = int(blend.weights[source])
    lo, hi = 0, (rows + 1) * blend.period // (batch_size * weight) + 2
    while lo < hi:  # smallest t with taken(t + 1) >= rows
        mid = (lo + hi) // 2
        if taken(mid + 1) >= rows:
            hi = mid
        else:
            lo = mid + 1
    return lo


def plan_pass(
    blend: Blend,
    batch_size: int,
    phase: int,
    limits: Sequence[int | None],
    drop_last: bool = False,
) -> PassPlan:
    """The batches of a pass of fixed weights that ends when a limited source runs out.

    :func:`plan_staged_pass` with one stage: ``blend`` from ``phase`` on.
    """
    weights = tuple(int(w) for w in blend.weights)
    return plan_staged_pass(
        [(0, 0, weights)], batch_size, limits, lambda first, b: phase, drop_last, lambda w: blend
    )


Stages = Iterable[tuple[int, int, tuple[int, ...]]]
"""``(first batch, stage, integer weights)`` of every stage a pass meets, in order, from batch 0."""


def plan_staged_pass(
    stages: Stages,
    batch_size: int,
    limits: Sequence[int | None],
    phase_of: Callable[[int, Blend], int],
    drop_last: bool = False,
    blend_of: Callable[[tuple[int, ...]], Blend] = blend_for,
) -> PassPlan:
    """The batches of a pass whose weights change by stage, ending when a limited source runs out.

    Args:
        stages: Every stage the pass meets, in order (may be endless: it is read only up
            to the batch where the pass ends); the first from batch 0. Consecutive stages
            of equal weights are one run.
        batch_size: Rows per batch.
        limits: Rows every source can give before the pass must end (``None``: no limit,
            the source starts its next epoch when it runs out). At least one is an int >= 1.
        phase_of: Slot of a run's cycle where it starts, from its first batch and blend.
        drop_last: Do not yield a short last batch (its rows still count as taken).
        blend_of: The blend of a stage's integer weights.

    In every run, consecutive batches take consecutive slots of its blend's cycle, so the
    proportions hold within a run as with fixed weights. The last batch takes what the
    exhausted sources have left; the rows they lack come from the other sources, shared
    by the last run's weights (:func:`apportion`) and within their own limits, so the
    batch is short only when every source ran out.
    """
    items = iter(stages)
    first, stage, weights = next(items)
    blend = blend_of(weights)
    if len(limits) != blend.num_sources:
        raise ValueError(f"{len(limits)} limits for {blend.num_sources} sources")
    left = list(limits)
    ends = [n for n in left if n is not None]
    if not ends or any(n < 1 for n in ends):
        raise ValueError(f"at least one limit, and every limit >= 1, is needed; got {list(limits)}")
    run = Run(first, blend, phase_of(first, blend), stage)
    runs: list[Run] = []
    before = np.zeros(blend.num_sources, dtype=np.int64)
    while True:
        end = run.first + min(
            _runs_out(run.blend, batch_size, run.phase, s, n) for s, n in enumerate(left) if n is not None
        )
        nxt = next(items, None)
        while nxt is not None and nxt[0] <= end and nxt[2] == weights:  # the same weights: the run goes on
            nxt = next(items, None)
        if nxt is None or nxt[0] > end:
            break
        took = run.blend.between(run.phase, run.phase + (nxt[0] - run.first) * batch_size)
        before += took
        left = [None if n is None else n - int(t) for n, t in zip(left, took, strict=True)]
        runs.append(run)
        first, stage, weights = nxt
        blend = blend_of(weights)
        run = Run(first, blend, phase_of(first, blend), stage)
    runs.append(run)
    return _ending(tuple(runs), batch_size, end, before, limits, drop_last)


def _ending(
    runs: tuple[Run, ...],
    batch_size: int,
    last: int,
    earlier: np.ndarray,
    limits: Sequence[int | None],
    drop_last: bool,
) -> PassPlan:
    """The pass whose last batch is ``last`` (``earlier``: rows the runs before the last took)."""
    run = runs[-1]
    blend = run.blend
    at = run.phase + (last - run.first) * batch_size
    before = earlier + blend.between(run.phase, at)
    want = blend.between(at, at + batch_size)
    room = np.array(
        [np.iinfo(np.int64).max if n is None else n - int(b) for n, b in zip(limits, before, strict=True)],
        dtype=np.int64,
    )
    give = np.minimum(want, room)
    room -= give
    short = int(want.sum() - give.sum())
    while short > 0:
        open_ = [s for s in range(blend.num_sources) if room[s] > 0 and give[s] >= want[s]]
        if not open_:
            break
        extra = apportion(short, [int(blend.weights[s]) for s in open_])
        for s, n in zip(open_, extra, strict=True):
            n = min(n, int(room[s]))
            give[s] += n
            room[s] -= n
            short -= n
    batches = last if short > 0 and drop_last else last + 1
    return PassPlan(
        runs=runs,
        batch_size=batch_size,
        last=last,
        last_counts=give,
        batches=batches,
        taken=before + give,
    )


def advance(lengths: Sequence[int], fresh: int, skip: int, rows: int) -> tuple[int, int, int]:
    """Where a lane's rows of one source stand after ``rows`` more rows.

    The rows are ``len(lengths)`` partly read epochs of ``lengths[i]`` rows each, then
    whole epochs of ``fresh`` rows each; ``skip`` rows of its head are already read.

    Returns:
        ``(partial, whole, skip)``: partly read epochs finished, whole epochs finished
        after them, and rows read of the new head.
    """
    if fresh < 1:
        raise ValueError(f"an epoch of a lane must hold rows, got {fresh}")
    at = skip + rows
    done = 0
    for n in lengths:
        if at < n:
            return done, 0, at
        at -= n
        done += 1
    whole, at = divmod(at, fresh)
    return done, whole, at
