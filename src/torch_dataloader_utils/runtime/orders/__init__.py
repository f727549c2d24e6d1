"""Orders: how a dataset's epochs are read, as values the one engine (:mod:`..dataset`) drives.

An order decides which rows every reading process of every rank yields, in what order,
and what a resume state of it holds. The engine does the rest the same way for every
order: it converts and tags the batches, groups them for the trip from a DataLoader
worker, hands them to the loop, records what the loop consumed, counts and times it.

* :class:`~.planned.PlannedOrder`: every rank's share of an epoch, dealt by the planner
  and spread over its workers in pieces (``create_dataloader``'s default);
* :class:`~.elastic.ElasticOrder`: ``C`` canonical ranks' streams, shared by the physical
  ranks, every batch drawn from all of a rank's streams; its workers' parts of a batch
  are joined in the main process (the only order with a joiner);
* :class:`~.mixed.MixedOrder`: several sources mixed by weight, every reading process a
  lane of its own, each source exactly once per its own epoch.

An order is a pure function of its plan, seed, epoch, the start it was loaded with, the
world and the workers: it reads nothing from the environment, so any pass can be planned
again, anywhere, from the same values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from torch_dataloader_utils.runtime.env import WorkerSlot
from torch_dataloader_utils.runtime.state import PassLog, Tagged
from torch_dataloader_utils.runtime.workstats import WorkStats

__all__ = ["Delivery", "Joins", "Order", "OrderState", "Reading", "Tagger"]


class Tagger(Protocol):
    """What tags a reading process's batches with their position (:mod:`..emit`)."""

    worker: int

    def tag(self, rows: int, nbytes: int = 0) -> tuple[int, ...]:
        """The position after a yielded batch of ``rows`` rows (and ``nbytes`` Arrow bytes)."""
        ...

    def take_removed(self) -> tuple[tuple[int, int], ...]:
        """``(planned position, rows)`` runs left out since the last call (the training ledger's skips)."""
        ...


class Reading(NamedTuple):
    """What one reading process reads of a pass.

    Attributes:
        batches: Its batches, as Arrow (a :class:`~..emit.BatchParts` where the engine may
            join a batch's parts straight into the transfer buffer).
        positions: Tags every batch with its position, so the loop's consumption is exact.
        work: Its timers and counters.
        parts: The batches are this process's parts of the rank's batches, which the main
            process joins (elastic order with several reading workers).
    """

    batches: Iterator[Any]
    positions: Tagger
    work: WorkStats
    parts: bool = False


class OrderState(Protocol):
    """A resume state, parsed: a frozen value that gives its JSON."""

    @property
    def epoch(self) -> int:
        """The epoch it resumes."""
        ...

    def to_json(self) -> dict[str, Any]:
        """The state as JSON values."""
        ...


class Delivery(Protocol):
    """Main process: what turns the items workers send into the loop's batches, in order."""

    def add(self, item: Tagged) -> Iterator[Any]:
        """Take one worker's item; the batches it completes, each made when asked for."""
        ...

    def check_done(self) -> None:
        """At the end of a pass: nothing is left over (else the plan was inconsistent)."""
        ...


class Joins(NamedTuple):
    """How the main process joins workers' parts of a batch (the engine's conversion).

    Attributes:
        one: One batch of its parts.
        blocks: Several batches of parts that each hold whole batches (one copy per
            column), or ``None``.
        converted: The parts arrive converted (else as Arrow, converted once joined).
    """

    one: Callable[[list[Any]], Any]
    blocks: Callable[[list[Any], int], list[Any]] | None
    converted: bool


class Order(Protocol):
    """How a dataset's epochs are read; see the module docstring.

    Attributes:
        num_workers: Reading processes per rank the order is planned for (0: the main
            process).
    """

    num_workers: int

    @property
    def passes(self) -> PassLog:
        """The passes over the current epoch and what the loop consumed of them (the progress)."""
        ...

    def batches(self, slot: WorkerSlot, epoch: int, converted_parts: bool) -> Reading:
        """What the reading process ``slot`` reads of the current pass over ``epoch``.

        ``converted_parts``: parts of joined batches are converted by the workers.
        """
        ...

    def prepare(self, epoch: int, num_workers: int) -> None:
        """Main process: a pass over ``epoch`` starts; plan what its workers and its state need."""
        ...

    def num_batches(self, epoch: int, num_workers: int) -> int:
        """Batches this rank yields in a full pass over ``epoch`` with ``num_workers`` workers."""
        ...

    def remaining(self, epoch: int) -> int:
        """Batches left of the current pass over ``epoch`` (or of the next one, before it starts)."""
        ...

    def rows(self, epoch: int, num_workers: int) -> tuple[int | None, int]:
        """Rows this rank's loop receives in ``epoch`` (``None``: unknown), and those already consumed."""
        ...

    def digest(self, epoch: int, num_workers: int) -> int | None:
        """A custom split strategy's digest of the chunks this rank reads (``None``: built in)."""
        ...

    def fingerprint(self) -> dict[str, Any]:
        """What a state of this order is tied to: its data and the options that shape it."""
        ...

    def state(self, epoch: int) -> OrderState:
        """This rank's resume state: what the loop consumed of ``epoch``."""
        ...

    def load(self, state: Mapping[str, Any]) -> int:
        """Resume from a (merged) state; returns its epoch. A refused state changes nothing."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """``epoch`` is selected (the engine then sets it)."""
        ...

    def delivery(
        self, epoch: int, num_workers: int, joins: Joins, consume: Callable[[Tagged], Any]
    ) -> Delivery | None:
        """Main process: what a pass over ``epoch`` with ``num_workers`` workers needs before the loop.

        ``consume`` records a worker's part as consumed when a joined batch is made.
        """
        ...

    def dropped_rows(self, epoch: int) -> int:
        """Rows equal batches leave out of ``epoch`` on this rank's plan (for the metrics)."""
        ...
