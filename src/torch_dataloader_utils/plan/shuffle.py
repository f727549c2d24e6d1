"""Deterministic shuffling of chunk order, seeded by the pair ``(seed, epoch)``.

The generator is ``numpy.random.default_rng((seed, epoch))``: the tuple goes through
``SeedSequence``, so ``(42, 1)`` and ``(43, 0)`` give unrelated permutations (a seed of
``seed + epoch`` would make them equal). No global random state is touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

__all__ = ["permutation", "shuffled"]

T = TypeVar("T")


def permutation(n: int, seed: int, epoch: int, *salt: int) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on ``(seed, epoch, *salt)``.

    Args:
        n: Length of the permutation.
        seed: The user's shuffle seed (a non-negative int).
        epoch: The epoch (a non-negative int).
        salt: Further non-negative ints mixed into the seed (e.g. a rank).

    Returns:
        An int64 array holding each of ``0..n-1`` once.
    """
    if seed < 0 or epoch < 0 or any(s < 0 for s in salt):
        raise ValueError(f"seed, epoch and salt must be >= 0, got {(seed, epoch, *salt)}")
    rng = np.random.default_rng((seed, epoch, *salt))
    return rng.permutation(n)


def shuffled(items: Sequence[T], seed: int, epoch: int, *salt: int) -> list[T]:
    """``items`` reordered by :func:`permutation`."""
    return [items[i] for i in permutation(len(items), seed, epoch, *salt)]
