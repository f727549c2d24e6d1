"""Batches from workers are received by a thread of the main process, ahead of the loop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.data import WriteParquet
from tests.fixtures.e2e import corrupt, epoch_ids
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.errors import ReadError
from torch_dataloader_utils.runtime.emit import FIRST_GROUP_BATCHES
from torch_dataloader_utils.runtime.loader import _Receiver, received

ROWS = [400, 300, 500]
TOTAL = sum(ROWS)


@pytest.fixture
def data(write_parquet: WriteParquet) -> Path:
    return write_parquet(ROWS, row_group_size=50)[0].parent


def _threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "torch_dataloader_utils-receive")


def test_receiving_thread_ends_with_the_epoch(data: Path) -> None:
    loader, _ = create_dataloader(str(data), batch_size=16, num_workers=2, shuffle=True)
    before = _threads()
    assert sorted(epoch_ids(loader)) == list(range(TOTAL))
    time.sleep(0.2)
    assert _threads() == before


def test_break_mid_epoch_then_iterate_again_with_persistent_workers(data: Path) -> None:
    loader, dataset = create_dataloader(str(data), batch_size=16, num_workers=2, persistent_workers=True)
    for n, _ in enumerate(loader):
        if n == 3:
            break  # the thread may still be inside the workers' iterator
    dataset.set_epoch(1)
    assert sorted(epoch_ids(loader)) == list(range(TOTAL))
    assert sorted(epoch_ids(loader)) == list(range(TOTAL))


def test_worker_error_arrives_after_the_batches_before_it(data: Path) -> None:
    bad = sorted(data.glob("*.parquet"))[1]
    corrupt(bad, [(4, 64)])  # data pages of the second file
    loader, _ = create_dataloader(str(data), batch_size=10, num_workers=1)
    seen: list[int] = []

    def read_all() -> None:
        for batch in loader:
            seen.extend(batch["id"].tolist())

    with pytest.raises(ReadError, match="part-0001"):
        read_all()
    assert seen[: ROWS[0]] == list(range(ROWS[0]))  # the first file's batches came first


def test_first_group_is_one_batch(data: Path) -> None:
    assert FIRST_GROUP_BATCHES == 1
    loader, _ = create_dataloader(str(data), batch_size=8, num_workers=1)
    it = iter(loader)
    assert len(next(it)["id"]) == 8


def test_received_hands_over_any_exception() -> None:
    def failing():
        yield 1
        raise SystemExit  # a BaseException, handed to the loop too

    items = received(_Receiver(failing(), 1))
    assert next(items) == 1
    with pytest.raises(SystemExit):
        next(items)


def test_received_never_waits_on_a_thread_that_is_gone() -> None:
    def slow():
        time.sleep(0.2)
        yield 1

    receiver = _Receiver(slow(), 1)
    receiver.stop()  # the thread drops its item and ends without a word
    with pytest.raises(RuntimeError, match="ended unexpectedly"):
        next(received(receiver))
