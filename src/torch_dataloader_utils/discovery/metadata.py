"""Metadata as columns: the listing and the files' footers as Arrow tables.

Discovery keeps what it learns about thousands (or millions) of files in two Arrow
tables, never in one Python object per file, and moves them between ranks and into the
metadata cache as Arrow IPC buffers:

* the **listing** (:data:`LISTING_SCHEMA`): one row per file found, with what the
  object store says about it (path, size, modification time, ETag, and the directory it
  was listed under, for hive partition keys);
* the **files** (:data:`FILES_SCHEMA`): one row per Parquet file with what its footer
  says: rows, the unpruned row groups (a list of ``(index, first_row, num_rows,
  num_bytes)`` structs) and, only for a file whose schema differs from the first
  file's, that schema (so any column request can be checked against it later).

:func:`file_infos` is the one place the files table becomes
:class:`~torch_dataloader_utils.plan.types.FileInfo` values for the planner;
:func:`file_columns` gives the same files as numpy columns and :func:`file_table` as
the planner's :class:`~torch_dataloader_utils.plan.table.FileTable` (whose ``infos``
view builds a ``FileInfo`` only when one is read).
"""

from __future__ import annotations

import builtins
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

import torch_dataloader_utils.errors as errors
from torch_dataloader_utils.discovery.listing import ListedFile
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import FileInfo, RowGroup

__all__ = [
    "FILES_SCHEMA",
    "FOOTER_COLUMN",
    "LISTING_SCHEMA",
    "ROW_GROUP_TYPE",
    "FileRows",
    "SharedError",
    "decode_share",
    "encode_share",
    "file_columns",
    "file_infos",
    "file_table",
    "files_table",
    "from_ipc",
    "listed_files",
    "listing_table",
    "to_ipc",
]

_LISTING_FIELDS: list[pa.Field[Any]] = [
    pa.field("path", pa.string(), nullable=False),
    pa.field("size", pa.int64(), nullable=False),
    pa.field("mtime", pa.float64()),
    pa.field("etag", pa.string()),
    pa.field("base", pa.dictionary(pa.int32(), pa.string())),
]
LISTING_SCHEMA = pa.schema(_LISTING_FIELDS)
"""One row per listed file (``base``: the directory it was listed under, for hive keys)."""

ROW_GROUP_TYPE = pa.struct(
    [
        pa.field("index", pa.int32(), nullable=False),
        pa.field("first_row", pa.int64(), nullable=False),
        pa.field("num_rows", pa.int64(), nullable=False),
        pa.field("num_bytes", pa.int64(), nullable=False),
    ]
)
"""A row group: its index in the file, first row, rows, compressed bytes."""

_FILES_FIELDS: list[pa.Field[Any]] = [
    pa.field("path", pa.string(), nullable=False),
    pa.field("size", pa.int64(), nullable=False),
    pa.field("mtime", pa.float64()),
    pa.field("etag", pa.string()),
    pa.field("num_rows", pa.int64(), nullable=False),
    pa.field("row_groups", pa.list_(pa.field("item", ROW_GROUP_TYPE, nullable=False)), nullable=False),
    pa.field("schema", pa.binary()),
]
FILES_SCHEMA = pa.schema(_FILES_FIELDS)
"""One row per Parquet file: listing columns, rows, unpruned row groups, and the file's
Arrow schema (serialized) only where it differs from the first file's."""

FOOTER_COLUMN = "footer"
"""The column of footer buffers a share carries for a small dataset (not in FILES_SCHEMA)."""

_ERROR_CLASS = b"tdu.error.class"
_ERROR_MESSAGE = b"tdu.error.message"
_ERROR_INDEX = b"tdu.error.index"


# -- the listing ------------------------------------------------------------------
def listing_table(files: Sequence[ListedFile]) -> pa.Table:
    """The listing as a table (files in the given order)."""
    return pa.table(
        {
            "path": pa.array([f.path for f in files], pa.string()),
            "size": pa.array([f.size for f in files], pa.int64()),
            "mtime": pa.array([f.mtime for f in files], pa.float64()),
            "etag": pa.array([f.etag for f in files], pa.string()),
            "base": pa.array([f.base for f in files], pa.string()).dictionary_encode(),
        },
        schema=LISTING_SCHEMA,
    )


def listed_files(table: pa.Table, start: int = 0, stop: int | None = None) -> list[ListedFile]:
    """Rows ``[start, stop)`` of a listing table as :class:`ListedFile` values."""
    part = table.slice(start, (table.num_rows if stop is None else stop) - start)
    columns = [part.column(name).to_pylist() for name in ("path", "size", "mtime", "base", "etag")]
    return [ListedFile(*row) for row in zip(*columns, strict=True)]


# -- the files --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FileRows:
    """What one footer tells, before it joins the files table.

    Attributes:
        listed: The file as listed.
        num_rows: Rows in the file.
        row_groups: The unpruned row groups.
        schema: The file's serialized Arrow schema, only when it differs from the first file's.
        footer: The footer buffer, when it is kept for the readers (small datasets).
    """

    listed: ListedFile
    num_rows: int
    row_groups: tuple[RowGroup, ...]
    schema: bytes | None = None
    footer: bytes | None = None


def files_table(rows: Sequence[FileRows], *, footers: bool = False) -> pa.Table:
    """The files table of ``rows`` (in their order); with ``footers``, plus a ``footer`` column."""
    counts = np.fromiter((len(r.row_groups) for r in rows), np.int64, len(rows))
    offsets = np.zeros(len(rows) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    groups = [g for r in rows for g in r.row_groups]
    structs = pa.StructArray.from_arrays(
        [
            pa.array([g.index for g in groups], pa.int32()),
            pa.array([g.first_row for g in groups], pa.int64()),
            pa.array([g.num_rows for g in groups], pa.int64()),
            pa.array([g.num_bytes for g in groups], pa.int64()),
        ],
        fields=list(ROW_GROUP_TYPE),
    )
    list_type: Any = FILES_SCHEMA.field("row_groups").type
    row_groups = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), structs, type=list_type)
    table = pa.table(
        {
            "path": pa.array([r.listed.path for r in rows], pa.string()),
            "size": pa.array([r.listed.size for r in rows], pa.int64()),
            "mtime": pa.array([r.listed.mtime for r in rows], pa.float64()),
            "etag": pa.array([r.listed.etag for r in rows], pa.string()),
            "num_rows": pa.array([r.num_rows for r in rows], pa.int64()),
            "row_groups": row_groups,
            "schema": pa.array([r.schema for r in rows], pa.binary()),
        },
        schema=FILES_SCHEMA,
    )
    if footers:
        table = table.append_column(FOOTER_COLUMN, pa.array([r.footer for r in rows], pa.binary()))
    return table


def file_infos(table: pa.Table) -> tuple[FileInfo, ...]:
    """The files table as :class:`FileInfo` values, for the planner (one per row, in order)."""
    table = table.combine_chunks()
    paths: list[Any] = table.column("path").to_pylist()
    sizes: list[Any] = table.column("size").to_pylist()
    mtimes: list[float | None] = table.column("mtime").to_pylist()
    num_rows: list[Any] = table.column("num_rows").to_pylist()
    lists = table.column("row_groups")
    if lists.num_chunks == 0:
        return ()
    groups: Any = lists.chunk(0)
    offsets = groups.offsets.to_pylist()  # positions in groups.values, even for a slice
    flat = groups.values
    index, first, rows, nbytes = (
        flat.field(name).to_pylist() for name in ("index", "first_row", "num_rows", "num_bytes")
    )
    every = list(map(RowGroup, index, first, rows, nbytes))
    etags: list[Any] = (
        table.column("etag").to_pylist() if "etag" in table.column_names else [None] * table.num_rows
    )
    return tuple(
        FileInfo(path, size, n, tuple(every[lo:hi]), mtime, etag=etag or None)
        for path, size, n, (lo, hi), mtime, etag in zip(
            paths, sizes, num_rows, itertools.pairwise(offsets), mtimes, etags, strict=True
        )
    )


def file_table(table: pa.Table) -> FileTable:
    """The files table as the planner's :class:`FileTable` (no Python object per file)."""
    c = file_columns(table)
    tags: dict[str, Any] = {}
    if "etag" in table.column_names and table.num_rows:
        column: Any = table.column("etag").combine_chunks()
        if column.null_count < len(column):  # the listing's ETags: the cache keys versions by them
            raw = _offsets(column)
            tags = {
                "etag_blob": np.frombuffer(column.buffers()[2], dtype=np.uint8)[raw[0] : raw[-1]].copy(),
                "etag_offsets": _rebased(raw),
            }
    return FileTable.from_arrays(
        paths_blob=c["paths_blob"],
        path_offsets=c["path_offsets"],
        size=c["size"],
        rows=c["rows"],
        mtime=c["mtime"],
        group_offsets=c["group_offsets"],
        group_index=c["group_index"],
        group_first_row=c["group_first_row"],
        group_rows=c["group_rows"],
        group_bytes=c["group_bytes"],
        **tags,
    )


def _offsets(array: Any) -> np.ndarray[Any, Any]:
    """An Arrow string or list array's ``len + 1`` ``int32`` offsets (into its data, slices included).

    A view of the array's offsets buffer (no copy).
    """
    raw = np.frombuffer(array.buffers()[1], dtype=np.int32)
    out: np.ndarray[Any, Any] = raw[array.offset : array.offset + len(array) + 1]
    return out


def _rebased(offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``offsets`` starting at 0 (a copy only for a slice that does not)."""
    return offsets if offsets[0] == 0 else offsets - offsets[0]


def _values(column: Any, dtype: Any) -> np.ndarray[Any, Any]:
    """An Arrow column of numbers as numpy (a view of its buffer when it has no nulls and is ``dtype``)."""
    out: np.ndarray[Any, Any] = column.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return out


def file_columns(table: pa.Table) -> dict[str, np.ndarray[Any, Any]]:
    """The files table as plain numpy columns, without a Python object per file.

    Keys (the column layout of a columnar planner's file table): ``paths_blob``
    (UTF-8 bytes of every path, ``uint8``) and ``path_offsets`` (``int32``, ``n + 1``),
    ``size``, ``rows`` (``int64``), ``mtime`` (``float64``, ``nan`` when unknown),
    ``group_offsets`` (``int32``, ``n + 1``: each file's unpruned row groups) and, per
    row group, ``group_index`` (``int32``), ``group_first_row``, ``group_rows`` and
    ``group_bytes`` (``int64``). The same files as :func:`file_infos`, in the same order.
    Columns are views of the table's buffers where Arrow allows (no copy): the
    :class:`~torch_dataloader_utils.plan.table.FileTable` built from them copies only
    what it keeps, narrowed.
    """
    table = table.combine_chunks()
    n = table.num_rows
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return {
            "paths_blob": np.zeros(0, dtype=np.uint8),
            "path_offsets": np.zeros(1, dtype=np.int64),
            "size": empty,
            "rows": empty,
            "mtime": np.zeros(0, dtype=np.float64),
            "group_offsets": np.zeros(1, dtype=np.int64),
            "group_index": np.zeros(0, dtype=np.int32),
            "group_first_row": empty,
            "group_rows": empty,
            "group_bytes": empty,
        }
    paths: Any = table.column("path").chunk(0)
    raw = _offsets(paths)
    blob = np.frombuffer(paths.buffers()[2], dtype=np.uint8)[raw[0] : raw[-1]].copy()
    lists: Any = table.column("row_groups").chunk(0)
    spans = _offsets(lists)
    groups = lists.values.slice(int(spans[0]), int(spans[-1] - spans[0]))
    return {
        "paths_blob": blob,
        "path_offsets": _rebased(raw),
        "size": _values(table.column("size").chunk(0), np.int64),
        "rows": _values(table.column("num_rows").chunk(0), np.int64),
        "mtime": _values(table.column("mtime").chunk(0), np.float64),
        "group_offsets": _rebased(spans),
        "group_index": _values(groups.field("index"), np.int32),
        "group_first_row": _values(groups.field("first_row"), np.int64),
        "group_rows": _values(groups.field("num_rows"), np.int64),
        "group_bytes": _values(groups.field("num_bytes"), np.int64),
    }


# -- buffers ----------------------------------------------------------------------
def to_ipc(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    """The table of an Arrow IPC stream written by :func:`to_ipc`."""
    with pa.ipc.open_stream(pa.BufferReader(data)) as reader:
        return reader.read_all()


@dataclass(frozen=True)
class SharedError:
    """An error one rank met reading its share, as it travels to every rank.

    Attributes:
        index: The position (in the listing) of the file it concerns; errors are raised
            in file order, so every rank raises the same one.
        kind: The exception class's name.
        message: Its message.
    """

    index: int
    kind: str
    message: str

    def exception(self) -> Exception:
        """The error to raise: the library's own class (or a builtin one) of that name."""
        cls = getattr(errors, self.kind, None) or getattr(builtins, self.kind, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(self.message)
            except Exception:  # a constructor with other arguments
                pass
        return errors.DiscoveryError(f"{self.kind}: {self.message}")


def encode_share(table: pa.Table, error: SharedError | None = None) -> bytes:
    """One rank's share of the files table (and its first error) as an IPC buffer."""
    if error is not None:
        meta = {
            _ERROR_CLASS: error.kind.encode(),
            _ERROR_MESSAGE: error.message.encode(),
            _ERROR_INDEX: str(error.index).encode(),
        }
        table = table.replace_schema_metadata(meta)
    return to_ipc(table)


def decode_share(data: bytes) -> tuple[pa.Table, SharedError | None]:
    """The table and error of :func:`encode_share`."""
    table = from_ipc(data)
    meta = table.schema.metadata or {}
    error = None
    if _ERROR_CLASS in meta:
        error = SharedError(
            int(meta[_ERROR_INDEX].decode()), meta[_ERROR_CLASS].decode(), meta[_ERROR_MESSAGE].decode()
        )
    return table.replace_schema_metadata(None), error
