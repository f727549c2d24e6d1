"""``simulate``: the worker model's arithmetic, requests as the fetcher sends them, the command's output.

Agreement with real runs (within 25% at 0, 10 and 50 ms per request) is checked by
``benchmarks/bench_simulate.py``, not here: it is a timing.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import testsupport.latency_fs as latency

from tests.fixtures.data import write_parquet_files
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.cli import main
from torch_dataloader_utils.io.prefetch import coalesce
from torch_dataloader_utils.plan.types import Chunk
from torch_dataloader_utils.tools.simulate import (
    DecodeModel,
    StorageModel,
    chunk_requests,
    simulate_worker,
)

CHUNKS = [Chunk("f", i * 100, (i + 1) * 100, num_rows=100, num_bytes=100) for i in range(3)]


def test_read_ahead_overlaps_fetching_with_decoding() -> None:
    storage = StorageModel(latency_sec=1.0, concurrency=8, read_ahead_bytes=10**6)
    first, finish, wait, decode = simulate_worker(CHUNKS, [[100]] * 3, storage, rate=100.0, first_rows=50)
    # All three fetched at once (1 s); then 1 s of decoding each.
    assert (first, finish, wait, decode) == (1.5, 4.0, 1.0, 3.0)


def test_without_read_ahead_every_chunk_waits() -> None:
    storage = StorageModel(latency_sec=1.0, concurrency=8, read_ahead_bytes=0)
    first, finish, wait, decode = simulate_worker(
        CHUNKS, [[100]] * 3, storage, rate=100.0, first_rows=100, start=0.5
    )
    assert (first, finish, wait, decode) == (2.5, 6.5, 3.0, 3.0)


def test_concurrency_and_bandwidth_bound_requests() -> None:
    storage = StorageModel(latency_sec=0.5, bandwidth=100.0, concurrency=2, read_ahead_bytes=0)
    # One chunk of 4 requests of 50 bytes: two rounds of (0.5 + 0.5) s on 2 connections.
    _, finish, wait, _ = simulate_worker(CHUNKS[:1], [[50, 50, 50, 50]], storage, rate=1e12, first_rows=1)
    assert wait == pytest.approx(2.0)
    assert finish == pytest.approx(2.0)


def test_workers_share_cores() -> None:
    model = DecodeModel(rows_per_sec=1000.0, cores_used=2.0)
    assert model.worker_rate(0, cores=2) == 1000.0
    assert model.worker_rate(2, cores=2) == 500.0
    assert model.worker_rate(4, cores=16) == 1000.0


def test_requests_are_those_the_fetcher_sends(tmp_path: Path) -> None:
    write_parquet_files(tmp_path, [3000, 2000], row_group_size=500)
    key = uuid.uuid4().hex
    loader, dataset = create_dataloader(
        f"latency://{tmp_path}",
        storage_options={"stats_key": key},
        num_workers=0,
        split_rows=1000,
        columns=["id", "s"],
    )
    source = dataset.reader._source  # type: ignore[attr-defined]
    chunks = dataset.plan(0).all_chunks()
    sizes = [chunk_requests(dataset, c) for c in chunks]
    assert sizes == [[hi - lo for lo, hi in coalesce(source.needed_ranges(c))] for c in chunks]
    store = latency.stats(key)
    store.reset()
    for _ in loader:
        pass
    # The ranged reads, plus one metadata request per file and pass (is it still the planned file?).
    assert store.requests == sum(len(s) for s in sizes) + len(dataset.files)
    assert store.bytes == sum(sum(s) for s in sizes)


def test_command_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_parquet_files(tmp_path, [1300, 170, 940, 55, 610], row_group_size=100)
    argv = ["simulate", str(tmp_path), "--num-ranks", "2", "--num-workers", "2", "--split-rows", "200"]
    assert main([*argv, "--latency-ms", "20", "--decode-rate", "10000", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["storage"]["latency_sec"] == 0.02
    assert sim["decode"]["measured_on"] is None
    assert [r["rank"] for r in sim["ranks"]] == [0, 1]
    assert sum(w["rows"] for w in sim["workers"]) == 3074  # 'drop' leaves one row out
    assert sim["epoch_sec"] == max(r["epoch_sec"] for r in sim["ranks"]) >= sim["first_batch_sec"] > 0.02
    # 768 rows per worker at 5,000 rows/s each (2 workers share 1 core): at least 0.15 s.
    assert all(w["decode_sec"] == pytest.approx(w["rows"] / 5000) for w in sim["workers"])
    assert main([*argv, "--latency-ms", "20", "--step-ms", "10"]) == 0
    text = capsys.readouterr().out
    assert "decode: " in text
    assert "rows/s per process (measured on " in text
    assert "time to first batch: " in text
    assert "epoch: " in text
    assert "(straggler: rank " in text
    assert "with a 10 ms step per batch: stall about " in text


def test_picture_draws_every_workers_predicted_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28, item 6: ``--picture`` existed on ``plan`` only; ``simulate`` draws its timeline."""
    pytest.importorskip("matplotlib")
    from torch_dataloader_utils.tools.picture import draw_timeline
    from torch_dataloader_utils.tools.simulate import SimulateRequest, run_simulation
    from torch_dataloader_utils.tools.source import Source

    write_parquet_files(tmp_path / "data", [3000, 2000, 2500], row_group_size=500)
    out = tmp_path / "epoch.png"
    argv = ["simulate", str(tmp_path / "data"), "--num-ranks", "3", "--num-workers", "2"]
    argv += [
        "--decode-rate",
        "200000",
        "--worker-start",
        "0.2",
        "--picture",
        str(out),
        "--picture-ranks",
        "2",
    ]
    assert main(argv) == 0
    assert f"picture: {out} (4 workers drawn)" in capsys.readouterr().out
    assert out.stat().st_size > 1000
    request = SimulateRequest(
        source=Source(path=str(tmp_path / "data")),
        num_ranks=3,
        num_workers=2,
        decode_rate=200000.0,
        worker_start_sec=0.2,
    )
    _, sim = run_simulation(request)
    drawn = draw_timeline(sim.workers, [(r.rank, r.epoch_sec) for r in sim.ranks], tmp_path / "t.svg")
    bars = {(b.rank, b.worker, b.kind): (b.start, b.end) for b in drawn}
    assert len(bars) == 2 * len(sim.workers)
    for w in sim.workers:
        assert bars[(w.rank, w.worker, "start")] == pytest.approx((0.0, w.first_batch_sec))
        assert bars[(w.rank, w.worker, "read")] == pytest.approx((w.first_batch_sec, w.finish_sec))
