"""The Iceberg demo (`python -m testsupport.demo_iceberg`, run by `make demo`) checks exactly-once."""

from __future__ import annotations

from pathlib import Path

import pytest
from testsupport.demo_iceberg import main


def test_demo_iceberg_reads_every_live_row_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--data-dir", str(tmp_path), "--num-workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "25000 rows written" in out
    assert "OK: 24196 of 24197 live rows arrived exactly once, deleted rows never" in out
    assert "1 left out of this epoch to even the ranks; every rank yielded 13 batches" in out
