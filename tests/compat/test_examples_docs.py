"""Every code example of torch-dataloader-utils 0.2.0's docs pages, run here (one process).

As in ``test_examples_readme.py``: the docs' calls with the docs' arguments; buckets
become a local S3 server or a local directory, REST / Glue catalogs a SQLite catalog,
``...`` the smallest code that makes the example run. One test per example, named
after its page (structured, iceberg, splits, training, observability, checkpoint,
index, limitations). The distributed page's examples and the multi-rank checkpoint
examples run in ``test_examples_launch.py``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from pyiceberg.expressions import GreaterThan
from torch.utils.data import DataLoader

from tests.fixtures.examples020 import EXAMPLE_SNAPSHOT, Data020, Recorder, ids_of, note
from tests.fixtures.s3 import KEY, SECRET, S3Server
from torch_dataloader_utils import (
    CheckpointMismatchError,
    DataFileInfo,
    IcebergDataset,
    StructuredDataset,
)
from torch_dataloader_utils.splits.core import IcebergDataFileInfo, Shard, Split

AFTER_NEW_YEAR = list(range(200, 600))


@pytest.fixture(scope="module")
def s3_train(s3_server: S3Server, data020: Data020) -> tuple[str, dict[str, Any]]:
    """The hive layout on the S3 server, and the storage_options reaching it."""
    prefix = s3_server.new_prefix()
    s3_server.fs().put(str(data020.hive) + "/", f"{prefix}/data/train/", recursive=True)
    return f"s3://{prefix}/data/train/", {"key": KEY, "secret": SECRET, "endpoint_url": s3_server.endpoint}


def _train(model: Recorder, loader: Any, dataset: Any, num_epochs: int) -> list[list[int]]:
    """The docs' training loop body; returns the ids seen per epoch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    per_epoch = []
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            loss = model(batch["feature_a"], batch["label"])
            loss.backward()
            optimizer.step()
        per_epoch.append(model.seen)
        model.seen = []
    return per_epoch


# -- structured.md ------------------------------------------------------------------
def test_structured_create_dataloader(s3_train: tuple[str, dict[str, Any]]) -> None:
    """structured.md "create_dataloader()" (bucket: the local S3 server)."""
    path, storage = s3_train
    loader, _dataset = StructuredDataset.create_dataloader(
        path=path,
        format="parquet",
        num_workers=None,
        batch_size=1024,
        columns=["feature_a", "feature_b", "label"],
        filters=pc.field("date") > "2024-01-01",
        shuffle=True,
        shuffle_seed=42,
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
    )
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == AFTER_NEW_YEAR


def test_structured_epoch_reshuffling(data020: Data020) -> None:
    """structured.md "Epoch Reshuffling" (``s3://bucket/data/``: a local directory)."""
    num_epochs = 2
    loader, dataset = StructuredDataset.create_dataloader(
        path=str(data020.train),
        format="parquet",
        shuffle=True,
        num_workers=4,
    )
    seen = []
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        seen.append(ids_of(loader))
    for epoch, ids in enumerate(seen):
        note(ids, f"epoch {epoch}")
    assert [sorted(s) for s in seen] == [data020.ids()] * num_epochs


class MyStrategy:
    """structured.md / splits.md "Custom Split Strategy": ``-> list[Shard]`` (body: files dealt in turn)."""

    def generate(self, files: list[DataFileInfo], num_workers: int, epoch: int) -> list[Shard]:
        shards = [Shard(id=w) for w in range(num_workers)]
        for i, f in enumerate(files):
            shards[i % num_workers].splits.append(Split(file=f))
        return shards


def test_structured_custom_strategy(data020: Data020) -> None:
    """structured.md / splits.md "Custom Split Strategy" (imports from ``splits.core``)."""
    with pytest.warns(UserWarning, match="older generate"):
        loader, _ = StructuredDataset.create_dataloader(
            str(data020.train), "parquet", num_workers=2, split_strategy=MyStrategy()
        )
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == data020.ids()


def test_structured_arrow_collate(data020: Data020) -> None:
    """structured.md, training.md, limitations.md: ``output_format="arrow"``, ``collate_fn=lambda x: x``."""
    loader, _ = StructuredDataset.create_dataloader(
        path=str(data020.train),
        format="parquet",
        output_format="arrow",
        collate_fn=lambda x: x,
    )
    batches = list(loader)
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    ids = ids_of(batches)
    note(ids)
    assert sorted(ids) == data020.ids()


def test_structured_direct_constructor(data020: Data020) -> None:
    """structured.md "Advanced: Direct Constructor": ``StructuredDataset(files=..., format="parquet")``.

    ``files=``: the directory's files as ``DataFileInfo``. (``accelerator.prepare``: launch tests.)
    """
    files = [DataFileInfo(str(p)) for p in sorted(data020.train.glob("*.parquet"))]
    ds = StructuredDataset(files=files, format="parquet", split_rows=50)
    loader = DataLoader(ds, batch_size=None, num_workers=4)
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == data020.ids()


# -- iceberg.md -----------------------------------------------------------------------
def test_iceberg_create_dataloader(data020: Data020) -> None:
    """iceberg.md "create_dataloader()" (REST catalog: SQLite; current snapshot: all 600 rows)."""
    loader, _dataset = IcebergDataset.create_dataloader(
        table="my_db.my_table",
        catalog_config=data020.catalog_config,
        num_workers=4,
        batch_size=1024,
        columns=["feature_a", "feature_b", "label"],
        filters=pc.field("region_id") >= 5,
        snapshot_id=None,
        shuffle=True,
        split_bytes="64MiB",
        output_format="torch",
    )
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == [i for i in range(600) if i % 10 >= 5]


def test_iceberg_two_layer_control(data020: Data020) -> None:
    """iceberg.md "Explicit Two-Layer Control" (``...``: table and catalog)."""
    loader, _dataset = IcebergDataset.create_dataloader(
        table="my_db.my_table",
        catalog_config=data020.catalog_config,
        scan_filter=GreaterThan("partition_dt", 20240101),
        filters=pc.field("score") > 0.9,
    )
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == [i for i in range(450, 600) if i % 100 > 90]


def test_iceberg_local_sqlite_catalog_config(data020: Data020) -> None:
    """iceberg.md "Catalog Config Examples / Local SQLite": a ``name``, no ``type`` (paths: the fixture's)."""
    catalog_config = {
        "name": "local",
        "uri": data020.catalog_config["uri"],
        "warehouse": data020.catalog_config["warehouse"],
    }
    loader, _ = IcebergDataset.create_dataloader(table="my_db.my_table", catalog_config=catalog_config)
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == data020.ids()


def test_iceberg_time_travel(data020: Data020) -> None:
    """iceberg.md "Time Travel": snapshot 8271638172635 holds ids 0-299."""
    catalog_config = data020.catalog_config
    loader, _ = IcebergDataset.create_dataloader(
        table="my_db.my_table",
        catalog_config=catalog_config,
        snapshot_id=8271638172635,
    )
    assert _.snapshot_id == EXAMPLE_SNAPSHOT
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == list(range(300))


# -- splits.md ------------------------------------------------------------------------
@pytest.mark.parametrize("split", [{"split_bytes": "64MiB"}, {"split_rows": 50_000}])
def test_splits_tune_chunk_size(data020: Data020, split: dict[str, Any]) -> None:
    """splits.md "TargetSizeSplitStrategy": ``split_bytes="64MiB"``, or ``split_rows=50_000``."""
    loader, _ = StructuredDataset.create_dataloader(str(data020.train), "parquet", num_workers=2, **split)
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == data020.ids()


def test_splits_partition_aware_strategy(data020: Data020) -> None:
    """splits.md "File Metadata": a strategy that reads ``IcebergDataFileInfo.partition``.

    ``...``: one shard per partition value, dealt to workers in turn.
    """
    seen: list[Any] = []

    class PartitionAwareStrategy:
        def generate(self, files: list[DataFileInfo], num_workers: int, epoch: int) -> list[Shard]:
            shards = [Shard(id=w) for w in range(num_workers)]
            for i, f in enumerate(files):
                if isinstance(f, IcebergDataFileInfo):
                    partition = f.partition
                    seen.append(partition)
                shards[i % num_workers].splits.append(Split(file=f))
            return shards

    with pytest.warns(UserWarning, match="older generate"):
        loader, _ = IcebergDataset.create_dataloader(
            "my_db.my_table",
            catalog_config=data020.catalog_config,
            num_workers=2,
            split_strategy=PartitionAwareStrategy(),
        )
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == data020.ids()
    note(ids, f"the strategy saw partitions {sorted(p['partition_dt'] for p in seen)}")
    assert sorted(p["partition_dt"] for p in seen) == [20231231, 20240101, 20240101, 20240102]


# -- training.md ----------------------------------------------------------------------
def test_training_loop(data020: Data020) -> None:
    """training.md "Training Loop" (``s3://bucket/data/``: a local directory)."""
    model = Recorder()
    num_epochs = 2
    loader, dataset = StructuredDataset.create_dataloader(
        path=str(data020.train),
        format="parquet",
        shuffle=True,
        num_workers=4,
        batch_size=1024,
    )
    per_epoch = _train(model, loader, dataset, num_epochs)
    for epoch, ids in enumerate(per_epoch):
        note(ids, f"epoch {epoch}")
    assert [sorted(s) for s in per_epoch] == [data020.ids()] * 2


def test_training_numpy_output(data020: Data020) -> None:
    """training.md "Output Formats": ``output_format="numpy"``, no collate_fn (``...``: path and format)."""
    loader, _ = StructuredDataset.create_dataloader(str(data020.train), "parquet", output_format="numpy")
    batches = list(loader)
    assert all(isinstance(b["feature_a"], np.ndarray) for b in batches)
    ids = ids_of(batches)
    note(ids)
    assert sorted(ids) == data020.ids()


# -- observability.md -----------------------------------------------------------------
def test_observability_logging_progress_and_metrics(
    data020: Data020, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """observability.md: ``logging.basicConfig``, ``split_bytes``, progress bars, ``get_metrics()``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    caplog.set_level(logging.INFO, logger="torch_dataloader_utils")
    loader, dataset = StructuredDataset.create_dataloader(str(data020.train), "parquet", split_bytes="64MiB")
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == data020.ids()

    loader, dataset = StructuredDataset.create_dataloader(
        path=str(data020.train),
        format="parquet",
        show_progress=True,
        progress_interval_sec=30,
    )
    num_epochs = 1
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        for _batch in loader:
            pass
        for m in dataset.get_metrics():
            print(f"worker={m.worker_id}  rows={m.rows_read:,}  bytes={m.bytes_read / 1e9:.2f} GB")
    out = capsys.readouterr()
    lines = [line for line in out.out.splitlines() if line.startswith("worker=")]
    summary = [line for line in caplog.text.splitlines() if "Epoch 0 complete" in line]
    with capsys.disabled():
        note([], "printed: " + " | ".join(lines) + "; logged: " + summary[0].split(" ", 2)[-1])
    assert len(lines) == loader.num_workers
    assert sum(int(line.split("rows=")[1].split()[0].replace(",", "")) for line in lines) == 600
    assert "Epoch 0 complete" in caplog.text
    # Progress: a tqdm bar on a terminal; here (stderr captured, not a terminal) log lines.
    progress = [r.getMessage() for r in caplog.records if r.name == "torch_dataloader_utils.progress"]
    assert "it/s" in out.err or any("600/600 rows" in line for line in progress)


def test_observability_json_logging(data020: Data020) -> None:
    """observability.md "JSON Logging" (needs python-json-logger, as in 0.2.0)."""
    pytest.importorskip("pythonjsonlogger")
    import io

    from pythonjsonlogger import jsonlogger

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(jsonlogger.JsonFormatter())
    logging.getLogger("torch_dataloader_utils").addHandler(handler)
    logger = logging.getLogger("torch_dataloader_utils")
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        loader, dataset = StructuredDataset.create_dataloader(str(data020.train), "parquet", num_workers=0)
        for _ in loader:
            pass
        dataset.get_metrics()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    note([], "JSON records: " + stream.getvalue().splitlines()[-1])
    assert any(r["message"].startswith("Epoch 0 complete") for r in records)


# -- checkpoint.md --------------------------------------------------------------------
def _loader(data020: Data020, **kw: Any) -> tuple[Any, Any]:
    return StructuredDataset.create_dataloader(
        path=str(data020.train),
        format="parquet",
        shuffle=True,
        shuffle_seed=kw.pop("shuffle_seed", 42),
        num_workers=kw.pop("num_workers", 8),
        split_rows=50,
        batch_size=64,
        **kw,
    )


def test_checkpoint_save_and_resume(
    data020: Data020, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """checkpoint.md "Saving a checkpoint" then "Resuming", with the crash after step 3 of epoch 1."""
    monkeypatch.chdir(tmp_path)
    model = Recorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    num_epochs = 3
    loader, dataset = _loader(data020)
    before: list[int] = []
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        for step, batch in enumerate(loader):
            loss = model(batch)
            loss.backward()
            optimizer.step()

            if step % 500 == 0:
                torch.save({
                    "model":   model.state_dict(),
                    "dataset": dataset.state_dict(),
                    "epoch":   epoch,
                    "step":    step,
                }, f"ckpt_{epoch}_{step}.pt")  # fmt: skip
            if epoch == 1:
                before.extend(int(i) for i in batch["feature_a"])
                if step == 3:  # the crash: save what the resume example loads, and stop
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                    torch.save({**state, "dataset": dataset.state_dict(), "epoch": epoch}, "checkpoint.pt")
                    break
        if epoch == 1:
            break
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.pt")) == ["ckpt_0_0.pt", "ckpt_1_0.pt"]
    assert 0 < len(before) < 600

    # "Resuming", unchanged (a fresh process would start here).
    model = Recorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader, dataset = _loader(data020)
    start_epoch = 0
    if os.path.exists("checkpoint.pt"):
        ckpt = torch.load("checkpoint.pt")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        dataset.load_state_dict(ckpt["dataset"])
        start_epoch = ckpt["epoch"]

    per_epoch = {}
    for epoch in range(start_epoch, num_epochs):
        if epoch != start_epoch:
            dataset.set_epoch(epoch)
        for batch in loader:
            model(batch)
        per_epoch[epoch], model.seen = model.seen, []
    note(
        before + per_epoch[1],
        f"epoch 1: {len(before)} rows before the crash + {len(per_epoch[1])} after resume",
    )
    note(per_epoch[2], "epoch 2 after the resume")
    assert start_epoch == 1
    assert sorted(before + per_epoch[1]) == data020.ids()  # epoch 1: every row once in all
    assert sorted(per_epoch[2]) == data020.ids()


def test_checkpoint_mismatch_is_caught(data020: Data020, caplog: pytest.LogCaptureFixture) -> None:
    """checkpoint.md "CheckpointMismatchError": another seed's state: a fresh epoch."""
    loader, dataset = _loader(data020, num_workers=0)
    it = iter(loader)
    next(it)
    ckpt = {"dataset": dataset.state_dict(), "epoch": 0}
    del it
    loader, dataset = _loader(data020, num_workers=0, shuffle_seed=7)
    start_epoch = None
    try:
        dataset.load_state_dict(ckpt["dataset"])
    except CheckpointMismatchError as e:
        logging.warning("Checkpoint incompatible, starting epoch from scratch: %s", e)
        start_epoch = 0
    note([], "caught: " + caplog.records[-1].getMessage()[:160] + "...")
    assert start_epoch == 0
    assert "shuffle_seed" in caplog.text


def test_checkpoint_020_state_dict_contents(data020: Data020) -> None:
    """checkpoint.md "What state_dict() contains": such a 0.2.0 state is refused, saying what to do."""
    _, dataset = _loader(data020, num_workers=0)
    state = {
        "epoch": 3,
        "_num_workers": 8,
        "_shuffle_seed": 42,
        "completed_shards": [
            {
                "splits": [
                    {"path": str(data020.train / "part-0.parquet"), "row_offset": 0, "row_length": 100},
                    {"path": str(data020.train / "part-1.parquet"), "row_offset": None, "row_length": None},
                ]
            },
        ],
    }
    with pytest.raises(CheckpointMismatchError, match=r"0\.2\.0.*set_epoch\(3\)") as raised:
        dataset.load_state_dict(state)
    note([], f"CheckpointMismatchError: {str(raised.value)[:150]}...")


# -- index.md -------------------------------------------------------------------------
def test_index_quick_start(data020: Data020) -> None:
    """index.md "Quick Start" (``s3://my-bucket/data/train/``: a local directory with a ``date`` column)."""
    model = Recorder()
    num_epochs = 2
    loader, dataset = StructuredDataset.create_dataloader(
        path=str(data020.train),
        format="parquet",
        num_workers=4,
        batch_size=1024,
        columns=["feature_a", "feature_b", "label"],
        filters=pc.field("date") > "2024-01-01",
        shuffle=True,
    )
    seen = []
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            loss = model(batch["feature_a"], batch["label"])
            loss.backward()
        seen.append(sorted(model.seen))
        model.seen = []
    for epoch, ids in enumerate(seen):
        note(ids, f"epoch {epoch}")
    assert seen == [AFTER_NEW_YEAR] * 2


def test_index_iceberg_quick_start(data020: Data020) -> None:
    """index.md "Quick Start" for Iceberg (REST catalog: SQLite)."""
    loader, _dataset = IcebergDataset.create_dataloader(
        table="my_db.my_table",
        catalog_config=data020.catalog_config,
        num_workers=4,
        batch_size=1024,
        filters=pc.field("region_id") >= 5,
    )
    ids = ids_of(loader)
    note(ids)
    assert sorted(ids) == [i for i in range(600) if i % 10 >= 5]


def test_index_one_interface(data020: Data020, s3_train: tuple[str, dict[str, Any]]) -> None:
    """index.md "One Interface Across Everything": S3 Parquet, GCS ORC (local), Glue Iceberg (SQLite).

    ``...``: the S3 endpoint, ``partitioning="hive"``; nothing for the others.
    """
    model = Recorder()
    path, storage = s3_train
    loaders = []
    loader, _ = StructuredDataset.create_dataloader(
        path=path, format="parquet", storage_options=storage, partitioning="hive"
    )
    loaders.append(loader)
    loader, _ = StructuredDataset.create_dataloader(path=str(data020.orc), format="orc")
    loaders.append(loader)
    loader, _dataset = IcebergDataset.create_dataloader(
        table="my_db.my_table",
        catalog_config=data020.catalog_config,
    )
    loaders.append(loader)
    for name, loader in zip(("S3 Parquet", "ORC", "Iceberg"), loaders, strict=True):
        for batch in loader:
            model(batch["feature_a"], batch["label"])
        note(model.seen, name)
        assert sorted(model.seen) == data020.ids()
        model.seen = []
