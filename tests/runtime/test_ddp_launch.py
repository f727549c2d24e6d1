"""Real multi-process runs: torchrun (one node, two "nodes") and accelerate, on gloo/CPU.

Each launch runs tests/runtime/ddp_scripts/train_loop.py: a loop with one all_reduce per
batch over deliberately uneven data, ranks with different numbers of DataLoader
workers, a 30 s process-group timeout. An uneven batch count would make it fail (a
rank waits in all_reduce until the timeout) instead of hang.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("ddp_scripts") / "train_loop.py"
ROWS = [1300, 170, 940, 55, 610, 333, 20]
TOTAL = sum(ROWS)
BATCH_SIZE = 64
LAUNCH_TIMEOUT = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO / "src")
    env["HF_HOME"] = str(tmp_path / "hf_home")
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch(commands: list[list[str]], tmp_path: Path) -> None:
    """Start every command (in its own process group), wait, kill all on timeout."""
    procs = [
        subprocess.Popen(
            cmd,
            cwd=tmp_path,
            env=child_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for cmd in commands
    ]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=LAUNCH_TIMEOUT)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        pytest.fail(f"launch timed out after {LAUNCH_TIMEOUT}s: {commands}")
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-4000:]


def bin_of(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


@pytest.fixture
def data(write_parquet) -> Path:
    paths = write_parquet(ROWS, row_group_size=[200, 50, 300, 55, 100, 111, 20], with_strings=False)
    return paths[0].parent


def collect(out: Path, world: int) -> list[dict]:
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    assert [r["rank"] for r in results] == list(range(world))
    assert all(r["world"] == world for r in results)
    return results


def check_gathered_metrics(results: list[dict], key: str) -> None:
    """Every rank gathered the same metrics, and they equal what each rank read."""
    runs = [r[key] for r in results]
    expected = [
        [rank, len(run["ids"]) + len(run["pads"]), run["batches"], len(run["pads"])]
        for rank, run in enumerate(runs)
    ]
    assert all(run["metrics"] == expected for run in runs)


def check_equal_and_exactly_once(results: list[dict]) -> None:
    world = len(results)
    for key in ("drop/0", "drop/1", "pad/0"):
        check_gathered_metrics(results, key)
    per_rank_rows = TOTAL // world
    for key in ("drop/0", "drop/1"):
        runs = [r[key] for r in results]
        assert {run["batches"] for run in runs} == {-(-per_rank_rows // BATCH_SIZE)}
        assert all(run["len"] == run["batches"] for run in runs)  # len(loader) is right
        ids = [i for run in runs for i in run["ids"]]
        assert len(ids) == len(set(ids)) == TOTAL - TOTAL % world  # documented drops only
        assert set(ids) <= set(range(TOTAL))
    pad = [r["pad/0"] for r in results]
    assert len({run["batches"] for run in pad}) == 1
    assert sorted(i for run in pad for i in run["ids"]) == list(range(TOTAL))
    pads = [i for run in pad for i in run["pads"]]
    assert len(pads) == (-TOTAL) % world
    assert set(pads) <= set(range(TOTAL))


def test_torchrun_three_ranks(data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cmd = [
        bin_of("torchrun"),
        "--nproc_per_node=3",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(SCRIPT),
        str(data),
        str(out),
        "torchrun",
    ]
    launch([cmd], tmp_path)
    results = collect(out, 3)
    check_equal_and_exactly_once(results)
    assert TOTAL % 3 == 2  # the drop really drops: 3428 rows over 3 ranks


def test_torchrun_two_nodes(data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    cmds = [
        [
            bin_of("torchrun"),
            "--nnodes=2",
            f"--node_rank={node}",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            str(SCRIPT),
            str(data),
            str(out),
            "torchrun",
        ]
        for node in (0, 1)
    ]
    launch(cmds, tmp_path)
    results = collect(out, 4)
    check_equal_and_exactly_once(results)
    # On node 1, LOCAL_RANK != RANK: passing the local rank was refused before init.
    assert results[0]["checks"]["local_rank_error"] is None
    for r in (2, 3):
        msg = results[r]["checks"]["local_rank_error"]
        assert f"rank={r - 2} equals LOCAL_RANK but RANK={r}" in msg
        assert "pass the global rank" in msg


def test_accelerate_two_processes(data, tmp_path):
    """The documented Accelerate usage: the loader is NOT passed to accelerator.prepare."""
    pytest.importorskip("accelerate")
    out = tmp_path / "out"
    out.mkdir()
    cmd = [
        bin_of("accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes=2",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        "--main_process_ip=127.0.0.1",
        f"--main_process_port={free_port()}",
        str(SCRIPT),
        str(data),
        str(out),
        "accelerate",
    ]
    launch([cmd], tmp_path)
    results = collect(out, 2)
    assert [r["checks"]["accelerate"] for r in results] == [[0, 2], [1, 2]]
    check_equal_and_exactly_once(results)


def test_torchrun_elastic_order_on_two_then_three_ranks(data, tmp_path):
    """canonical_ranks=6: 2 ranks and 3 ranks read the same global batches; 3 resume 2's state."""
    from torch_dataloader_utils import StructuredDataset

    script = SCRIPT.with_name("elastic_loop.py")
    one = StructuredDataset(
        str(data), batch_size=24, canonical_ranks=6, shuffle=True, shuffle_seed=4, split_rows=50
    )
    expected = [sorted(b["id"].tolist()) for b in one]
    runs = []
    for world in (2, 3):
        out = tmp_path / f"out{world}"
        out.mkdir()
        state = [str(tmp_path / "out2" / "state.json")] if world == 3 else []
        cmd = [
            bin_of("torchrun"),
            f"--nproc_per_node={world}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(script),
            str(data),
            str(out),
            *state,
        ]
        launch([cmd], tmp_path)
        runs.append(json.loads((out / "batches.json").read_text()))
    assert runs[0] == {"world": 2, "batches": expected}
    assert runs[1] == {"world": 3, "batches": expected[5:]}  # resumed after 5 global batches
