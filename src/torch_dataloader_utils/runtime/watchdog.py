"""DataLoader workers end themselves when the process that started them is gone.

torch's workers look for their parent only between two batches. A worker blocked on a
full result pipe (the parent stopped reading because it was killed: torchrun and
schedulers send SIGTERM, then SIGKILL) never gets there, since its siblings hold the
pipe's read end open, so it would stay an orphan. A daemon thread in each worker
watches the parent process id instead and exits the worker at once when it changes.
Shared-memory batches use torch's ``file_descriptor`` strategy, so nothing is left in
``/dev/shm`` when a worker exits this way.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["POLL_SECONDS", "watch_parent"]

POLL_SECONDS = 0.5
"""How often a worker checks that its parent is alive."""

_watching: int | None = None  # the pid of the process whose parent is watched


def watch_parent() -> None:
    """Start (once per process) a thread that exits this process when its parent dies."""
    global _watching
    pid = os.getpid()
    if _watching == pid:
        return
    _watching = pid
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(POLL_SECONDS)
            if os.getppid() != parent:  # re-parented: the trainer is gone
                os._exit(1)

    threading.Thread(target=watch, name="torch_dataloader_utils-watchdog", daemon=True).start()
