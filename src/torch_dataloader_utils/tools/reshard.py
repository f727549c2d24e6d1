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

import dataclasses
import hashlib
import itertools
import json
import logging
import math
import multiprocessing
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from typing import Any, Unpack

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from torch_dataloader_utils.config import (
    COMPRESSIONS,
    DEFAULT_COMPRESSION,
    DEFAULT_RANK_TIMEOUT,
    DEFAULT_ROW_GROUP_BYTES,
    DEFAULT_TARGET_FILE_SIZE,
    RESHARD_SOURCE_FORMATS,
    ReshardConfig,
    ReshardSourceConfig,
)
from torch_dataloader_utils.discovery.listing import list_files
from torch_dataloader_utils.discovery.manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    check_directory_names,
    check_partition_field,
    hive_directory,
    partition_value,
)
from torch_dataloader_utils.discovery.parquet import row_groups
from torch_dataloader_utils.errors import (
    ConfigError,
    DestinationConflictError,
    FileChangedError,
    ReshardError,
    SourceChangedError,
    UnknownColumnError,
)
from torch_dataloader_utils.plan.shards import ReduceShard, Run, cut_shards, plan_reduce
from torch_dataloader_utils.plan.types import Chunk, FileInfo
from torch_dataloader_utils.runtime import share
from torch_dataloader_utils.runtime.dataset import PlannedDataset
from torch_dataloader_utils.runtime.options import ReshardKeywords, reshard_request
from torch_dataloader_utils.storage.expressions import filter_identity
from torch_dataloader_utils.storage.redact import redact
from torch_dataloader_utils.tools.checksum import Checksums, key_hashes
from torch_dataloader_utils.tools.reshard_io import (
    STATE_DIR,
    Destination,
    ShardWriter,
    conform,
    read_spill,
    write_spill,
    writing,
)

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_COMPRESSION",
    "DEFAULT_RANK_TIMEOUT",
    "DEFAULT_ROW_GROUP_BYTES",
    "DEFAULT_TARGET_FILE_SIZE",
    "SOURCE_FORMATS",
    "ReshardReport",
    "SizePlan",
    "open_source",
    "reshard",
    "source_identity",
]

log = logging.getLogger(__name__)

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
SOURCE_FORMATS = RESHARD_SOURCE_FORMATS
"""What ``format`` accepts; ``"iceberg"`` makes ``src`` a table name."""


def open_source(source: ReshardSourceConfig) -> PlannedDataset:
    """The source as the loader opens it: one process, every chunk, Arrow batches."""
    common: dict[str, Any] = {
        "columns": None if source.columns is None else list(source.columns),
        "filters": source.filters,
        "storage_options": source.storage_options,
        "equal_batches": "off",
        "num_workers": 0,
        "output_format": "arrow",
        "count_rows": True,
    }
    if source.format == "iceberg":
        from torch_dataloader_utils.runtime.iceberg import IcebergDataset

        assert isinstance(source.src, str)
        return IcebergDataset(
            source.src, catalog_config=source.catalog_config, snapshot_id=source.snapshot_id, **common
        )
    from torch_dataloader_utils.runtime.files import StructuredDataset

    if source.filesystem is not None:
        common["filesystem"] = source.filesystem
    return StructuredDataset(
        source.src if isinstance(source.src, str) else list(source.src),
        format=source.format,
        partitioning=source.partitioning,
        schema=source.schema,
        **common,
    )


def source_identity(source: ReshardSourceConfig) -> dict[str, Any]:
    """What was read, as a rerun must name it (the snapshot read is in the source's fingerprint)."""
    return {
        "src": source.src if isinstance(source.src, str) else list(source.src),
        "format": source.format,
        "columns": None if source.columns is None else list(source.columns),
        **filter_identity(source.filters),
        "partitioning": source.partitioning,
    }


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


def reshard(src: str | Sequence[str], dst: str, **options: Unpack[ReshardKeywords]) -> ReshardReport:
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
            interrupted job with the same source and options; it may not be inside the
            source, nor hold it.
        **options: Every keyword of
            :class:`~torch_dataloader_utils.runtime.options.ReshardKeywords`: the
            source's (``format``, ``columns``, ``filters``, ``storage_options``,
            ``partitioning``, ``schema``, ``catalog_config``, ``snapshot_id``,
            ``filesystem``), the output's (``dst_storage_options``, ``dst_filesystem``,
            ``target_file_size``, ``row_group_bytes``
            or ``row_group_rows``, ``compression``, ``sort_by``, ``group_by``,
            ``partition_by``) and the job's (``workers``, ``verify``, ``rank_timeout``).

    Returns:
        A :class:`ReshardReport` with the manifest.

    Raises:
        UnknownOptionError: a keyword is not an option of ``reshard``.
        ConfigError: an option has an invalid value.
        UnknownColumnError: ``sort_by`` / ``group_by`` / ``partition_by`` name a missing column.
        DestinationConflictError: ``dst`` holds other files, or another job's shards.
        SourceChangedError: the source changed since the job at ``dst`` started.
        ReshardError: ``dst`` cannot be written, a worker died, or ``verify`` found a
            difference.
    """
    started = time.perf_counter()
    request = reshard_request(src, dst, options)
    dest = Destination(request.dst_fs, request.dst_root)
    with share.job_world(request.job.rank_timeout) as world:
        dataset = open_source(request.source)
        job = _Job(dataset, request.source, request.job, dest, world.rank, world.num_ranks)
        manifest, written, skipped, verified = job.run()
    return ReshardReport(
        destination=dest.display(),
        manifest=manifest,
        shards_written=written,
        shards_skipped=skipped,
        seconds=time.perf_counter() - started,
        verified=verified,
    )


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
    job_id: str = ""


JOB_FILE = f"{STATE_DIR}/job.json"
"""The job's claim on its destination: its id, options, source and plan (created exclusively)."""


@dataclass
class _Job:
    """One reshard job in one process: the source, the plan, and every step."""

    dataset: PlannedDataset
    source: ReshardSourceConfig
    options: ReshardConfig
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
    job_id: str = ""
    """The id of the job at the destination, carried by its done markers (``""``: a job of
    an earlier version, whose markers carry none)."""

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
            json.dumps({**source_identity(self.source), **self.options.identity()}, default=str)
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
        self.job_id = state.job_id
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
            return self._finished(found, identity, now)
        job = self.dest.read_json(JOB_FILE)
        if job is not None:
            return self._join(job, identity, now, "an interrupted")
        self._check_empty()
        plan = self._calibrate()
        job_id = uuid.uuid4().hex[:16]
        doc = {"job_id": job_id, "options": identity, "source": now, "plan": asdict(plan)}
        if not self._claim(doc):
            # Another job claimed the destination since it was found empty: one started
            # at the same moment. Join it if it is this job, else stop without writing;
            # if it already ran to its end, its output is judged.
            found = self.dest.read(MANIFEST_NAME)
            if found is not None:
                return self._finished(found, identity, now)
            return self._join(self.dest.read_json(JOB_FILE), identity, now, "a running or interrupted")
        found = self.dest.read(MANIFEST_NAME)
        if found is not None:
            # A job started at the same moment ran to its end (and released its claim) while
            # this one was planning: this claim is dropped, and that job's output is judged.
            self.dest.remove_tree(STATE_DIR)
            return self._finished(found, identity, now)
        log.info(
            "reshard %s -> %s: %s rows, %d rows per shard, %d rows per row group (job %s)",
            self.source.src,
            self.dest.display(),
            plan.total_rows,
            plan.shard_rows,
            plan.row_group_rows,
            job_id,
        )
        return _State(plan=plan, job_id=job_id)

    def _finished(self, found: bytes, identity: dict[str, Any], now: dict[str, Any]) -> _State:
        """A finished job's manifest at the destination: this job's output if the options match."""
        manifest = Manifest.from_json(found, self.dest.display(MANIFEST_NAME))
        self._check_same(dict(manifest.options), dict(manifest.source), identity, now, "a finished")
        return _State(manifest=found)

    def _claim(self, doc: dict[str, Any]) -> bool:
        """Create the job file exclusively; whether this job holds the destination now."""
        data = json.dumps(doc, indent=1).encode("utf-8")
        try:
            created = self.dest.create_exclusive(JOB_FILE, data)
        except OSError as exc:
            if self._taken():
                # Another job claimed, or finished and removed its own files (``_reshard/``)
                # while this one wrote its claim there: the destination is that job's now.
                return False
            raise ReshardError(
                f"cannot write to the destination {self.dest.display()!r} ({exc}); check that it "
                "is writable (permissions, credentials in dst_storage_options) or choose another"
            ) from exc
        if not created:
            return False
        back = self.dest.read_json(JOB_FILE)  # a storage without exclusive creates: who won?
        return isinstance(back, dict) and back.get("job_id") == doc["job_id"]

    def _taken(self) -> bool:
        """Whether another job's claim or finished manifest is at the destination now."""
        try:
            return self.dest.read(MANIFEST_NAME) is not None or self.dest.read(JOB_FILE) is not None
        except OSError:
            return False

    def _join(self, job: Any, identity: dict[str, Any], now: dict[str, Any], what: str) -> _State:
        """Continue the job whose file is at the destination, if it is this one."""
        if not isinstance(job, dict) or not {"options", "source", "plan"} <= set(job):
            raise DestinationConflictError(
                f"dst={self.dest.display()!r} holds a reshard job file {self.dest.display(JOB_FILE)!r} "
                "that cannot be read; nothing was overwritten: delete dst to start over"
            )
        self._check_same(job["options"], job["source"], identity, now, what)
        return _State(plan=SizePlan(**job["plan"]), job_id=str(job.get("job_id", "")))

    def _check_empty(self) -> None:
        try:
            kind = self.dest.kind()
            entries = self.dest.entries() if kind == pafs.FileType.Directory else []
            # Another job's claim being written (its job file not linked yet): not a conflict
            # by itself; the claims decide which job holds the destination.
            entries = [e for e in entries if e != STATE_DIR]
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
        """Items of ``kind`` this job marked done (markers of another job are not its)."""
        names = self.dest.entries(f"{STATE_DIR}/done")
        pattern = re.compile(rf"{kind}-(\d{{6}}){re.escape(self._suffix)}\.json")
        return {int(m.group(1)) for m in map(pattern.fullmatch, names) if m is not None}

    @property
    def _suffix(self) -> str:
        return f".{self.job_id}" if self.job_id else ""

    def _marker(self, kind: str, index: int) -> str:
        return f"{STATE_DIR}/done/{kind}-{index:06d}{self._suffix}.json"

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
        with writing(self.dest, rel):
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
        self.dest.write_json(self._marker("shard", index), {**entry.to_json(), "job": self.job_id})

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
                values = [
                    None if code < 0 else partition_value(d[code])
                    for code, d in zip(row, dictionaries, strict=True)
                ]
                check_directory_names(opts.partition_by, values)
                partitions.append(values)
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
            self._marker("map", index),
            {"spill": spill, "partitions": partitions, "runs": runs, "job": self.job_id},
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
        """Rank 0: merge the done markers into the manifest; remove the job's own files.

        Before the manifest is written, the shards must hold the planned rows and be on
        storage as their markers describe them (sizes from one listing, whose
        modification times the manifest records): a job that lost a race for the
        destination, or whose shards were overwritten, stops here instead of publishing
        a manifest of other files.
        """
        assert self.plan is not None
        count = len(self.reduce) if self.options.grouped else len(self.shards)
        entries = [ShardEntry.from_json(doc) for doc in self._read_markers("shard", count)]
        self._check_rows(entries)
        manifest = Manifest(
            schema=self.manifest_schema,
            partition_by=self.options.partition_by,
            shards=tuple(self._as_listed(entries)),
            source=self.fingerprint(),
            options=self.identity(),
            plan=asdict(self.plan),
        )
        data = manifest.to_json()
        with writing(self.dest, MANIFEST_NAME):
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

    def _check_rows(self, entries: Sequence[ShardEntry]) -> None:
        """The shards' rows add up to the plan's (when every chunk's rows are known)."""
        assert self.plan is not None
        if any(c.num_rows is None for c in self.chunks):
            return
        written = sum(e.rows for e in entries)
        if written != self.plan.total_rows:
            raise ReshardError(
                f"the {len(entries)} shards of {self.dest.display()!r} hold {written} rows but the job "
                f"planned {self.plan.total_rows}: another job wrote to the same destination, or its "
                "shards were changed; no manifest was written: delete dst and run the command again"
            )

    def _as_listed(self, entries: Sequence[ShardEntry]) -> list[ShardEntry]:
        """``entries`` with the modification times a listing gives (sizes checked against it)."""
        listing = list_files(
            self.dest.display(), dict(self.dest.fs.storage_options) or None, filesystem=self.dest.fs.user
        )
        if not listing.fs.is_local:  # the manifest is written next: no stale listing cache
            listing.fs.fsspec().invalidate_cache()
        found = {f.path: f for f in listing.files}
        out = []
        for entry in entries:
            listed = found.get(self.dest.path(entry.path))
            if listed is None or listed.size != entry.bytes:
                now = "missing" if listed is None else f"{listed.size} bytes"
                raise ReshardError(
                    f"shard {self.dest.display(entry.path)!r} is {now} but was written with {entry.bytes} "
                    "bytes: another job wrote to the same destination, or the shard was changed; no "
                    "manifest was written: delete dst and run the command again"
                )
            out.append(dataclasses.replace(entry, mtime=listed.mtime))
        return out

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
        log.info("verify: %d rows, every column's checksum and the whole rows' match the source", source.rows)
        return True

    def _mine(self, count: int) -> list[int]:
        return list(range(self.rank, count, self.num_ranks))
