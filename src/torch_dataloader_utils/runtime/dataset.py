"""The IterableDataset: plan -> this worker's chunks -> read -> re-batch -> convert.

The dataset holds only values (file metadata, configs) and a shared-memory epoch
counter, so it pickles cheaply to DataLoader workers, and ``set_epoch`` reaches
persistent workers too.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset

from torch_dataloader_utils.config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SHUFFLE_SEED,
    DEFAULT_SPLIT_BYTES,
    FileFormat,
    OutputFormat,
    SplitKind,
    check_int,
    coerce_enum,
    coerce_format,
    parse_size,
)
from torch_dataloader_utils.convert import BatchConverter, pack, pack_group
from torch_dataloader_utils.discovery import Discovered, discover
from torch_dataloader_utils.errors import ConfigError, IncompatibleOptionsError
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.io.batching import rebatch
from torch_dataloader_utils.io.readers import make_reader
from torch_dataloader_utils.plan.planner import PlanSpec, plan_epoch
from torch_dataloader_utils.plan.splits import (
    FileSplit,
    RankAwareStrategy,
    RowGroupSplit,
    Splitter,
    resolve_strategy,
)
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, FileInfo, World
from torch_dataloader_utils.runtime import env

__all__ = ["GROUP_BYTES", "GROUP_MAX_BATCHES", "PlannedDataset", "StructuredDataset"]

GROUP_BYTES = 8 << 20
"""A worker sends batches in groups of about this many bytes (when the loader flattens them).

Such a group travels in one shared-memory segment (see ``convert.PIPE_MAX_BYTES``): one
file-descriptor handshake per group instead of one per tensor or per batch. Every
hand-off between processes waits for the scheduler, which on a busy 2-core machine
costs more than the copying; measured there, 4-8 MiB groups beat 256 KiB groups through
the pipe by 1.2-1.5x (docs/benchmarks.md). In flight at once: about
``(prefetch_factor + 1) * num_workers`` groups.
"""

GROUP_MAX_BATCHES = 1024
"""At most this many batches per group."""

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
        raise ConfigError(f"split_strategy={kind.value!r} is not implemented yet for format={format.value!r}")
    if split_bytes is not None or split_rows is not None:
        raise IncompatibleOptionsError(
            "split_bytes / split_rows configure the built-in strategies; a custom "
            f"split_strategy ({type(split_strategy).__name__}) sizes its own chunks"
        )
    return resolve_strategy(split_strategy)


class PlannedDataset(IterableDataset[Any]):
    """Source-agnostic core: plans each epoch and reads this worker's chunks.

    Subclasses (files, Iceberg) discover the data and provide a reader.
    """

    _group_transfer = False
    """Set (around the start of workers) by a loader that flattens batch groups."""

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
        # Shared memory: set_epoch in the main process reaches persistent workers.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
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

    def _spec(self, num_workers: int) -> PlanSpec:
        return PlanSpec(
            files=self._files,
            strategy=self._strategy,
            num_ranks=self._world.num_ranks,
            num_workers=max(1, num_workers),
            shuffle=self._shuffle,
            seed=self._seed,
        )

    def plan(self, epoch: int | None = None, num_workers: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the current one) for every rank and worker."""
        epoch = self.epoch if epoch is None else epoch
        workers = self._num_workers if num_workers is None else num_workers
        return plan_epoch(self._spec(workers), epoch)

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
        chunks = self.worker_chunks()
        batches = itertools.chain.from_iterable(self._reader.read(c) for c in chunks)
        converter, collate_fn = self._converter, self._collate_fn
        if not slot.in_worker:
            for batch in rebatch(batches, self._batch_size, self._drop_last):
                out = converter(batch)
                yield out if collate_fn is None else collate_fn(out)
            return
        # In a worker: one buffer per batch (see convert.pack); without a collate_fn,
        # string columns travel as Arrow buffers and become lists in the main process.
        # Under a loader that flattens groups (runtime.loader), small batches travel
        # several to a transfer: the per-transfer cost of the DataLoader dominates them.
        group = self._group_transfer
        pending: list[Any] = []
        pending_bytes = 0
        try:
            for batch in rebatch(batches, self._batch_size, self._drop_last):
                if collate_fn is None:
                    out = converter.convert_for_transfer(batch)
                else:
                    out = collate_fn(converter(batch))
                if not group:
                    yield pack(out)
                    continue
                pending.append(out)
                pending_bytes += batch.nbytes
                if pending_bytes >= GROUP_BYTES or len(pending) >= GROUP_MAX_BATCHES:
                    yield pack_group(pending)
                    pending, pending_bytes = [], 0
        except Exception:
            if pending:  # the batches before an error still arrive, as without groups
                yield pack_group(pending)
            raise
        if pending:
            yield pack_group(pending)


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
    ) -> None:
        fmt = coerce_format(format)
        out_fmt = coerce_enum(output_format, OutputFormat, "output_format")
        check_int(batch_size, "batch_size", 1, hint=" (rows per batch)")
        check_int(shuffle_seed, "shuffle_seed", 0)
        check_int(num_workers, "num_workers", 0)
        if collate_fn is not None and not callable(collate_fn):
            raise ConfigError(f"collate_fn={collate_fn!r} must be callable")
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ConfigError(f"storage_options={storage_options!r} must be a dict of filesystem options")
        world = env.resolve_world(num_ranks, rank)
        strategy = build_strategy(split_strategy, fmt, split_bytes, split_rows)
        found = discover(
            path,
            format=fmt,
            columns=columns,
            filters=filters,
            partitioning=partitioning,
            storage_options=storage_options,
        )
        self.discovered: Discovered = found
        """What discovery found: files, schema, columns."""
        reader = make_reader(found, batch_size)
        super().__init__(
            files=found.files,
            strategy=strategy,
            reader=reader,
            converter=BatchConverter(found.output_schema, out_fmt, null_fill),
            world=world,
            num_workers=num_workers,
            batch_size=batch_size,
            drop_last=bool(drop_last),
            shuffle=bool(shuffle),
            shuffle_seed=shuffle_seed,
            collate_fn=collate_fn,
        )

    @classmethod
    def create_dataloader(cls, path: str | Sequence[str], **kwargs: Any) -> tuple[Any, StructuredDataset]:
        """Build the dataset and its DataLoader; see :func:`create_dataloader`."""
        from torch_dataloader_utils.runtime.loader import create_dataloader

        return create_dataloader(path, **kwargs)
