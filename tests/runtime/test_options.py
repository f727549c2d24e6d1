"""The options model: every keyword declared once, checked once, typos named."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.data import WriteParquet
from torch_dataloader_utils import (
    ConfigError,
    IcebergDataset,
    ResumableDataLoader,
    StructuredDataset,
    UnknownOptionError,
    create_dataloader,
)
from torch_dataloader_utils.config import (
    BadDataConfig,
    BatchConfig,
    CacheConfig,
    CountConfig,
    FetchConfig,
    FileSourceConfig,
    IcebergSourceConfig,
    LoaderConfig,
    MixConfig,
    OutputConfig,
    ProgressConfig,
    ShuffleConfig,
    SplitConfig,
)
from torch_dataloader_utils.runtime.options import (
    FileLoaderOptions,
    FileReadOptions,
    IcebergLoaderOptions,
    IcebergReadOptions,
    LoaderOptions,
    MixedLoaderOptions,
    ReadOptions,
)

GROUPS = (
    BadDataConfig,
    BatchConfig,
    CacheConfig,
    CountConfig,
    FetchConfig,
    LoaderConfig,
    OutputConfig,
    ProgressConfig,
    ShuffleConfig,
    SplitConfig,
)
WORLD_KEYS = {"num_ranks", "rank"}  # resolved into a World by runtime.env
# Options of files only: text counts cached on disk; ranged reads of remote files.
FILE_ONLY = {"count_cache_dir", "read_ahead_bytes", "retries", "retry_backoff", "request_timeout"}


def _keys(typed: Any) -> set[str]:
    return set(typed.__required_keys__ | typed.__optional_keys__)


def _fields(config: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config)}


@pytest.mark.parametrize(
    ("typed", "source"),
    [
        (FileLoaderOptions, FileSourceConfig),
        (IcebergLoaderOptions, IcebergSourceConfig),
        (MixedLoaderOptions, FileSourceConfig),
    ],
)
def test_every_keyword_is_one_field_of_one_config(typed: Any, source: type) -> None:
    owners: dict[str, list[str]] = {}
    for config in (*GROUPS, source, *((MixConfig,) if typed is MixedLoaderOptions else ())):
        for name in _fields(config):
            owners.setdefault(name, []).append(config.__name__)
    for key in _keys(typed) - WORLD_KEYS:
        assert key in owners, f"option {key!r} of {typed.__name__} is in no config object"
        if key not in ("columns", "filters"):  # the source's, carried by the source config only
            assert len(owners[key]) == 1, f"option {key!r} is a field of {owners[key]}"
    # ... and every config field is reachable from the public keywords.
    allowed_missing = FILE_ONLY if typed is IcebergLoaderOptions else set()
    for config in GROUPS:
        unreachable = _fields(config) - _keys(typed) - allowed_missing
        assert not unreachable, f"{config.__name__} fields {unreachable} have no keyword"


def test_typed_dicts_compose() -> None:
    assert _keys(ReadOptions) < _keys(FileReadOptions) < _keys(FileLoaderOptions)
    assert _keys(ReadOptions) < _keys(IcebergReadOptions) < _keys(IcebergLoaderOptions)
    assert _keys(LoaderOptions) <= _keys(FileLoaderOptions) & _keys(IcebergLoaderOptions)
    assert not _keys(LoaderOptions) & _keys(FileReadOptions)


@pytest.fixture
def data(write_parquet: WriteParquet) -> str:
    return str(write_parquet([20, 10], row_group_size=10)[0].parent)


@pytest.mark.parametrize(
    ("typo", "closest"), [("shufle", "shuffle"), ("batchsize", "batch_size"), ("num_worker", "num_workers")]
)
def test_misspelled_keyword_names_the_closest_option(data: str, typo: str, closest: str) -> None:
    with pytest.raises(UnknownOptionError) as exc:
        create_dataloader(data, **{typo: True})  # type: ignore[arg-type]
    message = str(exc.value)
    assert f"create_dataloader() got an unknown option {typo}=True" in message
    assert f"did you mean {closest!r}?" in message
    assert isinstance(exc.value, TypeError)
    assert isinstance(exc.value, ConfigError)


def test_unknown_keyword_without_a_close_match(data: str) -> None:
    expected = r"unknown option zzz=1; the options are listed in FileLoaderOptions"
    with pytest.raises(UnknownOptionError, match=expected):
        create_dataloader(data, zzz=1)  # type: ignore[call-arg]


def test_loader_options_are_not_dataset_options(data: str) -> None:
    expected = r"StructuredDataset\(\) got an unknown option pin_memory=True"
    with pytest.raises(UnknownOptionError, match=expected):
        StructuredDataset(data, pin_memory=True)  # type: ignore[call-arg]


def test_iceberg_entry_points_name_themselves() -> None:
    with pytest.raises(UnknownOptionError, match=r"IcebergDataset\(\) got an unknown option shufle=True"):
        IcebergDataset("db.t", shufle=True)  # type: ignore[call-arg]
    expected = r"IcebergDataset.create_dataloader\(\) got an unknown option .*'catalog_config'"
    with pytest.raises(UnknownOptionError, match=expected):
        IcebergDataset.create_dataloader("db.t", catalog_configs={})  # type: ignore[call-arg]


def test_format_is_positional(data: str) -> None:
    loader, _ = create_dataloader(data, "parquet", num_workers=0, batch_size=10)
    assert isinstance(loader, ResumableDataLoader)
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(30))
    assert StructuredDataset(data, "parquet").discovered.format.value == "parquet"


def test_dataset_alone_reads_in_its_process_loader_sizes_itself(data: str) -> None:
    assert StructuredDataset(data).num_workers == 0
    loader, dataset = create_dataloader(data, num_workers=None)
    assert loader.num_workers == dataset.num_workers  # resolved once, by the dataset


def test_options_are_checked_before_discovery(tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing-here")
    # A bad value is reported before the (missing) path is listed.
    with pytest.raises(ConfigError, match="batch_size=0"):
        create_dataloader(missing, batch_size=0)


def test_every_reshard_keyword_is_one_field_of_one_config() -> None:
    from torch_dataloader_utils.config import ReshardConfig, ReshardSourceConfig
    from torch_dataloader_utils.runtime.options import ReshardKeywords

    owners: dict[str, list[str]] = {}
    for config in (ReshardConfig, ReshardSourceConfig):
        for name in _fields(config):
            owners.setdefault(name, []).append(config.__name__)
    destination = {"dst_storage_options", "dst_filesystem"}  # resolved into the destination's filesystem
    for key in _keys(ReshardKeywords) - destination:
        assert len(owners.get(key, [])) == 1, f"reshard option {key!r} is a field of {owners.get(key)}"
    assert set(owners) - _keys(ReshardKeywords) == {"src"}  # the positional argument


def test_a_misspelled_reshard_keyword_names_the_closest(tmp_path: Path) -> None:
    from torch_dataloader_utils import reshard

    with pytest.raises(
        UnknownOptionError, match=r"reshard\(\) got an unknown option targte_file_size=.*'target_file_size'"
    ):
        reshard(str(tmp_path), str(tmp_path / "out"), targte_file_size="1MiB")  # type: ignore[call-arg]
    assert not (tmp_path / "out").exists()
