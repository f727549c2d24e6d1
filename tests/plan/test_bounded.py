"""The one bounded cache: FIFO or LRU eviction, ``on_drop`` for resources, no hand-written copies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_dataloader_utils.plan.bounded import BoundedDict

SRC = Path(__file__).resolve().parents[2] / "src" / "torch_dataloader_utils"


def test_fifo_drops_the_oldest_even_when_it_was_just_read() -> None:
    dropped: list[tuple[str, int]] = []
    cache: BoundedDict[str, int] = BoundedDict(2, on_drop=lambda k, v: dropped.append((k, v)))
    cache["a"], cache["b"] = 1, 2
    assert cache["a"] == 1  # a read does not refresh a FIFO entry
    cache["c"] = 3
    assert list(cache) == ["b", "c"]
    assert dropped == [("a", 1)]
    assert cache.get("a") is None
    assert cache.get("a", 0) == 0


def test_lru_drops_the_least_recently_used() -> None:
    dropped: list[str] = []
    cache: BoundedDict[str, int] = BoundedDict(2, lru=True, on_drop=lambda k, _: dropped.append(k))
    cache["a"], cache["b"] = 1, 2
    assert cache.get("a") == 1  # refreshed
    cache["c"] = 3
    assert list(cache) == ["a", "c"]
    assert dropped == ["b"]


def test_replacing_a_value_drops_the_old_one_and_clear_drops_all() -> None:
    dropped: list[int] = []
    cache: BoundedDict[str, int] = BoundedDict(4, on_drop=lambda _, v: dropped.append(v))
    cache["a"] = 1
    cache["a"] = 2
    cache["b"] = 3
    assert dropped == [1]
    assert cache.pop("b") == 3  # popped: the caller owns it, not dropped
    cache.clear()
    assert dropped == [1, 2]
    assert len(cache) == 0


def test_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 entry, got size=0"):
        BoundedDict(0)


@given(
    size=st.integers(1, 5),
    lru=st.booleans(),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=60),
)
def test_matches_a_reference_list(size: int, lru: bool, ops: list[tuple[bool, int]]) -> None:
    """Any sequence of reads and writes: the same keys, in the same order, as a plain list model."""
    cache: BoundedDict[int, int] = BoundedDict(size, lru=lru)
    model: list[int] = []
    for write, key in ops:
        if write:
            cache[key] = key
            if key in model:
                model.remove(key)
            model.append(key)
            del model[: max(0, len(model) - size)]
        else:
            got = cache.get(key)
            assert got == (key if key in model else None)
            if lru and key in model:
                model.remove(key)
                model.append(key)
        assert list(cache) == model


def test_no_hand_written_fifo_eviction_is_left_in_the_library() -> None:
    pattern = re.compile(r"pop\(next\(iter\(|popitem\(last=False\)")
    found = [
        f"{path.relative_to(SRC)}:{n}"
        for path in SRC.rglob("*.py")
        if path.name != "bounded.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == [], f"use plan.bounded.BoundedDict instead: {found}"
