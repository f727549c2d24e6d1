"""Collectives for metadata: rank 0 reads and broadcasts; every rank reads a share and all gather.

With an initialized ``torch.distributed`` process group of more than one rank,
:func:`from_rank0` runs a read on rank 0 only and broadcasts the result
(``broadcast_object_list`` over a gloo group, so it works beside NCCL too), and
:class:`TorchExchange` adds :meth:`~TorchExchange.all_gather` of byte buffers (Arrow
IPC): each rank reads the footers of its share of the files and every rank receives
all shares. An error on one rank travels with the results and is raised on every rank,
so no rank is left waiting. Without a process group each rank reads for itself
(:func:`exchange` returns discovery's ``LOCAL``), and plans stay identical because
planning depends on values alone.

Every rank must build its dataset (these are collective calls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from torch_dataloader_utils.discovery.exchange import LOCAL, Exchange
from torch_dataloader_utils.errors import DistributedConfigError, RankFailedError
from torch_dataloader_utils.plan.types import World
from torch_dataloader_utils.runtime import env

__all__ = ["TorchExchange", "all_gather", "all_ok", "exchange", "from_rank0", "job_world"]

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


class TorchExchange:
    """The :class:`~torch_dataloader_utils.discovery.exchange.Exchange` of the default process group.

    Buffers travel as uint8 tensors over gloo (a gloo group is made beside NCCL): the
    sizes first (one int64 per rank), then every buffer padded to the largest.
    """

    @property
    def rank(self) -> int:
        """This process's rank in the default group."""
        return int(dist.get_rank())

    @property
    def size(self) -> int:
        """The default group's size."""
        return int(dist.get_world_size())

    def from_rank0(self, read: Callable[[], T]) -> T:
        """See :func:`from_rank0`."""
        return from_rank0(read)

    def all_gather(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload``, in rank order, on every rank."""
        group = _gloo_group()
        size = self.size
        mine = torch.tensor([len(payload)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
        dist.all_gather(sizes, mine, group=group)
        lengths = [int(t.item()) for t in sizes]
        longest = max(lengths)
        if longest == 0:
            return [b"" for _ in range(size)]
        buffer = torch.zeros(longest, dtype=torch.uint8)
        if payload:
            buffer[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        received = [torch.empty(longest, dtype=torch.uint8) for _ in range(size)]
        dist.all_gather(received, buffer, group=group)
        return [t[:n].numpy().tobytes() for t, n in zip(received, lengths, strict=True)]


def exchange() -> Exchange:
    """The exchange of this process: over the process group when one of several ranks is up."""
    return TorchExchange() if _grouped() else LOCAL


def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextmanager
def job_world(timeout_s: float) -> Iterator[World]:
    """The ranks of a job run by a tool (``reshard``): an initialized process group, or one made here.

    With an initialized process group, its ranks. Launched by torchrun (``RANK`` and
    ``WORLD_SIZE`` set, more than one rank) without one, a gloo group is started for the
    duration of the block (timeout ``timeout_s``: how long a rank waits for the others at
    a barrier) and destroyed after it. Otherwise a single process.

    Raises:
        DistributedConfigError: the launcher's variables are inconsistent, or the group
            cannot start (``MASTER_ADDR`` / ``MASTER_PORT`` missing).
    """
    if dist.is_available() and dist.is_initialized():
        yield World(dist.get_world_size(), dist.get_rank())
        return
    detected = env.detect()
    if detected.num_ranks == 1:
        yield World(1, 0)
        return
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    except (ValueError, RuntimeError) as exc:
        raise DistributedConfigError(
            f"RANK={detected.rank} and WORLD_SIZE={detected.num_ranks} are set but no process group "
            f"could start ({exc}); launch with torchrun (it sets MASTER_ADDR / MASTER_PORT) or "
            "initialize torch.distributed first"
        ) from exc
    try:
        yield World(dist.get_world_size(), dist.get_rank())
    finally:
        dist.destroy_process_group()


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
    if group is None:
        if not _grouped():
            return [value]
        group = _gloo_group()
    elif not (dist.is_available() and dist.is_initialized()):
        return [value]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


def all_ok(error: BaseException | None) -> None:
    """A barrier that also tells every rank whether any rank failed before it.

    Every rank calls it once its part of a step is done, with the exception it hit or
    ``None``. It returns on every rank when all succeeded; otherwise the failed rank
    raises its own error and the others raise :class:`RankFailedError` naming it, so no
    rank goes on (or waits) alone.
    """
    report = None if error is None else f"{type(error).__name__}: {error}"
    reports = all_gather(report)
    if error is not None:
        raise error
    failed = [(rank, r) for rank, r in enumerate(reports) if r is not None]
    if failed:
        rank, message = failed[0]
        raise RankFailedError(f"rank {rank} failed, so this rank stops too: {message}")
