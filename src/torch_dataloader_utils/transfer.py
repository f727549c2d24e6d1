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
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from torch_dataloader_utils.convert import DeferredText, JaggedParts, as_tensor, text_out, text_parts
from torch_dataloader_utils.upstream.torch import jagged, jagged_parts, new_shared_bytes

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


def pack_group(items: list[Any]) -> Any:
    """Pack several batches into one buffer; it unpickles as a :class:`BatchGroup`.

    Used between a worker and a loader that knows to flatten groups (see
    ``runtime.loader``): one transfer for several small batches.
    """
    try:
        return _pack(items, group=True)
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


def _pack(obj: Any, group: bool) -> Any:
    packer = _Packer()
    layout = ("g", [packer.lay(item) for item in obj]) if group else packer.lay(obj)
    if not packer.leaves:
        if group:
            return BatchGroup(obj)
        return obj
    total = packer.total
    buffer: bytearray | torch.Tensor
    if total <= PIPE_MAX_BYTES:
        buffer = bytearray(total)
        dst = np.frombuffer(buffer, dtype=np.uint8)
    else:
        buffer = new_shared_bytes(total)
        dst = buffer.numpy()
    for at, src, nbytes in packer.parts:
        dst[at : at + nbytes] = np.frombuffer(src, dtype=np.uint8, count=nbytes)
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
