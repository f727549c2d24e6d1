"""Dealing an epoch's chunks out to ranks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["slice_for_rank"]

T = TypeVar("T")


def slice_for_rank(items: Sequence[T], num_ranks: int, rank: int) -> list[T]:
    """Rank ``rank``'s share of ``items``: every ``num_ranks``-th item from ``rank`` on.

    Applied after the shuffle, so each rank's share changes from epoch to epoch while
    the shares stay disjoint and together cover every item.
    """
    if not 0 <= rank < num_ranks:
        raise ValueError(f"rank must be in [0, {num_ranks}), got {rank}")
    return list(items[rank::num_ranks])
