"""Decoding ahead: an iterator advanced by a background thread, a few items in front of its reader.

A process that reads and converts its own batches (``num_workers=0``, or a DataLoader
worker with a CPU to spare) otherwise decodes a batch only when it is asked for, so
decoding never overlaps the conversion, the training step or anything else the
reading thread does. :func:`read_ahead` runs the source iterator in one thread, at most
``depth`` items ahead; Arrow's decoding and gathering release the GIL, so the two
threads run in parallel.

The items come out in the source's order, unchanged. An exception raised by the source
is raised by the reader at the point of the stream where it happened (the items
before it are handed out first), with its own type and message. When the reader stops
early (``close()``, garbage collection, an exception in the loop), the thread stops at
its next item, closes the source in its own thread, and is joined.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

from torch_dataloader_utils.storage.threads import join_at_exit

__all__ = ["AHEAD_ITEMS", "read_ahead"]

T = TypeVar("T")

AHEAD_ITEMS: Final = 2
"""Items decoded ahead of the reader: besides the one being converted, at most this many
decoded batches (or mix rounds' slices) are held."""

_POLL_SEC = 0.05
"""How often a thread blocked on a full queue looks whether its reader has stopped."""
_JOIN_SEC = 60.0
"""How long a stopping reader waits for the thread to finish the item it is decoding."""


class _End:
    """The source is exhausted (``error`` is ``None``) or raised ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


def read_ahead(
    source: Iterator[T],
    depth: int = AHEAD_ITEMS,
    name: str = "read-ahead",
    prepare: Callable[[T], bool] | None = None,
) -> Iterator[T]:
    """``source``'s items, advanced by a background thread up to ``depth`` items ahead.

    Args:
        source: The iterator to run in the thread; nothing else may advance it.
        depth: Items held ready at most (>= 1).
        name: The thread's name (shown by debuggers and ``py-spy``).
        prepare: Work the thread may do on a queued item while the queue is full (the
            newest first); returns whether it did any. It must be safe to run beside
            the reader's own use of the item.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    ready: queue.Queue[T | _End] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def help_out() -> bool:
        """Prepare one queued item, the newest first; whether there was one to prepare."""
        if prepare is None:
            return False
        with ready.mutex:
            queued = list(ready.queue)
        return any(prepare(item) for item in reversed(queued) if not isinstance(item, _End))

    def put(item: T | _End) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, block=False)
                return True
            except queue.Full:
                if help_out():
                    continue
            try:
                ready.put(item, timeout=_POLL_SEC)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in source:
                if not put(item):
                    break
            else:
                put(_End(None))
        except BaseException as exc:  # handed to the reader, raised there
            put(_End(exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name=f"torch_dataloader_utils-{name}", daemon=True)
    thread.start()
    join_at_exit(thread, stop)  # never left running while Python finalizes
    try:
        while True:
            item = ready.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        stop.set()
        thread.join(_JOIN_SEC)
