"""Columnar metadata of a dataset's files: one row per file, one per row group / stripe.

A :class:`FileTable` keeps what planning needs as numpy columns instead of one Python
object per file: paths as one ``uint8`` blob with offsets, sizes, modification times,
row counts (``-1``: unknown), a row-group / stripe table ``(index in file, first row,
rows, bytes)`` with per-file offsets into it, and, concatenated with per-file offsets,
the record counts of text files (:class:`~.types.RecordIndex`) and the deleted
positions of Iceberg data files. About 90 bytes per file plus 8 per row group: the group
columns are ``int32`` when their values fit, and the index and first row of each group
are not stored when they follow from the rows (every file's groups in file order, none
pruned: what a footer gives), but computed when read.

Planning works on file ids (positions in the table). A :class:`~.types.FileInfo` is
built for one file on demand (:meth:`FileTable.info`, or ``table[path]``: the table is a
read-only ``Mapping[str, FileInfo]``), for the few files whose chunks a rank cuts or a
reader opens. A table built with :meth:`FileTable.from_infos` keeps the objects it was
given and hands them back unchanged (subclasses included); one built with
:meth:`FileTable.from_arrays` (what a columnar discovery produces) builds them.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
from numpy.typing import ArrayLike

from torch_dataloader_utils.plan.bounded import BoundedDict
from torch_dataloader_utils.plan.types import FileInfo, RecordIndex, RowGroup

__all__ = ["FileTable", "FileWithDeletes", "encode_paths", "search"]

Array = np.ndarray[Any, Any]


def encode_paths(paths: Sequence[str]) -> tuple[Array, Array]:
    """Paths as one UTF-8 ``uint8`` blob and ``len(paths) + 1`` ``int64`` offsets."""
    encoded = [p.encode() for p in paths]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    if encoded:
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return blob, offsets


@dataclass(frozen=True, slots=True)
class FileWithDeletes(FileInfo):
    """A :class:`FileInfo` whose row counts exclude deleted positions (Iceberg deletes).

    Built by :meth:`FileTable.info` for a file with deleted positions; the same row
    arithmetic as the Iceberg discovery's own file type.

    Attributes:
        deleted: Sorted, unique deleted file row positions (``int64``).
    """

    deleted: Any = field(default=None, compare=False, repr=False)

    @property
    def live_rows(self) -> int | None:
        """Rows left after deletes."""
        rows: int | None = FileInfo.live_rows.fget(self)  # type: ignore[attr-defined]
        if rows is None or self.deleted is None:
            return rows
        return int(rows - len(self.deleted))

    def rows_in(self, start: int, stop: int) -> int:
        """Rows in ``[start, stop)`` left after deletes."""
        return FileInfo.rows_in(self, start, stop) - self.deleted_in(start, stop)

    def deleted_in(self, start: int, stop: int) -> int:
        """How many deleted positions lie in ``[start, stop)``."""
        if self.deleted is None or len(self.deleted) == 0:
            return 0
        lo, hi = np.searchsorted(self.deleted, [start, stop])
        return int(hi - lo)

    def stop_after(self, start: int, rows: int) -> int:
        """The smallest ``stop`` with ``rows_in(start, stop) == rows``.

        Raises:
            ValueError: fewer than ``rows`` live rows follow ``start``.
        """
        if rows < 0:
            raise ValueError(f"rows must be >= 0, got {rows}")
        stop = start + rows
        while True:  # least fixed point of stop = start + rows + deleted_in(start, stop)
            moved = start + rows + self.deleted_in(start, stop)
            if moved == stop:
                break
            stop = moved
        if self.num_rows is not None and stop > self.num_rows:
            raise ValueError(f"{self.path!r} has fewer than {rows} live rows after position {start}")
        return stop


def _i64(values: ArrayLike | None, n: int, name: str, default: int | None = None) -> Array:
    if values is None:
        if default is None:
            raise ValueError(f"{name} is required")
        return np.full(n, default, dtype=np.int64)
    out = np.ascontiguousarray(values, dtype=np.int64)
    if out.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {out.shape}")
    return out


_I32 = np.iinfo(np.int32)


def _fits_int32(*columns: Array) -> bool:
    """Whether the columns' values, and the sum of their largest values, fit ``int32``."""
    lo = sum(int(c.min()) for c in columns if len(c))
    hi = sum(int(c.max()) for c in columns if len(c))
    return bool(min(lo, 0) >= _I32.min and hi <= _I32.max)


def _narrow(column: Array, fits: bool) -> Array:
    """``column`` as ``int32`` when ``fits`` (one copy, or none when it already is)."""
    return np.ascontiguousarray(column, dtype=np.int32) if fits else column


def _index_column(index: Array) -> Array:
    """Group positions as ``int16`` when they fit, else ``int32``."""
    small = not len(index) or (int(index.min()) >= 0 and int(index.max()) < 2**15)
    return np.ascontiguousarray(index, dtype=np.int16 if small else np.int32)


def _column(values: ArrayLike | None, n: int, name: str) -> Array:
    """An integer column of length ``n`` (``int32`` or ``int64`` kept as given; default zeros)."""
    if values is None:
        return np.zeros(n, dtype=np.int32)
    out = np.asarray(values)
    if out.dtype not in (np.int16, np.int32, np.int64):
        out = out.astype(np.int64)
    out = np.ascontiguousarray(out)
    if out.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {out.shape}")
    return out


def _offsets(values: ArrayLike | None, n: int, total: int, name: str, narrow: bool = False) -> Array:
    """Offsets ``0 .. total`` (``n + 1``), checked; ``narrow``: ``int32`` when ``total`` fits."""
    out = _column(values, n + 1, name)
    if out.dtype == np.int16:
        out = out.astype(np.int64)
    if n >= 0 and (out[0] != 0 or out[-1] != total or np.any(out[1:] < out[:-1])):
        raise ValueError(f"{name} must rise from 0 to {total}")
    if narrow and total <= _I32.max:
        return out.astype(np.int32, copy=False)
    return out.astype(np.int64, copy=False)


def search(column: Array, value: int, side: str = "left") -> int:
    """``np.searchsorted(column, value, side)`` for a sorted integer column and an int.

    The key is given the column's type: numpy would otherwise convert an ``int32``
    column to ``int64`` first, a copy of the whole column on every call.
    """
    if value > np.iinfo(column.dtype).max:
        return len(column)
    return int(column.searchsorted(column.dtype.type(value), side=side))  # type: ignore[call-overload]


_PIECE = 1 << 14
"""Groups at a time when a column over every group is checked or computed (bounds the temporaries)."""


def _pieces(offsets: Array) -> Iterator[tuple[int, int, int, int]]:
    """``(f0, f1, g0, g1)``: files ``[f0, f1)`` and their groups ``[g0, g1)``, a piece at a time.

    A piece holds about :data:`_PIECE` groups (whole files: more for a larger file).
    """
    n = len(offsets) - 1
    f0 = 0
    while f0 < n:
        g0 = int(offsets[f0])
        f1 = min(n, max(f0 + 1, search(offsets, g0 + _PIECE, "right") - 1))
        yield f0, f1, g0, int(offsets[f1])
        f0 = f1


def _positions(offsets: Array, f0: int, f1: int, g0: int, g1: int) -> Array:
    """Position in its file of each group of ``[g0, g1)`` (the groups of files ``[f0, f1)``)."""
    out: Array = np.arange(g0, g1, dtype=np.int64)
    out -= np.repeat(offsets[f0:f1], np.diff(offsets[f0 : f1 + 1]))
    return out


def _running_rows(rows: Array, offsets: Array, f0: int, f1: int, g0: int, g1: int) -> Array:
    """Rows of the groups before each group of ``[g0, g1)`` in its file (``int64``)."""
    piece = rows[g0:g1]
    out = np.cumsum(piece, dtype=np.int64)
    out -= piece
    counts = np.diff(offsets[f0 : f1 + 1])
    full = counts > 0
    out -= np.repeat(out[offsets[f0:f1][full] - g0], counts[full])
    return out


def _derivable(offsets: Array, index: Array, first: Array, rows: Array) -> tuple[bool, bool]:
    """Whether ``index`` is each group's position in its file, and ``first`` the rows before it."""
    same_index = same_first = True
    for f0, f1, g0, g1 in _pieces(offsets):
        if same_index:
            same_index = bool(np.array_equal(index[g0:g1], _positions(offsets, f0, f1, g0, g1)))
        if same_first:
            same_first = bool(np.array_equal(first[g0:g1], _running_rows(rows, offsets, f0, f1, g0, g1)))
        if not (same_index or same_first):
            break
    return same_index, same_first


class FileTable(Mapping[str, FileInfo]):
    """The files of a dataset as numpy columns; a read-only ``Mapping[str, FileInfo]``.

    Build it with :meth:`from_infos` (from ``FileInfo`` objects) or :meth:`from_arrays`
    (from plain numpy columns). Files keep their order: file id ``i`` is the ``i``-th
    file given. Paths must be distinct.
    """

    __slots__ = (
        "_by_path",
        "_cache",
        "_deleted_count",
        "_group_first_row",
        "_group_index",
        "_infos",
        "_order",
        "_seen",
        "block_bytes",
        "delete_offsets",
        "deleted",
        "etag_blob",
        "etag_offsets",
        "group_bytes",
        "group_offsets",
        "group_rows",
        "has_groups",
        "live",
        "mtime",
        "path_offsets",
        "paths_blob",
        "record_counts",
        "record_offsets",
        "rows",
        "size",
        "splittable",
    )

    paths_blob: Array
    """Every path, UTF-8, concatenated (``uint8``)."""
    path_offsets: Array
    """``n + 1`` offsets, ``int32`` when the blob's size fits (else ``int64``): path ``i`` is
    ``paths_blob[path_offsets[i]:path_offsets[i + 1]]``."""
    size: Array
    """``int64`` size in bytes."""
    mtime: Array
    """``float64`` modification time, ``nan`` when unknown."""
    rows: Array
    """``int64`` rows in the file (pruned groups and deleted positions included), ``-1`` unknown."""
    live: Array
    """``int64`` rows that planning deals out (:attr:`FileInfo.live_rows`), ``-1`` unknown
    (the :attr:`rows` column itself when every file's are its rows)."""
    splittable: Array
    """``bool``: byte-range splitting may cut the file."""
    has_groups: Array
    """``bool``: the file's row groups are known (``FileInfo.row_groups is not None``)."""
    group_offsets: Array
    """``n + 1`` offsets, ``int32`` when the number of groups fits (else ``int64``): file
    ``i``'s unpruned groups are ``[group_offsets[i], group_offsets[i + 1])``."""
    group_rows: Array
    """Rows of each group (the same type as :attr:`group_first_row`)."""
    group_bytes: Array
    """Bytes on disk of each group: ``int32`` when every value fits, else ``int64``."""
    block_bytes: Array | None
    """``int64`` record-count block size of each text file (0: not counted), or ``None``."""
    record_offsets: Array | None
    """``int64``, ``n + 1``: offsets into :attr:`record_counts`, or ``None``."""
    record_counts: Array | None
    """``int64`` records starting in each block, every counted file's blocks concatenated."""
    delete_offsets: Array | None
    """``int64``, ``n + 1``: offsets into :attr:`deleted`, or ``None`` (no file has deletes)."""
    deleted: Array | None
    """``int64`` sorted deleted positions of each file, concatenated."""
    etag_blob: Array | None
    """Every file's ETag, UTF-8, concatenated (``uint8``; empty: none), or ``None`` (no file has one)."""
    etag_offsets: Array | None
    """``n + 1`` offsets into :attr:`etag_blob`, or ``None``."""

    _group_index: Array | None
    _group_first_row: Array | None
    _infos: Sequence[FileInfo] | None
    _by_path: dict[str, int] | None
    _order: Array | None
    _cache: BoundedDict[int, FileInfo]
    _seen: dict[str, int]
    _deleted_count: Array | None

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls,
        *,
        paths: Sequence[str] | None = None,
        paths_blob: ArrayLike | None = None,
        path_offsets: ArrayLike | None = None,
        size: ArrayLike,
        rows: ArrayLike | None = None,
        mtime: ArrayLike | None = None,
        splittable: ArrayLike | None = None,
        group_offsets: ArrayLike | None = None,
        group_index: ArrayLike | None = None,
        group_first_row: ArrayLike | None = None,
        group_rows: ArrayLike | None = None,
        group_bytes: ArrayLike | None = None,
        has_groups: ArrayLike | None = None,
        block_bytes: ArrayLike | None = None,
        record_offsets: ArrayLike | None = None,
        record_counts: ArrayLike | None = None,
        delete_offsets: ArrayLike | None = None,
        deleted: ArrayLike | None = None,
        live: ArrayLike | None = None,
        etag_blob: ArrayLike | None = None,
        etag_offsets: ArrayLike | None = None,
    ) -> FileTable:
        """A table from plain numpy columns (what a columnar discovery produces).

        Args:
            paths: The paths, as strings; or give ``paths_blob`` (UTF-8 bytes, ``uint8``)
                and ``path_offsets`` (``int64``, ``n + 1``) instead (see :func:`encode_paths`).
            paths_blob: Every path's UTF-8 bytes, concatenated.
            path_offsets: Where each path starts in ``paths_blob``, then its total length
                (integers; kept as ``int32`` when the total fits).
            size: ``int64`` size in bytes of each file; ``n`` is its length.
            rows: ``int64`` rows of each file (``-1``: unknown, a text file); default unknown.
            mtime: ``float64`` modification times (``nan``: unknown); default unknown.
            splittable: ``bool`` per file (default ``True``).
            group_offsets: ``n + 1`` integers: each file's rows of the group columns
                (its unpruned row groups / stripes, in file order; kept as ``int32``
                when the number of groups fits). Omitted: no file has row-group metadata.
            group_index: Position of each group in its file (integers).
            group_first_row: File row of each group's first row (integers).
            group_rows: Rows of each group (integers).
            group_bytes: Bytes on disk of each group (integers; default 0). The group
                columns are kept as ``int32`` when their values fit (``int16`` for
                ``group_index``), so a discovery that gives them so is not copied;
                ``group_index`` and ``group_first_row`` are not kept when they follow from
                the offsets and rows (each file's groups numbered ``0, 1, ...`` and
                starting where the previous one ends).
            has_groups: ``bool`` per file, whether its groups are known (default: every
                file when ``group_offsets`` is given, else none).
            block_bytes: ``int64`` record-count block size per text file (0: not counted).
            record_offsets: ``int64``, ``n + 1``: each file's blocks in ``record_counts``.
            record_counts: ``int64`` records starting in each block.
            delete_offsets: ``int64``, ``n + 1``: each file's positions in ``deleted``.
            deleted: ``int64`` sorted, unique deleted positions per file, concatenated.
            live: ``int64`` rows planning deals out per file (default: derived from the
                rows, groups and deletes as :attr:`FileInfo.live_rows` does).
            etag_blob: Every file's ETag, UTF-8, concatenated (an empty one: none), with
                ``etag_offsets`` (``n + 1``); omitted: no file has one.
            etag_offsets: Where each ETag starts in ``etag_blob``, then its total length.

        Raises:
            ValueError: a column has the wrong length, or offsets do not rise.
        """
        if paths is not None:
            paths_blob, path_offsets = encode_paths(paths)
        if paths_blob is None or path_offsets is None:
            raise ValueError("give paths, or paths_blob and path_offsets")
        self = cls.__new__(cls)
        blob = np.ascontiguousarray(paths_blob, dtype=np.uint8)
        n = len(np.asarray(path_offsets)) - 1
        self.paths_blob = blob
        self.path_offsets = _offsets(path_offsets, n, len(blob), "path_offsets", narrow=True)
        self.size = _i64(size, n, "size")
        self.rows = _i64(rows, n, "rows", -1)
        self.mtime = np.full(n, np.nan) if mtime is None else np.ascontiguousarray(mtime, dtype=np.float64)
        self.splittable = (
            np.ones(n, dtype=bool) if splittable is None else np.ascontiguousarray(splittable, dtype=bool)
        )
        self._set_groups(n, group_offsets, group_index, group_first_row, group_rows, group_bytes, has_groups)
        self._set_extras(n, block_bytes, record_offsets, record_counts, delete_offsets, deleted)
        if etag_blob is not None and etag_offsets is not None and len(np.asarray(etag_blob)):
            tags = np.ascontiguousarray(etag_blob, dtype=np.uint8)
            self.etag_blob = tags
            self.etag_offsets = _offsets(etag_offsets, n, len(tags), "etag_offsets", narrow=True)
        else:
            self.etag_blob = self.etag_offsets = None
        self._infos = None
        self._init_derived(live)
        return self

    def _set_groups(
        self,
        n: int,
        offsets: ArrayLike | None,
        index: ArrayLike | None,
        first_row: ArrayLike | None,
        rows: ArrayLike | None,
        nbytes: ArrayLike | None,
        has_groups: ArrayLike | None,
    ) -> None:
        """The row-group columns of :meth:`from_arrays`, narrowed where their values fit."""
        if offsets is None:
            self.group_offsets = np.zeros(n + 1, dtype=np.int32)
            self.has_groups = np.zeros(n, dtype=bool)
            groups = 0
        else:
            groups = len(np.asarray(rows))
            self.group_offsets = _offsets(offsets, n, groups, "group_offsets", narrow=True)
            self.has_groups = (
                np.ones(n, dtype=bool) if has_groups is None else np.ascontiguousarray(has_groups, dtype=bool)
            )
        # Group columns are kept as int32 when their values fit (checked), half the memory:
        # rows and first rows together (a group's stop row, first + rows, must fit too).
        rows_col = _column(rows, groups, "group_rows")
        first_col = _column(first_row, groups, "group_first_row")
        index_col = _column(index, groups, "group_index")
        fits = _fits_int32(rows_col, first_col)
        same_index, same_first = _derivable(self.group_offsets, index_col, first_col, rows_col)
        self.group_rows = _narrow(rows_col, fits)
        self._group_first_row = None if same_first else _narrow(first_col, fits)
        self._group_index = None if same_index else _index_column(index_col)
        del rows_col, first_col, index_col
        bytes_col = _column(nbytes, groups, "group_bytes")
        self.group_bytes = _narrow(bytes_col, _fits_int32(bytes_col))

    def _set_extras(
        self,
        n: int,
        block_bytes: ArrayLike | None,
        record_offsets: ArrayLike | None,
        record_counts: ArrayLike | None,
        delete_offsets: ArrayLike | None,
        deleted: ArrayLike | None,
    ) -> None:
        """The text record counts and the deleted positions of :meth:`from_arrays`."""
        if record_counts is not None:
            counts = np.ascontiguousarray(record_counts, dtype=np.int64)
            self.record_counts = counts
            self.record_offsets = _offsets(record_offsets, n, len(counts), "record_offsets")
            self.block_bytes = _i64(block_bytes, n, "block_bytes", 0)
        else:
            self.record_counts = self.record_offsets = self.block_bytes = None
        dels = None if deleted is None else np.ascontiguousarray(deleted, dtype=np.int64)
        if dels is not None and len(dels):
            self.deleted = dels
            self.delete_offsets = _offsets(delete_offsets, n, len(dels), "delete_offsets")
        else:
            self.deleted = self.delete_offsets = None

    @classmethod
    def from_infos(cls, infos: Sequence[FileInfo]) -> FileTable:
        """A table of ``FileInfo`` objects (what discovery returns today).

        The objects are kept: :meth:`info` and ``table[path]`` return them unchanged,
        so subclasses (Iceberg files with deletes) keep their own row arithmetic.
        """
        infos = tuple(infos)
        n = len(infos)
        blob, offsets = encode_paths([f.path for f in infos])
        groups = [f.row_groups or () for f in infos]
        group_counts = np.fromiter((len(g) for g in groups), dtype=np.int64, count=n)
        group_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(group_counts, out=group_offsets[1:])
        flat = [g for gs in groups for g in gs]
        records = [f.records for f in infos]
        has_records = any(r is not None for r in records)
        dels = [getattr(f, "deleted", None) for f in infos]
        has_deletes = any(d is not None and len(d) for d in dels)
        record_kwargs: dict[str, Any] = {}
        if has_records:
            counts = [r.counts if r is not None else () for r in records]
            record_offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum([len(c) for c in counts], out=record_offsets[1:])
            record_kwargs = {
                "block_bytes": [r.block_bytes if r is not None else 0 for r in records],
                "record_offsets": record_offsets,
                "record_counts": np.fromiter(
                    (c for cs in counts for c in cs), dtype=np.int64, count=int(record_offsets[-1])
                ),
            }
        delete_kwargs: dict[str, Any] = {}
        if has_deletes:
            arrays = [np.asarray(d, dtype=np.int64) if d is not None else np.empty(0, np.int64) for d in dels]
            delete_offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum([len(a) for a in arrays], out=delete_offsets[1:])
            delete_kwargs = {"delete_offsets": delete_offsets, "deleted": np.concatenate(arrays)}
        etag_kwargs: dict[str, Any] = {}
        if any(f.etag for f in infos):
            tags, tag_offsets = encode_paths([f.etag or "" for f in infos])
            etag_kwargs = {"etag_blob": tags, "etag_offsets": tag_offsets}
        table = cls.from_arrays(
            paths_blob=blob,
            path_offsets=offsets,
            size=np.fromiter((f.size for f in infos), dtype=np.int64, count=n),
            rows=np.fromiter((-1 if f.num_rows is None else f.num_rows for f in infos), np.int64, n),
            mtime=np.fromiter((np.nan if f.mtime is None else f.mtime for f in infos), np.float64, n),
            splittable=np.fromiter((f.splittable for f in infos), dtype=bool, count=n),
            group_offsets=group_offsets,
            group_index=np.fromiter((g.index for g in flat), dtype=np.int32, count=len(flat)),
            group_first_row=np.fromiter((g.first_row for g in flat), dtype=np.int64, count=len(flat)),
            group_rows=np.fromiter((g.num_rows for g in flat), dtype=np.int64, count=len(flat)),
            group_bytes=np.fromiter((g.num_bytes for g in flat), dtype=np.int64, count=len(flat)),
            has_groups=np.fromiter((f.row_groups is not None for f in infos), dtype=bool, count=n),
            live=np.fromiter((-1 if (v := f.live_rows) is None else v for f in infos), np.int64, n),
            **record_kwargs,
            **delete_kwargs,
            **etag_kwargs,
        )
        table._infos = infos
        return table

    def _init_derived(self, live: Any) -> None:
        n = len(self.size)
        for name in ("mtime", "splittable", "has_groups"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name} must have shape ({n},)")
        self._by_path = None
        self._order = None
        self._cache = BoundedDict(64)
        self._seen = {}
        if self.delete_offsets is not None:
            self._deleted_count = np.diff(self.delete_offsets)
        else:
            self._deleted_count = None
        if live is not None:
            self.live = _i64(live, n, "live")
            return
        # The file's rows, or for a file with groups the rows of its groups, summed a
        # piece of files at a time (no temporary over every file or group). When they
        # are every file's rows (no pruned group, no delete), the rows column is shared.
        out: Array | None = None
        offsets = self.group_offsets
        for f0, f1, g0, g1 in _pieces(offsets):
            has = self.has_groups[f0:f1]
            if not has.any():
                continue
            counts = np.diff(offsets[f0 : f1 + 1])
            full = counts > 0
            sums = np.zeros(f1 - f0, dtype=np.int64)
            if g1 > g0:
                sums[full] = np.add.reduceat(
                    self.group_rows[g0:g1], offsets[f0:f1][full] - g0, dtype=np.int64
                )
            if out is None:
                if np.array_equal(sums[has], self.rows[f0:f1][has]):
                    continue
                out = self.rows.copy()  # the files before agree with their rows
            out[f0:f1][has] = sums[has]
        if self._deleted_count is not None:
            out = self.rows.copy() if out is None else out
            np.subtract(out, self._deleted_count, out=out, where=out >= 0)
        self.live = self.rows if out is None else out

    # -- group columns that may be derived -------------------------------------------
    @property
    def group_index(self) -> Array:
        """Position of each group in its file: ``int16`` when the values fit, else ``int32``.

        Computed when read (a new array) when every file's groups are numbered
        ``0, 1, ...`` in order, as a footer gives them; stored otherwise (pruned groups).
        """
        if self._group_index is not None:
            return self._group_index
        offsets = self.group_offsets
        most = int(np.diff(offsets).max(initial=0))
        out = np.empty(int(offsets[-1]), dtype=np.int16 if most <= 2**15 else np.int32)
        for f0, f1, g0, g1 in _pieces(offsets):
            out[g0:g1] = _positions(offsets, f0, f1, g0, g1)
        return out

    @property
    def group_first_row(self) -> Array:
        """File row of each group's first row (the same type as :attr:`group_rows`).

        Computed when read (a new array) when each group starts where the one before it
        in the file ends, as a footer gives them; stored otherwise (pruned groups). One
        group's: :meth:`first_row`.
        """
        if self._group_first_row is not None:
            return self._group_first_row
        offsets = self.group_offsets
        out = np.empty(len(self.group_rows), dtype=self.group_rows.dtype)
        for f0, f1, g0, g1 in _pieces(offsets):
            out[g0:g1] = _running_rows(self.group_rows, offsets, f0, f1, g0, g1)
        return out

    def group_file(self, g: int) -> int:
        """The file id of group ``g`` (a position in the group columns)."""
        return search(self.group_offsets, g, "right") - 1

    def first_row(self, g: int, file: int | None = None) -> int:
        """File row of group ``g``'s first row (``file``: its file id, when known)."""
        if self._group_first_row is not None:
            return int(self._group_first_row[g])
        lo = int(self.group_offsets[self.group_file(g) if file is None else file])
        if g - lo <= 64:  # a few groups: faster as Python ints
            return sum(self.group_rows[lo:g].tolist())
        return int(self.group_rows[lo:g].sum(dtype=np.int64))

    # -- Mapping[str, FileInfo] -----------------------------------------------------
    def __len__(self) -> int:
        return len(self.size)

    def __iter__(self) -> Iterator[str]:
        return (self.path(i) for i in range(len(self)))

    def __getitem__(self, path: str) -> FileInfo:
        return self.info(self.index(path))

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str):
            return False
        try:
            self.index(path)
        except KeyError:
            return False
        return True

    def __repr__(self) -> str:
        return f"FileTable({len(self)} files, {len(self.group_rows)} row groups, {self.nbytes} bytes)"

    def __getstate__(self) -> dict[str, Any]:
        state = {name: getattr(self, name) for name in self.__slots__}
        state.update(_by_path=None, _cache=BoundedDict(64), _seen={})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    # -- one file ---------------------------------------------------------------------
    def path(self, i: int) -> str:
        """The path of file ``i``."""
        if self._infos is not None:
            return self._infos[i].path
        lo, hi = self.path_offsets[i], self.path_offsets[i + 1]
        path = self.paths_blob[lo:hi].tobytes().decode()
        self._seen[path] = i  # the paths of chunks built here are the ones looked up later
        return path

    def paths_of(self, ids: Array) -> list[str]:
        """The paths of files ``ids`` (:meth:`path` of each, in bulk)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self._infos is not None:
            infos = self._infos
            return [infos[i].path for i in ids.tolist()]
        view = self.paths_blob.data  # a memoryview: slices without numpy's overhead
        out = [
            str(view[lo:hi], "utf-8")
            for lo, hi in zip(
                self.path_offsets[ids].tolist(), self.path_offsets[ids + 1].tolist(), strict=True
            )
        ]
        self._seen.update(zip(out, ids.tolist(), strict=True))
        return out

    def index(self, path: str) -> int:
        """The id of the file at ``path``.

        Raises:
            KeyError: no file has this path.
        """
        if self._infos is not None:
            if self._by_path is None:
                self._by_path = {f.path: i for i, f in enumerate(self._infos)}
            return self._by_path[path]
        seen = self._seen.get(path)
        if seen is not None:
            return seen
        order = self._sorted()
        key = path.encode()
        i = bisect.bisect_left(order, key, key=self._path_bytes)
        if i < len(order) and self._path_bytes(int(order[i])) == key:
            return int(order[i])
        raise KeyError(path)

    def _path_bytes(self, i: int) -> bytes:
        return self.paths_blob[self.path_offsets[i] : self.path_offsets[i + 1]].tobytes()

    def _sorted(self) -> Array:
        """File ids in path order (computed once, on the first lookup by path)."""
        if self._order is None:
            keys = (self._path_bytes(i) for i in range(len(self)))  # one at a time: no list of paths
            if all(a < b for a, b in itertools.pairwise(keys)):
                self._order = np.arange(len(self), dtype=np.int64)
            else:
                every = [self._path_bytes(i) for i in range(len(self))]
                self._order = np.array(sorted(range(len(every)), key=every.__getitem__), dtype=np.int64)
        return self._order

    def info(self, i: int) -> FileInfo:
        """File ``i`` as a :class:`FileInfo` (the object given to :meth:`from_infos`, or built)."""
        if self._infos is not None:
            return self._infos[i]
        cached = self._cache.get(i)
        if cached is not None:
            return cached
        groups: tuple[RowGroup, ...] | None = None
        if self.has_groups[i]:
            lo, hi = int(self.group_offsets[i]), int(self.group_offsets[i + 1])
            rows_of: list[int] = self.group_rows[lo:hi].tolist()
            index: Sequence[int] = (
                range(hi - lo) if self._group_index is None else self._group_index[lo:hi].tolist()
            )
            firsts: list[int] = (
                list(itertools.accumulate(rows_of, initial=0))[:-1]
                if self._group_first_row is None
                else self._group_first_row[lo:hi].tolist()
            )
            groups = tuple(
                RowGroup(int(ix), int(first), int(n), int(b))
                for ix, first, n, b in zip(
                    index, firsts, rows_of, self.group_bytes[lo:hi].tolist(), strict=True
                )
            )
        records = None
        if self.block_bytes is not None and self.block_bytes[i] > 0:
            assert self.record_offsets is not None
            assert self.record_counts is not None
            lo, hi = int(self.record_offsets[i]), int(self.record_offsets[i + 1])
            records = RecordIndex(int(self.block_bytes[i]), tuple(self.record_counts[lo:hi].tolist()))
        rows = int(self.rows[i])
        mtime = float(self.mtime[i])
        args = (
            self.path(i),
            int(self.size[i]),
            None if rows < 0 else rows,
            groups,
            None if np.isnan(mtime) else mtime,
            records,
            bool(self.splittable[i]),
        )
        deleted = self.deleted_of(i)
        etag = self.etag(i)
        info = (
            FileWithDeletes(*args, etag=etag, deleted=deleted) if len(deleted) else FileInfo(*args, etag=etag)
        )
        self._cache[i] = info
        return info

    def etag(self, i: int) -> str | None:
        """The ETag of file ``i`` (``None``: none)."""
        if self._infos is not None:
            return self._infos[i].etag
        if self.etag_blob is None or self.etag_offsets is None:
            return None
        lo, hi = self.etag_offsets[i], self.etag_offsets[i + 1]
        return self.etag_blob[lo:hi].tobytes().decode() or None

    def deleted_of(self, i: int) -> Array:
        """The sorted deleted positions of file ``i`` (empty when none)."""
        if self.deleted is None or self.delete_offsets is None:
            return np.empty(0, dtype=np.int64)
        return self.deleted[self.delete_offsets[i] : self.delete_offsets[i + 1]]

    def stop_after(self, i: int, start: int, rows: int) -> int:
        """:meth:`FileInfo.stop_after` of file ``i``."""
        return self.info(i).stop_after(start, rows)

    # -- whole table --------------------------------------------------------------------
    @property
    def infos(self) -> Sequence[FileInfo]:
        """Every file as a ``Sequence[FileInfo]`` (built one by one on access when not given)."""
        if self._infos is not None:
            return self._infos
        return _InfoView(self)

    @property
    def has_deletes(self) -> bool:
        """Whether some file has deleted positions."""
        return self.deleted is not None

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns (not by ``FileInfo`` objects given to :meth:`from_infos`)."""
        seen = {id(v): v for name in self.__slots__ if isinstance(v := getattr(self, name, None), np.ndarray)}
        return sum(v.nbytes for v in seen.values())  # a column shared by two names counted once

    def to_arrays(self) -> dict[str, Array]:
        """The columns :meth:`from_arrays` rebuilds this table from (no copy, but of derived group columns).

        ``FileTable.from_arrays(**table.to_arrays())`` has the same files, groups, record
        counts, deleted positions and :meth:`digest` (what the training ledger's files
        manifest holds).
        """
        out: dict[str, Array] = {
            "paths_blob": self.paths_blob,
            "path_offsets": self.path_offsets,
            "size": self.size,
            "rows": self.rows,
            "mtime": self.mtime,
            "splittable": self.splittable,
            "group_offsets": self.group_offsets,
            "group_index": self.group_index,
            "group_first_row": self.group_first_row,
            "group_rows": self.group_rows,
            "group_bytes": self.group_bytes,
            "has_groups": self.has_groups,
            "live": self.live,
        }
        optional = {
            "block_bytes": self.block_bytes,
            "record_offsets": self.record_offsets,
            "record_counts": self.record_counts,
            "delete_offsets": self.delete_offsets,
            "deleted": self.deleted,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out

    def digest(self) -> str:
        """SHA-256 of the paths, sizes, modification times and row counts (hex).

        Computed over the columns in one pass, in well under a second for a million
        files: what a resume state is tied to.
        """
        h = hashlib.sha256()
        for column, dtype in (
            (self.path_offsets, np.int64),  # as int64 whatever its width: the same digest
            (self.paths_blob, np.uint8),
            (self.size, np.int64),
            (self.mtime, np.float64),
            (self.rows, np.int64),
            (self.live, np.int64),
        ):
            if column.dtype == dtype and dtype != np.float64:
                h.update(np.ascontiguousarray(column).view(np.uint8).data)
                continue
            step = 1 << 16  # converted a piece at a time: no copy of a whole column
            for a in range(0, len(column), step):
                piece = column[a : a + step].astype(dtype)
                if dtype == np.float64:
                    np.nan_to_num(piece, copy=False, nan=-1.0)
                h.update(piece.view(np.uint8).data)
        return h.hexdigest()


class _InfoView(Sequence[FileInfo]):
    """A table's files as a sequence of ``FileInfo``, each built when read.

    Equal to any sequence of the same files in the same order (a tuple of them too).
    """

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, table: FileTable) -> None:
        self._table = table

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    def __repr__(self) -> str:
        return f"<{len(self)} FileInfo of {self._table!r}>"

    def __len__(self) -> int:
        return len(self._table)

    @overload
    def __getitem__(self, i: int) -> FileInfo: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[FileInfo]: ...

    def __getitem__(self, i: int | slice) -> FileInfo | Sequence[FileInfo]:
        if isinstance(i, slice):
            return [self._table.info(j) for j in range(len(self))[i]]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._table.info(i)
