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

Batches that cross a process boundary (DataLoader workers) are packed by
:mod:`torch_dataloader_utils.transfer` so that all tensors of a batch travel in one
buffer; string columns stay Arrow (:class:`DeferredText`) until they arrive.
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

__all__ = ["BatchConverter", "DeferredText", "as_tensor", "text_out"]

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


_NUMBER, _TEXT, _OTHER = 0, 1, 2


def _is_text(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
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
        if output in (OutputFormat.TORCH, OutputFormat.NUMPY):
            for f in schema:
                if f.name in self._fills:
                    named = isinstance(null_fill, Mapping)
                    self._fills[f.name] = _check_fill(f.name, f.type, self._fills[f.name], named)
        self._to_torch = output is OutputFormat.TORCH
        self._fns, self._plan = self._build_fns()

    def _build_fns(self) -> tuple[list[tuple[str, ColumnFn]], list[tuple[str, int, ColumnFn]]]:
        # Per column: (name, kind, fn). Plain numbers take an inlined fast path; texts
        # (string / binary without dictionary) may travel as Arrow buffers (see pack).
        fns: list[tuple[str, ColumnFn]] = []
        plan: list[tuple[str, int, ColumnFn]] = []
        if self._output in (OutputFormat.TORCH, OutputFormat.NUMPY):
            for f in self._schema:
                fn = self._column_fn(f, self._to_torch)
                fns.append((f.name, fn))
                kind = _NUMBER if _is_number(f.type) else _TEXT if _is_text(f.type) else _OTHER
                plan.append((f.name, kind, fn))
        return fns, plan

    def __getstate__(self) -> dict[str, Any]:
        # The per-column functions are closures, which spawn / forkserver workers cannot
        # unpickle; they are rebuilt from the schema on the other side.
        state = self.__dict__.copy()
        del state["_fns"]
        del state["_plan"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fns, self._plan = self._build_fns()

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
        return as_tensor(arr) if to_torch else arr

    def _fixed_list(self, name: str, a: Any, size: int, to_torch: bool) -> Any:
        a = self._fill_list(name, a)
        values = a.flatten()
        values = self._fill(name, values)
        arr = values.to_numpy(zero_copy_only=False).reshape(len(a), size)
        return as_tensor(arr) if to_torch else arr

    def _var_list(self, name: str, a: Any, to_torch: bool) -> Any:
        a = self._fill_list(name, a)
        values = self._fill(name, a.flatten()).to_numpy(zero_copy_only=False)
        offsets = a.offsets.to_numpy()
        offsets = offsets - offsets[0]
        parts = np.split(values, offsets[1:-1]) if len(a) else []
        if to_torch:
            return [as_tensor(p) for p in parts]
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
        return self._convert(batch, defer_text=False)

    def convert_for_transfer(self, batch: pa.RecordBatch) -> Any:
        """Convert one batch that :func:`pack` will send to another process.

        The same as calling the converter, except that string and binary columns
        without nulls stay Arrow arrays (wrapped in :class:`DeferredText`): :func:`pack`
        sends their buffers, and :func:`unpack` builds the ``list`` (or object array)
        in the receiving process, which is cheaper than pickling Python strings.
        """
        if self._output is OutputFormat.ARROW or self._output is OutputFormat.DICT:
            return self(batch)
        return self._convert(batch, defer_text=True)

    def _convert(self, batch: pa.RecordBatch, defer_text: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        columns = batch.columns
        to_torch = self._to_torch
        for i, (name, kind, fn) in enumerate(self._plan):
            a = columns[i]
            if kind == _NUMBER:
                if a.null_count:
                    a = self._fill(name, a)
                arr = a.to_numpy(zero_copy_only=True)
                out[name] = as_tensor(arr) if to_torch else arr
            elif kind == _TEXT and defer_text and a.null_count == 0:
                out[name] = DeferredText(a, to_torch)
            else:
                out[name] = fn(a)
        return out


def _fill_type(t: pa.DataType) -> pa.DataType | None:
    """The type a ``null_fill`` value takes in a column of type ``t`` (``None``: never filled)."""
    if pa.types.is_dictionary(t):
        return _fill_type(t.value_type)
    if _is_number(t) or pa.types.is_boolean(t):
        return t
    if _is_temporal_int(t):
        return (
            pa.int32() if pa.types.is_date32(t) or t == pa.time32("s") or t == pa.time32("ms") else pa.int64()
        )
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        return _fill_type(t.value_type)
    return None


def _check_fill(name: str, t: pa.DataType, value: Any, named: bool) -> Any:
    """``value`` as column ``name`` takes it; :class:`ConversionError` unless it fits exactly.

    A float for an integer column would be truncated (``0.7`` -> ``0``), a string would
    fail only when the first null is met: both are refused here, when the dataset is
    built. An integral float fills an integer column (``-1.0`` -> ``-1``), ``0`` / ``1``
    a bool column.
    """
    target = _fill_type(t)
    if target is None:
        return value  # strings, binaries...: nulls stay None, nothing is filled
    shown = f"null_fill={{{name!r}: {value!r}}}" if named else f"null_fill={value!r}"
    ok: bool
    if pa.types.is_boolean(target):
        ok = isinstance(value, bool) or (type(value) is int and value in (0, 1))
        value = bool(value) if ok else value
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        ok = False
    elif pa.types.is_floating(target):
        ok = True
    else:
        ok = isinstance(value, int) or float(value).is_integer()
        if ok:
            value = int(value)
            try:
                pa.scalar(value, target)
            except (pa.ArrowException, OverflowError, ValueError):
                ok = False
    if not ok:
        raise ConversionError(
            f"{shown} cannot fill the nulls of column {name!r} of type {t} (values {target}): it would "
            "be truncated, overflow or fail at the first null; pass a value of that type, e.g. "
            f"null_fill={{{name!r}: {_example(target)}}}"
        )
    return value


def _example(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "False"
    return "0.0" if pa.types.is_floating(t) else "0"


_quiet = False


def as_tensor(arr: np.ndarray) -> torch.Tensor:
    """A tensor over ``arr``'s memory (no copy), without torch's warning for read-only arrays."""
    global _quiet
    if _quiet or arr.flags.writeable:
        return torch.from_numpy(arr)
    # Arrow memory is read-only to numpy. The batch is ours alone, so handing out a
    # tensor over it is safe; silence torch's warning about non-writable arrays. torch
    # gives that warning once per process, so only the first call needs the (costly)
    # catch_warnings.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(arr)
    _quiet = True
    return t


class DeferredText:
    """A string / binary column kept as Arrow until it reaches the receiving process.

    Pickled alone (outside :func:`pack`) it becomes the plain ``list`` (or object array).
    """

    __slots__ = ("array", "to_torch")

    def __init__(self, array: Any, to_torch: bool) -> None:
        self.array = array
        self.to_torch = to_torch

    def materialize(self) -> Any:
        """The column as the converter would have returned it."""
        return text_out(self.array.to_pylist(), self.to_torch)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _identity, (self.materialize(),)


def _identity(obj: Any) -> Any:
    return obj


def text_out(values: list[Any], to_torch: bool) -> Any:
    """A string / binary column as the output format holds it: a list, or an object array."""
    return values if to_torch else np.array(values, dtype=object)
