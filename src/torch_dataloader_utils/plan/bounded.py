"""A dict that holds at most a fixed number of entries: the library's one bounded cache.

Plans, resumers, file infos and open files are kept for reuse in a few caches whose
size is fixed (4 to 256 entries). Each is a :class:`BoundedDict`: adding an entry past
the size drops the oldest one (first in, first out), or, with ``lru=True``, the one
used least recently (a lookup counts as a use). A cache whose entries hold resources
(open files) passes ``on_drop``, called with every entry it drops, and closes what is
left with :meth:`BoundedDict.clear`.

It is pure Python (``plan/`` stays free of heavy libraries) and not thread-safe: a
cache shared by threads is guarded by its owner's lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

__all__ = ["BoundedDict"]

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")


class BoundedDict(Generic[K, V]):
    """At most ``size`` entries; the oldest (or least recently used) is dropped first.

    Args:
        size: Most entries held (at least 1).
        lru: Drop the least recently used entry (a lookup refreshes it) instead of the
            oldest one.
        on_drop: Called with ``(key, value)`` of every entry dropped to make room, replaced
            under the same key, or removed by :meth:`clear` (e.g. to close a file).

    Raises:
        ValueError: ``size`` is below 1.
    """

    __slots__ = ("_data", "_lru", "_on_drop", "size")

    def __init__(
        self, size: int, *, lru: bool = False, on_drop: Callable[[K, V], object] | None = None
    ) -> None:
        if size < 1:
            raise ValueError(f"a BoundedDict holds at least 1 entry, got size={size}")
        self.size = size
        self._lru = lru
        self._on_drop = on_drop
        self._data: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __getitem__(self, key: K) -> V:
        value = self._data[key]
        if self._lru:
            self._data.move_to_end(key)
        return value

    @overload
    def get(self, key: K) -> V | None: ...

    @overload
    def get(self, key: K, default: D) -> V | D: ...

    def get(self, key: K, default: object = None) -> object:
        """The value of ``key`` (a use, with ``lru``), or ``default``."""
        if key not in self._data:
            return default
        return self[key]

    def __setitem__(self, key: K, value: V) -> None:
        old = self._data.pop(key, None) if key in self._data else None
        self._data[key] = value
        if old is not None and old is not value and self._on_drop is not None:
            self._on_drop(key, old)
        while len(self._data) > self.size:
            dropped = self._data.popitem(last=False)
            if self._on_drop is not None:
                self._on_drop(*dropped)

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove ``key`` and return its value (``on_drop`` is not called: the caller owns it)."""
        return self._data.pop(key, default)

    def values(self) -> list[V]:
        """The values, oldest (or least recently used) first."""
        return list(self._data.values())

    def clear(self) -> None:
        """Remove every entry, calling ``on_drop`` with each."""
        while self._data:
            dropped = self._data.popitem(last=False)
            if self._on_drop is not None:
                self._on_drop(*dropped)
