"""0.2.0's public names, from its documented API: importable where its docs say, and usable."""

from __future__ import annotations

import importlib

import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils import (
    CheckpointMismatchError,
    DataFileInfo,
    IcebergDataFileInfo,
    ResumeStateError,
    StateMismatchError,
)

# The 9 top-level names of 0.2.0's __init__ and the module paths its docs import from.
TOP_LEVEL = [
    "CheckpointMismatchError",
    "DataFileInfo",
    "IcebergDataFileInfo",
    "Split",
    "SplitStrategy",
    "RoundRobinSplitStrategy",
    "SizeBalancedSplitStrategy",
    "StructuredDataset",
    "IcebergDataset",
    "TargetSizeSplitStrategy",
]
SUBMODULES = {
    "torch_dataloader_utils.splits": [
        "DataFileInfo",
        "IcebergDataFileInfo",
        "RowRange",
        "Split",
        "Shard",
        "SplitStrategy",
        "RoundRobinSplitStrategy",
        "SizeBalancedSplitStrategy",
    ],
    "torch_dataloader_utils.splits.core": [
        "DataFileInfo",
        "IcebergDataFileInfo",
        "RowRange",
        "Split",
        "Shard",
        "SplitStrategy",
    ],
    "torch_dataloader_utils.splits.round_robin": ["RoundRobinSplitStrategy"],
    "torch_dataloader_utils.splits.balanced": ["SizeBalancedSplitStrategy"],
    "torch_dataloader_utils.splits.target_size": ["TargetSizeSplitStrategy"],
}


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_top_level_name(name: str) -> None:
    assert name in tdu.__all__
    assert getattr(tdu, name) is not None


@pytest.mark.parametrize(("module", "names"), sorted(SUBMODULES.items()))
def test_documented_module_paths(module: str, names: list[str]) -> None:
    mod = importlib.import_module(module)
    for name in names:
        assert (
            getattr(mod, name)
            is getattr(importlib.import_module("torch_dataloader_utils.compat"), name, None)
            or getattr(mod, name) is tdu.SplitStrategy
        ), name


def test_version_succeeds_020() -> None:
    assert tuple(int(p) for p in tdu.__version__.split(".")) > (0, 2, 0)


def test_file_info_fields() -> None:
    f = DataFileInfo("a.parquet")
    assert (f.path, f.file_size, f.record_count) == ("a.parquet", None, None)
    g = IcebergDataFileInfo("b.parquet", 10, 2, partition={"region": "eu"}, snapshot_id=7)
    assert isinstance(g, DataFileInfo)
    assert (g.partition, g.snapshot_id) == ({"region": "eu"}, 7)


def test_checkpoint_mismatch_catches_our_state_mismatch() -> None:
    assert issubclass(StateMismatchError, CheckpointMismatchError)
    assert issubclass(CheckpointMismatchError, ResumeStateError)


def test_isinstance_recognizes_the_files_strategies_receive() -> None:
    from torch_dataloader_utils.plan.types import FileInfo
    from torch_dataloader_utils.storage.iceberg_meta import IcebergFileInfo

    plain = FileInfo("a.parquet", 10, 2)
    iceberg = IcebergFileInfo("b.parquet", 10, 2, partition={"dt": 1}, snapshot_id=7)
    assert isinstance(plain, DataFileInfo)
    assert not isinstance(plain, IcebergDataFileInfo)
    assert isinstance(iceberg, DataFileInfo)
    assert isinstance(iceberg, IcebergDataFileInfo)
    assert (iceberg.partition, iceberg.snapshot_id, iceberg.file_size, iceberg.record_count) == (
        {"dt": 1},
        7,
        10,
        2,
    )
    assert not isinstance("a.parquet", DataFileInfo)
