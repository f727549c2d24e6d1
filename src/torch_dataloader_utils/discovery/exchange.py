"""The seam between discovery and the ranks: how metadata reads are shared.

Discovery never communicates itself: it is handed an :class:`Exchange`. The runtime
passes one over its process group (``runtime/share.py``); without one,
:data:`LOCAL` makes this process read everything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["LOCAL", "Exchange", "LocalExchange"]

T = TypeVar("T")


@runtime_checkable
class Exchange(Protocol):
    """The collectives metadata discovery needs, over ``size`` processes.

    Every process must make the same calls in the same order (they are collective):
    discovery catches its own errors and passes them through the exchange, so a
    failure on one rank is raised on every rank and none is left waiting.
    """

    @property
    def rank(self) -> int:
        """This process's position, ``0 <= rank < size``."""
        ...

    @property
    def size(self) -> int:
        """Processes taking part."""
        ...

    def from_rank0(self, read: Callable[[], T]) -> T:
        """``read()`` run on rank 0 only; its result (or its error) on every rank.

        The result must pickle; keep it small or make it bytes (an Arrow IPC buffer).
        """
        ...

    def all_gather(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload``, in rank order, on every rank."""
        ...


class LocalExchange:
    """The exchange of a single process: it reads everything itself."""

    @property
    def rank(self) -> int:
        """Always 0."""
        return 0

    @property
    def size(self) -> int:
        """Always 1."""
        return 1

    def from_rank0(self, read: Callable[[], T]) -> T:
        """Just ``read()``."""
        return read()

    def all_gather(self, payload: bytes) -> list[bytes]:
        """``[payload]``."""
        return [payload]


LOCAL: Exchange = LocalExchange()
"""The exchange of a process that reads all metadata itself."""
