"""The README's main job: ``python -m torch_dataloader_utils demo`` runs real torchrun ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_runs_as_real_ranks_and_verifies_every_row(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO / "src")
    done = subprocess.run(
        [sys.executable, "-m", "torch_dataloader_utils", "demo", f"--data-dir={tmp_path}", "--epochs=1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "launching torchrun: 2 ranks x 2 workers" in out
    assert out.count("  OK: every rank yielded 100 batches; all 200000 rows arrived exactly once") == 1
    assert "FAIL" not in out
