"""``create_dataloader``: the flat keyword API that builds configs, dataset and DataLoader."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import DataLoader

from torch_dataloader_utils.config import DEFAULT_BATCH_SIZE, DEFAULT_SHUFFLE_SEED, LoaderConfig, check_int
from torch_dataloader_utils.convert import BatchGroup
from torch_dataloader_utils.runtime import env
from torch_dataloader_utils.runtime.dataset import PlannedDataset, StructuredDataset

__all__ = ["MAX_AUTO_WORKERS", "StructuredDataLoader", "create_dataloader", "make_loader"]

MAX_AUTO_WORKERS = 8
"""Upper bound of ``num_workers=None`` (auto)."""


def _passthrough(batch: Any) -> Any:
    """DataLoader ``collate_fn``: batches are already built by the dataset."""
    return batch


class StructuredDataLoader(DataLoader[Any]):
    """A ``DataLoader`` whose workers may send several small batches per transfer.

    Each transfer between a worker and the main process has a fixed cost (queues,
    pickling, waking processes) that dominates small batches; the workers of this
    loader send batches in groups of about ``GROUP_BYTES`` and the loader yields them one
    by one, in the order each worker produced them. The dataset (or a plain
    ``DataLoader`` over it) never sees a group: they are enabled only while this loader
    starts its workers.
    """

    def __iter__(self) -> Any:
        dataset = self.dataset
        if self.num_workers == 0 or not isinstance(dataset, PlannedDataset):
            return super().__iter__()
        dataset._group_transfer = True
        try:
            it = super().__iter__()  # starts (or reuses) the workers with groups enabled
        finally:
            dataset._group_transfer = False
        return _FlatIterator(it)


class _FlatIterator:
    """Yields the batches of groups one by one; other attributes are the DataLoader iterator's."""

    def __init__(self, inner: Iterator[Any]) -> None:
        self._inner = inner
        self._group: Iterator[Any] = iter(())

    def __iter__(self) -> _FlatIterator:
        return self

    def __next__(self) -> Any:
        for item in self._group:
            return item
        item = next(self._inner)
        if type(item) is BatchGroup:
            self._group = iter(item)
            return next(self._group)  # groups are never empty
        return item

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set yet (copy / unpickle): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)


def auto_workers(dataset: PlannedDataset) -> int:
    """Workers for ``num_workers=None``: CPUs per rank, at most one per chunk, at most 8.

    One worker would only add a process hop, so 1 becomes 0 (read in the main process).
    """
    chunks = len(dataset.plan(0, num_workers=1).rank_chunks(dataset.world.rank))
    workers = min(env.cpus_per_rank(), chunks, MAX_AUTO_WORKERS)
    return 0 if workers <= 1 else workers


def make_loader(dataset: PlannedDataset, loader: LoaderConfig) -> DataLoader[Any]:
    """The DataLoader over ``dataset`` (which yields whole batches)."""
    kwargs: dict[str, Any] = {}
    if loader.prefetch_factor is not None:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if loader.multiprocessing_context is not None:
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
    return StructuredDataLoader(
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
) -> tuple[DataLoader[Any], StructuredDataset]:
    """Build a :class:`StructuredDataset` and a DataLoader that reads it.

    Args:
        path: A file, a directory (recursive), a glob, or a list of them; local paths
            or URLs of any fsspec filesystem (``s3://``, ``gs://``, ``memory://``...).
        format: ``"parquet"`` (more formats: see the docs).
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
        split_strategy: ``"row_group"`` (Parquet default), ``"file"``, or an object
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

    Returns:
        ``(loader, dataset)``. Call ``dataset.set_epoch(epoch)`` before each epoch.
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
    )
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
    return make_loader(dataset, config), dataset
