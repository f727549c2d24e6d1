"""``benchmarks/compare.py`` runs: a smoke run (``--quick``) of the working tree beside HEAD.

A benchmark, not a test of speed: this only checks that the guard against the next loss
still runs and writes its table (the versions' figures side by side, with ratios).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_compare_quick_runs_and_writes_its_table(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "compare.py"), "HEAD", "--quick", "--only", "S1 nw=0",
         "S2 nw=0", "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "out" / "compare-HEAD-quick.md").read_text()
    assert "| scenario | figure | HEAD | tree | tree / HEAD |" in table
    rows = [line for line in table.splitlines() if line.startswith(("| S1 nw=0", "| S2 nw=0"))]
    assert [r.split(" | ")[1] for r in rows] == [
        "wall s",
        "peak PSS MiB",
        "wall s",
        "first batch s (since launch)",
        "rest of epoch s",
        "peak PSS MiB",
    ]
    assert all(r.rstrip(" |").split(" | ")[-1].split("x")[0].replace(".", "").isdigit() for r in rows)
