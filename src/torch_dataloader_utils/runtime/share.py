"""Reading metadata once per job: rank 0 reads, every other rank receives it.

With an initialized ``torch.distributed`` process group of more than one rank,
:func:`from_rank0` runs the metadata read on rank 0 only and broadcasts the result
(``broadcast_object_list`` over a gloo group, so it works beside NCCL too). An error on
rank 0 is broadcast as well and raised on every rank, so no rank is left waiting.
Without a process group each rank reads for itself, and plans stay identical because
planning depends on values alone.

Every rank must build its dataset (the broadcast is a collective call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

__all__ = ["all_gather", "from_rank0"]

T = TypeVar("T")

_GLOO_GROUPS: dict[int, Any] = {}


def _gloo_group() -> Any:
    """The default group when it is gloo, else a gloo group over all ranks (made once)."""
    if dist.get_backend() == "gloo":
        return None
    key = id(dist.group.WORLD)  # the default group (public handle)
    group = _GLOO_GROUPS.get(key)
    if group is None:
        group = dist.new_group(backend="gloo")
        _GLOO_GROUPS[key] = group
    return group


def from_rank0(read: Callable[[], T]) -> T:
    """``read()`` on rank 0, its result (or its error) on every rank.

    Args:
        read: The metadata read; its result must pickle.

    Raises:
        Whatever ``read`` raised on rank 0, on every rank.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return read()
    group = _gloo_group()
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = (True, read())
        except Exception as exc:  # sent to the other ranks, then raised here too
            box[0] = (False, exc)
    dist.broadcast_object_list(box, src=0, group=group)
    ok, payload = box[0]
    if not ok:
        raise payload
    return payload  # type: ignore[no-any-return]


def all_gather(value: T, group: Any = None) -> list[T]:
    """Every rank's ``value`` (in rank order); ``[value]`` without a process group.

    A collective call: every rank of ``group`` must call it. Objects travel over gloo
    (the default group when it is gloo, else a gloo group over all ranks), so it works
    beside NCCL without setting a CUDA device.

    Args:
        value: What this rank contributes; it must pickle.
        group: A process group, or ``None`` for the default one (over NCCL, a gloo
            group over all ranks is used instead).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    if group is None:
        group = _gloo_group()
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out
