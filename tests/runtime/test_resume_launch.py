"""A real torchrun job on 3 ranks is SIGKILLed mid-epoch and resumed on 2 ranks.

Ranks checkpoint their loader state every few batches (per-rank files, as a training
job would); the test kills the launcher's whole process group between checkpoints,
merges the last step every rank saved, and resumes on another number of ranks and
workers. Every row is read exactly once across both runs (minus the documented
equal-batches drops), and both resumed ranks yield the same number of batches.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.runtime.test_ddp_launch import LAUNCH_TIMEOUT, ROWS, TOTAL, bin_of, child_env, free_port, launch

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("ddp_scripts") / "resume_loop.py"


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (torchrun starts its ranks in new sessions)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


def kill_tree(pid: int) -> None:
    for p in descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def torchrun(ranks: int, data: Path, out: Path, phase: str, script: Path = SCRIPT) -> list[str]:
    return [
        bin_of("torchrun"),
        f"--nproc_per_node={ranks}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(script),
        str(data),
        str(out),
        phase,
    ]


def run_until_ready(command: list[str], tmp_path: Path, out: Path, ranks: int) -> None:
    """Start a launch, wait until every rank wrote ``ready_rank<r>``, then kill its tree (preemption)."""
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=child_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    try:
        while not all((out / f"ready_rank{r}").exists() for r in range(ranks)):
            if proc.poll() is not None:
                pytest.fail(f"first run exited early:\n{proc.communicate()[0][-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail("first run did not reach its checkpoints in time")
            time.sleep(0.2)
    finally:
        kill_tree(proc.pid)  # preemption: launcher, ranks and workers die at once, no cleanup
        proc.communicate()


def test_kill_three_ranks_resume_on_two(write_parquet, tmp_path):
    data = write_parquet(ROWS, row_group_size=[200, 50, 300, 55, 100, 111, 20], with_strings=False)[0].parent
    out = tmp_path / "out"
    out.mkdir()
    run_until_ready(torchrun(3, data, out, "first"), tmp_path, out, 3)
    (out / "first_world.txt").write_text("3")
    steps = sorted({int(p.name[4:].split("_")[0]) for p in out.glob("step*_rank*.json")})
    step = max(s for s in steps if all((out / f"step{s}_rank{r}.json").exists() for r in range(3)))
    consumed = [
        i for r in range(3) for i in json.loads((out / f"step{step}_rank{r}.json").read_text())["ids"]
    ]

    launch([torchrun(2, data, out, "second")], tmp_path)
    second = [json.loads((out / f"second_rank{r}.json").read_text()) for r in range(2)]
    assert second[0]["batches"] == second[1]["batches"] == second[0]["len"] == second[1]["len"]
    rest = [i for run in second for i in run["ids"]]
    assert len(consumed) >= 3 * 8 * 32
    assert len(rest) >= 2 * 32
    seen = Counter(consumed + rest)
    assert all(n == 1 for n in seen.values()), "a row was read twice"
    assert set(seen) <= set(range(TOTAL))
    assert TOTAL - len(seen) <= (3 - 1) + (2 - 1)  # equal-batches drops only
    gathered = json.loads((out / "gathered.json").read_text())
    assert sorted(gathered["segments"][-1]["ranks"]) == ["0", "1"]
    assert gathered["segments"][-1]["num_ranks"] == 2
