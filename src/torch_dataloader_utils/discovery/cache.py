"""The metadata cache: a restarted job skips reading footers.

``metadata_cache="PATH or URL"`` names one file (local, or on any fsspec store such as
``s3://bucket/cache/train.arrow``). It is an Arrow IPC file holding the files table
(:data:`~.metadata.FILES_SCHEMA`: path, size, mtime, ETag, rows, unpruned row groups)
and, in its schema metadata, what it was built for:

================================  ===================================================
``tdu.kind``                      ``torch_dataloader_utils/parquet-metadata``
``tdu.version``                   the format version (:data:`CACHE_VERSION`)
``tdu.created_by``                the library version that wrote it
``tdu.filters``                   the row filter it was pruned with, as text (``""``: none)
``tdu.filters_key``               that filter's lossless identity (``storage.expressions``)
``tdu.partitioning``              ``"hive"`` or ``""``
``tdu.first_path``                the first file, whose schema is the dataset's
``tdu.first_footer``              that file's Parquet footer (a few KB)
``tdu.source``                    the path(s) listed, as JSON (``metadata_cache_check``)
``tdu.base``                      the directory every file was listed under, if one
================================  ===================================================

A dataset of at most ``KEEP_FOOTERS_FILES`` files (``discovery.dataset``) whose listing
gives every file an ETag (object stores) also keeps every file's footer, in a ``footer``
column after :data:`~.metadata.FILES_SCHEMA`'s: a warm start then hands them to the
readers, and no footer is read at all. Without ETags (local disks, where a file can be
replaced keeping its size and time) and for larger datasets, the readers read the
footers of the files they read and compare them with the plan, as on a cold start.
Format version 1 (no ``footer`` column) is still read.

With ``metadata_cache_check="listing"`` (the default) it is valid when the listing
matches it exactly: the same paths, sizes, modification times and ETags (a vectorized
comparison of four columns; the listing itself is still read, one request per 1,000
files on object stores). With ``"on_open"`` nothing is listed: it is valid when it was
written for the same path(s) (``tdu.source``), and each file is checked against it when
a reader opens it (``storage.identity``). Otherwise, or when it cannot be read, it is
ignored with a ``UserWarning`` naming it, the footers are read again and the file is
rewritten. It is written whole, atomically: a temporary file renamed over
it on a local disk, one ``PUT`` on an object store.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.discovery.metadata import FILES_SCHEMA, FOOTER_COLUMN
from torch_dataloader_utils.storage.atomic import write_atomically
from torch_dataloader_utils.storage.fetch import GaveUp, retry_call
from torch_dataloader_utils.storage.fs import FileSystemSpec

__all__ = [
    "CACHE_KIND",
    "CACHE_VERSION",
    "READ_VERSIONS",
    "CacheHit",
    "CacheKey",
    "cache_bytes",
    "load_cache",
    "save_cache",
    "source_key",
]

CACHE_KIND = "torch_dataloader_utils/parquet-metadata"
CACHE_VERSION = 2
"""Bumped whenever the cache's columns or metadata change meaning (2: the ``footer`` column)."""
READ_VERSIONS = frozenset({"1", str(CACHE_VERSION)})
"""Format versions read (version 1 has no ``footer`` column)."""

_LISTING_COLUMNS = ("path", "size", "mtime", "etag")


@dataclass(frozen=True)
class CacheKey:
    """What a cache's content depends on besides the listing.

    Attributes:
        filters: The row filter as text (``""``: none); row groups are pruned by it.
        partitioning: ``"hive"`` or ``""`` (partition values prune whole files).
        source: The path(s) listed (:func:`source_key`): what a cache used without a
            listing must have been written for.
        filters_key: The filter's lossless identity (:func:`~.expressions.filter_key`;
            ``""``: none). The text alone is not one: pyarrow abbreviates long lists.
    """

    filters: str
    partitioning: str
    source: str = ""
    filters_key: str = ""


def source_key(paths: Sequence[str]) -> str:
    """The listed path(s) as the cache records them (JSON; local paths made absolute)."""
    return json.dumps(list(paths))


@dataclass(frozen=True)
class CacheHit:
    """A valid cache: the files table (matching the listing) and the first file's footer.

    Attributes:
        table: The files table (:data:`~.metadata.FILES_SCHEMA`).
        first_path: The first file.
        first_footer: Its footer.
        base: The directory every file was listed under (``None``: several, or not recorded).
    """

    table: pa.Table
    first_path: str
    first_footer: bytes
    base: str | None = None


def _describe_change(cached: pa.Table, listing: pa.Table) -> str | None:
    """Why ``cached`` does not match ``listing`` (``None`` when it does)."""
    if cached.num_rows != listing.num_rows or not cached.column("path").equals(listing.column("path")):
        old: set[Any] = set(cached.column("path").to_pylist())
        new: list[Any] = listing.column("path").to_pylist()
        added = [p for p in new if p not in old]
        removed = sorted(old - set(new))
        parts = [f"the listing has {listing.num_rows} files, the cache {cached.num_rows}"]
        if added:
            parts.append(f"{len(added)} new (first {added[0]!r})")
        if removed:
            parts.append(f"{len(removed)} gone (first {removed[0]!r})")
        return "; ".join(parts)
    for name in ("size", "mtime", "etag"):
        if cached.column(name).equals(listing.column(name)):
            continue
        was: list[object] = cached.column(name).to_pylist()
        now: list[object] = listing.column(name).to_pylist()
        changed = [i for i, (a, b) in enumerate(zip(was, now, strict=True)) if a != b]
        if not changed:
            continue
        first = changed[0]
        path = listing.column("path")[first].as_py()
        return (
            f"{len(changed)} file(s) changed {name} since it was written (first {path!r}: "
            f"{was[first]!r} -> {now[first]!r})"
        )
    return None


def _read(fs: FileSystemSpec, path: str, config: FetchConfig) -> bytes:
    if fs.is_local:
        with open(path, "rb") as f:
            return f.read()
    try:  # one GET (start=0: s3fs asks no size first), retried within the request's time budget
        return bytes(retry_call(lambda: fs.call("cat_file", path, start=0), config))
    except GaveUp as failed:
        if isinstance(failed.error, FileNotFoundError):
            raise failed.error from None
        raise OSError(f"reading it failed {failed.how(config)}") from failed.error


def load_cache(
    fs: FileSystemSpec, path: str, listing: pa.Table | None, key: CacheKey, fetch: FetchConfig | None = None
) -> CacheHit | str | None:
    """The cache at ``path`` if it is valid for ``listing`` and ``key``.

    ``listing=None`` (``metadata_cache_check="on_open"``): nothing is compared with a
    listing; the cache must have been written for ``key.source`` (the same path(s)).

    Returns:
        A :class:`CacheHit`; ``None`` when there is no cache file yet; else a sentence
        saying why it is ignored (stale, written for another request, unreadable).
    """
    shown = fs.display(path)
    try:
        data = _read(fs, path, fetch or FetchConfig())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"metadata_cache={shown!r} cannot be read ({type(exc).__name__}: {exc})"
    try:
        table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    except (pa.ArrowException, OSError, ValueError) as exc:
        return f"metadata_cache={shown!r} is not a metadata cache file or is damaged ({exc})"
    meta = {k.decode(): v for k, v in (table.schema.metadata or {}).items()}
    kind = meta.get("tdu.kind", b"").decode(errors="replace")
    if kind != CACHE_KIND:
        return (
            f"metadata_cache={shown!r} is not a metadata cache file (kind {kind!r}, expected {CACHE_KIND!r})"
        )
    version = meta.get("tdu.version", b"").decode(errors="replace")
    if version not in READ_VERSIONS:
        return f"metadata_cache={shown!r} has format version {version!r}; this version reads {CACHE_VERSION}"
    columns = table.schema.remove_metadata()
    if FOOTER_COLUMN in columns.names:
        columns = columns.remove(columns.get_field_index(FOOTER_COLUMN))
    if not columns.equals(FILES_SCHEMA):
        return f"metadata_cache={shown!r} has unexpected columns {table.schema.names}"
    for field, wanted in (("filters", key.filters), ("partitioning", key.partitioning)):
        was = meta.get(f"tdu.{field}", b"").decode(errors="replace")
        if was != wanted:
            return f"metadata_cache={shown!r} was written for {field}={was or None!r}, not {wanted or None!r}"
    if meta.get("tdu.filters_key", b"").decode(errors="replace") != key.filters_key:
        return (
            f"metadata_cache={shown!r} was written for another filter that prints the same "
            f"(filters={key.filters!r}; pyarrow abbreviates long value lists), or by a version "
            "that did not record the filter's identity"
        )
    table = table.replace_schema_metadata(None)
    if listing is not None:
        change = _describe_change(table.select(_LISTING_COLUMNS), listing.select(_LISTING_COLUMNS))
        if change is not None:
            return f"metadata_cache={shown!r} is stale: {change}"
    else:
        was = meta.get("tdu.source", b"").decode(errors="replace")
        if was != key.source:
            written = f"for path {json.loads(was)!r}" if was else "by a version that does not record its path"
            return f"metadata_cache={shown!r} was written {written}, not for {json.loads(key.source)!r}"
        if key.partitioning and "tdu.base" not in meta:
            return f"metadata_cache={shown!r} does not record the directory its partitions were listed under"
    first_path = meta.get("tdu.first_path", b"").decode()
    first_footer = meta.get("tdu.first_footer")
    if not table.num_rows:
        return f"metadata_cache={shown!r} lists no file"
    if not first_footer or first_path != table.column("path")[0].as_py():
        return f"metadata_cache={shown!r} is damaged (no footer of the first file)"
    base = meta["tdu.base"].decode() if "tdu.base" in meta else None
    return CacheHit(table, first_path, bytes(first_footer), base)


def cache_bytes(
    table: pa.Table,
    key: CacheKey,
    first_path: str,
    first_footer: bytes,
    created_by: str,
    base: str | None = None,
    footers: Sequence[bytes | None] | None = None,
) -> bytes:
    """The cache file's content.

    Args:
        table: The files table.
        key: What it was built for.
        first_path: The first file.
        first_footer: Its footer.
        created_by: The library version writing it.
        base: The directory every file was listed under, if one.
        footers: Every file's footer, in the table's order (``None``: not kept).
    """
    meta: dict[str, str] = {
        "tdu.kind": CACHE_KIND,
        "tdu.version": str(CACHE_VERSION),
        "tdu.created_by": created_by,
        "tdu.filters": key.filters,
        "tdu.filters_key": key.filters_key,
        "tdu.partitioning": key.partitioning,
        "tdu.first_path": first_path,
        "tdu.source": key.source,
    }
    if base is not None:
        meta["tdu.base"] = base
    # Binary metadata values: pyarrow keeps them as bytes.
    metadata: dict[bytes, bytes] = {k.encode(): v.encode() for k, v in meta.items()}
    metadata[b"tdu.first_footer"] = first_footer
    table = table.cast(FILES_SCHEMA)
    if footers is not None:
        table = table.append_column(FOOTER_COLUMN, pa.array(list(footers), pa.binary()))
    table = table.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def save_cache(fs: FileSystemSpec, path: str, data: bytes, fetch: FetchConfig | None = None) -> None:
    """Write the cache file at ``path`` atomically (temporary file + rename; one PUT remotely).

    Raises:
        OSError: it could not be written.
    """
    if not fs.is_local:
        config = fetch or FetchConfig()
        try:  # one PUT, retried within the request's time budget
            retry_call(lambda: fs.call("pipe_file", path, data), config)
        except GaveUp as failed:
            raise OSError(f"writing it failed {failed.how(config)}") from failed.error
        return
    write_atomically(path, data)
