"""Logging: what discovery found and what the plan is (INFO), layouts that hurt (WARNING), pieces (DEBUG)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import torch_dataloader_utils.plan.summary as summary_module
from tests.fixtures.data import write_parquet_files
from tests.fixtures.iceberg import create_id_table, id_table
from torch_dataloader_utils import IcebergDataset, StructuredDataset

LOGGER = "torch_dataloader_utils"
ROWS = [1300, 170, 940, 55, 610]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    write_parquet_files(root, ROWS, row_group_size=100)
    return root


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name.startswith(LOGGER)]


def test_discovery_and_plan_at_info(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        StructuredDataset(str(data), num_ranks=2, rank=0, num_workers=2, batch_size=64, split_rows=200)
    found, left_out, plan = _records(caplog, logging.INFO)
    # Which row equal batches leave out (logged when this rank's plan is made), then the summary.
    assert left_out.startswith("equal_batches='drop' leaves out 1 row(s) in every epoch")
    size = sum(p.stat().st_size for p in data.glob("*.parquet"))
    assert found.startswith(f"found 5 parquet files under {str(data)!r}: 3,075 rows, {size / 1024:.1f} KiB, ")
    assert "33 row groups; schema: id: int64, x: float, label: int64, s: string" in found
    assert plan.startswith("plan of epoch 0: ")
    assert "of 5 files over 2 ranks x 2 workers, 3,074 rows" in plan
    assert "rows per rank min 1,537 max 1,537 (imbalance 1.00)" in plan
    assert "equal batches leave out 1 rows and pad 0" in plan
    assert _records(caplog, logging.WARNING) == []


def test_pruned_rows_and_partitions_are_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import pyarrow.compute as pc

    for year in (2023, 2024):
        write_parquet_files(tmp_path / f"year={year}", [300], row_group_size=100, start_id=year * 1000)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        StructuredDataset(str(tmp_path), partitioning="hive", filters=pc.field("id") < 2024100, num_workers=0)
    found = _records(caplog, logging.INFO)[0]
    assert "filters pruned 200 rows (0 files with no rows left)" in found
    assert found.endswith("; partitions: year (2 values)")


def test_only_rank_zero_logs(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        StructuredDataset(str(data), num_ranks=2, rank=1, num_workers=8)
    assert [r for r in caplog.records if r.name.startswith(LOGGER)] == []


def test_idle_workers_and_ranks_warn(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        StructuredDataset(str(data), num_workers=8)  # 5 files, one chunk each
        StructuredDataset(str(data), num_ranks=7, rank=0, num_workers=1, equal_batches="off")
    idle_workers, idle_ranks = _records(caplog, logging.WARNING)
    assert idle_workers.startswith("3 of 8 workers have nothing to read in epoch 0 ((rank, worker) (0, 5)")
    assert "Lower split_rows / split_bytes or num_workers" in idle_workers
    assert idle_ranks.startswith("2 of 7 ranks have nothing to read in epoch 0 (ranks 5, 6; 5 chunks in all)")


def test_large_chunk_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_parquet_files(tmp_path, [5000, 100, 100, 100, 100], row_group_size=[5000, 100, 100, 100, 100])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        StructuredDataset(str(tmp_path), num_workers=0)
    [message] = _records(caplog, logging.WARNING)
    assert message.startswith(
        f"chunk {tmp_path / 'part-0000.parquet'}[0:5000) holds 5,000 rows, 50x the median"
    )
    assert "torch-dataloader-utils reshard" in message


def test_many_small_files_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(summary_module, "SMALL_FILES_MIN_COUNT", 6)
    write_parquet_files(tmp_path, [50] * 6, row_group_size=50)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        StructuredDataset(str(tmp_path), num_workers=0)
    [message] = _records(caplog, logging.WARNING)
    assert message.startswith("6 files with a median size of ")
    assert message.endswith(
        "Rewrite them into about 1 files of ~128.0 MiB with `torch-dataloader-utils reshard`"
    )


def test_shuffle_with_one_file_per_batch_warns(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        # chunk order only: every batch of 64 rows comes from one chunk of 200
        StructuredDataset(
            str(data), shuffle=True, row_mixing=None, batch_size=64, split_rows=200, num_workers=0
        )
        # the row mixing (shuffle=True's default), the window and larger batches all mix files
        StructuredDataset(str(data), shuffle=True, batch_size=64, split_rows=200, num_workers=0)
        StructuredDataset(str(data), shuffle=True, row_shuffle_window=800, batch_size=64, num_workers=0)
        StructuredDataset(
            str(data), shuffle=True, row_mixing=None, batch_size=1024, split_rows=200, num_workers=0
        )
    [message] = _records(caplog, logging.WARNING)
    assert message.startswith(
        "shuffle=True shuffles the order of the 18 chunks, but rows keep their file order"
    )
    assert "median 200 rows >= batch_size=64" in message
    assert (
        "keep row_interleave on (its default) or set row_shuffle_window=800" in message
    )  # row_mixing's new name


def test_pieces_at_debug(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    dataset = StructuredDataset(str(data), num_workers=0, split_rows=500)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert sum(len(b["id"]) for b in dataset) == sum(ROWS)
    pieces = [m for m in _records(caplog, logging.DEBUG) if " read piece " in m]
    assert len(pieces) == len(dataset.plan(0).all_chunks())
    assert pieces[0].startswith(
        f"rank 0 worker 0 read piece 0: {data / 'part-0000.parquet'}[0:500), 500 rows in "
    )


def test_iceberg_discovery_at_info(iceberg_catalog, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    config, catalog = iceberg_catalog
    table = create_id_table(catalog)
    table.append(id_table(0, 40))
    table.append(id_table(40, 25))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        IcebergDataset("ns.t", catalog_config=config, num_workers=0)
    found, plan = _records(caplog, logging.INFO)
    assert found.startswith(
        f"Iceberg table 'ns.t' snapshot {table.current_snapshot().snapshot_id}: 2 data files: 65 rows"
    )
    assert "schema: id: int64, x: double, label: int64, s: string" in found
    assert "65 rows" in plan


def test_building_a_dataset_builds_few_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's summary (every rank's) comes from the plan's columns, not from chunk objects."""
    from torch_dataloader_utils.plan.chunks import ChunkTable

    built: list[str] = []
    chunk, chunks = ChunkTable.chunk, ChunkTable.chunks

    def one(self: ChunkTable, i: int) -> object:
        built.append("one")
        return chunk(self, i)

    def bulk(self: ChunkTable, index: object, padding: object = None) -> object:
        built.append("bulk")
        return chunks(self, index, padding)  # type: ignore[arg-type]

    monkeypatch.setattr(ChunkTable, "chunk", one)
    monkeypatch.setattr(ChunkTable, "chunks", bulk)
    write_parquet_files(tmp_path, [2001, 2000, 2000], row_group_size=10)
    ds = StructuredDataset(str(tmp_path), num_ranks=2, rank=0, num_workers=2, batch_size=64, split_rows=10)
    # Built: the largest chunk (the summary names it), the chunks cut to equalize, the row left out.
    assert "bulk" not in built
    assert 1 <= len(built) <= 12
    assert len(ds.plan(0).all_chunks()) > 600  # of 600 chunks
    assert len(ds.rank_plan(0).chunks_for(0)) > 10  # reading builds the worker's chunks
    assert "bulk" in built
