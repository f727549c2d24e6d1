"""show_progress: a bar per rank on a terminal, log lines elsewhere; right with workers and resume."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.data import write_parquet_files
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.runtime import env
from torch_dataloader_utils.runtime.progress import progress_line

ROWS = [1300, 170, 940, 55, 610]
TOTAL = sum(ROWS)
PROGRESS = "torch_dataloader_utils.progress"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("progress")
    write_parquet_files(root, ROWS, row_group_size=100, with_strings=False)
    return root


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(env, "stderr_is_terminal", lambda: True)
    return


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == PROGRESS]


@pytest.mark.parametrize("workers", [0, 2])
def test_log_lines_when_not_a_terminal(data: Path, workers: int, caplog: pytest.LogCaptureFixture) -> None:
    loader, dataset = create_dataloader(
        str(data), num_workers=workers, batch_size=64, show_progress=True, progress_interval_sec=1e-6
    )
    with caplog.at_level(logging.INFO, logger=PROGRESS):
        for epoch in (0, 1):
            dataset.set_epoch(epoch)
            for _ in loader:
                pass
    lines = _lines(caplog)
    assert len(lines) > 10  # one per batch at this interval, plus the last
    assert lines[0].startswith("rank 0 epoch 0: 64/3,075 rows (2.1%), ")
    assert "rows/s, stall " in lines[0]
    assert " left" in lines[0]
    finals = [line for line in lines if line.endswith(", done")]
    assert [f.split(":")[0] for f in finals] == ["rank 0 epoch 0", "rank 0 epoch 1"]
    assert all(f"{TOTAL:,}/{TOTAL:,} rows (100.0%)" in f for f in finals)


def test_only_rank_zero_unless_all_ranks(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=PROGRESS):
        for every in (False, True):
            loader, _ = create_dataloader(
                str(data), num_ranks=2, rank=1, num_workers=0, show_progress=True, progress_all_ranks=every
            )
            for _ in loader:
                pass
    lines = _lines(caplog)
    assert len(lines) == 1
    assert lines[0].startswith("rank 1 epoch 0: 1,537/1,537 rows (100.0%)")


def test_resumed_epoch_counts_rows_consumed_before(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    options = {"batch_size": 64, "split_rows": 150, "show_progress": True}
    loader, _ = create_dataloader(str(data), num_workers=2, **options)  # type: ignore[arg-type]
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    loader2, _ = create_dataloader(str(data), num_workers=1, **options)  # type: ignore[arg-type]
    loader2.load_state_dict(state)
    with caplog.at_level(logging.INFO, logger=PROGRESS):
        rows = sum(len(b["id"]) for b in loader2)
    assert rows == TOTAL - 5 * 64
    [line] = _lines(caplog)
    assert line.startswith(f"rank 0 epoch 0: {TOTAL:,}/{TOTAL:,} rows (100.0%)")


def test_an_abandoned_pass_says_stopped(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    loader, _ = create_dataloader(str(data), num_workers=0, batch_size=100, show_progress=True)
    with caplog.at_level(logging.INFO, logger=PROGRESS):
        it = iter(loader)
        next(it)
        it.close()
    [line] = _lines(caplog)
    assert line.startswith("rank 0 epoch 0: 100/3,075 rows (3.3%)")
    assert line.endswith(", stopped")


def test_bar_on_a_terminal(data: Path, terminal: None, capsys: pytest.CaptureFixture[str]) -> None:
    loader, _ = create_dataloader(str(data), num_workers=2, batch_size=100, show_progress=True)
    assert sum(len(b["id"]) for b in loader) == TOTAL
    err = capsys.readouterr().err
    assert "rank 0 epoch 0: 100%" in err
    assert "3.08k/3.08k" in err
    assert "rows/s" in err
    assert "stall " in err


def test_without_a_logging_handler_lines_go_to_stderr(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = logging.getLogger(PROGRESS)
    log.propagate = False  # no handler anywhere above: the library must not stay silent
    try:
        loader, _ = create_dataloader(str(data), num_workers=0, show_progress=True)
        for _ in loader:
            pass
    finally:
        log.propagate = True
    assert f"rank 0 epoch 0: {TOTAL:,}/{TOTAL:,} rows (100.0%)" in capsys.readouterr().err


def test_progress_line_format() -> None:
    line = progress_line(
        prefix="rank 3 epoch 1", done=50, total=200, rows_per_sec=10.0, stall=0.25, elapsed=5
    )
    assert line == "rank 3 epoch 1: 50/200 rows (25.0%), 10 rows/s, stall 25%, 00:05 elapsed, ~00:15 left"
    unknown = progress_line(
        prefix="p", done=7, total=None, rows_per_sec=None, stall=None, elapsed=3700, final="done"
    )
    assert unknown == "p: 7 rows, - rows/s, stall -, 1:01:40 elapsed, done"
