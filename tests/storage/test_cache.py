"""The node-local cache of remote byte ranges (``data_cache``): shared, checked, bounded, never fatal.

Remote files are reached through ``latency://`` (local files behind an fsspec filesystem
that logs every ranged read of every process to a file), so the tests count the
requests that really reached storage, across processes.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import testsupport.latency_fs as latency

from tests.bounds import assert_ends_within
from tests.fixtures.data import write_parquet_files
from torch_dataloader_utils import FileChangedError, StructuredDataset
from torch_dataloader_utils.storage.cache import (
    BLOCK,
    CACHE_DIRNAME,
    TRAILER_BYTES,
    FileKey,
    RangeCache,
    process_stats,
)

ROWS = [2000, 1500, 2500, 1000]
TOTAL = sum(ROWS)


def _options(log: Path, delay: float = 0.0) -> dict[str, Any]:
    return {"delay": delay, "stats_key": uuid.uuid4().hex, "request_log": str(log)}


def _dataset(root: Path, log: Path, cache: Path, delay: float = 0.0, **kwargs: Any) -> StructuredDataset:
    return StructuredDataset(
        f"latency://{root}",
        storage_options=_options(log, delay),
        data_cache=str(cache),
        output_format="arrow",
        batch_size=700,
        **kwargs,
    )


def _ids(dataset: StructuredDataset) -> list[int]:
    return sorted(i for b in dataset for i in b.column("id").to_pylist())


def _reads(log: Path, after: dict[int, int] | None = None) -> list[tuple[str, int, int]]:
    """Ranged reads in the log (of each pid, those after its ``after`` line count)."""
    if not log.exists():
        return []
    out = []
    seen: Counter[int] = Counter()
    for pid, path, start, end in latency.logged_requests(str(log)):
        seen[pid] += 1
        if path == "READY":
            continue
        if after is None or seen[pid] > after.get(pid, 0):
            out.append((path, start, end))
    return out


def _entries(cache: Path) -> list[Path]:
    root = cache / CACHE_DIRNAME / "files"
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name[0].isdigit() and "." not in p.name)


def _disk(cache: Path) -> int:
    """Bytes the cache's files take, in whole blocks (what du counts), usage file aside."""
    root = cache / CACHE_DIRNAME / "files"
    return sum(-(-p.stat().st_size // BLOCK) * BLOCK for p in root.rglob("*") if p.is_file())


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    write_parquet_files(tmp_path / "data", ROWS, row_group_size=500)
    return tmp_path / "data"


# -- shared by processes, fetched once ---------------------------------------------------
def _cold_reader(root: str, log: str, cache: str, barrier: Any, out: Any) -> None:
    dataset = _dataset(Path(root), Path(log), Path(cache), delay=0.02, split_rows=500)
    with open(log, "a") as fh:  # this process's discovery reads end here
        fh.write(f"{os.getpid()} READY -1 -1\n")
    barrier.wait(timeout=60)
    out.put((os.getpid(), _ids(dataset)))


def test_four_processes_cold_read_identical_rows_with_one_fetch_per_range(
    remote: Path, tmp_path: Path
) -> None:
    log, cache = tmp_path / "requests.log", tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [
        ctx.Process(target=_cold_reader, args=(str(remote), str(log), str(cache), barrier, out))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for _, ids in results:
        assert ids == list(range(TOTAL))
    # Discovery (each process reads the footers) comes before each process's READY line.
    ready: dict[int, int] = {}
    lines: Counter[int] = Counter()
    for pid, path, _, _ in latency.logged_requests(str(log)):
        lines[pid] += 1
        if path == "READY":
            ready[pid] = lines[pid]
    assert len(ready) == 4
    data_reads = _reads(log, ready)
    counts = Counter(data_reads)
    assert counts, "the readers fetched nothing"
    assert max(counts.values()) == 1, [r for r, c in counts.items() if c > 1]
    assert len({p for p, _, _ in counts}) == len(ROWS)
    assert len(_entries(cache)) == len(counts)  # one entry per range fetched


# -- checked on read ---------------------------------------------------------------------
def test_a_corrupted_entry_is_dropped_and_fetched_again(remote: Path, tmp_path: Path) -> None:
    log, cache = tmp_path / "requests.log", tmp_path / "cache"
    dataset = _dataset(remote, log, cache)
    assert _ids(dataset) == list(range(TOTAL))
    first = _reads(log)
    entries = _entries(cache)
    assert len(entries) >= len(ROWS)
    victim = entries[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one payload byte flipped: same length, wrong checksum
    victim.write_bytes(bytes(data))
    short = entries[2]
    short.write_bytes(short.read_bytes()[:-5])  # a torn entry: wrong length
    dropped = process_stats().dropped
    assert _ids(dataset) == list(range(TOTAL))
    assert process_stats().dropped == dropped + 2
    again = _reads(log)[len(first) :]
    start, stop = (int(v) for v in victim.name.split("-"))
    assert sorted((s, e) for _, s, e in again) == sorted(
        [(start, stop), tuple(int(v) for v in short.name.split("-"))]
    )
    assert victim.stat().st_size == stop - start + TRAILER_BYTES  # written again, whole
    assert _ids(dataset) == list(range(TOTAL))
    assert _reads(log)[len(first) + 2 :] == []  # and served from the cache after that


# -- a rewritten file ----------------------------------------------------------------------
def _fixed_width(path: Path, first: int, rows: int) -> None:
    """A file whose size depends on its row count only (no compression, dictionary or statistics)."""
    ids = np.arange(first, first + rows, dtype=np.int64)
    table = pa.table({"id": ids, "x": (ids * 3).astype(np.float64)})
    pq.write_table(table, path, compression="none", use_dictionary=False, write_statistics=False)


def test_a_rewritten_file_is_never_served_its_old_bytes(tmp_path: Path) -> None:
    root, log, cache = tmp_path / "data", tmp_path / "requests.log", tmp_path / "cache"
    root.mkdir()
    path = root / "a.parquet"
    _fixed_width(path, 0, 1000)
    old = _dataset(root, log, cache)
    assert _ids(old) == list(range(1000))
    size, mtime = path.stat().st_size, path.stat().st_mtime
    _fixed_width(path, 5000, 1000)  # same size, other rows
    os.utime(path, (mtime + 10, mtime + 10))
    assert path.stat().st_size == size
    new = _dataset(root, log, cache)
    assert _ids(new) == list(range(5000, 6000))
    assert len({p.parent for p in _entries(cache)}) == 2  # two versions, two keys
    # The old plan reads the version it planned, whole, from the cache, never a mix;
    # once a range must come from storage, the rewrite is found.
    assert _ids(old) == list(range(1000))
    RangeCache(str(cache), 1).clear()
    with pytest.raises(FileChangedError, match="changed after the dataset was built"):
        _ids(old)


# -- bounded, least recently used out first ------------------------------------------------
def _key(n: int) -> FileKey:
    return FileKey(f"latency://bucket/f{n}", 10_000_000, "1.0")


def test_eviction_keeps_the_cache_under_its_limit_and_the_recent_entries(tmp_path: Path) -> None:
    limit = 256 * 1024
    cache = RangeCache(str(tmp_path), limit)
    payload = os.urandom(20_000)
    keep = (_key(0), 0, len(payload))
    cache.put(*keep, payload)
    evictions = process_stats().evictions
    for i in range(60):
        key = _key(1 + i % 5)
        cache.put(key, i * 20_000, (i + 1) * 20_000, payload)
        assert cache.get(*keep) == payload  # used all along: never the least recent
        assert _disk(tmp_path) <= limit
        assert cache.recorded_usage() <= limit
    assert process_stats().evictions > evictions
    assert cache.get(_key(1), 0, 20_000) is None  # the oldest went first
    assert cache.get(_key(5), 59 * 20_000, 60 * 20_000) == payload
    assert not cache.put(_key(9), 0, limit // 2, os.urandom(limit // 2))  # too large: not cached


def _writer(directory: str, limit: int, offset: int) -> None:
    cache = RangeCache(directory, limit)
    for i in range(40):
        cache.put(_key(offset), i * 10_000, (i + 1) * 10_000, os.urandom(10_000))


def test_processes_writing_at_once_stay_under_the_limit(tmp_path: Path) -> None:
    limit = 192 * 1024
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), limit, n)) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert 0 < _disk(tmp_path) <= limit
    assert not list((tmp_path / CACHE_DIRNAME).rglob("*.tmp-*"))


# -- a full disk -----------------------------------------------------------------------------
FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys, uuid, warnings
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    warnings.simplefilter("always")
    import testsupport.latency_fs  # registers latency://
    from torch_dataloader_utils import StructuredDataset
    from torch_dataloader_utils.storage.cache import process_stats
    root, cache = sys.argv[1], sys.argv[2]
    ds = StructuredDataset(
        "latency://" + root, storage_options={"stats_key": uuid.uuid4().hex}, data_cache=cache,
        output_format="arrow", batch_size=1000,
    )
    ids = sorted(i for b in ds for i in b.column("id").to_pylist())
    assert ids == list(range(%d)), len(ids)
    print("bypassed", process_stats().bypassed, "stored", process_stats().bytes_stored)
    """
)


def test_a_full_disk_is_a_warning_and_a_bypass(remote: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK % TOTAL, str(remote), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "UserWarning: data_cache" in done.stderr
    assert "is full" in done.stderr
    assert "Free space there or lower data_cache_size" in done.stderr
    assert done.stderr.count("is full") == 1  # once, then reads bypass the cache quietly
    counts = dict(zip(done.stdout.split()[::2], (int(v) for v in done.stdout.split()[1::2]), strict=True))
    assert counts["bypassed"] >= 1
    assert counts["stored"] == 0
    assert not _entries(tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.tmp-*"))


# -- every format benefits ---------------------------------------------------------------
def test_a_second_pass_makes_no_request(remote: Path, tmp_path: Path) -> None:
    log, cache = tmp_path / "requests.log", tmp_path / "cache"
    loader_ds = _dataset(remote, log, cache, split_rows=700)
    assert _ids(loader_ds) == list(range(TOTAL))
    before = len(_reads(log))
    hits = process_stats().hits
    again = _dataset(remote, tmp_path / "other.log", cache, split_rows=700)  # a new job, same data
    discovery = len(_reads(tmp_path / "other.log"))
    assert _ids(again) == list(range(TOTAL))
    assert len(_reads(tmp_path / "other.log")) == discovery  # no byte from storage
    assert len(_reads(log)) == before
    assert process_stats().hits > hits


def test_text_and_orc_read_through_the_cache(tmp_path: Path) -> None:
    import pyarrow.orc as orc

    root = tmp_path / "data"
    root.mkdir()
    ids = np.arange(3000)
    (root / "a.csv").write_text("id,v\n" + "".join(f"{i},{i * 2}\n" for i in ids))
    orc_root = tmp_path / "orc"
    orc_root.mkdir()
    orc.write_table(pa.table({"id": ids, "v": ids * 2}), str(orc_root / "a.orc"), stripe_size=4096)
    for path, fmt in ((root, "csv"), (orc_root, "orc")):
        log, cache = tmp_path / f"{fmt}.log", tmp_path / f"{fmt}-cache"
        first = _dataset(path, log, cache, format=fmt, split_bytes=8192 if fmt == "csv" else None)
        assert _ids(first) == list(range(3000))
        assert _entries(cache)
        later = tmp_path / f"{fmt}-2.log"
        second = _dataset(path, later, cache, format=fmt, split_bytes=8192 if fmt == "csv" else None)
        discovery = len(_reads(later))
        assert _ids(second) == list(range(3000))
        assert len(_reads(later)) == discovery, fmt


def test_cache_command_shows_and_clears(
    remote: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torch_dataloader_utils.cli import main

    log, cache = tmp_path / "requests.log", tmp_path / "cache"
    _ids(_dataset(remote, log, cache))
    assert main(["cache", "show", str(cache), "--size", "1MiB"]) == 0
    shown = capsys.readouterr().out
    assert f"{len(ROWS)} files" in shown
    assert "part-0000.parquet" in shown
    assert "(latency " in shown  # the store each file came from
    assert "of 1.0 MiB (" in shown
    held = _disk(cache)
    assert main(["cache", "clear", str(cache)]) == 0
    assert "cleared" in capsys.readouterr().out
    assert not _entries(cache)
    assert held > 0
    assert main(["cache", "show", str(cache)]) == 0
    assert "empty" in capsys.readouterr().out
    assert main(["cache", "show", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_options_are_checked(remote: Path, tmp_path: Path) -> None:
    from torch_dataloader_utils import ConfigError, IncompatibleOptionsError

    with pytest.raises(ConfigError, match=r"data_cache='s3://b/c' must be a directory on this node"):
        StructuredDataset(str(remote), data_cache="s3://b/c")
    with pytest.raises(ConfigError, match=r"data_cache_size='lots' is not a size"):
        StructuredDataset(str(remote), data_cache=str(tmp_path), data_cache_size="lots")
    with pytest.raises(IncompatibleOptionsError, match=r"data_cache_prefetch=2 warms the data_cache"):
        StructuredDataset(str(remote), data_cache_prefetch=2)
    started = time.monotonic()
    local = StructuredDataset(str(remote), data_cache=str(tmp_path / "c"), output_format="arrow")
    assert _ids(local) == list(range(TOTAL))
    assert not (tmp_path / "c").exists()  # local files are never cached
    assert_ends_within(time.monotonic() - started, 6)  # no fetch, no wait: a few seconds at most


def test_entries_of_either_checksum_are_read_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch_dataloader_utils.storage.cache as cache_module

    payload = os.urandom(10_000)
    monkeypatch.setattr(cache_module, "_FAST", False)  # zlib's CRC-32: no google-crc32c here
    cache = RangeCache(str(tmp_path), 10**8)
    assert cache.put(_key(1), 0, len(payload), payload)
    path = Path(cache.entry_path(_key(1), 0, len(payload)))
    assert path.read_bytes()[-TRAILER_BYTES:][:4] == b"TDU2"
    assert cache.get(_key(1), 0, len(payload)) == payload
    monkeypatch.setattr(cache_module, "_FAST", True)  # CRC-32C where accelerated
    assert cache.get(_key(1), 0, len(payload)) == payload  # the older kind is still checked
    assert cache.put(_key(2), 0, len(payload), payload)
    crc32c_entry = Path(cache.entry_path(_key(2), 0, len(payload)))
    assert crc32c_entry.read_bytes()[-TRAILER_BYTES:][:4] == b"TDV2"
    monkeypatch.setattr(cache_module, "_FAST", False)
    dropped = process_stats().dropped
    assert cache.get(_key(2), 0, len(payload)) is None  # not computable here: a miss ...
    assert crc32c_entry.exists()  # ... not a damaged entry
    assert process_stats().dropped == dropped


def _cached_chunks(dataset: StructuredDataset, chunks: list[Any], cache: Path) -> list[bool]:
    """Whether every coalesced range of each chunk is in the cache."""
    from torch_dataloader_utils.storage.cached import file_key

    store = RangeCache(str(cache), 10**12)
    source = dataset.reader._source  # type: ignore[attr-defined]
    out = []
    for chunk in chunks:
        info = dataset.discovered.fs, chunk.path
        key = file_key(info[0], chunk.path, source._files[chunk.path].size, source._files[chunk.path].mtime)
        assert key is not None
        out.append(
            all(
                store.get(key, lo, hi) is not None
                for lo, hi in source._requests_of(chunk, source.metadata(chunk.path))
            )
        )
    return out


@pytest.mark.parametrize("prefetch", [0, 3])
def test_prefetch_warms_the_next_epochs_first_chunks(tmp_path: Path, prefetch: int) -> None:
    write_parquet_files(tmp_path / "data", [2000] * 4, row_group_size=250)
    log, cache = tmp_path / "requests.log", tmp_path / "cache"
    kwargs: dict[str, Any] = {"split_rows": 250, "shuffle": True, "num_ranks": 2, "rank": 0}
    if prefetch:
        kwargs["data_cache_prefetch"] = prefetch
    for seed in range(100):  # a seed where rank 0 reads next what it does not read now
        dataset = _dataset(tmp_path / "data", log, cache, shuffle_seed=seed, **kwargs)
        read_now = set(dataset.plan(0).chunks_for(0, 0))
        upcoming = list(dataset.plan(1).chunks_for(0, 0))[:3]
        if set(upcoming) - read_now:
            break
    assert set(upcoming) - read_now, "the test needs chunks of epoch 1 not read in epoch 0"
    _ids(dataset)  # epoch 0; warming runs on the fetch threads once they are idle
    deadline = time.monotonic() + 120  # polled: ends once warm; long only on a loaded machine
    while prefetch and not all(_cached_chunks(dataset, upcoming, cache)) and time.monotonic() < deadline:
        time.sleep(0.05)
    warmed = _cached_chunks(dataset, upcoming, cache)
    if prefetch:
        assert all(warmed)
    else:
        assert warmed == [c in read_now for c in upcoming]


def test_a_range_is_served_from_entries_that_cover_it(tmp_path: Path) -> None:
    """A chunk cut another way (another epoch's mix, another world) asks for other ranges."""
    data = os.urandom(400)
    cache = RangeCache(str(tmp_path), 10**8)
    for lo, hi in ((0, 100), (100, 250), (200, 300), (320, 400)):
        cache.put(_key(1), lo, hi, data[lo:hi])
    hits = process_stats().hits
    assert cache.get(_key(1), 50, 280) == data[50:280]
    assert cache.get(_key(1), 120, 180) == data[120:180]
    assert cache.get(_key(1), 0, 300) == data[:300]
    assert process_stats().hits == hits + 3
    assert cache.get(_key(1), 250, 350) is None  # a gap: fetched
    assert cache.get(_key(2), 0, 100) is None  # another file
