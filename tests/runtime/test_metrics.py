"""loader.metrics(): exact counters (rows, batches, chunks, bytes) and the loop's stall fraction."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import testsupport.latency_fs as latency

from tests.fixtures.data import write_parquet_files
from torch_dataloader_utils import LoaderMetrics, RankMetrics, WorkerMetrics, create_dataloader

ROWS = [1300, 170, 940, 55, 610]
BATCH = 64


def _column_bytes(path: Path) -> int:
    """What reading every column of every row group of a file reads: all but magic and footer."""
    meta = pq.read_metadata(path)
    size = path.stat().st_size - 12 - meta.serialized_size
    assert size == sum(
        meta.row_group(i).column(j).total_compressed_size
        for i in range(meta.num_row_groups)
        for j in range(meta.num_columns)
    )
    return size


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("metrics")
    write_parquet_files(root, ROWS, row_group_size=[200, 50, 300, 55, 100])
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_counters_equal_what_every_rank_and_worker_read(data: Path, workers: int) -> None:
    ranks = 2
    total_rows = total_batches = total_chunks = total_bytes = 0
    for rank in range(ranks):
        loader, dataset = create_dataloader(
            str(data),
            num_ranks=ranks,
            rank=rank,
            num_workers=workers,
            batch_size=BATCH,
            split_rows=150,
            equal_batches="off",
        )
        ids = [int(i) for batch in loader for i in batch["id"]]
        metrics = loader.metrics()
        assert isinstance(metrics, LoaderMetrics)
        [mine] = metrics.ranks
        assert isinstance(mine, RankMetrics)
        assert (mine.rank, mine.num_ranks, mine.epoch) == (rank, ranks, 0)
        plan = dataset.plan(0)
        assert [m.worker_id for m in mine.workers] == list(range(max(1, workers)))
        for m in mine.workers:
            chunks = plan.chunks_for(rank, m.worker_id)
            assert m.rows_read == sum(c.num_rows or 0 for c in chunks)
            assert m.chunks_done == m.files_read == len(chunks)
            assert m.bytes_fetched == m.bytes_needed > 0
            assert m.requests == m.retries == 0  # local files: no requests
            assert m.decode_sec > 0
            assert m.convert_sec > 0
            assert (m.transfer_sec > 0) == (workers > 0)
        total = mine.total
        assert total.rows_read == len(ids) == plan.rank_rows(rank)
        assert total.batches_read == len(loader)
        total_rows += total.rows_read
        total_batches += total.batches_read
        total_chunks += total.chunks_done
        total_bytes += total.bytes_fetched
        assert mine.first_batch_sec is not None
        assert mine.wait_sec >= mine.first_batch_sec
    files = sorted(data.glob("*.parquet"))
    assert total_rows == sum(ROWS)
    assert total_chunks == len(plan.all_chunks())
    # Every row group of every file read once over the ranks: all column chunks, nothing more.
    assert total_bytes == sum(_column_bytes(f) for f in files)


def test_remote_requests_and_bytes_match_the_store(tmp_path: Path) -> None:
    write_parquet_files(tmp_path, [3000, 2000], row_group_size=500)
    key = uuid.uuid4().hex
    loader, _ = create_dataloader(
        f"latency://{tmp_path}", storage_options={"stats_key": key}, num_workers=0, split_rows=1000
    )
    store = latency.stats(key)
    store.reset()  # discovery's listing and footers are not the loader's reads
    assert sum(len(b["id"]) for b in loader) == 5000
    m = loader.metrics().total
    assert m.requests == store.requests > 0
    assert m.bytes_fetched == store.bytes
    assert m.bytes_needed == sum(_column_bytes(f) for f in sorted(tmp_path.glob("*.parquet")))
    assert m.bytes_needed <= m.bytes_fetched
    assert m.storage_wait_sec >= 0
    assert m.retries == 0


def test_resume_counts_each_pass_and_every_row_once(data: Path) -> None:
    options: dict[str, Any] = {"batch_size": BATCH, "split_rows": 150, "num_workers": 2}
    loader, _ = create_dataloader(str(data), **options)
    it = iter(loader)
    head = [int(i) for _ in range(7) for i in next(it)["id"]]
    first = loader.metrics().total
    assert (first.rows_read, first.batches_read) == (len(head), 7)
    state = loader.state_dict()
    del it
    loader2, _ = create_dataloader(str(data), **{**options, "num_workers": 1})
    loader2.load_state_dict(state)
    left = loader2.remaining_batches  # batches of the rest of the epoch
    rest = [int(i) for b in loader2 for i in b["id"]]
    assert sorted(head + rest) == list(range(sum(ROWS)))
    [worker] = loader2.metrics().ranks[0].workers
    assert worker.rows_read == len(rest)
    assert worker.batches_read == left
    # The resumed pass's pieces: the rest of each interrupted worker's chunks, then the others.
    assert worker.chunks_done == worker.files_read


def test_equal_batches_padding_and_drops_are_counted(data: Path) -> None:
    ranks = 3
    padded = dropped = 0
    for rank in range(ranks):
        for policy in ("pad", "drop"):
            loader, dataset = create_dataloader(
                str(data), num_ranks=ranks, rank=rank, num_workers=0, batch_size=BATCH, equal_batches=policy
            )
            flags = [int(b["_is_padding"].sum()) for b in loader] if policy == "pad" else [0 for _ in loader]
            mine = loader.metrics().ranks[0]
            if policy == "pad":
                assert mine.total.rows_padded == sum(flags)
                padded += mine.total.rows_padded
            else:
                assert mine.rows_dropped == sum(c.num_rows or 0 for c in dataset.plan(0).dropped)
                dropped = mine.rows_dropped
    assert padded == (-sum(ROWS)) % ranks
    assert dropped == sum(ROWS) % ranks


def test_snapshot_is_a_copy_and_reset_clears(data: Path) -> None:
    loader, dataset = create_dataloader(str(data), num_workers=0, batch_size=BATCH)
    for _ in loader:
        pass
    snap = loader.metrics()
    snap.ranks[0].workers[0].rows_read = -1  # a copy: the recorder is not changed
    assert loader.metrics().total.rows_read == sum(ROWS)
    text = str(loader.metrics())
    assert "rank 0/1 epoch 0: stall" in text
    assert f"{sum(ROWS):,}" in text
    payload = json.loads(json.dumps(loader.metrics().as_dict()))
    assert payload["total"]["rows_read"] == sum(ROWS)
    assert payload["ranks"][0]["workers"][0]["worker_id"] == 0
    dataset.reset_metrics()
    empty = loader.metrics()
    assert empty.ranks[0].workers == ()
    assert empty.stall_fraction is None
    assert isinstance(empty.total, WorkerMetrics)
    assert empty.total.rows_read == 0


def _stall_after_start(loader: Any) -> float:
    """The stall fraction without the first batch (the workers' start-up, a fixed cost)."""
    rank = loader.metrics().ranks[0]
    wait = rank.wait_sec - (rank.first_batch_sec or 0.0)
    return float(wait / (wait + rank.between_sec))


@pytest.mark.parametrize("workers", [0, 2])
def test_stall_fraction_near_zero_for_a_slow_loop(data: Path, workers: int) -> None:
    loader, _ = create_dataloader(str(data), num_workers=workers, batch_size=BATCH)
    for _ in loader:
        time.sleep(0.01)  # the training step: far slower than reading a small batch
    stall = loader.metrics().stall_fraction
    assert stall is not None
    if workers == 0:
        assert stall < 0.3
    else:  # the receive thread keeps batches ready: past start-up, the loop never waits long
        assert _stall_after_start(loader) < 0.3


@pytest.mark.parametrize("workers", [0, 2])
def test_stall_fraction_near_one_for_a_slow_reader(tmp_path: Path, workers: int) -> None:
    write_parquet_files(tmp_path, [600, 600], row_group_size=100)
    loader, _ = create_dataloader(
        f"latency://{tmp_path}",
        storage_options={"delay": 0.02},
        read_ahead_bytes=1,  # no read-ahead: every chunk waits for its own requests
        num_workers=workers,
        batch_size=100,
        split_rows=100,
    )
    for _ in loader:
        pass  # the loop does nothing: it only waits for data
    metrics = loader.metrics()
    assert metrics.stall_fraction is not None
    assert metrics.stall_fraction > 0.7
    assert _stall_after_start(loader) > 0.7
    # Storage waits happen in the readers (two at once with workers): a large part of the loop's wait.
    waited = metrics.wait_sec - (metrics.ranks[0].first_batch_sec or 0.0)
    assert metrics.total.storage_wait_sec > 0.5 * waited


def test_direct_iteration_of_the_dataset_is_measured_too(data: Path) -> None:
    loader, dataset = create_dataloader(str(data), num_workers=0, batch_size=BATCH)
    ids = np.concatenate([b["id"].numpy() for b in dataset])
    assert len(ids) == sum(ROWS)
    total = loader.metrics().total
    assert total.rows_read == sum(ROWS)
    assert total.chunks_done == len(dataset.plan(0).all_chunks())
