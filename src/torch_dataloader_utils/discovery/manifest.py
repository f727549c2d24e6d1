"""The manifest of a resharded dataset: every shard's rows, bytes and row groups, no footers.

``torch-dataloader-utils reshard`` (:mod:`torch_dataloader_utils.tools.reshard`) writes
``_manifest.json`` at the root of its output once every shard is complete. It holds the
schema and, per shard, its path, rows, bytes and row groups (first row, rows, bytes), so
the loader plans from it alone: one request instead of a listing and a footer per file.

The file is JSON (version :data:`MANIFEST_VERSION`)::

    {"format": "torch-dataloader-utils.reshard", "version": 1,
     "schema": "<base64 Arrow IPC schema>", "columns": [["id", "int64"], ...],
     "partition_by": ["year"], "num_rows": 1000000, "num_bytes": 268435456,
     "source": {"fingerprint": "...", ...}, "options": {...}, "plan": {...},
     "shards": [{"path": "year=2024/part-00000.parquet", "rows": 250000,
                 "bytes": 67108864, "mtime": 1795000000.123, "partition": [2024],
                 "row_groups": [[0, 125000, 33554432], [125000, 125000, 33550000]]}]}

Shard paths are relative to the manifest's directory, so the dataset can be moved or
copied whole. Partition columns (``partition_by``) are not stored in the files: they come
back from the ``partition`` values, typed by the schema.

A shard's ``mtime`` is its modification time as a listing of the directory reports it
(absent in manifests written before it was recorded): readers check each shard's size
and time against it, and the footer they open against its row groups, so a shard
replaced or copied over is refused with the advice that the manifest is stale. A
manifest is refused when it lists a path twice, an absolute path or one with ``..``, or
row groups that do not add up to the shard's rows (a hand edit).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pyarrow as pa

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.discovery.listing import DATA_SUFFIXES, remote_request
from torch_dataloader_utils.errors import ConfigError, CorruptFileError
from torch_dataloader_utils.plan.types import FileInfo, RowGroup
from torch_dataloader_utils.storage.fs import FileSystemSpec, GivenFileSystem, resolve
from torch_dataloader_utils.storage.partitions import Partitions

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "Manifest",
    "ShardEntry",
    "check_directory_names",
    "check_partition_field",
    "find_manifest",
    "hive_directory",
    "partition_value",
]

MANIFEST_NAME = "_manifest.json"
"""File name of the manifest, at the root of a resharded dataset."""
MANIFEST_FORMAT = "torch-dataloader-utils.reshard"
"""The ``format`` key of every manifest."""
MANIFEST_VERSION = 1
"""The manifest version this library writes and reads."""

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
"""Directory value of a null partition key."""


def _is_partition_type(dtype: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(dtype)
        or pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_boolean(dtype)
        or pa.types.is_date(dtype)
    )


def check_partition_field(field_: pa.Field[Any]) -> None:
    """Partition columns are integers, strings, booleans or dates (JSON and directory safe).

    Raises:
        ConfigError: naming the column and its type.
    """
    if not _is_partition_type(field_.type):
        raise ConfigError(
            f"partition_by column {field_.name!r} is {field_.type}; partition columns must be "
            "integers, strings, booleans or dates (a directory per value); partition by another "
            "column or derive one (e.g. a date from a timestamp)"
        )


def partition_value(value: object) -> object:
    """A partition value as a JSON scalar (dates as ISO strings)."""
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return value


def _typed(value: object, dtype: pa.DataType) -> object:
    if value is None:
        return None
    if pa.types.is_date(dtype):
        return pa.scalar(str(value), pa.string()).cast(dtype).as_py()
    return pa.scalar(value, dtype).as_py()


def hive_directory(names: Sequence[str], values: Sequence[object]) -> str:
    """``name=value/...`` for a partition (values URL-quoted; null as Hive's default)."""
    parts = []
    for name, value in zip(names, values, strict=True):
        if value is None:
            text = HIVE_NULL
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(partition_value(value))
        parts.append(f"{quote(name, safe='')}={quote(text, safe='')}")
    return "/".join(parts)


NAME_MAX = 255
"""Bytes of the longest file or directory name most file systems and object stores take."""


def check_directory_names(names: Sequence[str], values: Sequence[object]) -> None:
    """Refuse a partition whose ``name=value`` directory is longer than a name may be.

    Raises:
        ConfigError: naming the column, the start of the value, the length and the fix.
    """
    for part, name, value in zip(hive_directory(names, values).split("/"), names, values, strict=True):
        length = len(part.encode("utf-8"))
        if length > NAME_MAX:
            shown = str(value)[:40]
            raise ConfigError(
                f"partition_by column {name!r} has a value ({shown!r}..., {len(str(value))} characters) "
                f"whose directory name '{name}=...' is {length} bytes, longer than file systems allow "
                f"({NAME_MAX}); partition by a shorter column, e.g. a prefix or a hash of this one"
            )


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a manifest.

    Attributes:
        path: Relative to the manifest's directory, ``/``-separated.
        rows: Rows in the file.
        bytes: Size of the file in bytes.
        row_groups: Its row groups: index, first row, rows, compressed bytes.
        partition: Its partition values, in ``Manifest.partition_by`` order (JSON scalars).
        mtime: Its modification time as a listing reports it, or ``None`` (not recorded).
    """

    path: str
    rows: int
    bytes: int
    row_groups: tuple[RowGroup, ...]
    partition: tuple[object, ...] = ()
    mtime: float | None = None

    def to_json(self) -> dict[str, Any]:
        """As a JSON object."""
        out: dict[str, Any] = {
            "path": self.path,
            "rows": self.rows,
            "bytes": self.bytes,
            "row_groups": [[g.first_row, g.num_rows, g.num_bytes] for g in self.row_groups],
        }
        if self.mtime is not None:
            out["mtime"] = self.mtime
        if self.partition:
            out["partition"] = [partition_value(v) for v in self.partition]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardEntry:
        """From :meth:`to_json`'s object."""
        groups = tuple(
            RowGroup(i, int(first), int(rows), int(nbytes))
            for i, (first, rows, nbytes) in enumerate(data["row_groups"])
        )
        mtime = data.get("mtime")
        return cls(
            path=str(data["path"]),
            rows=int(data["rows"]),
            bytes=int(data["bytes"]),
            row_groups=groups,
            partition=tuple(data.get("partition", ())),
            mtime=None if mtime is None else float(mtime),
        )

    def problem(self) -> str | None:
        """Why this entry cannot be a shard of its manifest (``None``: it can)."""
        path = self.path
        if not path or path.startswith(("/", "\\")) or "://" in path or (len(path) > 1 and path[1] == ":"):
            return f"shard path {path!r} is not relative to the manifest's directory"
        if any(part in ("..", ".", "") for part in path.replace("\\", "/").split("/")):
            return (
                f"shard path {path!r} has '..', '.' or an empty part (it must name a file below the manifest)"
            )
        if self.rows < 0 or self.bytes < 0:
            return f"shard {path!r} has {self.rows} rows and {self.bytes} bytes"
        first = 0
        for g in self.row_groups:
            if g.first_row != first or g.num_rows < 0:
                return (
                    f"shard {path!r} row group {g.index} starts at row {g.first_row}, after "
                    f"{first} rows of the groups before it"
                )
            first += g.num_rows
        if self.row_groups and first != self.rows:
            return f"shard {path!r} has {self.rows} rows but its row groups hold {first}"
        return None


@dataclass(frozen=True)
class Manifest:
    """What a reshard job wrote: the schema and every shard.

    Attributes:
        schema: Every column of the dataset, partition columns included (last).
        partition_by: Columns stored as ``key=value`` directories, not in the files.
        shards: The shards, in order.
        source: What was read: its ``fingerprint`` and a description.
        options: The job's options (what a rerun must match).
        plan: The sizes the job planned with (rows per shard, rows per row group).
        version: The manifest version.
    """

    schema: pa.Schema
    partition_by: tuple[str, ...]
    shards: tuple[ShardEntry, ...]
    source: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    plan: Mapping[str, Any] = field(default_factory=dict)
    version: int = MANIFEST_VERSION

    @property
    def num_rows(self) -> int:
        """Rows of every shard."""
        return sum(s.rows for s in self.shards)

    @property
    def num_bytes(self) -> int:
        """Bytes of every shard."""
        return sum(s.bytes for s in self.shards)

    @property
    def file_schema(self) -> pa.Schema:
        """The schema of the shard files (without the partition columns)."""
        return pa.schema([f for f in self.schema if f.name not in self.partition_by])

    def to_json(self) -> bytes:
        """The manifest file's bytes."""
        doc = {
            "format": MANIFEST_FORMAT,
            "version": self.version,
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode("ascii"),
            "columns": [[f.name, str(f.type)] for f in self.schema],
            "partition_by": list(self.partition_by),
            "num_rows": self.num_rows,
            "num_bytes": self.num_bytes,
            "source": dict(self.source),
            "options": dict(self.options),
            "plan": dict(self.plan),
            "shards": [s.to_json() for s in self.shards],
        }
        return json.dumps(doc, indent=1, sort_keys=False).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        """Parse a manifest file.

        Raises:
            CorruptFileError: not a manifest, or one of another version (``where`` is named).
        """
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptFileError(
                f"{where!r} is not a reshard manifest ({exc}); delete it or pass use_manifest=False"
            ) from exc
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            raise CorruptFileError(
                f"{where!r} is not a manifest written by torch-dataloader-utils reshard; "
                "delete it or pass use_manifest=False to list the directory instead"
            )
        if doc.get("version") != MANIFEST_VERSION:
            raise CorruptFileError(
                f"{where!r} is a manifest of version {doc.get('version')!r}, this library reads "
                f"version {MANIFEST_VERSION}; reshard the data again with this version or pass "
                "use_manifest=False to list the directory instead"
            )
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(doc["schema"])))
            partition_by = tuple(str(c) for c in doc.get("partition_by", ()))
            shards = tuple(ShardEntry.from_json(s) for s in doc["shards"])
        except (KeyError, TypeError, ValueError, pa.ArrowException) as exc:
            raise CorruptFileError(
                f"{where!r} is a damaged reshard manifest ({exc!r}); reshard again"
            ) from exc
        _check_shards(shards, where)
        return cls(
            schema=schema,
            partition_by=partition_by,
            shards=shards,
            source=doc.get("source", {}),
            options=doc.get("options", {}),
            plan=doc.get("plan", {}),
        )

    def files(self, root: str) -> tuple[FileInfo, ...]:
        """The shards as :class:`FileInfo` (paths under ``root``), without any I/O."""
        return tuple(
            FileInfo(posixpath.join(root, s.path), s.bytes, s.rows, s.row_groups, s.mtime)
            for s in self.shards
        )

    def partitions(self, root: str) -> Partitions | None:
        """The typed partition values of every shard, or ``None`` without ``partition_by``."""
        if not self.partition_by:
            return None
        fields = [self.schema.field(name) for name in self.partition_by]
        values = {
            posixpath.join(root, s.path): tuple(
                _typed(v, f.type) for v, f in zip(s.partition, fields, strict=True)
            )
            for s in self.shards
        }
        return Partitions(pa.schema(fields), values)


def _check_shards(shards: Sequence[ShardEntry], where: str) -> None:
    """Refuse a manifest whose shards cannot be the output of one job (a hand edit, a copy).

    Raises:
        CorruptFileError: a path twice, outside the manifest's directory, or row groups
            that do not add up (the first such shard named).
    """
    seen: set[str] = set()
    for shard in shards:
        problem = shard.problem()
        if problem is None and shard.path in seen:
            problem = f"shard path {shard.path!r} is listed twice"
        if problem is not None:
            raise CorruptFileError(
                f"{where!r} cannot be used: {problem}; it was edited or damaged: reshard again, or "
                "pass use_manifest=False to list the files and read their footers"
            )
        seen.add(shard.path)


def _probe(path: str) -> bool:
    name = posixpath.basename(path.rstrip("/"))
    return name == MANIFEST_NAME or not name.lower().endswith(DATA_SUFFIXES)


def find_manifest(
    path: str | Sequence[str],
    storage_options: Mapping[str, Any] | None,
    *,
    required: bool,
    fetch: FetchConfig | None = None,
    filesystem: GivenFileSystem | None = None,
) -> tuple[FileSystemSpec, str, Manifest] | None:
    """The manifest of ``path`` (a resharded directory, or its ``_manifest.json``), if any.

    Costs one request on object storage (none when ``path`` names a data file or a
    glob, or is a list). Returns ``(filesystem, root directory, manifest)``.

    Raises:
        ConfigError: ``required`` and ``path`` holds no manifest.
        CorruptFileError: the manifest cannot be read.
    """
    if not isinstance(path, (str, os.PathLike)) or any(ch in os.fspath(path) for ch in "*?["):
        if required:
            raise ConfigError(
                f"use_manifest=True needs path= to be one directory written by reshard (or its "
                f"{MANIFEST_NAME}), got {path!r}"
            )
        return None
    path = os.fspath(path)
    if not required and not _probe(path):
        return None
    config = fetch or FetchConfig()
    spec, stripped = resolve(
        path,
        storage_options,
        timeout=config.attempt_timeout,
        deadline=config.request_timeout,
        filesystem=filesystem,
    )
    if posixpath.basename(stripped.rstrip("/")) == MANIFEST_NAME:
        manifest_path = stripped
        root = posixpath.dirname(stripped) if not spec.is_local else os.path.dirname(stripped)
    else:
        root = stripped.rstrip("/") or "/"
        manifest_path = posixpath.join(root, MANIFEST_NAME)
    shown = spec.display(manifest_path)
    try:
        if spec.is_local:
            with open(manifest_path, "rb") as f:
                data = f.read()
        else:
            # Looking for the manifest is the first request of listing the directory: a
            # failure is reported as the listing's (the directory named, within its budget).
            # start=0: one GET, which answers 404 when there is no manifest (without it,
            # s3fs first asks the object's size: a HEAD, and a LIST when it is missing).
            data = remote_request(
                spec, config, root, lambda: bytes(spec.call("cat_file", manifest_path, start=0))
            )
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
        if required:
            raise ConfigError(
                f"use_manifest=True but {shown!r} does not exist; point path= at a directory "
                "written by reshard, or drop use_manifest to list the files"
            ) from exc
        return None
    except OSError as exc:
        if required:
            raise CorruptFileError(f"cannot read {shown!r} ({exc})") from exc
        return None
    return spec, root, Manifest.from_json(data, shown)
