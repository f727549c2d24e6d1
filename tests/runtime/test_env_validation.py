"""World detection and validation: runtime/env.py is the only reader of the environment."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.utils.data

from torch_dataloader_utils.errors import ConfigError, DistributedConfigError
from torch_dataloader_utils.plan.types import World
from torch_dataloader_utils.runtime import env

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def set_launch(mp, rank: int, world: int, local_rank: int, local_world: int) -> None:
    for name, value in zip(LAUNCH_VARS, (rank, world, local_rank, local_world), strict=True):
        mp.setenv(name, str(value))


def test_defaults_to_one_process(clean_env):
    assert env.resolve_world(None, None) == World(1, 0)


def test_defaults_from_launcher_env(clean_env):
    set_launch(clean_env, 5, 8, 1, 4)
    assert env.resolve_world(None, None) == World(8, 5)


def test_explicit_values_without_runtime_are_used(clean_env):
    """The Horovod path: hvd.size() and hvd.rank() passed in, no RANK/WORLD_SIZE."""
    assert env.resolve_world(4, 3) == World(4, 3)


def test_local_rank_on_multi_node_job_says_pass_global_rank(clean_env):
    set_launch(clean_env, 5, 8, 1, 4)  # node 1 of 2 nodes x 4 ranks
    with pytest.raises(DistributedConfigError) as err:
        env.resolve_world(8, 1)
    msg = str(err.value)
    assert "rank=1 equals LOCAL_RANK but RANK=5" in msg
    assert "multi-node job: LOCAL_WORLD_SIZE=4 < WORLD_SIZE=8" in msg
    assert "pass the global rank (RANK=5)" in msg
    assert env.resolve_world(8, 5) == World(8, 5)


def test_only_one_of_rank_and_num_ranks_is_an_error(clean_env):
    with pytest.raises(DistributedConfigError, match=r"pass both num_ranks and rank or neither"):
        env.resolve_world(4, None)


def test_rank_out_of_range_is_an_error(clean_env):
    with pytest.raises(ConfigError, match=r"rank=4 must be < num_ranks=4"):
        env.resolve_world(4, 4)


def test_bad_env_value_is_named(clean_env):
    clean_env.setenv("RANK", "zero")
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistributedConfigError, match=r"RANK='zero' is not an int"):
        env.detect()


@pytest.fixture
def group(clean_env, tmp_path):
    """A real (one-process) gloo group; explicit values are checked against it."""
    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp_path / 'store'}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=10),
    )
    yield
    dist.destroy_process_group()


def test_initialized_group_is_the_default(group):
    assert env.detect().source == "torch.distributed"
    assert env.resolve_world(None, None) == World(1, 0)
    assert env.resolve_world(1, 0) == World(1, 0)


def test_disagreeing_with_initialized_group_names_both(group):
    with pytest.raises(DistributedConfigError) as err:
        env.resolve_world(2, 1)
    msg = str(err.value)
    assert "num_ranks=2, rank=1 disagree with the initialized process group (world size 1, rank 0)" in msg


def test_world_size_without_rank_is_an_error_not_one_rank(clean_env):
    """Hostile case 3: WORLD_SIZE=4 with RANK unset was planned as one rank, silently."""
    clean_env.setenv("WORLD_SIZE", "4")
    with pytest.raises(DistributedConfigError) as err:
        env.resolve_world(None, None)
    msg = str(err.value)
    assert "WORLD_SIZE=4 is set but RANK is not" in msg
    assert "would read the whole dataset" in msg
    assert "pass num_ranks= and rank= explicitly" in msg
    assert env.resolve_world(4, 2) == World(4, 2)  # explicit values need no launcher variables


def test_rank_without_world_size_is_an_error(clean_env):
    clean_env.setenv("RANK", "3")
    with pytest.raises(DistributedConfigError, match=r"RANK=3 is set but WORLD_SIZE is not"):
        env.resolve_world(None, None)


def test_lone_single_process_variables_are_harmless(clean_env):
    clean_env.setenv("WORLD_SIZE", "1")
    assert env.resolve_world(None, None) == World(1, 0)
    clean_env.delenv("WORLD_SIZE")
    clean_env.setenv("RANK", "0")
    assert env.resolve_world(None, None) == World(1, 0)


def test_rank_out_of_range_in_env_names_both_variables(clean_env):
    """Hostile case 3b: RANK=5 WORLD_SIZE=2 gave a plain ValueError from plan/."""
    clean_env.setenv("RANK", "5")
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistributedConfigError, match=r"RANK=5 and WORLD_SIZE=2 disagree"):
        env.resolve_world(None, None)


class _FreezeProbe(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Yields whether it runs in a worker, and the frozen objects before, after, and after a second call."""

    def __iter__(self) -> Iterator[tuple[bool, int, int, int]]:
        before = gc.get_freeze_count()
        slot = env.worker_slot()
        after = gc.get_freeze_count()
        env.worker_slot()  # once per process: nothing more
        yield slot.in_worker, before, after, gc.get_freeze_count()


def test_a_worker_freezes_what_it_inherited_once() -> None:
    """Issue 37: a forked worker's first full collection walked every inherited object (pandas': 1.36x)."""
    main_frozen = gc.get_freeze_count()
    loader = torch.utils.data.DataLoader(_FreezeProbe(), batch_size=None, num_workers=1)
    [(in_worker, before, after, again)] = list(loader)
    assert in_worker
    assert before == main_frozen
    assert after > before + 10_000  # torch's and pyarrow's objects at least
    assert again == after
    # The main process is left as it was.
    [(in_worker, _, after, _)] = list(_FreezeProbe())
    assert not in_worker
    assert after == main_frozen == gc.get_freeze_count()


def test_the_main_process_collects_once_before_its_first_workers_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: the first full collection came mid-epoch, walking every young object pandas' import made."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from torch_dataloader_utils import create_dataloader

    pq.write_table(pa.table({"id": np.arange(100)}), tmp_path / "t.parquet")
    monkeypatch.delitem(env._done_in, "collect", raising=False)
    full = gc.get_stats()[2]["collections"]
    loader, _ = create_dataloader(str(tmp_path), batch_size=10, num_workers=1)
    batches = iter(loader)
    first = next(batches)
    assert sorted(i for b in [first, *batches] for i in b["id"].tolist()) == list(range(100))
    assert env._done_in["collect"] == os.getpid()
    assert gc.get_stats()[2]["collections"] >= full + 1
    again = gc.get_stats()[2]["collections"]
    env.collect_before_fork()  # once per process
    assert gc.get_stats()[2]["collections"] == again
