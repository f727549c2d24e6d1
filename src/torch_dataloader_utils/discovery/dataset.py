"""``discover``: from a user's path to files, schema, columns and pruned row groups."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.config import FetchConfig, FileFormat, FileSourceConfig
from torch_dataloader_utils.discovery.columns import check_columns, check_filter, filter_fields
from torch_dataloader_utils.discovery.listing import list_files
from torch_dataloader_utils.discovery.manifest import Manifest, find_manifest
from torch_dataloader_utils.discovery.orc import read_orc_footers
from torch_dataloader_utils.discovery.parquet import FooterInfo, prune, read_footers
from torch_dataloader_utils.discovery.partitions import Partitions, infer_partitions
from torch_dataloader_utils.discovery.text import TextDiscovery, TextOptions, discover_text
from torch_dataloader_utils.errors import ConfigError, SchemaError, SchemaMismatchError
from torch_dataloader_utils.plan.types import FileInfo
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.schemas import nullable_type, same_but_nullability

__all__ = ["Discovered", "ShareHook", "discover", "local_only"]

log = logging.getLogger(__name__)

ShareHook = Callable[[Callable[[], Any]], Any]
"""Runs a metadata-reading function once and gives its (picklable) result to every rank.

``share(read)`` returns ``read()``; the runtime passes one that calls it on rank 0 only
and broadcasts the result. Discovery itself never communicates.
"""


def local_only(read: Callable[[], Any]) -> Any:
    """The :data:`ShareHook` of a single process: just read."""
    return read()


@dataclass(frozen=True)
class Discovered:
    """Everything planning and reading need to know about a dataset.

    Attributes:
        fs: The filesystem.
        format: The file format.
        files: The files (row groups pruned by ``filters`` left out), sorted by path.
        schema: Data fields followed by partition fields.
        output_columns: Columns of every batch, in order.
        data_columns: File columns to read (outputs plus those the filter needs).
        partition_columns: Partition columns to add (outputs plus those the filter needs).
        partitions: Partition values per file, or ``None``.
        filters: The row filter, or ``None``.
        extra: Format-specific metadata for readers. CSV / JSONL: ``"text_meta"`` (a
            :class:`~torch_dataloader_utils.io.text.TextFileMeta` per path) and
            ``"text_options"`` (the :class:`TextOptions`).
    """

    fs: FileSystemSpec
    format: FileFormat
    files: tuple[FileInfo, ...]
    schema: pa.Schema
    output_columns: tuple[str, ...]
    data_columns: tuple[str, ...]
    partition_columns: tuple[str, ...]
    partitions: Partitions | None
    filters: pc.Expression | None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def output_schema(self) -> pa.Schema:
        """Schema of every batch."""
        return pa.schema([self.schema.field(c) for c in self.output_columns])


def _dataset_schema(
    footers: Sequence[FooterInfo], columns: Sequence[str] | None, fs: FileSystemSpec
) -> pa.Schema:
    """The first file's schema, checked against every file, NOT NULL differences unified.

    A field that some files declare NOT NULL and others nullable (as Spark writes them)
    becomes nullable. With ``columns=None`` every file must have the same fields: a
    field found only in a later file is an error, as one missing from it is (never
    dropped silently because of the order of the files).

    Raises:
        SchemaError: a file names a needed column twice.
        SchemaMismatchError: a file has a field the first lacks (all columns requested).
    """
    first = footers[0]
    wanted = set(columns) if columns is not None else None
    fields = {f.name: f for f in first.schema}
    for footer in footers:
        names = footer.schema.names
        if len(set(names)) == len(names):
            continue
        twice = sorted({n for n in names if names.count(n) > 1 and (wanted is None or n in wanted)})
        if twice:
            raise SchemaError(
                f"{fs.display(footer.file.path)!r} has more than one column named {twice}; columns "
                "are read by name, so rewrite the file with unique column names (or leave them "
                "out of columns)"
            )
    for other in footers[1:]:
        if other.schema.equals(first.schema):
            continue
        extra = [n for n in other.schema.names if n not in fields and (wanted is None or n in wanted)]
        if extra:
            common = [n for n in first.schema.names if n in other.schema.names]
            raise SchemaMismatchError(
                f"fields {extra} are in {fs.display(other.file.path)!r} but not in "
                f"{fs.display(first.file.path)!r}; every file must have the columns read: pass "
                f"columns= with fields all files share (e.g. {common}) or rewrite the files to "
                "one schema"
            )
        for b in other.schema:
            a = fields.get(b.name)
            if a is None or (a.nullable == b.nullable and a.type.equals(b.type)):
                continue
            if same_but_nullability(a.type, b.type):
                fields[b.name] = a.with_type(nullable_type(a.type)).with_nullable(True)
    return pa.schema([fields[f.name] for f in first.schema], metadata=first.schema.metadata)  # type: ignore[arg-type]


def _check_consistent(footers: Sequence[FooterInfo], names: Sequence[str], fs: FileSystemSpec) -> None:
    first = footers[0]
    for other in footers[1:]:
        if other.schema.equals(first.schema):
            continue
        for name in names:
            a = first.schema.field(name) if name in first.schema.names else None
            b = other.schema.field(name) if name in other.schema.names else None
            if b is None:
                raise SchemaMismatchError(
                    f"field {name!r} is in {fs.display(first.file.path)!r} but missing from "
                    f"{fs.display(other.file.path)!r}; rewrite the files to one schema or "
                    "leave the field out of columns"
                )
            if a is not None and not same_but_nullability(a.type, b.type):
                raise SchemaMismatchError(
                    f"field {name!r} is {a.type} in {fs.display(first.file.path)!r} but "
                    f"{b.type} in {fs.display(other.file.path)!r}; rewrite the files to one "
                    "type or leave the field out of columns"
                )


def discover(
    path: str | Sequence[str],
    source: FileSourceConfig,
    *,
    text: TextOptions | None = None,
    fetch: FetchConfig | None = None,
    share: ShareHook = local_only,
) -> Discovered:
    """List ``path``, read metadata, check ``source``'s request against the schema.

    Parquet reads footers (row groups pruned by ``filters``); ORC reads stripe lists;
    CSV / JSONL read each file's head (and, with ``text.count_rows``, count records).

    Raises:
        PathNotFoundError, NoFilesFoundError: nothing to read.
        CorruptFileError: a footer cannot be read (the file is named).
        SchemaMismatchError: two files disagree on a needed field (both are named).
        UnknownColumnError: ``columns`` or ``filters`` name a missing column.
        ConfigError: a parameter has an unsupported value.

    Listing and footers are read through ``share`` (once for all ranks when the runtime
    passes a broadcasting hook); checking the request against them is done locally.

    A Parquet ``path`` naming one directory that holds a reshard manifest
    (``_manifest.json``, see :mod:`~torch_dataloader_utils.discovery.manifest`) is planned
    from the manifest alone, with no listing and no footer read; ``use_manifest=False``
    lists it instead, ``True`` requires the manifest (``source.use_manifest``).
    """
    format, columns, filters, partitioning = (
        source.format,
        source.columns,
        source.filters,
        source.partitioning,
    )
    if partitioning not in (None, "hive"):
        raise ConfigError(f"partitioning={partitioning!r} is not supported; use 'hive' or None")
    fs_options = dict(source.storage_options or {})
    use_manifest = source.use_manifest
    if format is FileFormat.PARQUET:

        def read_metadata() -> tuple[FileSystemSpec, Any, Any]:
            if use_manifest is not False:
                found = find_manifest(path, fs_options, required=use_manifest is True, fetch=fetch)
                if found is not None:
                    return found
            listing = list_files(path, fs_options, fetch)
            partitions = infer_partitions(listing.files) if partitioning == "hive" else None
            return listing.fs, partitions, read_footers(listing.fs, listing.files, partitions, fetch)

        # With a process group, rank 0 reads the metadata and the others receive it.
        fs, partitions, footers = share(read_metadata)
        if isinstance(footers, Manifest):
            return _discover_manifest(fs, partitions, footers, columns, filters)
        return _discover_parquet(fs, format, footers, partitions, columns, filters)
    listing = list_files(path, fs_options, fetch)
    fs = listing.fs
    partitions = infer_partitions(listing.files) if partitioning == "hive" else None
    if format is FileFormat.ORC:
        footers = read_orc_footers(fs, listing.files)
        return _discover_parquet(fs, format, footers, partitions, columns, filters)
    if format in (FileFormat.CSV, FileFormat.JSONL):
        options = text or TextOptions()
        found = discover_text(fs, format, listing.files, options)
        return _discover_text(fs, format, found, options, partitions, columns, filters)
    raise ConfigError(f"format={format.value!r} is not implemented yet")


def _discover_text(
    fs: FileSystemSpec,
    format: FileFormat,
    found: TextDiscovery,
    options: TextOptions,
    partitions: Partitions | None,
    columns: Sequence[str] | None,
    filters: object,
) -> Discovered:
    request = _resolve_request(found.schema, partitions, columns, filters)
    if format is FileFormat.CSV:
        for path, meta in found.meta.items():
            missing = [c for c in request.data_columns if c not in meta.column_names]
            if missing:
                raise SchemaMismatchError(
                    f"columns {missing} are not in the CSV header of {fs.display(path)!r} "
                    f"(it has {list(meta.column_names)}); leave them out of columns or fix the file"
                )
    return Discovered(
        fs=fs,
        format=format,
        files=found.files,
        partitions=partitions,
        extra={"text_meta": found.meta, "text_options": options},
        **request._asdict(),
    )


class _Request(NamedTuple):
    """The user's request checked against the data: the :class:`Discovered` fields it decides."""

    schema: pa.Schema
    output_columns: tuple[str, ...]
    data_columns: tuple[str, ...]
    partition_columns: tuple[str, ...]
    filters: pc.Expression | None


def _resolve_request(
    data_schema: pa.Schema, partitions: Partitions | None, columns: Sequence[str] | None, filters: object
) -> _Request:
    """Dataset schema, output columns, file columns and partition columns to read, filter."""
    part_schema = partitions.schema if partitions is not None else pa.schema([])
    clash = [n for n in part_schema.names if n in data_schema.names]
    if clash:
        raise SchemaMismatchError(
            f"partitioning='hive': partition keys {clash} are also columns inside the files; "
            "rename the directories or pass partitioning=None"
        )
    schema = pa.schema(list(data_schema) + list(part_schema))
    output = check_columns(columns, schema)
    expr = check_filter(filters, schema)
    needed = list(dict.fromkeys(output + filter_fields(expr, schema)))
    return _Request(
        schema=schema,
        output_columns=tuple(output),
        data_columns=tuple(n for n in data_schema.names if n in needed),
        partition_columns=tuple(n for n in part_schema.names if n in needed),
        filters=expr,
    )


def _discover_parquet(
    fs: FileSystemSpec,
    format: FileFormat,
    footers: Sequence[FooterInfo],
    partitions: Partitions | None,
    columns: Sequence[str] | None,
    filters: object,
) -> Discovered:
    request = _resolve_request(_dataset_schema(footers, columns, fs), partitions, columns, filters)
    _check_consistent(footers, request.data_columns, fs)
    expr = request.filters
    if expr is None or format is not FileFormat.PARQUET:
        files = [f.file for f in footers]
    else:
        files = [prune(f, expr, request.schema) for f in footers]
        if all(f.live_rows == 0 for f in files):
            warnings.warn(
                f"filters={expr} excludes every row group of the {len(files)} files by their "
                "statistics: the dataset yields no rows",
                UserWarning,
                stacklevel=3,
            )
    return Discovered(
        fs=fs,
        format=format,
        files=tuple(files),
        partitions=partitions,
        extra={"parquet_footers": {f.file.path: f.footer for f in footers}},
        **request._asdict(),
    )


def _discover_manifest(
    fs: FileSystemSpec, root: str, manifest: Manifest, columns: Sequence[str] | None, filters: object
) -> Discovered:
    """A resharded dataset, from its manifest alone (no listing, no footers).

    Its partition columns (``partition_by``) come back as hive partitions typed by the
    manifest's schema. A filter on partition columns only drops whole shards, so row
    counts stay exact; other filters are applied to rows as they are read (row groups
    are not pruned: the manifest holds no statistics).
    """
    log.info(
        "reading %s from its manifest: %d shards, %d rows (no listing, no footer reads)",
        fs.display(root),
        len(manifest.shards),
        manifest.num_rows,
    )
    partitions = manifest.partitions(root)
    request = _resolve_request(manifest.file_schema, partitions, columns, filters)
    expr = request.filters
    files = tuple(sorted(manifest.files(root), key=lambda f: f.path))
    fields = filter_fields(expr, request.schema)
    if expr is not None and partitions is not None and fields and set(fields) <= set(partitions.schema.names):
        rows = pa.table(
            {
                **{
                    f.name: pa.array([partitions.values[fi.path][i] for fi in files], f.type)
                    for i, f in enumerate(partitions.schema)
                },
                "__index": pa.array(range(len(files)), pa.int64()),
            }
        )
        kept = set(rows.filter(expr).column("__index").to_pylist())
        files = tuple(fi for i, fi in enumerate(files) if i in kept)
    return Discovered(
        fs=fs,
        format=FileFormat.PARQUET,
        files=files,
        partitions=partitions,
        extra={"manifest": manifest},
        **request._asdict(),
    )
