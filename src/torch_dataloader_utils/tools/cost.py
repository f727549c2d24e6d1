"""What a job costs in requests: predicted from the plan, as the readers will send them.

``inspect`` and ``simulate`` show it, and its price at what the user pays per 1,000
requests. The rule the readers follow (:mod:`torch_dataloader_utils.io.prefetch`), for
Parquet on S3:

* **Building the dataset** (once per start): what this process sent building it here
  (one GET for a reshard manifest that is not there, one LIST per 1,000 objects, one GET
  per footer, one GET and one PUT for a metadata cache), with ``R`` ranks in a process
  group adding ``R - 1`` GETs (every rank but 0 reads the first file's footer: the
  dataset's schema); ranks without a process group each build it alone (``R`` times).
* **An epoch** (every rank and worker): no LIST, no HEAD (on S3 a file is checked by its
  first GET's response), and GETs: per chunk, its projected column chunks of its row
  groups, merged when closer than 4 KiB and split above 8 MiB; per reading process and
  file, one footer GET when the readers were not given the footers (datasets of more
  than 1,024 files, or a metadata cache without them); a file no larger than 64 KiB
  whose footer is not known comes whole in one GET. Elsewhere (GCS, Azure, other
  fsspec filesystems) each reading process also checks each file once per pass: one
  HEAD (or its store's equivalent) per file it reads; through a pyarrow filesystem
  object (``filesystem=pyarrow.fs.S3FileSystem(...)``) one more, pyarrow's open of the
  file by path.

ORC, CSV and JSONL are read through pyarrow's file objects, whose requests the library
does not choose: their count is an estimate (one GET per 8 MiB of each chunk and one
HEAD per file and reading process).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.config import FileFormat
from torch_dataloader_utils.io.prefetch import MAX_PART_BYTES, coalesce, column_ranges
from torch_dataloader_utils.plan.types import Chunk, FileInfo
from torch_dataloader_utils.runtime.dataset import PlannedDataset
from torch_dataloader_utils.storage.footers import FOOTER_READ_BYTES
from torch_dataloader_utils.storage.requests import RequestCounts

__all__ = ["RequestPlan", "predict_plan", "predict_requests", "render_requests"]


@dataclass(frozen=True)
class RequestPlan:
    """The requests a job sends to storage, predicted from its plan.

    Attributes:
        startup: Building the dataset, every rank together.
        epoch: One epoch read by every rank and worker (fresh workers).
        exact: Whether the counts follow the readers' rule exactly (Parquet with its
            footers in hand); otherwise a part of them is an estimate.
        notes: What the prediction assumed.
    """

    startup: RequestCounts
    epoch: RequestCounts
    exact: bool
    notes: tuple[str, ...] = ()

    def total(self, epochs: int = 1) -> RequestCounts:
        """The start and ``epochs`` epochs."""
        out = self.startup
        for _ in range(epochs):
            out += self.epoch
        return out

    def as_dict(self, per_1000: float | None = None, list_per_1000: float | None = None) -> dict[str, object]:
        """Plain values (JSON-ready), with the costs when a price is given."""
        out: dict[str, object] = {
            "startup": self.startup.as_dict(),
            "epoch": self.epoch.as_dict(),
            "exact": self.exact,
            "notes": list(self.notes),
        }
        if per_1000 is not None:
            out["price_per_1000"] = per_1000
            out["list_price_per_1000"] = per_1000 if list_per_1000 is None else list_per_1000
            out["startup_cost"] = self.startup.cost(per_1000, list_per_1000)
            out["epoch_cost"] = self.epoch.cost(per_1000, list_per_1000)
        return out


def _footer_of(dataset: PlannedDataset) -> Callable[[str], pq.FileMetaData | None]:
    """The parsed footers the readers are given (``None`` for a file whose footer they fetch)."""
    found = getattr(dataset, "discovered", None)
    footers = dict(getattr(found, "footers", None) or {})
    parsed: dict[str, pq.FileMetaData] = {}

    def meta(path: str) -> pq.FileMetaData | None:
        if path not in parsed:
            footer = footers.get(path)
            if footer is None:
                return None
            parsed[path] = pq.read_metadata(pa.BufferReader(footer))
        return parsed[path]

    return meta


def _projected_runs(dataset: PlannedDataset) -> tuple[int, bool]:
    """Runs of adjacent projected columns in a row group, and whether a run joins the next group's.

    Column chunks lie in schema order (a column's leaves together), row group after row
    group: a run is one GET per row group, and the last run of a group meets the first
    of the next when the first and the last columns are both read.
    """
    found = getattr(dataset, "discovered", None)
    columns = getattr(found, "data_columns", None)
    wanted = set(columns) if columns else None
    kept = [wanted is None or field.name in wanted for field in dataset.schema]
    runs = sum(1 for i, keep in enumerate(kept) if keep and (i == 0 or not kept[i - 1]))
    return max(1, runs), bool(kept) and kept[0] and kept[-1]


def _parquet_gets(
    dataset: PlannedDataset,
    chunks: Sequence[Chunk],
    files: dict[str, FileInfo],
    meta: Callable[[str], pq.FileMetaData | None],
) -> tuple[int, int, bool]:
    """GETs and bytes one reading process sends for ``chunks`` (Parquet), and whether exactly."""
    found = getattr(dataset, "discovered", None)
    columns = list(getattr(found, "data_columns", None) or []) or None
    gets = nbytes = 0
    exact = True
    footers: set[str] = set()  # files whose footer this process has
    runs = _projected_runs(dataset)
    for chunk in chunks:
        info = files[chunk.path]
        groups = info.groups_in(chunk.start, chunk.stop)
        if not groups:
            continue
        given = meta(chunk.path)
        if given is None and chunk.path not in footers:
            footers.add(chunk.path)
            if info.size <= FOOTER_READ_BYTES:  # the whole file in one GET
                gets += 1
                nbytes += info.size
                continue
            gets += 1
            nbytes += min(FOOTER_READ_BYTES, info.size)
        if given is not None:
            ranges = coalesce(column_ranges(given, [g.index for g in groups], columns))
            gets += len(ranges)
            nbytes += sum(hi - lo for lo, hi in ranges)
            continue
        exact = False  # the footer is fetched by the reader: its column offsets are unknown here
        share = sum(g.num_bytes for g in groups)
        per_group, joined = runs
        spans = per_group * len(groups) - (len(groups) - 1 if joined else 0)
        gets += max(spans, math.ceil(share / MAX_PART_BYTES))
        nbytes += share
    return gets, nbytes, exact


def predict_requests(
    dataset: PlannedDataset,
    chunks_for: Callable[[int, int], Sequence[Chunk]],
    num_ranks: int,
    num_workers: int,
    *,
    startup: RequestCounts,
    process_group: bool = True,
) -> RequestPlan:
    """The requests of building ``dataset`` on every rank and of one epoch of its plan.

    Args:
        dataset: The dataset (built here, by one process).
        chunks_for: ``chunks_for(rank, worker)``: that reader's chunks of the epoch.
        num_ranks: Ranks.
        num_workers: Workers per rank (0: the main process reads).
        startup: The requests this process sent building ``dataset`` (its metrics'
            ``discovery_requests``): one rank's start, reading every footer itself.
        process_group: Whether the ranks build the dataset together (torchrun): rank 0
            lists, each rank reads its share of the footers. Otherwise each rank builds it alone.
    """
    fs = getattr(getattr(dataset, "discovered", None), "fs", None)
    remote = fs is not None and not fs.is_local
    notes: list[str] = []
    if not remote:
        notes.append("local files: no request is sent")
        return RequestPlan(RequestCounts(), RequestCounts(), True, tuple(notes))
    if process_group:
        extra = RequestCounts(gets=num_ranks - 1) if startup.gets and num_ranks > 1 else RequestCounts()
        start = startup + extra
        notes.append(f"the {num_ranks} rank(s) build the dataset together (a process group)")
    else:
        start = RequestCounts(*(v * num_ranks for v in startup.as_tuple()))
        notes.append(f"each of the {num_ranks} rank(s) builds the dataset alone")
    checks_by_get = bool(getattr(fs, "observes", False))
    user = getattr(fs, "user", None)
    opens_by_head = user is not None and getattr(user, "kind", None) == "arrow"  # pyarrow opens by path
    files = {f.path: f for f in dataset.files}
    parquet = getattr(getattr(dataset, "discovered", None), "format", None) is FileFormat.PARQUET
    meta = _footer_of(dataset)
    gets = heads = nbytes = 0
    exact = parquet
    for rank in range(num_ranks):
        for worker in range(max(1, num_workers)):
            chunks = list(chunks_for(rank, worker))
            opened = len({c.path for c in chunks})
            if parquet:
                g, b, known = _parquet_gets(dataset, chunks, files, meta)
                exact = exact and known
                heads += 0 if checks_by_get else opened
                heads += opened if opens_by_head else 0
            else:  # checked by a metadata request, then opened (pyarrow's open: a HEAD)
                b = sum(max(1, c.num_bytes) for c in chunks)
                g = sum(math.ceil(max(1, c.num_bytes) / MAX_PART_BYTES) for c in chunks)
                heads += 2 * opened
            gets += g
            nbytes += b
    if not checks_by_get:
        notes.append("each reading process checks each file it reads with a metadata request per pass")
    if opens_by_head and parquet:
        notes.append("the pyarrow filesystem object opens each file by path: one HEAD per file and process")
    if not exact:
        notes.append(
            "an estimate in part: footers fetched by the readers (or a format read through pyarrow's "
            "files) leave column offsets unknown here"
        )
    epoch = RequestCounts(heads=heads, gets=gets, bytes_received=nbytes)
    return RequestPlan(start, epoch, exact, tuple(notes))


def predict_plan(dataset: PlannedDataset, epoch: int, num_workers: int) -> RequestPlan:
    """:func:`predict_requests` of ``epoch``'s plan, from what building ``dataset`` here sent."""
    from torch_dataloader_utils.tools.plan import plan_of

    view = plan_of(dataset, epoch, max(1, num_workers))
    return predict_requests(
        dataset, view.chunks_for, view.num_ranks, num_workers, startup=dataset.metrics.discovery_requests
    )


def render_requests(
    plan: RequestPlan, per_1000: float | None = None, list_per_1000: float | None = None
) -> str:
    """The prediction as lines of text (with the costs when a price is given)."""

    def line(name: str, counts: RequestCounts) -> str:
        text = f"  {name}: {counts}"
        if per_1000 is not None:
            text += f"; cost {counts.cost(per_1000, list_per_1000):.6g}"
        return text

    head = "requests to storage" + ("" if plan.exact else " (in part an estimate)")
    if per_1000 is not None:
        dear = per_1000 if list_per_1000 is None else list_per_1000
        head += f", at {per_1000:g} per 1,000 GET/HEAD and {dear:g} per 1,000 LIST/PUT"
    lines = [head + ":", line("building the dataset", plan.startup), line("one epoch", plan.epoch)]
    lines += [f"  ({note})" for note in plan.notes]
    return "\n".join(lines)
