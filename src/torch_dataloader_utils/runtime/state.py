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
from typing import Any, NamedTuple, Protocol

import torch
import torch.distributed as dist

from torch_dataloader_utils.errors import ResumeStateError
from torch_dataloader_utils.plan.state import (
    STATE_FORMAT,
    STATE_VERSION,
    check_state,
    fingerprint,
    legacy_files_sha256,
    merge_states,
    normalize,
)
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import FileInfo, World
from torch_dataloader_utils.storage.expressions import lossless_text

__all__ = ["EpochProgress", "ResumeTracker", "Stateful", "Tagged", "complete_state", "gather_state"]


class Tagged(NamedTuple):
    """A batch and its position in the worker's plan (a namedtuple survives pin_memory).

    ``work``: ``(worker, delta, files)``, the worker's timers and counters since its
    previous hand-over and the rows it skipped per file (see :mod:`.workstats`), or ``None``.
    """

    batch: Any
    tag: tuple[int, ...]
    work: tuple[int, tuple[float, ...], tuple[tuple[str, int], ...]] | None = None


@dataclass
class EpochProgress:
    """Cursors of the batches the loop received in the current pass over an epoch.

    Attributes:
        num_workers: Workers of this pass (1 when reading in the main process).
        cursors: ``worker -> (piece, offset)`` after the last batch received from it.
        done: The pass ran to its end (every piece consumed).
        base: The interrupted segments this pass resumed from (``[]`` for a full epoch).
    """

    num_workers: int
    base: list[dict[str, Any]] = field(default_factory=list)
    cursors: dict[int, tuple[int, int]] = field(default_factory=dict)
    done: bool = False

    def record(self, tag: Sequence[int]) -> None:
        """Note that the batch carrying ``tag`` reached the loop."""
        _, worker, workers, piece, offset = (int(v) for v in tag[:5])
        self.num_workers = workers
        self.cursors[worker] = (piece, offset)

    def entry(self, piece_rows: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
        """This rank's part of a state segment (JSON values).

        With ``piece_rows`` (the rows of each piece of each worker of this pass), it also
        says how many rows each worker has left (``"left"``), so a resumed job finds the
        rows of every rank without planning it.
        """
        cursors = [self.cursors.get(w, (0, 0)) for w in range(self.num_workers)]
        out: dict[str, Any] = {
            "num_workers": self.num_workers,
            "cursors": [list(c) for c in cursors],
            "done": self.done,
        }
        if piece_rows is not None and not self.done and len(piece_rows) == self.num_workers:
            out["left"] = [
                sum(rows[piece:]) - offset for rows, (piece, offset) in zip(piece_rows, cursors, strict=True)
            ]
        return out


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
    gets the merged state; save it from rank 0.

    Args:
        source: The loader (or dataset) whose state to gather.
        group: A process group, or ``None`` for the default one.
    """
    state = source.state_dict()
    if not (dist.is_available() and dist.is_initialized()):
        return state
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
    of :func:`~torch_dataloader_utils.plan.resume.check_state`.
    """
    if not isinstance(state, Mapping):
        return state
    segments = state.get("segments")
    if (
        world.num_ranks < 2
        or state.get("format") != STATE_FORMAT
        or not isinstance(segments, list)
        or not segments
        or not isinstance(segments[-1], Mapping)
        or segments[-1].get("num_ranks") != world.num_ranks
        or not isinstance(segments[-1].get("ranks"), Mapping)
        or len(segments[-1]["ranks"]) >= world.num_ranks
        or not (dist.is_available() and dist.is_initialized())
        or dist.get_world_size() != world.num_ranks
    ):
        return state
    states: list[Mapping[str, Any] | None] = [None] * world.num_ranks
    dist.all_gather_object(states, dict(state))
    return merge_states([s for s in states if s is not None])


class ResumeTracker:
    """The resume bookkeeping of one dataset: a loaded state, and what the loop consumed.

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
        self._files = files
        self._options = dict(options)
        self._world = world
        self._seed = seed
        self._fingerprint: dict[str, Any] | None = None
        self.loaded: dict[str, Any] | None = None
        """A loaded state's epoch, segments and token (pickled to workers)."""
        self._token = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self.progress: EpochProgress | None = None
        self.tagging = False
        """Set while a loader from create_dataloader iterates: batches are then tagged."""

    @property
    def token(self) -> int:
        """Which loaded state is live (0: none)."""
        return int(self._token.item())

    def fingerprint(self) -> dict[str, Any]:
        """What a resume state of this dataset is tied to (files digest and options), computed once."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self._files, json.loads(json.dumps(self._options, default=str)))
        return self._fingerprint

    def live_segments(self, epoch: int) -> list[dict[str, Any]] | None:
        """The loaded state's segments, when it is live and for ``epoch``."""
        token = self.token
        if token == 0:
            return None
        if self.loaded is None or self.loaded["token"] != token:
            raise ResumeStateError(
                "load_state_dict() was called after this loader's persistent workers started, so "
                "they cannot see the state; create a new loader (or persistent_workers=False) and "
                "load the state before the first iteration"
            )
        return list(self.loaded["segments"]) if self.loaded["epoch"] == epoch else None

    def on_set_epoch(self, epoch: int) -> None:
        """A new epoch was selected: a loaded state of another epoch is dropped."""
        self.progress = None
        if self.loaded is not None and self.loaded["epoch"] != epoch:
            self._token.fill_(0)

    def begin(self, num_workers: int, epoch: int) -> EpochProgress:
        """Start recording a pass over ``epoch`` read by ``num_workers`` workers."""
        self.progress = EpochProgress(max(1, num_workers), base=self.live_segments(epoch) or [])
        return self.progress

    def consume(self, item: Any) -> Any:
        """Main process: record a tagged batch as consumed and return the batch."""
        if not isinstance(item, Tagged):
            return item
        if self.progress is not None:
            self.progress.record(item.tag)
        return item.batch

    def finish(self) -> None:
        """The pass ran to its end: the next pass is a full epoch."""
        if self.progress is not None:
            self.progress.done = True
        self._token.fill_(0)

    def state_dict(
        self,
        epoch: int,
        piece_rows: Callable[[int, int, list[dict[str, Any]]], Sequence[Sequence[int]] | None] | None = None,
    ) -> dict[str, Any]:
        """This rank's state: what the loop consumed of ``epoch`` (plain JSON values).

        ``piece_rows(epoch, num_workers, segments)`` gives the rows of each piece of each
        worker of this rank in that pass (``None`` when unknown), so the state records
        the rows each worker has left. It is passed here, not kept: the dataset that owns
        this tracker is then freed as soon as it is deleted (no reference cycle).
        """
        progress = self.progress
        segments = progress.base if progress is not None else self.live_segments(epoch) or []
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint(),
            "epoch": epoch,
            "seed": self._seed,
            "world": {"num_ranks": self._world.num_ranks, "rank": self._world.rank},
            "segments": segments,
        }
        if progress is None:
            return state
        rows = None
        if piece_rows is not None and not progress.done:
            rows = piece_rows(epoch, progress.num_workers, progress.base)
        segment = {
            "num_ranks": self._world.num_ranks,
            "ranks": {str(self._world.rank): progress.entry(rows)},
            "index": len(segments),
        }
        state["segments"] = [*segments, segment]
        return normalize(state) if self._world.num_ranks == 1 else state

    def load(self, state: Mapping[str, Any], validate: Callable[[int, list[dict[str, Any]]], object]) -> int:
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
        if isinstance(saved, dict) and "files_digest" not in saved and "files_sha256" in saved:
            expected = {**expected, "files_sha256": legacy_files_sha256(self._files)}  # an older state
        if isinstance(saved, dict):
            expected = _older_filter(saved.get("options"), expected)
        checked = normalize(check_state(plain, expected))
        epoch = int(checked["epoch"])
        segments = checked["segments"]
        if segments:
            validate(epoch, segments)
        self.progress = None
        if not segments:
            self.loaded = None
            self._token.fill_(0)
            return epoch
        token = int(torch.randint(1, 2**62, ()).item())
        self.loaded = {"epoch": epoch, "segments": segments, "token": token}
        self._token.fill_(token)
        return epoch


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
