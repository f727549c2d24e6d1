"""Spare CPUs of a reading process: a few threads that decode streams and gather shuffles ahead.

Row mixing reads 8 streams side by side and gathers each round's rows once. In one
thread, every stream's next batch is decoded only when a round runs out of it (all 8 in
the same round: a burst), and a round's gather only when it is reached. When the process
has CPUs to spare (the main process of a rank with many CPUs, or a worker of a rank with
more CPUs than workers), :class:`Helpers` runs that work on other threads: each stream
decodes its next batch while the current one is taken, and each round is gathered as
soon as it is read. Arrow releases the GIL while decoding and gathering, so they run in
parallel. The order of rows does not change, only when the work is done.

The pool belongs to the process that made it: a forked DataLoader worker makes its own
(threads do not survive a fork).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["MAX_HELPERS", "Helpers", "helpers"]

T = TypeVar("T")

MAX_HELPERS = 8
"""Threads at most: one per stream of the default row mixing."""

_lock = threading.Lock()
_pools: dict[tuple[int, int], Helpers] = {}


class Helpers:
    """A thread pool of ``threads`` threads in this process (made on first use).

    Args:
        threads: Threads (>= 1).
    """

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self._pid = os.getpid()
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on a helper thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="torch_dataloader_utils-helper")
        return self._pool.submit(fn, *args)


def helpers(threads: int) -> Helpers | None:
    """This process's pool of ``threads`` helper threads (``None`` for 0), shared by its readers."""
    threads = min(threads, MAX_HELPERS)
    if threads < 1:
        return None
    key = (os.getpid(), threads)
    with _lock:
        found = _pools.get(key)
        if found is None:
            found = _pools[key] = Helpers(threads)
        return found
