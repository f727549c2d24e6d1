"""Hostile case 12: DataLoader workers exit when the training process dies, however it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

SCRIPT = Path(__file__).parent / "orphan_scripts" / "slow_consumer.py"
ROOT = Path(__file__).parents[2]


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.update(int(t) for t in text)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("orphans")
    rows = 200_000
    for i in range(4):  # wide rows: the workers' groups fill the result pipe quickly
        table = pa.table({"id": np.arange(i * rows, (i + 1) * rows), "x": np.random.rand(rows)})
        pq.write_table(table, root / f"part-{i}.parquet", row_group_size=20_000)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_workers_exit_when_the_trainer_is_killed(data: Path, sig: signal.Signals) -> None:
    shm_before = _shm()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(data), "torch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "READY", proc.stderr.read() if proc.stderr else ""
        time.sleep(0.5)  # let the workers block on the full pipe
        workers = _children(proc.pid)
        assert len(workers) >= 2, workers
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60  # polled: ends once they are gone (torch's check is every 5 s)
        while time.monotonic() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.2)
        left = [w for w in workers if _alive(w)]
        assert not left, f"DataLoader workers {left} outlived the killed trainer by 60 s"
        leaked = {n for n in _shm() - shm_before if "torch" in n}
        assert not leaked, f"shared memory left in /dev/shm: {sorted(leaked)}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for w in _children(proc.pid) if proc.poll() is None else []:
            os.kill(w, signal.SIGKILL)
