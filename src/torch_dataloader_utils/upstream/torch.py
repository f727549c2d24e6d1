"""torch: a shared-memory byte buffer without a copy; jagged nested tensors, quietly.

The public ``torch.empty(n, dtype=torch.uint8).share_memory_()`` allocates ordinary
memory and then copies it into a new shared segment. For the ~8 MiB buffers a worker
fills with a group of batches, that copy doubled the cost of the allocation (2.1 ms ->
4.5 ms per 8 MiB on the project's machine, torch 2.13.0), on every transfer.
``UntypedStorage._new_shared`` allocates the shared segment directly.

Jagged nested tensors (torch 2.13.0) are built by their private class (see :func:`jagged`).
The first operation on one in a process imports
``torch.distributed.tensor`` (about 1-2 s on the project's machine; sympy and torch.fx
come with it), and torch.fx logs a one-time warning about ``is_fx_tracing`` on the way.
:func:`prepare_jagged` pays that import once, with that one log record filtered out.
Their cached min / max lengths are stored without ``torch._dynamo`` (see
:func:`_with_seqlens`), whose import would cost another second per process.
Taking a jagged tensor apart for a transfer reads its private ``_values`` / ``_offsets``
attributes, so that a worker never runs a nested-tensor operation (which would import
the same modules there).

Page-locking memory that is already allocated (a shared-memory segment) has no public
torch API; ``torch.cuda.cudart()`` exposes the CUDA runtime's ``cudaHostRegister`` and
``cudaHostUnregister`` (:class:`CudaHostPinner`).

``next()`` on a DataLoader iterator opens a profiler range around each item, seen only
by a running profiler; :func:`loader_items` calls the iterator's private ``_next_data``
when none runs.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "CudaHostPinner",
    "jagged",
    "jagged_parts",
    "loader_items",
    "new_shared_bytes",
    "prepare_jagged",
    "seqlens",
]


def new_shared_bytes(nbytes: int) -> torch.Tensor:
    """A 1-d ``uint8`` tensor of ``nbytes`` bytes in shared memory (contents undefined)."""
    try:
        storage = torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call]
    except (AttributeError, RuntimeError):  # the private API is gone: the public path, one copy more
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call,no-any-return]
    return torch.empty(0, dtype=torch.uint8).set_(storage)


_REGISTER_PORTABLE = 1


class CudaHostPinner:
    """Page-locks host ranges with ``cudaHostRegister``, once each, and keeps count of them.

    ``registered`` maps each range's address to its size until it is unregistered: what
    is left there is page-locked memory not yet given back.
    """

    def __init__(self) -> None:
        self._cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        self.registered: dict[int, int] = {}

    def register(self, address: int, nbytes: int) -> None:
        """Page-lock ``nbytes`` bytes at ``address``.

        Raises:
            RuntimeError: CUDA refused (the error code named).
        """
        # cudaHostRegisterPortable: pinned for every CUDA context (any GPU of the process).
        code = self._cudart.cudaHostRegister(address, nbytes, _REGISTER_PORTABLE)
        if int(getattr(code, "value", code)) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes at {address:#x} failed: {code}")
        self.registered[address] = nbytes

    def unregister(self, address: int) -> None:
        """Release the range registered at ``address`` (nothing if it is not registered)."""
        if self.registered.pop(address, None) is not None:
            self._cudart.cudaHostUnregister(address)

    def synchronize(self) -> None:
        """Wait for every queued copy of this process (before the ranges are released)."""
        torch.cuda.synchronize()

    def fence(self) -> Any:
        """An event recorded on this thread's current stream (of the current device)."""
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        return event

    def passed(self, fence: Any) -> bool:
        """Whether the event has completed (the copies queued before it have run)."""
        return bool(fence.query())


_FX_LOGGER = "torch.fx._symbolic_trace"
_FX_MESSAGE = "is_fx_tracing will return true"
_prepared = False
_lock = threading.Lock()


class _DropFxNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_FX_MESSAGE)


def prepare_jagged() -> None:
    """Import what jagged nested tensors need, once per process, without torch.fx's notice.

    torch logs the notice at most once per process (it is cached), so filtering it
    while the first nested tensor is built removes it for good; nothing else is hidden.
    """
    global _prepared
    if _prepared:
        return
    with _lock:
        if _prepared:
            return
        logger = logging.getLogger(_FX_LOGGER)
        quiet = _DropFxNotice()
        logger.addFilter(quiet)
        try:
            probe = torch.nested.nested_tensor_from_jagged(
                torch.zeros(1), torch.tensor([0, 1], dtype=torch.int64)
            )
            probe.values()
        finally:
            logger.removeFilter(quiet)
        _prepared = True


def _constructor() -> Any:
    try:
        from torch.nested._internal.nested_tensor import NestedTensor
    except ImportError:  # pragma: no cover - torch moved it: the public path
        return None
    return NestedTensor


_NestedTensor = _constructor()
_DYNAMO = "torch._dynamo"


def jagged(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A jagged nested tensor ``[len(offsets) - 1, j, *values.shape[1:]]`` over ``values`` (no copy).

    Built by ``NestedTensor(values, offsets)``, torch 2.13's own class: about 4x cheaper
    per batch than ``torch.nested.nested_tensor_from_jagged`` (22 vs 87 us on the
    project's machine), which builds the same tensor through an autograd view op.
    The result is not an autograd view of ``values`` (batches carry no gradient).

    Args:
        values: The rows' items, one after the other (first dimension: items).
        offsets: ``int64`` offsets into ``values``, starting at 0.
    """
    if not _prepared:
        prepare_jagged()
    shortest, longest = seqlens(offsets)
    if _NestedTensor is not None:
        try:
            return _with_seqlens(values, offsets, shortest, longest)
        except TypeError:  # pragma: no cover - another signature: the public path
            pass
    return torch.nested.nested_tensor_from_jagged(
        values,
        offsets,
        min_seqlen=shortest if len(offsets) > 1 else None,
        max_seqlen=longest if len(offsets) > 1 else None,
    )


def _with_seqlens(values: torch.Tensor, offsets: torch.Tensor, shortest: int, longest: int) -> torch.Tensor:
    """``NestedTensor(values, offsets)`` with its min / max seqlen cached, importing nothing more.

    Handed to the constructor (``_metadata_cache=``), the cached lengths are marked
    dynamic for ``torch.compile`` through ``torch._dynamo.mark_dynamic``: the first such
    call imports ``torch._dynamo`` (and sympy), 0.5-1.6 s per process on the project's
    machine, workers included. Without ``torch.compile`` in the process (``torch._dynamo``
    not imported) nothing can read that mark, so the lengths go into the tensor's cache
    after it is built, unmarked, as torch itself caches lengths it computes
    (``NestedTensor._get_max_seqlen``). With ``torch._dynamo`` imported, torch's own path
    marks them, at no import cost.
    """
    if len(offsets) < 2:
        return _NestedTensor(values, offsets)  # type: ignore[no-any-return]
    if _DYNAMO in sys.modules:
        cache = {"min_seqlen": _stored(shortest), "max_seqlen": _stored(longest)}
        return _NestedTensor(values, offsets, _metadata_cache=cache)  # type: ignore[no-any-return]
    nt = _NestedTensor(values, offsets)
    nt._metadata_cache["min_seqlen"] = _stored(shortest)
    nt._metadata_cache["max_seqlen"] = _stored(longest)
    return nt  # type: ignore[no-any-return]


def seqlens(offsets: torch.Tensor) -> tuple[int, int]:
    """``(shortest, longest)`` row of a jagged layout, from its offsets (``(0, 0)`` without rows).

    Handed to the nested tensor, so that ``torch.nested.to_padded_tensor`` pads to the
    longest row (without it torch 2.13 pads every row to the batch's total item count)
    and attention kernels get their bounds without a pass over the lengths.
    """
    if len(offsets) < 2:
        return 0, 0
    shortest, longest = torch.aminmax(offsets[1:] - offsets[:-1])
    return int(shortest), int(longest)


def _stored(value: int) -> torch.Tensor:
    """A sequence length as torch's nested tensors cache it: the size of an empty tensor."""
    return torch.empty(value, 0)


def jagged_parts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(values, offsets)`` of a jagged nested tensor without holes, else ``None``.

    Reads the attributes torch 2.13's ``NestedTensor`` keeps them in, so no
    nested-tensor operation runs (see the module docstring).
    """
    if not t.is_nested or t.layout is not torch.jagged:
        return None
    values = getattr(t, "_values", None)
    offsets = getattr(t, "_offsets", None)
    if not isinstance(values, torch.Tensor) or not isinstance(offsets, torch.Tensor):
        return None
    if getattr(t, "_lengths", None) is not None or getattr(t, "_ragged_idx", 1) != 1:
        return None
    return values, offsets


def loader_items(source: Iterator[Any]) -> Iterator[Any]:
    """The items of a DataLoader iterator, without its per-item profiler range when no profiler runs.

    ``next()`` on torch's iterator opens a ``record_function`` range around each item
    (about 9 us on the project's machine, per group of batches); it is only seen by a
    running profiler. With none, the iterator's own ``_next_data`` is called (what
    ``__next__`` calls inside the range); with one, or where these private names are
    gone, ``next()``.
    """
    step = getattr(source, "_next_data", None)
    profiling = getattr(torch._C._autograd, "_profiler_enabled", None)
    if step is None or profiling is None or getattr(source, "_sampler_iter", None) is None:
        yield from source
        return
    while True:
        try:
            item = next(source) if profiling() else step()
        except StopIteration:
            return
        yield item
