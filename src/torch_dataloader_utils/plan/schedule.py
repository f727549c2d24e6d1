"""Mixture schedules: a mix's weights by stage, as a pure function of the step (or of rows).

A :class:`MixSchedule` says which weights a mix uses from where on: a list of
:class:`Stage` values (stage ``k`` from ``stages[k].start`` on), or a function of the
step evaluated at every ``every``-th one (stage ``k`` from ``k * every`` on, with the
weights the function returns there). The *unit* of the starts is the step (a rank's
batch count since the start of training, the same on every rank, as ranks yield equal
batches) or rows (rows the whole job has taken from the sources since the start of
training).

A mix reads its batches in *rounds*: batch ``t`` of every reading process (lane) of the
job, the same composition on every lane. A rank receives round ``t`` of a pass as its
steps ``step0 + t * readers`` to ``step0 + t * readers + readers - 1`` (its readers one
after the other), and the whole job takes ``lanes * batch_size`` rows per round. So a
stage applies from the first round of the pass whose first step (or first row) is at or
after the stage's start (:meth:`MixSchedule.rounds`): with one reading process per rank
at its start exactly, with ``readers`` processes at the first step at or after it where
a round starts (the start itself when it is a multiple of ``readers`` steps after the
pass's start).

Pure: stdlib and numpy only; nothing here reads data or the environment.
"""

from __future__ import annotations

import bisect
import enum
import functools
import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.plan.blend import integer_weights

__all__ = [
    "MixSchedule",
    "ScheduleUnit",
    "Stage",
    "WeightsFunction",
    "recorded_weights",
    "stage_weights",
    "weights_of_record",
]

WeightsFunction = Callable[[int], Sequence[float]]
"""A schedule's function: the step (or rows) where a stage starts -> the weights from there on."""


class ScheduleUnit(enum.Enum):
    """What the starts of a schedule's stages count."""

    STEP = "step"
    """Batches a rank has received since the start of training (the same on every rank)."""
    ROWS = "rows"
    """Rows the whole job (every rank) has taken from the sources since the start of training."""


@dataclass(frozen=True)
class Stage:
    """One stage of a :class:`MixSchedule`: from ``start`` (a step, or rows) on, ``weights``.

    Attributes:
        start: The first step (or row) of the stage.
        weights: One weight > 0 per source.
    """

    start: int
    weights: tuple[float, ...]


@functools.lru_cache(maxsize=256)
def _integers(weights: tuple[float, ...]) -> tuple[int, ...]:
    return integer_weights(weights)


def stage_weights(value: object, where: str) -> tuple[int, ...]:
    """``value`` as a stage's integer weights (:func:`~.blend.integer_weights`).

    Raises:
        ConfigError: not a non-empty list of finite numbers > 0 (``where`` names it).
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ConfigError(
            f"{where}={value!r} must be a non-empty list of weights > 0, one per source, e.g. [0.6, 0.3, 0.1]"
        )
    for w in value:
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w <= 0:
            raise ConfigError(
                f"{where}={list(value)!r}: every weight must be a finite number > 0 (got {w!r}); leave a "
                "source out of the mix (a recipe change) instead of giving it weight 0"
            )
    try:
        return _integers(tuple(float(w) for w in value))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


@dataclass(frozen=True, init=False)
class MixSchedule:
    """A mix's weights by stage: ``weights=`` of ``create_mixed_dataloader`` takes one.

    Either a list of stages, each ``(start, weights)``, the first starting at 0::

        MixSchedule([(0, [0.6, 0.3, 0.1]), (50_000, [0.4, 0.4, 0.2])])  # by step
        MixSchedule([(0, [1, 1]), (10**9, [1, 3])], unit="rows")  # by rows the job has taken

    or a function of the step (:meth:`of`), evaluated where each stage starts, every
    ``every`` steps (rows)::

        MixSchedule.of(lambda step: [1, 1] if step < 50_000 else [1, 3], every=1_000)

    Args:
        stages: ``(start, weights)`` pairs (or :class:`Stage` values), starts increasing from 0.
        unit: What the starts count: ``"step"`` (default), a rank's batches since the start
            of training, or ``"rows"``, the rows every rank together has taken since then.

    Raises:
        ConfigError: no stage, a first start other than 0, starts not increasing, a
            weights list that is not one number > 0 per source, or lists of other lengths.
    """

    stages: tuple[Stage, ...]
    """The stages (empty for a function's schedule)."""
    unit: ScheduleUnit
    """What the starts count."""
    function: WeightsFunction | None = field(default=None, compare=False)
    """The function of the step a schedule of :meth:`of` evaluates (``None``: a list of stages)."""
    every: int = 1
    """Steps (rows) between the starts of a function's stages."""

    def __init__(
        self,
        stages: Sequence[Stage | tuple[int, Sequence[float]]] = (),
        *,
        unit: str | ScheduleUnit = ScheduleUnit.STEP,
        function: WeightsFunction | None = None,
        every: int = 1,
    ) -> None:
        object.__setattr__(self, "unit", _unit(unit))
        object.__setattr__(self, "function", function)
        object.__setattr__(self, "every", every)
        if function is not None:
            if stages:
                raise ConfigError("a MixSchedule is a list of stages or a function, not both")
            if not callable(function):
                raise ConfigError(f"MixSchedule.of({function!r}): give a function of the step")
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise ConfigError(f"every={every!r} must be an int >= 1 (steps, or rows, between stages)")
            object.__setattr__(self, "stages", ())
            return
        object.__setattr__(self, "stages", _stages(stages))
        object.__setattr__(self, "every", 1)

    @classmethod
    def of(
        cls, function: WeightsFunction, *, every: int = 1, unit: str | ScheduleUnit = ScheduleUnit.STEP
    ) -> MixSchedule:
        """A schedule whose stage ``k`` starts at ``k * every`` with the weights ``function(k * every)``.

        ``function`` must be a pure function of its argument: every rank and reading
        process evaluates it when it plans a pass, so it must give the same weights for
        the same step everywhere (no clock, random draws, rank, files or global state),
        and pickle where workers are spawned. Stages of equal weights are one stage.

        Args:
            function: The step (or rows) where a stage starts -> the weights from there on.
            every: Steps (rows) between the starts of stages; the function is called once
                per stage a pass reaches.
            unit: ``"step"`` (default) or ``"rows"``.
        """
        return cls(unit=unit, function=function, every=every)

    @classmethod
    def constant(cls, weights: Sequence[float]) -> MixSchedule:
        """The schedule of fixed weights: one stage from step 0."""
        return cls([(0, weights)])

    @property
    def num_sources(self) -> int | None:
        """Weights per stage (``None`` for a function's, known when it is evaluated)."""
        return len(self.stages[0].weights) if self.stages else None

    @property
    def is_constant(self) -> bool:
        """One list of weights from the start of training on."""
        return len(self.stages) == 1

    def index_at(self, value: int) -> int:
        """The stage in force at ``value`` (a step, or rows)."""
        if self.function is not None:
            return value // self.every
        return bisect.bisect_right([s.start for s in self.stages], value) - 1

    def start_of(self, index: int) -> int | None:
        """Where stage ``index`` starts (``None``: there is no such stage)."""
        if self.function is not None:
            return index * self.every
        return self.stages[index].start if index < len(self.stages) else None

    def weights_of(self, index: int, num_sources: int) -> tuple[int, ...]:
        """Stage ``index``'s weights, as integers (:func:`~.blend.integer_weights`).

        Raises:
            ConfigError: the function returned no valid weights there, or a stage has
                another number of weights than ``num_sources``.
        """
        if self.function is None:
            value: Any = self.stages[index].weights
            where = f"weights stage {index} (from {self.unit.value} {self.stages[index].start:,})"
        else:
            at = index * self.every
            name = getattr(self.function, "__qualname__", repr(self.function))
            value = self.function(at)
            where = f"the weights function {name}({at})"
        ints = stage_weights(value, where)
        if len(ints) != num_sources:
            raise ConfigError(
                f"{where} gives {len(ints)} weight(s) for {num_sources} source(s); give one weight per source"
            )
        return ints

    def rounds(
        self, base: int, per_round: int, num_sources: int
    ) -> Iterator[tuple[int, int, tuple[int, ...]]]:
        """``(first round, stage, weights)`` of every stage a pass meets, in order (may be endless).

        Args:
            base: The step (or rows) where the pass starts.
            per_round: Steps (or rows) of one round of the pass.
            num_sources: Sources of the mix (every stage's weights are checked for it).

        The first item is the stage in force at round 0; each next one starts at the first
        round whose first step (row) is at or after its start. A stage that starts and
        ends inside one round is skipped.
        """
        if per_round < 1:
            raise ValueError(f"per_round must be >= 1, got {per_round}")
        t, k = 0, self.index_at(base)
        while True:
            yield t, k, self.weights_of(k, num_sources)
            start = self.start_of(k + 1)
            if start is None:
                return
            t = max(t + 1, -(-(start - base) // per_round))
            k = self.index_at(base + t * per_round)

    def fingerprint(self) -> Any:
        """What a resume state is tied to, as JSON values.

        Fixed weights: their integers (as before schedules); a list of stages: the unit
        and every stage's start and integers; a function: the unit and ``every`` (the
        function itself is compared through the weights a state records).
        """
        if self.function is not None:
            return {"unit": self.unit.value, "every": self.every, "function": True}
        if self.is_constant:
            return list(self.weights_of(0, len(self.stages[0].weights)))
        n = len(self.stages[0].weights)
        return {
            "unit": self.unit.value,
            "stages": [[s.start, list(self.weights_of(i, n))] for i, s in enumerate(self.stages)],
        }

    def describe(self) -> str:
        """The schedule in a line (errors, reports)."""
        if self.function is not None:
            name = getattr(self.function, "__qualname__", repr(self.function))
            return f"{name}, every {self.every:,} {self.unit.value}s"
        if self.is_constant:
            return str([float(w) for w in self.stages[0].weights])
        return ", ".join(
            f"from {self.unit.value} {s.start:,}: {[float(w) for w in s.weights]}" for s in self.stages
        )


def recorded_weights(weights: tuple[float, ...] | MixSchedule) -> Any:
    """A mix's ``weights`` as JSON values, as given (a ledger's config records them).

    Fixed weights: a list; stages: ``{"unit", "stages": [[start, weights], ...]}``; a
    function: ``{"unit", "every", "function": its name}`` (the function itself cannot be
    recorded: a replay is given it again).
    """
    if not isinstance(weights, MixSchedule):
        return list(weights)
    if weights.function is not None:
        name = getattr(weights.function, "__qualname__", repr(weights.function))
        return {"unit": weights.unit.value, "every": weights.every, "function": name}
    return {"unit": weights.unit.value, "stages": [[st.start, list(st.weights)] for st in weights.stages]}


def weights_of_record(
    value: Any, function: WeightsFunction | MixSchedule | None = None
) -> tuple[float, ...] | MixSchedule:
    """The weights :func:`recorded_weights` recorded; ``function``: a function's, given again.

    Raises:
        ConfigError: the record is a function's and none is given (names how to give it),
            or not a record of weights.
    """
    if isinstance(value, list):
        return tuple(value)
    if not isinstance(value, dict) or "unit" not in value:
        raise ConfigError(f"recorded weights {value!r} are not a list of weights or a schedule")
    if "stages" in value:
        return MixSchedule([(int(a), w) for a, w in value["stages"]], unit=value["unit"])
    if isinstance(function, MixSchedule):
        return function
    if function is None:
        raise ConfigError(
            f"the mix's weights were the function {value.get('function')!r} of the {value['unit']}, which "
            "cannot be recorded; pass it again: Ledger(DIR, weights=function)"
        )
    return MixSchedule.of(function, every=int(value["every"]), unit=value["unit"])


def _unit(value: str | ScheduleUnit) -> ScheduleUnit:
    if isinstance(value, ScheduleUnit):
        return value
    try:
        return ScheduleUnit(value)
    except ValueError:
        raise ConfigError(
            f"unit={value!r} is not a schedule unit; use 'step' (a rank's batches since the start of "
            "training) or 'rows' (rows every rank together has taken)"
        ) from None


def _stages(stages: object) -> tuple[Stage, ...]:
    """``stages`` as :class:`Stage` values, checked."""
    example = "[(0, [0.6, 0.3, 0.1]), (50_000, [0.4, 0.4, 0.2])]"
    if isinstance(stages, (str, bytes)) or not isinstance(stages, Sequence) or not stages:
        raise ConfigError(
            f"a schedule's stages={stages!r} must be a non-empty list of (start, weights), e.g. {example}"
        )
    out: list[Stage] = []
    for i, item in enumerate(stages):
        if isinstance(item, Stage):
            start, weights = item.start, item.weights
        elif isinstance(item, Sequence) and not isinstance(item, (str, bytes)) and len(item) == 2:
            start, weights = item
        else:
            raise ConfigError(f"stage {i}={item!r} must be a pair (start, weights), e.g. {example}")
        if isinstance(start, bool) or not isinstance(start, numbers.Integral) or start < 0:
            raise ConfigError(f"stage {i} starts at {start!r}: a start is an int >= 0 (a step, or rows)")
        if i == 0 and start != 0:
            raise ConfigError(
                f"stage 0 starts at {start!r}: the first stage starts at 0 (the weights from the start of "
                f"training), e.g. {example}"
            )
        if out and start <= out[-1].start:
            raise ConfigError(
                f"stage {i} starts at {start!r}, not after stage {i - 1} ({out[-1].start!r}): starts increase"
            )
        stage_weights(weights, f"stage {i}'s weights")
        if out and len(weights) != len(out[0].weights):
            raise ConfigError(
                f"stage {i} has {len(weights)} weight(s), stage 0 {len(out[0].weights)}: every stage gives "
                "one weight per source"
            )
        out.append(
            Stage(int(start), tuple(int(w) if isinstance(w, numbers.Integral) else float(w) for w in weights))
        )
    return tuple(out)
