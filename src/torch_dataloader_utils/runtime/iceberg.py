"""``IcebergDataset``: an Apache Iceberg table, sharded with the same promises as files.

The scan is planned from the table's manifests (:mod:`torch_dataloader_utils.discovery.iceberg`),
with every delete (position and equality) resolved to deleted row positions, so row
counts are exact (a row filter too, when ``count_rows`` counts it: the rows it drops
join the deleted positions); data files are cut into row-group chunks by the usual planner, and
each chunk is read with its own deleted positions and the row filter
(:mod:`torch_dataloader_utils.io.iceberg`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

from torch_dataloader_utils.config import FileFormat, IcebergSourceConfig
from torch_dataloader_utils.discovery.iceberg import IcebergScan, discover_iceberg, load_table
from torch_dataloader_utils.discovery.iceberg_delta import discover_incremental
from torch_dataloader_utils.errors import ConfigError, StateMismatchError
from torch_dataloader_utils.io.iceberg import IcebergReader
from torch_dataloader_utils.plan.state import plain_state
from torch_dataloader_utils.runtime.dataset import PlannedDataset
from torch_dataloader_utils.runtime.iceberg_continue import Continued, continue_scan, state_snapshot
from torch_dataloader_utils.runtime.ledger import recorded_source
from torch_dataloader_utils.runtime.loader import ResumableDataLoader, make_loader
from torch_dataloader_utils.runtime.options import (
    IcebergLoaderOptions,
    IcebergReadOptions,
    Options,
    build_options,
    iceberg_source,
)
from torch_dataloader_utils.runtime.report import log_files
from torch_dataloader_utils.storage.expressions import filter_identity

__all__ = ["IcebergDataset"]


class IcebergDataset(PlannedDataset):
    """An Iceberg table read exactly once per epoch across ranks and workers.

    Prefer :meth:`create_dataloader`, which also builds the DataLoader. Equal batches
    work with deletes of every kind (row counts are exact) and with ``filters``: with
    ``count_rows`` (by default when equal batches need it) the filter's columns of
    every data file are read once when the dataset is built, and the rows it drops join
    the file's deleted positions (8 bytes of memory per dropped row).

    Args:
        table: ``"namespace.table"`` or ``"catalog.namespace.table"``.
        **options: The options of :class:`~torch_dataloader_utils.runtime.options.IcebergReadOptions`
            (``catalog_config``, ``snapshot_id``, ``as_of``, ``scan_filter`` and the
            options every dataset takes).

    Raises:
        UnknownOptionError: a keyword is not an option (names the closest one).
        ConfigError: an option has an invalid value.
    """

    def __init__(self, table: str, **options: Unpack[IcebergReadOptions]) -> None:
        given: dict[str, Any] = dict(options)
        source = iceberg_source(table, given)
        self._setup(
            source,
            build_options(given, IcebergReadOptions, "IcebergDataset", FileFormat.PARQUET, standalone=True),
        )

    @classmethod
    def from_config(
        cls, source: IcebergSourceConfig, options: Options, *, member: bool = False
    ) -> IcebergDataset:
        """Build from config objects (the flat keywords, already checked).

        ``member``: a source of a mix, discovered only (the mix plans and reads it).
        """
        dataset = cls.__new__(cls)
        dataset._member = member
        dataset._setup(source, options)
        return dataset

    def _setup(self, source: IcebergSourceConfig, options: Options) -> None:
        tbl = load_table(source.table, source.catalog_config)
        self.continued: Continued | None = None
        """With ``continue_from``: the epoch continued, the rows it had left, deleted since and new."""
        if source.continue_from is not None:
            scan, self.continued = continue_scan(type(self).from_config, tbl, source, options)
        elif source.since_snapshot_id is not None:
            scan = discover_incremental(tbl, source, count_filtered=options.counts_rows)
        else:
            scan = discover_iceberg(tbl, source, count_filtered=options.counts_rows)
        self.scan: IcebergScan = scan
        """What discovery planned: data files, deletes, schema (and, incremental, ``scan.delta``)."""
        self.recorded_source = recorded_source(None, source, scan.snapshot_id)
        """The source as a training ledger records it (the snapshot read; secrets left out)."""
        deletes = scan.delete_files_read
        since = f" since snapshot {source.since_snapshot_id}" if source.since_snapshot_id is not None else ""
        log_files(
            scan.files,
            f"Iceberg table {source.table!r} snapshot {scan.snapshot_id}{since}: "
            f"{len(scan.files):,} data files" + (f" ({deletes:,} delete files applied)" if deletes else ""),
            scan.output_schema,
            rank=options.world.rank,
        )
        self.table_name = source.table
        issue = None
        if scan.filters is not None and not scan.filter_counted:
            count_rows = options.counting.count_rows
            how = "count_rows=None or True" if count_rows is False else "count_rows=True"
            issue = (
                f"filters={scan.filters} drops rows inside row groups and count_rows={count_rows!r} "
                f"did not count them ({how} counts them when the dataset is built)"
            )
        self._init_core(
            files=scan.files,
            reader=IcebergReader(
                scan,
                options.batching.batch_size,
                cache=options.cache,
                fetch=options.fetch,
                bad_data=options.bad_data,
            ),
            output_schema=scan.output_schema,
            options=options,
            row_count_issue=issue,
            identity={
                "table": source.table,
                "snapshot_id": scan.snapshot_id,
                # Only when set: states of full scans saved before it existed stay valid.
                **(
                    {}
                    if source.since_snapshot_id is None
                    else {"since_snapshot_id": source.since_snapshot_id}
                ),
                **({} if self.continued is None else {"continued_from": self.continued.identity()}),
                "columns": list(scan.output_schema.names),
                **filter_identity(scan.filters),
            },
            name=f"Iceberg table {source.table!r}",
        )

        if self.continued is not None:
            PlannedDataset.set_epoch(self, self.continued.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read next (see :meth:`PlannedDataset.set_epoch`).

        Raises:
            ConfigError: a dataset built with ``continue_from`` reads the rest of the
                state's epoch only; another epoch is a dataset of the snapshot itself.
        """
        continued = self.continued
        if continued is not None and epoch != continued.epoch:
            raise ConfigError(
                f"set_epoch({epoch}) on a dataset that continues epoch {continued.epoch} onto snapshot "
                f"{continued.snapshot_id} (continue_from): it reads the rest of that epoch only. For epoch "
                f"{epoch}, build a dataset of the snapshot without continue_from "
                f"(snapshot_id={continued.snapshot_id})"
            )
        super().set_epoch(epoch)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state (see :meth:`PlannedDataset.load_state_dict`).

        Raises:
            StateMismatchError: saved for other files or options; for a state of another
                snapshot of the table, the message names ``continue_from``, which continues it.
        """
        try:
            super().load_state_dict(state)
        except StateMismatchError as exc:
            saved = plain_state(state) if isinstance(state, Mapping) else {}
            table, snapshot, _ = state_snapshot(saved)
            if table != self.table_name or snapshot in (None, self.snapshot_id):
                raise
            raise StateMismatchError(
                f"{exc}. The state was saved on snapshot {snapshot} of {table!r} and this dataset reads "
                f"snapshot {self.snapshot_id}: to go on with the epoch it interrupted over the newer "
                "snapshot (its unread rows less those deleted since, and the rows added since), build "
                "the dataset with continue_from=state"
            ) from exc

    @property
    def snapshot_id(self) -> int | None:
        """The snapshot read (``None`` for a table without snapshots: zero rows)."""
        return self.scan.snapshot_id

    @property
    def since_snapshot_id(self) -> int | None:
        """An incremental dataset's older snapshot (its rows are not read), else ``None``."""
        return None if self.scan.delta is None else self.scan.delta.since_snapshot_id

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
        cls, table: str, **options: Unpack[IcebergLoaderOptions]
    ) -> tuple[ResumableDataLoader[IcebergDataset], IcebergDataset]:
        """Build the dataset and a DataLoader that reads it.

        Takes every option of :class:`IcebergDataset` plus the DataLoader options of
        :func:`torch_dataloader_utils.create_dataloader` (``num_workers=None`` picks
        the worker count automatically): the keywords of
        :class:`~torch_dataloader_utils.runtime.options.IcebergLoaderOptions`.

        Returns:
            ``(loader, dataset)``. Call ``dataset.set_epoch(epoch)`` before each epoch.
        """
        given: dict[str, Any] = dict(options)
        source = iceberg_source(table, given)
        built = build_options(
            given, IcebergLoaderOptions, "IcebergDataset.create_dataloader", FileFormat.PARQUET
        )
        dataset = cls.from_config(source, built)
        return make_loader(dataset, built.loader), dataset
