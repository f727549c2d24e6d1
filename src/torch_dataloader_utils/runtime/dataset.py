"""The IterableDataset: plan -> this worker's chunks -> read -> re-batch -> convert.

The dataset holds only values (file metadata, configs) and a shared-memory epoch
counter, so it pickles cheaply to DataLoader workers, and ``set_epoch`` reaches
persistent workers too.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import torch
from torch.utils.data import IterableDataset

from torch_dataloader_utils.config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EQUAL_BATCHES,
    DEFAULT_READ_AHEAD_BYTES,
    DEFAULT_RETRIES,
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_SHUFFLE_SEED,
    DEFAULT_SPLIT_BYTES,
    PADDING_COLUMN,
    EqualBatches,
    FetchConfig,
    FileFormat,
    OutputFormat,
    SplitKind,
    check_bool,
    check_int,
    coerce_enum,
    coerce_equal_batches,
    coerce_format,
    parse_size,
)
from torch_dataloader_utils.convert import BatchConverter, pack, pack_group
from torch_dataloader_utils.discovery import Discovered, discover
from torch_dataloader_utils.discovery.columns import filter_fields
from torch_dataloader_utils.discovery.counts import count_filtered_rows
from torch_dataloader_utils.discovery.text import COUNT_BLOCK_BYTES, TextOptions
from torch_dataloader_utils.errors import (
    ConfigError,
    IncompatibleOptionsError,
    ResumeStateError,
    UnknownLengthError,
)
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.batching import rebatch
from torch_dataloader_utils.io.pieces import read_piece
from torch_dataloader_utils.io.readers import make_reader
from torch_dataloader_utils.plan.planner import PlanSpec, plan_epoch
from torch_dataloader_utils.plan.resume import (
    STATE_FORMAT,
    STATE_VERSION,
    Piece,
    as_pieces,
    check_state,
    fingerprint,
    normalize,
    segment_pieces,
)
from torch_dataloader_utils.plan.splits import (
    ByteRangeSplit,
    FileSplit,
    RankAwareStrategy,
    RowGroupSplit,
    Splitter,
    resolve_strategy,
)
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, FileInfo, World
from torch_dataloader_utils.runtime import env, share
from torch_dataloader_utils.runtime.resume import EpochProgress, Tagged

GROUP_BYTES = 8 << 20
"""A worker under ``create_dataloader``'s loader sends batches in groups of about this size.

Every hand-off between a worker and the main process has a fixed cost (queue, pickle,
waking a process, a shared-memory segment); with small batches it dominates, so batches
travel several to a transfer. In flight at once: about ``(prefetch_factor + 1) *
num_workers`` groups. Measured in ``docs/benchmarks.md``.
"""

GROUP_MAX_BATCHES = 1024
"""At most this many batches per group."""

__all__ = ["PlannedDataset", "StructuredDataset"]

_DEFAULT_STRATEGY = {
    FileFormat.PARQUET: SplitKind.ROW_GROUP,
    FileFormat.ORC: SplitKind.ROW_GROUP,
    FileFormat.CSV: SplitKind.BYTE_RANGE,
    FileFormat.JSONL: SplitKind.BYTE_RANGE,
}


def build_strategy(
    split_strategy: object, format: FileFormat, split_bytes: object, split_rows: object
) -> Splitter | RankAwareStrategy:
    """The split strategy for the user's options (a built-in name or a custom object)."""
    size = parse_size(split_bytes, "split_bytes")
    rows = check_int(split_rows, "split_rows", 1, optional=True)
    if split_strategy is None or isinstance(split_strategy, (str, SplitKind)):
        kind = (
            _DEFAULT_STRATEGY[format]
            if split_strategy is None
            else coerce_enum(split_strategy, SplitKind, "split_strategy")
        )
        if kind is SplitKind.FILE:
            if size is not None or rows is not None:
                raise IncompatibleOptionsError(
                    "split_strategy='file' reads every file as one chunk; drop split_bytes / "
                    f"split_rows (got split_bytes={split_bytes!r}, split_rows={split_rows!r}) "
                    "or use split_strategy='row_group'"
                )
            return FileSplit()
        if kind is SplitKind.ROW_GROUP:
            if format not in (FileFormat.PARQUET, FileFormat.ORC):
                raise IncompatibleOptionsError(
                    f"split_strategy='row_group' needs format='parquet' or 'orc', got "
                    f"format={format.value!r}; use 'byte_range' or 'file'"
                )
            if size is None and rows is None:
                size = DEFAULT_SPLIT_BYTES
            return RowGroupSplit(split_bytes=size, split_rows=rows)
        if kind is SplitKind.BYTE_RANGE:
            if format not in (FileFormat.CSV, FileFormat.JSONL):
                raise IncompatibleOptionsError(
                    f"split_strategy='byte_range' needs format='csv' or 'jsonl', got "
                    f"format={format.value!r}; use 'row_group' or 'file'"
                )
            if rows is not None:
                raise IncompatibleOptionsError(
                    f"split_rows={split_rows!r} cannot size byte ranges (a row's position in a "
                    "text file is unknown before parsing); pass split_bytes instead"
                )
            return ByteRangeSplit(split_bytes=size if size is not None else DEFAULT_SPLIT_BYTES)
        raise ConfigError(f"split_strategy={kind.value!r} is not implemented yet for format={format.value!r}")
    if split_bytes is not None or split_rows is not None:
        raise IncompatibleOptionsError(
            "split_bytes / split_rows configure the built-in strategies; a custom "
            f"split_strategy ({type(split_strategy).__name__}) sizes its own chunks"
        )
    return resolve_strategy(split_strategy)


def text_options(
    format: FileFormat,
    strategy: object,
    schema: object,
    quoted_newlines: object,
    count_rows: object,
    count_cache_dir: object,
) -> TextOptions | None:
    """Validate the text-format options; ``None`` for formats that are not text.

    Raises:
        ConfigError: an option has a value of the wrong type.
        IncompatibleOptionsError: an option does not apply to ``format`` or needs another.
    """
    import pyarrow as pa

    is_text = format in (FileFormat.CSV, FileFormat.JSONL)
    if schema is not None and not isinstance(schema, pa.Schema):
        raise ConfigError(
            f"schema={schema!r} must be a pyarrow.Schema, e.g. "
            "pyarrow.schema([('id', pyarrow.int64()), ('text', pyarrow.string())])"
        )
    if schema is not None and not is_text:
        raise IncompatibleOptionsError(
            f"schema= applies to format='csv' or 'jsonl' (format={format.value!r} stores its own "
            "schema); drop schema"
        )
    for name, value in (("quoted_newlines", quoted_newlines), ("count_rows", count_rows)):
        if not isinstance(value, bool):
            raise ConfigError(f"{name}={value!r} must be True or False")
    if quoted_newlines and format is not FileFormat.CSV:
        raise IncompatibleOptionsError(
            f"quoted_newlines=True applies to format='csv' only (got format={format.value!r}); drop it"
        )
    if count_cache_dir is not None:
        if not isinstance(count_cache_dir, (str, os.PathLike)):
            raise ConfigError(f"count_cache_dir={count_cache_dir!r} must be a directory path (str)")
        if not count_rows:
            raise IncompatibleOptionsError(
                f"count_cache_dir={os.fspath(count_cache_dir)!r} caches the counts of count_rows=True; "
                "set count_rows=True or drop count_cache_dir"
            )
    if not is_text:
        return None
    block = COUNT_BLOCK_BYTES
    if isinstance(strategy, ByteRangeSplit):
        block = min(block, strategy.split_bytes)
    return TextOptions(
        schema=schema,
        quoted_newlines=bool(quoted_newlines),
        count_rows=bool(count_rows),
        count_cache_dir=None if count_cache_dir is None else os.fspath(count_cache_dir),
        count_block_bytes=block,
    )


def check_row_shuffle_window(row_shuffle_window: object, shuffle: object) -> None:
    """``row_shuffle_window`` is ``None`` or rows >= 1, and needs ``shuffle=True``."""
    check_int(row_shuffle_window, "row_shuffle_window", 1, optional=True, hint=" (rows shuffled together)")
    if row_shuffle_window is not None and not shuffle:
        raise IncompatibleOptionsError(
            f"row_shuffle_window={row_shuffle_window!r} mixes rows across chunks, which is a shuffle; "
            "pass shuffle=True too, or drop row_shuffle_window"
        )


@dataclasses.dataclass(frozen=True)
class CommonOptions:
    """The options every dataset (files, Iceberg) shares, checked and coerced once.

    Attributes:
        output: Output format of batches.
        equal: Equal-batches policy.
        world: The ranks to plan for.
        counting: Whether rows the metadata does not count are counted at construction.
    """

    output: OutputFormat
    equal: EqualBatches
    world: World
    counting: bool


def check_common(
    *,
    output_format: object,
    batch_size: object,
    shuffle: object,
    shuffle_seed: object,
    drop_last: object,
    num_workers: object,
    collate_fn: object,
    equal_batches: object,
    num_ranks: int | None,
    rank: int | None,
    count_rows: object,
    count_anyway: bool = False,
) -> CommonOptions:
    """Validate the shared options; decide whether rows are counted at construction.

    ``count_rows=None`` counts when equal batches need exact counts (more than one rank
    with ``equal_batches`` on), or when ``count_anyway`` (e.g. a count cache was given).

    Raises:
        ConfigError: an option has an invalid value (it is named, with the fix).
    """
    out = coerce_enum(output_format, OutputFormat, "output_format")
    equal = coerce_equal_batches(equal_batches)
    check_int(batch_size, "batch_size", 1, hint=" (rows per batch)")
    check_int(shuffle_seed, "shuffle_seed", 0)
    check_int(num_workers, "num_workers", 0)
    check_bool(shuffle, "shuffle")
    check_bool(drop_last, "drop_last")
    if collate_fn is not None and not callable(collate_fn):
        raise ConfigError(f"collate_fn={collate_fn!r} must be callable")
    world = env.resolve_world(num_ranks, rank)
    if count_rows is not None:
        check_bool(count_rows, "count_rows")
        counting = bool(count_rows)
    else:
        counting = (world.num_ranks > 1 and equal is not EqualBatches.OFF) or count_anyway
    return CommonOptions(out, equal, world, counting)


def batch_schema(schema: pa.Schema, equal: EqualBatches) -> pa.Schema:
    """The schema of every batch: ``schema``, plus the padding flag with ``equal_batches='pad'``.

    Raises:
        IncompatibleOptionsError: the data already has a column of the flag's name.
    """
    if equal is not EqualBatches.PAD:
        return schema
    if PADDING_COLUMN in schema.names:
        raise IncompatibleOptionsError(
            f"equal_batches='pad' adds a column {PADDING_COLUMN!r}, but the data already has one; "
            "rename it or leave it out of columns"
        )
    return schema.append(pa.field(PADDING_COLUMN, pa.bool_(), nullable=False))


def _count_filtered(found: Discovered, counting: bool) -> tuple[Discovered, str | None]:
    """Exact counts under a row filter (Parquet), or the reason counts stay unknown.

    A filter on hive partition columns only prunes whole files, so counts stay exact. A
    filter on data columns drops rows inside row groups: with ``counting`` the files are
    recounted in filtered coordinates (``discovery.counts``), else counts are unknown.
    """
    expr = found.filters
    if expr is None:
        return found, None
    part_names = set(found.partitions.schema.names) if found.partitions is not None else set()
    fields = filter_fields(found.filters, found.schema)
    data_fields = [f for f in fields if f not in part_names]
    if found.format is not FileFormat.PARQUET:
        return found, f"filters={found.filters} drops rows whose count is unknown before reading"
    if not data_fields:
        return found, None  # partition values pruned whole files: counts are exact
    if not counting:
        return found, (
            f"filters={found.filters} drops rows inside row groups and count_rows=False "
            "(count_rows=None or True counts them at startup)"
        )
    files = share.from_rank0(
        lambda: count_filtered_rows(
            found.fs,
            found.files,
            expr,
            filter_columns=data_fields,
            partitions=found.partitions,
            partition_columns=[f for f in fields if f in part_names],
            footers=found.extra.get("parquet_footers"),
        )
    )
    return dataclasses.replace(found, files=files, extra={**found.extra, "filtered_positions": True}), None


class PlannedDataset(IterableDataset[Any]):
    """Source-agnostic core: plans each epoch and reads this worker's chunks.

    Subclasses (files, Iceberg) discover the data and provide a reader.

    ``equal_batches`` (default ``'drop'``) makes every rank yield the same number of
    batches (see :class:`~torch_dataloader_utils.config.EqualBatches`). It needs exact
    row counts: a subclass whose counts are not exact (a row filter, deletes) passes
    ``row_count_issue``, a phrase saying why, which then makes ``equal_batches`` on more
    than one rank an error (never a hang) and ``len()`` an :class:`UnknownLengthError`.
    """

    def __init__(
        self,
        *,
        files: Sequence[FileInfo],
        strategy: Splitter | RankAwareStrategy,
        reader: ChunkReader,
        converter: BatchConverter,
        world: World,
        num_workers: int,
        batch_size: int,
        drop_last: bool,
        shuffle: bool,
        shuffle_seed: int,
        collate_fn: Callable[[Any], Any] | None,
        equal_batches: EqualBatches = DEFAULT_EQUAL_BATCHES,
        row_count_issue: str | None = None,
        row_shuffle_window: int | None = None,
        identity: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self._files = tuple(files)
        self._strategy = strategy
        self._reader = reader
        self._converter = converter
        self._world = world
        self._num_workers = num_workers
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._shuffle = shuffle
        self._seed = shuffle_seed
        self._collate_fn = collate_fn
        self._equal_batches = equal_batches
        self._row_count_issue = row_count_issue
        if world.num_ranks > 1 and equal_batches is not EqualBatches.OFF and row_count_issue:
            raise IncompatibleOptionsError(
                f"equal_batches={equal_batches.value!r} needs exact row counts, but {row_count_issue}, "
                f"so the {world.num_ranks} ranks' row counts are unknown before reading and they "
                "could yield different numbers of batches (a DDP job would hang). Mask those rows "
                "in the training step instead, rewrite the data already filtered, or pass "
                "equal_batches='off' and handle uneven inputs yourself (torch.distributed."
                "algorithms.Join)"
            )
        # Shared memory: set_epoch in the main process reaches persistent workers.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._init_resume(row_shuffle_window, identity)
        self._check_plan()

    # -- planning ---------------------------------------------------------------
    @property
    def world(self) -> World:
        """The ranks this dataset plans for."""
        return self._world

    @property
    def files(self) -> tuple[FileInfo, ...]:
        """The dataset's files (metadata only)."""
        return self._files

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read next; with ``shuffle=True`` each epoch has its own order.

        Call it before iterating, every epoch, on every rank (as with
        ``DistributedSampler.set_epoch``). Works with persistent workers.
        """
        check_int(epoch, "epoch", 0)
        self._epoch.fill_(epoch)
        self._on_set_epoch(epoch)

    def _spec(self, num_workers: int) -> PlanSpec:
        return PlanSpec(
            files=self._files,
            strategy=self._strategy,
            num_ranks=self._world.num_ranks,
            num_workers=max(1, num_workers),
            shuffle=self._shuffle,
            seed=self._seed,
            equal_batches=self._equal_batches,
            batch_size=self._batch_size,
        )

    def plan(self, epoch: int | None = None, num_workers: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the current one) for every rank and worker."""
        epoch = self.epoch if epoch is None else epoch
        workers = self._num_workers if num_workers is None else num_workers
        return plan_epoch(self._spec(workers), epoch)

    @property
    def equal_batches(self) -> EqualBatches:
        """The equal-batches policy (it acts only with more than one rank)."""
        return self._equal_batches

    def num_batches(self, epoch: int | None = None, num_workers: int | None = None) -> int:
        """Batches this rank yields in ``epoch`` with ``num_workers`` DataLoader workers.

        With ``equal_batches`` on, the count is the same on every rank and for any
        ``num_workers``; otherwise each worker's last batch may be short, so it depends
        on ``num_workers`` (default: the dataset's).

        Raises:
            UnknownLengthError: row counts are unknown before reading (a ``TypeError``).
        """
        if self._row_count_issue:
            raise UnknownLengthError(
                f"the number of batches is unknown before reading: {self._row_count_issue}. "
                "Iterate to count, or drop the row filter to get len()"
            )
        resumed = self._resumed_rows(self.epoch if epoch is None else epoch, num_workers)
        if resumed is not None:
            full_rest = [divmod(rows, self._batch_size) for rows in resumed]
            return sum(full + (1 if rest and not self._drop_last else 0) for full, rest in full_rest)
        plan = self.plan(epoch, num_workers)
        total = 0
        for worker in range(plan.num_workers):
            rows = plan.rows_for(self._world.rank, worker)
            if rows is None:
                raise UnknownLengthError(
                    "the number of batches is unknown before reading: this format's row counts "
                    "are not in its metadata (byte-range chunks). Iterate to count"
                )
            full, rest = divmod(rows, self._batch_size)
            total += full + (1 if rest and not self._drop_last else 0)
        return total

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch (see :meth:`num_batches`)."""
        return self.num_batches()

    def _check_plan(self) -> None:
        plan = self.plan(0)
        chunks = plan.rank_chunks(self._world.rank)
        if self._num_workers > 1 and len(chunks) < self._num_workers:
            warnings.warn(
                f"num_workers={self._num_workers} but rank {self._world.rank} has only "
                f"{len(chunks)} chunk(s) in epoch 0: {self._num_workers - len(chunks)} worker(s) "
                "will read nothing. Lower split_bytes / split_rows or num_workers.",
                UserWarning,
                stacklevel=4,
            )

    # -- reading ----------------------------------------------------------------
    def worker_chunks(self) -> tuple[Chunk, ...]:
        """The chunks the calling process (main or DataLoader worker) reads this epoch."""
        slot = env.worker_slot()
        plan = plan_epoch(self._spec(slot.count), self.epoch)
        return plan.chunks_for(self._world.rank, slot.id)

    def __iter__(self) -> Iterator[Any]:
        slot = env.worker_slot()
        epoch = self.epoch
        pieces = self._worker_pieces(slot, epoch)
        schedule = getattr(self._reader, "schedule", None)
        if schedule is not None:  # readers of remote files fetch the next chunks ahead
            schedule([c for piece in pieces for c in piece.chunks])
        flag = PADDING_COLUMN if self._equal_batches is EqualBatches.PAD else None
        # Position bookkeeping for resume: starts[i] = rows read before piece i.
        starts: list[int] = []
        read = 0

        def counted(index: int, piece: Piece) -> Iterator[Any]:
            nonlocal read
            starts.append(read)
            for batch in read_piece(self._reader, piece, flag_column=flag, batch_size=self._batch_size):
                read += batch.num_rows
                yield batch

        batches = itertools.chain.from_iterable(counted(i, p) for i, p in enumerate(pieces))
        tagging = self._loader_active
        progress = None if (tagging or slot.in_worker) else self._begin_progress(1)
        token = int(self._resume_token.item())
        emitted = 0
        if slot.in_worker and tagging:
            # Under the loader of create_dataloader (which flattens groups): several
            # batches per transfer, since each hand-off between processes has a fixed cost.
            yield from self._grouped(rebatch(batches, self._batch_size, self._drop_last), starts, token, slot)
            return
        for batch in rebatch(batches, self._batch_size, self._drop_last):
            emitted += batch.num_rows
            index = bisect.bisect_right(starts, emitted) - 1
            tag = (token, slot.id, slot.count, index, emitted - starts[index])
            if slot.in_worker and self._collate_fn is None:
                # Strings travel as Arrow buffers in the batch's one buffer (convert.pack).
                out = pack(self._converter.convert_for_transfer(batch))
            else:
                out = self._converter(batch)
                if self._collate_fn is not None:
                    out = self._collate_fn(out)
                if slot.in_worker:
                    out = pack(out)
            if tagging:
                yield Tagged(out, tag)
                continue
            if progress is not None:
                progress.record(tag)
            yield out
        if progress is not None:
            self._finish_progress()

    def _grouped(
        self, batches: Iterator[pa.RecordBatch], starts: list[int], token: int, slot: env.WorkerSlot
    ) -> Iterator[Any]:
        """Worker side: tagged batches sent in groups of about ``GROUP_BYTES``.

        A group is one :class:`Tagged` whose batch is a packed :class:`BatchGroup` and
        whose tag is the tuple of the batches' tags; the loader yields them one by one.
        Batches made before an error still arrive before the error.
        """
        pending: list[Any] = []
        tags: list[tuple[int, int, int, int, int]] = []
        size = emitted = 0
        try:
            for batch in batches:
                emitted += batch.num_rows
                index = bisect.bisect_right(starts, emitted) - 1
                if self._collate_fn is None:
                    pending.append(self._converter.convert_for_transfer(batch))
                else:
                    pending.append(self._collate_fn(self._converter(batch)))
                tags.append((token, slot.id, slot.count, index, emitted - starts[index]))
                size += batch.nbytes
                if size >= GROUP_BYTES or len(pending) >= GROUP_MAX_BATCHES:
                    yield Tagged(pack_group(pending), tuple(tags))  # type: ignore[arg-type]
                    pending, tags, size = [], [], 0
        except Exception:
            if pending:
                yield Tagged(pack_group(pending), tuple(tags))  # type: ignore[arg-type]
            raise
        if pending:
            yield Tagged(pack_group(pending), tuple(tags))  # type: ignore[arg-type]

    # >>> resume (issue 7) ------------------------------------------------------
    def _init_resume(self, row_shuffle_window: int | None, identity: Mapping[str, Any] | None) -> None:
        self._row_shuffle_window = row_shuffle_window
        self._identity = dict(identity or {})
        self._loader_active = False
        """Set while a loader from create_dataloader iterates: batches are then tagged."""
        self._resume: dict[str, Any] | None = None
        """A loaded state's epoch, segments and token (pickled to workers)."""
        # Shared memory: which loaded state is live (0: none), seen by persistent workers.
        self._resume_token = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._progress: EpochProgress | None = None

    @property
    def row_shuffle_window(self) -> int | None:
        """Rows shuffled together (the row-level shuffle's window), or ``None``."""
        return self._row_shuffle_window

    def fingerprint(self) -> dict[str, Any]:
        """What a resume state of this dataset is tied to (files digest and options)."""
        strategy = repr(self._strategy)
        if " at 0x" in strategy:
            strategy = f"{type(self._strategy).__module__}.{type(self._strategy).__qualname__}"
        options = {
            "split_strategy": strategy,
            "shuffle": self._shuffle,
            "shuffle_seed": self._seed,
            "batch_size": self._batch_size,
            "drop_last": self._drop_last,
            "equal_batches": self._equal_batches.value,
            "row_shuffle_window": self._row_shuffle_window,
            **self._identity,
        }
        return fingerprint(self._files, json.loads(json.dumps(options, default=str)))

    def _live_segments(self, epoch: int) -> list[dict[str, Any]] | None:
        """The loaded state's segments, when it is live and for ``epoch``."""
        token = int(self._resume_token.item())
        if token == 0:
            return None
        if self._resume is None or self._resume["token"] != token:
            raise ResumeStateError(
                "load_state_dict() was called after this loader's persistent workers started, so "
                "they cannot see the state; create a new loader (or persistent_workers=False) and "
                "load the state before the first iteration"
            )
        return list(self._resume["segments"]) if self._resume["epoch"] == epoch else None

    def _worker_pieces(self, slot: env.WorkerSlot, epoch: int) -> tuple[Piece, ...]:
        segments = self._live_segments(epoch)
        if not segments and self._row_shuffle_window is None:
            plan = plan_epoch(self._spec(slot.count), epoch)
            return tuple(as_pieces(plan.chunks_for(self._world.rank, slot.id)))
        return self._pieces(epoch, slot.count, segments or [])[slot.id]

    def _pieces(
        self, epoch: int, workers: int, segments: list[dict[str, Any]]
    ) -> tuple[tuple[Piece, ...], ...]:
        result = segment_pieces(
            self._spec(workers),
            epoch,
            segments,
            num_ranks=self._world.num_ranks,
            num_workers=lambda rank: max(1, workers),
            window_rows=self._row_shuffle_window,
            exact=self._row_count_issue is None,
        )
        return result.assignments[self._world.rank]

    def _resumed_rows(self, epoch: int, num_workers: int | None) -> list[int] | None:
        segments = self._live_segments(epoch)
        if not segments:
            return None
        workers = max(1, self._num_workers if num_workers is None else num_workers)
        rows = []
        for pieces in self._pieces(epoch, workers, segments):
            counts = [p.num_rows for p in pieces]
            if any(n is None for n in counts):
                raise UnknownLengthError("the number of batches left in this resumed epoch is unknown")
            rows.append(sum(n or 0 for n in counts))
        return rows

    def _on_set_epoch(self, epoch: int) -> None:
        self._progress = None
        if self._resume is not None and self._resume["epoch"] != epoch:
            self._resume_token.fill_(0)

    def _begin_progress(self, num_workers: int) -> EpochProgress:
        base = self._live_segments(self.epoch) or []
        self._progress = EpochProgress(max(1, num_workers), base=base)
        return self._progress

    def _consume(self, item: Any) -> Any:
        """Main process: record a tagged batch as consumed and return the batch.

        (Groups of batches are split by the loader before they get here.)
        """
        if not isinstance(item, Tagged):
            return item
        if self._progress is not None:
            self._progress.record(item.tag)
        return item.batch

    def _finish_progress(self) -> None:
        if self._progress is not None:
            self._progress.done = True
        self._resume_token.fill_(0)  # the resumed rest is read: the next pass is a full epoch

    def state_dict(self) -> dict[str, Any]:
        """What the training loop has consumed of the current epoch, as plain JSON values.

        Counted in the main process: the batches the loop received (from the loader of
        ``create_dataloader``, or from iterating this dataset in the main process)
        before this call; batches prefetched by workers are not consumed. The state
        holds this rank only; combine ranks with ``merge_states`` or ``gather_state``.
        It is tied to the files and options (``fingerprint``) and is small: a cursor
        ``(piece, row offset)`` per worker, per interrupted segment of the epoch.
        """
        epoch = self.epoch
        progress = self._progress
        segments = progress.base if progress is not None else self._live_segments(epoch) or []
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint(),
            "epoch": epoch,
            "seed": self._seed,
            "world": {"num_ranks": self._world.num_ranks, "rank": self._world.rank},
            "segments": segments,
        }
        if progress is None:
            return state
        segment = {"num_ranks": self._world.num_ranks, "ranks": {str(self._world.rank): progress.entry()}}
        state["segments"] = [*segments, segment]
        return normalize(state) if self._world.num_ranks == 1 else state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state: the next pass over its epoch reads only what was not consumed.

        The state must hold every rank (one rank's own state on a single-rank job, else
        ``merge_states([...])`` or ``gather_state``). The rest of the epoch is
        re-planned over this dataset's world, which may have other ``num_ranks`` and
        ``num_workers`` than the saved one. Sets :attr:`epoch` to the state's epoch;
        the epoch after it is a normal full epoch.

        Raises:
            ResumeStateError: not a state, another version, or not every rank.
            StateMismatchError: saved for other files or options (says what changed).
        """
        checked = check_state(json.loads(json.dumps(state)), self.fingerprint())
        checked = normalize(checked)
        self._epoch.fill_(checked["epoch"])
        self._progress = None
        if not checked["segments"]:
            self._resume = None
            self._resume_token.fill_(0)
            return
        token = int(torch.randint(1, 2**62, ()).item())
        self._resume = {"epoch": checked["epoch"], "segments": checked["segments"], "token": token}
        self._resume_token.fill_(token)
        self._pieces(checked["epoch"], max(1, self._num_workers), checked["segments"])  # validates

    # <<< resume ----------------------------------------------------------------


class StructuredDataset(PlannedDataset):
    """Parquet (and other file formats) on any fsspec filesystem, sharded by plan.

    Prefer :meth:`create_dataloader`, which also builds the DataLoader. Every row is
    read exactly once per epoch across all ranks and workers.
    """

    def __init__(
        self,
        path: str | Sequence[str],
        *,
        format: str | FileFormat = "parquet",
        columns: Sequence[str] | None = None,
        filters: Any = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        drop_last: bool = False,
        shuffle: bool = False,
        shuffle_seed: int = DEFAULT_SHUFFLE_SEED,
        split_strategy: object = None,
        split_bytes: int | str | None = None,
        split_rows: int | None = None,
        output_format: str | OutputFormat = "torch",
        null_fill: Any = None,
        collate_fn: Callable[[Any], Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        partitioning: str | None = None,
        num_ranks: int | None = None,
        rank: int | None = None,
        num_workers: int = 0,
        equal_batches: str | EqualBatches = DEFAULT_EQUAL_BATCHES,
        schema: Any = None,
        quoted_newlines: bool = False,
        count_rows: bool | None = None,
        count_cache_dir: str | os.PathLike[str] | None = None,
        read_ahead_bytes: int | str | None = DEFAULT_READ_AHEAD_BYTES,
        retries: int = DEFAULT_RETRIES,
        retry_backoff: float = DEFAULT_RETRY_BACKOFF,
        row_shuffle_window: int | None = None,
    ) -> None:
        fmt = coerce_format(format)
        check_row_shuffle_window(row_shuffle_window, shuffle)
        fetch = FetchConfig.from_user(read_ahead_bytes, retries, retry_backoff)
        common = check_common(
            output_format=output_format,
            batch_size=batch_size,
            shuffle=shuffle,
            shuffle_seed=shuffle_seed,
            drop_last=drop_last,
            num_workers=num_workers,
            collate_fn=collate_fn,
            equal_batches=equal_batches,
            num_ranks=num_ranks,
            rank=rank,
            count_rows=count_rows,
            count_anyway=count_cache_dir is not None,
        )
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ConfigError(f"storage_options={storage_options!r} must be a dict of filesystem options")
        strategy = build_strategy(split_strategy, fmt, split_bytes, split_rows)
        text = text_options(fmt, strategy, schema, quoted_newlines, common.counting, count_cache_dir)
        found = discover(
            path,
            format=fmt,
            columns=columns,
            filters=filters,
            partitioning=partitioning,
            storage_options=storage_options,
            text=text,
            fetch=fetch,
            share=share.from_rank0,
        )
        found, issue = _count_filtered(found, common.counting)
        self.discovered: Discovered = found
        """What discovery found: files, schema, columns."""
        super().__init__(
            files=found.files,
            strategy=strategy,
            reader=make_reader(found, batch_size, fetch),
            converter=BatchConverter(
                batch_schema(found.output_schema, common.equal), common.output, null_fill
            ),
            world=common.world,
            num_workers=num_workers,
            batch_size=batch_size,
            drop_last=bool(drop_last),
            shuffle=bool(shuffle),
            shuffle_seed=shuffle_seed,
            collate_fn=collate_fn,
            equal_batches=common.equal,
            row_count_issue=issue,
            row_shuffle_window=row_shuffle_window,
            identity={
                "format": fmt.value,
                "columns": list(found.output_columns),
                "filters": None if found.filters is None else str(found.filters),
                "partitioning": partitioning,
            },
        )

    @classmethod
    def create_dataloader(cls, path: str | Sequence[str], **kwargs: Any) -> tuple[Any, StructuredDataset]:
        """Build the dataset and its DataLoader; see :func:`create_dataloader`."""
        from torch_dataloader_utils.runtime.loader import create_dataloader

        return create_dataloader(path, **kwargs)
