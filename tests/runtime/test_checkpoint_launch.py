"""Checkpointers on 2 processes: torch.distributed.checkpoint (torchrun) and Accelerate's save_state.

DCP keeps one copy of an entry whose key is the same on every rank: the loader's own
state is keyed by rank (``{"rank<r>": JSON}``), so ``{"data": loader}`` keeps each rank's.
Accelerate writes what rank 0 holds, so it stores :class:`~torch_dataloader_utils.GatheredState`
(every rank's state merged, under one fixed key), which DCP also takes (and which resumes
on any number of ranks).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed.checkpoint.stateful import Stateful

from tests.fixtures.data import WriteParquet
from tests.fixtures.e2e import assert_exactly_once, epoch_ids
from tests.fixtures.s3 import free_ports
from torch_dataloader_utils import GatheredState, ResumeStateError, create_dataloader

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).with_name("dcp_scripts")
ROWS = [100, 100, 100, 100]
TOTAL = sum(ROWS)


def _run(cmd: list[str], cwd: Path, timeout: float = 150) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(REPO / "src"), HF_HOME=str(cwd / "hf_home"), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"timed out after {timeout}s: {cmd}")
    assert proc.returncode == 0, out[-4000:]


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


@pytest.fixture
def data(write_parquet: WriteParquet) -> Path:
    return write_parquet(ROWS, row_group_size=25)[0].parent


def test_the_loader_is_stateful_and_gathered_state_round_trips_in_process(data: Path) -> None:
    loader, _ = create_dataloader(str(data), batch_size=16, shuffle=True, num_workers=0)
    assert isinstance(loader, Stateful)
    assert isinstance(GatheredState(loader), Stateful)
    it = iter(loader)
    seen = epoch_ids([next(it), next(it)])
    saved = GatheredState(loader).state_dict()
    assert set(saved) == {"format", "state"}
    assert isinstance(saved["state"], str)  # one JSON leaf: the same entry on every rank
    fresh, _ = create_dataloader(str(data), batch_size=16, shuffle=True, num_workers=2)
    GatheredState(fresh).load_state_dict(saved)
    assert_exactly_once(seen + epoch_ids(fresh), range(TOTAL))
    with pytest.raises(ResumeStateError, match="not a GatheredState"):
        GatheredState(fresh).load_state_dict(loader.state_dict())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["loader", "gathered"])
def test_dcp_save_and_load_on_two_ranks_keeps_each_ranks_state(data: Path, tmp_path: Path, mode: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    cmd = [
        _bin("torchrun"),
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_ports(1)[0]}",
        str(SCRIPTS / "roundtrip.py"),
        str(data),
        str(tmp_path / "ckpt"),
        str(out),
        mode,
    ]
    _run(cmd, tmp_path)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    entries = {k for k in results[0]["keys"] if k.startswith("data.")}
    # The loader's entry: one per rank (DCP keeps one copy of a key every rank has).
    assert entries == ({"data.rank0", "data.rank1"} if mode == "loader" else {"data.format", "data.state"})
    for r in results:
        assert r["weights"]
        assert sorted(r["resumed"]) == sorted(r["expected"])  # this rank's rest, not rank 0's
    assert_exactly_once([i for r in results for i in r["seen"] + r["resumed"]], range(TOTAL))


@pytest.mark.slow
def test_accelerate_save_state_kill_and_resume_on_two_processes(data: Path, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    out = tmp_path / "out"
    out.mkdir()
    for phase in ("first", "resumed"):
        cmd = [
            _bin("accelerate"),
            "launch",
            "--multi_gpu",
            "--num_processes=2",
            "--num_machines=1",
            "--mixed_precision=no",
            "--dynamo_backend=no",
            "--main_process_ip=127.0.0.1",
            f"--main_process_port={free_ports(1)[0]}",
            str(SCRIPTS / "accelerate_resume.py"),
            str(data),
            str(out),
            phase,
        ]
        _run(cmd, tmp_path)
    lines = [json.loads(line) for r in range(2) for line in (out / f"rank{r}.jsonl").read_text().splitlines()]
    ranks = [
        [json.loads(line) for line in (out / f"rank{r}.jsonl").read_text().splitlines()] for r in range(2)
    ]
    # Epoch 0: the 4 batches per rank trained before the save, then the resumed run.
    epoch0 = [line for rank in ranks for line in rank[:4]] + [
        line for line in lines if line["phase"] == "resumed" and line["epoch"] == 0
    ]
    assert_exactly_once([i for line in epoch0 for i in line["ids"]], range(TOTAL))
    epoch1 = [line for line in lines if line["epoch"] == 1]
    assert_exactly_once([i for line in epoch1 for i in line["ids"]], range(TOTAL))


@pytest.mark.slow
def test_dcp_from_two_ranks_to_three_needs_gathered_state(data: Path, tmp_path: Path) -> None:
    """Issue 33, item 19: with the loader itself as the entry, DCP raises before the library runs
    ("Missing key in checkpoint state_dict: data.rank2"): documented, with GatheredState as the fix,
    which resumes a 2-rank checkpoint on 3 ranks, every row exactly once.
    """
    out = tmp_path / "out"
    out.mkdir()
    for phase, ranks in (("save", 2), ("load", 3)):
        cmd = [
            _bin("torchrun"),
            f"--nproc_per_node={ranks}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_ports(1)[0]}",
            str(SCRIPTS / "resize.py"),
            str(data),
            str(tmp_path / "ckpt"),
            str(out),
            phase,
        ]
        _run(cmd, tmp_path, timeout=240)
    saved = [json.loads((out / f"save{r}.json").read_text()) for r in range(2)]
    loaded = [json.loads((out / f"load{r}.json").read_text()) for r in range(3)]
    assert all("Missing key in checkpoint state_dict: data.rank2" in r["error"] for r in loaded)
    seen = [i for r in saved for i in r["seen"]] + [i for r in loaded for i in r["resumed"]]
    assert_exactly_once(seen, range(TOTAL))
