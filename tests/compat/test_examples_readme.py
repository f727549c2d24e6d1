"""Every code example of torch-dataloader-utils 0.2.0's README, run here (one process).

Each test makes the README's call with the README's arguments; only what names a
place is swapped: ``s3://my-bucket/...`` for a local S3 server (with its endpoint in
``storage_options``) or a local directory, the REST catalog for a SQLite catalog. The
data is described in ``tests/fixtures/examples020.py`` (``feature_a`` is the row id).
The multi-process examples (DDP, Accelerate) run in ``test_examples_launch.py``; the
outputs are listed in ``docs/migrating-from-0.2.md``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
import torch
from pyiceberg.expressions import GreaterThan
from torch.utils.data import DataLoader

from tests.fixtures.examples020 import EXAMPLE_SNAPSHOT, Data020, Recorder, ids_of, note
from tests.fixtures.s3 import KEY, SECRET, S3Server
from torch_dataloader_utils import IcebergDataset, Split, StructuredDataset

# date > "2024-01-01" keeps files 1 and 2.
AFTER_NEW_YEAR = list(range(200, 600))


@pytest.fixture(scope="module")
def s3_hive(s3_server: S3Server, data020: Data020) -> tuple[str, dict[str, Any]]:
    """The hive-partitioned files on the S3 server: (``s3://.../data/train/``, storage_options)."""
    prefix = s3_server.new_prefix()
    s3_server.fs().put(str(data020.hive) + "/", f"{prefix}/data/train/", recursive=True)
    return f"s3://{prefix}/data/train/", {"key": KEY, "secret": SECRET, "endpoint_url": s3_server.endpoint}


def test_file_based_formats(s3_hive: tuple[str, dict[str, Any]]) -> None:
    """README "API / File-Based Formats" (bucket: the local S3 server)."""
    path, storage = s3_hive
    loader, _dataset = StructuredDataset.create_dataloader(
        path=path,
        format="parquet",
        num_workers=None,
        batch_size=1024,
        columns=["feature_a", "feature_b", "label"],
        filters=pc.field("date") > "2024-01-01",
        shuffle=True,
        shuffle_seed=42,
        shuffle_buffer_size=50_000,
        split_bytes="128MiB",
        split_rows=None,
        split_strategy=None,
        output_format="torch",
        storage_options={
            "key": storage["key"],
            "secret": storage["secret"],
            "endpoint_url": storage["endpoint_url"],
        },
        partitioning="hive",
        num_ranks=1,
        rank=0,
        show_progress=False,
        progress_interval_sec=120.0,
    )
    batch = next(iter(loader))
    assert sorted(batch) == ["feature_a", "feature_b", "label"]
    assert all(isinstance(v, torch.Tensor) for v in batch.values())
    ids = ids_of(loader)
    note(ids, "torch int64/float64/int64 tensors, rows mixed by the shuffle buffer")
    assert sorted(ids) == AFTER_NEW_YEAR
    assert ids != AFTER_NEW_YEAR  # the row-level shuffle mixed them


def test_iceberg_tables(data020: Data020) -> None:
    """README "API / Iceberg Tables" (REST catalog: SQLite; snapshot 8271638172635 holds ids 0-299)."""
    loader, dataset = IcebergDataset.create_dataloader(
        table="my_catalog.my_db.my_table",
        catalog_config=data020.catalog_config,
        num_workers=4,
        batch_size=1024,
        columns=["feature_a", "feature_b", "label"],
        filters=pc.field("region_id") >= 5,
        snapshot_id=8271638172635,
        shuffle=True,
        split_bytes="64MiB",
        output_format="torch",
    )
    assert dataset.snapshot_id == EXAMPLE_SNAPSHOT
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == [i for i in range(300) if i % 10 >= 5]


def test_iceberg_scan_filter(data020: Data020) -> None:
    """README "Iceberg Tables", explicit two-layer control (``...``: the table and catalog above)."""
    loader, dataset = IcebergDataset.create_dataloader(
        table="my_catalog.my_db.my_table",
        catalog_config=data020.catalog_config,
        filters=pc.field("score") > 0.9,
        scan_filter=GreaterThan("partition_dt", 20240101),
    )
    assert len(dataset.files) == 1  # the partition 20240102 only
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == [i for i in range(450, 600) if i % 100 > 90]


def test_custom_strategy(data020: Data020) -> None:
    """README "Split Strategies": only ``generate(files, num_workers, epoch) -> list[Split]``."""

    class MyStrategy:
        def generate(self, files: Any, num_workers: int, epoch: int) -> list[Split]:
            return [Split(file=f) for f in files]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader, _ = StructuredDataset.create_dataloader(
            str(data020.train), "parquet", num_workers=2, split_strategy=MyStrategy()
        )
    assert any("older generate(files, num_workers, epoch)" in str(w.message) for w in caught)
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == data020.ids()


@pytest.mark.parametrize("num_workers", [None, 0, 4])
def test_num_workers(data020: Data020, num_workers: int | None) -> None:
    """README "num_workers": None (automatic), 0 (main process), 4."""
    loader, dataset = StructuredDataset.create_dataloader(
        str(data020.train), "parquet", num_workers=num_workers, split_rows=50
    )
    assert loader.num_workers == (4 if num_workers == 4 else dataset.num_workers)
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == data020.ids()


def test_collate_function(data020: Data020) -> None:
    """README "Collate Function" (``s3://my-bucket/data/train/``: a local directory)."""

    def my_collate(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.stack([batch["feature_a"], batch["label"]], dim=1)

    loader, _ = StructuredDataset.create_dataloader(
        path=str(data020.train),
        format="parquet",
        num_workers=4,
        batch_size=1024,
        collate_fn=my_collate,
    )
    batches = list(loader)
    assert all(isinstance(b, torch.Tensor) and b.shape[1] == 2 for b in batches)
    ids = sorted(int(i) for b in batches for i in b[:, 0])
    note(ids, f"{len(batches)} batches, each a tensor of shape [rows, 2] from my_collate")
    assert ids == data020.ids()


def test_escape_hatch_plain_dataloader(data020: Data020) -> None:
    """README "Advanced Usage": the dataset in a plain ``DataLoader(ds, batch_size=None, num_workers=4)``.

    (``accelerator.prepare(loader)`` runs in test_examples_launch.py.)
    """
    ds = StructuredDataset(path=str(data020.train), format="parquet", split_rows=50)
    loader = DataLoader(ds, batch_size=None, num_workers=4)
    batch = next(iter(loader))
    assert isinstance(batch["feature_a"], torch.Tensor)
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == data020.ids()


def test_set_epoch_training_loop(data020: Data020) -> None:
    """README "Epoch Reshuffling with set_epoch()" (``s3://bucket/data/``: a local directory)."""
    model = Recorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    num_epochs = 2
    loader, dataset = StructuredDataset.create_dataloader(
        path=str(data020.train),
        format="parquet",
        shuffle=True,
        shuffle_seed=42,
        num_workers=4,
    )
    orders = []
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            loss = model(batch)
            loss.backward()
            optimizer.step()
        orders.append(model.seen)
        model.seen = []
    for epoch, order in enumerate(orders):
        note(order, f"epoch {epoch}, loss.backward() + optimizer.step() per batch")
    assert [sorted(o) for o in orders] == [list(range(600))] * 2  # each epoch: every row once


def test_multi_rank_explicit(data020: Path | Data020) -> None:
    """README "DDP / Multi-Rank Usage": ``num_ranks`` / ``rank`` passed (as Horovod does), no process group.

    Two ranks in one process: together every row once, and equal batch counts.
    """
    assert isinstance(data020, Data020)
    got = []
    for rank in (0, 1):
        loader, _dataset = StructuredDataset.create_dataloader(
            path=str(data020.train), format="parquet", num_workers=2, batch_size=64, num_ranks=2, rank=rank
        )
        batches = list(loader)
        got.append((len(batches), ids_of(batches)))
    note(got[0][1] + got[1][1], f"rank 0: {got[0][0]} batches, rank 1: {got[1][0]} batches")
    assert got[0][0] == got[1][0]
    assert sorted(got[0][1] + got[1][1]) == data020.ids()
