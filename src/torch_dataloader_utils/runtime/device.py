"""The device stage: batches copied to a GPU ahead of the training step, on their own stream.

With ``device="cuda"`` (or ``"cuda:N"``, a ``torch.device``, ``"auto"``), the loader hands
over batches whose tensors are already on the device. The copies run on a CUDA stream of
the loader's own, queued as soon as a batch (with workers: a group of batches) reaches
the main process, so the copy of batch n+k overlaps step n. A group that travelled in
one buffer is copied as ONE transfer of that buffer, and its tensors are views of the
copy (:func:`~torch_dataloader_utils.transfer.unpack_on`): the main process's work per
batch does not grow with its columns. Strings and Arrow arrays stay on the host.

A handed batch is safe on the caller's current stream: that stream waits for the copy's
event, and the copy's memory is marked as used by it (``record_stream``), so the
caching allocator does not reuse it while the step still reads it. The host memory a
copy reads from (a shared-memory segment) is held until the copy has run.

``device="cpu"`` (or ``"auto"`` without CUDA) leaves batches where they are.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.runtime import env
from torch_dataloader_utils.transfer import BatchGroup, unpack_on

__all__ = ["DEVICE_AHEAD", "DeviceStage", "OnDevice", "copied_ahead", "resolve_device", "to_device"]

DEVICE_AHEAD = 2
"""Batches copied ahead of the one handed over, where the loader reads in its own process
(``num_workers=0``); with workers, the receiving thread copies each group as it arrives
(``RECEIVE_AHEAD`` groups ahead)."""

T = TypeVar("T")

_ALLOWED = "'cuda', 'cuda:N', a torch.device, 'auto' (this process's local-rank GPU) or 'cpu'"


def resolve_device(value: object) -> torch.device | None:
    """``device`` as a ``torch.device`` (``None``: no device stage), checked against this machine.

    ``"auto"`` is the GPU of this process's local rank (``LOCAL_RANK``, else the current
    CUDA device) when CUDA is available, else the CPU. ``"cuda"`` is the current CUDA
    device.

    Raises:
        ConfigError: not a device, a device type other than CPU and CUDA, CUDA without a
            CUDA GPU, or a GPU index this machine does not have (naming the value and fix).
    """
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        local = env.local_rank()
        index = torch.cuda.current_device() if local is None else local
        return _checked_cuda(torch.device("cuda", index), value)
    if not isinstance(value, (str, torch.device)):
        raise ConfigError(f"device={value!r} must be {_ALLOWED}; e.g. device='cuda:0'")
    try:
        device = torch.device(value.strip().lower() if isinstance(value, str) else value)
    except (RuntimeError, ValueError):
        raise ConfigError(f"device={value!r} is not a device; pass {_ALLOWED}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ConfigError(
            f"device={value!r} is a {device.type!r} device; the loader's device stage copies to {_ALLOWED}. "
            "Leave device unset and move the batches yourself"
        )
    return _checked_cuda(device, value)


def _checked_cuda(device: torch.device, shown: object) -> torch.device:
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={shown!r} needs a CUDA GPU, but torch.cuda.is_available() is False on this "
            f"machine (torch {torch.__version__}); pass device='cpu' or device='auto' (the CPU "
            "when there is no GPU), or leave device unset"
        )
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if device.index is None else device.index
    if not 0 <= index < count:
        raise ConfigError(
            f"device={shown!r} names GPU {index}, but this machine has {count} (cuda:0 to "
            f"cuda:{count - 1}); pass one of those, or device='auto' for the local rank's GPU"
        )
    return torch.device("cuda", index)


def to_device(obj: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """``obj`` with every tensor (dict / list / tuple / named tuple nesting) copied to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, device, non_blocking)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(v, device, non_blocking) for v in obj))
    if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], (torch.Tensor, dict, list, tuple)):
        return type(obj)(to_device(v, device, non_blocking) for v in obj)
    return obj  # strings, Arrow arrays, numbers: on the host


def _device_tensors(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    """The device tensors of a copied batch (a jagged tensor's values and offsets)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_nested:
            out.extend(
                t for t in (getattr(obj, "_values", None), getattr(obj, "_offsets", None)) if t is not None
            )
        else:
            out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _device_tensors(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _device_tensors(v, out)
    return out


class OnDevice:
    """Batches whose copy to the device is queued: the copy's event, and what it needs kept.

    Attributes:
        batches: The batches on the device (a group, or one batch in a list).
        group: Whether they are a group (else one batch).
        event: Recorded on the copy stream after the copy.
        used: The device memory the batches are views of (one buffer per group).
        host: What the copy reads from, held until the copy has run.
    """

    __slots__ = ("batches", "event", "group", "host", "used")

    def __init__(
        self, batches: list[Any], event: Any, used: list[torch.Tensor], host: Any, group: bool
    ) -> None:
        self.batches = batches
        self.event = event
        self.used = used
        self.host = host
        self.group = group


class DeviceStage:
    """Copies batches to a CUDA ``device`` on a stream of its own, and hands them over safely.

    :meth:`copy` (any thread) queues a group's or a batch's copy; :meth:`hand` (the
    loop's thread) makes the current stream wait for it before the batches are used.

    Args:
        device: A CUDA device.
    """

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"a device stage copies to a CUDA device, got {device}")
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._held: collections.deque[tuple[Any, Any]] = collections.deque()

    def copy(self, item: Any) -> OnDevice:
        """Queue the copy of ``item`` (a received :class:`BatchGroup`, or one batch)."""
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            if isinstance(item, BatchGroup) and item.source is not None:
                group = unpack_on(item.source, self.device)
                host, used = item.source[0], [group.source[1]]  # type: ignore[index]
                batches: list[Any] = group
            else:
                host = item
                batches = (
                    [to_device(b, self.device) for b in item]
                    if isinstance(item, BatchGroup)
                    else [to_device(item, self.device)]
                )
                used = _device_tensors(batches, [])
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self.stream)
        return OnDevice(batches, event, used, host, isinstance(item, BatchGroup))

    def hand(self, item: OnDevice) -> list[Any]:
        """``item``'s batches, safe to use on the current stream."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(item.event)
        for tensor in item.used:
            tensor.record_stream(current)
        self._held.append((item.event, item.host))
        while self._held and self._held[0][0].query():
            self._held.popleft()  # that copy has run: its host memory may be reused
        return item.batches

    def close(self) -> None:
        """Wait for the queued copies, then let their host memory go."""
        self.stream.synchronize()
        self._held.clear()


def copied_ahead(items: Iterator[T], copy: Callable[[T], T], ahead: int = DEVICE_AHEAD) -> Iterator[T]:
    """``items`` with ``copy`` applied ``ahead`` items before each is handed on (one thread)."""
    queued: collections.deque[T] = collections.deque()
    for item in items:
        queued.append(copy(item))
        if len(queued) > ahead:
            yield queued.popleft()
    while queued:
        yield queued.popleft()
