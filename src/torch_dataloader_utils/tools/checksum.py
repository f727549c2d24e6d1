"""Order-independent checksums of Arrow columns, and stable hashes of their values.

Every value is hashed to 64 bits by its type's canonical bytes (integers by value, so
``int32`` and ``int64`` agree; floats as ``float64`` bits with one NaN; strings and
binaries by their bytes), vectorized with numpy; other types (nested, decimals) fall
back to hashing their Python value. A column's checksum is the sum of its values'
hashes modulo 2**64, together with its row and null counts: the same multiset of values
gives the same checksum in any order and any batching, so a dataset and its reshard
compare exactly without sorting either.

Column checksums alone do not see values moved between rows (a row group whose ``x``
values were permuted keeps every column's multiset). So each row is also hashed whole,
its columns' value hashes combined in column-name order, and those row hashes are summed
the same way: the same multiset of rows gives the same whole-row checksum.

The same hashes place ``group_by`` keys into buckets: they are stable across processes
and runs (unlike Python's ``hash``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["Checksums", "column_hashes", "key_hashes"]

_MASK = (1 << 64) - 1
_PRIME = 0x100000001B3  # odd, so it has an inverse modulo 2**64
_PRIME_INV = pow(_PRIME, -1, 1 << 64)
_NULL = np.uint64(0x6A09E667F3BCC908)
_SEED = np.uint64(0x9E3779B97F4A7C15)
_STRING_SLICE_BYTES = 8 * 1024**2
"""Strings are hashed in slices of about this many bytes (numpy temporaries are 8x)."""


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 that spreads every input bit."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _ints(arr: pa.Array[Any]) -> np.ndarray:
    values = arr.fill_null(0).to_numpy(zero_copy_only=False)
    if values.dtype.kind == "u":
        return values.astype(np.uint64)
    return values.astype(np.int64).view(np.uint64)


def _floats(arr: pa.Array[Any]) -> np.ndarray:
    values = arr.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64)
    values = np.where(np.isnan(values), np.float64("nan"), values)
    values = np.where(values == 0.0, 0.0, values)  # -0.0 and 0.0 are equal values
    return values.view(np.uint64)


def _bytes_hashes(arr: pa.Array[Any]) -> np.ndarray:
    """A polynomial hash of each value's bytes (length mixed in), vectorized.

    ``h = sum(byte[j] * P**j)`` over a value's bytes, from prefix sums of the whole
    buffer: ``(S[end] - S[start]) * P**-start`` (P is odd, so invertible mod 2**64).
    """
    binary = arr.cast(pa.large_binary())
    count = len(binary)
    buffers: list[Any] = binary.buffers()
    offsets_all = np.frombuffer(buffers[1], dtype=np.int64)[binary.offset : binary.offset + count + 1]
    data_buf = buffers[2]
    data_all = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    out = np.empty(count, dtype=np.uint64)
    start = 0
    while start < count:  # slices of bounded bytes keep the temporaries (8x) small
        limit = offsets_all[start] + _STRING_SLICE_BYTES
        stop = min(count, max(start + 1, int(np.searchsorted(offsets_all, limit, side="right")) - 1))
        offsets = offsets_all[start : stop + 1]
        base = int(offsets[0])
        data = data_all[base : int(offsets[-1])]
        n = len(data)
        with np.errstate(over="ignore"):
            powers = np.full(n + 1, _PRIME, dtype=np.uint64)
            powers[0] = 1
            powers = np.cumprod(powers, dtype=np.uint64)
            inverse = np.full(n + 1, _PRIME_INV, dtype=np.uint64)
            inverse[0] = 1
            inverse = np.cumprod(inverse, dtype=np.uint64)
            weighted = np.zeros(n + 1, dtype=np.uint64)
            np.cumsum(data.astype(np.uint64) * powers[:n], dtype=np.uint64, out=weighted[1:])
            lo, hi = offsets[:-1] - base, offsets[1:] - base
            h = (weighted[hi] - weighted[lo]) * inverse[lo]
            out[start:stop] = _mix(h ^ _mix((hi - lo).astype(np.uint64) + _SEED))
        start = stop
    return out


def _python_hashes(arr: pa.Array[Any]) -> np.ndarray:
    """Any other type: a digest of each value's ``repr`` (slow, but exact)."""
    out = np.empty(len(arr), dtype=np.uint64)
    for i, value in enumerate(arr.to_pylist()):
        digest = hashlib.blake2b(repr(value).encode("utf-8"), digest_size=8).digest()
        out[i] = np.frombuffer(digest, dtype=np.uint64)[0]
    return out


def _raw_hashes(arr: pa.Array[Any]) -> np.ndarray:
    dtype = arr.type
    if pa.types.is_dictionary(dtype):
        return _raw_hashes(arr.cast(dtype.value_type))
    if pa.types.is_integer(dtype):
        return _mix(_ints(arr) ^ _SEED)
    if pa.types.is_boolean(dtype):
        return _mix(_ints(arr.cast(pa.uint8())) ^ _SEED)
    if pa.types.is_floating(dtype):
        return _mix(_floats(arr) ^ _SEED)
    if pa.types.is_date32(dtype) or pa.types.is_time32(dtype):
        return _mix(_ints(arr.view(pa.int32())) ^ _SEED)
    if (
        pa.types.is_date64(dtype)
        or pa.types.is_time64(dtype)
        or pa.types.is_timestamp(dtype)
        or pa.types.is_duration(dtype)
    ):
        return _mix(_ints(arr.view(pa.int64())) ^ _SEED)
    if (
        pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_binary(dtype)
        or pa.types.is_large_binary(dtype)
    ):
        return _bytes_hashes(arr)
    return _python_hashes(arr)


def column_hashes(column: pa.Array[Any] | pa.ChunkedArray[Any]) -> np.ndarray:
    """A stable 64-bit hash of every value of ``column`` (nulls share one hash)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = []
    for chunk in chunks:
        hashes = _raw_hashes(chunk) if len(chunk) else np.empty(0, dtype=np.uint64)
        if chunk.null_count:
            valid = chunk.is_valid().to_numpy(zero_copy_only=False)
            hashes = np.where(valid, hashes, _NULL)
        parts.append(hashes)
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)


def key_hashes(table: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> np.ndarray:
    """One stable hash per row of the values of ``columns`` together (a group key)."""
    combined = np.zeros(table.num_rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name in columns:
            combined = _mix(combined * np.uint64(_PRIME) + column_hashes(table.column(name)))
    return combined


@dataclass
class Checksums:
    """Row count, per column ``[nulls, sum of value hashes mod 2**64]``, and whole rows.

    Add batches with :meth:`add`, partial results with ``+``; two equal ``Checksums``
    hold the same multiset of rows (up to hash collisions): per column, and whole rows
    (``whole_rows``: the sum of each row's hash, its columns combined by name order).
    """

    rows: int = 0
    columns: dict[str, list[int]] = field(default_factory=dict)
    whole_rows: int = 0

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Count ``batch``'s rows and values."""
        self.rows += batch.num_rows
        combined = np.zeros(batch.num_rows, dtype=np.uint64)
        for name in sorted(batch.schema.names):
            column = batch.column(name)
            hashes = column_hashes(column)
            total = int(np.sum(hashes, dtype=np.uint64)) if len(hashes) else 0
            entry = self.columns.setdefault(name, [0, 0])
            entry[0] += column.null_count
            entry[1] = (entry[1] + total) & _MASK
            with np.errstate(over="ignore"):
                combined = _mix(combined * np.uint64(_PRIME) + hashes)
        row_total = int(np.sum(combined, dtype=np.uint64)) if len(combined) else 0
        self.whole_rows = (self.whole_rows + row_total) & _MASK

    def __add__(self, other: Checksums) -> Checksums:
        out = Checksums(
            self.rows + other.rows,
            {k: list(v) for k, v in self.columns.items()},
            (self.whole_rows + other.whole_rows) & _MASK,
        )
        for name, (nulls, total) in other.columns.items():
            entry = out.columns.setdefault(name, [0, 0])
            entry[0] += nulls
            entry[1] = (entry[1] + total) & _MASK
        return out

    @classmethod
    def total(cls, parts: Iterable[Checksums]) -> Checksums:
        """The sum of partial checksums."""
        out = cls()
        for part in parts:
            out = out + part
        return out

    def differences(self, other: Checksums, names: Mapping[str, str] | None = None) -> list[str]:
        """What differs between ``self`` (the source) and ``other`` (the output), as phrases."""
        found = []
        if self.rows != other.rows:
            found.append(f"{self.rows} rows in the source but {other.rows} in the output")
        for name in sorted(set(self.columns) | set(other.columns)):
            a, b = self.columns.get(name), other.columns.get(name)
            shown = (names or {}).get(name, name)
            if a is None or b is None:
                where = "output" if a is None else "source"
                found.append(f"column {shown!r} is missing from the {where}")
            elif a[0] != b[0]:
                found.append(f"column {shown!r} has {a[0]} nulls in the source but {b[0]} in the output")
            elif a[1] != b[1]:
                found.append(f"column {shown!r} holds other values in the output (checksum differs)")
        if not found and self.whole_rows != other.whole_rows:
            found.append(
                "every column holds the same values, but not in the same rows: values were moved "
                "between rows (the whole-row checksum differs)"
            )
        return found
