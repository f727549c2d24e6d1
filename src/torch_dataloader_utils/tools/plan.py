"""``plan``: which chunks every rank and worker reads, summarized, in detail, as JSON or a picture.

The plan shown is the library's own (:func:`plan_of` asks the dataset, built with the
same options a training job would pass), so what the command shows is what the loader
reads. The text report starts with a summary — rows, bytes and chunks per rank and per
worker (min / max / imbalance), rows left out or padded to equalize ranks, idle
workers, layout warnings — followed by the detail, shortened for large jobs
(``--detail N`` ranks, histograms of rows per rank). ``--json`` gives everything to
machines; ``--picture`` draws it (:mod:`.picture`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_dataloader_utils.plan.spread import SPREAD_RANKS
from torch_dataloader_utils.plan.summary import (
    LayoutIssue,
    PlanSummary,
    Spread,
    histogram,
    layout_issues,
    summarize_files,
    summarize_plan,
)
from torch_dataloader_utils.plan.types import Chunk
from torch_dataloader_utils.runtime.dataset import PlannedDataset
from torch_dataloader_utils.runtime.report import describe_files, size
from torch_dataloader_utils.tools.source import Source, open_dataset

__all__ = ["DETAIL_CHUNKS", "PlanRequest", "PlanView", "plan_of", "render_json", "render_text", "run_plan"]

DETAIL_CHUNKS = 3
"""Chunks named per worker line of the text detail (the rest are counted)."""

HISTOGRAM_BINS = 10
"""Bins of the rows-per-rank histogram printed for large jobs."""


@dataclass(frozen=True)
class PlanView:
    """One epoch's plan as the commands use it.

    Attributes:
        epoch: The epoch.
        num_ranks: Ranks.
        num_workers: Workers per rank.
        chunks_for: ``chunks_for(rank, worker)``: that worker's chunks, in reading order.
        dropped: Row ranges left out to equalize ranks.
        summary: Its figures.
    """

    epoch: int
    num_ranks: int
    num_workers: int
    chunks_for: Callable[[int, int], Sequence[Chunk]]
    dropped: tuple[Chunk, ...]
    summary: PlanSummary


def plan_of(dataset: PlannedDataset, epoch: int, num_workers: int) -> PlanView:
    """The plan of ``epoch`` for every rank: the one place the commands ask the planner."""
    plan = dataset.plan(epoch, num_workers)
    return PlanView(
        epoch=plan.epoch,
        num_ranks=plan.num_ranks,
        num_workers=plan.num_workers,
        chunks_for=plan.chunks_for,
        dropped=tuple(plan.dropped),
        summary=summarize_plan(plan),
    )


@dataclass(frozen=True)
class PlanRequest:
    """What ``plan`` is asked to show.

    Attributes:
        source: The dataset and its options.
        num_ranks: Ranks to plan for.
        num_workers: DataLoader workers per rank (0 reads in the main process: one
            reading "worker").
        epoch: The first epoch shown.
        epochs: Epochs shown from ``epoch`` on.
        detail: Ranks listed in the text detail (``-1``: all).
        as_json: Print JSON instead of text.
        picture: Draw the plan to this ``.png`` / ``.svg`` file.
        picture_ranks: Ranks drawn in the picture at most.
        verify: Check every shown epoch: no row planned for two ranks (see
            :meth:`PlannedDataset.verify_plan`).
    """

    source: Source
    num_ranks: int = 1
    num_workers: int = 0
    epoch: int = 0
    epochs: int = 1
    detail: int = 16
    as_json: bool = False
    picture: Path | None = None
    picture_ranks: int = 16
    verify: bool = False


@dataclass(frozen=True)
class PlanResult:
    """What ``plan`` computed: the dataset, one view per epoch, their issues."""

    dataset: PlannedDataset
    views: list[PlanView]
    issues: list[list[LayoutIssue]]
    files_per_batch: list[float | None]


def compute(request: PlanRequest) -> PlanResult:
    """Build the dataset and the plans of the requested epochs."""
    workers = max(1, request.num_workers)
    dataset = open_dataset(request.source, num_ranks=request.num_ranks, num_workers=request.num_workers)
    files = summarize_files(dataset.file_table)
    shuffle = dataset.options.shuffle
    views, issues, spreads = [], [], []
    for epoch in range(request.epoch, request.epoch + request.epochs):
        view = plan_of(dataset, epoch, workers)
        views.append(view)
        spreads.append(dataset.files_per_batch(epoch, workers, ranks=SPREAD_RANKS))
        issues.append(
            layout_issues(
                view.summary,
                files,
                shuffle=shuffle.shuffle,
                row_window=shuffle.rows_mixed,
                batch_size=dataset.options.batching.batch_size,
            )
        )
    return PlanResult(dataset, views, issues, spreads)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _num(value: float, unit: str) -> str:
    if unit == "bytes":
        return size(value)
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _spread_rows(label: str, spread: Spread | None, unit: str) -> list[str]:
    if spread is None:
        return [label, "?", "?", "?", "?"]
    imbalance = spread.imbalance
    return [
        label,
        _num(spread.min, unit),
        _num(spread.max, unit),
        _num(spread.mean, unit),
        "-" if imbalance is None else f"{imbalance:.2f}",
    ]


def _table(rows: Sequence[Sequence[str]], aligns: str = "") -> list[str]:
    """Columns padded to their widest cell; ``aligns[i]`` is ``l`` or ``r`` (default: first left)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    aligns = aligns or "l" + "r" * (len(widths) - 1)
    return [
        "  ".join(
            (c.ljust(w) if a == "l" else c.rjust(w)) for c, w, a in zip(r, widths, aligns, strict=True)
        ).rstrip()
        for r in rows
    ]


def _chunk(c: Chunk) -> str:
    name = c.path.rsplit("/", 1)[-1]
    return f"{name}[{c.start}:{c.stop}){'*' if c.padding else ''}"


def _strategy(strategy: object) -> str:
    """``row_group (split_rows=16384)``: a built-in strategy's name and the sizes it was given."""
    name = getattr(strategy, "name", type(strategy).__name__)
    sizes = [
        f"{k}={v:,}" for k in ("split_bytes", "split_rows") if (v := getattr(strategy, k, None)) is not None
    ]
    return f"{name} ({', '.join(sizes)})" if sizes else str(name)


def _options_line(dataset: PlannedDataset) -> str:
    opts = dataset.options
    shuffle = opts.shuffle
    parts = [
        f"batch_size {opts.batching.batch_size}",
        f"split {_strategy(dataset.split_strategy)}",
        f"equal_batches {opts.batching.equal_batches.value}",
        f"shuffle {'on (seed ' + str(shuffle.shuffle_seed) + ')' if shuffle.shuffle else 'off'}",
    ]
    if shuffle.row_window is not None:
        parts.append(f"row window {shuffle.row_window:,}")
    if opts.batching.drop_last:
        parts.append("drop_last")
    return ", ".join(parts)


def render_text(request: PlanRequest, result: PlanResult) -> str:
    """The report: options, files, then per epoch a summary and the (shortened) detail."""
    dataset = result.dataset
    first = result.views[0]
    lines = [
        f"plan of {request.source.describe()} for {first.num_ranks:,} ranks x {first.num_workers} workers",
        f"options: {_options_line(dataset)}",
        describe_files(summarize_files(dataset.file_table), _count(len(dataset.files), "file")),
    ]
    for view, issues, spread in zip(result.views, result.issues, result.files_per_batch, strict=True):
        s = view.summary
        rows = s.total_rows
        lines += [
            "",
            f"epoch {view.epoch}: {_count(s.total_chunks, 'chunk')} of {_count(s.files, 'file')}, "
            f"{'unknown' if rows is None else f'{rows:,}'} rows, {size(int(s.bytes.sum()))}",
        ]
        table = [["", "min", "max", "mean", "imbalance"]]
        for what, unit in (("rows", "rows"), ("bytes", "bytes"), ("chunks", "chunks")):
            table.append(_spread_rows(f"{what} per rank", s.rank_spread(what), unit))
        for what, unit in (("rows", "rows"), ("bytes", "bytes"), ("chunks", "chunks")):
            table.append(_spread_rows(f"{what} per worker", s.worker_spread(what), unit))
        lines += ["  " + line for line in _table(table)]
        lines.append(
            f"  rows left out to equalize ranks: {s.rows_dropped:,}; rows padded: {s.rows_padded:,}"
            + (" (padding chunks marked *)" if s.rows_padded else "")
        )
        idle = s.idle_workers
        idle_workers = len(idle) + len(s.idle_ranks) * s.num_workers
        lines.append(f"  idle ranks: {len(s.idle_ranks):,}; idle workers: {idle_workers:,}")
        if spread is not None:
            over = "" if view.num_ranks <= SPREAD_RANKS else f" (ranks 0-{SPREAD_RANKS - 1})"
            lines.append(f"  expected files per batch: {spread:.1f}{over}")
        per_rank = s.per_rank("rows")
        if per_rank is not None and view.num_ranks > max(request.detail, 0) >= 0:
            lines.append("  rows per rank:")
            bins = histogram(per_rank, HISTOGRAM_BINS)
            widest = max(c for _, _, c in bins)
            for lo, hi, count in bins:
                bar = "#" * max(1 if count else 0, round(30 * count / widest))
                lines.append(f"    {lo:>14,.0f} - {hi:<14,.0f} {bar} {count:,}")
        for issue in issues:
            lines.append(f"  warning: {issue.message}")
        lines += _detail(request, view)
    return "\n".join(lines)


def _detail(request: PlanRequest, view: PlanView) -> list[str]:
    ranks = list(range(view.num_ranks))
    shown = ranks if request.detail < 0 or request.detail >= len(ranks) else ranks[: request.detail]
    if not shown:
        return []
    out = [
        "",
        f"  detail of epoch {view.epoch}"
        + (
            ""
            if len(shown) == len(ranks)
            else f" (ranks 0-{shown[-1]} of {len(ranks):,}; --detail N for more)"
        ),
    ]
    rows = [["rank", "worker", "rows", "bytes", "chunks", "reads"]]
    for r in shown:
        for w in range(view.num_workers):
            chunks = view.chunks_for(r, w)
            count = 0 if not chunks else sum(c.num_rows or 0 for c in chunks)
            known = all(c.num_rows is not None for c in chunks)
            named = " ".join(_chunk(c) for c in chunks[:DETAIL_CHUNKS])
            if len(chunks) > DETAIL_CHUNKS:
                named += f" ... (+{len(chunks) - DETAIL_CHUNKS} more)"
            rows.append(
                [
                    str(r),
                    str(w),
                    f"{count:,}" if known else "?",
                    size(sum(c.num_bytes for c in chunks)),
                    f"{len(chunks):,}",
                    named or "-",
                ]
            )
    return out + ["  " + line for line in _table(rows, "rrrrrl")]


def _chunk_json(c: Chunk) -> dict[str, Any]:
    return {
        "path": c.path,
        "start": c.start,
        "stop": c.stop,
        "unit": c.unit.value,
        "rows": c.num_rows,
        "bytes": c.num_bytes,
        "padding": c.padding,
    }


def render_json(request: PlanRequest, result: PlanResult) -> str:
    """Everything, for machines: options, files, and per epoch the summary, issues and every chunk."""
    dataset = result.dataset
    files = summarize_files(dataset.file_table)
    epochs = []
    for view, issues, spread in zip(result.views, result.issues, result.files_per_batch, strict=True):
        s = view.summary
        ranks = []
        for r in range(view.num_ranks):
            workers = []
            for w in range(view.num_workers):
                chunks = view.chunks_for(r, w)
                workers.append(
                    {
                        "worker": w,
                        "rows": None if s.rows is None else int(s.rows[r, w]),
                        "bytes": int(s.bytes[r, w]),
                        "chunks": [_chunk_json(c) for c in chunks],
                    }
                )
            ranks.append(
                {
                    "rank": r,
                    "rows": None if s.rows is None else int(s.rows[r].sum()),
                    "bytes": int(s.bytes[r].sum()),
                    "chunks": int(s.chunks[r].sum()),
                    "workers": workers,
                }
            )
        epochs.append(
            {
                "summary": s.as_dict(),
                "files_per_batch": spread,
                "issues": [{"kind": i.kind, "message": i.message} for i in issues],
                "dropped": [_chunk_json(c) for c in view.dropped],
                "ranks": ranks,
            }
        )
    opts = dataset.options
    payload = {
        "source": request.source.describe(),
        "num_ranks": request.num_ranks,
        "num_workers": max(1, request.num_workers),
        "options": {
            "batch_size": opts.batching.batch_size,
            "drop_last": opts.batching.drop_last,
            "equal_batches": opts.batching.equal_batches.value,
            "shuffle": opts.shuffle.shuffle,
            "shuffle_seed": opts.shuffle.shuffle_seed,
            "row_shuffle_window": opts.shuffle.row_window,
            "split": _strategy(dataset.split_strategy),
        },
        "files": {
            "count": files.files,
            "bytes": files.bytes,
            "rows": files.rows,
            "live_rows": files.live_rows,
            "row_groups": files.row_groups,
        },
        "epochs": epochs,
    }
    return json.dumps(payload, indent=1)


def run_plan(request: PlanRequest) -> str:
    """Compute the plan, draw the picture if asked, and return the report (text or JSON)."""
    result = compute(request)
    note = ""
    if request.verify:
        for view in result.views:
            result.dataset.verify_plan(view.epoch, num_workers=max(1, request.num_workers))
        epochs = ", ".join(str(v.epoch) for v in result.views)
        note += f"\nverified: no row is planned for two ranks in epoch {epochs}"
    if request.picture is not None:
        from torch_dataloader_utils.tools.picture import draw_plan

        drawn = draw_plan(
            result.views, request.picture, max_ranks=request.picture_ranks, title=request.source.describe()
        )
        note += f"\npicture: {request.picture} ({len(drawn):,} chunks drawn)"
    if request.as_json:
        return render_json(request, result)
    return render_text(request, result) + note
