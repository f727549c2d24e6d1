"""``StructuredDataset`` and ``create_dataloader``: files (Parquet, ORC, CSV, JSONL) + the core."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Unpack

import pyarrow as pa

from torch_dataloader_utils.compat.files import DataFileInfo, file_paths
from torch_dataloader_utils.config import FileFormat, FileSourceConfig
from torch_dataloader_utils.discovery import Discovered, discover
from torch_dataloader_utils.discovery.columns import filter_fields
from torch_dataloader_utils.discovery.counts import count_filtered_rows
from torch_dataloader_utils.discovery.text import COUNT_BLOCK_BYTES, TextOptions
from torch_dataloader_utils.errors import ConfigError, IncompatibleOptionsError
from torch_dataloader_utils.plan.splits import ByteRangeSplit
from torch_dataloader_utils.runtime import share
from torch_dataloader_utils.runtime.dataset import PlannedDataset
from torch_dataloader_utils.runtime.ledger import recorded_source
from torch_dataloader_utils.runtime.loader import ResumableDataLoader, make_loader
from torch_dataloader_utils.runtime.options import (
    FileLoaderOptions,
    FileReadOptions,
    Options,
    build_options,
    file_source,
)
from torch_dataloader_utils.runtime.readers import make_reader
from torch_dataloader_utils.runtime.report import log_data_path, log_files
from torch_dataloader_utils.storage.expressions import filter_identity
from torch_dataloader_utils.storage.requests import process_requests

__all__ = ["StructuredDataset", "create_dataloader"]


def text_options(source: FileSourceConfig, options: Options) -> TextOptions | None:
    """The text-format options; ``None`` for formats that are not text.

    Raises:
        ConfigError: ``schema`` is not a ``pyarrow.Schema``.
        IncompatibleOptionsError: an option does not apply to the format.
    """
    format, schema = source.format, source.schema
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
    if source.quoted_newlines and format is not FileFormat.CSV:
        raise IncompatibleOptionsError(
            f"quoted_newlines=True applies to format='csv' only (got format={format.value!r}); drop it"
        )
    if source.metadata_cache is not None and format is not FileFormat.PARQUET:
        instead = " (record counts of CSV / JSONL are kept across runs by count_cache_dir)" if is_text else ""
        raise IncompatibleOptionsError(
            f"metadata_cache={source.metadata_cache!r} keeps Parquet footers and applies to "
            f"format='parquet' only (got format={format.value!r}, whose metadata it would not keep); "
            f"drop it{instead}"
        )
    if not is_text:
        return None
    block = COUNT_BLOCK_BYTES
    if isinstance(options.strategy, ByteRangeSplit):
        block = min(block, options.strategy.split_bytes)
    return TextOptions(
        schema=schema,
        quoted_newlines=source.quoted_newlines,
        count_rows=options.counts_rows,
        count_cache_dir=options.counting.count_cache_dir,
        count_block_bytes=block,
    )


def count_filtered(
    found: Discovered, counting: bool, count_rows: bool | None = None
) -> tuple[Discovered, str | None]:
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
            f"filters={found.filters} drops rows inside row groups and count_rows={count_rows!r} "
            "did not count them (count_rows=True counts them at startup)"
        )
    files = share.from_rank0(
        lambda: count_filtered_rows(
            found.fs,
            found.files,
            expr,
            filter_columns=data_fields,
            partitions=found.partitions,
            partition_columns=[f for f in fields if f in part_names],
            footers=found.footers,
        )
    )
    # The counted files differ from the columns discovery kept: those are dropped.
    return (
        dataclasses.replace(found, files=files, metadata=None, table=None, filtered_positions=True),
        None,
    )


def source_paths(path: object, files: object) -> str | list[str]:
    """The paths to read: ``path``, or the paths of 0.2.0's ``files=[DataFileInfo(...)]``.

    Raises:
        ConfigError: neither or both are given, or an item is not a path.
    """
    if files is not None:
        if path is not None:
            raise IncompatibleOptionsError(
                f"pass path= or files=, not both (got path={path!r} and files=); drop one"
            )
        return file_paths(files)  # type: ignore[arg-type]
    if path is None:
        raise ConfigError(
            "StructuredDataset needs path= (a file, directory or glob) or files=[DataFileInfo(...)]"
        )
    if isinstance(path, (list, tuple)) and any(not isinstance(p, str) for p in path):
        return file_paths(path)
    return path  # type: ignore[return-value]


def _first(path: str | Sequence[str]) -> str:
    if isinstance(path, str):
        return path
    return f"{path[0]} (+{len(path) - 1} more)" if len(path) > 1 else str(path[0]) if path else ""


def _partition_names(found: Discovered) -> list[str]:
    """Hive partition keys with their number of distinct values."""
    if found.partitions is None:
        return []
    values = list(found.partitions.values.values())
    return [
        f"{name} ({len({v[i] for v in values})} values)"
        for i, name in enumerate(found.partitions.schema.names)
    ]


class StructuredDataset(PlannedDataset):
    """Parquet, ORC, CSV and JSONL files on any fsspec filesystem, sharded by plan.

    Prefer :meth:`create_dataloader`, which also builds the DataLoader. Every row is
    read exactly once per epoch across all ranks and workers.

    Args:
        path: A file, a directory (recursive), a glob, or a list of them; local paths
            or URLs of any fsspec filesystem (``s3://``, ``gs://``, ``memory://``...).
        format: ``"parquet"`` (default), ``"orc"``, ``"csv"`` or ``"jsonl"``.
        files: Instead of ``path``, the files as 0.2.0's ``DataFileInfo`` objects (only
            their ``path`` is used; sizes and row counts come from the files' metadata).
        **options: The options of :class:`~torch_dataloader_utils.runtime.options.FileReadOptions`.

    Raises:
        UnknownOptionError: a keyword is not an option (names the closest one).
        ConfigError: an option has an invalid value.
    """

    def __init__(
        self,
        path: str | Sequence[str] | Sequence[DataFileInfo] | None = None,
        format: str | FileFormat = "parquet",
        *,
        files: Sequence[DataFileInfo] | None = None,
        **options: Unpack[FileReadOptions],
    ) -> None:
        given: dict[str, Any] = dict(options)
        source = file_source(format, given)
        self._setup(
            source_paths(path, files),
            source,
            build_options(given, FileReadOptions, "StructuredDataset", source.format, standalone=True),
        )

    @classmethod
    def from_config(
        cls, path: str | Sequence[str], source: FileSourceConfig, options: Options, *, member: bool = False
    ) -> StructuredDataset:
        """Build from config objects (the flat keywords, already checked).

        ``member``: a source of a mix, discovered only (the mix plans and reads it).
        """
        dataset = cls.__new__(cls)
        dataset._member = member
        dataset._setup(path, source, options)
        return dataset

    def _setup(self, path: str | Sequence[str], source: FileSourceConfig, options: Options) -> None:
        text = text_options(source, options)
        before = process_requests()
        found = discover(path, source, text=text, fetch=options.fetch, share=share.exchange())
        found, issue = count_filtered(found, options.counts_rows, options.counting.count_rows)
        discovery_requests = process_requests() - before
        where = found.fs.display(_first(path))
        log_data_path(found.fs.data_path_description, not found.fs.is_local, options.world.rank)
        self._log_found(found, source, where, options)
        self.discovered: Discovered = found
        """What discovery found: files, schema, columns."""
        self.recorded_source = recorded_source(path, source)
        """The source as a training ledger records it (secrets left out)."""
        self._init_core(
            files=found.files,
            reader=make_reader(
                found,
                options.batching.batch_size,
                options.fetch,
                cache=options.cache,
                bad_data=options.bad_data,
            ),
            output_schema=found.output_schema,
            options=options,
            row_count_issue=issue,
            table=found.table,
            identity={
                "format": source.format.value,
                "columns": list(found.output_columns),
                "partitioning": source.partitioning,
                **filter_identity(found.filters),
            },
            name=where,
        )
        recorder = getattr(self, "metrics", None)  # a source of a mix records none of its own
        if recorder is not None:
            recorder.discovered(discovery_requests)

    @staticmethod
    def _log_found(found: Discovered, source: FileSourceConfig, where: str, options: Options) -> None:
        log_files(
            found.table if found.table is not None else found.files,
            f"found {len(found.files):,} {source.format.value} files under {where!r}",
            found.schema,
            _partition_names(found),
            options.world.rank,
        )

    @classmethod
    def create_dataloader(
        cls,
        path: str | Sequence[str] | Sequence[DataFileInfo] | None = None,
        format: str | FileFormat = "parquet",
        *,
        files: Sequence[DataFileInfo] | None = None,
        **options: Unpack[FileLoaderOptions],
    ) -> tuple[ResumableDataLoader[StructuredDataset], StructuredDataset]:
        """Build the dataset and its DataLoader; see :func:`create_dataloader`."""
        given: dict[str, Any] = dict(options)
        source = file_source(format, given)
        paths = source_paths(path, files)
        built = build_options(given, FileLoaderOptions, "create_dataloader", source.format)
        dataset = cls.from_config(paths, source, built)
        return make_loader(dataset, built.loader), dataset


def create_dataloader(
    path: str | Sequence[str] | Sequence[DataFileInfo] | None = None,
    format: str | FileFormat = "parquet",
    *,
    files: Sequence[DataFileInfo] | None = None,
    **options: Unpack[FileLoaderOptions],
) -> tuple[ResumableDataLoader[StructuredDataset], StructuredDataset]:
    """Build a :class:`StructuredDataset` and a DataLoader that reads it.

    Args:
        path: A file, a directory (recursive), a glob, or a list of them; local paths
            or URLs of any fsspec filesystem (``s3://``, ``gs://``, ``memory://``...).
        format: ``"parquet"`` (default), ``"orc"``, ``"csv"`` or ``"jsonl"`` (see
            ``docs/formats.md``).
        files: Instead of ``path``, 0.2.0's ``DataFileInfo`` objects (their paths are read).
        **options: Every keyword of
            :class:`~torch_dataloader_utils.runtime.options.FileLoaderOptions`: the
            dataset's options (batching, shuffling, splitting, ranks, output, storage)
            and the DataLoader's (``num_workers``, ``pin_memory``, ...). A keyword
            that is not an option raises :class:`UnknownOptionError` naming the
            closest one.

    Returns:
        ``(loader, dataset)``. Call ``dataset.set_epoch(epoch)`` before each epoch.
        ``len(loader)`` is this rank's batch count where row counts are known.
        ``loader.state_dict()`` / ``load_state_dict()`` save and resume mid-epoch
        (``docs/resume.md``).
    """
    return StructuredDataset.create_dataloader(path, format, files=files, **options)
