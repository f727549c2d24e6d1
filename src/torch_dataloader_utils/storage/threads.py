"""The library's threads, stopped and joined before the interpreter finalizes.

A daemon thread that is still running (or just ending) while Python finalizes can abort
the process after the training ran to its end: when it frees a tensor, torch's
deallocator releases the GIL, and the thread, finding the interpreter finalizing, is
unwound through C++ frames that cannot be unwound ("terminate called without an active
exception", exit status 134). So the threads that hold batches (receiving from workers,
reading ahead) are registered here, and an ``atexit`` handler, which runs before the
interpreter finalizes, sets their stop events and waits for them (at most
:data:`EXIT_JOIN_SEC` in all).
"""

from __future__ import annotations

import atexit
import threading
import time

__all__ = ["EXIT_JOIN_SEC", "join_at_exit", "stop_and_join_all"]

EXIT_JOIN_SEC = 2.0
"""Longest wait at exit for all registered threads together."""

_live: dict[threading.Thread, threading.Event] = {}
_lock = threading.Lock()


def join_at_exit(thread: threading.Thread, stop: threading.Event) -> None:
    """Have ``thread`` (started) stopped through ``stop`` and joined at interpreter exit."""
    with _lock:
        for done in [t for t in _live if not t.is_alive()]:
            del _live[done]
        _live[thread] = stop


def stop_and_join_all(timeout: float = EXIT_JOIN_SEC) -> list[threading.Thread]:
    """Stop every registered thread and wait for them; returns those still running after ``timeout``."""
    with _lock:
        items = list(_live.items())
        _live.clear()
    for _, stop in items:
        stop.set()
    deadline = time.monotonic() + timeout
    for thread, _ in items:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [thread for thread, _ in items if thread.is_alive()]


atexit.register(stop_and_join_all)
