"""A real torchrun job with a ledger: 2 ranks killed mid-epoch, resumed on 3; replay equals what it saw.

The job writes out every batch its loop receives (with the trainer's step) and checkpoints
every few batches; the test SIGKILLs the launcher's process tree between checkpoints and
resumes on 3 ranks from the last checkpoint every rank saved. Then ``torch-dataloader-utils
replay LEDGER --step N --rank R --read --out F`` for a sample of steps on both sides of the
interruption, and ``Ledger.rows`` for every other step, must give exactly the batches the
job wrote out: the same rows in the same order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.runtime.test_ddp_launch import LAUNCH_TIMEOUT, ROWS, child_env, launch
from tests.runtime.test_resume_launch import run_until_ready, torchrun
from torch_dataloader_utils import Ledger

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("ledger_scripts") / "train.py"


def written(out: Path, phase: str, rank: int) -> dict[int, dict[str, list[float]]]:
    lines = (out / f"batches_{phase}_rank{rank}.jsonl").read_text().splitlines()
    return {(v := json.loads(line))["step"]: v for line in lines}


def replay_cli(tmp_path: Path, ledger: Path, step: int, rank: int) -> dict[str, list[float]]:
    target = tmp_path / f"replay-{rank}-{step}.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "torch_dataloader_utils", "replay", str(ledger), "--step", str(step),
         "--rank", str(rank), "--read", "--out", str(target)],
        env=child_env(tmp_path), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return pq.read_table(target).to_pydict()


def test_kill_two_ranks_resume_on_three_and_replay_both_sides(write_parquet, tmp_path: Path) -> None:
    data = write_parquet(ROWS, row_group_size=[200, 50, 300, 55, 100, 111, 20], with_strings=False)[0].parent
    out = tmp_path / "out"
    out.mkdir()
    run_until_ready(torchrun(2, data, out, "first", SCRIPT), tmp_path, out, 2)
    checkpoint = max(
        s for s in (4, 8, 12, 16, 20, 24) if all((out / f"step{s}_rank{r}.json").exists() for r in range(2))
    )
    launch([torchrun(3, data, out, "second", SCRIPT)], tmp_path)

    ledger = Ledger(out / "ledger")
    assert ledger.ranks == [0, 1, 2]
    before = {r: {s: v for s, v in written(out, "first", r).items() if s < checkpoint} for r in range(2)}
    after = {r: written(out, "second", r) for r in range(3)}
    assert all(min(after[r]) == checkpoint for r in range(3))  # the step counts on from the checkpoint
    for seen in [*before.values(), *after.values()]:
        assert seen
    for rank, seen in [*before.items(), *after.items()]:
        for step, batch in seen.items():
            got = ledger.rows(step, rank)
            assert got["id"].tolist() == batch["id"], (rank, step)
            assert got["x"].tolist() == batch["x"], (rank, step)
    samples = [(0, 1), (1, checkpoint - 1), (2, checkpoint), (0, max(after[0]))]
    for rank, step in samples:
        seen = (before if step < checkpoint else after)[rank][step]
        got = replay_cli(tmp_path, out / "ledger", step, rank)
        assert got["id"] == seen["id"]
        assert got["x"] == seen["x"]
