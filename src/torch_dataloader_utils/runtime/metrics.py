"""What the loader did: per-worker counters and timings, the loop's wait, snapshots of ranks.

Everything is kept in the main process, from what already reaches it:

* every batch's tag (:mod:`.emit`) gives its worker, rows, Arrow bytes and position
  in the worker's plan (rows, batches, pieces begun and done);
* every group of batches from a worker carries the worker's timers and I/O counters
  since its previous group (:mod:`.workstats`): storage wait, decode, convert,
  transfer, bytes fetched from storage and bytes needed, requests, retries, padding;
* the loader times the training loop: the time it is blocked in ``next()`` (waiting on
  the loader) and the time between two batches (its own work). The stall fraction is
  ``wait / (wait + between)``: near 0 when the loader keeps up, near 1 when the loop
  mostly waits for data.

:class:`MetricsRecorder` is the one protocol the loader (and a dataset iterated in the
main process) calls: ``begin`` a pass, ``record`` each tag, ``add_work``, ``waited`` /
``between``, ``finish``. ``snapshot`` / ``drain`` / ``reset`` back ``loader.metrics()``,
``get_metrics()`` and ``reset_metrics()``.

The counters describe batches the loop *received*, so batches prefetched but never
consumed (an interrupted epoch) are not counted — the same rule as the resume state.
Worker timers and I/O counters arrive with the batches, so they cover the work done for
the batches received (and, at the end of a pass, the rest of it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from torch_dataloader_utils.config import ProgressConfig
from torch_dataloader_utils.runtime import share
from torch_dataloader_utils.runtime.progress import Progress, check_progress, logger
from torch_dataloader_utils.runtime.workstats import WorkStats
from torch_dataloader_utils.storage.requests import RequestCounts

__all__ = [
    "LoaderMetrics",
    "MetricsRecorder",
    "RankMetrics",
    "WorkerMetrics",
    "gather_metrics",
    "stall_clock",
]

T = TypeVar("T")


@dataclass
class WorkerMetrics:
    """What one DataLoader worker delivered to the training loop, and what it cost.

    The first six fields are 0.2.0's. Counts are exact; times are seconds summed over
    the worker's batches (so they can add up to more than the wall time, since workers
    run in parallel with the loop).

    Attributes:
        worker_id: The worker's id (0 when reading in the main process; -1 in totals).
        rows_read: Rows in the batches received (padding rows included).
        batches_read: Batches received.
        bytes_read: Arrow size of those batches before conversion (the decoded bytes).
        files_read: Pieces of the plan (chunks, or windows of the row shuffle) begun.
        elapsed_sec: Seconds from the start of the pass (the loop asking for its first
            batch) to the last batch received, as in 0.2.0.
        chunks_done: Pieces whose every row reached the loop.
        rows_padded: Rows repeated to give every rank the same batches
            (``equal_batches='pad'``, flagged ``_is_padding``); the stand-ins of skipped
            units, flagged too, are ``bad_rows``, not counted here.
        bytes_fetched: Bytes read from storage: remote files, what the ranged requests
            returned (coalescing gaps included); local Parquet, the column chunks read;
            CSV / JSONL, the byte ranges read. Not counted for ORC.
        bytes_needed: Bytes of the column chunks (or ranges) the pieces needed.
        requests: Requests this worker's process sent to remote storage, of every kind
            (``request_counts.total``; each retry is a request).
        retries: Requests the library retried after a transient error (a storage client
            may also retry some errors itself, e.g. a reset connection, unseen here).
        storage_wait_sec: Time the worker waited for bytes from remote storage (local
            files: 0, reading is part of decoding).
        decode_sec: Time reading batches apart from the storage wait: decoding,
            deletes, filters, re-batching.
        convert_sec: Time converting batches to the output format.
        transfer_sec: Time packing batches into the buffer they cross processes in.
        cache_hits: Ranges read from the node-local ``data_cache`` (no request).
        cache_misses: Ranges fetched from storage into it.
        cache_bytes_served: Bytes read from it.
        cache_evictions: Entries this worker evicted to keep it under ``data_cache_size``.
        bad_units: Units of data that did not decode and were skipped (``on_bad_data``;
            a row group shared by two chunks counts once per chunk; a line, once).
        bad_rows: Rows of those units.
        bad_rows_by_file: ``bad_rows`` per file.
        request_counts: Those requests by kind (LIST, HEAD, GET, PUT) and the bytes they
            carried, as the storage receives them
            (:class:`~torch_dataloader_utils.storage.requests.RequestCounts`).

    The cache and bad-data counters count what this loader's reader did in the worker's
    process (another loader read in the same process never adds to them).
    """

    worker_id: int
    rows_read: int = 0
    batches_read: int = 0
    bytes_read: int = 0
    files_read: int = 0
    elapsed_sec: float = 0.0
    chunks_done: int = 0
    rows_padded: int = 0
    bytes_fetched: int = 0
    bytes_needed: int = 0
    requests: int = 0
    retries: int = 0
    storage_wait_sec: float = 0.0
    decode_sec: float = 0.0
    convert_sec: float = 0.0
    transfer_sec: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_bytes_served: int = 0
    cache_evictions: int = 0
    bad_units: int = 0
    bad_rows: int = 0
    bad_rows_by_file: dict[str, int] = field(default_factory=dict)
    request_counts: RequestCounts = field(default_factory=RequestCounts)
    _first: float | None = field(default=None, repr=False, compare=False)
    _pieces: int = field(default=0, repr=False, compare=False)

    @property
    def rows_per_sec(self) -> float | None:
        """Rows received per second between the first and last batch (``None`` under 1 ms)."""
        return self.rows_read / self.elapsed_sec if self.elapsed_sec > 1e-3 else None

    def as_dict(self) -> dict[str, Any]:
        """The public fields as plain values."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.name.startswith("_")}
        out["request_counts"] = self.request_counts.as_dict()
        return out

    def add_work(self, delta: Sequence[float], files: Sequence[tuple[str, int]] = ()) -> None:
        """Add a worker's counters (a delta in :data:`WORK_FIELDS` order) and rows skipped per file."""
        (read, convert, transfer, padded, pieces, fetched, needed, requests, retries, wait, *rest) = delta
        hits, misses, served, evictions, units, bad = (int(v) for v in (*rest, 0, 0, 0, 0, 0, 0)[:6])
        sent = rest[6 : 6 + len(REQUEST_FIELDS)]
        if sent:
            self.request_counts += RequestCounts(*(int(v) for v in sent))
        self.cache_hits += hits
        self.cache_misses += misses
        self.cache_bytes_served += served
        self.cache_evictions += evictions
        self.bad_units += units
        self.bad_rows += bad
        for path, rows in files:
            self.bad_rows_by_file[path] = self.bad_rows_by_file.get(path, 0) + int(rows)
        self.storage_wait_sec += wait
        self.decode_sec += read - wait
        self.convert_sec += convert
        self.transfer_sec += transfer
        self.rows_padded += int(padded)
        self._pieces += int(pieces)
        self.bytes_fetched += int(fetched)
        self.bytes_needed += int(needed)
        self.requests += int(requests)
        self.retries += int(retries)


_SUMMED = [
    f.name
    for f in dataclasses.fields(WorkerMetrics)
    if not f.name.startswith("_") and f.name not in ("worker_id", "elapsed_sec", "bad_rows_by_file")
]
REQUEST_FIELDS = dataclasses.fields(RequestCounts)


def _total(workers: Sequence[WorkerMetrics]) -> WorkerMetrics:
    out = WorkerMetrics(worker_id=-1)
    for m in workers:
        for name in _SUMMED:
            setattr(out, name, getattr(out, name) + getattr(m, name))
        for path, rows in m.bad_rows_by_file.items():
            out.bad_rows_by_file[path] = out.bad_rows_by_file.get(path, 0) + rows
    out.elapsed_sec = max((m.elapsed_sec for m in workers), default=0.0)
    return out


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


_COLUMNS: tuple[tuple[str, Callable[[WorkerMetrics], str]], ...] = (
    ("worker", lambda m: "all" if m.worker_id < 0 else str(m.worker_id)),
    ("rows", lambda m: f"{m.rows_read:,}"),
    ("batches", lambda m: f"{m.batches_read:,}"),
    ("chunks", lambda m: f"{m.chunks_done:,}"),
    ("MiB fetched", lambda m: _mib(m.bytes_fetched)),
    ("MiB needed", lambda m: _mib(m.bytes_needed)),
    ("requests", lambda m: f"{m.requests:,}"),
    ("retries", lambda m: f"{m.retries:,}"),
    ("storage s", lambda m: f"{m.storage_wait_sec:.2f}"),
    ("decode s", lambda m: f"{m.decode_sec:.2f}"),
    ("convert s", lambda m: f"{m.convert_sec:.2f}"),
    ("transfer s", lambda m: f"{m.transfer_sec:.2f}"),
    ("rows/s", lambda m: "-" if m.rows_per_sec is None else f"{m.rows_per_sec:,.0f}"),
)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class RankMetrics:
    """A snapshot of one rank's loader: its workers, totals, and the loop's wait.

    Attributes:
        rank: This rank.
        num_ranks: Ranks of the job.
        epoch: The epoch of the last pass.
        workers: One :class:`WorkerMetrics` per worker that delivered a batch, by id.
        wait_sec: Time the training loop was blocked in ``next()`` on the loader (the
            first batch included: worker start-up, first reads).
        between_sec: Time the loop spent between receiving a batch and asking for the
            next one (its own work).
        first_batch_sec: Time from the start of the last pass to its first batch.
        rows_dropped: Rows the plan of ``epoch`` leaves out on every rank to equalize
            them (``equal_batches='drop'``), all ranks together.
        rows_by_source: A mix (``create_mixed_dataloader``): ``(source name, rows the
            loop received from it)`` per source, in order; empty otherwise.
        discovery_requests: Requests this rank sent to storage while the dataset was
            built (the manifest, listing pages, footers, the metadata cache), by kind;
            cleared with the other counters.
    """

    rank: int
    num_ranks: int
    epoch: int
    workers: tuple[WorkerMetrics, ...]
    wait_sec: float = 0.0
    between_sec: float = 0.0
    first_batch_sec: float | None = None
    rows_dropped: int = 0
    rows_by_source: tuple[tuple[str, int], ...] = ()
    discovery_requests: RequestCounts = field(default_factory=RequestCounts)

    @property
    def total(self) -> WorkerMetrics:
        """The workers' counters summed (``worker_id=-1``; ``elapsed_sec`` is the longest)."""
        return _total(self.workers)

    @property
    def request_counts(self) -> RequestCounts:
        """Every request of this rank by kind: building the dataset, and its workers' reads."""
        return self.discovery_requests + self.total.request_counts

    @property
    def stall_fraction(self) -> float | None:
        """``wait / (wait + between)``: the share of the loop's time spent waiting for data."""
        return _ratio(self.wait_sec, self.wait_sec + self.between_sec)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready), totals and stall fraction included."""
        return {
            "rank": self.rank,
            "num_ranks": self.num_ranks,
            "epoch": self.epoch,
            "wait_sec": self.wait_sec,
            "between_sec": self.between_sec,
            "stall_fraction": self.stall_fraction,
            "first_batch_sec": self.first_batch_sec,
            "rows_dropped": self.rows_dropped,
            "rows_by_source": dict(self.rows_by_source),
            "discovery_requests": self.discovery_requests.as_dict(),
            "request_counts": self.request_counts.as_dict(),
            "total": self.total.as_dict(),
            "workers": [m.as_dict() for m in self.workers],
        }

    def __str__(self) -> str:
        first = "-" if self.first_batch_sec is None else f"{self.first_batch_sec:.2f} s"
        head = (
            f"rank {self.rank}/{self.num_ranks} epoch {self.epoch}: stall {_pct(self.stall_fraction)} "
            f"(waited {self.wait_sec:.2f} s on the loader, {self.between_sec:.2f} s between batches), "
            f"first batch after {first}, rows dropped to equalize ranks {self.rows_dropped:,}"
        )
        rows = [[fmt(m) for _, fmt in _COLUMNS] for m in (*self.workers, self.total)]
        if self.request_counts.total:
            built = self.discovery_requests.total
            head += f"\nstorage requests: {self.request_counts} (building the dataset: {built:,})"
        if self.rows_by_source:
            head += "\nrows by source: " + ", ".join(f"{n} {r:,}" for n, r in self.rows_by_source)
        return head + "\n" + _table([name for name, _ in _COLUMNS], rows)


@dataclass(frozen=True)
class LoaderMetrics:
    """A snapshot of the loader's metrics: this rank's, or every rank's (gathered).

    ``str(metrics)`` is a readable report (one table per rank); :meth:`as_dict` gives
    plain values for logging systems.

    Attributes:
        ranks: One :class:`RankMetrics` per rank, by rank.
    """

    ranks: tuple[RankMetrics, ...]

    @property
    def total(self) -> WorkerMetrics:
        """Every worker of every rank summed (``elapsed_sec`` is the longest)."""
        return _total([r.total for r in self.ranks])

    @property
    def request_counts(self) -> RequestCounts:
        """Every request of every rank by kind: building the dataset, and the workers' reads."""
        out = RequestCounts()
        for rank in self.ranks:
            out += rank.request_counts
        return out

    @property
    def wait_sec(self) -> float:
        """The loops' wait on the loader, summed over ranks."""
        return sum(r.wait_sec for r in self.ranks)

    @property
    def between_sec(self) -> float:
        """The loops' time between batches, summed over ranks."""
        return sum(r.between_sec for r in self.ranks)

    @property
    def stall_fraction(self) -> float | None:
        """Over all ranks: ``wait / (wait + between)``."""
        return _ratio(self.wait_sec, self.wait_sec + self.between_sec)

    @property
    def rows_by_source(self) -> dict[str, int]:
        """A mix: rows the loops received per source, every rank together (empty otherwise)."""
        out: dict[str, int] = {}
        for rank in self.ranks:
            for name, rows in rank.rows_by_source:
                out[name] = out.get(name, 0) + rows
        return out

    @property
    def most_stalled(self) -> RankMetrics | None:
        """The rank whose loop waited longest for data (``None`` without ranks)."""
        return max(self.ranks, key=lambda r: r.wait_sec, default=None)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready): every rank, totals and stall fraction."""
        return {
            "num_ranks": len(self.ranks),
            "stall_fraction": self.stall_fraction,
            "wait_sec": self.wait_sec,
            "between_sec": self.between_sec,
            "total": self.total.as_dict(),
            "request_counts": self.request_counts.as_dict(),
            "rows_by_source": self.rows_by_source,
            "ranks": [r.as_dict() for r in self.ranks],
        }

    def __str__(self) -> str:
        parts = [str(r) for r in self.ranks]
        if len(self.ranks) > 1:
            worst = self.most_stalled
            assert worst is not None
            total = self.total
            parts.insert(
                0,
                f"{len(self.ranks)} ranks: {total.rows_read:,} rows, {total.batches_read:,} batches, "
                f"stall {_pct(self.stall_fraction)} overall; most stalled: rank {worst.rank} "
                f"({_pct(worst.stall_fraction)})",
            )
        return "\n\n".join(parts)


class _HasRankMetrics(Protocol):
    def rank_metrics(self) -> RankMetrics: ...


class _HasDataset(Protocol):
    @property
    def dataset(self) -> _HasRankMetrics: ...


def gather_metrics(source: _HasDataset | _HasRankMetrics, group: Any = None) -> LoaderMetrics:
    """Every rank's metrics combined: call it on every rank at the same step.

    Uses ``torch.distributed.all_gather_object`` (over gloo; with NCCL a gloo group over
    all ranks is made once). Without an initialized process group it returns this
    rank's metrics. ``loader.metrics(gather=True)`` is the same.

    Args:
        source: The loader of ``create_dataloader`` (or its dataset).
        group: A process group, or ``None`` for the default one.
    """
    dataset = source if hasattr(source, "rank_metrics") else source.dataset
    mine = dataset.rank_metrics()
    return LoaderMetrics(tuple(sorted(share.all_gather(mine, group), key=lambda r: r.rank)))


def stall_clock(items: Iterator[T], recorder: MetricsRecorder) -> Iterator[T]:
    """Yield ``items``, timing the consumer: its wait in ``next()`` and its time between items."""
    clock = time.perf_counter
    asked = clock()
    first = True
    for item in items:
        got = clock()
        recorder.waited(got - asked, first)
        first = False
        yield item
        asked = clock()
        recorder.between(asked - got)
    recorder.waited(clock() - asked, False)


class MetricsRecorder:
    """Per-worker counters, the loop's wait and the progress display of one dataset.

    Lives in the main process (workers get an empty one when the dataset is pickled).

    Args:
        progress: The ``show_progress`` options.

    Raises:
        IncompatibleOptionsError: ``show_progress=True`` but ``tqdm`` is not installed
            (and stderr is a terminal, where bars are drawn).
    """

    def __init__(self, progress: ProgressConfig) -> None:
        check_progress(progress)
        self._setup(progress)

    def _setup(self, progress: ProgressConfig) -> None:
        self._progress_config = progress
        self._workers: dict[int, WorkerMetrics] = {}
        self._live: dict[int, WorkStats] = {}
        self._progress: Progress | None = None
        self._pass_started: float | None = None
        self.epoch = 0
        self.wait_sec = 0.0
        self.between_sec = 0.0
        self.first_batch_sec: float | None = None
        self.discovery_requests = RequestCounts()

    def __getstate__(self) -> dict[str, Any]:
        # Workers get an empty recorder: counting happens in the main process only.
        return {"_progress_config": self._progress_config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["_progress_config"])

    # -- a pass -------------------------------------------------------------------
    def begin(self, epoch: int, progress: Callable[[], Progress | None] | None = None) -> None:
        """A pass over ``epoch`` starts; ``progress`` makes its display (when one is shown)."""
        self._close_progress()
        self._fold_live()
        self.epoch = epoch
        self.first_batch_sec = None
        self._pass_started = time.monotonic()
        self._progress = progress() if progress is not None else None

    def record(self, tag: Sequence[int]) -> None:
        """Count the batch carrying ``tag`` ``(token, worker, workers, piece, offset, rows, nbytes)``."""
        worker, piece, offset = int(tag[1]), int(tag[3]), int(tag[4])
        rows = int(tag[5]) if len(tag) > 5 else 0
        nbytes = int(tag[6]) if len(tag) > 6 else 0
        now = time.monotonic()
        m = self._workers.get(worker)
        if m is None:
            m = self._workers[worker] = self._new(worker, now)
        m.rows_read += rows
        m.batches_read += 1
        m.bytes_read += nbytes
        m.files_read = max(m.files_read, piece + (1 if offset > 0 else 0))
        m.chunks_done = max(m.chunks_done, piece)
        m.elapsed_sec = now - (m._first if m._first is not None else now)
        if self._progress is not None:
            self._progress.update(rows, self)

    def add_work(self, worker: int, delta: Sequence[float], files: Sequence[tuple[str, int]] = ()) -> None:
        """Add what worker ``worker`` reported with a group of batches (and rows skipped per file)."""
        m = self._workers.get(worker)
        if m is None:
            m = self._workers[worker] = self._new(worker, time.monotonic())
        m.add_work(delta, files)

    def _new(self, worker: int, now: float) -> WorkerMetrics:
        """A worker's counters, timed from the start of the pass (``now`` outside a pass)."""
        started = self._pass_started if self._pass_started is not None else now
        return WorkerMetrics(worker_id=worker, _first=min(started, now))

    def discovered(self, requests: RequestCounts) -> None:
        """Count the requests this rank sent while the dataset was built."""
        self.discovery_requests += requests

    def attach(self, worker: int, work: WorkStats) -> None:
        """Read ``work`` directly (the dataset is read in this process)."""
        self._fold_live()
        self._live[worker] = work

    def waited(self, seconds: float, first: bool) -> None:
        """The loop was blocked ``seconds`` in ``next()`` (``first``: for the pass's first batch)."""
        self.wait_sec += seconds
        if first:
            self.first_batch_sec = seconds

    def between(self, seconds: float) -> None:
        """The loop spent ``seconds`` between two batches."""
        self.between_sec += seconds

    def finish(self, completed: bool = True) -> None:
        """The pass ended (``completed``: every piece reached the loop); closes the display."""
        self._fold_live()
        if completed:
            for m in self._workers.values():
                m.chunks_done = max(m.chunks_done, m._pieces)
        self._close_progress(completed)

    @property
    def stall_fraction(self) -> float | None:
        """``wait / (wait + between)`` so far."""
        return _ratio(self.wait_sec, self.wait_sec + self.between_sec)

    # -- reading the counters ---------------------------------------------------------
    def _fold_live(self) -> None:
        for worker, work in self._live.items():
            delta = work.delta()
            files = work.files_delta()
            if any(delta) or files:
                self.add_work(worker, delta, files)

    def snapshot(self) -> list[WorkerMetrics]:
        """Copies of the counters so far, by worker id (nothing is cleared)."""
        self._fold_live()
        return [dataclasses.replace(self._workers[w]) for w in sorted(self._workers)]

    def rank_metrics(self, rank: int, num_ranks: int, rows_dropped: int) -> RankMetrics:
        """This rank's snapshot."""
        return RankMetrics(
            rank=rank,
            num_ranks=num_ranks,
            epoch=self.epoch,
            workers=tuple(self.snapshot()),
            wait_sec=self.wait_sec,
            between_sec=self.between_sec,
            first_batch_sec=self.first_batch_sec,
            rows_dropped=rows_dropped,
            discovery_requests=self.discovery_requests,
        )

    def drain(self) -> list[WorkerMetrics]:
        """The counters since the last drain or reset, logged as an epoch summary, then cleared."""
        results = self.snapshot()
        stall = self.stall_fraction
        self._clear()
        if results:
            total = _total(results)
            logger.info(
                "Epoch %d complete: workers=%d rows=%s batches=%d bytes=%s elapsed=%.1fs stall=%s",
                self.epoch,
                len(results),
                f"{total.rows_read:,}",
                total.batches_read,
                f"{total.bytes_read:,}",
                total.elapsed_sec,
                _pct(stall),
            )
            if total.bad_units:
                files = ", ".join(
                    f"{path}: {rows:,}" for path, rows in sorted(total.bad_rows_by_file.items())
                )
                logger.info(
                    "Epoch %d: on_bad_data skipped %d unit(s) of data that did not decode, %s row(s) (%s)",
                    self.epoch,
                    total.bad_units,
                    f"{total.bad_rows:,}",
                    files,
                )
        return results

    def _clear(self) -> None:
        self._workers = {}
        self.discovery_requests = RequestCounts()
        self.wait_sec = 0.0
        self.between_sec = 0.0
        self.first_batch_sec = None

    def reset(self) -> None:
        """Discard the counters (and close the progress display)."""
        self._fold_live()
        self._clear()
        self._close_progress()

    def _close_progress(self, completed: bool = False) -> None:
        if self._progress is not None:
            self._progress.close(self, completed)
            self._progress = None
