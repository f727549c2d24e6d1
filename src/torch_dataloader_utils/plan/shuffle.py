"""Deterministic shuffling of chunk order, seeded by the pair ``(seed, epoch)``.

The generator is ``numpy.random.default_rng`` seeded with the tuple ``(seed, epoch)``
through ``SeedSequence``, so ``(42, 1)`` and ``(43, 0)`` give unrelated permutations (a
seed of ``seed + epoch`` would make them equal). Each value is fed as its count of
32-bit words followed by the words, and the number of values comes last: given the plain
tuple, ``SeedSequence`` would split a seed of ``2**32 + 5`` into the words ``(5, 1)`` and
collide with seed 5, epoch 1, and would ignore a trailing zero salt. No global random
state is touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

__all__ = ["permutation", "random_offset", "shuffled"]

T = TypeVar("T")

_WORD = 2**32 - 1
_INT32_MAX = 2**31 - 1


def permutation(n: int, seed: int, epoch: int, *salt: int, narrow: bool = False) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on ``(seed, epoch, *salt)``.

    Args:
        n: Length of the permutation.
        seed: The user's shuffle seed (a non-negative int).
        epoch: The epoch (a non-negative int).
        salt: Further non-negative ints mixed into the seed (e.g. a rank).
        narrow: Return ``int32`` when ``n`` fits (half the memory; the same values:
            the shuffle's draws do not depend on the element type).

    Returns:
        An int64 (or, ``narrow``, int32) array holding each of ``0..n-1`` once.
    """
    rng = _rng(seed, epoch, *salt)
    if narrow and n <= _INT32_MAX:
        out = np.arange(n, dtype=np.int32)
        rng.shuffle(out)  # what Generator.permutation(n) does, over int32
        return out
    return rng.permutation(n)


def random_offset(n: int, seed: int, epoch: int, *salt: int) -> int:
    """An int in ``[0, n)`` (``n >= 1``) that depends only on ``(seed, epoch, *salt)``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return int(_rng(seed, epoch, *salt).integers(0, n))


def _rng(seed: int, epoch: int, *salt: int) -> np.random.Generator:
    values = (seed, epoch, *salt)
    if any(v < 0 for v in values):
        raise ValueError(f"seed, epoch and salt must be >= 0, got {values}")
    entropy: list[int] = []
    for v in values:
        words = _words(int(v))
        entropy += [len(words), *words]
    return np.random.default_rng([*entropy, len(values)])


def _words(value: int) -> list[int]:
    """``value`` (>= 0) as 32-bit words, least significant first; 0 is one word."""
    words = [value & _WORD]
    value >>= 32
    while value:
        words.append(value & _WORD)
        value >>= 32
    return words


def shuffled(items: Sequence[T], seed: int, epoch: int, *salt: int) -> list[T]:
    """``items`` reordered by :func:`permutation`."""
    return [items[i] for i in permutation(len(items), seed, epoch, *salt)]
