"""What the library tells its logger: what discovery found, what the plan is, layouts that hurt.

Records go to the ``torch_dataloader_utils`` logger hierarchy (this module logs as
``torch_dataloader_utils.runtime.report``), on rank 0 only, so a job of 1,000 ranks
logs each once:

* INFO, when a dataset is built: the files (count, rows, bytes, row groups, pruned
  rows), the schema and partitions; then the plan of epoch 0 (chunks, rows per rank and
  per worker with their min / max / imbalance, rows left out or padded to equalize
  ranks, idle workers).
* WARNING: the layouts of :func:`~torch_dataloader_utils.plan.summary.layout_issues`
  (ranks or workers with nothing to read, a chunk far larger than the rest, many small
  files, ``shuffle=True`` where every batch comes from one file).
* DEBUG, while reading: one record per piece read (:mod:`.emit`).

The figures are computed in :mod:`torch_dataloader_utils.plan.summary` (pure values);
this module only formats and logs them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa

from torch_dataloader_utils.plan.summary import (
    FileSummary,
    PlanSummary,
    Spread,
    layout_issues,
    summarize_files,
    summarize_plan,
)
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import EpochPlan, FileInfo

__all__ = ["describe_files", "describe_plan", "log_data_path", "log_files", "report_plan", "size"]

log = logging.getLogger(__name__)

SCHEMA_FIELDS_SHOWN = 12
"""Fields of the schema named in the discovery record (the rest are counted)."""


def size(n: float) -> str:
    """A byte count for people: ``"1.5 MiB"``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _schema(schema: pa.Schema) -> str:
    fields = [f"{f.name}: {f.type}" for f in schema]
    shown = ", ".join(fields[:SCHEMA_FIELDS_SHOWN])
    more = len(fields) - SCHEMA_FIELDS_SHOWN
    return shown + (f", ... ({more} more)" if more > 0 else "")


def describe_files(summary: FileSummary, what: str) -> str:
    """One line about the files: ``what`` (e.g. ``"5 parquet files"``) plus rows, bytes, groups."""
    rows = "unknown rows" if summary.rows is None else f"{summary.rows:,} rows"
    text = f"{what}: {rows}, {size(summary.bytes)}"
    if summary.row_groups:
        text += f", {summary.row_groups:,} row groups"
    pruned = summary.pruned_rows
    if pruned:
        text += f"; filters pruned {pruned:,} rows"
    if summary.deleted_rows:
        text += f"; {summary.deleted_rows:,} rows deleted (delete files, or dropped by a counted row filter)"
    if pruned or summary.deleted_rows:
        text += f" ({summary.empty_files:,} files with no rows left)"
    return text


def log_data_path(description: str, remote: bool, rank: int = 0) -> None:
    """Log which client reads the data bytes of a remote dataset, and why (rank 0, INFO)."""
    if remote and rank == 0:
        log.info("data bytes are read through %s", description)


def log_files(
    files: FileTable | Sequence[FileInfo],
    what: str,
    schema: pa.Schema,
    partitions: Sequence[str] = (),
    rank: int = 0,
) -> FileSummary | None:
    """Log what discovery found (rank 0, INFO); returns the summary when it logged."""
    if rank != 0 or not log.isEnabledFor(logging.INFO):
        return None
    summary = summarize_files(files)
    parts = f"; partitions: {', '.join(partitions)}" if partitions else ""
    log.info("%s; schema: %s%s", describe_files(summary, what), _schema(schema), parts)
    return summary


def _spread(s: Spread | None, fmt: str = ",.0f") -> str:
    if s is None:
        return "unknown"
    imbalance = s.imbalance
    balance = "-" if imbalance is None else f"{imbalance:.2f}"
    return f"min {s.min:{fmt}} max {s.max:{fmt}} (imbalance {balance})"


def describe_plan(summary: PlanSummary) -> str:
    """One line about a plan: chunks, rows per rank and worker, drops, padding, idle workers."""
    rows = summary.total_rows
    count = "unknown" if rows is None else f"{rows:,}"
    text = (
        f"plan of epoch {summary.epoch}: {summary.total_chunks:,} chunks of {summary.files:,} files over "
        f"{summary.num_ranks} ranks x {summary.num_workers} workers, "
        f"{count} rows; rows per rank {_spread(summary.rank_spread('rows'))}, "
        f"per worker {_spread(summary.worker_spread('rows'))}"
    )
    if summary.rows_dropped or summary.rows_padded:
        text += f"; equal batches leave out {summary.rows_dropped:,} rows and pad {summary.rows_padded:,}"
    idle = len(summary.idle_workers) + len(summary.idle_ranks) * summary.num_workers
    if idle:
        text += f"; {idle:,} idle workers"
    return text


def report_plan(
    plan: EpochPlan,
    files: FileTable | Sequence[FileInfo],
    *,
    rank: int,
    shuffle: bool,
    row_window: int | None,
    batch_size: int,
    file_summary: FileSummary | None = None,
    name: str | None = None,
    more_chunks: str = "Lower split_rows / split_bytes",
) -> list[str]:
    """Log ``plan``'s summary (INFO) and its layout issues (WARNING), on rank 0.

    ``files``: the dataset's files (a :class:`FileTable` is summarized from its columns).
    ``name``: the dataset as messages name it; ``more_chunks``: how it gets more chunks.
    Returns the warning messages (empty on other ranks).
    """
    if rank != 0:
        return []
    summary = summarize_plan(plan)
    log.info("%s", describe_plan(summary))
    issues = layout_issues(
        summary,
        file_summary if file_summary is not None else summarize_files(files),
        shuffle=shuffle,
        row_window=row_window,
        batch_size=batch_size,
        more_chunks=more_chunks,
    )
    messages = [
        f"{i.message} (dataset: {name})" if name is not None and i.kind.startswith("idle") else i.message
        for i in issues
    ]
    for message in messages:
        log.warning("%s", message)
    return messages
