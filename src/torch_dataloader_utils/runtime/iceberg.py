"""``IcebergDataset``: an Apache Iceberg table, sharded with the same promises as files.

The scan is planned from the table's manifests (:mod:`torch_dataloader_utils.discovery.iceberg`),
with every delete (position and equality) resolved to deleted row positions, so row
counts are exact (a row filter too, when ``count_rows`` counts it: the rows it drops
join the deleted positions); data files are cut into row-group chunks by the usual planner, and
each chunk is read with its own deleted positions and the row filter
(:mod:`torch_dataloader_utils.io.iceberg`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch_dataloader_utils.config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EQUAL_BATCHES,
    DEFAULT_SHUFFLE_SEED,
    EqualBatches,
    FileFormat,
    OutputFormat,
    check_int,
)
from torch_dataloader_utils.convert import BatchConverter
from torch_dataloader_utils.discovery.iceberg import IcebergScan, discover_iceberg, load_table
from torch_dataloader_utils.io.iceberg import IcebergReader
from torch_dataloader_utils.runtime.dataset import PlannedDataset, batch_schema, build_strategy, check_common

__all__ = ["IcebergDataset"]


class IcebergDataset(PlannedDataset):
    """An Iceberg table read exactly once per epoch across ranks and workers.

    Prefer :meth:`create_dataloader`, which also builds the DataLoader.

    Args:
        table: ``"namespace.table"`` or ``"catalog.namespace.table"``.
        catalog_config: Properties for ``pyiceberg.catalog.load_catalog`` (``type``,
            ``uri``, ``warehouse``, ``s3.endpoint``, ``s3.access-key-id``, ...). They also
            configure the storage every worker reads from.
        snapshot_id: Read this snapshot (time travel).
        as_of: Read the snapshot current at this time: an aware ``datetime`` or
            milliseconds since the epoch.
        columns: Columns to return, in order (``None``: all, in schema order).
        filters: A ``pyarrow.compute.Expression``, translated to pyiceberg for file
            pruning where that is exact, and always applied to rows.
        scan_filter: A pyiceberg ``BooleanExpression`` used for pruning only (rows
            are not filtered by it beyond the files it prunes).
        batch_size, drop_last, shuffle, shuffle_seed, split_strategy, split_bytes,
            split_rows, output_format, null_fill, collate_fn, num_ranks, rank,
            num_workers, equal_batches: As for :class:`StructuredDataset`. Equal
            batches work with deletes of every kind (row counts are exact) and with
            ``filters`` (see ``count_rows``).
        count_rows: Make row counts exact under ``filters``: when the dataset is built,
            read the filter's columns of every data file once and add the rows it drops
            to the file's deleted positions (8 bytes of memory per dropped row).
            ``None`` (default) counts when equal batches need it (more than one rank
            and ``equal_batches`` not ``'off'``); ``False`` never counts, which makes
            ``filters`` with equal batches on several ranks an error.
        **planner_options: Further options of the source-agnostic core
            (:class:`PlannedDataset`), forwarded unchanged.
    """

    def __init__(
        self,
        table: str,
        *,
        catalog_config: Mapping[str, Any] | None = None,
        snapshot_id: int | None = None,
        as_of: Any = None,
        columns: Sequence[str] | None = None,
        filters: Any = None,
        scan_filter: Any = None,
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
        num_ranks: int | None = None,
        rank: int | None = None,
        num_workers: int = 0,
        equal_batches: str | EqualBatches = DEFAULT_EQUAL_BATCHES,
        count_rows: bool | None = None,
        **planner_options: Any,
    ) -> None:
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
        )
        strategy = build_strategy(split_strategy, FileFormat.PARQUET, split_bytes, split_rows)
        tbl = load_table(table, catalog_config)
        scan = discover_iceberg(
            tbl,
            snapshot_id=snapshot_id,
            as_of=as_of,
            columns=columns,
            filters=filters,
            scan_filter=scan_filter,
            count_filtered=common.counting,
        )
        self.scan: IcebergScan = scan
        """What discovery planned: data files, deletes, schema."""
        self.table_name = table
        issue = None
        if scan.filters is not None and not scan.filter_counted:
            how = "count_rows=None or True" if count_rows is False else "count_rows=True"
            issue = (
                f"filters={scan.filters} drops rows inside row groups and count_rows={count_rows!r} "
                f"did not count them ({how} counts them when the dataset is built)"
            )
        super().__init__(
            files=scan.files,
            strategy=strategy,
            reader=IcebergReader(scan, batch_size),
            converter=BatchConverter(
                batch_schema(scan.output_schema, common.equal), common.output, null_fill
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
            **planner_options,
        )

    @property
    def snapshot_id(self) -> int | None:
        """The snapshot read (``None`` for a table without snapshots: zero rows)."""
        return self.scan.snapshot_id

    @property
    def exact_row_counts(self) -> bool:
        """Whether planned row counts are exact: ``False`` only with uncounted ``filters``.

        Position and equality deletes are resolved to row positions when the dataset is
        built, so they are counted exactly per row range; so are the rows a row filter
        drops when it is counted (``count_rows``), else its effect is known only once
        the rows are read.
        """
        return self.scan.filters is None or self.scan.filter_counted

    @classmethod
    def create_dataloader(
        cls,
        table: str,
        *,
        num_workers: int | None = None,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        timeout: float = 0,
        multiprocessing_context: Any = None,
        **kwargs: Any,
    ) -> tuple[Any, IcebergDataset]:
        """Build the dataset and a DataLoader that reads it.

        Takes every argument of :class:`IcebergDataset` plus the DataLoader options of
        :func:`torch_dataloader_utils.create_dataloader` (``num_workers=None`` picks
        the worker count automatically).

        Returns:
            ``(loader, dataset)``. Call ``dataset.set_epoch(epoch)`` before each epoch.
        """
        from torch_dataloader_utils.runtime.loader import loader_for

        check_int(num_workers, "num_workers", 0, optional=True, hint=" (or None for automatic)")
        dataset = cls(table, num_workers=num_workers or 0, **kwargs)
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
