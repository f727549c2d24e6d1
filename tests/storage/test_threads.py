"""The library's threads are stopped and joined before the interpreter finalizes.

A daemon thread still running while Python finalizes aborted Lightning's resumed fit
after it ended ("terminate called without an active exception", exit 134, about 1 run in
4 here): the receiving thread freed a batch's tensors during finalization.
"""

from __future__ import annotations

import threading
from pathlib import Path

from tests.fixtures.data import WriteParquet
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.storage.threads import join_at_exit, stop_and_join_all


def test_registered_threads_are_stopped_and_joined() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    join_at_exit(thread, stop)
    assert stop_and_join_all(timeout=5) == []
    assert not thread.is_alive()


def test_a_thread_that_does_not_stop_is_reported_not_waited_for_forever() -> None:
    stop, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    join_at_exit(thread, stop)
    assert stop_and_join_all(timeout=0.05) == [thread]
    assert stop.is_set()
    release.set()
    thread.join(5)


def test_the_loaders_receiving_thread_is_joined_at_exit(write_parquet: WriteParquet) -> None:
    paths = write_parquet([200, 200], row_group_size=20)
    loader, _ = create_dataloader(str(Path(paths[0]).parent), batch_size=8, num_workers=2)
    it = iter(loader)
    next(it)
    receiver = loader._receiver
    assert receiver is not None
    assert receiver.thread.is_alive()  # mid-pass: it waits with a full queue
    assert stop_and_join_all(timeout=10) == []
    assert not receiver.thread.is_alive()
    del it
