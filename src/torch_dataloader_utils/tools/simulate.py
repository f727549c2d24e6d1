"""``simulate``: predict time to first batch, epoch time per rank and worker, and the straggler.

The model, from the plan (the library's own) and a few numbers:

* **Storage**: every chunk is fetched as the library fetches it — its needed byte ranges
  (projected columns of its row groups, from the footers), coalesced and split as
  :mod:`torch_dataloader_utils.io.prefetch` does, each range one request taking
  ``latency + bytes / bandwidth``, at most ``concurrency`` requests in flight per
  worker, the next chunks fetched ahead while one is decoded (up to ``read_ahead_bytes``).
* **Decoding**: rows per second of one reading process (read, cut into batches,
  convert, and pack for the transfer when there are workers), measured on one chunk of
  the plan or given; workers and the main process share ``cores_per_rank`` cores.
* **The reading process's own fetching**: receiving bytes into fresh buffers costs CPU
  (``receive_rate``) in the process that reads, beside its decoding (its fetch threads
  share its interpreter); parsing a file's footer when its first chunk is fetched
  (``footer_sec``); one metadata request per remote file and pass (is it the planned
  file?), 8 at once, each open waiting for its file's answer, except on S3, where a
  file's first GET checks it.
* **The main process**: its own time per batch (the DataLoader's machinery, tags,
  metrics), and the start-up of the DataLoader workers, both measured on this machine
  (:mod:`torch_dataloader_utils.runtime.calibrate`).
* **The plan**: each worker reads its chunks in order; a worker's first batches reach
  the loop in a group of about 32 MiB (:data:`~torch_dataloader_utils.runtime.emit.GROUP_BYTES`);
  the DataLoader takes worker 0's first.
* **The loop** (optional): ``step_sec`` of training per batch; the rank's epoch is then
  at least its batches times the step.

It ignores what it cannot know from here: other jobs on the node or the network,
variance of the store, Python's own overheads beyond those in the measured rate.
``benchmarks/bench_simulate.py`` checks it against real runs through a latency file
system.
"""

from __future__ import annotations

import heapq
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.config import DEFAULT_READ_AHEAD_BYTES
from torch_dataloader_utils.discovery.parquet import METADATA_THREADS
from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.io.batching import rebatch
from torch_dataloader_utils.io.parquet import READ_BATCH_ROWS
from torch_dataloader_utils.io.prefetch import FETCH_THREADS, MAX_PART_BYTES, coalesce, column_ranges
from torch_dataloader_utils.plan.summary import Spread
from torch_dataloader_utils.plan.types import Chunk, FileInfo
from torch_dataloader_utils.runtime.calibrate import (
    measure_batch_overhead,
    measure_thread_start,
    measure_worker_start,
)
from torch_dataloader_utils.runtime.dataset import PlannedDataset
from torch_dataloader_utils.runtime.emit import FIRST_GROUP_BATCHES, GROUP_BYTES
from torch_dataloader_utils.runtime.report import size
from torch_dataloader_utils.storage.identity import CHECK_THREADS, CHECKS_AHEAD
from torch_dataloader_utils.tools.cost import predict_plan, render_requests
from torch_dataloader_utils.tools.plan import PlanView, plan_of
from torch_dataloader_utils.tools.source import Source, open_dataset
from torch_dataloader_utils.transfer import pack_group

__all__ = [
    "DecodeModel",
    "SimulateRequest",
    "Simulation",
    "StorageModel",
    "WorkerTime",
    "chunk_requests",
    "measure_decode",
    "measure_footer",
    "measure_pass_start",
    "run_simulate",
    "simulate",
    "simulate_worker",
]

MEASURE_SEC = 0.3
"""A decode measurement repeats the chunk until this long has passed (and at least twice)."""


def _at_least(name: str, value: float, flag: str, *, zero: bool = False, infinite: bool = False) -> None:
    """Refuse a model figure that is negative, not a number, zero (unless ``zero``) or infinite.

    Raises:
        ConfigError: naming the figure, its value, its command-line flag and what is allowed.
    """
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and (value > 0 or (zero and value == 0)) and (infinite or math.isfinite(value)):
        return
    allowed = ">= 0" if zero else "> 0"
    raise ConfigError(f"{name}={value!r} must be a finite number {allowed} ({flag})")


@dataclass(frozen=True)
class StorageModel:
    """Where the bytes come from.

    Attributes:
        latency_sec: Seconds before a request's first byte (0: local disk, page cache).
        bandwidth: Bytes per second of one request (``inf``: not a limit).
        concurrency: Requests in flight at once per worker (the library's fetch threads).
        read_ahead_bytes: Bytes of the next chunks fetched while one is decoded.
        receive_rate: Bytes per second one core receives (copies, TLS): fetching costs
            CPU that decoding then lacks (``inf``: free).
    """

    latency_sec: float = 0.0
    bandwidth: float = math.inf
    concurrency: int = FETCH_THREADS
    read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES
    receive_rate: float = math.inf

    def __post_init__(self) -> None:
        _at_least("latency_sec", self.latency_sec, "--latency-ms", zero=True)
        _at_least("bandwidth", self.bandwidth, "--bandwidth-mib; leave it out for no limit", infinite=True)
        _at_least("receive_rate", self.receive_rate, "--receive-mib; leave it out for free", infinite=True)
        _at_least("read_ahead_bytes", self.read_ahead_bytes, "--read-ahead", zero=True)
        if (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or self.concurrency < 1
        ):
            raise ConfigError(f"concurrency={self.concurrency!r} must be an int >= 1 (--concurrency)")

    def request_sec(self, nbytes: int) -> float:
        """Time of one request of ``nbytes``."""
        return self.latency_sec + (nbytes / self.bandwidth if math.isfinite(self.bandwidth) else 0.0)


@dataclass(frozen=True)
class DecodeModel:
    """How fast one process turns stored bytes into batches.

    Attributes:
        rows_per_sec: Rows per second of one reading process running alone.
        cores_used: Cores that process kept busy while measured (pyarrow decodes with
            threads), so workers sharing a rank's cores each get their share.
        arrow_bytes_per_row: Decoded bytes per row (sizes the first group of batches).
        batch_sec: The main process's own time per batch (the DataLoader's machinery,
            tags, metrics), beside reading.
        footer_sec: Seconds to parse one file's footer (once per file and process).
        pass_sec: Seconds a reading process spends starting a pass before its first
            request (its fetch and check threads, on remote storage).
        measured_on: The chunk measured, or ``None`` when the rate was given.
    """

    rows_per_sec: float
    cores_used: float = 1.0
    arrow_bytes_per_row: float = 64.0
    batch_sec: float = 0.0
    footer_sec: float = 0.0
    pass_sec: float = 0.0
    measured_on: str | None = None

    def worker_rate(self, workers: int, cores: float) -> float:
        """Rows per second of one of ``workers`` processes when all read at once on ``cores`` cores."""
        if workers <= 1:
            return self.rows_per_sec * min(1.0, cores / max(self.cores_used, 1e-9))
        share = cores / (workers * max(self.cores_used, 1e-9))
        return self.rows_per_sec * min(1.0, share)


@dataclass(frozen=True)
class WorkerTime:
    """One worker's predicted reading of its chunks (seconds from the start of the pass).

    Attributes:
        rank: The rank.
        worker: The worker.
        rows: Rows it reads.
        chunks: Chunks it reads.
        requests: Requests it sends.
        first_batch_sec: When its first batches reach the loop.
        finish_sec: When its last batch is ready.
        storage_wait_sec: Time it waits for bytes.
        decode_sec: Time it decodes.
    """

    rank: int
    worker: int
    rows: int
    chunks: int
    requests: int
    first_batch_sec: float
    finish_sec: float
    storage_wait_sec: float
    decode_sec: float


@dataclass(frozen=True)
class RankTime:
    """One rank's predicted epoch.

    Attributes:
        rank: The rank.
        first_batch_sec: Time to its first batch.
        data_sec: When its last batch is ready (the loop never slower).
        epoch_sec: Its epoch with the loop's step time.
        batches: Its batches.
        stall_fraction: Predicted share of the loop's time spent waiting for data.
    """

    rank: int
    first_batch_sec: float
    data_sec: float
    epoch_sec: float
    batches: int
    stall_fraction: float


@dataclass(frozen=True)
class Simulation:
    """The prediction for one epoch.

    Attributes:
        storage: The storage model.
        decode: The decode model.
        startup_sec: Building the dataset: listing and footers.
        ranks: Every rank's epoch.
        workers: Every worker's reading.
        worker_start_sec: Start-up of the DataLoader workers assumed.
        step_sec: The loop's time per batch assumed.
    """

    storage: StorageModel
    decode: DecodeModel
    startup_sec: float
    ranks: list[RankTime]
    workers: list[WorkerTime] = field(repr=False)
    worker_start_sec: float = 0.0
    step_sec: float = 0.0

    @property
    def straggler(self) -> RankTime:
        """The rank whose epoch ends last."""
        return max(self.ranks, key=lambda r: r.epoch_sec)

    @property
    def slowest_worker(self) -> WorkerTime:
        """The worker that finishes last."""
        return max(self.workers, key=lambda w: w.finish_sec)

    @property
    def epoch_sec(self) -> float:
        """The job's epoch: its straggler's."""
        return self.straggler.epoch_sec

    @property
    def first_batch_sec(self) -> float:
        """The latest time to first batch over ranks (every rank waits for the slowest)."""
        return max(r.first_batch_sec for r in self.ranks)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready)."""
        straggler = self.straggler
        return {
            "storage": {
                "latency_sec": self.storage.latency_sec,
                "bandwidth": None if math.isinf(self.storage.bandwidth) else self.storage.bandwidth,
                "concurrency": self.storage.concurrency,
                "read_ahead_bytes": self.storage.read_ahead_bytes,
                "receive_rate": None if math.isinf(self.storage.receive_rate) else self.storage.receive_rate,
            },
            "decode": {
                "rows_per_sec": self.decode.rows_per_sec,
                "cores_used": self.decode.cores_used,
                "arrow_bytes_per_row": self.decode.arrow_bytes_per_row,
                "batch_sec": self.decode.batch_sec,
                "footer_sec": self.decode.footer_sec,
                "pass_sec": self.decode.pass_sec,
                "measured_on": self.decode.measured_on,
            },
            "worker_start_sec": self.worker_start_sec,
            "step_sec": self.step_sec,
            "startup_sec": self.startup_sec,
            "first_batch_sec": self.first_batch_sec,
            "epoch_sec": self.epoch_sec,
            "straggler": {"rank": straggler.rank, "epoch_sec": straggler.epoch_sec},
            "ranks": [vars(r) for r in self.ranks],
            "workers": [vars(w) for w in self.workers],
        }


def _metadata(
    dataset: PlannedDataset, path: str, cache: dict[str, pq.FileMetaData]
) -> pq.FileMetaData | None:
    meta = cache.get(path)
    if meta is None:
        found = getattr(dataset, "discovered", None)
        footers = getattr(found, "footers", None) if found is not None else None
        footer = (footers or {}).get(path)
        if footer is None:
            return None
        meta = cache[path] = pq.read_metadata(pa.BufferReader(footer))
    return meta


def chunk_requests(
    dataset: PlannedDataset, chunk: Chunk, cache: dict[str, pq.FileMetaData] | None = None
) -> list[int]:
    """The sizes of the requests that fetch ``chunk`` from remote storage, as the library sends them.

    Parquet: its projected column chunks, coalesced and split like the fetcher does.
    Other formats: its bytes, in parts of :data:`MAX_PART_BYTES`.
    """
    cache = {} if cache is None else cache
    meta = _metadata(dataset, chunk.path, cache)
    files: dict[str, FileInfo] = {f.path: f for f in dataset.files} if meta is not None else {}
    if meta is not None and chunk.path in files:
        groups = files[chunk.path].groups_in(chunk.start, chunk.stop)
        columns = list(dataset.discovered.data_columns)  # type: ignore[attr-defined]
        ranges = coalesce(column_ranges(meta, [g.index for g in groups], columns))
        return [hi - lo for lo, hi in ranges]
    nbytes = max(1, chunk.num_bytes)
    return [min(MAX_PART_BYTES, nbytes - lo) for lo in range(0, nbytes, MAX_PART_BYTES)]


def measure_footer(dataset: PlannedDataset, files: int = 8) -> float:
    """Median seconds to parse one Parquet footer of the dataset (0 when it has none in hand)."""
    found = getattr(dataset, "discovered", None)
    footers = list((getattr(found, "footers", None) or {}).values())[:files]
    times = []
    for footer in footers:
        began = time.perf_counter()
        pq.read_metadata(pa.BufferReader(footer))
        times.append(time.perf_counter() - began)
    return float(np.median(times)) if times else 0.0


def measure_pass_start(dataset: PlannedDataset) -> float:
    """Seconds a reading process spends starting a pass: its fetch and check threads (remote files)."""
    if not dataset.reader.fetches_ahead:
        return 0.0
    return measure_thread_start(FETCH_THREADS + CHECK_THREADS)


def measure_decode(dataset: PlannedDataset, chunk: Chunk, workers: int) -> DecodeModel:
    """Rows per second of reading ``chunk`` in this process (storage waits left out).

    Reads it, cuts it into batches and converts them (with ``workers``, packing them in
    groups as a worker does, and timing apart the main process's unpacking of them) until
    :data:`MEASURE_SEC` has passed, after one warm-up read; the main process's own time
    per batch adds :func:`measure_batch_overhead`.
    """
    reader = dataset.reader
    io = reader.io_totals

    batching = dataset.options.batching
    received = [0.0, 0]  # main process: seconds unpacking groups, batches received

    def receive(packed: Any, count: int) -> None:
        began = time.perf_counter()
        rebuild, args = packed.__reduce__()
        rebuild(*args)  # the main process's views of the buffer (its transfer itself not timed)
        received[0] += time.perf_counter() - began
        received[1] += count

    def once() -> tuple[int, int, float]:
        rows = nbytes = group = 0
        waited = (io() or (0, 0, 0, 0, 0.0))[4]
        pending: list[Any] = []
        for batch in rebatch(reader.read(chunk), batching.batch_size, batching.drop_last):
            rows += batch.num_rows
            nbytes += batch.nbytes
            out = dataset.convert_batch(batch, for_transfer=workers > 0)
            if workers > 0:  # as a worker sends them: groups of about GROUP_BYTES
                pending.append(out)
                group += batch.nbytes
                if group >= GROUP_BYTES:
                    receive(pack_group(pending), len(pending))
                    pending, group = [], 0
        if pending:
            receive(pack_group(pending), len(pending))
        return rows, nbytes, (io() or (0, 0, 0, 0, 0.0))[4] - waited

    once()
    wall = cpu = waits = 0.0
    rows = nbytes = runs = 0
    while runs < 2 or wall < MEASURE_SEC:
        w0, c0 = time.perf_counter(), time.process_time()
        r, b, waited = once()
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
        waits += waited
        rows += r
        nbytes += b
        runs += 1
        if r == 0:
            break
    unpack_sec = received[0] / received[1] if received[1] else 0.0
    busy = max(wall - waits - received[0], 1e-9)
    name = f"{chunk.path}[{chunk.start}:{chunk.stop})"
    return DecodeModel(
        rows_per_sec=rows / busy,
        cores_used=max(1.0, (cpu - received[0]) / busy),
        arrow_bytes_per_row=nbytes / rows if rows else 64.0,
        batch_sec=measure_batch_overhead() + unpack_sec,
        footer_sec=measure_footer(dataset),
        pass_sec=measure_pass_start(dataset),
        measured_on=name,
    )


def simulate_worker(
    chunks: Sequence[Chunk],
    requests: Sequence[Sequence[int]],
    storage: StorageModel,
    rate: float,
    first_rows: int,
    start: float = 0.0,
    footer_sec: float = 0.0,
    checks: bool = True,
) -> tuple[float, float, float, float]:
    """One worker reading ``chunks`` in order: ``(first_batch, finish, storage_wait, decode)`` seconds.

    ``requests[i]`` are the request sizes of chunk ``i``; its first batches reach the
    loop once ``first_rows`` rows are decoded (or its chunks end). Receiving a chunk's
    bytes costs the worker ``bytes / storage.receive_rate`` beside decoding; the first
    chunk fetched of a file costs ``footer_sec`` when it is fetched. Remote files
    (``latency_sec > 0``) are checked once per pass, :data:`CHECK_THREADS` at once: the
    first :data:`CHECKS_AHEAD` files at the start, each next one when a file is first
    opened; a chunk is opened once its file's check answered. ``checks=False``: the
    storage's reads check their files themselves (S3), no request of their own.
    """
    threads = [start] * max(1, storage.concurrency)
    heapq.heapify(threads)
    ready: dict[int, float] = {}
    fetched = [sum(r) for r in requests]
    receive = math.isfinite(storage.receive_rate) and storage.receive_rate > 0
    remote = storage.latency_sec > 0 and checks
    order = list(dict.fromkeys(c.path for c in chunks)) if remote else []
    checked: dict[str, float] = {}
    checkers = [start] * CHECK_THREADS

    def send_check(k: int, at: float) -> None:
        """Send the check of the pass's ``k``-th file at ``at`` (if it has a file, not sent yet)."""
        if k < len(order) and order[k] not in checked:
            done = max(at, heapq.heappop(checkers)) + storage.request_sec(0)
            heapq.heappush(checkers, done)
            checked[order[k]] = done

    for k in range(min(CHECKS_AHEAD, len(order))):
        send_check(k, start)
    unread = {path: k for k, path in enumerate(order)}
    parsed: set[str] = set()

    def submit(i: int, at: float) -> float:
        """Send chunk ``i``'s requests at ``at`` (after parsing its file's footer): the time after."""
        if chunks[i].path not in parsed:
            parsed.add(chunks[i].path)
            at += footer_sec
        end = at
        for nbytes in requests[i]:
            free = heapq.heappop(threads)
            done = max(at, free) + storage.request_sec(nbytes)
            heapq.heappush(threads, done)
            end = max(end, done)
        ready[i] = end
        return at

    t = start
    wait = decode = 0.0
    first: float | None = None
    produced = 0
    for i, chunk in enumerate(chunks):
        opened = t
        if i not in ready:
            opened = submit(i, opened)
        pending = sum(fetched[j] for j in ready if j > i)
        j = max(ready) + 1
        while j < len(chunks) and pending + fetched[j] <= storage.read_ahead_bytes:
            opened = submit(j, opened)
            pending += fetched[j]
            j += 1
        k = unread.pop(chunk.path, -1)
        if k >= 0:  # the file's first read of the pass: one more check goes out
            if chunk.path not in checked:  # read before its check was sent: checked now
                checked[chunk.path] = opened + storage.request_sec(0)
            send_check(k + CHECKS_AHEAD, opened)
        t = max(opened, ready[i], checked.get(chunk.path, 0.0))
        wait += t - opened
        rows = chunk.num_rows or 0
        spent = rows / rate if rate > 0 else 0.0
        if receive:
            spent += fetched[i] / storage.receive_rate
        if first is None and produced + rows >= first_rows:
            first = t + spent * (first_rows - produced) / max(rows, 1)
        produced += rows
        decode += spent
        t += spent
    return (t if first is None else first), t, wait, decode


def startup_sec(files: int, storage: StorageModel) -> float:
    """Listing (a request per 1,000 files) and footers (one request each, 64 at once)."""
    return storage.request_sec(0) * (math.ceil(max(1, files) / 1000) + math.ceil(files / METADATA_THREADS))


def simulate(
    dataset: PlannedDataset,
    view: PlanView,
    storage: StorageModel,
    decode: DecodeModel,
    *,
    num_workers: int,
    cores_per_rank: float,
    worker_start_sec: float,
    step_sec: float = 0.0,
) -> Simulation:
    """Predict the epoch of ``view`` (see the module docstring)."""
    batching = dataset.options.batching
    rate = decode.worker_rate(num_workers, cores_per_rank)
    read_rows = max(batching.batch_size, READ_BATCH_ROWS)
    if num_workers > 0:  # a worker's first group: FIRST_GROUP_BATCHES batches (or GROUP_BYTES)
        group_rows = max(
            batching.batch_size,
            min(
                FIRST_GROUP_BATCHES * batching.batch_size,
                math.ceil(GROUP_BYTES / max(decode.arrow_bytes_per_row, 1e-9)),
            ),
        )
    else:
        group_rows = batching.batch_size
    start = (worker_start_sec if num_workers > 0 else 0.0) + decode.pass_sec
    if num_workers == 0 and decode.batch_sec > 0:
        # One process reads and hands out batches: its per-batch cost slows its rows.
        rate = 1.0 / (1.0 / rate + decode.batch_sec / batching.batch_size)
    cache: dict[str, pq.FileMetaData] = {}
    fs = getattr(getattr(dataset, "discovered", None), "fs", None)
    checks = not getattr(fs, "observes", False)  # S3: a file's first GET checks it
    workers: list[WorkerTime] = []
    ranks: list[RankTime] = []
    for r in range(view.num_ranks):
        mine: list[WorkerTime] = []
        batches = rows_total = fetched = 0
        for w in range(view.num_workers):
            chunks = list(view.chunks_for(r, w))
            requests = [chunk_requests(dataset, c, cache) for c in chunks]
            rows = sum(c.num_rows or 0 for c in chunks)
            first_rows = min(rows, max(group_rows, min(read_rows, chunks[0].num_rows or 0) if chunks else 0))
            first, finish, wait, dec = simulate_worker(
                chunks, requests, storage, rate, first_rows, start, decode.footer_sec, checks=checks
            )
            mine.append(
                WorkerTime(r, w, rows, len(chunks), sum(len(q) for q in requests), first, finish, wait, dec)
            )
            full, rest = divmod(rows, batching.batch_size)
            batches += full + (1 if rest and not batching.drop_last else 0)
            rows_total += rows
            fetched += sum(sum(q) for q in requests)
        workers += mine
        busy = [m for m in mine if m.rows]
        first_batch = busy[0].first_batch_sec if busy else start
        data = max((m.finish_sec for m in mine), default=start)
        # Decoding, receiving bytes and handing out batches share the rank's cores.
        receive = fetched / storage.receive_rate if math.isfinite(storage.receive_rate) else 0.0
        main = batches * decode.batch_sec
        cpu = (rows_total / decode.rows_per_sec * decode.cores_used + receive + main) / cores_per_rank
        data = max(data, start + cpu)
        if num_workers > 0:  # the main process hands out every batch while the workers read
            data = max(data, start + main)
        epoch = max(data, first_batch + batches * step_sec)
        stall = 0.0 if epoch <= 0 else max(0.0, epoch - batches * step_sec) / epoch
        ranks.append(RankTime(r, first_batch, data, epoch, batches, stall))
    return Simulation(
        storage=storage,
        decode=decode,
        startup_sec=startup_sec(len(dataset.files), storage),
        ranks=ranks,
        workers=workers,
        worker_start_sec=worker_start_sec if num_workers > 0 else 0.0,
        step_sec=step_sec,
    )


@dataclass(frozen=True)
class SimulateRequest:
    """What ``simulate`` is asked.

    Attributes:
        source: The dataset and its options (its plan and a chunk to measure).
        num_ranks: Ranks.
        num_workers: DataLoader workers per rank.
        epoch: The epoch simulated.
        storage: The storage model.
        decode_rate: Rows per second of one process, or ``None`` to measure one chunk.
        cores_per_rank: Cores each rank's processes share.
        worker_start_sec: Start-up of DataLoader workers, or ``None`` to measure it here.
        step_sec: The training step per batch (0: predict the loading alone).
        detail: Ranks listed (``-1``: all).
        as_json: Print JSON.
        picture: Draw the predicted epoch to this ``.png`` / ``.svg`` / ``.pdf`` file
            (a timeline per rank and worker, :func:`~.picture.draw_timeline`).
        picture_ranks: Ranks drawn at most.
        price_per_1000: What 1,000 GET / HEAD requests cost (the predicted requests are
            priced at it), or ``None``.
        list_price_per_1000: What 1,000 LIST / PUT requests cost (``None``: ``price_per_1000``).
    """

    source: Source
    num_ranks: int = 1
    num_workers: int = 0
    epoch: int = 0
    storage: StorageModel = StorageModel()
    decode_rate: float | None = None
    cores_per_rank: float = 1.0
    worker_start_sec: float | None = None
    step_sec: float = 0.0
    detail: int = 16
    as_json: bool = False
    picture: Path | None = None
    picture_ranks: int = 16
    price_per_1000: float | None = None
    list_price_per_1000: float | None = None

    def __post_init__(self) -> None:
        if self.decode_rate is not None:
            _at_least("decode_rate", self.decode_rate, "--decode-rate; leave it out to measure it")
        _at_least("cores_per_rank", self.cores_per_rank, "--cores-per-rank")
        if self.worker_start_sec is not None:
            _at_least("worker_start_sec", self.worker_start_sec, "--worker-start", zero=True)
        _at_least("step_sec", self.step_sec, "--step-ms", zero=True)


def _median_chunk(view: PlanView) -> Chunk | None:
    chunks = [c for w in range(view.num_workers) for c in view.chunks_for(0, w) if c.num_rows]
    if not chunks:
        return None
    chunks.sort(key=lambda c: c.num_rows or 0)
    return chunks[len(chunks) // 2]


def run_simulation(request: SimulateRequest) -> tuple[PlannedDataset, Simulation]:
    """Build the dataset, measure (or take) the decode rate, simulate."""
    workers = max(1, request.num_workers)
    dataset = open_dataset(request.source, num_ranks=request.num_ranks, num_workers=request.num_workers)
    view = plan_of(dataset, request.epoch, workers)
    if request.decode_rate is not None:
        decode = DecodeModel(
            rows_per_sec=request.decode_rate,
            batch_sec=measure_batch_overhead(),
            footer_sec=measure_footer(dataset),
            pass_sec=measure_pass_start(dataset),
        )
    else:
        chunk = _median_chunk(view)
        if chunk is None:
            decode = DecodeModel(rows_per_sec=1.0)
        else:
            decode = measure_decode(dataset, chunk, request.num_workers)
    sim = simulate(
        dataset,
        view,
        request.storage,
        decode,
        num_workers=request.num_workers,
        cores_per_rank=request.cores_per_rank,
        worker_start_sec=(
            measure_worker_start(request.num_workers)
            if request.worker_start_sec is None
            else request.worker_start_sec
        ),
        step_sec=request.step_sec,
    )
    return dataset, sim


def render_text(request: SimulateRequest, sim: Simulation) -> str:
    """The prediction for people: the model, time to first batch, epoch, straggler, ranks."""
    s, d = sim.storage, sim.decode
    bw = "unlimited" if math.isinf(s.bandwidth) else f"{size(s.bandwidth)}/s"
    how = f"measured on {d.measured_on}" if d.measured_on else "given"
    lines = [
        f"simulation of {request.source.describe()}: {len(sim.ranks):,} ranks x "
        f"{max(1, request.num_workers)} workers, epoch {request.epoch}",
        f"storage: {s.latency_sec * 1000:g} ms per request, {bw} per request, {s.concurrency} requests "
        f"in flight per worker, read-ahead {size(s.read_ahead_bytes)}"
        + ("" if math.isinf(s.receive_rate) else f", receiving {size(s.receive_rate)}/s per core"),
        f"decode: {d.rows_per_sec:,.0f} rows/s per process ({how}; {d.cores_used:.1f} cores busy), "
        f"{request.cores_per_rank:g} cores per rank",
        f"main process: {d.batch_sec * 1e6:,.0f} us per batch; worker start-up {sim.worker_start_sec:.2f} s; "
        f"pass start-up {d.pass_sec * 1000:.1f} ms; footer {d.footer_sec * 1000:.2f} ms per file",
        "",
        f"dataset start-up (listing, footers): {sim.startup_sec:.2f} s",
        f"time to first batch: {sim.first_batch_sec:.2f} s",
        f"epoch: {sim.epoch_sec:.2f} s (straggler: rank {sim.straggler.rank})",
    ]
    slow = sim.slowest_worker
    lines.append(
        f"slowest worker: rank {slow.rank} worker {slow.worker}: {slow.finish_sec:.2f} s for "
        f"{slow.rows:,} rows in {slow.chunks:,} chunks ({slow.requests:,} requests; waits "
        f"{slow.storage_wait_sec:.2f} s for storage, decodes {slow.decode_sec:.2f} s)"
    )
    epochs = Spread.of([r.epoch_sec for r in sim.ranks])
    lines.append(f"epoch per rank: min {epochs.min:.2f} s, mean {epochs.mean:.2f} s, max {epochs.max:.2f} s")
    if request.step_sec:
        stall = np.mean([r.stall_fraction for r in sim.ranks])
        lines.append(f"with a {request.step_sec * 1000:g} ms step per batch: stall about {100 * stall:.0f}%")
    shown = sim.ranks if request.detail < 0 else sim.ranks[: request.detail]
    lines += ["", "rank  first batch s  epoch s  batches  slowest worker s"]
    by_rank: dict[int, list[WorkerTime]] = {}
    for w in sim.workers:
        by_rank.setdefault(w.rank, []).append(w)
    for r in shown:
        worst = max(w.finish_sec for w in by_rank[r.rank])
        lines.append(
            f"{r.rank:>4}  {r.first_batch_sec:>13.2f}  {r.epoch_sec:>7.2f}  {r.batches:>7,}  {worst:>16.2f}"
        )
    if len(shown) < len(sim.ranks):
        lines.append(f"... {len(sim.ranks) - len(shown):,} more ranks (--detail N)")
    return "\n".join(lines)


def run_simulate(request: SimulateRequest) -> str:
    """Simulate and return the report (text or JSON), with the requests it sends and their cost."""
    dataset, sim = run_simulation(request)
    requests = predict_plan(dataset, request.epoch, request.num_workers)
    prices = (request.price_per_1000, request.list_price_per_1000)
    note = ""
    if request.picture is not None:
        from torch_dataloader_utils.tools.picture import draw_timeline

        drawn = draw_timeline(
            sim.workers,
            [(r.rank, r.epoch_sec) for r in sim.ranks],
            request.picture,
            max_ranks=request.picture_ranks,
            title=request.source.describe(),
        )
        lanes = len({(b.rank, b.worker) for b in drawn})
        note = f"\npicture: {request.picture} ({lanes:,} workers drawn)"
    if request.as_json:
        return json.dumps({**sim.as_dict(), "requests": requests.as_dict(*prices)}, indent=1)
    return render_text(request, sim) + "\n\n" + render_requests(requests, *prices) + note
