"""0.2.0's documented options and README examples, run unchanged against local data."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
import torch

from tests.fixtures.data import WriteParquet
from tests.fixtures.iceberg import create_id_table, id_table, make_catalog
from torch_dataloader_utils import (
    CheckpointMismatchError,
    ConfigError,
    DataFileInfo,
    IcebergDataset,
    MissingDependencyError,
    OptionTypeError,
    StructuredDataset,
    UnknownOptionError,
)
from torch_dataloader_utils.runtime.metrics import WorkerMetrics


def _ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"]]


@pytest.fixture
def data(write_parquet: WriteParquet) -> str:
    return str(write_parquet([300, 100, 200], row_group_size=50)[0].parent)


def test_readme_file_example(data: str) -> None:
    # README "File-Based Formats", with a local path and no storage_options.
    loader, dataset = StructuredDataset.create_dataloader(
        path=data,
        format="parquet",
        num_workers=None,
        batch_size=64,
        columns=["id", "x", "label"],
        filters=pc.field("id") >= 0,
        shuffle=True,
        shuffle_seed=42,
        shuffle_buffer_size=120,
        split_bytes="128MiB",
        split_rows=None,
        split_strategy=None,
        output_format="torch",
        partitioning=None,
        num_ranks=1,
        rank=0,
        show_progress=False,
        progress_interval_sec=120.0,
    )
    for epoch in range(2):
        dataset.set_epoch(epoch)
        ids = _ids(loader)
        assert sorted(ids) == list(range(600))


def test_positional_format_and_files(data: str) -> None:
    paths = sorted(str(p) for p in Path(data).glob("*.parquet"))
    loader, _ = StructuredDataset.create_dataloader(data, "parquet", batch_size=100, num_workers=0)
    assert sorted(_ids(loader)) == list(range(600))
    ds = StructuredDataset(files=[DataFileInfo(p) for p in paths[:2]], format="parquet", batch_size=100)
    assert sorted(int(i) for b in ds for i in b["id"]) == list(range(400))
    loader, _ = StructuredDataset.create_dataloader(files=[DataFileInfo(paths[2])], format="parquet")
    assert sorted(_ids(loader)) == list(range(400, 600))


def test_shuffle_buffer_mixes_rows_exactly_once_and_resumes(data: str) -> None:
    loader, _ = StructuredDataset.create_dataloader(
        data, "parquet", batch_size=50, num_workers=2, shuffle_buffer_size=200, split_rows=50
    )
    full = _ids(loader)
    assert sorted(full) == list(range(600))
    assert full != sorted(full)  # rows mixed inside windows, chunk order kept (shuffle=False)
    it = iter(loader)
    head = [int(i) for _ in range(3) for i in next(it)["id"]]
    state = loader.state_dict()
    del it
    loader2, _ = StructuredDataset.create_dataloader(
        data, "parquet", batch_size=50, num_workers=1, shuffle_buffer_size=200, split_rows=50
    )
    loader2.load_state_dict(state)
    rest = _ids(loader2)
    assert sorted(head + rest) == list(range(600))


def test_get_metrics_and_reset(data: str, caplog: pytest.LogCaptureFixture) -> None:
    loader, dataset = StructuredDataset.create_dataloader(data, "parquet", batch_size=64, num_workers=2)
    dataset.set_epoch(0)
    for _ in loader:
        pass
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils"):
        metrics = dataset.get_metrics()
    assert [m.worker_id for m in metrics] == [0, 1]
    assert all(isinstance(m, WorkerMetrics) for m in metrics)
    assert sum(m.rows_read for m in metrics) == 600
    assert sum(m.batches_read for m in metrics) == len(loader)
    assert all(m.bytes_read > 0 and m.files_read >= 1 for m in metrics)
    assert "Epoch 0 complete" in caplog.text
    assert dataset.get_metrics() == []  # drained
    next(iter(loader))
    dataset.reset_metrics()
    assert dataset.get_metrics() == []


def test_show_progress_reports_rows(data: str, caplog: pytest.LogCaptureFixture) -> None:
    # Not a terminal here: progress goes to log lines (bars: tests/runtime/test_progress.py).
    loader, _ = StructuredDataset.create_dataloader(
        data, "parquet", batch_size=100, num_workers=0, show_progress=True, progress_interval_sec=0.01
    )
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils.progress"):
        assert sorted(_ids(loader)) == list(range(600))
    assert "600/600 rows (100.0%)" in caplog.text


def test_progress_interval_zero_writes_a_line_per_batch(data: str, caplog: pytest.LogCaptureFixture) -> None:
    # 0.2.0 passed progress_interval_sec to tqdm's mininterval: 0 redrew the bar at every batch.
    loader, _ = StructuredDataset.create_dataloader(
        data, "parquet", batch_size=100, num_workers=0, show_progress=True, progress_interval_sec=0
    )
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils.progress"):
        assert sorted(_ids(loader)) == list(range(600))
    lines = [r.getMessage() for r in caplog.records if r.name == "torch_dataloader_utils.progress"]
    assert [line.split(":")[1].split(" rows")[0].strip() for line in lines[:-1]] == [
        f"{n}/600" for n in range(100, 601, 100)
    ]
    assert lines[-1].endswith("done")


def test_elapsed_sec_of_a_full_read_in_one_batch(data: str) -> None:
    loader, dataset = StructuredDataset.create_dataloader(data, "parquet", batch_size=1000, num_workers=0)
    assert sorted(_ids(loader)) == list(range(600))
    (metrics,) = dataset.get_metrics()
    assert metrics.batches_read == 1
    assert metrics.elapsed_sec > 0  # from the start of the pass to its last batch, as in 0.2.0


def test_wrong_filters_type_is_a_type_error(data: str) -> None:
    # 0.2.0 raised TypeError; the error is still the library's ConfigError too.
    with pytest.raises(TypeError, match=r"filters=.*must be a pyarrow.compute.Expression") as caught:
        StructuredDataset.create_dataloader(data, "parquet", filters="id > 3", num_workers=0)
    assert isinstance(caught.value, OptionTypeError)
    assert isinstance(caught.value, ConfigError)


def test_show_progress_without_tqdm_is_an_import_error(data: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from torch_dataloader_utils.runtime import env

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tqdm" else real(name, *a)
    )
    monkeypatch.setattr(env, "stderr_is_terminal", lambda: True)
    with pytest.raises(ImportError, match="tqdm") as caught:  # as 0.2.0 raised
        StructuredDataset.create_dataloader(data, "parquet", show_progress=True, num_workers=0)
    assert isinstance(caught.value, MissingDependencyError)


def test_option_checks(data: str) -> None:
    with pytest.raises(UnknownOptionError, match="shuffle_buffer_size"):
        StructuredDataset.create_dataloader(data, "parquet", shuffle_bufer_size=10)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="progress_interval_sec=-1"):
        StructuredDataset.create_dataloader(data, "parquet", progress_interval_sec=-1)
    with pytest.raises(ValueError, match="only one"):
        StructuredDataset.create_dataloader(
            data, "parquet", shuffle=True, shuffle_buffer_size=5, row_shuffle_window=5
        )


def test_skip_instance_cache_in_storage_options(data: str) -> None:
    loader, _ = StructuredDataset.create_dataloader(
        f"file://{data}", "parquet", storage_options={"skip_instance_cache": True}, num_workers=0
    )
    assert sorted(_ids(loader)) == list(range(600))


def test_020_checkpoint_gives_clear_error(data: str) -> None:
    loader, _ = StructuredDataset.create_dataloader(data, "parquet", num_workers=0)
    old = {"epoch": 1, "_num_workers": 4, "_shuffle_seed": 42, "completed_shards": []}
    with pytest.raises(CheckpointMismatchError, match=r"0\.2\.0.*set_epoch\(1\)"):
        loader.load_state_dict(old)


def test_iceberg_catalog_name_and_storage_options(iceberg_catalog: Any) -> None:
    config, _ = iceberg_catalog
    catalog = make_catalog(config, name="local")  # SqlCatalog scopes tables by catalog name
    table = create_id_table(catalog)
    table.append(id_table(0, 50))
    named = {**config, "name": "local"}
    loader, _ = IcebergDataset.create_dataloader(
        "ns.t",
        catalog_config=named,
        batch_size=16,
        num_workers=0,
        storage_options={"skip_instance_cache": True, "s3.region": "us-east-1"},
    )
    assert sorted(_ids(loader)) == list(range(50))
    with pytest.raises(ValueError, match="storage_options key 'profile'"):
        IcebergDataset.create_dataloader("ns.t", catalog_config=named, storage_options={"profile": "x"})
    with pytest.raises(UnknownOptionError, match="did you mean 'storage_options'"):
        IcebergDataset.create_dataloader("ns.t", catalog_config=named, storage_option={})  # type: ignore[call-arg]


def test_outputs_are_tensors(data: str) -> None:
    loader, _ = StructuredDataset.create_dataloader(data, "parquet", batch_size=10, num_workers=0)
    batch = next(iter(loader))
    assert isinstance(batch["id"], torch.Tensor)
