"""``inspect``: what a dataset is made of, what will hurt, and the split size to use.

From metadata only (listing and footers, as the loader reads them): files, rows, bytes,
row groups per file, a histogram of file sizes, the schema, hive partitions, Parquet
compression codecs; then the layout warnings of the plan for ``--num-ranks`` x
``--num-workers`` and a recommendation: the ``split_bytes`` that gives every reader
several chunks, and a resharding target when files are many and small or row groups
too large to split.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.plan.chunks import build_chunks
from torch_dataloader_utils.plan.splits import ByteRangeSplit, RowGroupSplit
from torch_dataloader_utils.plan.spread import SPREAD_RANKS
from torch_dataloader_utils.plan.summary import (
    RESHARD_TARGET_BYTES,
    SMALL_FILES_MAX_BYTES,
    SMALL_FILES_MIN_COUNT,
    FileSummary,
    LayoutIssue,
    histogram,
    layout_issues,
    summarize_files,
)
from torch_dataloader_utils.runtime.dataset import PlannedDataset
from torch_dataloader_utils.runtime.report import describe_files, size
from torch_dataloader_utils.tools.cost import RequestPlan, predict_plan, render_requests
from torch_dataloader_utils.tools.plan import _strategy, plan_of
from torch_dataloader_utils.tools.source import Source, open_dataset

__all__ = ["CHUNKS_PER_READER", "InspectRequest", "Inspection", "inspect_dataset", "run_inspect"]

CHUNKS_PER_READER = 4
"""Chunks per (rank, worker) a recommended split aims for: enough to balance readers."""
MAX_SPLIT_BYTES = 256 * 2**20
"""The largest split recommended: larger chunks only delay the first batch."""
SIZE_BINS = 8
"""Bins of the file-size histogram."""


@dataclass(frozen=True)
class InspectRequest:
    """What ``inspect`` looks at.

    Attributes:
        source: The dataset and its options.
        num_ranks: Ranks the recommendation is for.
        num_workers: Workers per rank the recommendation is for.
        top: Largest files listed.
        as_json: Print JSON instead of text.
        price_per_1000: What 1,000 GET / HEAD requests cost (shown with the predicted
            requests), or ``None``.
        list_price_per_1000: What 1,000 LIST / PUT requests cost (``None``: ``price_per_1000``).
    """

    source: Source
    num_ranks: int = 1
    num_workers: int = 1
    top: int = 5
    as_json: bool = False
    price_per_1000: float | None = None
    list_price_per_1000: float | None = None


@dataclass(frozen=True)
class Inspection:
    """What ``inspect`` found (plain values; :meth:`as_dict` for JSON).

    Attributes:
        source: The dataset described.
        files: The file summary.
        schema: ``name: type`` of every column.
        partitions: Hive partition keys and their number of values.
        compression: Parquet column chunks per codec (empty when unknown).
        groups_per_file: Row groups (stripes) of each file, in the files' order.
        group_bytes: Size on disk of every row group.
        largest: ``(path, bytes, rows)`` of the largest files.
        issues: Layout warnings for the ranks x workers asked.
        recommendation: What to do, as sentences.
        split: The recommended ``{"split_bytes": n}`` (or ``{"split_rows": n}`` for small data).
        data_path: How data bytes are read, and why (pyarrow's native client or the
            fsspec path); empty for Iceberg tables (their FileIO reads them).
        split_used: The split the options give (with ``--shuffle``, finer when the row
            mixing needs more chunks per reader).
        files_per_batch: Expected distinct files in a batch with these options, or ``None``.
        requests: The requests of the start and of one epoch (:mod:`~.tools.cost`).
        prices: ``(price_per_1000, list_price_per_1000)`` they are priced at, if given.
    """

    source: str
    files: FileSummary
    schema: list[str]
    partitions: list[str]
    compression: dict[str, int]
    groups_per_file: list[int] = field(repr=False)
    group_bytes: list[int] = field(repr=False)
    largest: list[tuple[str, int, int | None]]
    issues: list[LayoutIssue]
    recommendation: list[str]
    split: dict[str, int]
    data_path: str = ""
    split_used: str = ""
    files_per_batch: float | None = None
    requests: RequestPlan | None = None
    prices: tuple[float | None, float | None] = (None, None)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready)."""
        f = self.files
        return {
            "source": self.source,
            "files": f.files,
            "bytes": f.bytes,
            "rows": f.rows,
            "live_rows": f.live_rows,
            "deleted_rows": f.deleted_rows,
            "row_groups": f.row_groups,
            "file_size": {**f.size_spread.as_dict(), "median": f.median_size},
            "file_size_histogram": [list(b) for b in histogram(f.sizes, SIZE_BINS)],
            "row_groups_per_file": _stats(self.groups_per_file),
            "row_group_bytes": _stats(self.group_bytes),
            "schema": self.schema,
            "partitions": self.partitions,
            "compression": self.compression,
            "largest_files": [{"path": p, "bytes": b, "rows": r} for p, b, r in self.largest],
            "issues": [{"kind": i.kind, "message": i.message} for i in self.issues],
            "recommendation": self.recommendation,
            "split": self.split,
            "data_path": self.data_path,
            "split_used": self.split_used,
            "files_per_batch": self.files_per_batch,
            "requests": None if self.requests is None else self.requests.as_dict(*self.prices),
        }


def _stats(values: list[int]) -> dict[str, float] | None:
    if not values:
        return None
    arr = np.asarray(values)
    return {"min": float(arr.min()), "median": float(np.median(arr)), "max": float(arr.max())}


def _compression(dataset: PlannedDataset) -> dict[str, int]:
    footers = getattr(dataset, "discovered", None)
    raw = getattr(footers, "footers", None) if footers is not None else None
    counts: Counter[str] = Counter()
    for footer in (raw or {}).values():
        meta = pq.read_metadata(pa.BufferReader(footer))
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            for j in range(rg.num_columns):
                counts[str(rg.column(j).compression)] += 1
    return dict(counts.most_common())


def _partitions(dataset: PlannedDataset) -> list[str]:
    found = getattr(dataset, "discovered", None)
    parts = getattr(found, "partitions", None)
    if parts is None:
        return []
    values = list(parts.values.values())
    return [f"{name} ({len({v[i] for v in values})} values)" for i, name in enumerate(parts.schema.names)]


def _mib(nbytes: float) -> int:
    """``nbytes`` rounded down to a power of two of MiB (at least 1 MiB)."""
    mib = max(1, int(nbytes // 2**20))
    return int(2 ** int(np.log2(mib)) * 2**20)


def recommend(
    files: FileSummary,
    group_bytes: list[int],
    issues: list[LayoutIssue],
    readers: int,
    count: Callable[[dict[str, int]], int] | None = None,
    per_reader: int = CHUNKS_PER_READER,
) -> tuple[dict[str, int], list[str]]:
    """The split giving each of ``readers`` about ``per_reader`` chunks, and advice.

    Args:
        files: The files' summary.
        group_bytes: Size of every row group (stripe).
        issues: The layout issues found.
        readers: Ranks x workers.
        count: The chunks a split (``{"split_bytes": n}`` or ``{"split_rows": n}``) really
            gives, row groups being the smallest unit; ``None`` estimates from the bytes.
        per_reader: Chunks per reader aimed at (more with row mixing: its streams).

    Returns:
        ``({"split_bytes": n} or {"split_rows": n}, sentences)``: a size in bytes, or in rows
        for data smaller than a MiB per chunk.
    """
    wanted = max(1, readers * per_reader)
    target = files.bytes / wanted
    advice = []
    split: dict[str, int]
    if target < 2**20 and files.rows:
        split = {"split_rows": max(1, math.ceil(files.rows / wanted))}
        said = f"split_rows={split['split_rows']}"
        small = f" (the data is small: {size(files.bytes)})"
    else:
        split = {"split_bytes": min(MAX_SPLIT_BYTES, _mib(target))}
        said = f"split_bytes='{split['split_bytes'] // 2**20}MiB'"
        small = ""
    chunks = count(split) if count is not None else max(1, round(files.bytes / split.get("split_bytes", 1)))
    if "split_rows" in split and count is None:
        chunks = wanted
    each = chunks / max(1, readers)
    limited = (
        count is not None and chunks < wanted and bool(group_bytes) and count({"split_rows": 1}) <= chunks
    )
    shown = f"{each:.1f}" if limited or each < 1 else f"{max(1, round(each)):,}"
    text = f"{said} gives each of the {readers:,} readers (ranks x workers) about {shown} chunks{small}"
    if limited:
        text += (
            f"; the row groups allow no more ({len(group_bytes):,} in all: a chunk holds whole row "
            f"groups), fewer than the {per_reader} per reader aimed at"
        )
    advice.append(text)
    if group_bytes:
        median_group = float(np.median(group_bytes))
        if median_group > 2 * target:
            advice.append(
                f"row groups (median {size(median_group)}) are larger than the ~{size(target)} chunks "
                "that keep every reader busy: a chunk smaller than a row group still decodes it whole; "
                f"rewrite the data with row groups of ~{size(max(target, 2**20))} "
                "(`torch-dataloader-utils reshard`) or accept fewer, larger chunks"
            )
    if any(i.kind == "small_files" for i in issues):
        shards = max(1, round(files.bytes / RESHARD_TARGET_BYTES))
        advice.append(
            f"reshard the {files.files:,} small files into about {shards:,} files of "
            f"~{size(RESHARD_TARGET_BYTES)}: `torch-dataloader-utils reshard`"
        )
    elif files.files >= SMALL_FILES_MIN_COUNT // 4 and files.median_size < SMALL_FILES_MAX_BYTES // 4:
        advice.append(
            f"{files.files:,} files of a median {size(files.median_size)}: fine here, but each costs a "
            "request or two on object storage; reshard if listing and footers show up in the start-up time"
        )
    return split, advice


def inspect_dataset(request: InspectRequest) -> Inspection:
    """Build the dataset (metadata only) and describe it."""
    dataset = open_dataset(request.source, num_ranks=request.num_ranks, num_workers=request.num_workers)
    files = summarize_files(dataset.file_table)
    view = plan_of(dataset, 0, max(1, request.num_workers))
    shuffle = dataset.options.shuffle
    issues = layout_issues(
        view.summary,
        files,
        shuffle=shuffle.shuffle,
        row_window=shuffle.rows_mixed,
        batch_size=dataset.options.batching.batch_size,
    )
    groups = [len(f.row_groups or ()) for f in dataset.files]
    group_bytes = [g.num_bytes for f in dataset.files for g in (f.row_groups or ())]
    readers = request.num_ranks * max(1, request.num_workers)
    mixing = shuffle.mixing
    per_reader = max(CHUNKS_PER_READER, mixing.streams if mixing is not None else 0)
    split, advice = recommend(
        files, group_bytes, issues, readers, _chunk_counter(dataset), per_reader=per_reader
    )
    spread = dataset.files_per_batch(0, max(1, request.num_workers), ranks=SPREAD_RANKS)
    largest = sorted(dataset.files, key=lambda f: f.size, reverse=True)[: request.top]
    schema = dataset.schema
    return Inspection(
        source=request.source.describe(),
        files=files,
        schema=[f"{f.name}: {f.type}" for f in schema],
        partitions=_partitions(dataset),
        compression=_compression(dataset),
        groups_per_file=groups,
        group_bytes=group_bytes,
        largest=[(f.path, f.size, f.num_rows) for f in largest],
        issues=issues,
        recommendation=advice,
        split=split,
        data_path=_data_path(dataset),
        split_used=_strategy(dataset.split_strategy),
        files_per_batch=spread,
        requests=predict_plan(dataset, 0, request.num_workers),
        prices=(request.price_per_1000, request.list_price_per_1000),
    )


def _data_path(dataset: PlannedDataset) -> str:
    """How the dataset's bytes are read (file datasets), or ``""``."""
    found = getattr(dataset, "discovered", None)
    fs = getattr(found, "fs", None)
    return str(getattr(fs, "data_path_description", ""))


def _chunk_counter(dataset: PlannedDataset) -> Callable[[dict[str, int]], int] | None:
    """Counts the chunks a split of the dataset's built-in kind gives (whole row groups per chunk)."""
    strategy = dataset.split_strategy
    if isinstance(strategy, RowGroupSplit):

        def row_groups(split: dict[str, int]) -> int:
            sized = RowGroupSplit(split_bytes=split.get("split_bytes"), split_rows=split.get("split_rows"))
            return len(build_chunks(sized, dataset.file_table))

        return row_groups
    if isinstance(strategy, ByteRangeSplit):

        def byte_ranges(split: dict[str, int]) -> int:
            if "split_bytes" not in split:
                return len(build_chunks(strategy, dataset.file_table))
            return len(build_chunks(ByteRangeSplit(split["split_bytes"]), dataset.file_table))

        return byte_ranges
    return None


def render_text(found: Inspection) -> str:
    """The report for people."""
    f = found.files
    lines = [describe_files(f, f"{found.source}: {f.files:,} file{'' if f.files == 1 else 's'}")]
    spread = f.size_spread
    lines.append(f"file size: min {size(spread.min)}, median {size(f.median_size)}, max {size(spread.max)}")
    bins = histogram(f.sizes, SIZE_BINS)
    if bins:
        widest = max(c for _, _, c in bins)
        for lo, hi, count in bins:
            bar = "#" * max(1 if count else 0, round(30 * count / widest))
            lines.append(f"  {size(lo):>10} - {size(hi):<10} {bar} {count:,}")
    groups = _stats(found.groups_per_file)
    if groups and f.row_groups:
        gb = _stats(found.group_bytes)
        assert gb is not None
        lines.append(
            f"row groups per file: min {groups['min']:.0f}, median {groups['median']:.0f}, "
            f"max {groups['max']:.0f}; "
            f"row group size: min {size(gb['min'])}, median {size(gb['median'])}, max {size(gb['max'])}"
        )
    if found.compression:
        lines.append(
            "compression: " + ", ".join(f"{k} ({v:,} column chunks)" for k, v in found.compression.items())
        )
    lines.append("schema:")
    lines += [f"  {s}" for s in found.schema]
    lines.append("partitions: " + (", ".join(found.partitions) if found.partitions else "none"))
    if found.data_path:
        lines.append(f"data bytes read through: {found.data_path}")
    lines.append("largest files:")
    for path, nbytes, rows in found.largest:
        lines.append(f"  {size(nbytes):>10}  {'?' if rows is None else f'{rows:,}':>12} rows  {path}")
    if found.files_per_batch is not None:
        lines.append(
            f"split with these options: {found.split_used}; "
            f"expected files per batch: {found.files_per_batch:.1f}"
        )
    if found.requests is not None:
        lines.append(render_requests(found.requests, *found.prices))
    for issue in found.issues:
        lines.append(f"warning: {issue.message}")
    lines.append("recommendation:")
    lines += [f"  {a}" for a in found.recommendation]
    return "\n".join(lines)


def run_inspect(request: InspectRequest) -> str:
    """Inspect and return the report (text or JSON)."""
    found = inspect_dataset(request)
    return json.dumps(found.as_dict(), indent=1) if request.as_json else render_text(found)
