"""``discover``: from a user's path to files, schema, columns and pruned row groups."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import posixpath
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.config import FetchConfig, FileFormat, FileSourceConfig
from torch_dataloader_utils.discovery.cache import (
    CacheHit,
    CacheKey,
    cache_bytes,
    load_cache,
    save_cache,
    source_key,
)
from torch_dataloader_utils.discovery.columns import check_columns, check_filter, filter_fields
from torch_dataloader_utils.discovery.exchange import LOCAL, Exchange
from torch_dataloader_utils.discovery.listing import list_files, start_listing
from torch_dataloader_utils.discovery.manifest import MANIFEST_NAME, Manifest, find_manifest
from torch_dataloader_utils.discovery.metadata import (
    FILES_SCHEMA,
    FOOTER_COLUMN,
    LISTING_SCHEMA,
    SharedError,
    decode_share,
    encode_share,
    file_table,
    files_table,
    from_ipc,
    listed_files,
    listing_table,
    to_ipc,
)
from torch_dataloader_utils.discovery.orc import read_orc_footers
from torch_dataloader_utils.discovery.parquet import (
    FooterCheck,
    FooterInfo,
    Reference,
    check_fields,
    read_share,
    reference,
)
from torch_dataloader_utils.discovery.partitions import Partitions, infer_partitions
from torch_dataloader_utils.discovery.text import TextDiscovery, TextOptions, discover_text
from torch_dataloader_utils.errors import (
    ConfigError,
    DiscoveryError,
    SchemaError,
    SchemaMismatchError,
    user_stacklevel,
)
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import FileInfo
from torch_dataloader_utils.storage.expressions import filter_key
from torch_dataloader_utils.storage.fs import FileSystemSpec, GivenFileSystem, resolve
from torch_dataloader_utils.storage.records import TextFileMeta
from torch_dataloader_utils.storage.schemas import nullable_type, same_but_nullability
from torch_dataloader_utils.storage.userfs import UserFileSystem

_LISTING_COLUMNS = ("path", "size", "mtime", "etag")
KEEP_FOOTERS_FILES = 1024
"""Datasets of at most this many Parquet files pass the footers to every rank's readers
(at most a few MB), which then read no footer themselves; larger ones do not (their
readers fetch the footers of the files they read, 1M footers would be GBs per rank)."""

__all__ = ["Discovered", "discover"]

log = logging.getLogger(__name__)


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
        footers: Parquet of at most ``KEEP_FOOTERS_FILES`` files read without the cache:
            the footer bytes by path (readers and row counts need not read them again).
        filtered_positions: Parquet: the files' row positions count only the rows that
            pass ``filters`` (rows counted at construction), so readers filter first.
        text_meta: CSV / JSONL: the text metadata of every file, by path.
        text_options: CSV / JSONL: how the text is parsed.
        reshard_manifest: Parquet read from its reshard manifest: the manifest.
        metadata: Parquet: the files as columns (:data:`~.metadata.FILES_SCHEMA`, one
            row per file, in the order of ``files``), which ``files`` is built from and
            the planner's file table is built from (``None`` once ``files`` changed).
        table: Parquet: the same files as the planner's columns (:class:`FileTable`);
            ``files`` is then its view, each ``FileInfo`` built when read (``None``
            once ``files`` changed, and for other formats).
        manifest: The reshard manifest the files were planned from, as shown to users
            (``None``: planned from a listing). Readers name it as stale when a file
            no longer matches it.
    """

    fs: FileSystemSpec
    format: FileFormat
    files: Sequence[FileInfo]
    schema: pa.Schema
    output_columns: tuple[str, ...]
    data_columns: tuple[str, ...]
    partition_columns: tuple[str, ...]
    partitions: Partitions | None
    filters: pc.Expression | None
    footers: Mapping[str, bytes] | None = None
    filtered_positions: bool = False
    text_meta: Mapping[str, TextFileMeta] | None = None
    text_options: TextOptions | None = None
    reshard_manifest: Manifest | None = None
    metadata: pa.Table | None = None
    table: FileTable | None = None
    manifest: str | None = None

    @property
    def output_schema(self) -> pa.Schema:
        """Schema of every batch."""
        return pa.schema([self.schema.field(c) for c in self.output_columns])


def _dataset_schema(
    first: tuple[str, pa.Schema],
    others: Sequence[tuple[str, pa.Schema]],
    columns: Sequence[str] | None,
    fs: FileSystemSpec,
) -> pa.Schema:
    """The first file's schema, checked against the others, NOT NULL differences unified.

    ``others`` are ``(path, schema)`` of the other files (those whose schema equals the
    first's may be left out). A field that some files declare NOT NULL and others
    nullable (as Spark writes them) becomes nullable. With ``columns=None`` every file
    must have the same fields: a field found only in a later file is an error, as one
    missing from it is (never dropped silently because of the order of the files).

    Raises:
        SchemaError: a file names a needed column twice.
        SchemaMismatchError: a file has a field the first lacks (all columns requested).
    """
    first_path, first_schema = first
    wanted = set(columns) if columns is not None else None
    fields = {f.name: f for f in first_schema}
    for path, schema in [first, *others]:
        names = schema.names
        if len(set(names)) == len(names):
            continue
        twice = sorted({n for n in names if names.count(n) > 1 and (wanted is None or n in wanted)})
        if twice:
            raise SchemaError(
                f"{fs.display(path)!r} has more than one column named {twice}; columns "
                "are read by name, so rewrite the file with unique column names (or leave them "
                "out of columns)"
            )
    for path, schema in others:
        if schema.equals(first_schema):
            continue
        extra = [n for n in schema.names if n not in fields and (wanted is None or n in wanted)]
        if extra:
            common = [n for n in first_schema.names if n in schema.names]
            raise SchemaMismatchError(
                f"fields {extra} are in {fs.display(path)!r} but not in "
                f"{fs.display(first_path)!r}; every file must have the columns read: pass "
                f"columns= with fields all files share (e.g. {common}) or rewrite the files to "
                "one schema"
            )
        for b in schema:
            a = fields.get(b.name)
            if a is None or (a.nullable == b.nullable and a.type.equals(b.type)):
                continue
            if same_but_nullability(a.type, b.type):
                fields[b.name] = a.with_type(nullable_type(a.type)).with_nullable(True)
    return pa.schema([fields[f.name] for f in first_schema], metadata=first_schema.metadata)  # type: ignore[arg-type]


def discover(
    path: str | Sequence[str],
    source: FileSourceConfig,
    *,
    text: TextOptions | None = None,
    fetch: FetchConfig | None = None,
    share: Exchange = LOCAL,
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

    Parquet metadata is read through ``share``: rank 0 lists the files (and reads the
    first footer, or the metadata cache), every rank reads the footers of its share and
    the ranks exchange the results as Arrow buffers. Without a process group
    (:data:`~.exchange.LOCAL`) this process reads everything, concurrently. Errors are
    raised on every rank.

    A Parquet ``path`` naming one directory that holds a reshard manifest
    (``_manifest.json``, see :mod:`~torch_dataloader_utils.discovery.manifest`) is planned
    from the manifest alone, with no listing, no footer read and no metadata cache;
    ``use_manifest=False`` lists it instead, ``True`` requires the manifest
    (``source.use_manifest``).
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
    user = given_filesystem(source)
    if format is FileFormat.PARQUET:
        return _discover_parquet(path, source, fetch or FetchConfig(), share, user)
    listing = list_files(path, fs_options, fetch, filesystem=user)
    fs = listing.fs
    partitions = infer_partitions(listing.files) if partitioning == "hive" else None
    if format is FileFormat.ORC:
        footers = read_orc_footers(fs, listing.files)
        return _discover_orc(fs, footers, partitions, columns, filters)
    if format in (FileFormat.CSV, FileFormat.JSONL):
        options = text or TextOptions()
        found = discover_text(fs, format, listing.files, options)
        return _discover_text(fs, format, found, options, partitions, columns, filters)
    raise ConfigError(f"format={format.value!r} is not implemented yet")


def given_filesystem(source: FileSourceConfig) -> GivenFileSystem | None:
    """The user's ``filesystem=`` object, wrapped once for this dataset (``None`` when not given)."""
    given = source.filesystem
    if given is None or isinstance(given, UserFileSystem):
        return given
    return UserFileSystem(given)


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
        text_meta=found.meta,
        text_options=options,
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


def _discover_orc(
    fs: FileSystemSpec,
    footers: Sequence[FooterInfo],
    partitions: Partitions | None,
    columns: Sequence[str] | None,
    filters: object,
) -> Discovered:
    schema = _dataset_schema(
        (footers[0].file.path, footers[0].schema), [(f.file.path, f.schema) for f in footers[1:]], columns, fs
    )
    request = _resolve_request(schema, partitions, columns, filters)
    first = footers[0]
    for other in footers[1:]:
        if not other.schema.equals(first.schema):
            check_fields(fs, first, other.file.path, other.schema, request.data_columns)
    return Discovered(
        fs=fs,
        format=FileFormat.ORC,
        files=tuple(f.file for f in footers),
        partitions=partitions,
        **request._asdict(),
    )


@dataclass(frozen=True)
class _Head:
    """What rank 0 reads first and sends to every rank (plain values and Arrow buffers).

    Attributes:
        listing: The listing table as an IPC buffer.
        first_footer: The first file's footer, from the cache (when it is valid).
        cached: The cache's files table without the listing columns, as an IPC buffer,
            when the cache is valid.
        note: Why the cache was ignored, when it was.
        manifest: ``(filesystem, root, manifest)`` of a resharded directory read from
            its manifest (then nothing else is set: no listing, no footers, no cache).
    """

    listing: bytes
    first_footer: bytes | None
    cached: bytes | None
    note: str | None
    manifest: tuple[FileSystemSpec, str, Manifest] | None = None


def _cache_spec(
    source: FileSourceConfig, fs: FileSystemSpec, fetch: FetchConfig
) -> tuple[FileSystemSpec, str] | None:
    """The metadata cache's filesystem and path (the dataset's filesystem on the same store)."""
    if source.metadata_cache is None:
        return None
    scheme, sep, _ = source.metadata_cache.partition("://")
    if fs.user is not None and (not sep or scheme in fs.user.protocols):
        # With filesystem=, a path without a scheme (or with its scheme) is on that filesystem.
        spec, cache_path = fs, fs.user.strip(source.metadata_cache)
    else:
        spec, cache_path = resolve(
            source.metadata_cache, None, timeout=fetch.attempt_timeout, deadline=fetch.request_timeout
        )
        if spec.protocol == fs.protocol and fs.user is None:
            spec = fs
    if spec.is_local and os.path.isdir(cache_path):
        raise ConfigError(
            f"metadata_cache={source.metadata_cache!r} is a directory; pass a file path such as "
            f"{os.path.join(source.metadata_cache, 'metadata.arrow')!r}"
        )
    return spec, cache_path


def _share_bounds(num_files: int, rank: int, size: int) -> tuple[int, int]:
    """The listing positions ``[lo, hi)`` whose footers ``rank`` reads (contiguous blocks)."""
    return num_files * rank // size, num_files * (rank + 1) // size


def _with_listing(listing: pa.Table, rest: pa.Table) -> pa.Table:
    """The files table: the listing's columns joined to the footers' (same rows, same order)."""
    columns = {name: listing.column(name) for name in _LISTING_COLUMNS}
    columns.update({name: rest.column(name) for name in rest.column_names})
    return pa.table(columns).cast(FILES_SCHEMA).combine_chunks()


def _listed_paths(
    path: str | Sequence[str], source: FileSourceConfig, fetch: FetchConfig, user: GivenFileSystem | None
) -> tuple[FileSystemSpec, str] | None:
    """The filesystem of ``path`` and the path(s) as a cache records them (:func:`source_key`).

    ``None`` when ``path`` is not a path or a non-empty list of them (listing says why).
    """
    paths = [path] if isinstance(path, (str, os.PathLike)) else path
    if (
        not isinstance(paths, (list, tuple))
        or not paths
        or not all(isinstance(p, (str, os.PathLike)) for p in paths)
    ):
        return None
    resolved = [
        resolve(
            os.fspath(p),
            source.storage_options,
            timeout=fetch.attempt_timeout,
            deadline=fetch.request_timeout,
            filesystem=user,
        )
        for p in paths
    ]
    return resolved[0][0], source_key([f"{spec.protocol}://{stripped}" for spec, stripped in resolved])


def _trusted_head(cache: tuple[FileSystemSpec, str], key: CacheKey, fetch: FetchConfig) -> _Head | str | None:
    """``metadata_cache_check="on_open"``: the head from the cache alone (no listing).

    Returns the head, or why the cache cannot be used without a listing (``None``: none yet).
    """
    loaded = load_cache(*cache, None, key, fetch)
    if not isinstance(loaded, CacheHit):
        return loaded
    table = loaded.table
    n = table.num_rows
    base = (
        pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), pa.array([loaded.base], pa.string()))
        if loaded.base is not None
        else pa.nulls(n, LISTING_SCHEMA.field("base").type)
    )
    listing = pa.table({**{name: table.column(name) for name in _LISTING_COLUMNS}, "base": base}).cast(
        LISTING_SCHEMA
    )
    kept = table.drop_columns(list(_LISTING_COLUMNS))
    return _Head(to_ipc(listing), loaded.first_footer, to_ipc(kept), None)


def _discover_parquet(
    path: str | Sequence[str],
    source: FileSourceConfig,
    fetch: FetchConfig,
    share: Exchange,
    user: GivenFileSystem | None,
) -> Discovered:
    listed = _listed_paths(path, source, fetch, user) if source.metadata_cache is not None else None
    key = CacheKey(
        filters="" if source.filters is None else str(source.filters),
        partitioning=source.partitioning or "",
        source="" if listed is None else listed[1],
        filters_key=filter_key(source.filters) or "",
    )

    # Rank 0 lists (and reads the cache); every rank receives the listing.
    got = share.from_rank0(lambda: _parquet_head(path, source, fetch, listed, key, user))
    if got.manifest is not None:
        if source.metadata_cache is not None:
            log.info(
                "metadata_cache=%r is not used: the dataset is read from its reshard manifest",
                source.metadata_cache,
            )
        return _discover_manifest(*got.manifest, source.columns, source.filters)
    if got.note is not None:
        warnings.warn(got.note, UserWarning, stacklevel=user_stacklevel())
    # This rank's own filesystem spec (its own storage_options), as list_files resolved it.
    fs = resolve(
        os.fspath(path if isinstance(path, (str, os.PathLike)) else path[0]),
        source.storage_options,
        timeout=fetch.attempt_timeout,
        deadline=fetch.request_timeout,
        filesystem=user,
    )[0]
    listing = from_ipc(got.listing)
    partitions = infer_partitions(listed_files(listing)) if source.partitioning == "hive" else None
    check = _FirstFooter(fs, listing, source, partitions)
    footers: dict[str, bytes] = {}
    if got.cached is not None:
        assert got.first_footer is not None
        check(got.first_footer)
        cached = from_ipc(got.cached)
        footers = _cached_footers(listing, cached)
        if FOOTER_COLUMN in cached.column_names:
            cached = cached.drop_columns([FOOTER_COLUMN])
        table = _with_listing(listing, cached)
    else:
        table, footers = _read_footers(fs, listing, share, check, fetch)
        cache = _cache_spec(source, fs, fetch) if share.rank == 0 else None
        if cache is not None:
            bases = listing.column("base").unique()
            base = bases[0].as_py() if len(bases) == 1 else None
            # Footers are kept only where the listing names each file's content (an ETag):
            # a file replaced with the same size and time is then another file to the cache.
            strong = table.column("etag").null_count == 0
            paths: list[Any] = table.column("path").to_pylist()
            kept = [footers.get(p) for p in paths] if footers and strong else None
            _write_cache(cache, table, key, check.first, fetch, base, kept)
    request = check.request
    others = _other_schemas(table)
    if others:
        for other_path, other_schema in others:  # (the footer readers checked theirs already)
            check_fields(fs, check.first, other_path, other_schema, request.data_columns)
        schema = _dataset_schema((check.first.path, check.first.schema), others, source.columns, fs)
        if not schema.equals(check.first.schema):  # NOT NULL in some files only: nullable
            request = _resolve_request(schema, partitions, source.columns, source.filters)
    files = file_table(table)
    if request.filters is not None and len(files) and not files.live.any():
        warnings.warn(
            f"filters={request.filters} excludes every row group of the {len(files)} files by their "
            "statistics: the dataset yields no rows",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    return Discovered(
        fs=fs,
        format=FileFormat.PARQUET,
        files=files.infos,
        partitions=partitions,
        metadata=table,
        table=files,
        footers=footers or None,
        **request._asdict(),
    )


def _parquet_head(
    path: str | Sequence[str],
    source: FileSourceConfig,
    fetch: FetchConfig,
    listed: tuple[FileSystemSpec, str] | None,
    key: CacheKey,
    user: GivenFileSystem | None,
) -> _Head:
    """Rank 0: the manifest, or the listing and what the metadata cache holds of it."""
    early = None
    if source.use_manifest is None and (listed is None or source.metadata_cache_check != "on_open"):
        # The listing goes out beside the manifest's search: one round trip, not two.
        early = start_listing(path, dict(source.storage_options or {}), fetch, user)
    try:
        if source.use_manifest is not False:
            found = find_manifest(
                path,
                source.storage_options,
                required=source.use_manifest is True,
                fetch=fetch,
                filesystem=user,
            )
            if found is not None:
                return _Head(b"", None, None, None, found)
        trusted: str | None = None
        trust = _cache_spec(source, listed[0], fetch) if listed is not None else None
        if trust is not None and source.metadata_cache_check == "on_open":
            got = _trusted_head(trust, key, fetch)
            if isinstance(got, _Head):
                return got
            trusted = got
        listing = list_files(path, dict(source.storage_options or {}), fetch, filesystem=user, early=early)
        table = listing_table(listing.files)
        cache = _cache_spec(source, listing.fs, fetch)
        loaded = load_cache(*cache, table, key, fetch) if cache is not None else None
        if isinstance(loaded, CacheHit):
            if trusted is not None:  # usable with the listing only (e.g. written by an older version)
                log.info("%s; listed the files to validate it", trusted)
            kept = loaded.table.drop_columns(list(_LISTING_COLUMNS))
            return _Head(to_ipc(table), loaded.first_footer, to_ipc(kept), None)
        note = f"{loaded}; reading the footers again and rewriting it" if isinstance(loaded, str) else None
        return _Head(to_ipc(table), None, None, note)
    finally:
        if early is not None:
            early.cancel()  # a no-op once it was used


class _FirstFooter:
    """The request, resolved against the first file's footer (the same on every rank).

    Called with the first file's footer bytes (by the reader of that footer, or with the
    cached ones), it returns what every other footer is checked against.
    """

    def __init__(
        self, fs: FileSystemSpec, listing: pa.Table, source: FileSourceConfig, partitions: Partitions | None
    ) -> None:
        self.fs, self.listing, self.source, self.partitions = fs, listing, source, partitions
        self.resolved: tuple[Reference, _Request] | None = None

    def __call__(self, footer: bytes) -> FooterCheck:
        source = self.source
        first = reference(self.fs, self.listing.column("path")[0].as_py(), footer)
        schema = _dataset_schema((first.path, first.schema), [], source.columns, self.fs)  # its own names
        request = _resolve_request(schema, self.partitions, source.columns, source.filters)
        self.resolved = (first, request)
        return FooterCheck(first, request.data_columns, request.filters, request.schema, self.partitions)

    @property
    def first(self) -> Reference:
        """The first file's reference."""
        assert self.resolved is not None, "the first footer was not read"
        return self.resolved[0]

    @property
    def request(self) -> _Request:
        """The request resolved against the first file."""
        assert self.resolved is not None, "the first footer was not read"
        return self.resolved[1]


def _read_footers(
    fs: FileSystemSpec, listing: pa.Table, share: Exchange, check: _FirstFooter, fetch: FetchConfig
) -> tuple[pa.Table, dict[str, bytes]]:
    """Every rank reads its share of the footers; the shares are exchanged and joined.

    Returns the files' table and, for at most ``KEEP_FOOTERS_FILES`` files, their footers.
    """
    lo, hi = _share_bounds(listing.num_rows, share.rank, share.size)
    mine = listed_files(listing, lo, hi)
    first_file = mine[0] if lo == 0 and mine else listed_files(listing, 0, 1)[0]
    keep = listing.num_rows <= KEEP_FOOTERS_FILES
    try:
        result = read_share(fs, mine, first_file, check, first_index=lo, fetch=fetch, keep_footers=keep)
        part, error = result.table, result.error
    except Exception as exc:  # still take part in the exchange: no rank is left waiting
        part, error = files_table([], footers=keep), SharedError(lo, type(exc).__name__, str(exc))
    # Every rank has the listing: only what the footers said travels (rows, row groups).
    slim = part.drop_columns(list(_LISTING_COLUMNS))
    shares = [decode_share(buf) for buf in share.all_gather(encode_share(slim, error))]
    errors = [e for _, e in shares if e is not None]
    if errors:
        raise min(errors, key=lambda e: e.index).exception()
    for rank, (got, _) in enumerate(shares):
        a, b = _share_bounds(listing.num_rows, rank, share.size)
        if got.num_rows != b - a:
            raise DiscoveryError(
                f"rank {rank} of {share.size} sent the footers of {got.num_rows} files, not the "
                f"{b - a} of its share: every rank must build the dataset with the same path and options"
            )
    joined = pa.concat_tables([t for t, _ in shares])
    footers: dict[str, bytes] = {}
    if keep:
        buffers: list[Any] = joined.column(FOOTER_COLUMN).to_pylist()
        names: list[Any] = listing.column("path").to_pylist()
        footers = dict(zip(names, buffers, strict=True))
        joined = joined.drop_columns([FOOTER_COLUMN])
    return _with_listing(listing, joined), footers


def _cached_footers(listing: pa.Table, cached: pa.Table) -> dict[str, bytes]:
    """The footers a metadata cache kept (small datasets), by path; ``{}`` when it kept none."""
    if FOOTER_COLUMN not in cached.column_names or cached.column(FOOTER_COLUMN).null_count:
        return {}
    paths: list[Any] = listing.column("path").to_pylist()
    return dict(zip(paths, cached.column(FOOTER_COLUMN).to_pylist(), strict=True))


def _other_schemas(table: pa.Table) -> list[tuple[str, pa.Schema]]:
    """``(path, schema)`` of the files whose schema differs from the first's (the ``schema`` column)."""
    schemas = table.column("schema")
    if schemas.null_count == len(schemas):
        return []
    rows = table.select(["path", "schema"]).filter(pc.is_valid(schemas)).to_pylist()
    return [(row["path"], pa.ipc.read_schema(pa.py_buffer(row["schema"]))) for row in rows]


def _write_cache(
    cache: tuple[FileSystemSpec, str],
    table: pa.Table,
    key: CacheKey,
    first: Reference,
    fetch: FetchConfig,
    base: str | None,
    footers: Sequence[bytes | None] | None = None,
) -> None:
    """Write the metadata cache (with every file's footer when kept); a failure is a warning."""
    cache_fs, cache_path = cache
    try:
        version = importlib.metadata.version("torch_dataloader_utils")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    try:
        created = f"torch_dataloader_utils {version}"
        data = cache_bytes(table, key, first.path, first.footer, created, base, footers)
        save_cache(cache_fs, cache_path, data, fetch)
    except (OSError, ValueError) as exc:
        warnings.warn(
            f"metadata_cache={cache_fs.display(cache_path)!r} could not be written "
            f"({type(exc).__name__}: {exc}); the next start reads the footers again",
            UserWarning,
            stacklevel=user_stacklevel(),
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
        reshard_manifest=manifest,
        manifest=fs.display(posixpath.join(root, MANIFEST_NAME)),
        **request._asdict(),
    )
