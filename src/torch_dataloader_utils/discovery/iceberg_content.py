"""Rows compared by content: 128-bit hashes of whole rows, and the matching of two multisets.

An incremental Iceberg epoch (:mod:`~torch_dataloader_utils.discovery.iceberg_delta`)
must tell the rows that an overwrite or a compaction only *moved* (same content, new
file) from the rows it *added*. Iceberg format v2 has no row identity, so rows are
compared by content: every row is hashed over all its columns, and the rows of the
rewritten files are matched, as a multiset, against the rows of the files the rewrites
removed (:func:`match`). A rewritten row with no removed twin is new.

The hash is computed column by column with numpy over the Arrow buffers (no Python per
row), for every Arrow type an Iceberg column can have: fixed-width values by their bytes
(floats bit for bit: ``-0.0`` and ``0.0`` differ, as do NaN payloads; a rewrite copies
bytes), strings and binaries byte by byte, lists, maps and structs from their children,
nulls apart from every value. Two lanes of 64 bits with independent seeds make a 128-bit
row hash: two different rows collide with a probability of about ``2**-128`` per pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

from torch_dataloader_utils.errors import DiscoveryError

__all__ = ["LANES", "match", "row_hashes"]

Column: TypeAlias = "pa.Array[Any] | pa.ChunkedArray[Any]"
Hashes: TypeAlias = "np.ndarray[Any, np.dtype[np.uint64]]"

LANES = (0x243F6A8885A308D3, 0x13198A2E03707344)
"""Seeds of the two 64-bit lanes of a row hash."""

_NULL = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_BLOCK_BYTES = 1 << 24
"""Bytes of strings hashed at once (8 bytes of memory per byte hashed, per lane)."""


def _mix(x: Hashes) -> Hashes:
    """The splitmix64 finalizer, elementwise (wraps modulo 2**64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _u64(value: int) -> np.uint64:
    return np.uint64(value & 0xFFFFFFFFFFFFFFFF)


def row_hashes(columns: Sequence[Column], num_rows: int) -> Hashes:
    """The 128-bit content hash of each of ``num_rows`` rows, as an ``(num_rows, 2)`` uint64 array.

    Args:
        columns: The rows' columns, in a fixed order (the same for every file compared).
        num_rows: Rows of every column.

    Raises:
        DiscoveryError: a column has a type that cannot be hashed (a union).
    """
    out = np.empty((num_rows, 2), dtype=np.uint64)
    for lane, seed in enumerate(LANES):
        h = np.full(num_rows, _u64(seed), dtype=np.uint64)
        for i, column in enumerate(columns):
            h = _mix(h ^ _column_hash(column, _u64(seed + 0x51ED27 * (i + 1))))
        out[:, lane] = h
    return out


def _column_hash(column: Column, seed: np.uint64) -> Hashes:
    if isinstance(column, pa.ChunkedArray):
        parts = [_array_hash(chunk, seed) for chunk in column.chunks]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
    return _array_hash(column, seed)


def _valid(array: pa.Array[Any]) -> np.ndarray[Any, np.dtype[np.bool_]] | None:
    """Which values are valid, or ``None`` when all are."""
    if array.null_count == 0:
        return None
    return array.is_valid().to_numpy(zero_copy_only=False)


def _array_hash(array: pa.Array[Any], seed: np.uint64) -> Hashes:
    """A 64-bit hash of every value of ``array`` (nulls hash alike, apart from any value)."""
    t = array.type
    if isinstance(t, pa.ExtensionType):
        return _array_hash(array.storage, seed)  # type: ignore[attr-defined]
    if pa.types.is_dictionary(t):
        return _array_hash(array.dictionary_decode(), seed)  # type: ignore[attr-defined]
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _array_hash(array.cast(pa.large_binary()), seed)
    n = len(array)
    if pa.types.is_null(t):
        return np.full(n, _NULL ^ seed, dtype=np.uint64)
    if pa.types.is_struct(t):
        h = np.full(n, seed, dtype=np.uint64)
        for i, child in enumerate(array.flatten()):  # type: ignore[attr-defined]
            h = _mix(h ^ _array_hash(child, seed + _u64(i + 1)))
    elif pa.types.is_fixed_size_list(t):
        size = t.list_size
        offsets = np.arange(n + 1, dtype=np.int64) * size
        child = array.values.slice(array.offset * size, n * size)  # type: ignore[attr-defined]
        h = _segments(_array_hash(child, seed + _u64(1)), offsets, seed)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        offsets = np.asarray(array.offsets, dtype=np.int64)  # type: ignore[attr-defined]
        first, last = int(offsets[0]), int(offsets[-1])
        child = array.values.slice(first, last - first)  # type: ignore[attr-defined]
        h = _segments(_array_hash(child, seed + _u64(1)), offsets - first, seed)
    elif t in (pa.string(), pa.binary(), pa.large_string(), pa.large_binary()):
        h = _bytes_hash(array, seed)
    elif pa.types.is_boolean(t):
        h = _mix(array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64) ^ seed)
    elif pa.types.is_fixed_size_binary(t) or _fixed_width(t):
        h = _fixed_hash(array, seed)
    else:
        raise DiscoveryError(f"rows with a column of type {t} cannot be compared by content")
    valid = _valid(array)
    if valid is not None:
        h = np.where(valid, h, _NULL ^ seed)
    return h


def _fixed_width(t: pa.DataType) -> bool:
    try:
        return t.bit_width % 8 == 0 and t.bit_width > 0
    except ValueError:
        return False


def _fixed_hash(array: pa.Array[Any], seed: np.uint64) -> Hashes:
    """Values of a fixed width (numbers, dates, times, decimals, fixed binaries) by their bytes."""
    t = array.type
    width = t.byte_width if pa.types.is_fixed_size_binary(t) else t.bit_width // 8
    n = len(array)
    raw = _bytes_of(array.buffers()[1])[array.offset * width : (array.offset + n) * width]
    if width in (1, 2, 4, 8):
        kind = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
        return _mix(raw.view(kind).astype(np.uint64) ^ seed)
    words = -(-width // 8)
    padded = np.zeros((n, words * 8), dtype=np.uint8)
    padded[:, :width] = raw.reshape(n, width)
    lanes = padded.view(np.uint64)
    h = np.full(n, seed ^ _u64(width), dtype=np.uint64)
    for j in range(words):
        h = _mix(h ^ lanes[:, j])
    return h


def _bytes_of(buffer: pa.Buffer | None) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The bytes of an Arrow buffer, without a copy (none for a missing buffer)."""
    if buffer is None:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(memoryview(buffer), dtype=np.uint8)


def _bytes_hash(array: pa.Array[Any], seed: np.uint64) -> Hashes:
    """Strings and binaries: every byte hashed with its position, summed per value."""
    large = array.type in (pa.large_string(), pa.large_binary())
    n = len(array)
    buffers = array.buffers()
    width = 8 if large else 4
    raw = _bytes_of(buffers[1])[array.offset * width : (array.offset + n + 1) * width]
    offsets = raw.view(np.int64 if large else np.int32).astype(np.int64)
    data = _bytes_of(buffers[2])
    out = np.empty(n, dtype=np.uint64)
    start = 0
    while start < n:  # blocks of rows of about _BLOCK_BYTES bytes: bounded memory
        stop = int(np.searchsorted(offsets, offsets[start] + _BLOCK_BYTES, side="right"))
        stop = min(n, max(stop - 1, start + 1))
        block = offsets[start : stop + 1]
        values = data[int(block[0]) : int(block[-1])].astype(np.uint64)
        lengths = np.diff(block)
        local = np.arange(len(values), dtype=np.int64) - np.repeat(block[:-1] - block[0], lengths)
        per_byte = _mix(values ^ (local.astype(np.uint64) << np.uint64(8)) ^ seed)
        out[start:stop] = _sum_segments(per_byte, block - block[0]) ^ _mix(lengths.astype(np.uint64) ^ ~seed)
        start = stop
    return _mix(out)


def _segments(child: Hashes, offsets: np.ndarray[Any, Any], seed: np.uint64) -> Hashes:
    """One hash per list: its elements' hashes, each with its position in the list, summed."""
    lengths = np.diff(offsets)
    local = np.arange(len(child), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    per_item = _mix(child ^ _mix(local.astype(np.uint64) ^ seed))
    return _mix(_sum_segments(per_item, offsets) ^ _mix(lengths.astype(np.uint64) ^ ~seed))


def _sum_segments(values: Hashes, offsets: np.ndarray[Any, Any]) -> Hashes:
    """The wrapping sum of ``values[offsets[i]:offsets[i + 1]]`` for every ``i`` (0 when empty)."""
    n = len(offsets) - 1
    if not len(values):
        return np.zeros(n, dtype=np.uint64)
    sums = np.cumsum(values, dtype=np.uint64)
    sums = np.concatenate((np.zeros(1, dtype=np.uint64), sums))
    return sums[offsets[1:]] - sums[offsets[:-1]]  # type: ignore[no-any-return]


def match(removed: Hashes, added: Hashes) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Match two multisets of row hashes: which removed rows and which added rows are twins.

    Every hash value ``h`` present ``r`` times among ``removed`` and ``a`` times among
    ``added`` pairs ``min(r, a)`` of each: the first ones in each array's order (so the
    result is the same on every process that matches the same arrays).

    Args:
        removed: ``(m, 2)`` hashes of the rows that left (files removed).
        added: ``(n, 2)`` hashes of the rows that came (files added by rewrites).

    Returns:
        ``(removed_matched, added_matched)``: boolean masks of lengths ``m`` and ``n``.
    """
    m, n = len(removed), len(added)
    if not m or not n:
        return np.zeros(m, dtype=bool), np.zeros(n, dtype=bool)
    keys = np.concatenate((removed, added))
    side = np.concatenate((np.zeros(m, dtype=np.int8), np.ones(n, dtype=np.int8)))
    index = np.arange(m + n, dtype=np.int64)
    order = np.lexsort((index, side, keys[:, 1], keys[:, 0]))
    k0, k1, s = keys[order, 0], keys[order, 1], side[order]
    new_group = np.ones(m + n, dtype=bool)
    new_group[1:] = (k0[1:] != k0[:-1]) | (k1[1:] != k1[:-1])
    group = np.cumsum(new_group) - 1
    # Within a group the removed rows come first, then the added ones, each in order.
    removed_in = np.bincount(group, weights=(s == 0), minlength=int(group[-1]) + 1).astype(np.int64)
    added_in = np.bincount(group, weights=(s == 1), minlength=int(group[-1]) + 1).astype(np.int64)
    pairs = np.minimum(removed_in, added_in)
    starts = np.flatnonzero(new_group)
    rank = np.arange(m + n, dtype=np.int64) - starts[group]
    rank = np.where(s == 1, rank - removed_in[group], rank)
    hit = rank < pairs[group]
    matched = np.empty(m + n, dtype=bool)
    matched[order] = hit
    return matched[:m], matched[m:]
