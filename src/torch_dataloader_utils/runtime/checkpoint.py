"""The loader's state for checkpointers that save from one rank or store entries by key.

Two ways checkpointers store a loader's state go wrong on several ranks:

* Accelerate's ``save_state`` (``register_for_checkpointing``), Lightning and many
  hand-written loops write what rank 0 holds: rank 0's cursors alone, so a resumed
  rank 1 has nothing to resume from (``ResumeStateError``).
* ``torch.distributed.checkpoint`` (DCP) keeps one copy of an entry that has the same
  key on every rank (it takes it for a replicated value), and loads into the keys of
  the state dict each rank passes: a loader's state has the same keys on every rank
  but different values, and a fresh loader's state has fewer entries than a mid-epoch
  one ("Missing key in checkpoint state_dict").

:class:`GatheredState` answers both: its ``state_dict()`` is every rank's state merged
(:func:`~torch_dataloader_utils.runtime.state.gather_state`, a collective: the
checkpointer calls it on every rank at the same step, as both do), held as one JSON
string under a fixed key, so every rank saves the same entry and any rank, in a job of
any size, resumes from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from torch_dataloader_utils.errors import ResumeStateError
from torch_dataloader_utils.plan.state_kind import GATHERED_FORMAT as GATHERED
from torch_dataloader_utils.plan.state_kind import not_a_state
from torch_dataloader_utils.runtime.state import gather_state

__all__ = ["GATHERED_FORMAT", "GatheredState"]

GATHERED_FORMAT = GATHERED
"""The ``format`` entry of a :class:`GatheredState` state dict."""


class _Resumable(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class GatheredState:
    """A ``torch.distributed.checkpoint.stateful.Stateful`` holding every rank's loader state, merged.

    Example (Accelerate, and DCP)::

        accelerator.register_for_checkpointing(GatheredState(loader))
        accelerator.save_state(path)          # on every rank
        accelerator.load_state(path)          # on every rank, any number of ranks

        dcp.save({"model": model, "data": GatheredState(loader)}, checkpoint_id=path)
        dcp.load({"model": model, "data": GatheredState(loader)}, checkpoint_id=path)

    Args:
        loader: The loader (or dataset) of ``create_dataloader``.
        group: The process group to gather over (``None``: the default one).
    """

    def __init__(self, loader: _Resumable, group: Any = None) -> None:
        self.loader = loader
        self.group = group

    def state_dict(self) -> dict[str, Any]:
        """``{"format": ..., "state": "<every rank's state merged, as JSON>"}``: call it on every rank."""
        return {"format": GATHERED_FORMAT, "state": json.dumps(gather_state(self.loader, self.group))}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume the loader from the merged state (on every rank, any number of ranks).

        Raises:
            ResumeStateError: ``state_dict`` was not written by a ``GatheredState``.
        """
        if state_dict.get("format") != GATHERED_FORMAT:
            raise not_a_state(state_dict, GATHERED_FORMAT)
        if not isinstance(state_dict.get("state"), str):
            raise ResumeStateError(
                f"not a GatheredState: its 'state' is a {type(state_dict.get('state')).__name__}, not the "
                "JSON string GatheredState(loader).state_dict() returns; pass that, unchanged"
            )
        self.loader.load_state_dict(json.loads(state_dict["state"]))
