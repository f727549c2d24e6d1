"""Issue 28, item 14: a worker killed with persistent workers is an error every time, never a hang.

With ``persistent_workers=True``, SIGKILL one worker at batch 30, catch the error, call
``state_dict()`` and iterate again: the new pass blocked forever in 5 of 7 tries (the
thread receiving from the workers sat in a read that the dead worker had left half
written, and the next pass waited for it), and otherwise failed again, since torch waits
for every persistent worker to acknowledge a new pass. Now the pass that a dead worker
ended raises, drops its workers, and the next pass starts new ones.

The loop runs in a child process: a hang there is a failed test after a bounded wait,
and torch's SIGCHLD handler raises in that process's main thread, not in pytest's. That
handler's error lands wherever the main thread is, the loop's own code included: the
loop keeps each batch first thing (``list.append``, after which the error can land), as
a checkpointing loop must treat a batch it received as consumed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.data import write_parquet_files

ROWS = [6000, 5000, 7000, 6000]
ATTEMPTS = 3

SCRIPT = r"""
import json, multiprocessing, os, signal, sys
from torch_dataloader_utils import create_dataloader

root, attempts = sys.argv[1], int(sys.argv[2])
opts = dict(batch_size=64, num_workers=2, persistent_workers=True, shuffle=True, split_rows=1000)
loader, dataset = create_dataloader(root, **opts)
report = []
for attempt in range(attempts):
    dataset.set_epoch(attempt)
    got, error, pids = [], None, None
    try:
        for n, batch in enumerate(loader, start=1):
            got.append(batch)  # first: the handler's error may land anywhere in this body
            if n == 30:
                pids = sorted(p.pid for p in multiprocessing.active_children())
                os.kill(pids[0], signal.SIGKILL)
    except RuntimeError as exc:
        error = str(exc)
    first = [int(i) for b in got for i in b["id"]]
    state = loader.state_dict()
    again = [int(i) for b in loader for i in b["id"]]
    workers = sorted(p.pid for p in multiprocessing.active_children())
    resumed, _ = create_dataloader(root, **{**opts, "persistent_workers": False})
    resumed.load_state_dict(state)
    rest = [int(i) for b in resumed for i in b["id"]]
    report.append({"error": error, "first": first, "again": again, "rest": rest, "killed": pids[0],
                   "workers_after": workers})
print(json.dumps(report))
"""


@pytest.mark.slow
def test_28_14_sigkilled_persistent_worker_is_an_error_every_time_and_never_a_hang(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_parquet_files(root, ROWS, row_group_size=1000, with_strings=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root), str(ATTEMPTS)],
        capture_output=True,
        text=True,
        timeout=240,  # a hang fails here (each attempt takes about a second)
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    total = sum(ROWS)
    for attempt in report:
        assert attempt["error"] is not None, "the pass a dead worker ended raises"
        assert "DataLoader worker" in attempt["error"]
        assert len(attempt["first"]) >= 30 * 64
        # The next pass started new workers and read the whole epoch, every row once.
        assert sorted(attempt["again"]) == list(range(total))
        assert attempt["killed"] not in attempt["workers_after"]
        # The state taken after the error resumes exactly: consumed + rest = every row once.
        assert sorted(attempt["first"] + attempt["rest"]) == list(range(total))
