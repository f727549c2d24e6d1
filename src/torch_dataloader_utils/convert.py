"""RecordBatch -> torch / numpy / arrow / dict, without needless copies.

Column types and what they become (``torch`` and ``numpy`` outputs):

==========================  ===================================  =====================
Arrow type                  torch                                numpy
==========================  ===================================  =====================
int*, uint*, float*         tensor of that dtype (zero-copy)     array (zero-copy)
bool                        ``torch.bool`` tensor                bool array
timestamp, duration, time   int64 tensor in the column's unit    int64 array
date32                      int32 tensor (days since epoch)      int32 array
string, large_string        ``strings``: ``list[str]`` (default), the Arrow array, or
binary                      a :class:`FlatList` of uint8 bytes + int64 offsets
dictionary<..., string>     as its strings (decoded)
fixed_size_list<number>     ``[rows, size]`` tensor              ``[rows, size]`` array
list<number>, large_list    ``ragged``: a jagged nested tensor   ``ragged``: an object
list<fixed_size_list<..>>   (default), a :class:`PaddedList` or  array of arrays
                            a :class:`FlatList`                  (default), padded, flat
decimal, struct, map, ...   error: use ``output_format='arrow'``
==========================  ===================================  =====================

A null in a column whose output type has no null (numbers, bool, lists of numbers,
strings as bytes) is a :class:`NullValueError` naming the column, unless ``null_fill``
gives a value for it: the value replaces null numbers (inside lists too) and null
strings, and a null list reads as an empty list (a fixed-size list as ``size`` copies of
the value). The dtype never changes silently (no int -> float promotion for nulls).

``pack_features`` stacks numeric columns into one ``[rows, F]`` tensor per
:class:`~torch_dataloader_utils.config.FeaturePack`: a view of Arrow's memory for one
column of the target dtype, one copy otherwise.

Batches that cross a process boundary (DataLoader workers) are packed by
:mod:`torch_dataloader_utils.transfer` so that all tensors of a batch travel in one
buffer; string columns stay Arrow (:class:`DeferredText`) and jagged list columns stay
values + offsets (:class:`JaggedParts`) until they arrive.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from torch_dataloader_utils.config import FeaturePack, OutputConfig, OutputFormat, RaggedLayout, StringLayout
from torch_dataloader_utils.errors import (
    ConversionError,
    IncompatibleOptionsError,
    NullValueError,
    UnknownColumnError,
)
from torch_dataloader_utils.upstream.torch import jagged, prepare_jagged

__all__ = [
    "BatchConverter",
    "DeferredPack",
    "DeferredText",
    "FlatList",
    "JaggedParts",
    "PaddedList",
    "as_tensor",
    "text_out",
    "text_parts",
]

ColumnFn = Callable[..., Any]


class PaddedList(NamedTuple):
    """A list column padded to a rectangle (``ragged="padded"``).

    Attributes:
        values: ``[rows, width, ...]``; positions past a list's end hold ``pad_value``.
            ``width`` is the longest list of the batch, at most ``max_length``.
        lengths: ``[rows]`` int64, the items kept per row (``values[i, :lengths[i]]``).
    """

    values: Any
    lengths: Any


class FlatList(NamedTuple):
    """A list, string or binary column in Arrow's layout: flat values and offsets.

    Row ``i`` is ``values[offsets[i]:offsets[i + 1]]`` (``ragged="offsets"``, or bytes
    with ``strings="bytes"``).

    Attributes:
        values: The rows' items one after the other (``uint8`` bytes for strings).
        offsets: ``[rows + 1]`` int64, starting at 0.
    """

    values: Any
    offsets: Any


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


def _is_text(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


def _is_any_text(t: pa.DataType) -> bool:
    return (
        _is_text(t)
        or pa.types.is_string_view(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    )


def _is_dense(t: pa.DataType) -> bool:
    """Numbers, bool, and fixed-size lists of them (nested fixed-size lists too)."""
    if _is_number(t) or pa.types.is_boolean(t):
        return True
    return pa.types.is_fixed_size_list(t) and _is_dense(t.value_type)


def _dense_shape(t: pa.DataType) -> tuple[tuple[int, ...], pa.DataType]:
    """The item shape and the innermost type of a dense type (``()`` for a scalar)."""
    dims: list[int] = []
    while pa.types.is_fixed_size_list(t):
        dims.append(t.list_size)
        t = t.value_type
    return tuple(dims), t


def _np_dtype(t: pa.DataType) -> np.dtype[Any]:
    return np.dtype(bool) if pa.types.is_boolean(t) else np.dtype(t.to_pandas_dtype())


_NUMBER, _TEXT, _LIST, _PACK, _OTHER = range(5)


class BatchConverter:
    """Converts record batches of one schema to the configured output.

    Args:
        schema: The schema of every batch.
        config: The output options (format, ``null_fill``, ``ragged``, ``strings``,
            ``pack_features``...).

    Raises:
        ConversionError: at construction, a column type the output cannot hold, a
            ``pad_value`` a padded column cannot hold, or a packed column that is no number.
        UnknownColumnError: ``pack_features`` names a column that is not in the output.
        IncompatibleOptionsError: a ``FeaturePack`` key is also a column of the output.
    """

    def __init__(self, schema: pa.Schema, config: OutputConfig) -> None:
        self._config = config
        self._output = config.output_format
        self._schema = schema
        self._fills = self._fill_map(schema, config.null_fill)
        if self._output in (OutputFormat.TORCH, OutputFormat.NUMPY):
            named = isinstance(config.null_fill, Mapping)
            for f in schema:
                if f.name in self._fills:
                    self._fills[f.name] = _check_fill(f.name, f.type, self._fills[f.name], named)
        self._to_torch = self._output is OutputFormat.TORCH
        self._ragged = config.ragged or (RaggedLayout.JAGGED if self._to_torch else None)
        self._strings = config.strings or StringLayout.LIST
        self._pad = 0 if config.pad_value is None else config.pad_value
        self._check_packs()
        self._plan = self._build_plan()
        if (
            self._to_torch
            and self._ragged is RaggedLayout.JAGGED
            and any(k == _LIST for _, k, _, _ in self._plan)
        ):
            # The first jagged tensor of a process imports ~1-2 s of torch modules: here,
            # while the dataset is built, rather than in the first batch (forked workers
            # inherit them).
            prepare_jagged()

    def _build_plan(self) -> list[tuple[str, int, ColumnFn, Any]]:
        # Per output key, in order: (key, kind, fn, column index or indices). Plain
        # numbers take an inlined fast path; texts may travel as Arrow buffers and
        # jagged lists as values + offsets (see convert_for_transfer); a feature pack
        # sits where its first column was.
        plan: list[tuple[str, int, ColumnFn, Any]] = []
        if self._output not in (OutputFormat.TORCH, OutputFormat.NUMPY):
            return plan
        packed = {c: p for p in self._config.pack_features for c in p.columns}
        names = self._schema.names
        for i, f in enumerate(self._schema):
            pack = packed.get(f.name)
            if pack is not None:
                if f.name == pack.columns[0]:
                    indices = [names.index(c) for c in pack.columns]
                    plan.append((pack.key, _PACK, self._pack_fn(pack, indices), indices))
                continue
            t = f.type
            if _is_number(t):
                kind = _NUMBER
            elif _is_any_text(t):
                kind = _TEXT
            elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_dense(t.value_type):
                kind = _LIST
            else:
                kind = _OTHER
            plan.append((f.name, kind, self._column_fn(f), i))
        return plan

    def __getstate__(self) -> dict[str, Any]:
        # The per-column functions are closures, which spawn / forkserver workers cannot
        # unpickle; they are rebuilt from the schema on the other side.
        state = self.__dict__.copy()
        del state["_plan"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._plan = self._build_plan()

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

    # -- construction checks ------------------------------------------------------------
    def _check_packs(self) -> None:
        packs = self._config.pack_features
        if not packs:
            return
        names = self._schema.names
        packed = {c for p in packs for c in p.columns}
        for pack in packs:
            unknown = [c for c in pack.columns if c not in names]
            if unknown:
                raise UnknownColumnError(
                    f"pack_features key {pack.key!r} names column(s) {unknown} that are not in the "
                    f"output; output columns: {names}"
                )
            if pack.key in names and pack.key not in packed:
                raise IncompatibleOptionsError(
                    f"pack_features key {pack.key!r} is also a column of the output; give the "
                    f"FeaturePack another key (e.g. key='{pack.key}_packed') or leave the column out"
                )
            target = pack.numpy_dtype
            for column in pack.columns:
                t = self._schema.field(column).type
                dims, inner = _dense_shape(t)
                if not _is_dense(t) or len(dims) > 1:
                    raise ConversionError(
                        f"pack_features column {column!r} has type {t}; a FeaturePack stacks "
                        "numbers, bool and fixed-size lists of them: leave it out of the pack"
                    )
                source = _np_dtype(inner)
                if not np.can_cast(source, target, "same_kind"):
                    raise ConversionError(
                        f"pack_features column {column!r} ({t}) cannot become dtype={pack.dtype!r} "
                        "without changing its kind (numpy's 'same_kind' rule); use a float dtype "
                        "such as 'float32', or cast the column when writing the data"
                    )

    def _check_pad(self, name: str, inner: pa.DataType) -> None:
        dtype = _np_dtype(inner)
        pad = self._pad
        if dtype.kind == "f" or np.array(pad).astype(dtype).item() == pad:
            return
        raise ConversionError(
            f"pad_value={pad!r} cannot be stored in column {name!r} of item type {inner}; "
            "pass a pad_value of that type (e.g. 0 or -1 for signed ints)"
        )

    def _check_text_fill(self, name: str, t: pa.DataType) -> None:
        if name not in self._fills:
            return
        try:
            pa.scalar(self._fills[name], t)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            raise ConversionError(
                f"null_fill value {self._fills[name]!r} for column {name!r} is not a {t}; with "
                f"strings='bytes' a null string is replaced by null_fill: pass null_fill={{{name!r}: ''}}"
            ) from None

    # -- per-column functions -----------------------------------------------------------
    def _column_fn(self, f: pa.Field[Any]) -> ColumnFn:
        t = f.type
        name = f.name
        if pa.types.is_dictionary(t):
            inner = self._column_fn(pa.field(name, t.value_type))
            return lambda a: inner(a.dictionary_decode())
        if _is_number(t) or pa.types.is_boolean(t):
            return lambda a: self._tensor(self._dense(name, a))
        if _is_temporal_int(t):
            width = (
                pa.int32()
                if pa.types.is_date32(t) or t == pa.time32("s") or t == pa.time32("ms")
                else pa.int64()
            )
            return lambda a: self._tensor(self._dense(name, a.view(width)))
        if _is_any_text(t):
            return self._text_fn(name, t)
        if pa.types.is_fixed_size_list(t) and _is_dense(t):
            return lambda a: self._tensor(self._dense(name, a))
        if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_dense(t.value_type):
            if self._ragged is RaggedLayout.PADDED:
                self._check_pad(name, _dense_shape(t.value_type)[1])
            return lambda a: self._list_parts(name, a)
        hint = ""
        if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_list(t.value_type):
            hint = " (lists of variable-length lists have no tensor layout)"
        raise ConversionError(
            f"column {name!r} has type {t}, which output_format={self._output.value!r} cannot "
            f"hold{hint}; use output_format='arrow', leave the column out of columns, or cast it "
            "when writing the data"
        )

    def _text_fn(self, name: str, t: pa.DataType) -> ColumnFn:
        to_torch = self._to_torch
        mode = self._strings
        if mode is StringLayout.LIST:
            return lambda a: text_out(a, to_torch)
        wide = (
            pa.large_string()
            if pa.types.is_string_view(t)
            else pa.large_binary()
            if pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t)
            else None
        )
        if mode is StringLayout.ARROW:
            return (lambda a: a.cast(wide)) if wide is not None else (lambda a: a)
        self._check_text_fill(name, t)
        return lambda a: self._bytes(name, a if wide is None else a.cast(wide))

    def _tensor(self, arr: np.ndarray) -> Any:
        return as_tensor(arr) if self._to_torch else arr

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

    def _null_lists(self, name: str, a: Any) -> None:
        if name not in self._fills:
            raise NullValueError(
                f"column {name!r} has {a.null_count} null list(s) in a batch; pass "
                f"null_fill={{{name!r}: <value>}} to read a null list as an empty list (a "
                "fixed-size one as copies of the value), filter them out with filters=, or use "
                "output_format='arrow'"
            )

    def _dense(self, name: str, a: Any) -> np.ndarray:
        """Numbers, bool or fixed-size lists of them as an array ``[rows, *sizes]``."""
        t = a.type
        if not pa.types.is_fixed_size_list(t):
            a = self._fill(name, a)
            return a.to_numpy(zero_copy_only=not pa.types.is_boolean(t))  # type: ignore[no-any-return]
        size = t.list_size
        n = len(a)
        if a.null_count:
            self._null_lists(name, a)
        inner = self._dense(name, a.values.slice(a.offset * size, n * size))
        arr = inner.reshape(n, size, *inner.shape[1:])
        if a.null_count:
            arr = arr.copy()
            arr[~a.is_valid().to_numpy(zero_copy_only=False)] = self._fills[name]
        return arr

    def _list_parts(self, name: str, a: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(values, offsets)`` of a variable-length list column: items and int64 offsets from 0."""
        n = len(a)
        if a.null_count:
            self._null_lists(name, a)
            lengths = pc.list_value_length(a).fill_null(0).to_numpy()
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            values = a.flatten()
        else:
            raw = a.offsets.to_numpy()
            lo, hi = int(raw[0]), int(raw[-1])
            offsets = raw.astype(np.int64)
            if lo:
                offsets -= lo
            values = a.values.slice(lo, hi - lo)
        return self._dense(name, values), offsets

    def _ragged_out(self, values: np.ndarray, offsets: np.ndarray, defer: bool) -> Any:
        layout = self._ragged
        if layout is None:  # numpy: an object array of arrays
            parts = np.split(values, offsets[1:-1]) if len(offsets) > 1 else []
            out = np.empty(len(parts), dtype=object)
            out[:] = parts
            return out
        if layout is RaggedLayout.PADDED:
            return self._padded(values, offsets)
        if layout is RaggedLayout.OFFSETS:
            return FlatList(self._tensor(values), self._tensor(offsets))
        v, o = as_tensor(values), torch.from_numpy(offsets)
        return JaggedParts(v, o) if defer else jagged(v, o)

    def _padded(self, values: np.ndarray, offsets: np.ndarray) -> PaddedList:
        lengths = np.diff(offsets)
        longest = int(lengths.max()) if len(lengths) else 0
        limit = self._config.max_length
        width = longest if limit is None else min(longest, limit)
        out = np.full((len(lengths), width, *values.shape[1:]), self._pad, dtype=values.dtype)
        if width:
            if width < longest:  # truncation: keep each list's first `width` items
                position = np.arange(len(values)) - np.repeat(offsets[:-1], lengths)
                values = values[position < width]
                lengths = np.minimum(lengths, width)
            out[np.arange(width) < lengths[:, None]] = values
        return PaddedList(self._tensor(out), self._tensor(lengths))

    def _bytes(self, name: str, a: Any) -> FlatList:
        if a.null_count:
            if name not in self._fills:
                raise NullValueError(
                    f"column {name!r} has {a.null_count} null string(s) in a batch and "
                    f"strings='bytes' has no null; pass null_fill={{{name!r}: ''}}, filter them out "
                    "with filters=, or use strings='list' or 'arrow' (which keep nulls)"
                )
            a = pc.fill_null(a, pa.scalar(self._fills[name], a.type))
        offsets, data = text_parts(a)
        values = np.frombuffer(data, dtype=np.uint8) if len(data) else np.zeros(0, dtype=np.uint8)
        return FlatList(self._tensor(values), self._tensor(offsets.astype(np.int64)))

    def _pack_fn(self, pack: FeaturePack, indices: list[int]) -> ColumnFn:
        dtype = pack.numpy_dtype
        specs = []
        for column, index in zip(pack.columns, indices, strict=True):
            dims, inner = _dense_shape(self._schema.field(column).type)
            bounds = _narrowing(_np_dtype(inner), dtype)
            specs.append((column, index, dims[0] if dims else 1, bounds))
        width = sum(w for _, _, w, _ in specs)

        def dense(column: str, array: Any, n: int, w: int, bounds: tuple[int, int] | None) -> np.ndarray:
            arr = self._dense(column, array).reshape(n, w)
            if bounds is not None:
                _check_range(column, arr, bounds, pack)
            return arr

        def stack(columns: list[Any], defer: bool = False) -> Any:
            n = len(columns[specs[0][1]])
            if len(specs) == 1:  # one column: a view where its dtype is the target's
                column, index, w, bounds = specs[0]
                arr = dense(column, columns[index], n, w, bounds)
                if arr.dtype == dtype:
                    return self._tensor(arr)
                if not (defer and self._to_torch):
                    return self._tensor(arr.astype(dtype))
            parts = [(dense(column, columns[i], n, w, bounds), w) for column, i, w, bounds in specs]
            if defer and self._to_torch:  # stacked where it travels: one copy, not two
                return DeferredPack(parts, n, width, dtype)
            out = np.empty((n, width), dtype=dtype)
            _stack_into(out, parts)
            return self._tensor(out)

        return stack

    # -- conversion ---------------------------------------------------------------------
    def __call__(self, batch: pa.RecordBatch) -> Any:
        """Convert one batch."""
        if self._output is OutputFormat.ARROW:
            return batch
        if self._output is OutputFormat.DICT:
            return batch.to_pydict()
        return self._convert(batch, defer=False)

    def convert_for_transfer(self, batch: pa.RecordBatch) -> Any:
        """Convert one batch that :func:`pack` will send to another process.

        The same as calling the converter, except that string and binary columns
        without nulls (``strings='list'``) stay Arrow arrays (wrapped in
        :class:`DeferredText`), jagged list columns stay values + offsets
        (:class:`JaggedParts`) and feature packs that need a copy stay their columns
        (:class:`DeferredPack`): :func:`pack` sends their buffers (stacking a pack
        straight into its buffer), and :func:`unpack` builds the ``list`` (or object
        array) or the nested tensor in the receiving process, which is cheaper than
        pickling Python strings or a tensor per row.
        """
        if self._output is OutputFormat.ARROW or self._output is OutputFormat.DICT:
            return self(batch)
        return self._convert(batch, defer=True)

    def _convert(self, batch: pa.RecordBatch, defer: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        columns = batch.columns
        to_torch = self._to_torch
        defer_text = defer and self._strings is StringLayout.LIST
        for name, kind, fn, index in self._plan:
            if kind == _NUMBER:
                a = columns[index]
                if a.null_count:
                    a = self._fill(name, a)
                arr = a.to_numpy(zero_copy_only=True)
                out[name] = as_tensor(arr) if to_torch else arr
            elif kind == _LIST:
                values, offsets = fn(columns[index])
                out[name] = self._ragged_out(values, offsets, defer)
            elif kind == _PACK:
                out[name] = fn(columns, defer)
            elif (
                kind == _TEXT
                and defer_text
                and columns[index].null_count == 0
                and _is_text(columns[index].type)
            ):
                out[name] = DeferredText(columns[index], to_torch)
            else:
                out[name] = fn(columns[index])
        return out


def _narrowing(source: np.dtype[Any], target: np.dtype[Any]) -> tuple[int, int] | None:
    """The target's ``(min, max)`` when an integer ``source`` may not fit integer ``target``, else ``None``.

    numpy's casts wrap such values silently (int64 ``2**31 + 5`` -> int32 ``-2147483643``;
    uint64 above int64's max -> negative), so a pack that narrows integers checks them.
    """
    if source.kind in "iu" and target.kind in "iu" and not np.can_cast(source, target, "safe"):
        info = np.iinfo(target)
        return int(info.min), int(info.max)
    return None


def _check_range(column: str, arr: np.ndarray, bounds: tuple[int, int], pack: FeaturePack) -> None:
    """:class:`ConversionError` unless every value of ``arr`` lies within ``bounds``."""
    if not arr.size:
        return
    lo, hi = bounds
    low, high = int(arr.min()), int(arr.max())
    if low >= lo and high <= hi:
        return
    value = low if low < lo else high
    raise ConversionError(
        f"pack_features column {column!r} holds the value {value}, which does not fit "
        f"dtype={pack.dtype!r} of the pack {pack.key!r} (range {lo}..{hi}); numpy would wrap it "
        "silently. Pass a wider dtype (e.g. FeaturePack(..., dtype='int64') or 'float64'), leave "
        "the column out of the pack, or cast it when writing the data"
    )


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


def text_parts(a: Any) -> tuple[np.ndarray, memoryview]:
    """Offsets rebased to 0 and the data bytes of a string / binary array (nulls read as empty)."""
    wide = pa.types.is_large_string(a.type) or pa.types.is_large_binary(a.type)
    dtype = np.int64 if wide else np.int32
    bufs = a.buffers()
    n = len(a)
    offsets: np.ndarray = np.frombuffer(bufs[1], dtype=dtype, count=n + 1, offset=a.offset * dtype().itemsize)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = memoryview(bufs[2])[lo:hi] if bufs[2] is not None else memoryview(b"")
    return offsets - lo, data


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
        return text_out(self.array, self.to_torch)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _identity, (self.materialize(),)


def _stack_into(out: np.ndarray, parts: list[tuple[np.ndarray, int]]) -> None:
    """Write ``parts`` (``[rows, width]`` arrays) side by side into ``out``, cast to its dtype."""
    at = 0
    for arr, width in parts:
        out[:, at : at + width] = arr
        at += width


class DeferredPack:
    """A feature pack bound for another process, stacked only where it travels.

    :func:`~torch_dataloader_utils.transfer.pack` has it write its columns straight
    into the transfer buffer (:meth:`write`): one copy of each value instead of two
    (stacking, then copying the stack). Pickled alone it becomes the stacked tensor.

    Args:
        parts: ``([rows, width] array, width)`` per packed column, in order.
        rows: Rows of the batch.
        width: Features in all.
        dtype: The pack's dtype.
    """

    __slots__ = ("dtype", "parts", "rows", "width")

    def __init__(
        self, parts: list[tuple[np.ndarray, int]], rows: int, width: int, dtype: np.dtype[Any]
    ) -> None:
        self.parts = parts
        self.rows = rows
        self.width = width
        self.dtype = dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the stacked ``[rows, width]`` array."""
        return self.rows * self.width * self.dtype.itemsize

    def write(self, dst: np.ndarray) -> None:
        """Stack into ``dst``, ``nbytes`` bytes (uint8, aligned to the dtype)."""
        _stack_into(dst.view(self.dtype).reshape(self.rows, self.width), self.parts)

    def materialize(self) -> torch.Tensor:
        """The column as the converter would have returned it."""
        out = np.empty((self.rows, self.width), dtype=self.dtype)
        _stack_into(out, self.parts)
        return torch.from_numpy(out)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _identity, (self.materialize(),)


class JaggedParts:
    """A list column bound for a jagged nested tensor, kept as values + offsets until it arrives.

    Pickled alone (outside :func:`pack`) it becomes the nested tensor on the other side.
    """

    __slots__ = ("offsets", "values")

    def __init__(self, values: torch.Tensor, offsets: torch.Tensor) -> None:
        self.values = values
        self.offsets = offsets

    def materialize(self) -> torch.Tensor:
        """The column as the converter would have returned it."""
        return jagged(self.values, self.offsets)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return jagged, (self.values, self.offsets)


def _identity(obj: Any) -> Any:
    return obj


def text_out(array: Any, to_torch: bool) -> Any:
    """A string / binary Arrow array as ``strings='list'`` holds it: a list, or an object array.

    ``to_numpy`` builds the Python objects in one C++ pass, faster than ``to_pylist``
    (0.08 vs 0.14 ms per 4,096 short strings on the project's machine).
    """
    objects = array.to_numpy(zero_copy_only=False)
    return objects.tolist() if to_torch else objects
