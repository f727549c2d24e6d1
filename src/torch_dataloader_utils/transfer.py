"""Batches across processes: one buffer per batch (or group of batches) from a worker.

Packing: one buffer per batch for the trip from a worker.

Measured on 2 cores (docs/benchmarks.md): sending each tensor through torch's shared
memory costs a file-descriptor handshake per tensor, and even one shared-memory
segment per batch costs more than copying a batch of a few hundred KiB through the
worker's pipe; for several MiB, one segment wins. So a batch's tensors (and the
buffers of its string columns) are copied into ONE buffer: a bytearray pickled in-band
up to PIPE_MAX_BYTES, one shared-memory segment above. Groups of batches
(runtime.loader.ResumableDataLoader) are sized to take the shared-memory path.

Ragged data never travels as a tensor (or a Python object) per row: a jagged list
column (:class:`~torch_dataloader_utils.convert.JaggedParts`, or a jagged nested tensor
a ``collate_fn`` returned) travels as its values and offsets, a string column as its
Arrow offsets and bytes (and validity bitmap), and the receiving process rebuilds the
nested tensor, the ``list[str]`` or the Arrow array over the received buffer. Named
tuples (:class:`~torch_dataloader_utils.convert.PaddedList`,
:class:`~torch_dataloader_utils.convert.FlatList`) keep their type.

Segments used again (:class:`SegmentPool`): a fresh shared-memory segment costs its
page faults twice, in the worker that fills it and in the main process that reads it
(an 8 MiB segment: about 18 ms to create and fill on the project's machine, against
0.3 ms to fill one whose pages are already there). So the loader of
``create_dataloader`` keeps a few segments per worker for its whole life: a worker
fills a free one and sends only its number; the main process builds the batch over its
own mapping of the segment and marks the segment free again once nothing refers to the
batch any more (a finalizer on the array every tensor of the group is a view of).
Nothing a user holds is overwritten: a segment a batch still uses is not free, and a
worker that finds none free takes a fresh segment as before.
"""

from __future__ import annotations

import itertools
import os
import threading
import warnings
import weakref
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from torch_dataloader_utils.convert import DeferredText, JaggedParts, as_tensor, text_out, text_parts
from torch_dataloader_utils.upstream.torch import jagged, jagged_parts, new_shared_bytes

__all__ = [
    "PIPE_MAX_BYTES",
    "BatchGroup",
    "PackedBatch",
    "PooledBatch",
    "SegmentPool",
    "SegmentWriter",
    "pack",
    "pack_group",
    "unpack",
]

_ALIGN = 64

PIPE_MAX_BYTES = 1 << 20
"""Packed batches up to this size travel in the pipe; larger ones in shared memory."""


class PackedBatch:
    """A batch whose tensors share one buffer; unpickles as the plain structure."""

    __slots__ = ("buffer", "layout")

    def __init__(self, buffer: bytearray | torch.Tensor, layout: Any) -> None:
        self.buffer = buffer
        self.layout = layout

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # bytes, not bytearray: unpickling a bytearray copies the data a second time.
        buffer = bytes(self.buffer) if isinstance(self.buffer, bytearray) else self.buffer
        return unpack, (buffer, self.layout)


class BatchGroup(list[Any]):
    """Consecutive batches of one worker that travelled together; the loader flattens it."""


class _Unpackable(Exception):
    """A leaf that cannot go into a byte buffer (a CUDA or sparse tensor...)."""


def _is_plain_list(obj: Any) -> bool:
    return isinstance(obj, list) and (not obj or not isinstance(obj[0], (torch.Tensor, dict, list, tuple)))


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _is_text_array(obj: Any) -> bool:
    return isinstance(obj, pa.Array) and (
        pa.types.is_string(obj.type)
        or pa.types.is_large_string(obj.type)
        or pa.types.is_binary(obj.type)
        or pa.types.is_large_binary(obj.type)
    )


def pack(obj: Any) -> Any:
    """Pack every tensor of ``obj`` (dict / list / tuple nesting) into one buffer.

    :class:`DeferredText` columns and Arrow string / binary arrays travel as their
    Arrow buffers, :class:`JaggedParts` and jagged nested tensors as values + offsets,
    all in the same buffer. Returns ``obj`` unchanged when it holds none of these (or a
    CUDA / sparse tensor, or another nested tensor).
    """
    try:
        return _pack(obj, group=False)
    except _Unpackable:
        return obj


def pack_group(items: list[Any], pool: SegmentWriter | None = None) -> Any:
    """Pack several batches into one buffer; it unpickles as a :class:`BatchGroup`.

    Used between a worker and a loader that knows to flatten groups (see
    ``runtime.loader``): one transfer for several small batches. With ``pool`` (the
    worker's share of its loader's :class:`SegmentPool`), a buffer too large for the
    pipe goes into a free segment of the pool, if there is one.
    """
    try:
        return _pack(items, group=True, pool=pool)
    except _Unpackable:
        return BatchGroup(items)


def _np_dtype(dtype: torch.dtype) -> np.dtype[Any] | None:
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):  # bfloat16 and other types numpy lacks
        return None


_NP_DTYPES: dict[torch.dtype, np.dtype[Any] | None] = {}


class _Packer:
    """Walks a structure once: its layout, and the byte ranges to copy into the buffer."""

    def __init__(self) -> None:
        self.parts: list[tuple[int, Any, int]] = []  # (offset, source, nbytes)
        self.total = 0
        self.leaves = 0

    def put(self, src: Any, nbytes: int) -> int:
        at = self.total
        if nbytes:
            self.parts.append((at, src, nbytes))
        self.total += _aligned(nbytes)
        return at

    def tensor(self, o: torch.Tensor) -> Any:
        if o.is_cuda or o.is_sparse or o.is_nested:
            raise _Unpackable
        self.leaves += 1
        nbytes = o.numel() * o.element_size()
        src = o.detach().contiguous().view(-1).view(torch.uint8).numpy() if nbytes else b""
        at = self.put(src, nbytes)
        if o.dtype not in _NP_DTYPES:
            _NP_DTYPES[o.dtype] = _np_dtype(o.dtype)
        np_dtype = _NP_DTYPES[o.dtype]
        if np_dtype is not None:
            # numpy views of the received buffer: cheaper than torch slicing.
            return ("n", at, np_dtype, o.numel(), tuple(o.shape))
        return ("t", at, o.dtype, tuple(o.shape), nbytes)

    def text(self, array: Any) -> tuple[Any, ...]:
        offsets, data = text_parts(array)
        self.leaves += 1
        at = self.put(offsets, offsets.nbytes)
        data_at = self.put(data, data.nbytes)
        valid = None
        if array.null_count:
            bitmap = array.is_valid().buffers()[1]  # a fresh bitmap starting at bit 0
            valid = (self.put(bitmap, bitmap.size), bitmap.size, array.null_count)
        return (at, offsets.dtype.str, len(array), data_at, data.nbytes, array.type, valid)

    def lay(self, o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            if o.is_nested:
                parts = jagged_parts(o)
                if parts is None:
                    raise _Unpackable
                return self.jagged(*parts)
            return self.tensor(o)
        if isinstance(o, JaggedParts):
            return self.jagged(o.values, o.offsets)
        if isinstance(o, DeferredText):
            return ("s", self.text(o.array), o.to_torch)
        if _is_text_array(o):
            return ("a", self.text(o))
        if isinstance(o, dict):
            return ("d", [(k, self.lay(v)) for k, v in o.items()])
        if isinstance(o, tuple) and hasattr(o, "_fields") and "<locals>" not in type(o).__qualname__:
            return ("nt", type(o), [self.lay(v) for v in o])  # a named tuple keeps its type
        if isinstance(o, (list, tuple)) and not _is_plain_list(o):
            return ("l" if isinstance(o, list) else "u", [self.lay(v) for v in o])
        return ("o", o)

    def jagged(self, values: torch.Tensor, offsets: torch.Tensor) -> Any:
        lo, hi = int(offsets[0]), int(offsets[-1])
        if lo or hi != len(values):  # send only the rows' items
            values, offsets = values[lo:hi], offsets - lo
        return ("j", self.tensor(values), self.tensor(offsets))


def _pack(obj: Any, group: bool, pool: SegmentWriter | None = None) -> Any:
    packer = _Packer()
    layout = ("g", [packer.lay(item) for item in obj]) if group else packer.lay(obj)
    if not packer.leaves:
        if group:
            return BatchGroup(obj)
        return obj
    total = packer.total
    buffer: bytearray | torch.Tensor
    result: PackedBatch | PooledBatch
    taken = pool.take(total) if pool is not None and total > PIPE_MAX_BYTES else None
    if taken is not None:
        slot, dst, new = taken
        result = PooledBatch(pool.pool_id, slot, new, layout)  # type: ignore[union-attr]
    elif total <= PIPE_MAX_BYTES:
        buffer = bytearray(total)
        dst = np.frombuffer(buffer, dtype=np.uint8)
        result = PackedBatch(buffer, layout)
    else:
        buffer = new_shared_bytes(total)
        dst = buffer.numpy()
        result = PackedBatch(buffer, layout)
    for at, src, nbytes in packer.parts:
        dst[at : at + nbytes] = np.frombuffer(src, dtype=np.uint8, count=nbytes)
    return result


# -- segments used again ----------------------------------------------------------

_FREE, _BUSY = 0, 1
_SEGMENT_ROUND = 1 << 20
_POOLS: weakref.WeakValueDictionary[int, SegmentPool] = weakref.WeakValueDictionary()
_pool_ids = itertools.count(1)


def _segment_bytes(total: int) -> int:
    """Room for ``total`` bytes and a quarter more (pages never written cost nothing)."""
    return -(-(total + total // 4) // _SEGMENT_ROUND) * _SEGMENT_ROUND


class SegmentPool:
    """Shared-memory segments a loader's workers fill again and again.

    The main process (a loader) owns the pool; its workers get it when they start
    (inherited under ``fork``, pickled under ``spawn`` / ``forkserver``, as torch shares
    tensors). Worker ``w`` uses slots ``w * slots_per_worker`` to ``(w + 1) *
    slots_per_worker - 1``; a shared byte per slot says whether it is free. A worker
    marks a free slot busy, fills its segment and sends the slot's number
    (:class:`PooledBatch`); it makes the slot's segment itself the first time (and when
    a group outgrows it), and then sends the segment along, once. The main process
    marks the slot free when the last reference to the group's memory is gone.

    One iteration at a time may use the pool (:meth:`lease`): a second iteration of the
    same loader while the first one's workers live goes without.

    Args:
        workers: The loader's ``num_workers``.
        slots_per_worker: Segments per worker; a worker that finds none free sends a
            fresh segment, as without a pool.
    """

    def __init__(self, workers: int, slots_per_worker: int) -> None:
        self.pool_id = next(_pool_ids)
        self.slots_per_worker = slots_per_worker
        self.flags = new_shared_bytes(workers * slots_per_worker)
        self.flags.zero_()
        self.segments: list[torch.Tensor | None] = [None] * (workers * slots_per_worker)
        self._owner_pid = os.getpid()
        self._flags = self.flags.numpy()
        self._held: set[int] = set()
        self._leased = False
        self._lock = threading.Lock()
        _POOLS[self.pool_id] = self

    # -- main process ---------------------------------------------------------------
    def lease(self) -> bool:
        """Take the pool for an iteration whose workers start now; ``False`` if taken.

        Slots marked busy whose group never reached this process (an iteration that
        stopped early drops what its workers had sent) are free again: their workers
        are gone.
        """
        with self._lock:
            if self._leased:
                return False
            self._leased = True
            held = self._held
            for slot in range(len(self._flags)):
                self._flags[slot] = _BUSY if slot in held else _FREE
            return True

    def release(self) -> None:
        """The leasing iteration's workers are gone (its DataLoader iterator was collected)."""
        with self._lock:
            self._leased = False

    def receive(self, slot: int, segment: torch.Tensor | None) -> np.ndarray[Any, Any]:
        """Main process: an array over slot ``slot``'s segment, the owner of one group.

        The slot is marked free when the array is collected, i.e. when no tensor, array
        or Arrow buffer of the group is left.
        """
        if segment is not None:
            self.segments[slot] = segment
        seg = self.segments[slot]
        if seg is None:  # pragma: no cover - a worker sends every segment it makes
            raise RuntimeError(f"slot {slot} of transfer pool {self.pool_id} has no segment")
        owner = seg.numpy()  # a fresh array (its base is a tensor): numpy views keep it alive
        self._held.add(slot)
        weakref.finalize(owner, self._free, slot).atexit = False
        return owner

    def _free(self, slot: int) -> None:
        # Only the process that owns the pool frees: a forked child inherits the
        # finalizers of the arrays alive at the fork, and must not run them.
        if os.getpid() != self._owner_pid:
            return
        self._held.discard(slot)
        self._flags[slot] = _FREE

    # -- worker -----------------------------------------------------------------------
    def writer(self, worker: int) -> SegmentWriter | None:
        """Worker ``worker``'s side of the pool (``None`` if its memory is not shared)."""
        shared: bool = self.flags.is_shared()  # type: ignore[no-untyped-call]
        if not shared or worker >= len(self.segments) // self.slots_per_worker:
            return None  # pickled without torch's sharing (never by a DataLoader): unusable
        return SegmentWriter(self, worker)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _pool_in_worker, (self.pool_id, self.slots_per_worker, self.flags, list(self.segments))


def _pool_in_worker(
    pool_id: int, slots_per_worker: int, flags: torch.Tensor, segments: list[torch.Tensor | None]
) -> SegmentPool:
    pool = SegmentPool.__new__(SegmentPool)
    pool.pool_id = pool_id
    pool.slots_per_worker = slots_per_worker
    pool.flags = flags
    pool.segments = segments
    pool._owner_pid = -1  # never frees
    pool._flags = flags.numpy()
    pool._held = set()
    pool._leased = True
    pool._lock = threading.Lock()
    return pool


class SegmentWriter:
    """A worker's slots of a :class:`SegmentPool`."""

    def __init__(self, pool: SegmentPool, worker: int) -> None:
        self.pool_id = pool.pool_id
        self._pool = pool
        self._flags = pool._flags
        start = worker * pool.slots_per_worker
        self._slots = range(start, start + pool.slots_per_worker)

    def take(self, total: int) -> tuple[int, np.ndarray[Any, Any], torch.Tensor | None] | None:
        """A free slot for ``total`` bytes, marked busy; ``None`` when every slot is busy.

        Returns ``(slot, array to fill, segment to send or None)``.
        """
        segments = self._pool.segments
        spare = None
        for slot in self._slots:
            if self._flags[slot] != _FREE:
                continue
            seg = segments[slot]
            if seg is not None and seg.numel() >= total:
                self._flags[slot] = _BUSY
                return slot, seg.numpy(), None
            if spare is None or segments[spare] is not None:
                spare = slot  # prefer an empty slot to replacing a small segment
        if spare is None:
            return None
        # A new segment (the main process knows the others): it travels with this group.
        seg = new_shared_bytes(_segment_bytes(total))
        segments[spare] = seg
        self._flags[spare] = _BUSY
        return spare, seg.numpy(), seg


class PooledBatch:
    """A batch (or group) in a slot of a :class:`SegmentPool`; unpickles as the plain structure."""

    __slots__ = ("layout", "pool_id", "segment", "slot")

    def __init__(self, pool_id: int, slot: int, segment: torch.Tensor | None, layout: Any) -> None:
        self.pool_id = pool_id
        self.slot = slot
        self.segment = segment
        self.layout = layout

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _unpack_pooled, (self.pool_id, self.slot, self.segment, self.layout)


def _unpack_pooled(pool_id: int, slot: int, segment: torch.Tensor | None, layout: Any) -> Any:
    pool = _POOLS.get(pool_id)
    if pool is None:  # pragma: no cover - the leasing iteration keeps its pool alive
        raise RuntimeError(f"a batch arrived for transfer pool {pool_id}, which is gone")
    owner = pool.receive(slot, segment)
    return unpack(owner, layout)


def unpack(buffer: bytes | bytearray | torch.Tensor | np.ndarray[Any, Any], layout: Any) -> Any:
    """Rebuild the structure packed by :func:`pack`, tensors as views of ``buffer``.

    Tensors over a ``bytes`` buffer are, like tensors over Arrow memory in the main
    process, backed by memory Python considers read-only (torch does not enforce it).
    """
    raw: Any
    if isinstance(buffer, np.ndarray):  # a pool's segment: every view must keep it alive
        raw, buffer = buffer, as_tensor(buffer)
    else:
        raw = buffer.numpy() if isinstance(buffer, torch.Tensor) else buffer
    if layout[0] == "g":
        return BatchGroup(_unpack(raw, buffer, item) for item in layout[1])
    return _unpack(raw, buffer, layout)


def _base(buffer: bytes | bytearray | torch.Tensor) -> torch.Tensor:
    if isinstance(buffer, torch.Tensor):
        return buffer
    if not buffer:
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only bytes, as with Arrow memory
        return torch.frombuffer(buffer, dtype=torch.uint8)


def _text_array(raw: Any, parts: tuple[Any, ...]) -> Any:
    at, offsets_dtype, n, data_at, data_len, arrow_type, valid = parts
    width = np.dtype(offsets_dtype).itemsize
    view: Any = memoryview(raw) if not isinstance(raw, np.ndarray) else raw
    offsets = pa.py_buffer(view[at : at + width * (n + 1)])
    data = pa.py_buffer(view[data_at : data_at + data_len])
    if valid is None:
        return pa.Array.from_buffers(arrow_type, n, [None, offsets, data])
    valid_at, valid_len, null_count = valid
    bitmap = pa.py_buffer(view[valid_at : valid_at + valid_len])
    return pa.Array.from_buffers(arrow_type, n, [bitmap, offsets, data], null_count=null_count)


def _unpack(raw: Any, buffer: Any, layout: Any) -> Any:
    kind = layout[0]
    if kind == "n":
        _, offset, np_dtype, count, shape = layout
        arr = np.frombuffer(raw, dtype=np_dtype, count=count, offset=offset)
        return as_tensor(arr if len(shape) == 1 else arr.reshape(shape))
    if kind == "t":
        _, offset, dtype, shape, nbytes = layout
        return _base(buffer)[offset : offset + nbytes].view(dtype).view(shape)
    if kind == "j":
        return jagged(_unpack(raw, buffer, layout[1]), _unpack(raw, buffer, layout[2]))
    if kind == "s":
        return text_out(_text_array(raw, layout[1]), layout[2])
    if kind == "a":
        return _text_array(raw, layout[1])
    if kind == "d":
        return {k: _unpack(raw, buffer, v) for k, v in layout[1]}
    if kind == "nt":
        return layout[1](*(_unpack(raw, buffer, v) for v in layout[2]))
    if kind == "l":
        return [_unpack(raw, buffer, v) for v in layout[1]]
    if kind == "u":
        return tuple(_unpack(raw, buffer, v) for v in layout[1])
    return layout[1]
