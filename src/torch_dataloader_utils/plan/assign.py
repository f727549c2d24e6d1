"""Longest-processing-time (LPT) assignment of weighted items to bins.

Items are taken heaviest first and each goes to the currently lightest bin; ties in
weight are broken by the item's position in the input, ties in load by the lower bin
index, so the result depends on the values alone. Every bin's load is at most
``mean + max(weight)``. Inside a bin, items keep their input order, so a shuffled
input stays shuffled within each worker.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["assign"]

T = TypeVar("T")


def assign(items: Sequence[T], num_bins: int, weight: Callable[[T], int]) -> list[list[T]]:
    """Distribute ``items`` over ``num_bins`` bins, balancing the sum of ``weight``.

    Args:
        items: The items, in the order each bin should keep them.
        num_bins: Number of bins (>= 1).
        weight: Non-negative weight of an item.

    Returns:
        ``num_bins`` lists; together they hold every item exactly once.
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    weights = [weight(item) for item in items]
    order = sorted(range(len(items)), key=lambda i: (-weights[i], i))
    heap = [(0, b) for b in range(num_bins)]
    owner = [0] * len(items)
    for i in order:
        load, b = heapq.heappop(heap)
        owner[i] = b
        heapq.heappush(heap, (load + weights[i], b))
    bins: list[list[T]] = [[] for _ in range(num_bins)]
    for i, item in enumerate(items):
        bins[owner[i]].append(item)
    return bins
