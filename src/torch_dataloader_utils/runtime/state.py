"""What the training loop consumed, tracked in the main process; gathering states of ranks.

Workers tag every batch with its position in their plan: ``(token, worker, workers,
piece, offset, ...)`` — after this batch, the worker's first ``piece`` pieces and the first
``offset`` rows of piece ``piece`` have been yielded. The loader strips the tag in the
main process at the moment it hands the batch to the loop and records it in
:class:`EpochProgress`. So a batch counts as consumed exactly when the loop received
it: batches prefetched by workers, or sitting in the DataLoader's queues, are not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import torch
import torch.distributed as dist

from torch_dataloader_utils.errors import CheckpointMismatchError, ResumeStateError
from torch_dataloader_utils.plan.state import (
    RankEntry,
    ResumeState,
    Segment,
    fingerprint,
    merge_states,
    plain_state,
)
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import FileInfo, World
from torch_dataloader_utils.storage.expressions import lossless_text

__all__ = [
    "STALE_WORKERS",
    "EpochProgress",
    "Live",
    "Loaded",
    "PassLog",
    "ResumeTracker",
    "Stateful",
    "Tagged",
    "complete_state",
    "gather_state",
]


class Tagged(NamedTuple):
    """A batch and its position in the worker's plan (a namedtuple survives pin_memory).

    ``work``: ``(worker, delta, files)``, the worker's timers and counters since its
    previous hand-over and the rows it skipped per file (see :mod:`.workstats`), or ``None``.
    ``removed``: ``(position, rows)`` runs of the worker's planned stream whose rows it left
    out since its previous hand-over (stand-ins of skipped units), for the training ledger.
    """

    batch: Any
    tag: tuple[int, ...]
    work: tuple[int, tuple[float, ...], tuple[tuple[str, int], ...]] | None = None
    removed: tuple[tuple[int, int], ...] = ()


@dataclass
class EpochProgress:
    """Cursors of the batches the loop received in one pass over an epoch.

    Attributes:
        num_workers: Workers of this pass (1 when reading in the main process).
        cursors: ``worker -> (piece, offset)`` after the last batch received from it.
        done: The pass ran to its end (every piece consumed).
        base: The interrupted segments this pass resumed from (``()`` for a full epoch).
        batches: Batches the loop received in this pass.
        running: The pass has not ended yet (not exhausted, closed, or failed).
        tracked: This pass is the one the resume state describes (a pass started while
            another one runs, e.g. an evaluation over the training loader, is not).
    """

    num_workers: int
    base: tuple[Segment, ...] = ()
    cursors: dict[int, tuple[int, int]] = field(default_factory=dict)
    done: bool = False
    batches: int = 0
    running: bool = True
    tracked: bool = True

    def record(self, tag: Sequence[int]) -> None:
        """Note that the batch carrying ``tag`` reached the loop."""
        _, worker, workers, piece, offset = (int(v) for v in tag[:5])
        cursor = (piece, offset)
        # Plain stores last, no call after them: an exception raised asynchronously in the
        # main thread (a signal handler) cannot land between the record and the hand-over.
        self.cursors[worker] = cursor
        self.num_workers = workers
        self.batches += 1

    def entry(
        self, piece_rows: Sequence[Sequence[int]] | None = None, digest: int | None = None
    ) -> RankEntry:
        """This rank's part of a state segment (``digest``: its plan's, see :class:`RankEntry`).

        With ``piece_rows`` (the rows of each piece of each worker of this pass), it also
        says how many rows each worker has left (``left``), so a resumed job finds the
        rows of every rank without planning it.
        """
        cursors = tuple(self.cursors.get(w, (0, 0)) for w in range(self.num_workers))
        left = None
        if piece_rows is not None and not self.done and len(piece_rows) == self.num_workers:
            left = tuple(
                sum(rows[piece:]) - offset for rows, (piece, offset) in zip(piece_rows, cursors, strict=True)
            )
        return RankEntry(self.num_workers, cursors, self.done, left, digest)


class Stateful(Protocol):
    """Anything with ``state_dict()`` (a loader from ``create_dataloader``, or its dataset)."""

    def state_dict(self) -> dict[str, Any]:
        """The resume state of this rank."""
        ...


def gather_state(source: Stateful, group: Any = None) -> dict[str, Any]:
    """The state of every rank, merged: call it on all ranks at the same step.

    Uses ``torch.distributed.all_gather_object`` (any backend; with NCCL set the
    current CUDA device first) and :func:`~torch_dataloader_utils.plan.state.merge_states`.
    Without an initialized process group it returns this process's state. Every rank
    gets the merged state (plain JSON values, not keyed by rank); save it from rank 0.

    Args:
        source: The loader (or dataset) whose state to gather.
        group: A process group, or ``None`` for the default one.
    """
    state = source.state_dict()
    if not (dist.is_available() and dist.is_initialized()):
        return dict(plain_state(state))
    states: list[Mapping[str, Any] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, state, group=group)
    return merge_states([s for s in states if s is not None])


def complete_state(state: Mapping[str, Any], world: World) -> Mapping[str, Any]:
    """``state``, or, if it holds only some ranks of the running job, every rank's state merged.

    Each rank loading its *own* state (as torch-dataloader-utils 0.2.0 checkpoints were
    saved: ``all_gather_object`` then ``states[rank]``, or one file per rank) leaves
    the rest of the epoch unknown to it, since the other ranks' cursors decide how it
    is re-planned. When a ``torch.distributed`` process group of ``world``'s size is
    initialized, such a state is completed with the states the other ranks load at
    the same call (``all_gather_object``; every rank must call ``load_state_dict``
    then, as a DDP job does). Any other value is returned unchanged, for the checks
    of :meth:`~torch_dataloader_utils.plan.state.ResumeState.parse`.
    """
    if world.num_ranks < 2 or not (dist.is_available() and dist.is_initialized()):
        return state
    try:
        parsed = ResumeState.parse(state, complete=False)
    except (ResumeStateError, CheckpointMismatchError):
        return state
    last = parsed.segments[-1] if parsed.segments else None
    if (
        last is None
        or last.num_ranks != world.num_ranks
        or len(last.ranks) >= world.num_ranks
        or dist.get_world_size() != world.num_ranks
    ):
        return state
    states: list[Mapping[str, Any] | None] = [None] * world.num_ranks
    dist.all_gather_object(states, dict(state))
    return merge_states([s for s in states if s is not None])


S = TypeVar("S")


@dataclass(frozen=True)
class Loaded(Generic[S]):
    """A loaded state made live: its epoch, where it starts, and the token that names it."""

    epoch: int
    start: S
    token: int

    @property
    def segments(self) -> S:
        """The start, by the name a planned order's state gives it (its segments)."""
        return self.start


STALE_WORKERS = (
    "load_state_dict() was called after this loader's persistent workers started, so they cannot "
    "see the state; create a new loader (or persistent_workers=False) and load the state before the "
    "first iteration"
)


class Live(Generic[S]):
    """A loaded start, live while a shared-memory token names it.

    It lives in its dataset (so it pickles to workers): the start travels with it, and the
    shared token says which loaded start is live, so persistent workers see a state loaded
    (or used up) in the main process, or refuse a start they were not given.
    """

    def __init__(self) -> None:
        self._token = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self.loaded: Loaded[S] | None = None

    @property
    def token(self) -> int:
        """Which loaded start is live (0: none)."""
        return int(self._token.item())

    def get(self) -> Loaded[S] | None:
        """The live start (``None``: none).

        Raises:
            ResumeStateError: a start was loaded after this process's copy was made.
        """
        token = self.token
        if token == 0:
            return None
        if self.loaded is None or self.loaded.token != token:
            raise ResumeStateError(STALE_WORKERS)
        return self.loaded

    def set(self, epoch: int, start: S) -> None:
        """Make ``start`` (of ``epoch``) the live one."""
        token = int(torch.randint(1, 2**62, ()).item())
        self.loaded = Loaded(epoch, start, token)
        self._token.fill_(token)

    def clear(self) -> None:
        """No start is live any more (the loaded one is kept, unread)."""
        self._token.fill_(0)

    def forget(self) -> None:
        """No start is loaded."""
        self.loaded = None
        self._token.fill_(0)


class PassLog:
    """The passes over a dataset's epoch: the one the resume state describes, and what the loop took.

    A pass started while the tracked one still runs (a loop over the same loader nested in
    the training loop, e.g. an evaluation) gets its own, untracked record: the resume state
    keeps describing the pass it was started inside, and the nested pass reaching its end
    does not finish the epoch.
    """

    def __init__(self) -> None:
        self.progress: EpochProgress | None = None
        """The pass the resume state describes (``None``: no pass since the epoch was set)."""
        self.completed_pass = False
        """A tracked pass over the current epoch ran to its end since it was set or loaded."""

    def __getstate__(self) -> dict[str, Any]:
        return {"progress": None, "completed_pass": False}

    def begin(self, num_workers: int, epoch: int) -> EpochProgress:
        """Start recording a pass over ``epoch`` read by ``num_workers`` workers."""
        current = self.progress
        nested = current is not None and current.running and not current.done
        progress = EpochProgress(max(1, num_workers), base=self.base(epoch), tracked=not nested)
        if not nested:
            self.progress = progress
        return progress

    def base(self, epoch: int) -> tuple[Segment, ...]:
        """The interrupted passes a pass over ``epoch`` resumes (``()``: none)."""
        return ()

    def consume(self, item: Any, progress: EpochProgress | None = None) -> Any:
        """Main process: record a tagged batch as consumed by ``progress``'s pass; return the batch.

        ``progress`` defaults to the tracked pass.
        """
        if not isinstance(item, Tagged):
            return item
        progress = self.progress if progress is None else progress
        if progress is not None:
            progress.record(item.tag)
        return item.batch

    def finish(self, progress: EpochProgress | None = None) -> bool:
        """``progress``'s pass ran to its end; returns whether it is the tracked one."""
        progress = self.progress if progress is None else progress
        if progress is None:
            return True
        progress.done = True
        if progress.tracked:
            self.completed_pass = True
        return progress.tracked

    @staticmethod
    def end(progress: EpochProgress) -> None:
        """``progress``'s pass ended (exhausted, closed or failed): a later pass is not nested in it."""
        progress.running = False

    def reset(self) -> None:
        """A new epoch was selected, or a state loaded: no pass yet."""
        self.progress = None
        self.completed_pass = False


class ResumeTracker(PassLog):
    """The resume bookkeeping of a planned order: a loaded state, and what the loop consumed.

    It lives in the dataset (so it pickles to workers): the loaded state's epoch and
    segments travel with it, and a shared-memory token says which loaded state is
    live, so persistent workers see a state loaded (or finished) in the main process.

    Args:
        files: The dataset's files (part of the fingerprint).
        options: The options a state is tied to (JSON values), part of the fingerprint.
        world: The ranks this dataset plans for.
        seed: The shuffle seed (saved in the state).
    """

    def __init__(
        self,
        files: Sequence[FileInfo] | FileTable,
        options: Mapping[str, Any],
        world: World,
        seed: int,
    ) -> None:
        super().__init__()
        self._files = files
        self._options = dict(options)
        self._world = world
        self._seed = seed
        self._fingerprint: dict[str, Any] | None = None
        self._live: Live[tuple[Segment, ...]] = Live()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "progress": None, "completed_pass": False}

    def set_option(self, name: str, value: Any) -> None:
        """Set (``None``: remove) one option a state is tied to; the fingerprint is computed again."""
        if value is None:
            self._options.pop(name, None)
        else:
            self._options[name] = value
        self._fingerprint = None

    @property
    def token(self) -> int:
        """Which loaded state is live (0: none)."""
        return self._live.token

    @property
    def loaded(self) -> Loaded[tuple[Segment, ...]] | None:
        """A loaded state's epoch, segments and token (pickled to workers)."""
        return self._live.loaded

    def fingerprint(self) -> dict[str, Any]:
        """What a resume state of this dataset is tied to (files digest and options), computed once."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self._files, json.loads(json.dumps(self._options, default=str)))
        return self._fingerprint

    def live_segments(self, epoch: int) -> tuple[Segment, ...] | None:
        """The loaded state's segments, when it is live and for ``epoch``."""
        loaded = self._live.get()
        return loaded.start if loaded is not None and loaded.epoch == epoch else None

    def unread_loaded_epoch(self) -> int | None:
        """The epoch of a loaded state that no pass has started reading yet, else ``None``."""
        loaded = self._live.loaded
        if loaded is None or self.token == 0 or loaded.token != self.token or self.progress is not None:
            return None
        return loaded.epoch

    def on_set_epoch(self, epoch: int) -> None:
        """A new epoch was selected: a loaded state of another epoch is dropped."""
        self.reset()
        loaded = self._live.loaded
        if loaded is not None and loaded.epoch != epoch:
            self._live.clear()

    def base(self, epoch: int) -> tuple[Segment, ...]:
        """The loaded state's segments of ``epoch``: where a pass over it starts."""
        return self.live_segments(epoch) or ()

    def finish(self, progress: EpochProgress | None = None) -> bool:
        """``progress``'s pass ran to its end; if it is the tracked one, the next pass is a full epoch."""
        tracked = super().finish(progress)
        if tracked:
            self._live.clear()
        return tracked

    def state_dict(
        self,
        epoch: int,
        piece_rows: Callable[[int, int, tuple[Segment, ...]], Sequence[Sequence[int]] | None] | None = None,
        plan_digest: Callable[[int, int], int | None] | None = None,
    ) -> dict[str, Any]:
        """This rank's state: what the loop consumed of ``epoch`` (plain JSON values); see :meth:`state`."""
        return self.state(epoch, piece_rows, plan_digest).to_json()

    def state(
        self,
        epoch: int,
        piece_rows: Callable[[int, int, tuple[Segment, ...]], Sequence[Sequence[int]] | None] | None = None,
        plan_digest: Callable[[int, int], int | None] | None = None,
    ) -> ResumeState:
        """This rank's state: what the loop consumed of ``epoch``.

        ``piece_rows(epoch, num_workers, segments)`` gives the rows of each piece of each
        worker of this rank in that pass (``None`` when unknown), so the state records
        the rows each worker has left. ``plan_digest(epoch, num_workers)`` gives a custom
        strategy's digest of the chunks of this rank's plan (``None`` for a built-in
        one), recorded in a fresh pass's entry so that a resume with other strategy
        parameters is refused.
        """
        progress = self.progress
        segments = progress.base if progress is not None else self.live_segments(epoch) or ()
        world = (self._world.num_ranks, self._world.rank)
        state = ResumeState(epoch, self.fingerprint(), segments, self._seed, world)
        if progress is None:
            return state
        rows = None
        if piece_rows is not None and not progress.done:
            rows = piece_rows(epoch, progress.num_workers, progress.base)
        digest = None
        if plan_digest is not None and not progress.base:  # a fresh pass: its plan's chunks
            digest = plan_digest(epoch, progress.num_workers)
        entry = progress.entry(rows, digest)
        segment = Segment(self._world.num_ranks, {self._world.rank: entry}, len(segments))
        state = ResumeState(epoch, state.fingerprint, (*segments, segment), self._seed, world)
        return state.normalized() if self._world.num_ranks == 1 else state

    def load(self, state: Mapping[str, Any], validate: Callable[[int, tuple[Segment, ...]], object]) -> int:
        """Check ``state`` against this dataset and make it live; returns its epoch.

        ``validate(epoch, segments)`` re-plans the rest of the epoch (raising on a
        state that does not fit); nothing changes when a check fails.

        Raises:
            ResumeStateError: not a state, another version, or not every rank.
            StateMismatchError: saved for other files or options (says what changed).
        """
        try:
            plain = json.loads(json.dumps(state))
        except (TypeError, ValueError, RecursionError) as exc:
            raise ResumeStateError(
                f"a resume state holds only JSON values (dicts, lists, strings, numbers, booleans); "
                f"this one does not ({type(exc).__name__}: {exc}); pass what loader.state_dict() returned"
            ) from exc
        expected = self.fingerprint()
        saved = plain.get("fingerprint") if isinstance(plain, dict) else None
        if isinstance(saved, dict):
            expected = _older_options(saved.get("options"), expected)
        checked = ResumeState.parse(plain).check_against(expected).normalized()
        if checked.segments:
            validate(checked.epoch, checked.segments)
        self.reset()
        if not checked.segments:
            self._live.forget()
        else:
            self._live.set(checked.epoch, checked.segments)
        return checked.epoch


def _older_options(saved: object, expected: dict[str, Any]) -> dict[str, Any]:
    """``expected`` for a state saved by an older version: the keys it could not have are left out.

    ``rows_counted`` (whether text rows were counted) is recorded since 0.8: a state without
    it is taken as it was. A filter's lossless key: :func:`_older_filter`.
    """
    options = expected["options"]
    if isinstance(saved, dict) and "rows_counted" in options and "rows_counted" not in saved:
        expected = {**expected, "options": {k: v for k, v in options.items() if k != "rows_counted"}}
    return _older_filter(saved, expected)


def _older_filter(saved: object, expected: dict[str, Any]) -> dict[str, Any]:
    """``expected`` for a state saved before filters had a lossless key (``filters_sha256``).

    Such a state recorded only the filter's text. It is accepted when that text is this
    dataset's filter shown whole; an abbreviated text (pyarrow prints long lists as
    ``...``) cannot tell two filters apart, so the key is then required.
    """
    options = expected["options"]
    if not isinstance(saved, dict) or "filters_sha256" in saved or "filters_sha256" not in options:
        return expected
    text = saved.get("filters")
    if isinstance(text, str) and text == options.get("filters") and lossless_text(text):
        trimmed = {k: v for k, v in options.items() if k != "filters_sha256"}
        return {**expected, "options": trimmed}
    return expected
