"""The public surface: ``__all__`` is sorted, unique, complete, and every name resolves."""

from __future__ import annotations

import types

import pytest

import torch_dataloader_utils

# Helpers the top-level module imports for its own use; they are not part of the API.
NOT_EXPORTED = {"Any", "TYPE_CHECKING", "importlib"}


def test_all_is_sorted_and_unique() -> None:
    names = torch_dataloader_utils.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)


def test_every_exported_name_resolves() -> None:
    for name in torch_dataloader_utils.__all__:
        value = getattr(torch_dataloader_utils, name)
        assert value is not None, name
        assert getattr(value, "__module__", "").startswith("torch_dataloader_utils"), name


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from torch_dataloader_utils import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(torch_dataloader_utils.__all__)


def test_every_public_name_is_exported() -> None:
    for name in torch_dataloader_utils.__all__:  # load the lazy names too
        getattr(torch_dataloader_utils, name)
    public = {
        name
        for name, value in vars(torch_dataloader_utils).items()
        if not name.startswith("_")
        and name not in NOT_EXPORTED
        # Submodules (config, plan, ...) become attributes once imported; they are not names.
        and not (isinstance(value, types.ModuleType) and value.__name__.startswith("torch_dataloader_utils."))
    }
    assert public - set(torch_dataloader_utils.__all__) == set()


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        torch_dataloader_utils.NoSuchThing  # noqa: B018


def test_loader_offers_what_trainers_call() -> None:
    """``len``, ``remaining_batches``, ``set_epoch`` and ``sampler.set_epoch`` (issue 28, items 1-2)."""
    from torch_dataloader_utils.runtime.loader import EpochSampler

    loader = torch_dataloader_utils.ResumableDataLoader
    for name in ("__len__", "remaining_batches", "set_epoch", "sampler", "state_dict", "load_state_dict"):
        assert getattr(loader, name).__doc__, name
    assert callable(EpochSampler.set_epoch)


def test_request_counts_are_the_metrics_type() -> None:
    """``loader.metrics().request_counts`` (issue 34) is a public, typed value."""
    from torch_dataloader_utils.runtime.metrics import LoaderMetrics, RankMetrics
    from torch_dataloader_utils.storage.requests import RequestCounts

    assert torch_dataloader_utils.RequestCounts is RequestCounts
    rank = RankMetrics(0, 1, 0, (), discovery_requests=RequestCounts(lists=1, gets=3, bytes_received=9))
    got = LoaderMetrics((rank, rank)).request_counts
    assert got == RequestCounts(lists=2, gets=6, bytes_received=18)
    assert got.cost(0.4, 5.0) == (6 * 0.4 + 2 * 5.0) / 1000
