"""Object-storage benchmarks: latency hidden, requests per epoch, startup, data path.

Run one section per command (each is one command, for reruns on a quiet machine):

    PYTHONPATH=src:. python benchmarks/bench_s3.py --section latency --repeats 5 [--baseline-src OLD/src]
    PYTHONPATH=src:. python benchmarks/bench_s3.py --section requests --baseline-src /path/to/old/src
    PYTHONPATH=src:. python benchmarks/bench_s3.py --section startup --repeats 5 [--baseline-src OLD/src]
    PYTHONPATH=src:. python benchmarks/bench_s3.py --section coalesce
    PYTHONPATH=src:. python benchmarks/bench_s3.py --section data-path --repeats 3

Every section reads from a real S3 server (SeaweedFS on 127.0.0.1) through
``testsupport/latency_proxy.py``, a TCP proxy that delays every request by the same
amount for every client and counts the requests it forwards, by kind.

1. **latency**: 8 files x 400,000 rows (row groups of 100,000; 3 of 5 columns read) at
   0 and 20 ms per request: the library with ``num_workers=0`` and ``2``, and the floor,
   pyarrow's own ``ParquetFile(..., pre_buffer=True).iter_batches`` over the same row
   groups and columns through pyarrow's native S3 client. The configurations are
   interleaved in every repeat; medians and ranges, and each one's 20 ms / 0 ms ratio.
2. **requests**: the same files read by 2 ranks x 2 workers (one cold epoch, each rank
   building its dataset alone): the requests the proxy saw by kind, and what
   ``loader.metrics().request_counts`` said; with ``--baseline-src``, the same run
   with another copy of the library (e.g. the previous release) in the same command.
3. **coalesce**: GETs per epoch and bytes over-read for several coalescing holes,
   computed from the footers of a wide dataset (no timing).
4. **startup**: 1,000 small files at 10 ms per request: seconds from
   ``create_dataloader`` to the first batch (listing, every footer, the first chunk),
   median of ``--repeats``; the raw pyarrow dataset (lists, reads the first file) beside it.
5. **data-path**: no added latency: the library with ``storage_options`` and with
   ``filesystem=`` objects, and the raw pyarrow loop over each client.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from testsupport.latency_proxy import LatencyProxy
from testsupport.s3_server import BUCKET, KEY, SECRET, start_seaweedfs

from torch_dataloader_utils import create_dataloader

COLUMNS = ["id", "f0", "f1"]


def write_dataset(root: Path, files: int, rows: int, rg_rows: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        ids = np.arange(i * rows, (i + 1) * rows)
        table = pa.table(
            {
                "id": ids,
                "f0": rng.random(rows),
                "f1": rng.random(rows).astype(np.float32),
                "f2": rng.random(rows),
                "f3": rng.integers(0, 1 << 40, rows),
            }
        )
        pq.write_table(table, root / f"part-{i:05d}.parquet", row_group_size=rg_rows)


def library_rows(url: str, options: dict[str, Any] | None, **kwargs: Any) -> tuple[int, Any]:
    """Rows of one epoch, and the loader's request counts."""
    kwargs.setdefault("num_workers", 0)
    if kwargs["num_workers"]:
        kwargs.setdefault("multiprocessing_context", "fork")
    loader, _ = create_dataloader(
        url, storage_options=options, batch_size=65536, output_format="arrow", **kwargs
    )
    rows = sum(b.num_rows for b in loader)
    return rows, loader.metrics().request_counts


def _s3fs_subclass() -> type:
    import s3fs

    class MyS3(s3fs.S3FileSystem):  # a user's own subclass: bytes through it (fsspec path)
        pass

    return MyS3


def raw_rows(
    fs: pafs.FileSystem, paths: list[str], columns: list[str] | None, pre_buffer: bool = False
) -> int:
    rows = 0
    for p in paths:
        pf = pq.ParquetFile(p, filesystem=fs, pre_buffer=pre_buffer)
        for batch in pf.iter_batches(batch_size=65536, columns=columns):
            rows += batch.num_rows
    return rows


def native_fs(endpoint: str) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(
        access_key=KEY,
        secret_key=SECRET,
        endpoint_override=urlsplit(endpoint).netloc,
        scheme="http",
        region="us-east-1",
    )


class Store:
    """SeaweedFS with the benchmark data, behind a latency proxy."""

    def __init__(self, tmp: Path) -> None:
        workdir = tmp / "seaweedfs"
        workdir.mkdir()
        started = start_seaweedfs(workdir)
        if isinstance(started, str):
            raise SystemExit(f"SeaweedFS could not start: {started}")
        self.server, self._stop = started
        parts = urlsplit(self.server.endpoint)
        self.proxy = LatencyProxy(parts.hostname or "127.0.0.1", parts.port or 80)
        self.endpoint = self.proxy.start()
        self.fs = self.server.fs()

    def upload(self, local: Path, prefix: str) -> tuple[str, list[str]]:
        self.fs.put(str(local) + "/", f"{BUCKET}/{prefix}/", recursive=True)
        paths = sorted(p for p in self.fs.find(f"{BUCKET}/{prefix}") if p.endswith(".parquet"))
        return f"s3://{BUCKET}/{prefix}", paths

    def options(self) -> dict[str, Any]:
        return self.server.options(self.endpoint)

    def stop(self) -> None:
        self.proxy.stop()
        self._stop()


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


_EPOCH_RUN = """
import json, sys, time
from torch_dataloader_utils import create_dataloader
url, options, columns, workers, more, again = json.loads(sys.argv[1])
def epoch():
    extra = {"multiprocessing_context": "fork"} if workers else {}
    extra.update(more)
    began = time.perf_counter()
    loader, _ = create_dataloader(url, storage_options=options, batch_size=65536, output_format="arrow",
        columns=columns, num_workers=workers, **extra)
    built = time.perf_counter() - began
    return sum(b.num_rows for b in loader), built, loader
rows, built, loader = epoch()  # warm-up at the same latency: imports, clients, connections
if again:  # the next epoch of that loader: nothing listed or read but the epoch's own bytes
    loader.set_epoch(1)
    began = time.perf_counter()
    rows = sum(b.num_rows for b in loader)
    print(json.dumps([rows, time.perf_counter() - began, 0.0, loader.metrics().request_counts.total]))
else:
    began = time.perf_counter()
    rows, built, _ = epoch()
    print(json.dumps([rows, time.perf_counter() - began, built, None]))
"""


def _epoch_in(
    src: str, url: str, options: dict[str, Any], workers: int, again: bool = False, **more: Any
) -> tuple[int, Any, float, float]:
    """One epoch (after a warm-up one) in a process of its own importing the library from ``src``.

    ``more``: other keywords of ``create_dataloader``. ``again``: the timed epoch is the
    warm-up loader's next one (no dataset built). Returns its rows, its requests as the
    loader's metrics count them when ``again`` (else ``None``), its seconds and the
    seconds ``create_dataloader`` took (0 when ``again``).
    """
    here = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(here)])}
    args = json.dumps([url, options, COLUMNS, workers, more, again])
    out = subprocess.run(
        [sys.executable, "-c", _EPOCH_RUN, args], env=env, capture_output=True, text=True, check=True
    )
    rows, seconds, built, counted = json.loads(out.stdout.strip().splitlines()[-1])
    return int(rows), counted, float(seconds), float(built)


def bench_latency(
    store: Store, root: Path, repeats: int, delay: float, baseline: str | None = None
) -> list[str]:
    url, paths = store.upload(root, "latency")
    rows_total = sum(pq.read_metadata(p).num_rows for p in sorted(root.glob("*.parquet")))
    floor_fs = native_fs(store.endpoint)
    cases: dict[str, Callable[[], tuple[int, Any] | tuple[int, Any, float, float]]] = {
        "library, num_workers=0": lambda: library_rows(url, store.options(), columns=COLUMNS),
        "library, num_workers=2": lambda: library_rows(url, store.options(), columns=COLUMNS, num_workers=2),
        "floor: pyarrow pre_buffer=True": lambda: (raw_rows(floor_fs, paths, COLUMNS, pre_buffer=True), None),
    }
    if baseline:  # this tree and the baseline alike, each epoch in a process of its own
        here = str(Path(__file__).resolve().parents[1] / "src")
        cases = {"floor: pyarrow pre_buffer=True": cases["floor: pyarrow pre_buffer=True"]}
        for tree, src in (("this tree", here), ("baseline", baseline)):
            for workers in (0, 2):
                cases[f"{tree}, num_workers={workers}"] = functools.partial(
                    _epoch_in, src, url, store.options(), workers
                )
        # The start made for restarts: footers and file list from a warm metadata cache,
        # each file checked by its first read's response (no listing, no footer GET).
        meta = str(root.parent / "latency-meta.parquet")
        cached = {"metadata_cache": meta, "metadata_cache_check": "on_open"}
        for workers in (0, 2):
            cases[f"this tree, num_workers={workers}, warm metadata_cache (on_open)"] = functools.partial(
                _epoch_in, here, url, store.options(), workers, **cached
            )
        # A training run's every epoch after its first: the same loader, nothing built.
        for workers in (0, 2):
            cases[f"this tree, num_workers={workers}, the same loader's next epoch"] = functools.partial(
                _epoch_in, here, url, store.options(), workers, True
            )
    times: dict[tuple[str, float], list[float]] = {}
    requests: dict[tuple[str, float], Any] = {}
    chains: dict[tuple[int, float], list[float]] = {}
    builds: dict[tuple[str, float], list[float]] = {}  # seconds in create_dataloader (own processes)
    wire = _WireChain(store, url)
    loads = [load()]
    for name, fn in cases.items():  # warm-up: connections, imports
        if not baseline:
            assert fn()[0] == rows_total, name
    for steps in (2, 3):
        wire.run(steps)
    for _ in range(repeats):
        for d in (0.0, delay):
            store.proxy.delay = d
            for name, fn in cases.items():
                store.proxy.reset()
                began = time.perf_counter()
                got = fn()
                took = got[2] if len(got) == 4 else time.perf_counter() - began
                rows, counted = got[0], got[1]
                times.setdefault((name, d), []).append(took)
                if len(got) == 4 and got[3] > 0:
                    builds.setdefault((name, d), []).append(got[3])
                assert rows == rows_total, name
                requests[(name, d)] = (store.proxy.counts(), counted)
            for steps in (2, 3):
                chains.setdefault((steps, d), []).append(wire.run(steps))
    loads.append(load())
    ms = f"{delay * 1000:g} ms"
    lines = [
        f"{len(paths)} files, {rows_total:,} rows, columns {COLUMNS}; medians (ranges) of {repeats} "
        f"interleaved runs; {loads[0]} before, {loads[1]} after",
        "",
        f"| reader | 0 ms | {ms} | {ms} / 0 ms (median) | requests per epoch (proxy) |",
        "|---|---|---|---|---|",
    ]
    for name in cases:
        zero, slow = times[(name, 0.0)], times[(name, delay)]
        ratio = statistics.median(zero) / statistics.median(slow)
        seen, counted = requests[(name, delay)]
        if isinstance(counted, int):  # the next epoch of a loader: the process also built it
            kinds = f"{counted} (its metrics)"
        else:
            if name.startswith(("this tree", "baseline")):  # the warm-up epoch and the timed one
                seen = Counter({k: v // 2 for k, v in seen.items()})
            kinds = ", ".join(f"{v} {k}" for k, v in sorted(seen.items()))
            if counted is not None:
                kinds += f" (metrics: {counted.total})"
        lines.append(f"| {name} | {_spread(zero)} | {_spread(slow)} | **{ratio:.2f}** | {kinds} |")
    lines += [
        "",
        "Ratio: rows/s at the added latency over rows/s at 0 ms (time at 0 ms / time at the latency).",
        "",
    ]
    if builds:
        lines += [
            "**Before any worker starts** (same runs): `create_dataloader` lists the directory and reads "
            "the footers, each round trip waiting for the one before, and a DataLoader's workers are "
            "forked only when the loop starts, with the plan those make. What the latency adds there "
            "shows in the epoch whatever the workers hide after it: the last column is the ratio an "
            "epoch would have if nothing else showed it.",
            "",
            f"| reader | building the dataset, 0 ms | {ms} | added | ratio if only that showed |",
            "|---|---|---|---|---|",
        ]
        for name in cases:
            if (name, 0.0) not in builds:
                continue
            zero, slow = builds[(name, 0.0)], builds[(name, delay)]
            added = statistics.median(slow) - statistics.median(zero)
            epoch0 = statistics.median(times[(name, 0.0)])
            lines.append(
                f"| {name} | {_spread(zero)} | {_spread(slow)} | {added * 1000:.0f} ms | "
                f"{epoch0 / (epoch0 + added):.2f} |"
            )
        lines.append("")
    lines += [
        "**The wire** (same runs): requests that each wait for the one before, which no reader "
        "given a directory avoids (its names, then bytes), and what the latency adds to them. A reader "
        "whose epoch is longer than the chain can hide part of it behind its own work (the footers "
        "parsed, the plan made, workers started), so this is not a bound on the ratio.",
        "",
        f"| chain | 0 ms | {ms} | added by the latency (median) |",
        "|---|---|---|---|",
    ]
    for steps, what in (
        (2, "LIST, then one GET (any reader: the names, then bytes)"),
        (3, "LIST, a footer GET, a column-chunk GET (a Parquet reader reading the columns asked)"),
    ):
        zero, slow = chains[(steps, 0.0)], chains[(steps, delay)]
        added = statistics.median(slow) - statistics.median(zero)
        lines.append(f"| {what} | {_spread(zero)} | {_spread(slow)} | {added * 1000:.0f} ms |")
    return lines


class _WireChain:
    """Dependent requests through s3fs's client (no HEAD: sizes come from the listing)."""

    def __init__(self, store: Store, url: str) -> None:
        import s3fs

        self.fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **store.options())
        self.prefix = url.removeprefix("s3://")
        self.proxy = store.proxy

    def run(self, steps: int) -> float:
        """Seconds for the chain of ``steps`` requests (checked: exactly that many reach the server)."""
        self.proxy.reset()
        began = time.perf_counter()
        listed = self.fs.ls(self.prefix, detail=True, refresh=True)
        first = min((f for f in listed if f["name"].endswith(".parquet")), key=lambda f: f["name"])
        size = int(first["size"])
        if steps == 2:
            data = self.fs.cat_file(first["name"], start=0, end=min(size, 65536))
        else:
            tail = self.fs.cat_file(first["name"], start=size - 65536, end=size)
            length = int.from_bytes(tail[-8:-4], "little")
            meta = pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-(length + 8) :]))
            column = meta.row_group(0).column(0)
            start = column.dictionary_page_offset or column.data_page_offset
            data = self.fs.cat_file(first["name"], start=start, end=start + column.total_compressed_size)
        took = time.perf_counter() - began
        assert data
        assert sum(self.proxy.counts().values()) == steps, self.proxy.counts()
        return took


_REQUESTS_RUN = """
import json, sys
from torch_dataloader_utils import create_dataloader
url, options, ranks, workers = json.loads(sys.argv[1])
total, ids = {}, 0
for rank in range(ranks):
    loader, _ = create_dataloader(url, storage_options=options, num_ranks=ranks, rank=rank,
        num_workers=workers, multiprocessing_context="fork", batch_size=8192, output_format="arrow",
        columns=["id", "f0", "f1"])
    ids += sum(b.num_rows for b in loader)
    m = loader.metrics()
    counted = getattr(m, "request_counts", None)
    if counted is not None:
        for k, v in counted.as_dict().items():
            total[k] = total.get(k, 0) + v
    else:
        total["total"] = total.get("total", 0) + m.total.requests
print(json.dumps({"rows": ids, "metrics": total}))
"""


def bench_requests(
    store: Store, root: Path, baseline: str | None, ranks: int = 2, workers: int = 2
) -> list[str]:
    url, paths = store.upload(root, "requests")
    store.proxy.delay = 0.0
    here = str(Path(__file__).resolve().parents[1] / "src")
    trees = [("this tree", here)] + ([("baseline", baseline)] if baseline else [])
    lines = [
        f"{len(paths)} files ({ranks} ranks x {workers} workers, one cold epoch, each rank building its "
        f"dataset alone; columns {COLUMNS}); requests as the proxy saw them; {load()}",
        "",
        "| library | LIST | HEAD | GET | PUT | total | metrics() said |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, src in trees:
        store.proxy.reset()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(Path(here).parent)])}
        args = json.dumps([url, store.options(), ranks, workers])
        out = subprocess.run(
            [sys.executable, "-c", _REQUESTS_RUN, args], env=env, capture_output=True, text=True, check=False
        )
        if out.returncode:
            lines.append(f"| {name} ({src}) | failed: {out.stderr.strip().splitlines()[-1:]} |")
            continue
        got = json.loads(out.stdout.strip().splitlines()[-1])
        seen = store.proxy.counts()
        said = got["metrics"]
        lines.append(
            f"| {name} | {seen['LIST']} | {seen['HEAD']} | {seen['GET']} | {seen['PUT']} | "
            f"{sum(seen.values())} | {said.get('total')} "
            + (f"({said['lists']} LIST, {said['heads']} HEAD, {said['gets']} GET)" if "lists" in said else "")
            + " |"
        )
    return lines


_FIRST_BATCH_RUN = """
import json, sys, time
from torch_dataloader_utils import create_dataloader
url, options = json.loads(sys.argv[1])
seconds = []
for _ in range(2):  # the first warms imports and clients up; the second is timed
    began = time.perf_counter()
    loader, _ = create_dataloader(url, storage_options=options, num_workers=0)
    next(iter(loader))
    seconds.append(time.perf_counter() - began)
print(json.dumps(seconds[-1]))
"""


def _first_batch_in(src: str, url: str, options: dict[str, Any]) -> float:
    """Seconds to the first batch (after a warm-up start) in a process importing the library from ``src``."""
    here = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(here)])}
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_BATCH_RUN, json.dumps([url, options])],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def bench_startup(
    store: Store, tmp: Path, repeats: int, files: int, delay: float, baseline: str | None = None
) -> list[str]:
    """Seconds to the first batch over many small files, on ``latency://`` and on S3 behind the proxy."""
    import uuid

    import testsupport.latency_fs as latency

    small = tmp / "small"
    write_dataset(small, files=files, rows=50, rg_rows=50)
    url, _ = store.upload(small, "startup")

    def library(where: str) -> float:
        t = time.perf_counter()
        if where in ("s3", "s3fs", "s3-workers"):
            store.proxy.delay = delay
            options = store.options()
            if where == "s3fs":  # an option with no native equivalent: footers through s3fs
                options["s3_additional_kwargs"] = {}
            workers: dict[str, Any] = {"num_workers": 0}
            if where == "s3-workers":
                workers = {"num_workers": 2, "multiprocessing_context": "fork"}
            loader, _ = create_dataloader(url, storage_options=options, **workers)
        else:
            options = {"delay": delay, "stats_key": uuid.uuid4().hex}
            loader, _ = create_dataloader(f"latency://{small}", storage_options=options, num_workers=0)
        next(iter(loader))
        return time.perf_counter() - t

    def raw(where: str) -> float:
        t = time.perf_counter()
        if where == "s3":
            store.proxy.delay = delay
            fs: pafs.FileSystem = native_fs(store.endpoint)
            dataset = pads.dataset(f"{BUCKET}/startup", format="parquet", filesystem=fs)
        else:
            slow = latency.LatencyFileSystem(delay=delay, stats_key=uuid.uuid4().hex)
            fs = pafs.PyFileSystem(pafs.FSSpecHandler(slow))
            dataset = pads.dataset(str(small), format="parquet", filesystem=fs)
        next(iter(dataset.to_batches()))
        return time.perf_counter() - t

    def footers() -> float:
        """The no-library floor of reading every footer: pyarrow's native client, sized fragments."""
        from concurrent.futures import ThreadPoolExecutor

        t = time.perf_counter()
        store.proxy.delay = delay
        fs = native_fs(store.endpoint)
        listed = [(i.path, i.size) for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/startup"))]
        parquet = pads.ParquetFileFormat()

        def one(item: tuple[str, int]) -> int:
            fragment = parquet.make_fragment(item[0], filesystem=fs, file_size=item[1])
            fragment.ensure_complete_metadata()
            return int(fragment.metadata.num_rows)

        with ThreadPoolExecutor(64) as pool:
            rows = sum(pool.map(one, listed))
        assert rows == files * 50
        return time.perf_counter() - t

    before = load()
    cases: dict[tuple[str, str], list[float]] = {
        ("library", "latency"): [],
        ("library", "s3"): [],
        ("library", "s3fs"): [],
        ("library", "s3-workers"): [],
        ("raw", "latency"): [],
        ("raw", "s3"): [],
        ("footers", "s3"): [],
    }
    run = {"library": library, "raw": raw}
    trees: dict[str, str] = {}
    if baseline:  # this tree and the baseline alike, in processes of their own
        trees = {"this tree": str(Path(__file__).resolve().parents[1] / "src"), "baseline": baseline}
        for tree in trees:
            cases[(tree, "s3")] = []
    for _ in range(repeats):
        for who, where in cases:
            if who in trees:
                store.proxy.delay = delay
                cases[(who, where)].append(_first_batch_in(trees[who], url, store.options()))
                continue
            cases[(who, where)].append(footers() if who == "footers" else run[who](where))
    where_text = {
        "latency": f"`latency://` (local files, {delay * 1000:g} ms per request)",
        "s3": f"SeaweedFS behind the proxy ({delay * 1000:g} ms per request)",
        "s3fs": "same, footers through s3fs (`s3_additional_kwargs={}`: the fallback)",
        "s3-workers": "same, `num_workers=2` (forked workers read the first chunks)",
    }
    lines = [
        f"{files:,} files of 50 rows; median (range) of {repeats} interleaved runs; {before} before, "
        f"{load()} after",
        "",
        "| seconds to first batch | store | median (range) |",
        "|---|---|---|",
    ]
    for (who, where), values in cases.items():
        name = {
            "library": f"library (listing, {files:,} footers read concurrently, then the first chunk)",
            "raw": "raw pyarrow dataset (lists, reads only the first file)",
            "footers": f"raw pyarrow, every footer (lists, {files:,} sized fragments' metadata, 64 threads)",
            "this tree": "this tree, in a process of its own (second start of the process)",
            "baseline": f"baseline ({baseline}), the same way",
        }[who]
        lines.append(f"| {name} | {where_text[where]} | {_spread(values)} |")
    return lines


def bench_coalesce(tmp: Path) -> list[str]:
    """GETs per epoch and bytes over-read for several coalescing holes (from the footers: no timing)."""
    from torch_dataloader_utils.io.prefetch import COALESCE_HOLE, coalesce, column_ranges

    rng = np.random.default_rng(0)
    root = tmp / "wide"
    root.mkdir()
    rows, groups, files = 200_000, 4, 4
    table = pa.table(
        {
            **{f"x{i}": rng.random(rows) for i in range(12)},  # 400 KB per row group each
            **{f"flag{i}": rng.integers(0, 2, rows).astype(np.int8) for i in range(12)},  # ~13 KB
        }
    )
    names = table.column_names
    for f in range(files):
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=rows // groups)
    metas = [pq.read_metadata(p) for p in sorted(root.glob("*.parquet"))]
    projections = {
        "every other wide column": names[0:12:2],
        "every other narrow column": names[12:24:2],
        "every column": None,
    }
    lines = [
        f"{files} files x {groups} row groups; 12 float64 columns (~400 KB per row group) and 12 "
        "int8 columns (~13 KB); one chunk per row group",
        "",
        "| columns read | hole | GETs per epoch | bytes fetched / needed | KiB fetched (needed) |",
        "|---|---|---|---|---|",
    ]
    for what, columns in projections.items():
        for hole in (0, 4096, COALESCE_HOLE, 1024**2):
            gets = fetched = needed = 0
            for meta in metas:
                for g in range(meta.num_row_groups):
                    ranges = column_ranges(meta, [g], columns)
                    merged = coalesce(ranges, hole=hole)
                    gets += len(merged)
                    fetched += sum(hi - lo for lo, hi in merged)
                    needed += sum(hi - lo for lo, hi in ranges)
            mark = {COALESCE_HOLE: " (the library's)", 4096: " (0.7.0's)"}.get(hole, "")
            lines.append(
                f"| {what} | {hole:,} B{mark} | {gets} | {fetched / needed:.3f} | "
                f"{fetched / 1024:,.0f} ({needed / 1024:,.0f}) |"
            )
    return lines


def bench_data_path(store: Store, root: Path, repeats: int) -> list[str]:
    import s3fs

    url, paths = store.upload(root, "data-path")
    store.proxy.delay = 0.0
    opts = store.options()
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
    native = native_fs(store.endpoint)
    via_s3fs = pafs.PyFileSystem(pafs.FSSpecHandler(fs))
    plain = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
    subclass = _s3fs_subclass()(skip_instance_cache=True, **opts)
    cases: dict[str, Callable[[], Any]] = {
        "raw pyarrow loop, native S3FileSystem": lambda: raw_rows(native, paths, COLUMNS),
        "raw pyarrow loop, s3fs via FSSpecHandler": lambda: raw_rows(via_s3fs, paths, COLUMNS),
        "library, storage_options": lambda: library_rows(url, opts, columns=COLUMNS)[0],
        "library, storage_options with an s3fs-only option": lambda: library_rows(
            url, {**opts, "version_aware": False}, columns=COLUMNS
        )[0],
        "library, filesystem=s3fs.S3FileSystem(...)": lambda: library_rows(
            url, None, filesystem=plain, columns=COLUMNS
        )[0],
        "library, filesystem=a subclass of s3fs": lambda: library_rows(
            url, None, filesystem=subclass, columns=COLUMNS
        )[0],
    }
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            times.setdefault(name, []).append(time.perf_counter() - t)
    base = statistics.median(times["raw pyarrow loop, native S3FileSystem"])
    lines = [
        f"SeaweedFS on 127.0.0.1, no added latency; median (range) of {repeats}; {load()}",
        "",
        "| reader | seconds | time / raw native loop |",
        "|---|---|---|",
    ]
    for name, values in times.items():
        lines.append(f"| {name} | {_spread(values)} | {statistics.median(values) / base:.2f}x |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    sections = ["latency", "requests", "startup", "coalesce", "data-path"]
    parser.add_argument("--section", choices=[*sections, "all"], default="all")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--files", type=int, default=8, help="files of the throughput dataset")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added latency of the latency section")
    parser.add_argument("--startup-files", type=int, default=1000)
    parser.add_argument("--startup-ms", type=float, default=10.0)
    parser.add_argument(
        "--baseline-src",
        help="another copy of the library's src/ (requests section; latency and startup sections: both "
        "trees then run in processes of their own, interleaved)",
    )
    args = parser.parse_args()
    wanted = set(sections) if args.section == "all" else {args.section}
    tmp = Path(tempfile.mkdtemp(prefix="tdu-bench-s3-"))
    store = Store(tmp) if wanted - {"coalesce"} else None
    try:
        big = tmp / "big"
        write_dataset(big, files=args.files, rows=400_000, rg_rows=100_000)
        out: list[str] = []
        if store is not None and "latency" in wanted:
            lines = bench_latency(store, big, args.repeats, args.latency_ms / 1000, args.baseline_src)
            out += ["## Latency hidden", "", *lines, ""]
        if store is not None and "requests" in wanted:
            out += ["## Requests per epoch", "", *bench_requests(store, big, args.baseline_src), ""]
        if store is not None and "startup" in wanted:
            lines = bench_startup(
                store, tmp, args.repeats, args.startup_files, args.startup_ms / 1000, args.baseline_src
            )
            out += ["## Startup", "", *lines, ""]
        if "coalesce" in wanted:
            out += ["## Coalescing", "", *bench_coalesce(tmp), ""]
        if store is not None and "data-path" in wanted:
            out += ["## Data path", "", *bench_data_path(store, big, args.repeats), ""]
        print("\n".join(out))
    finally:
        if store is not None:
            store.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
