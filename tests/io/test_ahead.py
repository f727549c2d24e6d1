"""Decoding ahead: a background thread a few items in front of the reader, order and errors kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from torch_dataloader_utils.io.ahead import read_ahead


class Source:
    """Yields 0..n-1 (raising ``error`` at ``fail_at``), recording how far it was advanced."""

    def __init__(self, n: int, fail_at: int | None = None, error: Exception | None = None) -> None:
        self.n, self.fail_at, self.error = n, fail_at, error
        self.produced = 0
        self.closed = False
        self.thread: str | None = None

    def __iter__(self) -> Iterator[int]:
        try:
            for i in range(self.n):
                if i == self.fail_at and self.error is not None:
                    raise self.error
                self.thread = threading.current_thread().name
                self.produced += 1
                yield i
        finally:
            self.closed = True


def wait_for(condition, seconds: float = 60.0) -> None:  # polled: long only on a loaded machine
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.005)


def test_items_come_out_in_order_from_a_background_thread() -> None:
    source = Source(100)
    assert list(read_ahead(iter(source), depth=3, name="t")) == list(range(100))
    assert source.thread == "torch_dataloader_utils-t"
    assert source.closed


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_the_thread_runs_ahead_but_at_most_depth_items(depth: int) -> None:
    source = Source(50)
    items = read_ahead(iter(source), depth=depth)
    for k in range(10):
        assert next(items) == k
        # k + 1 items handed out, `depth` queued, one more held by the blocked thread
        wait_for(lambda k=k: source.produced >= min(50, k + 1 + depth))
        time.sleep(0.02)
        assert source.produced <= k + 2 + depth
    items.close()


def test_an_error_is_raised_where_it_happened_with_its_type_and_message() -> None:
    source = Source(10, fail_at=6, error=KeyError("row group 3 is gone"))
    items = read_ahead(iter(source), depth=2)
    got = [next(items) for _ in range(6)]
    with pytest.raises(KeyError, match="row group 3 is gone"):
        next(items)
    assert got == [0, 1, 2, 3, 4, 5]  # every item before the error, none after
    assert source.closed


def test_stopping_early_stops_the_thread_and_closes_the_source() -> None:
    source = Source(10_000)
    items = read_ahead(iter(source), depth=2, name="early")
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    items.close()
    assert source.closed  # closed in the thread, which was joined
    assert not any(t.name == "torch_dataloader_utils-early" for t in threading.enumerate())
    assert source.produced <= 3 + 2 + 1


def test_depth_is_checked() -> None:
    with pytest.raises(ValueError, match="depth must be >= 1, got 0"):
        next(read_ahead(iter([1]), depth=0))


def test_while_the_queue_is_full_the_thread_prepares_queued_items_newest_first() -> None:
    prepared: list[int] = []
    lock = threading.Lock()

    def prepare(item: dict[str, int | bool]) -> bool:
        with lock:
            if item["ready"]:
                return False
            item["ready"] = True
            prepared.append(int(item["n"]))
            return True

    items = read_ahead(iter([{"n": i, "ready": False} for i in range(6)]), depth=2, prepare=prepare)
    first = next(items)
    wait_for(lambda: len(prepared) >= 2)  # the queue is full: both queued items prepared
    assert prepared[0] > prepared[1]  # newest first
    rest = list(items)
    assert [first["n"], *(i["n"] for i in rest)] == list(range(6))
    assert {int(i["n"]) for i in [first, *rest] if i["ready"]} >= set(prepared[:2])
