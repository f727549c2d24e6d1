"""``show_progress``: one bar per rank on a terminal, progress lines in a log otherwise.

On a terminal (standard error is a TTY) a ``tqdm`` bar per rank shows rows received,
rows per second and the loop's stall percentage. Anywhere else (a job's log file, a
pipe) the same figures are written every ``progress_interval_sec`` seconds, and once at
the end of the pass, as INFO records of the ``torch_dataloader_utils.progress`` logger
(to standard error when no logging handler is configured, so a requested progress
display is never silent). Rank 0 shows progress unless ``progress_all_ranks=True``,
where every rank does, each line prefixed with its rank.

A resumed epoch starts where the loop stopped: the display counts the rows consumed
before the interruption as done.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import time
from typing import Any, Protocol

from torch_dataloader_utils.config import ProgressConfig
from torch_dataloader_utils.errors import MissingDependencyError
from torch_dataloader_utils.runtime import env

__all__ = ["BAR_REFRESH_SEC", "Progress", "StallSource", "check_progress", "logger", "progress_line"]

logger = logging.getLogger("torch_dataloader_utils")
_progress_log = logging.getLogger("torch_dataloader_utils.progress")

BAR_REFRESH_SEC = 0.5
"""Seconds between two updates of a bar's stall figure."""


class StallSource(Protocol):
    """Whatever knows the loop's stall fraction so far (the metrics recorder)."""

    @property
    def stall_fraction(self) -> float | None:
        """``wait / (wait + between)``, or ``None`` before the first batch."""
        ...


def check_progress(config: ProgressConfig) -> None:
    """Check that the display ``config`` asks for can be drawn here.

    Raises:
        MissingDependencyError: bars would be drawn (a terminal) but ``tqdm`` is missing
            (an ``ImportError`` too, as in 0.2.0).
    """
    if config.show_progress and env.stderr_is_terminal() and importlib.util.find_spec("tqdm") is None:
        raise MissingDependencyError(
            "show_progress=True draws tqdm progress bars, but tqdm is not installed; "
            "pip install torch-dataloader-utils[progress] (or tqdm), or drop show_progress"
        )


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def progress_line(
    *,
    prefix: str,
    done: int,
    total: int | None,
    rows_per_sec: float | None,
    stall: float | None,
    elapsed: float,
    final: str | None = None,
) -> str:
    """One progress line, e.g. ``rank 0 epoch 1: 120,000/200,000 rows (60.0%), 45,120 rows/s, ...``."""
    count = f"{done:,}/{total:,} rows ({100 * done / total:.1f}%)" if total else f"{done:,} rows"
    speed = "-" if rows_per_sec is None else f"{rows_per_sec:,.0f}"
    stalled = "-" if stall is None else f"{100 * stall:.0f}%"
    line = f"{prefix}: {count}, {speed} rows/s, stall {stalled}, {_duration(elapsed)} elapsed"
    if final is not None:
        return f"{line}, {final}"
    if total and rows_per_sec and done < total:
        line += f", ~{_duration((total - done) / rows_per_sec)} left"
    return line


class Progress:
    """The progress display of one pass over an epoch on one rank.

    Args:
        config: The ``show_progress`` options.
        rank: This rank.
        epoch: The epoch read.
        total: Rows of this rank's epoch, when known.
        done: Rows already consumed before this pass (a resumed epoch).
    """

    def __init__(
        self, config: ProgressConfig, *, rank: int, epoch: int, total: int | None, done: int
    ) -> None:
        self._interval = config.progress_interval_sec
        self._prefix = f"rank {rank} epoch {epoch}"
        self._total = total
        self._done = done
        self._start_done = done
        self._started = time.monotonic()
        self._next_line = self._started + self._interval
        self._next_postfix = self._started
        self._bar: Any = None
        if env.stderr_is_terminal():
            from tqdm.auto import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(
                total=total,
                initial=done,
                desc=self._prefix,
                unit="rows",
                unit_scale=True,
                leave=True,
                mininterval=min(0.1, self._interval),  # 0: redrawn at every batch, as in 0.2.0
            )

    @classmethod
    def shown_on(cls, config: ProgressConfig, rank: int) -> bool:
        """Whether rank ``rank`` shows progress under ``config``."""
        return config.show_progress and (rank == 0 or config.progress_all_ranks)

    def _rate(self, now: float) -> float | None:
        elapsed = now - self._started
        return (self._done - self._start_done) / elapsed if elapsed > 1e-3 else None

    def _line(self, now: float, stall: StallSource, final: str | None = None) -> str:
        return progress_line(
            prefix=self._prefix,
            done=self._done,
            total=self._total,
            rows_per_sec=self._rate(now),
            stall=stall.stall_fraction,
            elapsed=now - self._started,
            final=final,
        )

    def _write(self, line: str) -> None:
        if _progress_log.hasHandlers():
            _progress_log.info("%s", line)
        else:
            print(line, file=sys.stderr, flush=True)

    def update(self, rows: int, stall: StallSource) -> None:
        """``rows`` more rows reached the loop."""
        self._done += rows
        now = time.monotonic()
        if self._bar is not None:
            if now >= self._next_postfix:
                self._next_postfix = now + BAR_REFRESH_SEC
                fraction = stall.stall_fraction
                self._bar.set_postfix_str(
                    "stall -" if fraction is None else f"stall {100 * fraction:.0f}%", refresh=False
                )
            self._bar.update(rows)
        elif now >= self._next_line:
            self._next_line = now + self._interval
            self._write(self._line(now, stall))

    def close(self, stall: StallSource, completed: bool) -> None:
        """The pass ended (``completed``) or was abandoned: close the bar, or write the last line."""
        if self._bar is not None:
            fraction = stall.stall_fraction
            if fraction is not None:
                self._bar.set_postfix_str(f"stall {100 * fraction:.0f}%", refresh=False)
            self._bar.close()
            self._bar = None
        else:
            self._write(self._line(time.monotonic(), stall, final="done" if completed else "stopped"))
