"""``create_dataloader``: the flat keyword API that builds configs, dataset and DataLoader."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import DataLoader

from torch_dataloader_utils.config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_READ_AHEAD_BYTES,
    DEFAULT_RETRIES,
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_SHUFFLE_SEED,
    LoaderConfig,
    check_int,
)
from torch_dataloader_utils.convert import BatchGroup
from torch_dataloader_utils.runtime import env
from torch_dataloader_utils.runtime.dataset import PlannedDataset, StructuredDataset
from torch_dataloader_utils.runtime.resume import Tagged

__all__ = ["MAX_AUTO_WORKERS", "ResumableDataLoader", "create_dataloader", "loader_for", "make_loader"]

MAX_AUTO_WORKERS = 8
"""Upper bound of ``num_workers=None`` (auto)."""


def _passthrough(batch: Any) -> Any:
    """DataLoader ``collate_fn``: batches are already built by the dataset."""
    return batch


def auto_workers(dataset: PlannedDataset) -> int:
    """Workers for ``num_workers=None``: CPUs per rank, at most one per chunk, at most 8.

    One worker would only add a process hop, so 1 becomes 0 (read in the main process).
    """
    chunks = len(dataset.plan(0, num_workers=1).rank_chunks(dataset.world.rank))
    workers = min(env.cpus_per_rank(), chunks, MAX_AUTO_WORKERS)
    return 0 if workers <= 1 else workers


# >>> resume (issue 7)
class ResumableDataLoader(DataLoader[Any]):
    """The DataLoader of ``create_dataloader``: it knows what the loop consumed.

    Workers tag each batch with its position in their plan; this loader strips the tag
    when it hands the batch to the loop, and records it. ``state_dict()`` therefore
    describes exactly the batches yielded before it was called (prefetched batches are
    not consumed), and ``load_state_dict()`` resumes after them, for any number of
    workers or ranks. It follows the ``state_dict`` / ``load_state_dict`` protocol of
    torchdata's ``StatefulDataLoader``, so trainers that checkpoint such loaders
    (Lightning, Accelerate) save it with the model.
    """

    dataset: PlannedDataset

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        dataset = self.dataset
        # len() may differ between a resumed pass and a full one; drop torch's cached value.
        self._IterableDataset_len_called = None
        dataset._begin_progress(self.num_workers)
        dataset._loader_active = True  # set before workers start: they pickle the dataset
        try:
            for item in super().__iter__():
                if isinstance(item, Tagged) and isinstance(item.batch, BatchGroup):
                    # Several batches of one worker that travelled together.
                    for batch, tag in zip(item.batch, item.tag, strict=True):
                        yield dataset._consume(Tagged(batch, tag))  # type: ignore[arg-type]
                else:
                    yield dataset._consume(item)
            dataset._finish_progress()
        finally:
            dataset._loader_active = False

    def state_dict(self) -> dict[str, Any]:
        """This rank's resume state; see :meth:`PlannedDataset.state_dict`."""
        return self.dataset.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a (merged) state; see :meth:`PlannedDataset.load_state_dict`."""
        self.dataset.load_state_dict(state)


# <<< resume


def make_loader(dataset: PlannedDataset, loader: LoaderConfig) -> ResumableDataLoader:
    """The DataLoader over ``dataset`` (which yields whole batches)."""
    kwargs: dict[str, Any] = {}
    if loader.prefetch_factor is not None:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if loader.multiprocessing_context is not None:
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
    return ResumableDataLoader(
        dataset,
        batch_size=None,
        num_workers=loader.num_workers,
        collate_fn=_passthrough,
        pin_memory=loader.pin_memory,
        persistent_workers=loader.persistent_workers,
        timeout=loader.timeout,
        **kwargs,
    )


def create_dataloader(
    path: str | Sequence[str],
    *,
    format: str = "parquet",
    num_workers: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    columns: Sequence[str] | None = None,
    filters: Any = None,
    shuffle: bool = False,
    shuffle_seed: int = DEFAULT_SHUFFLE_SEED,
    split_bytes: int | str | None = None,
    split_rows: int | None = None,
    split_strategy: object = None,
    output_format: str = "torch",
    null_fill: Any = None,
    storage_options: Mapping[str, Any] | None = None,
    partitioning: str | None = None,
    num_ranks: int | None = None,
    rank: int | None = None,
    collate_fn: Callable[[Any], Any] | None = None,
    drop_last: bool = False,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    timeout: float = 0,
    multiprocessing_context: Any = None,
    equal_batches: str = "drop",
    schema: Any = None,
    quoted_newlines: bool = False,
    count_rows: bool | None = None,
    count_cache_dir: str | os.PathLike[str] | None = None,
    read_ahead_bytes: int | str | None = DEFAULT_READ_AHEAD_BYTES,
    retries: int = DEFAULT_RETRIES,
    retry_backoff: float = DEFAULT_RETRY_BACKOFF,
    row_shuffle_window: int | None = None,
) -> tuple[DataLoader[Any], StructuredDataset]:
    """Build a :class:`StructuredDataset` and a DataLoader that reads it.

    Args:
        path: A file, a directory (recursive), a glob, or a list of them; local paths
            or URLs of any fsspec filesystem (``s3://``, ``gs://``, ``memory://``...).
        format: ``"parquet"``, ``"orc"``, ``"csv"`` or ``"jsonl"`` (see docs/formats.md).
        num_workers: DataLoader worker processes; ``None`` picks CPUs per rank, capped
            by this rank's chunk count and 8 (0 means read in the main process).
        batch_size: Rows per batch. Every batch has exactly this many rows except the
            last of each worker.
        columns: Columns to return, in order; ``None`` returns all.
        filters: A ``pyarrow.compute.Expression``; row groups whose statistics (or
            partition values) exclude it are never read; rows are filtered exactly.
        shuffle: Shuffle chunk order every epoch (by ``(shuffle_seed, epoch)``).
        shuffle_seed: Seed of the shuffle (an int >= 0), the same on every rank.
        split_bytes: Target chunk size on disk, an int or a string such as
            ``"128MiB"`` (default 64 MiB for ``row_group``).
        split_rows: Target rows per chunk.
        split_strategy: ``"row_group"`` (Parquet / ORC default), ``"byte_range"``
            (CSV / JSONL default), ``"file"``, or an object
            with ``generate(...)`` (see :mod:`torch_dataloader_utils.plan.splits`).
        output_format: ``"torch"`` (default), ``"numpy"``, ``"arrow"`` or ``"dict"``.
        null_fill: Value (or mapping column -> value) replacing nulls in columns
            whose output type has no null; by default a null there is an error.
        storage_options: Filesystem options (credentials, endpoint), used for listing,
            footers and reading alike.
        partitioning: ``"hive"`` reads ``key=value`` directories as typed columns.
        num_ranks: Number of ranks (world size); default from ``torch.distributed``
            or ``WORLD_SIZE``.
        rank: Global rank of this process; default from ``torch.distributed`` or ``RANK``.
        collate_fn: Applied to each converted batch inside the worker.
        drop_last: Drop each worker's last, short batch.
        pin_memory: DataLoader passthrough.
        persistent_workers: DataLoader passthrough; ``set_epoch`` still reaches them.
        prefetch_factor: DataLoader passthrough (needs ``num_workers >= 1``).
        timeout: DataLoader passthrough.
        multiprocessing_context: DataLoader passthrough (``"fork"``, ``"spawn"``...).
        equal_batches: ``"drop"`` (default), ``"pad"`` or ``"off"``: with more than one
            rank, ``"drop"`` and ``"pad"`` give every rank exactly the same number of
            batches every epoch (any ``num_workers``), so a DDP loop cannot hang on
            uneven data. ``"drop"`` leaves out fewer than ``num_ranks`` rows per epoch
            (different ones each epoch with ``shuffle``); ``"pad"`` repeats fewer than
            ``num_ranks`` rows and adds a bool column ``_is_padding`` to mask them;
            ``"off"`` reads chunks whole, with uneven batch counts. Needs exact row
            counts, so with a row filter on more than one rank pass ``"off"``. See
            ``docs/distributed.md``.
        schema: CSV / JSONL: a ``pyarrow.Schema`` giving column types for every file;
            by default types are inferred once per file from its head and unified.
        quoted_newlines: CSV: quoted fields may hold newlines. Such files are read
            whole (one chunk each). Without it, a record found spanning lines raises
            :class:`RecordBoundaryError` rather than being split or duplicated.
        count_rows: Count rows exactly at startup so every chunk carries its exact row
            count (needed by ``equal_batches`` on several ranks, and by ``len()``).
            CSV / JSONL: a fast newline pass (no parsing), cached per (path, size,
            mtime). Parquet with ``filters`` on data columns: one read of only the
            filter's columns, counting the rows that pass. ``None`` (default) counts
            when equal batches need it (more than one rank and ``equal_batches`` on);
            ``False`` never counts (then such a setup is a clear error).
        count_cache_dir: Also keep text counts in this directory across processes and
            runs (implies counting).
        read_ahead_bytes: Remote storage only: memory bound of the bytes of upcoming
            chunks fetched while one is decoded (an int or ``"256MiB"``; default
            256 MiB per worker; ``0`` disables read-ahead).
        retries: Remote storage only: retries of a request that failed with a transient
            error (HTTP 5xx, connection reset, timeout); ``0`` disables them.
        retry_backoff: Seconds before the first retry, doubled after each (max 10 s).
        row_shuffle_window: With ``shuffle=True``, also mix rows across chunks: each
            worker reads runs of consecutive chunks of up to this many rows together
            and yields their rows in a permutation seeded by ``(shuffle_seed, epoch,
            ...)``. Memory holds at most ``max(row_shuffle_window, largest chunk)``
            rows per worker. ``None`` (default) keeps file order inside chunks.

    Returns:
        ``(loader, dataset)``. Call ``dataset.set_epoch(epoch)`` before each epoch.
        ``len(loader)`` is this rank's batch count where row counts are known.
        ``loader.state_dict()`` / ``load_state_dict()`` save and resume mid-epoch
        (``docs/resume.md``).
    """
    check_int(num_workers, "num_workers", 0, optional=True, hint=" (or None for automatic)")
    dataset = StructuredDataset(
        path,
        format=format,
        columns=columns,
        filters=filters,
        batch_size=batch_size,
        drop_last=drop_last,
        shuffle=shuffle,
        shuffle_seed=shuffle_seed,
        split_strategy=split_strategy,
        split_bytes=split_bytes,
        split_rows=split_rows,
        output_format=output_format,
        null_fill=null_fill,
        collate_fn=collate_fn,
        storage_options=storage_options,
        partitioning=partitioning,
        num_ranks=num_ranks,
        rank=rank,
        num_workers=num_workers or 0,
        equal_batches=equal_batches,
        schema=schema,
        quoted_newlines=quoted_newlines,
        count_rows=count_rows,
        count_cache_dir=count_cache_dir,
        read_ahead_bytes=read_ahead_bytes,
        retries=retries,
        retry_backoff=retry_backoff,
        row_shuffle_window=row_shuffle_window,
    )
    loader = loader_for(
        dataset,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers,
        prefetch_factor=prefetch_factor,
        timeout=timeout,
        multiprocessing_context=multiprocessing_context,
    )
    return loader, dataset


def loader_for(
    dataset: PlannedDataset,
    *,
    num_workers: int | None,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    timeout: float = 0,
    multiprocessing_context: Any = None,
) -> ResumableDataLoader:
    """The loader of a built dataset from the DataLoader options (``num_workers=None``: auto)."""
    if num_workers is None:
        num_workers = auto_workers(dataset)
        dataset._num_workers = num_workers
    config = LoaderConfig(
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers,
        prefetch_factor=prefetch_factor,
        timeout=timeout,
        multiprocessing_context=multiprocessing_context,
    )
    return make_loader(dataset, config)
