"""Chunks as numpy columns: the chunk table of a dataset, built once, and its checks.

A :class:`ChunkTable` holds chunks as columns (file id, start, stop, unit, rows, bytes,
skip, padding) over a :class:`~.table.FileTable`; :meth:`ChunkTable.chunk` builds one
:class:`~.types.Chunk` on demand. :func:`build_chunks` cuts a dataset into chunks with
a built-in strategy (``file``, ``row_group``, ``byte_range``) vectorized over the file
and row-group columns; it gives exactly the chunks of the strategy's ``split()`` (a
property test compares them), without a Python object per chunk. Built-in strategies
do not depend on the epoch, so the runtime builds the table once per dataset.
:func:`from_chunks` turns a custom strategy's chunks into a table, validating them.
:func:`check_table_overlap` is the overlap check, vectorized.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torch_dataloader_utils.plan.splits import (
    ByteRangeSplit,
    FileSplit,
    RowGroupSplit,
    check_no_overlap,
    normalize_chunks,
)
from torch_dataloader_utils.plan.table import FileTable, search
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit

__all__ = ["ChunkTable", "build_chunks", "check_table_overlap", "from_chunks", "is_builtin"]

Array = np.ndarray[Any, Any]

ROWS, BYTES = 0, 1
"""Values of :attr:`ChunkTable.unit`."""

_UNITS = (ChunkUnit.ROWS, ChunkUnit.BYTES)

_BLOCK = 1 << 14
"""Pairs of groups checked at a time for packing (bounds the temporaries)."""


def _empty() -> Array:
    return np.empty(0, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class ChunkTable:
    """Chunks as columns over a :class:`FileTable`, in a deterministic order.

    Integer columns are ``int64``, or ``int32`` where the values fit (a table of a
    built-in strategy shares the file table's ``int32`` group columns when every row
    group is one chunk).

    Attributes:
        files: The file table the ``file`` ids point into.
        file: File id of each chunk (``int32`` when the file table allows).
        start: First row (or byte) of the range.
        stop: One past the last row (or byte).
        unit: ``uint8``: 0 rows, 1 bytes.
        rows: Rows the chunk yields, ``-1`` when unknown.
        bytes: Approximate bytes on disk.
        skip: ``int64`` records to skip (windowed byte ranges), or ``None`` (all 0).
        padding: ``bool`` repeats of rows read elsewhere, or ``None`` (none).
    """

    files: FileTable
    file: Array
    start: Array
    stop: Array
    unit: Array
    rows: Array
    bytes: Array
    skip: Array | None = None
    padding: Array | None = None

    def __len__(self) -> int:
        return len(self.file)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns (the file table not counted)."""
        return sum(
            a.nbytes
            for a in (
                self.file,
                self.start,
                self.stop,
                self.unit,
                self.rows,
                self.bytes,
                self.skip,
                self.padding,
            )
            if a is not None
        )

    @property
    def known(self) -> bool:
        """Every chunk's row count is known."""
        return bool(np.all(self.rows >= 0))

    def file_of(self, i: int) -> int:
        """The file id of chunk ``i``."""
        return int(self.file[i])

    def stop_of(self, i: int) -> int:
        """The stop of chunk ``i``."""
        return int(self.stop[i])

    def span_of(self, i: int) -> tuple[int, int, int]:
        """``(file id, start, stop)`` of chunk ``i``."""
        return self.file_of(i), int(self.start[i]), self.stop_of(i)

    def files_of(self, index: Array) -> Array:
        """The file ids of the chunks at ``index`` (vectorized :meth:`file_of`)."""
        return np.asarray(self.file[index], dtype=np.int64)

    def stops_of(self, index: Array) -> Array:
        """The stops of the chunks at ``index`` (vectorized :meth:`stop_of`)."""
        return np.asarray(self.stop[index], dtype=np.int64)

    def chunks(self, index: Array, padding: Array | None = None) -> list[Chunk]:
        """The chunks at ``index`` as :class:`Chunk` values (:meth:`chunk` of each, in bulk).

        ``padding`` (``bool``, one per index) flags chunks as padding besides those the
        table flags.
        """
        index = np.asarray(index, dtype=np.int64)
        n = len(index)
        flags = self.padding[index] if self.padding is not None else np.zeros(n, dtype=bool)
        if padding is not None:
            flags = flags | padding
        skips = self.skip[index].tolist() if self.skip is not None else [0] * n
        file = self.files_of(index)
        ids, where = np.unique(file, return_inverse=True)
        paths = self.files.paths_of(ids)
        return [
            Chunk(
                paths[f],
                start,
                stop,
                _UNITS[unit],
                None if rows < 0 else rows,
                nbytes,
                pad,
                skip,
            )
            for f, start, stop, unit, rows, nbytes, pad, skip in zip(
                where.reshape(-1).tolist(),
                self.start[index].tolist(),
                self.stops_of(index).tolist(),
                self.unit[index].tolist(),
                self.rows[index].tolist(),
                self.bytes[index].tolist(),
                flags.tolist(),
                skips,
                strict=True,
            )
        ]

    def chunk(self, i: int) -> Chunk:
        """Chunk ``i`` as a :class:`Chunk`."""
        rows = int(self.rows[i])
        file, start, stop = self.span_of(i)
        return Chunk(
            self.files.path(file),
            start,
            stop,
            _UNITS[int(self.unit[i])],
            None if rows < 0 else rows,
            int(self.bytes[i]),
            bool(self.padding[i]) if self.padding is not None else False,
            int(self.skip[i]) if self.skip is not None else 0,
        )

    def part(self, i: int, lo: int, hi: int, padding: bool = False) -> Chunk:
        """Rows ``[lo, hi)`` (in the order the chunk yields them) of chunk ``i``, as a :class:`Chunk`.

        The whole chunk is returned as it is. A row range is cut after the ``lo``-th and
        ``hi``-th live rows (pruned groups and deleted positions are not rows, see
        :meth:`FileInfo.stop_after`); a byte range read in part keeps its range and
        narrows its window of records (``skip``). Bytes are shared in proportion to rows.
        """
        n = int(self.rows[i])
        whole = lo == 0 and (hi == n or n < 0)
        base = self.chunk(i)
        if whole:
            if padding and not base.padding:
                return Chunk(
                    base.path,
                    base.start,
                    base.stop,
                    base.unit,
                    base.num_rows,
                    base.num_bytes,
                    True,
                    base.skip,
                )
            return base
        size = base.num_bytes * hi // n - base.num_bytes * lo // n
        pad = padding or base.padding
        if base.unit is ChunkUnit.BYTES:
            return Chunk(base.path, base.start, base.stop, base.unit, hi - lo, size, pad, base.skip + lo)
        f = self.file_of(i)
        start = base.start if lo == 0 else self.files.stop_after(f, base.start, lo)
        stop = base.stop if hi == n else self.files.stop_after(f, base.start, hi)
        return Chunk(base.path, start, stop, ChunkUnit.ROWS, hi - lo, size, pad)

    def weight(self, i: int) -> int:
        """Balancing weight of chunk ``i``: its rows when known, else its bytes."""
        n = int(self.rows[i])
        return n if n >= 0 else int(self.bytes[i])

    def digest(self) -> int:
        """A 63-bit digest of the chunks (what a non-deterministic strategy changes)."""
        h = hashlib.blake2b(digest_size=8)
        for column in (self.file, self.start, self.stop, self.unit, self.rows, self.skip, self.padding):
            if column is not None:
                if column.dtype == np.int32:  # the same digest whatever the columns' widths
                    column = column.astype(np.int64)
                h.update(np.ascontiguousarray(column).view(np.uint8).data)
        return int.from_bytes(h.digest(), "little") >> 1

    def take(self, index: Array) -> ChunkTable:
        """The chunks at ``index``, in that order."""
        return ChunkTable(
            self.files,
            self.file[index],
            self.start[index],
            self.stop[index],
            self.unit[index],
            self.rows[index],
            self.bytes[index],
            None if self.skip is None else self.skip[index],
            None if self.padding is None else self.padding[index],
        )

    @classmethod
    def concat(cls, files: FileTable, tables: Sequence[ChunkTable]) -> ChunkTable:
        """The chunks of ``tables`` one after another."""

        def cat(name: str, dtype: Any) -> Array:
            parts = [getattr(t, name) for t in tables]
            if not parts:
                return np.empty(0, dtype=dtype)
            return np.concatenate(parts).astype(dtype, copy=False)

        def optional(name: str, dtype: Any) -> Array | None:
            if all(getattr(t, name) is None for t in tables):
                return None
            parts = [
                getattr(t, name) if getattr(t, name) is not None else np.zeros(len(t), dtype=dtype)
                for t in tables
            ]
            return np.concatenate(parts).astype(dtype, copy=False)

        return cls(
            files,
            cat("file", np.int64),
            cat("start", np.int64),
            cat("stop", np.int64),
            cat("unit", np.uint8),
            cat("rows", np.int64),
            cat("bytes", np.int64),
            optional("skip", np.int64),
            optional("padding", bool),
        )


class _GroupChunks(ChunkTable):
    """Every row group of the file table as one chunk: columns derived from the group columns.

    ``rows`` and ``bytes`` are the file table's group columns themselves; ``file``,
    ``start`` (unless the file table stores its groups' first rows) and ``stop`` are
    computed when read (for the whole table, a temporary), and one chunk's from its
    group's position, so the table holds no column of its own.
    """

    def __init__(self, files: FileTable) -> None:
        n = len(files.group_rows)
        object.__setattr__(self, "files", files)
        object.__setattr__(self, "unit", np.broadcast_to(np.uint8(ROWS), (n,)))
        object.__setattr__(self, "rows", files.group_rows)
        object.__setattr__(self, "bytes", files.group_bytes)
        object.__setattr__(self, "skip", None)
        object.__setattr__(self, "padding", None)

    @property
    def file(self) -> Array:
        """File id of each chunk (computed now)."""
        offsets = self.files.group_offsets
        ids = np.arange(len(offsets) - 1, dtype=np.int32 if len(offsets) <= 2**31 else np.int64)
        return np.repeat(ids, np.diff(offsets))

    @property
    def start(self) -> Array:
        """First row of each chunk (the file table's, or computed now)."""
        return self.files.group_first_row

    @property
    def stop(self) -> Array:
        """One past the last row of each chunk (computed now)."""
        return self.start + self.rows

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def nbytes(self) -> int:
        """0: the columns are the file table's."""
        return 0

    def __getstate__(self) -> dict[str, Any]:
        return {"files": self.files}

    def __setstate__(self, state: dict[str, Any]) -> None:
        _GroupChunks.__init__(self, state["files"])

    def file_of(self, i: int) -> int:
        return self.files.group_file(i)

    def files_of(self, index: Array) -> Array:
        return np.searchsorted(self.files.group_offsets, index, side="right").astype(np.int64) - 1

    def stops_of(self, index: Array) -> Array:
        return np.asarray(self.start[index], dtype=np.int64) + self.rows[index]

    def stop_of(self, i: int) -> int:
        return self.files.first_row(i) + int(self.rows[i])

    def span_of(self, i: int) -> tuple[int, int, int]:
        file = self.files.group_file(i)
        start = self.files.first_row(i, file)
        return file, start, start + int(self.rows[i])


def is_builtin(strategy: object) -> bool:
    """Whether ``strategy`` is one of the built-in splitters :func:`build_chunks` vectorizes."""
    return type(strategy) in (FileSplit, RowGroupSplit, ByteRangeSplit)


def _int(column: Array) -> Array:
    """An integer column as it is when ``int32`` or ``int64`` (a view, no copy), else ``int64``."""
    return column if column.dtype in (np.int32, np.int64) else column.astype(np.int64)


def _table(
    files: FileTable, file: Array, start: Array, stop: Array, unit: Array, rows: Array, size: Array
) -> ChunkTable:
    """A chunk table of the columns, ordered by file (stable); ``int32`` columns stay ``int32``."""
    if len(file) >= 2 and not bool(np.all(file[1:] >= file[:-1])):
        order = np.argsort(file, kind="stable")
        file, start, stop, unit, rows, size = (c[order] for c in (file, start, stop, unit, rows, size))
    if len(files) <= np.iinfo(np.int32).max:
        file = file.astype(np.int32, copy=False)
    return ChunkTable(
        files,
        _int(file),
        _int(start),
        _int(stop),
        unit.astype(np.uint8, copy=False),
        _int(rows),
        _int(size),
    )


def _deleted_in(files: FileTable, file: Array, start: Array, stop: Array) -> Array:
    """Deleted positions of each ``(file, [start, stop))``, vectorized."""
    out = np.zeros(len(file), dtype=np.int64)
    if files.deleted is None or files.delete_offsets is None or not len(file):
        return out
    file, start, stop = (np.asarray(c, dtype=np.int64) for c in (file, start, stop))
    lo_off = files.delete_offsets[file]
    hi_off = files.delete_offsets[file + 1]
    has = hi_off > lo_off
    if not np.any(has):
        return out
    span = int(max(files.rows.max(initial=0), files.deleted.max(initial=0), stop.max(initial=0))) + 2
    if span * (len(files) + 1) < 2**62:
        # One searchsorted over keys (file, position) of every deleted position.
        owner = np.repeat(np.arange(len(files), dtype=np.int64), np.diff(files.delete_offsets))
        keys = owner * span + files.deleted
        base = file[has] * span
        a = np.searchsorted(keys, base + np.clip(start[has], 0, span - 1))
        b = np.searchsorted(keys, base + np.clip(stop[has], 0, span - 1))
        out[has] = b - a
        return out
    for k in np.flatnonzero(has):  # pragma: no cover - positions too large for one key
        d = files.deleted_of(int(file[k]))
        a, b = np.searchsorted(d, [start[k], stop[k]])
        out[k] = b - a
    return out


def _whole_files(files: FileTable, ids: Array) -> tuple[Array, ...]:
    """``FileSplit`` chunks of the files ``ids``: ``(file, start, stop, unit, rows, bytes)``."""
    rows = files.rows[ids]
    known = rows >= 0
    r_ids = ids[known & (files.live[ids] != 0)]
    # Chunk.rows(f): rows_in(0, num_rows), bytes in proportion to rows.
    num_rows = files.rows[r_ids]
    r_rows = _rows_in(files, r_ids, np.zeros_like(num_rows), num_rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        r_bytes = np.where(num_rows > 0, files.size[r_ids] * r_rows // np.maximum(num_rows, 1), 0)
    b_ids = ids[~known]
    size = files.size[b_ids]
    totals = np.full(len(b_ids), -1, dtype=np.int64)
    if files.block_bytes is not None and files.record_offsets is not None and files.record_counts is not None:
        counted = files.block_bytes[b_ids] > 0
        cs = np.zeros(len(files.record_counts) + 1, dtype=np.int64)
        np.cumsum(files.record_counts, out=cs[1:])
        total = cs[files.record_offsets[b_ids + 1]] - cs[files.record_offsets[b_ids]]
        totals = np.where(counted, total, -1)
    keep = (size > 0) & (totals != 0)
    b_ids, size, totals = b_ids[keep], size[keep], totals[keep]
    return (
        np.concatenate([r_ids, b_ids]),
        np.zeros(len(r_ids) + len(b_ids), dtype=np.int64),
        np.concatenate([num_rows, size]),
        np.concatenate([np.full(len(r_ids), ROWS), np.full(len(b_ids), BYTES)]).astype(np.uint8),
        np.concatenate([r_rows, totals]),
        np.concatenate([r_bytes, size]),
    )


def _rows_in(files: FileTable, ids: Array, start: Array, stop: Array) -> Array:
    """:meth:`FileInfo.rows_in` of each ``(file, [start, stop))``, vectorized."""
    out = np.where(
        files.has_groups[ids], 0, np.maximum(0, np.minimum(stop, files.rows[ids]) - np.maximum(start, 0))
    )
    grouped = np.flatnonzero(files.has_groups[ids])
    if len(grouped):
        g_ids = ids[grouped]
        counts = files.group_offsets[g_ids + 1] - files.group_offsets[g_ids]
        owner = np.repeat(np.arange(len(grouped)), counts)
        first = files.group_offsets[g_ids]
        local = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        g = np.repeat(first, counts) + local
        lo = files.group_first_row[g]
        hi = lo + files.group_rows[g]
        s, e = start[grouped][owner], stop[grouped][owner]
        clipped = np.maximum(0, np.minimum(e, hi) - np.maximum(s, lo))
        out[grouped] = np.bincount(owner, weights=clipped, minlength=len(grouped)).astype(np.int64)
    return out - _deleted_in(files, ids, start, stop)


def _file_split(files: FileTable) -> ChunkTable:
    return _table(files, *_whole_files(files, np.arange(len(files), dtype=np.int64)))


def _runs(files: FileTable, ids: Array, split_bytes: int | None, split_rows: int | None) -> tuple[Array, ...]:
    """``RowGroupSplit`` runs of the files ``ids`` (all with groups).

    When every group of the table is a run of its own (no empty group, no group
    packing), the run columns are the group columns themselves (views, no copy): only
    the file ids and the stops are new, in the group columns' type.
    """
    counts = files.group_offsets[ids + 1] - files.group_offsets[ids]
    narrow = len(files) <= np.iinfo(np.int32).max
    owner = np.repeat(ids.astype(np.int32) if narrow else ids, counts)
    identity = len(ids) == len(files)  # every group, in order: the columns as they are
    g: Array | None = None
    if not identity:
        g = np.arange(int(counts.sum()), dtype=np.int64)
        g -= np.repeat(np.cumsum(counts) - counts - files.group_offsets[ids], counts)
    empty = (files.group_rows if g is None else files.group_rows[g]) == 0
    if empty.any():
        keep = ~empty
        g = np.flatnonzero(keep) if g is None else g[keep]
        owner = owner[keep]
        counts = np.bincount(np.searchsorted(ids, owner), minlength=len(ids))
        identity = False
        del keep
    del empty

    single = not len(counts) or int(counts.max()) <= 1
    del counts
    if not single and (split_bytes is not None or split_rows is not None):
        rows_g = files.group_rows if g is None else files.group_rows[g]
        bytes_g = files.group_bytes if g is None else files.group_bytes[g]
        starts = _greedy_starts(owner, rows_g, bytes_g, split_bytes, split_rows)
        del rows_g, bytes_g
        every = bool(starts.all())
        first = None if every else np.flatnonzero(starts)  # None: each group a run of its own
        del starts
    else:
        first = None  # every group is a run of its own
    firsts = files.group_first_row  # computed now when the file table derives it
    if first is None:
        file = owner
        start = firsts if g is None else firsts[g]
        run_rows = files.group_rows if g is None else files.group_rows[g]
        run_bytes = files.group_bytes if g is None else files.group_bytes[g]
        stop = start + run_rows  # fits: the table checked first + rows when it chose int32
    else:
        if g is None:
            g = np.arange(len(files.group_rows), dtype=np.int64)
        file = owner[first]
        last = np.append(first[1:], len(g))[: len(first)] - 1
        if len(first):
            run_rows = np.add.reduceat(files.group_rows[g], first, dtype=np.int64)
            run_bytes = np.add.reduceat(files.group_bytes[g], first, dtype=np.int64)
        else:
            run_rows = run_bytes = _empty()
        start = firsts[g[first]]
        stop = firsts[g[last]] + files.group_rows[g[last]]
    del g, owner, first, firsts
    if files.deleted is not None:
        fixed = _rows_in(files, file, start, stop)
        changed = fixed != run_rows
        num_rows = files.rows[file]
        with np.errstate(divide="ignore", invalid="ignore"):
            proportional = np.where(
                num_rows > 0, files.size[file] * (stop - start) // np.maximum(num_rows, 1), 0
            )
        run_bytes = np.where(changed & (run_bytes == 0), proportional, run_bytes)
        run_rows = fixed
    unit = np.zeros(len(file), dtype=np.uint8)
    return file, start, stop, unit, run_rows, run_bytes


def _greedy_starts(
    owner: Array, rows: Array, size: Array, split_bytes: int | None, split_rows: int | None
) -> Array:
    """Where each run of consecutive groups starts (``RowGroupSplit``'s greedy packing).

    The groups of all files advance in lockstep (group ``k`` of every file at once);
    when few files are left, their remaining groups are packed one by one.
    """
    n = len(owner)
    starts = np.zeros(n, dtype=bool)
    if not n:
        return starts
    boundary = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    counts = np.diff(np.r_[boundary, n])
    starts[boundary] = True
    run_bytes = size[boundary].astype(np.int64)
    run_rows = rows[boundary].astype(np.int64)
    active = np.flatnonzero(counts > 1)  # files (by slot) with a group at the next level
    level = 1
    while len(active) >= 32:
        idx = boundary[active] + level
        b, r = size[idx], rows[idx]
        full = np.zeros(len(idx), dtype=bool)
        if split_bytes is not None:
            full |= run_bytes[active] + b > split_bytes
        if split_rows is not None:
            full |= run_rows[active] + r > split_rows
        starts[idx] = full
        run_bytes[active] = np.where(full, b, run_bytes[active] + b)
        run_rows[active] = np.where(full, r, run_rows[active] + r)
        level += 1
        active = active[counts[active] > level]
    # Few files have more groups: finish them one group at a time.
    for slot in active.tolist():
        rb, rr = int(run_bytes[slot]), int(run_rows[slot])
        for k in range(int(boundary[slot]) + level, int(boundary[slot] + counts[slot])):
            nb, nr = int(size[k]), int(rows[k])
            over = (split_bytes is not None and rb + nb > split_bytes) or (
                split_rows is not None and rr + nr > split_rows
            )
            if over:
                starts[k] = True
                rb, rr = nb, nr
            else:
                rb, rr = rb + nb, rr + nr
    return starts


def _every_group_a_chunk(files: FileTable, strategy: RowGroupSplit) -> bool:
    """Whether each row group of every file is one chunk (no empty group, no packing, no deletes)."""
    if files.deleted is not None or not bool(files.has_groups.all()) or not len(files.group_rows):
        return False
    if bool((files.group_rows == 0).any()):
        return False
    if strategy.split_bytes is None and strategy.split_rows is None:
        return True
    offsets = files.group_offsets
    if int(np.diff(offsets).max()) <= 1:
        return True
    # Packing: a group joins the run before it when the two fit under every limit given;
    # none does when no two consecutive groups of a file fit (checked a block at a time).
    pairs = len(files.group_rows) - 1  # pair k: groups k and k + 1
    for a in range(0, pairs, _BLOCK):
        b = min(pairs, a + _BLOCK)
        joins = np.ones(b - a, dtype=bool)
        for limit, column in (
            (strategy.split_bytes, files.group_bytes),
            (strategy.split_rows, files.group_rows),
        ):
            if limit is not None:
                joins &= column[a + 1 : b + 1].astype(np.int64) + column[a:b] <= limit
        # Groups k and k + 1 of different files never join: k + 1 starts a file.
        bounds = offsets[search(offsets, a + 1) : search(offsets, b, "right")]
        joins[bounds - 1 - a] = False
        if joins.any():
            return False
    return True


def _row_group_split(files: FileTable, strategy: RowGroupSplit) -> ChunkTable:
    if _every_group_a_chunk(files, strategy):
        return _GroupChunks(files)
    ids = np.arange(len(files), dtype=np.int64)
    whole = _whole_files(files, ids[~files.has_groups])
    runs = _runs(files, ids[files.has_groups], strategy.split_bytes, strategy.split_rows)
    if not len(whole[0]):  # every file has groups: the runs as they are (views, no copy)
        return _table(files, *runs)
    return _table(files, *(np.concatenate([a, b]) for a, b in zip(whole, runs, strict=True)))


def _byte_range_split(files: FileTable, strategy: ByteRangeSplit) -> ChunkTable:
    ids = np.arange(len(files), dtype=np.int64)
    ranged = (files.rows < 0) & files.splittable & (files.size > strategy.split_bytes)
    whole = _whole_files(files, ids[~ranged])
    r_ids = ids[ranged]
    block = np.zeros(len(r_ids), dtype=np.int64)
    if files.block_bytes is not None:
        block = files.block_bytes[r_ids]
    step = np.where(
        block > 0, np.maximum(1, strategy.split_bytes // np.maximum(block, 1)) * block, strategy.split_bytes
    )
    size = files.size[r_ids]
    count = -(-size // step)
    file = np.repeat(r_ids, count)
    local = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    step_r, size_r = np.repeat(step, count), np.repeat(size, count)
    start = local * step_r
    stop = np.minimum(size_r, start + step_r)
    rows = np.full(len(file), -1, dtype=np.int64)
    if files.block_bytes is not None and files.record_offsets is not None and files.record_counts is not None:
        block_r = np.repeat(block, count)
        counted = block_r > 0
        cs = np.zeros(len(files.record_counts) + 1, dtype=np.int64)
        np.cumsum(files.record_counts, out=cs[1:])
        c_file, c_start, c_stop, c_block = file[counted], start[counted], stop[counted], block_r[counted]
        base = files.record_offsets[c_file]
        rows[counted] = cs[base + (-(-c_stop // c_block))] - cs[base + c_start // c_block]
    keep = rows != 0
    ranges = (
        file[keep],
        start[keep],
        stop[keep],
        np.full(int(keep.sum()), BYTES, np.uint8),
        rows[keep],
        (stop - start)[keep],
    )
    return _table(files, *(np.concatenate([a, b]) for a, b in zip(whole, ranges, strict=True)))


def build_chunks(strategy: FileSplit | RowGroupSplit | ByteRangeSplit, files: FileTable) -> ChunkTable:
    """Every chunk of a built-in strategy, vectorized: those of ``strategy.split(files)``.

    Raises:
        TypeError: ``strategy`` is not a built-in splitter (see :func:`is_builtin`).
    """
    if type(strategy) is FileSplit:
        return _file_split(files)
    if type(strategy) is RowGroupSplit:
        return _row_group_split(files, strategy)
    if type(strategy) is ByteRangeSplit:
        return _byte_range_split(files, strategy)
    raise TypeError(f"not a built-in split strategy: {strategy!r}")


def from_chunks(chunks: Sequence[Chunk], files: FileTable, strategy_name: str) -> ChunkTable:
    """A custom strategy's chunks as a table, validated, with exact row counts filled in.

    Raises:
        PlanError: a chunk names an unknown file, or its range is empty or out of bounds.
    """
    chunks = normalize_chunks(chunks, files, strategy_name)
    n = len(chunks)
    ids = np.fromiter((files.index(c.path) for c in chunks), dtype=np.int64, count=n)
    skip = np.fromiter((c.skip for c in chunks), dtype=np.int64, count=n)
    padding = np.fromiter((c.padding for c in chunks), dtype=bool, count=n)
    return ChunkTable(
        files,
        ids,
        np.fromiter((c.start for c in chunks), dtype=np.int64, count=n),
        np.fromiter((c.stop for c in chunks), dtype=np.int64, count=n),
        np.fromiter((_UNITS.index(c.unit) for c in chunks), dtype=np.uint8, count=n),
        np.fromiter((-1 if c.num_rows is None else c.num_rows for c in chunks), dtype=np.int64, count=n),
        np.fromiter((c.num_bytes for c in chunks), dtype=np.int64, count=n),
        skip if skip.any() else None,
        padding if padding.any() else None,
    )


def check_table_overlap(table: ChunkTable, what: str) -> None:
    """:func:`~.splits.check_no_overlap` over a chunk table, vectorized.

    Files where two chunks may share rows are found with numpy; only their chunks are
    built as objects, for the exact check and its message.

    Raises:
        OverlappingChunksError: naming both chunks.
    """
    keep = np.ones(len(table), dtype=bool) if table.padding is None else ~table.padding
    file, start, stop, unit = table.file[keep], table.start[keep], table.stop[keep], table.unit[keep]
    if len(file) < 2:
        return
    order = np.lexsort((unit, stop, start, file))
    f, s, e, u = file[order], start[order], stop[order], unit[order]
    same = (f[1:] == f[:-1]) & (s[1:] == s[:-1]) & (e[1:] == e[:-1]) & (u[1:] == u[:-1])
    suspect = set(f[1:][same].tolist())
    distinct = np.r_[True, ~same]
    f, s, e, u = f[distinct], s[distinct], e[distinct], u[distinct]
    along = f[1:] == f[:-1]
    bad = along & ((u[1:] != u[:-1]) | (s[1:] < e[:-1]))
    suspect.update(f[1:][bad].tolist())
    if not suspect:
        return
    index = np.flatnonzero(keep)[np.isin(file, np.array(sorted(suspect), dtype=np.int64))]
    check_no_overlap([table.chunk(int(i)) for i in index], what)
