"""Pictures of the plan (bars of chunks per rank and worker) and of ``simulate``'s epoch.

The plan: ranks x workers as bars of chunks, coloured by file, one panel per epoch.
``simulate``'s predicted epoch: a timeline per rank and worker (:func:`draw_timeline`).

Every (rank, worker) is a horizontal lane; its chunks are drawn in reading order as
rectangles whose width is the chunk's rows (bytes when rows are unknown), coloured by
the file they come from (a cycle of 20 colours; a legend when there are at most 20
files). Padding chunks (``equal_batches='pad'``) are hatched. Large jobs draw their
first ``max_ranks`` ranks and say so in the panel's title.

:func:`draw_plan` returns what it drew, read back from the figure's rectangles, so a
test can check that the picture equals the plan. Needs ``matplotlib`` (the ``plot``
extra: ``pip install 'torch-dataloader-utils[plot]'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch_dataloader_utils.errors import ConfigError, IncompatibleOptionsError
from torch_dataloader_utils.plan.summary import PlanSummary
from torch_dataloader_utils.plan.types import Chunk

__all__ = ["DrawnBar", "DrawnChunk", "PlanView", "WorkerSpan", "draw_plan", "draw_timeline", "file_colours"]


class PlanView(Protocol):
    """What a picture needs of an epoch's plan (``tools.plan.PlanView`` has it)."""

    @property
    def epoch(self) -> int:
        """The epoch."""
        ...

    @property
    def num_ranks(self) -> int:
        """Ranks."""
        ...

    @property
    def num_workers(self) -> int:
        """Workers per rank."""
        ...

    @property
    def summary(self) -> PlanSummary:
        """The plan's figures."""
        ...

    def chunks_for(self, rank: int, worker: int) -> Sequence[Chunk]:
        """That worker's chunks, in reading order."""
        ...


LANE_INCHES = 0.28
"""Height of one (rank, worker) lane."""
COLOURS = 20
"""Files get one of this many colours (matplotlib's ``tab20``), in a cycle."""
FORMATS = (".png", ".svg", ".pdf")


@dataclass(frozen=True)
class DrawnChunk:
    """One rectangle of the picture, as read back from the figure.

    Attributes:
        epoch: Its panel's epoch.
        rank: Its lane's rank.
        worker: Its lane's worker.
        index: Its position in the worker's reading order.
        x: Where it starts (rows, or bytes, read before it by the worker).
        width: Its rows (or bytes).
        colour: Its face colour, RGBA.
        hatched: Whether it is drawn hatched (a padding chunk).
    """

    epoch: int
    rank: int
    worker: int
    index: int
    x: float
    width: float
    colour: tuple[float, float, float, float]
    hatched: bool


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise IncompatibleOptionsError(
            "--picture draws with matplotlib, which is not installed; "
            "pip install 'torch-dataloader-utils[plot]' (or matplotlib), or drop --picture"
        ) from exc
    return matplotlib


def file_colours(views: Sequence[PlanView]) -> dict[str, tuple[float, float, float, float]]:
    """The colour of every file in ``views`` (files in path order, ``tab20`` in a cycle)."""
    matplotlib = _matplotlib()
    cmap = matplotlib.colormaps["tab20"]
    paths = sorted(
        {
            c.path
            for v in views
            for r in range(v.num_ranks)
            for w in range(v.num_workers)
            for c in v.chunks_for(r, w)
        }
    )
    return {p: tuple(float(x) for x in cmap(i % COLOURS)) for i, p in enumerate(paths)}  # type: ignore[misc]


def draw_plan(
    views: Sequence[PlanView], out: Path, *, max_ranks: int = 16, title: str = ""
) -> list[DrawnChunk]:
    """Draw ``views`` (one panel per epoch) to ``out`` (``.png``, ``.svg`` or ``.pdf``).

    Returns:
        Every rectangle drawn, read back from the figure.

    Raises:
        IncompatibleOptionsError: matplotlib is not installed.
        ConfigError: ``out`` has another suffix.
    """
    if out.suffix.lower() not in FORMATS:
        raise ConfigError(f"--picture {str(out)!r} must end in {', '.join(FORMATS)} (the picture's format)")
    _matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import StrMethodFormatter

    colours = file_colours(views)
    lanes_per_view = [min(v.num_ranks, max_ranks) * v.num_workers for v in views]
    heights = [max(1.6, 0.9 + LANE_INCHES * n) for n in lanes_per_view]
    fig = Figure(figsize=(12, sum(heights) + (0.6 if len(colours) <= COLOURS else 0.2)), layout="constrained")
    axes = fig.subplots(len(views), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, view in zip(axes, views, strict=True):
        ranks = min(view.num_ranks, max_ranks)
        lanes = ranks * view.num_workers
        widest = 0.0
        by_rows = all(
            c.num_rows is not None
            for r in range(ranks)
            for w in range(view.num_workers)
            for c in view.chunks_for(r, w)
        )
        labels = []
        for r in range(ranks):
            for w in range(view.num_workers):
                lane = r * view.num_workers + w
                y = lanes - 1 - lane  # rank 0 worker 0 on top
                labels.append((y, f"rank {r} w{w}" if view.num_workers > 1 else f"rank {r}"))
                x = 0.0
                for i, c in enumerate(view.chunks_for(r, w)):
                    width = float(c.num_rows if by_rows and c.num_rows is not None else c.num_bytes)
                    rect = Rectangle(
                        (x, y - 0.4),
                        width,
                        0.8,
                        facecolor=colours[c.path],
                        edgecolor="white",
                        linewidth=0.6,
                        hatch="///" if c.padding else None,
                        gid=f"chunk-e{view.epoch}-r{r}-w{w}-{i}",
                    )
                    ax.add_patch(rect)
                    x += width
                widest = max(widest, x)
            if r < ranks - 1 and view.num_workers > 1:
                ax.axhline(lanes - 1 - (r + 1) * view.num_workers + 0.5, color="0.6", linewidth=0.8)
        ax.set_xlim(0, max(widest, 1.0) * 1.01)
        ax.set_ylim(-0.6, lanes - 0.4)
        ax.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=8)
        ax.set_xlabel("rows read by the worker" if by_rows else "bytes read by the worker (rows unknown)")
        shown = "" if ranks == view.num_ranks else f" (first {ranks} of {view.num_ranks:,} ranks)"
        s = view.summary
        ax.set_title(
            f"{title} epoch {view.epoch}: {s.total_chunks:,} chunks of {s.files:,} files, "
            f"{view.num_ranks:,} ranks x {view.num_workers} workers{shown}",
            fontsize=10,
            loc="left",
        )
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.grid(axis="x", color="0.9")
        ax.set_axisbelow(True)
    if len(colours) <= COLOURS:
        handles = [Patch(facecolor=c, label=Path(p).name) for p, c in colours.items()]
        fig.legend(
            handles=handles, loc="outside lower center", ncols=min(5, len(handles)), fontsize=8, frameon=False
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return _read_back(fig, views)


def _read_back(fig: Any, views: Sequence[PlanView]) -> list[DrawnChunk]:
    """The chunk rectangles of ``fig``, with their lanes decoded from their ids."""
    drawn = []
    for ax in fig.axes:
        for patch in ax.patches:
            gid = patch.get_gid()
            if not gid or not gid.startswith("chunk-"):
                continue
            e, r, w, i = gid.removeprefix("chunk-").split("-")
            drawn.append(
                DrawnChunk(
                    epoch=int(e[1:]),
                    rank=int(r[1:]),
                    worker=int(w[1:]),
                    index=int(i),
                    x=float(patch.get_x()),
                    width=float(patch.get_width()),
                    colour=tuple(float(v) for v in patch.get_facecolor()),  # type: ignore[arg-type]
                    hatched=bool(patch.get_hatch()),
                )
            )
    return drawn


class WorkerSpan(Protocol):
    """What a timeline needs of one worker's predicted pass (``tools.simulate.WorkerTime``)."""

    @property
    def rank(self) -> int:
        """The rank."""
        ...

    @property
    def worker(self) -> int:
        """The worker."""
        ...

    @property
    def first_batch_sec(self) -> float:
        """When its first batches reach the loop."""
        ...

    @property
    def finish_sec(self) -> float:
        """When its last batch is ready."""
        ...


@dataclass(frozen=True)
class DrawnBar:
    """One bar of a timeline, as read back from the figure.

    Attributes:
        rank: Its lane's rank.
        worker: Its lane's worker.
        kind: ``"start"`` (until the first batch) or ``"read"`` (first batch to last).
        start: Seconds from the start of the pass.
        end: Seconds from the start of the pass.
    """

    rank: int
    worker: int
    kind: str
    start: float
    end: float


def draw_timeline(
    workers: Sequence[WorkerSpan],
    rank_ends: Sequence[tuple[int, float]],
    out: Path,
    *,
    max_ranks: int = 16,
    title: str = "",
) -> list[DrawnBar]:
    """Draw ``simulate``'s predicted epoch: a lane per (rank, worker), a mark at each rank's end.

    Each lane shows the time until the worker's first batch reaches the loop (grey) and
    its reading, first batch to last (blue); ``rank_ends`` are ``(rank, epoch seconds)``
    marks (the loop's step time included). The first ``max_ranks`` ranks are drawn.

    Returns:
        Every bar drawn, read back from the figure.

    Raises:
        IncompatibleOptionsError: matplotlib is not installed.
        ConfigError: ``out`` has another suffix.
    """
    if out.suffix.lower() not in FORMATS:
        raise ConfigError(f"--picture {str(out)!r} must end in {', '.join(FORMATS)} (the picture's format)")
    _matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    shown = sorted({w.rank for w in workers})[:max_ranks]
    lanes = sorted((w for w in workers if w.rank in set(shown)), key=lambda w: (w.rank, w.worker))
    fig = Figure(figsize=(12, max(1.8, 1.2 + LANE_INCHES * len(lanes))), layout="constrained")
    ax = fig.subplots()
    labels = []
    for i, w in enumerate(lanes):
        y = len(lanes) - 1 - i
        labels.append((y, f"rank {w.rank} w{w.worker}"))
        for kind, start, end, colour in (
            ("start", 0.0, w.first_batch_sec, "0.75"),
            ("read", w.first_batch_sec, w.finish_sec, "tab:blue"),
        ):
            ax.add_patch(
                Rectangle(
                    (start, y - 0.4),
                    max(0.0, end - start),
                    0.8,
                    facecolor=colour,
                    edgecolor="white",
                    gid=f"bar-r{w.rank}-w{w.worker}-{kind}",
                )
            )
    ends = [(r, t) for r, t in rank_ends if r in set(shown)]
    for r, t in ends:
        ys = [len(lanes) - 1 - i for i, w in enumerate(lanes) if w.rank == r]
        ax.vlines(t, min(ys) - 0.45, max(ys) + 0.45, color="tab:red", linewidth=1.5)
    widest = max([w.finish_sec for w in lanes] + [t for _, t in ends] + [1e-3])
    ax.set_xlim(0, widest * 1.02)
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=8)
    ax.set_xlabel("seconds from the start of the pass")
    ranks = len({w.rank for w in workers})
    more = "" if len(shown) == ranks else f" (first {len(shown)} of {ranks:,} ranks)"
    ax.set_title(f"{title} predicted epoch{more}", fontsize=10, loc="left")
    ax.grid(axis="x", color="0.9")
    ax.set_axisbelow(True)
    fig.legend(
        handles=[
            Patch(facecolor="0.75", label="until the first batch"),
            Patch(facecolor="tab:blue", label="reading"),
            Patch(facecolor="tab:red", label="rank's epoch ends"),
        ],
        loc="outside lower center",
        ncols=3,
        fontsize=8,
        frameon=False,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    drawn = []
    for patch in ax.patches:
        gid = patch.get_gid() or ""
        if isinstance(patch, Rectangle) and gid.startswith("bar-"):
            rank, worker, kind = gid.removeprefix("bar-").split("-")
            x, width = float(patch.get_x()), float(patch.get_width())
            drawn.append(DrawnBar(int(rank[1:]), int(worker[1:]), kind, x, x + width))
    return drawn
