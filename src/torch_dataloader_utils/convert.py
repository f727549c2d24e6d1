"""RecordBatch -> torch / numpy / arrow / dict, without needless copies.

Column types and what they become (``torch`` and ``numpy`` outputs):

==========================  ===================================  =====================
Arrow type                  torch                                numpy
==========================  ===================================  =====================
int*, uint*, float*         tensor of that dtype (zero-copy)     array (zero-copy)
bool                        ``torch.bool`` tensor                bool array
timestamp, duration, time   int64 tensor in the column's unit    int64 array
date32                      int32 tensor (days since epoch)      int32 array
string, large_string        ``list[str]``                        object array of str
binary                      ``list[bytes]``                      object array of bytes
dictionary<..., string>     ``list[str]`` (decoded)              object array
fixed_size_list<number>     2-D tensor ``[rows, size]``          2-D array
list<number>                ``list`` of 1-D tensors              object array of arrays
decimal, struct, map, ...   error: use ``output_format='arrow'``
==========================  ===================================  =====================

A null in a column whose output type has no null (numbers, bool, lists of numbers) is
a :class:`NullValueError` naming the column, unless ``null_fill`` gives a value for
it. The dtype never changes silently (no int -> float promotion for nulls).

Batches that cross a process boundary (DataLoader workers) are packed so that all
tensors of a batch travel in one shared-memory buffer: one transfer per batch instead
of one per column. The receiving process sees a plain ``dict`` of tensor views.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from torch_dataloader_utils.config import OutputFormat
from torch_dataloader_utils.errors import ConversionError, NullValueError

__all__ = ["BatchConverter", "pack", "unpack"]

ColumnFn = Callable[[Any], Any]


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _is_temporal_int(t: pa.DataType) -> bool:
    return (
        pa.types.is_timestamp(t)
        or pa.types.is_duration(t)
        or pa.types.is_time(t)
        or pa.types.is_date64(t)
        or pa.types.is_date32(t)
    )


class BatchConverter:
    """Converts record batches of one schema to the configured output format.

    Args:
        schema: The schema of every batch.
        output: Output format.
        null_fill: ``None`` (nulls are an error), one value for every column, or a
            mapping column -> value.

    Raises:
        ConversionError: at construction, a column type the output format cannot hold.
    """

    def __init__(self, schema: pa.Schema, output: OutputFormat, null_fill: Any = None) -> None:
        self._output = output
        self._schema = schema
        self._fills = self._fill_map(schema, null_fill)
        self._fns = self._build_fns()

    def _build_fns(self) -> list[tuple[str, ColumnFn]]:
        if self._output not in (OutputFormat.TORCH, OutputFormat.NUMPY):
            return []
        to_torch = self._output is OutputFormat.TORCH
        return [(f.name, self._column_fn(f, to_torch)) for f in self._schema]

    def __getstate__(self) -> dict[str, Any]:
        # The per-column functions are closures, which spawn / forkserver workers cannot
        # unpickle; they are rebuilt from the schema on the other side.
        state = self.__dict__.copy()
        del state["_fns"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fns = self._build_fns()

    @staticmethod
    def _fill_map(schema: pa.Schema, null_fill: Any) -> dict[str, Any]:
        if null_fill is None:
            return {}
        if isinstance(null_fill, Mapping):
            unknown = [k for k in null_fill if k not in schema.names]
            if unknown:
                raise ConversionError(
                    f"null_fill names columns {unknown} that are not in the output; "
                    f"output columns: {schema.names}"
                )
            return dict(null_fill)
        return {name: null_fill for name in schema.names}

    def _column_fn(self, f: pa.Field[Any], to_torch: bool) -> ColumnFn:
        t = f.type
        name = f.name
        if pa.types.is_dictionary(t):
            inner = self._column_fn(pa.field(name, t.value_type), to_torch)
            return lambda a: inner(a.dictionary_decode())
        if _is_number(t) or pa.types.is_boolean(t):
            return lambda a: self._numeric(name, a, to_torch)
        if _is_temporal_int(t):
            width = (
                pa.int32()
                if pa.types.is_date32(t) or t == pa.time32("s") or t == pa.time32("ms")
                else pa.int64()
            )
            return lambda a: self._numeric(name, a.view(width), to_torch)
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            if to_torch:
                return lambda a: a.to_pylist()
            return lambda a: np.array(a.to_pylist(), dtype=object)
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            if to_torch:
                return lambda a: a.to_pylist()
            return lambda a: np.array(a.to_pylist(), dtype=object)
        if pa.types.is_fixed_size_list(t) and (_is_number(t.value_type) or pa.types.is_boolean(t.value_type)):
            size = t.list_size
            return lambda a: self._fixed_list(name, a, size, to_torch)
        if (pa.types.is_list(t) or pa.types.is_large_list(t)) and (
            _is_number(t.value_type) or pa.types.is_boolean(t.value_type)
        ):
            return lambda a: self._var_list(name, a, to_torch)
        raise ConversionError(
            f"column {name!r} has type {t}, which output_format={self._output.value!r} cannot "
            "hold; use output_format='arrow', leave the column out of columns, or cast it "
            "when writing the data"
        )

    def _fill(self, name: str, a: Any) -> Any:
        if a.null_count == 0:
            return a
        if name in self._fills:
            return pc.fill_null(a, pa.scalar(self._fills[name], a.type))
        raise NullValueError(
            f"column {name!r} has {a.null_count} null(s) in a batch and type {a.type} has no "
            f"null in output_format={self._output.value!r}; pass null_fill={{{name!r}: <value>}} "
            "(or one value for every column), filter the nulls out with filters=, or use "
            "output_format='arrow'"
        )

    def _numeric(self, name: str, a: Any, to_torch: bool) -> Any:
        a = self._fill(name, a)
        if pa.types.is_boolean(a.type):
            arr = a.to_numpy(zero_copy_only=False)
        else:
            arr = a.to_numpy(zero_copy_only=True)
        return _as_tensor(arr) if to_torch else arr

    def _fixed_list(self, name: str, a: Any, size: int, to_torch: bool) -> Any:
        a = self._fill_list(name, a)
        values = a.flatten()
        values = self._fill(name, values)
        arr = values.to_numpy(zero_copy_only=False).reshape(len(a), size)
        return _as_tensor(arr) if to_torch else arr

    def _var_list(self, name: str, a: Any, to_torch: bool) -> Any:
        a = self._fill_list(name, a)
        values = self._fill(name, a.flatten()).to_numpy(zero_copy_only=False)
        offsets = a.offsets.to_numpy()
        offsets = offsets - offsets[0]
        parts = np.split(values, offsets[1:-1]) if len(a) else []
        if to_torch:
            return [_as_tensor(p) for p in parts]
        out = np.empty(len(parts), dtype=object)
        out[:] = parts
        return out

    def _fill_list(self, name: str, a: Any) -> Any:
        if a.null_count == 0:
            return a
        raise NullValueError(
            f"column {name!r} has {a.null_count} null list(s) in a batch; filter them out with "
            "filters= or use output_format='arrow'"
        )

    def __call__(self, batch: pa.RecordBatch) -> Any:
        """Convert one batch."""
        if self._output is OutputFormat.ARROW:
            return batch
        if self._output is OutputFormat.DICT:
            return batch.to_pydict()
        return {name: fn(batch.column(i)) for i, (name, fn) in enumerate(self._fns)}


def _as_tensor(arr: np.ndarray) -> torch.Tensor:
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    # Arrow memory is read-only to numpy. The batch is ours alone, so handing out a
    # tensor over it is safe; silence torch's warning about non-writable arrays.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


# ----------------------------------------------------------------------------------
# Packing: one shared-memory buffer per batch for the trip from a worker.

_ALIGN = 64


class PackedBatch:
    """A batch whose tensors share one buffer; unpickles as the plain structure."""

    __slots__ = ("buffer", "layout")

    def __init__(self, buffer: torch.Tensor, layout: Any) -> None:
        self.buffer = buffer
        self.layout = layout

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return unpack, (self.buffer, self.layout)


def _tensor_sizes(obj: Any, out: list[torch.Tensor]) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensor_sizes(v, out)
    elif isinstance(obj, (list, tuple)) and not _is_plain_list(obj):
        for v in obj:
            _tensor_sizes(v, out)


def _is_plain_list(obj: Any) -> bool:
    return isinstance(obj, list) and (not obj or not isinstance(obj[0], (torch.Tensor, dict, list, tuple)))


def _new_shared(nbytes: int) -> torch.Tensor:
    try:
        storage = torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call]
        return torch.empty(0, dtype=torch.uint8).set_(storage)
    except (AttributeError, RuntimeError):  # pragma: no cover - older/newer torch
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call,no-any-return]


def pack(obj: Any) -> Any:
    """Pack every tensor of ``obj`` (dict / list / tuple nesting) into one shared buffer.

    Returns ``obj`` unchanged when it holds fewer than two tensors.
    """
    tensors: list[torch.Tensor] = []
    _tensor_sizes(obj, tensors)
    if len(tensors) < 2 or any(t.is_cuda or t.is_sparse for t in tensors):
        return obj
    total = 0
    for t in tensors:
        total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    buffer = _new_shared(max(total, 1))
    offset = 0

    def lay(o: Any) -> Any:
        nonlocal offset
        if isinstance(o, torch.Tensor):
            nbytes = o.numel() * o.element_size()
            dst = buffer[offset : offset + nbytes].view(o.dtype).view(o.shape)
            dst.copy_(o)
            entry = ("t", offset, o.dtype, tuple(o.shape))
            offset += -(-nbytes // _ALIGN) * _ALIGN
            return entry
        if isinstance(o, dict):
            return ("d", [(k, lay(v)) for k, v in o.items()])
        if isinstance(o, (list, tuple)) and not _is_plain_list(o):
            return ("l" if isinstance(o, list) else "u", [lay(v) for v in o])
        return ("o", o)

    layout = lay(obj)
    return PackedBatch(buffer, layout)


def unpack(buffer: torch.Tensor, layout: Any) -> Any:
    """Rebuild the structure packed by :func:`pack`, as views of ``buffer``."""
    kind = layout[0]
    if kind == "t":
        _, offset, dtype, shape = layout
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        return buffer[offset : offset + nbytes].view(dtype).view(shape)
    if kind == "d":
        return {k: unpack(buffer, v) for k, v in layout[1]}
    if kind == "l":
        return [unpack(buffer, v) for v in layout[1]]
    if kind == "u":
        return tuple(unpack(buffer, v) for v in layout[1])
    return layout[1]
