"""``reshard``: many small files into balanced Parquet shards, in parallel, restartable.

The source is anything the loader reads, opened as the loader opens it (a
``StructuredDataset`` or ``IcebergDataset``): its discovery, its planned chunks and its
reader (projection, filters, Iceberg deletes) are the loader's own. The job is a pure
function of that plan:

1. **Plan.** The source's chunks, in a canonical order, are cut at row granularity into
   consecutive shards of ``shard_rows`` rows (:func:`~torch_dataloader_utils.plan.shards.cut_shards`),
   so every source row lands in exactly one shard. ``shard_rows`` and the rows per row
   group come from a sample of the source written with the job's settings (a fit of
   bytes per row plus fixed bytes), so shards come out close to ``target_file_size``.
2. **Write.** Each shard is written by whichever process takes it: to a temporary name
   under ``_reshard/tmp/``, renamed to ``part-NNNNN.parquet`` when complete, then marked
   done (``_reshard/done/``). A rerun skips done shards and rewrites the others; a
   partial shard is never visible.
3. **Group or partition** (``group_by`` / ``partition_by``): a map phase writes each
   task's rows sorted by (partition, hash bucket of the key) to a spill file, then a
   reduce phase builds every shard from whole buckets of one partition
   (:func:`~torch_dataloader_utils.plan.shards.plan_reduce`), sorted by the key so a
   group's rows are contiguous. Both phases have done markers.
4. **Manifest.** Once every shard is done, ``_manifest.json`` lists every shard's rows,
   bytes and row groups; ``create_dataloader(path=DST)`` plans from it without listing
   or footers. The job's own files (``_reshard/``) are then removed.

Shards are written by local worker processes (``workers``) and, under torchrun, by
every rank: rank ``r`` takes shards ``r, r + world, ...``; ranks meet at barriers that
also carry failures (``runtime.share.all_ok``), and rank 0 merges the manifest.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import multiprocessing
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from torch_dataloader_utils.config import check_bool, check_int, parse_size
from torch_dataloader_utils.discovery.manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    check_partition_field,
    hive_directory,
    partition_value,
)
from torch_dataloader_utils.discovery.parquet import row_groups
from torch_dataloader_utils.errors import (
    ConfigError,
    DestinationConflictError,
    FileChangedError,
    IncompatibleOptionsError,
    ReshardError,
    SourceChangedError,
    UnknownColumnError,
)
from torch_dataloader_utils.plan.shards import ReduceShard, Run, cut_shards, plan_reduce
from torch_dataloader_utils.plan.types import Chunk, FileInfo
from torch_dataloader_utils.runtime import env, share
from torch_dataloader_utils.runtime.dataset import PlannedDataset
from torch_dataloader_utils.storage.fs import resolve
from torch_dataloader_utils.storage.redact import redact
from torch_dataloader_utils.storage.userfs import UserFileSystem
from torch_dataloader_utils.tools.checksum import Checksums, key_hashes
from torch_dataloader_utils.tools.reshard_io import (
    STATE_DIR,
    Destination,
    ShardWriter,
    conform,
    read_spill,
    write_spill,
)

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_COMPRESSION",
    "DEFAULT_RANK_TIMEOUT",
    "DEFAULT_ROW_GROUP_BYTES",
    "DEFAULT_TARGET_FILE_SIZE",
    "ReshardOptions",
    "ReshardReport",
    "SizePlan",
    "reshard",
]

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE = 256 * 1024**2
"""Size of every output shard but the last (256 MiB) when ``target_file_size`` is not given."""
DEFAULT_ROW_GROUP_BYTES = 32 * 1024**2
"""Size of a row group (32 MiB) when neither ``row_group_bytes`` nor ``row_group_rows`` is given:
several per shard, so the loader can split a shard among workers."""
DEFAULT_COMPRESSION = "zstd"
"""Parquet codec of the shards when ``compression`` is not given."""
COMPRESSIONS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")
"""The Parquet codecs ``compression`` accepts."""
DEFAULT_RANK_TIMEOUT = 24 * 3600.0
"""Seconds a rank waits for the others at a barrier, when ``reshard`` starts the process group."""
SAMPLE_ROWS = 65536
"""Rows of the source written in memory to measure bytes per row (before planning)."""
SAMPLE_CHUNKS = 16
"""Chunks the sample is drawn from, spread evenly over the source."""
MAP_TASK_BYTES = 256 * 1024**2
"""Arrow bytes a map task holds in memory (``group_by`` / ``partition_by``)."""
BUCKETS_PER_SHARD = 16
"""Hash buckets per expected shard (``group_by``): shards are packed from whole buckets."""
MAX_BUCKETS = 1 << 20
"""Upper bound of the hash buckets of a ``group_by`` job."""
VERIFY_TASKS_PER_WORKER = 4
"""Groups of chunks ``verify`` reads per worker process (fewer, longer tasks: read-ahead works)."""
SOURCE_FORMATS = ("parquet", "orc", "csv", "jsonl", "iceberg")
"""What ``format`` accepts; ``"iceberg"`` makes ``src`` a table name."""


def _names(value: object, param: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        if len(set(value)) != len(value):
            raise ConfigError(f"{param}={list(value)!r} names a column twice")
        return tuple(value)
    raise ConfigError(f"{param}={value!r} must be a column name or a list of column names")


@dataclass(frozen=True, kw_only=True)
class ReshardOptions:
    """The checked options of a reshard job (built once from :func:`reshard`'s keywords).

    Attributes:
        target_file_size: Bytes of every shard but the last (and but each partition's last).
        row_group_bytes: Bytes per row group, or ``None`` when ``row_group_rows`` is set.
        row_group_rows: Rows per row group, or ``None`` (sized by ``row_group_bytes``).
        compression: Parquet codec, one of :data:`COMPRESSIONS`.
        sort_by: Columns each shard is sorted by.
        group_by: Columns whose rows stay together in one shard, contiguous.
        partition_by: Columns written as ``key=value`` directories.
        workers: Local worker processes per rank.
        verify: Compare row counts and per-column checksums of source and output.
        rank_timeout: Seconds a rank waits at a barrier (process group started by reshard).
    """

    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    row_group_bytes: int | None = DEFAULT_ROW_GROUP_BYTES
    row_group_rows: int | None = None
    compression: str = DEFAULT_COMPRESSION
    sort_by: tuple[str, ...] = ()
    group_by: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()
    workers: int = 1
    verify: bool = False
    rank_timeout: float = DEFAULT_RANK_TIMEOUT

    def __post_init__(self) -> None:
        check_int(self.target_file_size, "target_file_size", 1, hint=" (bytes, or a string like '256MiB')")
        check_int(self.row_group_bytes, "row_group_bytes", 1, optional=True)
        check_int(self.row_group_rows, "row_group_rows", 1, optional=True)
        if (self.row_group_bytes is None) == (self.row_group_rows is None):
            raise IncompatibleOptionsError(
                f"pass one of row_group_bytes and row_group_rows (got row_group_bytes="
                f"{self.row_group_bytes!r}, row_group_rows={self.row_group_rows!r})"
            )
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression={self.compression!r} is not supported; use one of "
                + ", ".join(repr(c) for c in COMPRESSIONS)
            )
        check_int(self.workers, "workers", 1, hint=" (worker processes per rank)")
        check_bool(self.verify, "verify")
        timeout = self.rank_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"rank_timeout={timeout!r} must be a number of seconds > 0")
        both = sorted(set(self.sort_by) & set(self.partition_by))
        if both:
            raise IncompatibleOptionsError(
                f"sort_by and partition_by both name {both}: a partition column is constant "
                "within a shard; drop it from sort_by"
            )

    @property
    def grouped(self) -> bool:
        """Whether the job runs a map and a reduce phase (``group_by`` or ``partition_by``)."""
        return bool(self.group_by or self.partition_by)

    def identity(self) -> dict[str, Any]:
        """The options that decide the output (a rerun must pass the same)."""
        return {
            "target_file_size": self.target_file_size,
            "row_group_bytes": self.row_group_bytes,
            "row_group_rows": self.row_group_rows,
            "compression": self.compression,
            "sort_by": list(self.sort_by),
            "group_by": list(self.group_by),
            "partition_by": list(self.partition_by),
        }


@dataclass(frozen=True)
class SourceSpec:
    """The source of a job as values: what :meth:`open` hands to the loader's datasets."""

    src: str | tuple[str, ...]
    format: str
    columns: tuple[str, ...] | None = None
    filters: Any = None
    storage_options: Mapping[str, Any] | None = None
    partitioning: str | None = None
    schema: pa.Schema | None = None
    catalog_config: Mapping[str, Any] | None = None
    snapshot_id: int | None = None
    filesystem: Any = None

    def __post_init__(self) -> None:
        if self.format not in SOURCE_FORMATS:
            raise ConfigError(
                f"format={self.format!r} is not supported; use one of "
                + ", ".join(repr(f) for f in SOURCE_FORMATS)
            )
        iceberg = self.format == "iceberg"
        for name, value in (("catalog_config", self.catalog_config), ("snapshot_id", self.snapshot_id)):
            if value is not None and not iceberg:
                raise IncompatibleOptionsError(
                    f"{name}= applies to format='iceberg' (got format={self.format!r}); drop it"
                )
        if iceberg:
            for name, given in (
                ("partitioning", self.partitioning),
                ("schema", self.schema),
                ("filesystem", self.filesystem),
            ):
                if given is not None:
                    raise IncompatibleOptionsError(f"{name}= does not apply to format='iceberg'; drop it")
        if iceberg and not isinstance(self.src, str):
            raise ConfigError(
                f"format='iceberg' needs src= to be a table name like 'db.events', got {self.src!r}"
            )

    def open(self) -> PlannedDataset:
        """The source as the loader opens it: one process, every chunk, Arrow batches."""
        common: dict[str, Any] = {
            "columns": None if self.columns is None else list(self.columns),
            "filters": self.filters,
            "storage_options": self.storage_options,
            "equal_batches": "off",
            "num_workers": 0,
            "output_format": "arrow",
            "count_rows": True,
        }
        if self.format == "iceberg":
            from torch_dataloader_utils.runtime.iceberg import IcebergDataset

            assert isinstance(self.src, str)
            return IcebergDataset(
                self.src, catalog_config=self.catalog_config, snapshot_id=self.snapshot_id, **common
            )
        from torch_dataloader_utils.runtime.files import StructuredDataset

        if self.filesystem is not None:
            common["filesystem"] = self.filesystem
        return StructuredDataset(
            self.src if isinstance(self.src, str) else list(self.src),
            format=self.format,
            partitioning=self.partitioning,
            schema=self.schema,
            **common,
        )

    def identity(self) -> dict[str, Any]:
        """What was read (a rerun must name the same source)."""
        return {
            "src": self.src if isinstance(self.src, str) else list(self.src),
            "format": self.format,
            "columns": None if self.columns is None else list(self.columns),
            "filters": None if self.filters is None else str(self.filters),
            "partitioning": self.partitioning,
        }  # the snapshot read is in the source's fingerprint


@dataclass(frozen=True)
class SizePlan:
    """The sizes a job plans with, fixed when it starts (kept in ``_reshard/job.json``).

    Attributes:
        shard_rows: Rows per shard.
        row_group_rows: Rows per row group.
        bytes_per_row: Measured Parquet bytes per row of the sample.
        fixed_bytes: Measured bytes of a file beyond its rows (footer, headers).
        task_rows: Rows per map task (``group_by`` / ``partition_by``).
        buckets: Hash buckets of the group key (1 without ``group_by``).
        total_rows: Rows of the source.
    """

    shard_rows: int
    row_group_rows: int
    bytes_per_row: float
    fixed_bytes: int
    task_rows: int
    buckets: int
    total_rows: int


@dataclass(frozen=True)
class ReshardReport:
    """What :func:`reshard` did.

    Attributes:
        destination: The output directory (with its scheme).
        manifest: The manifest written (or found complete) there.
        shards_written: Shards written by this call (on every rank together).
        shards_skipped: Shards already done by an earlier, interrupted run.
        seconds: Wall time of the call.
        verified: Whether ``verify`` compared source and output (and found them equal).
    """

    destination: str
    manifest: Manifest
    shards_written: int
    shards_skipped: int
    seconds: float
    verified: bool

    @property
    def num_shards(self) -> int:
        """Shards in the output."""
        return len(self.manifest.shards)

    @property
    def num_rows(self) -> int:
        """Rows in the output."""
        return self.manifest.num_rows

    @property
    def num_bytes(self) -> int:
        """Bytes of the output's shards."""
        return self.manifest.num_bytes

    def describe(self) -> str:
        """One line for the command line: shards, rows, bytes, what this run wrote, time."""
        return (
            f"{self.destination}: {self.num_shards} shards, {self.num_rows} rows, "
            f"{self.num_bytes} bytes ({self.shards_written} written now, {self.shards_skipped} "
            f"done before) in {self.seconds:.1f} s" + ("; verified" if self.verified else "")
        )


def _destination_filesystem(
    dst: str, filesystem: Any, dst_filesystem: Any, dst_storage_options: Mapping[str, Any] | None
) -> UserFileSystem | None:
    """The user's filesystem object for ``dst``: ``dst_filesystem``, else ``filesystem`` on its scheme."""
    if dst_filesystem is not None:
        if dst_storage_options:
            raise IncompatibleOptionsError(
                "dst_filesystem and dst_storage_options were both given; configure the filesystem "
                "object instead, or drop dst_filesystem"
            )
        return UserFileSystem(dst_filesystem)
    if filesystem is None or dst_storage_options is not None:
        return None
    wrapped = UserFileSystem(filesystem)
    scheme, sep, _ = dst.partition("://")
    return wrapped if not sep or scheme in wrapped.protocols else None


def reshard(
    src: str | Sequence[str],
    dst: str,
    *,
    format: str = "parquet",
    columns: Sequence[str] | None = None,
    filters: Any = None,
    storage_options: Mapping[str, Any] | None = None,
    partitioning: str | None = None,
    schema: pa.Schema | None = None,
    catalog_config: Mapping[str, Any] | None = None,
    snapshot_id: int | None = None,
    dst_storage_options: Mapping[str, Any] | None = None,
    target_file_size: int | str = DEFAULT_TARGET_FILE_SIZE,
    row_group_bytes: int | str | None = None,
    row_group_rows: int | None = None,
    compression: str = DEFAULT_COMPRESSION,
    sort_by: str | Sequence[str] | None = None,
    group_by: str | Sequence[str] | None = None,
    partition_by: str | Sequence[str] | None = None,
    workers: int | None = 1,
    verify: bool = False,
    rank_timeout: float = DEFAULT_RANK_TIMEOUT,
    filesystem: Any = None,
    dst_filesystem: Any = None,
) -> ReshardReport:
    """Rewrite a dataset into Parquet shards of a target size, with a manifest the loader opens.

    Every source row lands in exactly one shard. The job is restartable: run the same
    call again after an interruption and it skips the shards already written. Under
    torchrun (or with an initialized process group) every rank must call it; the ranks
    split the shards and rank 0 writes the manifest. See ``docs/resharding.md``.

    Args:
        src: What the loader reads: files, directories or globs (``format`` one of
            ``"parquet"``, ``"orc"``, ``"csv"``, ``"jsonl"``), local or on object storage,
            or an Iceberg table name with ``format="iceberg"``.
        dst: The output directory (local or a URL). It must be new or empty, or hold an
            interrupted job with the same source and options.
        format: The source's format, or ``"iceberg"``.
        columns: Columns to keep (default: all).
        filters: A ``pyarrow.compute.Expression``: only rows passing it are written.
        storage_options: The source's filesystem options (credentials, endpoint); also
            used for ``dst`` when it is on the same kind of filesystem.
        partitioning: ``"hive"`` reads the source's ``key=value`` directories as columns.
        schema: CSV / JSONL: the column types.
        catalog_config: Iceberg: ``pyiceberg.catalog.load_catalog`` properties.
        snapshot_id: Iceberg: the snapshot to read (default: the current one).
        dst_storage_options: The output's filesystem options, when they differ.
        target_file_size: Bytes of every shard but the last (an int, or ``"256MiB"``).
            Shards come within about 10% of it when rows have similar sizes; with
            ``group_by`` a shard holds whole groups, with ``partition_by`` each partition
            has its own last shard.
        row_group_bytes: Bytes per row group (default 32 MiB), e.g. ``"16MiB"``.
        row_group_rows: Rows per row group, instead of ``row_group_bytes``.
        compression: ``"zstd"`` (default), ``"snappy"``, ``"lz4"``, ``"gzip"``,
            ``"brotli"`` or ``"none"``.
        sort_by: Column(s) each shard is sorted by (the shard is sorted in memory).
        group_by: Column(s) whose equal values stay in one shard, in consecutive rows.
        partition_by: Column(s) written as ``key=value`` directories (not in the files);
            integers, strings, booleans or dates.
        workers: Worker processes per rank (``None``: the CPUs of this rank).
        verify: After writing, read source and output again and compare row counts and
            an order-independent checksum of every column.
        rank_timeout: Seconds a rank waits for the others at a barrier, when reshard
            starts the process group itself (torchrun without one).
        filesystem: The source's filesystem object (an fsspec or pyarrow filesystem
            instance, as the loader's ``filesystem=``) instead of ``storage_options``;
            also used for ``dst`` when ``dst`` has no scheme or the filesystem's.
        dst_filesystem: The output's filesystem object, when it differs.

    Returns:
        A :class:`ReshardReport` with the manifest.

    Raises:
        ConfigError: an option has an invalid value.
        UnknownColumnError: ``sort_by`` / ``group_by`` / ``partition_by`` name a missing column.
        DestinationConflictError: ``dst`` holds other files, or another job's shards.
        SourceChangedError: the source changed since the job at ``dst`` started.
        ReshardError: ``dst`` cannot be written, a worker died, or ``verify`` found a
            difference.
    """
    started = time.perf_counter()
    if workers is None:
        workers = env.cpus_per_rank()
    options = ReshardOptions(
        target_file_size=_size(target_file_size, "target_file_size"),
        row_group_bytes=(
            None
            if row_group_rows is not None and row_group_bytes is None
            else _size(
                row_group_bytes if row_group_bytes is not None else DEFAULT_ROW_GROUP_BYTES, "row_group_bytes"
            )
        ),
        row_group_rows=row_group_rows,
        compression=_codec(compression),
        sort_by=_names(sort_by, "sort_by"),
        group_by=_names(group_by, "group_by"),
        partition_by=_names(partition_by, "partition_by"),
        workers=workers,
        verify=verify,
        rank_timeout=rank_timeout,
    )
    if isinstance(columns, str):
        raise ConfigError(f"columns={columns!r} must be a list of column names, e.g. ['{columns}']")
    if isinstance(src, (list, tuple)):
        src_value: str | tuple[str, ...] = tuple(src)
    elif isinstance(src, str):
        src_value = src
    else:
        raise ConfigError(f"src={src!r} must be a path, a URL, a list of them, or an Iceberg table name")
    source = SourceSpec(
        src=src_value,
        format=format.strip().lower() if isinstance(format, str) else format,
        columns=None if columns is None else tuple(columns),
        filters=filters,
        storage_options=storage_options,
        partitioning=partitioning,
        schema=schema,
        catalog_config=catalog_config,
        snapshot_id=snapshot_id,
        filesystem=filesystem,
    )
    if not isinstance(dst, str) or not dst:
        raise ConfigError(f"dst={dst!r} must be a directory path or URL")
    dst_given = _destination_filesystem(dst, filesystem, dst_filesystem, dst_storage_options)
    if (
        dst_storage_options is None
        and _protocol(dst) == _protocol(_first(src_value))
        and source.format != "iceberg"
    ):
        dst_storage_options = storage_options
    spec, root = resolve(dst, dst_storage_options, filesystem=dst_given)
    dest = Destination(spec, root.rstrip("/") or "/")
    with share.job_world(options.rank_timeout) as world:
        dataset = source.open()
        job = _Job(dataset, source, options, dest, world.rank, world.num_ranks)
        report = job.run()
    return ReshardReport(
        destination=dest.display(),
        manifest=report[0],
        shards_written=report[1],
        shards_skipped=report[2],
        seconds=time.perf_counter() - started,
        verified=report[3],
    )


def _size(value: object, param: str) -> int:
    size = parse_size(value, param)
    if size is None:
        raise ConfigError(f"{param}=None is not a size; pass bytes as an int or a string like '256MiB'")
    return size


def _codec(value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"compression={value!r} must be one of " + ", ".join(repr(c) for c in COMPRESSIONS))
    name = value.strip().lower()
    return "none" if name == "uncompressed" else name


def _first(src: str | tuple[str, ...]) -> str:
    return src if isinstance(src, str) else (src[0] if src else "")


def _protocol(path: str) -> str:
    return path.split("://", 1)[0].lower() if "://" in path else "file"


# -- worker processes -----------------------------------------------------------------

_ACTIVE: _Job | None = None


def _install(job: _Job) -> None:
    global _ACTIVE
    _ACTIVE = job


def _call(method: str, item: int) -> Any:
    assert _ACTIVE is not None, "worker process started without its job"
    return getattr(_ACTIVE, method)(item)


def run_tasks(job: _Job, method: str, items: Sequence[int], workers: int) -> list[Any]:
    """``job.method(item)`` for every item, on up to ``workers`` forked processes.

    The job is handed to the workers by fork (not pickled); results come back in order.

    Raises:
        ReshardError: a worker process died (killed, out of memory).
    """
    if workers <= 1 or len(items) <= 1:
        return [getattr(job, method)(i) for i in items]
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(
        max_workers=min(workers, len(items)), mp_context=context, initializer=_install, initargs=(job,)
    ) as pool:
        futures = [pool.submit(_call, method, i) for i in items]
        try:
            return [f.result() for f in futures]
        except BrokenProcessPool as exc:
            raise ReshardError(
                f"a reshard worker process died ({exc}); the shards it finished are kept: run "
                "the same command again to write the rest (lower workers= if memory ran out)"
            ) from exc
        except BaseException:
            for f in futures:
                f.cancel()
            raise


# -- the job ----------------------------------------------------------------------------


@dataclass
class _State:
    """What rank 0 found at the destination (broadcast to every rank)."""

    plan: SizePlan | None = None
    manifest: bytes | None = None


@dataclass
class _Job:
    """One reshard job in one process: the source, the plan, and every step."""

    dataset: PlannedDataset
    source: SourceSpec
    options: ReshardOptions
    dest: Destination
    rank: int
    num_ranks: int
    plan: SizePlan | None = None
    shards: list[tuple[Chunk, ...]] = field(default_factory=list)
    tasks: list[tuple[Chunk, ...]] = field(default_factory=list)
    reduce: list[ReduceShard] = field(default_factory=list)
    partitions: list[tuple[object, ...]] = field(default_factory=list)
    output: PlannedDataset | None = None
    verify_groups: tuple[list[list[Chunk]], list[list[Chunk]]] = ([], [])

    def __post_init__(self) -> None:
        schema = self.dataset.schema
        wanted = {"sort_by": self.options.sort_by, "group_by": self.options.group_by}
        wanted["partition_by"] = self.options.partition_by
        for param, names in wanted.items():
            missing = [n for n in names if n not in schema.names]
            if missing:
                raise UnknownColumnError(
                    f"{param}={list(names)!r}: {missing} not found; columns: {schema.names}"
                )
        for name in self.options.partition_by:
            check_partition_field(schema.field(name))
        if len(self.options.partition_by) == len(schema.names):
            raise ConfigError(
                f"partition_by={list(self.options.partition_by)!r} takes every column into directories, "
                "leaving the files without columns; keep at least one column out of partition_by"
            )
        self.file_schema = pa.schema([f for f in schema if f.name not in self.options.partition_by])
        self.manifest_schema = pa.schema(
            list(self.file_schema) + [schema.field(n) for n in self.options.partition_by]
        )
        order = {f.path: i for i, f in enumerate(self.dataset.files)}
        chunks = self.dataset.plan(0, num_workers=1).all_chunks()
        self.chunks = sorted(chunks, key=lambda c: (order[c.path], c.start, c.skip))
        self.files: dict[str, FileInfo] = {f.path: f for f in self.dataset.files}

    # -- identity -----------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """Source and options, as a rerun must repeat them (JSON values)."""
        values: dict[str, Any] = json.loads(
            json.dumps({**self.source.identity(), **self.options.identity()}, default=str)
        )
        return values

    def fingerprint(self) -> dict[str, Any]:
        """What the source is now: a digest of its files and schema, and a summary."""
        digest = hashlib.sha256()
        for f in self.dataset.files:
            digest.update(json.dumps([f.path, f.size, f.mtime, f.num_rows]).encode("utf-8"))
        digest.update(self.dataset.schema.serialize().to_pybytes())
        snapshot = getattr(self.dataset, "snapshot_id", None)
        digest.update(repr(snapshot).encode("utf-8"))
        rows = [c.num_rows for c in self.chunks]
        return {
            "fingerprint": digest.hexdigest(),
            "files": len(self.dataset.files),
            "bytes": sum(f.size for f in self.dataset.files),
            "rows": None if any(r is None for r in rows) else sum(r or 0 for r in rows),
            "snapshot_id": snapshot,
        }

    # -- the steps ----------------------------------------------------------------------
    def run(self) -> tuple[Manifest, int, int, bool]:
        """Every step on this rank; ``(manifest, written, skipped, verified)``."""
        state = share.from_rank0(self._prepare)
        if state.manifest is not None:
            manifest = Manifest.from_json(state.manifest, self.dest.display(MANIFEST_NAME))
            log.info(
                "%s is complete (%d shards): nothing to write", self.dest.display(), len(manifest.shards)
            )
            verified = self._verify(manifest) if self.options.verify else False
            return manifest, 0, len(manifest.shards), verified
        assert state.plan is not None
        self.plan = state.plan
        if self.options.grouped:
            written, skipped = self._run_grouped()
        else:
            written, skipped = self._run_direct()
        data = share.from_rank0(self._finish)
        manifest = Manifest.from_json(data, self.dest.display(MANIFEST_NAME))
        verified = self._verify(manifest) if self.options.verify else False
        return manifest, written, skipped, verified

    def _prepare(self) -> _State:
        """Rank 0: check the destination, then start or resume the job there."""
        identity, now = self.identity(), self.fingerprint()
        found = self.dest.read(MANIFEST_NAME)
        if found is not None:
            manifest = Manifest.from_json(found, self.dest.display(MANIFEST_NAME))
            self._check_same(dict(manifest.options), dict(manifest.source), identity, now, "a finished")
            return _State(manifest=found)
        job = self.dest.read_json(f"{STATE_DIR}/job.json")
        if job is not None:
            self._check_same(job["options"], job["source"], identity, now, "an interrupted")
            return _State(plan=SizePlan(**job["plan"]))
        self._check_empty()
        plan = self._calibrate()
        doc = {"options": identity, "source": now, "plan": asdict(plan)}
        try:
            self.dest.write_json(f"{STATE_DIR}/job.json", doc)
        except OSError as exc:
            raise ReshardError(
                f"cannot write to the destination {self.dest.display()!r} ({exc}); check that it "
                "is writable (permissions, credentials in dst_storage_options) or choose another"
            ) from exc
        log.info(
            "reshard %s -> %s: %s rows, %d rows per shard, %d rows per row group",
            self.source.src,
            self.dest.display(),
            plan.total_rows,
            plan.shard_rows,
            plan.row_group_rows,
        )
        return _State(plan=plan)

    def _check_empty(self) -> None:
        try:
            kind = self.dest.kind()
            entries = self.dest.entries() if kind == pafs.FileType.Directory else []
        except OSError as exc:
            raise ReshardError(
                f"cannot read the destination {self.dest.display()!r} ({exc}); check the path and "
                "its credentials (dst_storage_options)"
            ) from exc
        if kind == pafs.FileType.File:
            raise DestinationConflictError(
                f"dst={self.dest.display()!r} is a file; reshard writes a directory: choose a new path"
            )
        if entries:
            shown = ", ".join(repr(e) for e in entries[:3]) + (" ..." if len(entries) > 3 else "")
            raise DestinationConflictError(
                f"dst={self.dest.display()!r} already holds {len(entries)} entries not written by "
                f"reshard ({shown}); nothing was overwritten: choose a new or empty directory, or "
                "delete it first"
            )

    def _check_same(
        self,
        options: dict[str, Any],
        source: dict[str, Any],
        identity: dict[str, Any],
        now: dict[str, Any],
        what: str,
    ) -> None:
        where = self.dest.display()
        changed = [k for k in sorted(set(options) | set(identity)) if options.get(k) != identity.get(k)]
        if changed:
            detail = "; ".join(
                f"{k}={redact(options.get(k))!r} there, {redact(identity.get(k))!r} now" for k in changed
            )
            raise DestinationConflictError(
                f"dst={where!r} holds {what} reshard job with other options ({detail}); nothing was "
                "overwritten: rerun with the same options to continue it, choose another dst, or "
                "delete it to start over"
            )
        if source.get("fingerprint") != now["fingerprint"]:
            parts = [
                f"{k} {source.get(k)!r} then, {now.get(k)!r} now"
                for k in ("files", "bytes", "rows", "snapshot_id")
                if source.get(k) != now.get(k)
            ]
            detail = "; ".join(parts) or "file sizes or modification times differ"
            hint = ""
            if source.get("snapshot_id") != now.get("snapshot_id") and source.get("snapshot_id") is not None:
                hint = (
                    f" (pass snapshot_id={source['snapshot_id']} to finish on the snapshot it started from)"
                )
            raise SourceChangedError(
                f"the source changed since {what} reshard job at dst={where!r} started ({detail}); "
                f"nothing was overwritten: restore the source{hint}, or delete {where!r} to reshard "
                "the new data"
            )

    # -- planning sizes -------------------------------------------------------------------
    def _sample(self) -> pa.Table:
        chunks = [c for c in self.chunks if c.num_rows != 0]
        if not chunks:
            return self.file_schema.empty_table()
        picks = sorted(
            set(np.linspace(0, len(chunks) - 1, min(SAMPLE_CHUNKS, len(chunks))).round().astype(int))
        )
        per = max(1, SAMPLE_ROWS // len(picks))
        parts: list[pa.RecordBatch] = []
        for i in picks:
            got = 0
            batches = self.dataset.read_chunk(chunks[int(i)])
            for batch in batches:
                take = conform(batch, self.dataset.schema).slice(0, per - got)
                parts.append(take)
                got += take.num_rows
                if got >= per:
                    break
            close = getattr(batches, "close", None)
            if close is not None:
                close()
        table = pa.Table.from_batches(parts, schema=self.dataset.schema)
        return table.select(self.file_schema.names)

    def _written_size(self, table: pa.Table, row_group_rows: int) -> int:
        sink = pa.BufferOutputStream()
        writer = ShardWriter(
            sink, self.file_schema, compression=self.options.compression, row_group_rows=row_group_rows
        )
        writer.write_table(table)
        writer.close()
        return int(sink.tell())

    def _calibrate(self) -> SizePlan:
        """Rows per shard and per row group, from a sample written with the job's settings.

        A file of ``n`` rows takes about ``fixed + n * per_row`` bytes: ``fixed`` is the
        size of a file without rows (footer, schema), ``per_row`` comes from the sample
        written in row groups of the planned size.
        """
        opts = self.options
        total = sum(c.num_rows or 0 for c in self.chunks)
        sample = self._sample()
        n = sample.num_rows
        fixed = self._written_size(sample.slice(0, 0), 1)
        per_row = max(1e-3, (self._written_size(sample, max(1, n)) - fixed) / n) if n else 1.0

        def sizes(per_row: float) -> tuple[int, int]:
            shard = max(1, round((opts.target_file_size - fixed) / per_row))
            group = opts.row_group_rows or max(1, round((opts.row_group_bytes or 1) / per_row))
            return shard, min(group, shard)

        shard_rows, group_rows = sizes(per_row)
        for _ in range(2):  # encodings depend on the rows per row group: measure with the planned ones
            if n == 0:
                break
            per_row = max(1e-3, (self._written_size(sample, group_rows) - fixed) / n)
            shard_rows, group_rows = sizes(per_row)
        arrow_per_row = (sample.nbytes / n) if n else 1.0
        task_rows = max(1, min(shard_rows, int(MAP_TASK_BYTES / max(arrow_per_row, 1e-9))))
        expected = max(1, math.ceil(total / shard_rows))
        buckets = min(MAX_BUCKETS, BUCKETS_PER_SHARD * expected) if opts.group_by else 1
        return SizePlan(
            shard_rows=shard_rows,
            row_group_rows=group_rows,
            bytes_per_row=per_row,
            fixed_bytes=fixed,
            task_rows=task_rows,
            buckets=buckets,
            total_rows=total,
        )

    def _rows_of(self, chunk: Chunk) -> int:
        """An estimate for a chunk of unknown row count (never cut): bytes at the source's density."""
        known = [c for c in self.chunks if c.num_rows is not None and c.num_bytes]
        if not known:
            return 0
        density = sum(c.num_rows or 0 for c in known) / sum(c.num_bytes for c in known)
        return round(chunk.num_bytes * density)

    # -- done markers ---------------------------------------------------------------------
    def _done(self, kind: str) -> set[int]:
        names = self.dest.entries(f"{STATE_DIR}/done")
        prefix = f"{kind}-"
        return {int(n[len(prefix) : -5]) for n in names if n.startswith(prefix) and n.endswith(".json")}

    @staticmethod
    def _marker(kind: str, index: int) -> str:
        return f"{STATE_DIR}/done/{kind}-{index:06d}.json"

    def _shard_path(self, index: int, partition: tuple[object, ...]) -> str:
        name = f"part-{index:05d}.parquet"
        if not self.options.partition_by:
            return name
        return f"{hive_directory(self.options.partition_by, partition)}/{name}"

    def _step(self, kind: str, method: str, count: int) -> tuple[int, int]:
        """Run ``method`` on this rank's undone items of ``kind``; ``(written, skipped)`` of all ranks."""
        done = self._done(kind)
        mine = [i for i in range(self.rank, count, self.num_ranks) if i not in done]
        error: BaseException | None = None
        try:
            run_tasks(self, method, mine, self.options.workers)
        except Exception as exc:
            error = exc
        share.all_ok(error)
        counts = share.all_gather(len(mine))
        written = sum(counts)
        return written, count - written

    def _run_direct(self) -> tuple[int, int]:
        assert self.plan is not None
        self.shards = cut_shards(self.chunks, self.files, self.plan.shard_rows, rows_of=self._rows_of)
        return self._step("shard", "write_shard", len(self.shards))

    def _run_grouped(self) -> tuple[int, int]:
        assert self.plan is not None
        self.tasks = cut_shards(self.chunks, self.files, self.plan.task_rows, rows_of=self._rows_of)
        self._step("map", "map_task", len(self.tasks))
        self.reduce, self.partitions = share.from_rank0(self._plan_reduce)
        return self._step("shard", "reduce_shard", len(self.reduce))

    # -- writing a shard ------------------------------------------------------------------
    def _write(self, index: int, table_or_batches: pa.Table | Any, partition: tuple[object, ...]) -> None:
        assert self.plan is not None
        rel = self._shard_path(index, partition)
        temp = self.dest.temp(rel)
        sorting = [
            c for c in (*self.options.group_by, *self.options.sort_by) if c not in self.options.partition_by
        ]
        with self.dest.open_output(temp) as out:
            writer = ShardWriter(
                out,
                self.file_schema,
                compression=self.options.compression,
                row_group_rows=self.plan.row_group_rows,
                sorting=list(dict.fromkeys(sorting)),
            )
            if isinstance(table_or_batches, pa.Table):
                writer.write_table(table_or_batches)
            else:
                for batch in table_or_batches:
                    writer.write(batch)
            meta = writer.close()
            size = int(out.tell())
        self.dest.commit(temp, rel)
        entry = ShardEntry(rel, meta.num_rows, size, row_groups(meta), partition)
        self.dest.write_json(self._marker("shard", index), entry.to_json())

    def _sorted(self, table: pa.Table) -> pa.Table:
        keys = [
            c for c in (*self.options.group_by, *self.options.sort_by) if c not in self.options.partition_by
        ]
        keys = list(dict.fromkeys(keys))
        if not keys or table.num_rows < 2:
            return table
        return table.sort_by([(k, "ascending") for k in keys])

    def _read(self, chunks: Sequence[Chunk]) -> Iterator[pa.RecordBatch]:
        for batch in self.dataset.read_chunks(chunks):
            yield conform(batch, self.dataset.schema)

    def write_shard(self, index: int) -> None:
        """Write shard ``index`` of a direct job (no grouping, no partitions)."""
        batches = self._read(self.shards[index])
        if self.options.sort_by:
            table = pa.Table.from_batches(list(batches), schema=self.dataset.schema)
            self._write(index, self._sorted(table), ())
        else:
            self._write(index, batches, ())

    # -- map and reduce -------------------------------------------------------------------
    def map_task(self, index: int) -> None:
        """Map task ``index``: its rows sorted by (partition, bucket), one record batch per run."""
        assert self.plan is not None
        opts = self.options
        table = pa.Table.from_batches(list(self._read(self.tasks[index])), schema=self.dataset.schema)
        n = table.num_rows
        partitions: list[list[object]] = []
        pid = np.zeros(n, dtype=np.int64)
        if opts.partition_by and n:
            codes = []
            dictionaries = []
            for name in opts.partition_by:
                encoded = table.column(name).combine_chunks().dictionary_encode()
                codes.append(encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64))
                dictionaries.append(encoded.dictionary.to_pylist())
            unique, pid = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
            pid = pid.reshape(-1)
            for row in unique:
                partitions.append(
                    [
                        None if code < 0 else partition_value(d[code])
                        for code, d in zip(row, dictionaries, strict=True)
                    ]
                )
        bucket = np.zeros(n, dtype=np.int64)
        if opts.group_by and n:
            bucket = (key_hashes(table, opts.group_by) % np.uint64(self.plan.buckets)).astype(np.int64)
        order = np.lexsort((bucket, pid))
        data = table.select(self.file_schema.names).take(order)
        pid, bucket = pid[order], bucket[order]
        cuts = np.flatnonzero((np.diff(pid) != 0) | (np.diff(bucket) != 0)) + 1
        bounds = [0, *cuts.tolist(), n] if n else [0]
        runs = []
        batches = []
        for lo, hi in itertools.pairwise(bounds):
            batches.append(data.slice(lo, hi - lo).combine_chunks().to_batches()[0])
            runs.append([int(pid[lo]), int(bucket[lo]), hi - lo])
        spill = f"{STATE_DIR}/spill/map-{index:06d}.arrow"
        write_spill(self.dest, spill, self.file_schema, batches)
        self.dest.write_json(
            self._marker("map", index), {"spill": spill, "partitions": partitions, "runs": runs}
        )

    def _plan_reduce(self) -> tuple[list[ReduceShard], list[tuple[object, ...]]]:
        """Rank 0: the reduce shards, from every map task's marker."""
        assert self.plan is not None
        markers = self._read_markers("map", len(self.tasks))
        keyed = sorted(
            {tuple(p) for m in markers for p in m["partitions"]},
            key=lambda values: tuple((v is None, v) for v in values),
        )
        position = {values: i for i, values in enumerate(keyed)}
        runs = []
        for task, marker in enumerate(markers):
            local = [position[tuple(p)] for p in marker["partitions"]] or [0]
            for index, (pid, bucket, rows) in enumerate(marker["runs"]):
                runs.append(Run(task, index, local[pid], bucket, rows))
        shards = plan_reduce(runs, self.plan.shard_rows, whole_buckets=bool(self.options.group_by))
        return shards, keyed

    def reduce_shard(self, index: int) -> None:
        """Write reduce shard ``index``: its runs, sorted by the group key (and ``sort_by``)."""
        shard = self.reduce[index]
        by_task: dict[int, list[tuple[int, int, int]]] = {}
        for seg in shard.segments:
            by_task.setdefault(seg.task, []).append((seg.index, seg.offset, seg.rows))
        batches: list[pa.RecordBatch] = []
        for task, indices in sorted(by_task.items()):
            batches.extend(read_spill(self.dest, f"{STATE_DIR}/spill/map-{task:06d}.arrow", indices))
        table = pa.Table.from_batches(batches, schema=self.file_schema)
        partition = self.partitions[shard.partition] if self.partitions else ()
        self._write(index, self._sorted(table), tuple(partition))

    # -- the manifest ---------------------------------------------------------------------
    def _read_markers(self, kind: str, count: int) -> list[Any]:
        def one(index: int) -> Any:
            doc = self.dest.read_json(self._marker(kind, index))
            if doc is None:
                raise ReshardError(
                    f"{kind} {index} of {self.dest.display()!r} has no done marker after every rank "
                    "finished; run the same command again"
                )
            return doc

        if self.dest.fs.is_local or count <= 1:
            return [one(i) for i in range(count)]
        with ThreadPoolExecutor(max_workers=min(32, count)) as pool:
            return list(pool.map(one, range(count)))

    def _finish(self) -> bytes:
        """Rank 0: merge the done markers into the manifest; remove the job's own files."""
        assert self.plan is not None
        count = len(self.reduce) if self.options.grouped else len(self.shards)
        entries = [ShardEntry.from_json(doc) for doc in self._read_markers("shard", count)]
        manifest = Manifest(
            schema=self.manifest_schema,
            partition_by=self.options.partition_by,
            shards=tuple(entries),
            source=self.fingerprint(),
            options=self.identity(),
            plan=asdict(self.plan),
        )
        data = manifest.to_json()
        self.dest.write_atomic(MANIFEST_NAME, data)
        self.dest.remove_tree(STATE_DIR)
        log.info(
            "wrote %s: %d shards, %d rows, %d bytes",
            self.dest.display(MANIFEST_NAME),
            len(entries),
            manifest.num_rows,
            manifest.num_bytes,
        )
        return data

    # -- verify ---------------------------------------------------------------------------
    def _groups(self, chunks: Sequence[Chunk]) -> list[list[Chunk]]:
        """Consecutive runs of chunks, a few per worker of every rank."""
        parts = max(1, self.options.workers * self.num_ranks * VERIFY_TASKS_PER_WORKER)
        size = max(1, math.ceil(len(chunks) / parts))
        return [list(chunks[i : i + size]) for i in range(0, len(chunks), size)]

    def checksum_source(self, index: int) -> Checksums:
        """Checksums of the rows of source group ``index``."""
        sums = Checksums()
        for batch in self._read(self.verify_groups[0][index]):
            sums.add(batch)
        return sums

    def checksum_output(self, index: int) -> Checksums:
        """Checksums of output group ``index`` (read through the manifest, as the loader does)."""
        assert self.output is not None
        sums = Checksums()
        for batch in self.output.read_chunks(self.verify_groups[1][index]):
            sums.add(batch)
        return sums

    def _verify(self, manifest: Manifest) -> bool:
        """Compare row counts and column checksums of source and output on every rank."""
        from torch_dataloader_utils.runtime.files import StructuredDataset

        self.output = StructuredDataset(
            self.dest.display(),
            storage_options=dict(self.dest.fs.storage_options) or None,
            filesystem=self.dest.fs.user,
            use_manifest=True,
            equal_batches="off",
            num_workers=0,
            output_format="arrow",
        )
        output_chunks = sorted(
            self.output.plan(0, num_workers=1).all_chunks(), key=lambda c: (c.path, c.start)
        )
        self.verify_groups = (self._groups(self.chunks), self._groups(output_chunks))
        workers = self.options.workers
        try:
            parts = [
                Checksums.total(
                    run_tasks(self, "checksum_source", self._mine(len(self.verify_groups[0])), workers)
                ),
                Checksums.total(
                    run_tasks(self, "checksum_output", self._mine(len(self.verify_groups[1])), workers)
                ),
            ]
        except FileChangedError as exc:
            raise ReshardError(f"verify: a file differs from what the job planned: {exc}") from exc
        gathered = share.all_gather(parts)
        source = Checksums.total(p[0] for p in gathered)
        output = Checksums.total(p[1] for p in gathered)
        problems = source.differences(output)
        if problems:
            raise ReshardError(
                f"verify: {self.dest.display()!r} does not hold the source's rows: " + "; ".join(problems[:5])
            )
        log.info("verify: %d rows and every column's checksum match the source", source.rows)
        return True

    def _mine(self, count: int) -> list[int]:
        return list(range(self.rank, count, self.num_ranks))
