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

Constant work per batch in the receiving process: the 1-d columns of a batch that
share a dtype and a length travel as one ``[k, rows]`` block, rebuilt with one
``unbind`` (C++), not one Python call per column; a feature pack is stacked straight
into the buffer (:class:`~torch_dataloader_utils.convert.DeferredPack`), one copy.

Page-locked segments (``pin_memory=True`` with CUDA): the main process maps each
segment a second time and page-locks that mapping once (:class:`HostPinner`), so the
batches it builds are in pinned memory with no copy and no pin thread. Workers keep
writing through their own mapping: a forked worker never touches a registered range
(a driver may keep such ranges out of forked children). The mappings are unregistered
when the pool goes away, or when a worker replaces a slot's segment.
"""

from __future__ import annotations

import collections
import itertools
import mmap
import operator
import os
import threading
import warnings
import weakref
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import torch

from torch_dataloader_utils.convert import (
    DeferredPack,
    DeferredText,
    JaggedParts,
    as_tensor,
    text_out,
    text_parts,
)
from torch_dataloader_utils.upstream.torch import jagged, jagged_parts, new_shared_bytes

__all__ = [
    "PIPE_MAX_BYTES",
    "BatchGroup",
    "HostPinner",
    "JoinedColumn",
    "PackedBatch",
    "PooledBatch",
    "SegmentPool",
    "SegmentWriter",
    "can_pin_segments",
    "pack",
    "pack_group",
    "unpack",
    "unpack_on",
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
    """Consecutive batches of one worker that travelled together; the loader flattens it.

    A group that arrived packed also keeps ``source``: its buffer and layout, from which
    :func:`unpack_on` rebuilds it on a device with one copy of the buffer.
    """

    source: tuple[Any, Any] | None = None


class JoinedColumn:
    """A column made of parts (numpy arrays of one dtype and trailing shape), joined only in the buffer.

    :func:`pack` writes the parts one after the other straight into the buffer that
    carries the batch (or, with ``order``, each row to its place: row ``j`` of the column
    is row ``order[j]`` of the parts taken one after the other), so joining costs no copy
    beyond the one into the buffer. It unpacks as one tensor. A mixed batch's columns
    travel so (:class:`~torch_dataloader_utils.runtime.emit.BatchParts`).
    """

    __slots__ = ("_numel", "np_dtype", "order", "parts", "shape")

    def __init__(self, parts: list[np.ndarray[Any, Any]], order: np.ndarray[Any, Any] | None = None) -> None:
        first = parts[0]
        self.parts = parts
        self.order = order
        self.np_dtype = first.dtype
        rows = sum(len(p) for p in parts)
        self.shape = (rows, *first.shape[1:])
        self._numel = rows if first.ndim == 1 else rows * int(np.prod(first.shape[1:]))

    @property
    def dtype(self) -> torch.dtype:
        """The joined column's torch dtype."""
        return _torch_dtype_of(self.np_dtype)

    def dim(self) -> int:
        """Dimensions of the joined column."""
        return len(self.shape)

    def numel(self) -> int:
        """Items of the joined column."""
        return self._numel

    def element_size(self) -> int:
        """Bytes of one item."""
        return int(self.np_dtype.itemsize)

    def place(self, out: list[tuple[int, Any, int]], at: int) -> None:
        """Register the copy that writes the column at byte ``at`` of the buffer (one numpy call)."""
        nbytes = self.numel() * self.element_size()
        if nbytes:
            out.append((at, self._write, nbytes))

    def _write(self, dst: np.ndarray[Any, Any]) -> None:
        column = dst.view(self.np_dtype).reshape(self.shape)
        if self.order is None:
            np.concatenate(self.parts, out=column)
            return
        where = np.empty(len(self.order), dtype=np.int64)
        where[self.order] = np.arange(len(self.order), dtype=np.int64)  # row i of the parts goes to where[i]
        start = 0
        for part in self.parts:
            n = len(part)
            column[where[start : start + n]] = part
            start += n


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


def _numpy_dtype_of(dtype: torch.dtype) -> np.dtype[Any] | None:
    if dtype not in _NP_DTYPES:
        _NP_DTYPES[dtype] = _np_dtype(dtype)
    return _NP_DTYPES[dtype]


_TORCH_DTYPES: dict[np.dtype[Any], torch.dtype] = {}


def _torch_dtype_of(dtype: np.dtype[Any]) -> torch.dtype:
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    return found


def _bytes_of(o: torch.Tensor) -> Any:
    """A tensor's bytes as a uint8 array (a copy only when it is not contiguous)."""
    return o.detach().contiguous().view(-1).view(torch.uint8).numpy()


def _is_column(o: Any) -> bool:
    """A plain 1-d CPU tensor (or joined column) of a dtype numpy has: a candidate for a column block."""
    if type(o) is JoinedColumn:
        return o.dim() == 1
    return (
        type(o) is torch.Tensor
        and o.dim() == 1
        and not o.is_cuda
        and not o.is_sparse
        and _numpy_dtype_of(o.dtype) is not None
    )


class _Packer:
    """Walks a structure once: its layout, and the byte ranges to copy into the buffer.

    A part's source is bytes (an array, a buffer) or a function that writes the part
    into its slice of the buffer (a feature pack stacked in place).
    """

    def __init__(self) -> None:
        self.parts: list[tuple[int, Any, int]] = []  # (offset, source or writer, nbytes)
        self.total = 0
        self.leaves = 0
        # The batches of a group share their keys: one tuple object, which pickle writes
        # once per group (then a reference) and the receiving process unpickles once.
        self._keys: dict[tuple[Any, ...], tuple[Any, ...]] = {}

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
        at = self.put(_bytes_of(o) if nbytes else b"", nbytes)
        np_dtype = _numpy_dtype_of(o.dtype)
        if np_dtype is not None:
            # numpy views of the received buffer: cheaper than torch slicing.
            return ("n", at, np_dtype, o.numel(), tuple(o.shape))
        return ("t", at, o.dtype, tuple(o.shape), nbytes)

    def joined(self, o: JoinedColumn) -> Any:
        """A joined column: its parts written where the column lies in the buffer."""
        np_dtype = o.np_dtype
        self.leaves += 1
        at = self.total
        o.place(self.parts, at)
        self.total += _aligned(o.numel() * o.element_size())
        return ("n", at, np_dtype, o.numel(), o.shape)

    def feature_pack(self, p: DeferredPack) -> Any:
        self.leaves += 1
        at = self.put(p.write, p.nbytes)
        return ("n", at, p.dtype, p.rows * p.width, (p.rows, p.width))

    def columns(self, columns: list[Any]) -> Any:
        """``k`` 1-d tensors of one dtype and length, back to back: a ``[k, rows]`` block."""
        first = columns[0]
        each = first.numel() * first.element_size()
        at = self.total
        if each:
            for j, column in enumerate(columns):
                if type(column) is JoinedColumn:
                    column.place(self.parts, at + j * each)
                else:
                    self.parts.append((at + j * each, _bytes_of(column), each))
        self.total += _aligned(each * len(columns))
        self.leaves += len(columns)
        return (at, _numpy_dtype_of(first.dtype), len(columns), first.numel())

    def mapping(self, o: dict[Any, Any]) -> Any:
        """A dict; its 1-d columns that share a dtype and a length go in blocks."""
        items = list(o.items())
        same: dict[tuple[torch.dtype, int], list[int]] = {}
        for i, (_, v) in enumerate(items):
            if _is_column(v):
                same.setdefault((v.dtype, v.numel()), []).append(i)
        runs = [idx for idx in same.values() if len(idx) > 1]
        if not runs:
            return ("d", [(k, self.lay(v)) for k, v in items])
        position: dict[int, int] = {}
        blocks = []
        for idx in runs:
            blocks.append(self.columns([items[i][1] for i in idx]))
            for i in idx:
                position[i] = len(position)
        rest = []
        for i, (_, v) in enumerate(items):
            if i not in position:
                rest.append(self.lay(v))
                position[i] = len(position)
        order = tuple(position[i] for i in range(len(items)))
        keep = order == tuple(range(len(items)))
        keys = tuple(k for k, _ in items)
        keys = self._keys.setdefault(keys, keys)
        return ("B", keys, tuple(blocks), tuple(rest), None if keep else order)

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
        if type(o) is JoinedColumn:
            return self.joined(o)
        if isinstance(o, JaggedParts):
            return self.jagged(o.values, o.offsets)
        if isinstance(o, DeferredPack):
            return self.feature_pack(o)
        if isinstance(o, DeferredText):
            return ("s", self.text(o.array), o.to_torch)
        if _is_text_array(o):
            return ("a", self.text(o))
        if type(o) is dict:
            return self.mapping(o)
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
    items = [packer.lay(item) for item in obj] if group else None
    layout = packer.lay(obj) if items is None else ("g", items, packer.total)
    if not packer.leaves:
        if group:
            return BatchGroup(obj)
        return obj
    total = packer.total
    buffer: bytearray | torch.Tensor
    result: PackedBatch | PooledBatch
    pooled = pool is not None and (total > PIPE_MAX_BYTES or pool.every_size)
    taken = pool.take(total) if pooled else None  # type: ignore[union-attr]
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
        if callable(src):
            src(dst[at : at + nbytes])
        else:
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


class HostPinner(Protocol):
    """Page-locks host memory for fast, asynchronous copies to a device, and releases it.

    ``torch.cuda.cudart()``'s ``cudaHostRegister`` / ``cudaHostUnregister`` with CUDA
    (:class:`~torch_dataloader_utils.upstream.torch.CudaHostPinner`).
    """

    def register(self, address: int, nbytes: int) -> None:
        """Page-lock ``nbytes`` bytes at ``address`` (page-aligned)."""

    def unregister(self, address: int) -> None:
        """Release the range registered at ``address`` (no copy reads it any more)."""

    def synchronize(self) -> None:
        """Wait until no queued copy reads a registered range (before releasing them all)."""

    def fence(self) -> Any:
        """A marker after the copies queued so far on this thread's current stream.

        ``None``: nothing to wait for (the range may be reused at once).
        """

    def passed(self, fence: Any) -> bool:
        """Whether the copies queued before ``fence`` have run."""


class _PinnedViews:
    """Main process: a second mapping of each segment of a pool, page-locked once.

    The pool keeps the segments as they arrived (forked workers inherit those objects
    and write through them); batches are built over the second mappings, which only
    the main process uses.
    """

    def __init__(self, pinner: HostPinner) -> None:
        self.pinner = pinner
        self.views: dict[int, np.ndarray[Any, Any]] = {}  # slot -> the second mapping's bytes
        self.locked: set[int] = set()  # slots whose mapping is page-locked
        self.warned = False

    def set(self, slot: int, segment: torch.Tensor) -> None:
        """Map ``segment`` (a new one, or one replacing the slot's old one) and page-lock it.

        A range the pinner refuses stays in use unpinned (copies from it are then
        synchronous), with one warning.
        """
        self.drop(slot)
        try:
            fd, size = segment.untyped_storage()._share_fd_cpu_()
            view = np.frombuffer(mmap.mmap(fd, size), dtype=np.uint8)  # the mapping lives with its arrays
        except (OSError, RuntimeError, ValueError) as exc:  # not shared by file descriptor
            self._unpinned(segment.numel(), exc)
            self.views[slot] = segment.numpy()
            return
        self.views[slot] = view
        try:
            self.pinner.register(view.ctypes.data, size)
        except RuntimeError as exc:
            self._unpinned(size, exc)
            return
        self.locked.add(slot)

    def _unpinned(self, size: int, exc: BaseException) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"pin_memory: a {size}-byte shared-memory segment could not be page-locked ({exc}); "
                "batches in such segments are not pinned, so their copies to the GPU are synchronous",
                RuntimeWarning,
                stacklevel=4,
            )

    def drop(self, slot: int) -> None:
        old = self.views.pop(slot, None)
        if old is not None and slot in self.locked:
            self.locked.discard(slot)
            self.pinner.unregister(old.ctypes.data)

    def close(self) -> None:
        if self.locked:
            self.pinner.synchronize()
        for slot in list(self.views):
            self.drop(slot)


def can_pin_segments() -> bool:
    """Whether segments can be mapped twice (torch shares memory by file descriptor)."""
    import torch.multiprocessing

    strategy: str = torch.multiprocessing.get_sharing_strategy()  # type: ignore[no-untyped-call]
    return strategy == "file_descriptor"


class SegmentPool:
    """Shared-memory segments a loader's workers fill again and again.

    The main process (a loader) owns the pool; its workers get it when they start
    (inherited under ``fork``, pickled under ``spawn`` / ``forkserver``, as torch shares
    tensors). Worker ``w`` uses slots ``w * slots_per_worker`` to ``(w + 1) *
    slots_per_worker - 1``; a shared byte per slot says whether it is free. A worker
    marks a free slot busy, fills its segment and sends the slot's number
    (:class:`PooledBatch`); it makes the slot's segment itself the first time (and when
    a group outgrows it), and then sends the segment along, once. The main process
    marks the slot free when the last reference to the group's memory is gone; in a
    page-locked pool, only once the copies queued from it until then (on that thread's
    current stream) have run (the pinner's fence): the loop's own
    ``.to(device, non_blocking=True)`` may still read a batch it has dropped, as with
    torch's pinned memory.

    One iteration at a time may use the pool (:meth:`lease`): a second iteration of the
    same loader while the first one's workers live goes without.

    Args:
        workers: The loader's ``num_workers``.
        slots_per_worker: Segments per worker; a worker that finds none free sends a
            fresh segment, as without a pool.
        pinner: Page-locks the segments in the main process (``pin_memory=True`` with
            CUDA); every group then travels in a segment, whatever its size. Released
            by :meth:`close`, or when the pool is collected.
        min_segment: Bytes of a new segment at least: room for a full group from the
            start, so that segments are not replaced (and registered again) as a
            worker's first groups grow.
    """

    def __init__(
        self, workers: int, slots_per_worker: int, pinner: HostPinner | None = None, min_segment: int = 0
    ) -> None:
        self.pool_id = next(_pool_ids)
        self.slots_per_worker = slots_per_worker
        self.every_size = pinner is not None
        self.min_segment = min_segment
        self.flags = new_shared_bytes(workers * slots_per_worker)
        self.flags.zero_()
        self.segments: list[torch.Tensor | None] = [None] * (workers * slots_per_worker)
        self._owner_pid = os.getpid()
        self._flags = self.flags.numpy()
        self._held: set[int] = set()
        self._exporters: dict[int, memoryview] = {}  # slot -> its segment's bytes (main process)
        self._leased = False
        self._lock = threading.Lock()
        self._fenced: collections.deque[tuple[Any, int]] = collections.deque()  # (fence, slot), in order
        self._fence_lock = threading.RLock()  # a finalizer may run _free inside free_fenced
        self._pinned = _PinnedViews(pinner) if pinner is not None else None
        if self._pinned is not None:
            weakref.finalize(self, self._pinned.close).atexit = False
        _POOLS[self.pool_id] = self

    @property
    def pinned(self) -> bool:
        """Whether batches are built over page-locked mappings of the segments."""
        return self._pinned is not None

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

    def close(self) -> None:
        """Unregister every page-locked mapping (batches over them stay valid, unpinned)."""
        if self._pinned is not None and os.getpid() == self._owner_pid:
            self._pinned.close()

    def receive(self, slot: int, segment: torch.Tensor | None) -> np.ndarray[Any, Any]:
        """Main process: an array over slot ``slot``'s segment, the owner of one group.

        The slot is marked free when the array is collected, i.e. when no tensor, array
        or Arrow buffer of the group is left.
        """
        self.free_fenced()
        if segment is not None:
            self.segments[slot] = segment
            if self._pinned is not None:
                self._pinned.set(slot, segment)
            whole = self._pinned.views[slot] if self._pinned is not None else segment.numpy()
            self._exporters[slot] = whole.data  # a memoryview of the whole segment
        exporter = self._exporters.get(slot)
        if exporter is None:  # pragma: no cover - a worker sends every segment it makes
            raise RuntimeError(f"slot {slot} of transfer pool {self.pool_id} has no segment")
        # A fresh array each time, over a buffer that is not an array (a memoryview made
        # once per segment): numpy roots the views taken from it at it, so it lives as
        # long as any of them. (A view of an array, e.g. ``array[:]``, would not do:
        # numpy roots views of a view at the first array, and the finalizer below would
        # free the slot while batches still use it.)
        owner = np.frombuffer(exporter, dtype=np.uint8)
        self._held.add(slot)
        weakref.finalize(owner, self._free, slot).atexit = False
        return owner

    def _free(self, slot: int) -> None:
        # Only the process that owns the pool frees: a forked child inherits the
        # finalizers of the arrays alive at the fork, and must not run them.
        if os.getpid() != self._owner_pid:
            return
        pinned = self._pinned
        if pinned is not None:
            try:
                fence = pinned.pinner.fence()
            except Exception:  # pragma: no cover - CUDA shutting down: nothing left to copy
                fence = None
            if fence is not None:
                with self._fence_lock:
                    self._fenced.append((fence, slot))
                self.free_fenced()
                return
        self._held.discard(slot)
        self._flags[slot] = _FREE

    def free_fenced(self) -> None:
        """Main process: free the slots whose fences have passed (in the order they were dropped)."""
        pinned = self._pinned
        if pinned is None or not self._fenced:
            return
        with self._fence_lock:
            while self._fenced:
                fence, slot = self._fenced[0]
                try:
                    done = pinned.pinner.passed(fence)
                except Exception:  # pragma: no cover - CUDA shutting down
                    done = True
                if not done:
                    return
                self._fenced.popleft()
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
        return _pool_in_worker, (
            self.pool_id,
            self.slots_per_worker,
            self.flags,
            list(self.segments),
            self.every_size,
            self.min_segment,
        )


def _pool_in_worker(
    pool_id: int,
    slots_per_worker: int,
    flags: torch.Tensor,
    segments: list[torch.Tensor | None],
    every_size: bool = False,
    min_segment: int = 0,
) -> SegmentPool:
    pool = SegmentPool.__new__(SegmentPool)
    pool.pool_id = pool_id
    pool.slots_per_worker = slots_per_worker
    pool.every_size = every_size
    pool.min_segment = min_segment
    pool.flags = flags
    pool.segments = segments
    pool._owner_pid = -1  # never frees
    pool._flags = flags.numpy()
    pool._held = set()
    pool._leased = True
    pool._lock = threading.Lock()
    pool._pinned = None
    return pool


class SegmentWriter:
    """A worker's slots of a :class:`SegmentPool`."""

    def __init__(self, pool: SegmentPool, worker: int) -> None:
        self.pool_id = pool.pool_id
        self.every_size = pool.every_size
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
        seg = new_shared_bytes(max(_segment_bytes(total), self._pool.min_segment))
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
    A group keeps its buffer and layout (``BatchGroup.source``) for :func:`unpack_on`.
    """
    raw: Any
    if isinstance(buffer, np.ndarray):  # a pool's segment: every view must keep it alive
        raw, buffer = buffer, as_tensor(buffer)
    else:
        raw = buffer.numpy() if isinstance(buffer, torch.Tensor) else buffer
    views = _Views(raw, buffer)
    if layout[0] == "g":
        group = BatchGroup(views.build(item) for item in layout[1])
        group.source = (raw, layout)
        return group
    return views.build(layout)


def unpack_on(source: tuple[Any, Any], device: torch.device, non_blocking: bool = True) -> BatchGroup:
    """A received group rebuilt on ``device``: ONE copy of its buffer, the tensors views of it.

    ``source`` is a group's ``BatchGroup.source``. Strings and Arrow arrays stay on the
    host (built from the host buffer). The copy is queued on the current stream; the
    returned group's ``source`` is ``(host buffer, device buffer)``: the host buffer
    must stay alive until the copy is done.
    """
    raw, layout = source
    nbytes = layout[2]
    host = as_tensor(np.frombuffer(raw, dtype=np.uint8, count=nbytes)) if nbytes else None
    on = host.to(device, non_blocking=non_blocking) if host is not None else torch.empty(0, device=device)
    views = _Views(raw, on, device=True)
    group = BatchGroup(views.build(item) for item in layout[1])
    group.source = (raw, on)
    return group


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


class _Views:
    """Builds a packed structure over a buffer: tensors from ``buffer``, strings from ``raw``.

    ``raw`` is the host bytes; ``buffer`` the same bytes as a tensor (or bytes), or, with
    ``device``, the buffer's copy on a device (tensors then are views of the copy,
    strings stay on the host).
    """

    def __init__(self, raw: Any, buffer: Any, device: bool = False) -> None:
        self.raw = raw
        self.buffer = buffer
        self.device = device

    def array(self, at: int, np_dtype: np.dtype[Any], count: int) -> torch.Tensor:
        """``count`` items of ``np_dtype`` at byte ``at``, as a 1-d tensor."""
        if self.device:
            return self.buffer[at : at + count * np_dtype.itemsize].view(_torch_dtype_of(np_dtype))  # type: ignore[no-any-return]
        return as_tensor(np.frombuffer(self.raw, dtype=np_dtype, count=count, offset=at))

    def build(self, layout: Any) -> Any:
        kind = layout[0]
        if kind == "n":
            _, offset, np_dtype, count, shape = layout
            flat = self.array(offset, np_dtype, count)
            return flat if len(shape) == 1 else flat.view(shape)
        if kind == "t":
            _, offset, dtype, shape, nbytes = layout
            return _base(self.buffer)[offset : offset + nbytes].view(dtype).view(shape)
        if kind == "B":
            return self.columns(layout)
        if kind == "j":
            return jagged(self.build(layout[1]), self.build(layout[2]))
        if kind == "s":
            return text_out(_text_array(self.raw, layout[1]), layout[2])
        if kind == "a":
            return _text_array(self.raw, layout[1])
        if kind == "d":
            return {k: self.build(v) for k, v in layout[1]}
        if kind == "nt":
            return layout[1](*(self.build(v) for v in layout[2]))
        if kind == "l":
            return [self.build(v) for v in layout[1]]
        if kind == "u":
            return tuple(self.build(v) for v in layout[1])
        return layout[1]

    def columns(self, layout: Any) -> dict[Any, Any]:
        """A dict whose 1-d columns travelled in blocks: one ``unbind`` per block."""
        _, keys, blocks, rest, order = layout
        values: list[Any] = []
        for at, np_dtype, k, n in blocks:
            values.extend(self.array(at, np_dtype, k * n).view(k, n).unbind(0))
        values.extend(self.build(leaf) for leaf in rest)
        if order is not None:  # blocks first, then the rest: back to the keys' order
            values = operator.itemgetter(*order)(values)
        return dict(zip(keys, values, strict=True))
