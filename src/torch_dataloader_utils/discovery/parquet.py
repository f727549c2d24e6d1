"""Parquet metadata: footers read concurrently, checked, pruned, kept as columns.

Each process reads the footers of its share of the files (all of them without a
process group), :data:`METADATA_THREADS` at once, and keeps of each footer only what
planning needs: rows, the row groups that may match the filter (by statistics and
partition values) and, for a file whose schema differs from the first file's, that
schema. The result is one Arrow table per share (:mod:`.metadata`); the footers
themselves are dropped (readers fetch the few they need when they read a chunk).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from torch_dataloader_utils.config import FetchConfig
from torch_dataloader_utils.discovery.listing import ListedFile
from torch_dataloader_utils.discovery.metadata import FileRows, SharedError, files_table
from torch_dataloader_utils.errors import CorruptFileError, SchemaMismatchError
from torch_dataloader_utils.plan.types import FileInfo, RowGroup
from torch_dataloader_utils.storage.footers import NotParquetError, read_footer_parsed
from torch_dataloader_utils.storage.fs import METADATA_CONCURRENCY, FileSystemSpec
from torch_dataloader_utils.storage.partitions import Partitions
from torch_dataloader_utils.storage.schemas import same_but_nullability

__all__ = [
    "METADATA_THREADS",
    "FooterCheck",
    "FooterInfo",
    "Reference",
    "check_fields",
    "ShareResult",
    "read_share",
    "reference",
    "row_groups",
]

METADATA_THREADS = METADATA_CONCURRENCY
"""Footers read at once per process (bounded thread pool; the s3fs connection pool is
as large). Each is one ranged request, mostly waiting on the network: 2,000 footers at
10 ms each take about 0.3 s with 64."""


@dataclass(frozen=True)
class FooterInfo:
    """What one ORC footer tells: the file (with every stripe) and its Arrow schema.

    Attributes:
        file: The file with all its stripes.
        schema: Its Arrow schema.
        footer: ``None`` (kept for symmetry with Parquet's footer bytes).
        partition_expression: The file's partition values.
    """

    file: FileInfo
    schema: pa.Schema
    footer: bytes | None
    partition_expression: pc.Expression | None = None


def row_groups(meta: pq.FileMetaData) -> tuple[RowGroup, ...]:
    """Every row group of a Parquet footer: first row, rows and compressed bytes."""
    groups = []
    first = 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        nbytes = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        groups.append(RowGroup(i, first, rg.num_rows, nbytes))
        first += rg.num_rows
    return tuple(groups)


def _corrupt(fs: FileSystemSpec, path: str, exc: BaseException) -> CorruptFileError:
    return CorruptFileError(
        f"cannot read the Parquet footer of {fs.display(path)!r} ({exc}); "
        "is it a Parquet file? Remove it from path or pass format= for its real format"
    )


def _parse(fs: FileSystemSpec, path: str, footer: bytes) -> pq.FileMetaData:
    try:
        return pq.read_metadata(pa.BufferReader(footer))
    except (OSError, pa.ArrowException) as exc:
        raise _corrupt(fs, path, exc) from exc


def _fetch_footer(
    fs: FileSystemSpec, listed: ListedFile, fetch: FetchConfig
) -> tuple[bytes, pq.FileMetaData | None]:
    try:
        return read_footer_parsed(fs, listed.path, listed.size, fetch)
    except (NotParquetError, OSError) as exc:
        raise _corrupt(fs, listed.path, exc) from exc


@dataclass(frozen=True)
class Reference:
    """The first file's footer: its schema is the dataset's, and others are checked against it.

    Attributes:
        path: The first file.
        footer: Its footer buffer.
        schema: Its Arrow schema.
    """

    path: str
    footer: bytes
    schema: pa.Schema

    @property
    def parquet_schema(self) -> Any:
        """The Parquet schema (a cheap first comparison for every other file)."""
        return pq.read_metadata(pa.BufferReader(self.footer)).schema


def reference(fs: FileSystemSpec, path: str, footer: bytes) -> Reference:
    """The :class:`Reference` of the first file's footer."""
    return Reference(path, footer, _parse(fs, path, footer).schema.to_arrow_schema())


def check_fields(
    fs: FileSystemSpec, first: Reference | FooterInfo, path: str, schema: pa.Schema, names: Sequence[str]
) -> None:
    """Check that ``schema`` (of ``path``) agrees with the first file's on ``names``.

    Raises:
        SchemaMismatchError: a needed field is missing or has another type (both files named).
    """
    first_path = first.path if isinstance(first, Reference) else first.file.path
    for name in names:
        a = first.schema.field(name) if name in first.schema.names else None
        b = schema.field(name) if name in schema.names else None
        if b is None:
            raise SchemaMismatchError(
                f"field {name!r} is in {fs.display(first_path)!r} but missing from "
                f"{fs.display(path)!r}; rewrite the files to one schema or "
                "leave the field out of columns"
            )
        if a is not None and not same_but_nullability(a.type, b.type):
            raise SchemaMismatchError(
                f"field {name!r} is {a.type} in {fs.display(first_path)!r} but "
                f"{b.type} in {fs.display(path)!r}; rewrite the files to one "
                "type or leave the field out of columns"
            )


@dataclass(frozen=True)
class FooterCheck:
    """What every footer is checked and pruned against (the request, resolved once).

    Attributes:
        first: The first file's footer.
        names: File columns the request reads (they must agree with the first file).
        filters: The row filter (row groups it excludes by statistics are dropped), or ``None``.
        schema: The dataset schema (data fields, then partition fields), for pruning.
        partitions: Partition values per file, or ``None``.
    """

    first: Reference
    names: tuple[str, ...]
    filters: pc.Expression | None
    schema: pa.Schema
    partitions: Partitions | None


def _kept_groups(footer: bytes, check: FooterCheck, path: str) -> set[int]:
    """Indices of the row groups whose statistics (or partition values) may match."""
    pexpr = check.partitions.expression(path) if check.partitions is not None else None
    frag: Any = ds.ParquetFileFormat().make_fragment(
        pa.BufferReader(footer),  # type: ignore[arg-type]
        partition_expression=pexpr,
    )
    frag.ensure_complete_metadata()
    return {g.id for g in frag.subset(check.filters, schema=check.schema).row_groups}


def _check_one(
    fs: FileSystemSpec,
    listed: ListedFile,
    footer: bytes,
    parsed: pq.FileMetaData | None,
    check: FooterCheck,
    parquet_schema: Any,
    keep: bool,
) -> FileRows:
    meta = parsed if parsed is not None else _parse(fs, listed.path, footer)
    schema_bytes = None
    if not meta.schema.equals(parquet_schema):
        try:
            schema = meta.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as exc:
            raise _corrupt(fs, listed.path, exc) from exc
        if not schema.equals(check.first.schema):
            check_fields(fs, check.first, listed.path, schema, check.names)
            schema_bytes = schema.serialize().to_pybytes()
    groups = row_groups(meta)
    if check.filters is not None:
        kept = _kept_groups(footer, check, listed.path)
        groups = tuple(g for g in groups if g.index in kept)
    return FileRows(listed, meta.num_rows, groups, schema_bytes, footer if keep else None)


@dataclass(frozen=True)
class ShareResult:
    """What one process learned from its share of footers.

    Attributes:
        table: The files table of its share (:data:`~.metadata.FILES_SCHEMA`, plus a
            ``footer`` column when footers are kept), up to the first error.
        error: The first error in file order (position ``-1``: the request itself, as
            ``make_check`` raised it), or ``None``.
        check: What ``make_check`` returned for the first file's footer, or ``None``
            when that failed.
    """

    table: pa.Table
    error: SharedError | None
    check: FooterCheck | None


def read_share(
    fs: FileSystemSpec,
    files: Sequence[ListedFile],
    first: ListedFile,
    make_check: Callable[[bytes], FooterCheck],
    *,
    first_index: int = 0,
    fetch: FetchConfig | None = None,
    threads: int = METADATA_THREADS,
    keep_footers: bool = False,
) -> ShareResult:
    """Read, check and prune the footers of ``files`` concurrently, as a files table.

    The dataset's first file's footer is read too (first, alongside the others: it is
    the share's own first file on the rank that holds it); ``make_check`` turns it into
    the request every footer is checked against. Fetching does not wait for it, only
    checking does, so the share costs no extra round trip.

    Nothing is raised: the first failure (in file order) is returned, to be passed to
    every rank and raised there.

    Args:
        fs: The filesystem.
        files: This process's share of the listing, in listing order.
        first: The dataset's first file (listing position 0).
        make_check: Builds the check from the first file's footer (may raise: a bad
            column or filter, reported at position -1).
        first_index: The listing position of ``files[0]`` (errors name positions).
        fetch: Retries of the ranged reads.
        threads: Footers read at once.
        keep_footers: Add the footer buffers as a ``footer`` column (for the readers).
    """
    reader = _ShareReader(fs, files, first, make_check, fetch or FetchConfig(), first_index, keep_footers)
    count = max(1, min(threads, len(files) + (0 if reader.own_first else 1)))
    if count == 1:
        reader.work()
    else:
        pool = [
            threading.Thread(target=reader.work, name=f"tdu-footer-{n}", daemon=True) for n in range(count)
        ]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    return reader.result()


class _ShareReader:
    """The footers of one share, read by a few threads that each take the next file.

    No future or queue per file: with thousands of footers per process their cost is a
    large part of the CPU. The first file's footer resolves the check every footer is
    checked against; a failure stops the files after it.
    """

    def __init__(
        self,
        fs: FileSystemSpec,
        files: Sequence[ListedFile],
        first: ListedFile,
        make_check: Callable[[bytes], FooterCheck],
        config: FetchConfig,
        first_index: int,
        keep_footers: bool,
    ) -> None:
        self.fs, self.files, self.first, self.make_check = fs, files, first, make_check
        self.config, self.first_index, self.keep = config, first_index, keep_footers
        self.own_first = first_index == 0 and bool(files)
        # Work items in order: -1 is the first file's footer when it is not in this share.
        self._items = iter(range(0 if self.own_first else -1, len(files)))
        self.results: list[FileRows | Exception | None] = [None] * len(files)
        self._lock = threading.Lock()
        self._failed = len(files)  # the first failed position: later files are not read
        self._ready = threading.Event()
        self.check: FooterCheck | None = None
        self._parquet_schema: Any = None  # the first file's, parsed once
        self.error: SharedError | None = None

    def _resolve(self, footer: bytes) -> None:
        try:
            self.check = self.make_check(footer)
            self._parquet_schema = self.check.first.parquet_schema
        except Exception as exc:  # a bad request: every rank meets the same
            index = -1 if not isinstance(exc, CorruptFileError) else 0
            self.error = SharedError(index, type(exc).__name__, str(exc))
        finally:
            self._ready.set()

    def _fail(self, i: int, exc: Exception) -> None:
        self.results[i] = exc
        with self._lock:
            self._failed = min(self._failed, i)

    def _next(self) -> int | None:
        with self._lock:
            i = next(self._items, None)
            return None if i is None or i > self._failed else i

    def work(self) -> None:
        """Take the next file until none is left (or one failed before it)."""
        while (i := self._next()) is not None:
            listed = self.first if i < 0 else self.files[i]
            first = i < 0 or (i == 0 and self.own_first)
            parsed: pq.FileMetaData | None = None
            try:
                footer, parsed = _fetch_footer(self.fs, listed, self.config)
            except Exception as exc:
                if not first:
                    self._fail(i, exc)
                    continue
                self.error = SharedError(0, type(exc).__name__, str(exc))
                self._ready.set()
                footer = None
            if first and footer is not None:
                self._resolve(footer)
            if self.error is not None:
                with self._lock:
                    self._failed = -1
                return
            if i < 0:
                continue
            self._ready.wait()
            if self.error is not None or self.check is None or footer is None:
                return
            try:
                self.results[i] = _check_one(
                    self.fs, listed, footer, parsed, self.check, self._parquet_schema, self.keep
                )
            except Exception as exc:  # passed on to every rank, raised there
                self._fail(i, exc)

    def result(self) -> ShareResult:
        """The share's files up to the first failure, and that failure."""
        if self.error is not None:
            return ShareResult(files_table([], footers=self.keep), self.error, None)
        rows: list[FileRows] = []
        for i, result in enumerate(self.results):
            if isinstance(result, Exception):
                error = SharedError(self.first_index + i, type(result).__name__, str(result))
                return ShareResult(files_table(rows, footers=self.keep), error, self.check)
            assert result is not None
            rows.append(result)
        return ShareResult(files_table(rows, footers=self.keep), None, self.check)
