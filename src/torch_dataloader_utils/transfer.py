"""Batches across processes: one buffer per batch (or group of batches) from a worker.

Packing: one buffer per batch for the trip from a worker.

Measured on 2 cores (docs/benchmarks.md): sending each tensor through torch's shared
memory costs a file-descriptor handshake per tensor, and even one shared-memory
segment per batch costs more than copying a batch of a few hundred KiB through the
worker's pipe; for several MiB, one segment wins. So a batch's tensors (and the
buffers of its string columns) are copied into ONE buffer: a bytearray pickled in-band
up to PIPE_MAX_BYTES, one shared-memory segment above. Groups of batches
(runtime.loader.ResumableDataLoader) are sized to take the shared-memory path.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from torch_dataloader_utils.convert import DeferredText, as_tensor, text_out
from torch_dataloader_utils.upstream.torch import new_shared_bytes

__all__ = ["PIPE_MAX_BYTES", "BatchGroup", "PackedBatch", "pack", "pack_group", "unpack"]

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


def _leaves(obj: Any, out: list[Any]) -> None:
    if isinstance(obj, (torch.Tensor, DeferredText)):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _leaves(v, out)
    elif isinstance(obj, (list, tuple)) and not _is_plain_list(obj):
        for v in obj:
            _leaves(v, out)


def _is_plain_list(obj: Any) -> bool:
    return isinstance(obj, list) and (not obj or not isinstance(obj[0], (torch.Tensor, dict, list, tuple)))


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _text_parts(a: Any) -> tuple[np.ndarray, memoryview]:
    """Offsets rebased to 0 and the data bytes of a null-free string / binary array."""
    wide = pa.types.is_large_string(a.type) or pa.types.is_large_binary(a.type)
    dtype = np.int64 if wide else np.int32
    bufs = a.buffers()
    n = len(a)
    offsets: np.ndarray = np.frombuffer(bufs[1], dtype=dtype, count=n + 1, offset=a.offset * dtype().itemsize)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = memoryview(bufs[2])[lo:hi] if bufs[2] is not None else memoryview(b"")
    return offsets - lo, data


def pack(obj: Any) -> Any:
    """Pack every tensor of ``obj`` (dict / list / tuple nesting) into one buffer.

    :class:`DeferredText` columns travel as their Arrow buffers in the same buffer.
    Returns ``obj`` unchanged when it holds no tensor (or a CUDA / sparse one).
    """
    leaves: list[Any] = []
    _leaves(obj, leaves)
    if not leaves or any(isinstance(t, torch.Tensor) and (t.is_cuda or t.is_sparse) for t in leaves):
        return obj
    return _pack(obj, leaves, group=False)


def pack_group(items: list[Any]) -> Any:
    """Pack several batches into one buffer; it unpickles as a :class:`BatchGroup`.

    Used between a worker and a loader that knows to flatten groups (see
    ``runtime.loader``): one transfer for several small batches.
    """
    leaves: list[Any] = []
    _leaves(items, leaves)
    if any(isinstance(t, torch.Tensor) and (t.is_cuda or t.is_sparse) for t in leaves):
        return BatchGroup(i.materialize() if isinstance(i, DeferredText) else i for i in items)
    return _pack(items, leaves, group=True)


class BatchGroup(list[Any]):
    """Consecutive batches of one worker that travelled together; the loader flattens it."""


def _np_dtype(dtype: torch.dtype) -> np.dtype[Any] | None:
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):  # bfloat16 and other types numpy lacks
        return None


_NP_DTYPES: dict[torch.dtype, np.dtype[Any] | None] = {}


def _pack(obj: Any, leaves: list[Any], group: bool) -> PackedBatch:
    texts: dict[int, tuple[np.ndarray, memoryview]] = {}
    total = 0
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            total += _aligned(leaf.numel() * leaf.element_size())
        else:
            offsets, data = _text_parts(leaf.array)
            texts[id(leaf)] = (offsets, data)
            total += _aligned(offsets.nbytes) + _aligned(data.nbytes)
    buffer: bytearray | torch.Tensor
    if total <= PIPE_MAX_BYTES:
        buffer = bytearray(total)
        dst = np.frombuffer(buffer, dtype=np.uint8)
    else:
        buffer = new_shared_bytes(total)
        dst = buffer.numpy()
    offset = 0

    def put(src: Any, nbytes: int) -> int:
        nonlocal offset
        start = offset
        dst[start : start + nbytes] = np.frombuffer(src, dtype=np.uint8, count=nbytes)
        offset += _aligned(nbytes)
        return start

    def lay(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            nbytes = o.numel() * o.element_size()
            src = o.detach().contiguous().view(-1).view(torch.uint8).numpy() if nbytes else b""
            at = put(src, nbytes)
            if o.dtype not in _NP_DTYPES:
                _NP_DTYPES[o.dtype] = _np_dtype(o.dtype)
            np_dtype = _NP_DTYPES[o.dtype]
            if np_dtype is not None:
                # numpy views of the received buffer: cheaper than torch slicing.
                return ("n", at, np_dtype, o.numel(), tuple(o.shape))
            return ("t", at, o.dtype, tuple(o.shape), nbytes)
        if isinstance(o, DeferredText):
            offsets, data = texts[id(o)]
            at = put(offsets, offsets.nbytes)
            data_at = put(data, data.nbytes)
            return ("s", at, offsets.dtype.str, len(o.array), data_at, data.nbytes, o.array.type, o.to_torch)
        if isinstance(o, dict):
            return ("d", [(k, lay(v)) for k, v in o.items()])
        if isinstance(o, (list, tuple)) and not _is_plain_list(o):
            return ("l" if isinstance(o, list) else "u", [lay(v) for v in o])
        return ("o", o)

    layout = ("g", [lay(item) for item in obj]) if group else lay(obj)
    return PackedBatch(buffer, layout)


def unpack(buffer: bytes | bytearray | torch.Tensor, layout: Any) -> Any:
    """Rebuild the structure packed by :func:`pack`, tensors as views of ``buffer``.

    Tensors over a ``bytes`` buffer are, like tensors over Arrow memory in the main
    process, backed by memory Python considers read-only (torch does not enforce it).
    """
    raw: Any
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


def _unpack(raw: Any, buffer: Any, layout: Any) -> Any:
    kind = layout[0]
    if kind == "n":
        _, offset, np_dtype, count, shape = layout
        arr = np.frombuffer(raw, dtype=np_dtype, count=count, offset=offset)
        return as_tensor(arr if len(shape) == 1 else arr.reshape(shape))
    if kind == "t":
        _, offset, dtype, shape, nbytes = layout
        return _base(buffer)[offset : offset + nbytes].view(dtype).view(shape)
    if kind == "s":
        _, at, offsets_dtype, n, data_at, data_len, arrow_type, to_torch = layout
        width = np.dtype(offsets_dtype).itemsize
        view: Any = memoryview(raw) if not isinstance(raw, np.ndarray) else raw
        offsets = pa.py_buffer(view[at : at + width * (n + 1)])
        data = pa.py_buffer(view[data_at : data_at + data_len])
        array = pa.Array.from_buffers(arrow_type, n, [None, offsets, data])
        return text_out(array.to_pylist(), to_torch)
    if kind == "d":
        return {k: _unpack(raw, buffer, v) for k, v in layout[1]}
    if kind == "l":
        return [_unpack(raw, buffer, v) for v in layout[1]]
    if kind == "u":
        return tuple(_unpack(raw, buffer, v) for v in layout[1])
    return layout[1]
