"""What the training loop consumed, tracked in the main process; gathering states of ranks.

Workers tag every batch with its position in their plan: ``(token, worker, workers,
piece, offset)`` — after this batch, the worker's first ``piece`` pieces and the first
``offset`` rows of piece ``piece`` have been yielded. The loader strips the tag in the
main process at the moment it hands the batch to the loop and records it in
:class:`EpochProgress`. So a batch counts as consumed exactly when the loop received
it: batches prefetched by workers, or sitting in the DataLoader's queues, are not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch.distributed as dist

from torch_dataloader_utils.plan.resume import merge_states

__all__ = ["EpochProgress", "Stateful", "Tagged", "gather_state"]


class Tagged(NamedTuple):
    """A batch and its position in the worker's plan (a namedtuple survives pin_memory)."""

    batch: Any
    tag: tuple[int, int, int, int, int]


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

    def record(self, tag: tuple[int, int, int, int, int] | list[int]) -> None:
        """Note that the batch carrying ``tag`` reached the loop."""
        _, worker, workers, piece, offset = (int(v) for v in tag)
        self.num_workers = workers
        self.cursors[worker] = (piece, offset)

    def entry(self) -> dict[str, Any]:
        """This rank's part of a state segment (JSON values)."""
        return {
            "num_workers": self.num_workers,
            "cursors": [list(self.cursors.get(w, (0, 0))) for w in range(self.num_workers)],
            "done": self.done,
        }


class Stateful(Protocol):
    """Anything with ``state_dict()`` (a loader from ``create_dataloader``, or its dataset)."""

    def state_dict(self) -> dict[str, Any]:
        """The resume state of this rank."""
        ...


def gather_state(source: Stateful, group: Any = None) -> dict[str, Any]:
    """The state of every rank, merged: call it on all ranks at the same step.

    Uses ``torch.distributed.all_gather_object`` (any backend; with NCCL set the
    current CUDA device first) and :func:`~torch_dataloader_utils.plan.resume.merge_states`.
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
