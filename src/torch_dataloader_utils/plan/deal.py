"""Dealing an epoch's row stream to ranks: one rule for fresh and resumed epochs.

The *stream* is every row to read in one pass, in an order every process computes alike,
cut into *homes*, one contiguous range per rank:

* a fresh epoch's stream is the ranks' shares one after another, each share its rank's
  home: ``[rank::num_ranks]`` of the (shuffled) chunk order, or what a rank-aware
  strategy returned for the rank;
* a resumed epoch's stream is what the interrupted pass left, worker after worker, rank
  after rank, and its homes are even ranges of it.

Without equal batches (``'off'``, or one rank) every rank reads its home. With them:

* ``'drop'`` leaves out ``total % num_ranks`` rows, a span of the stream at an offset
  drawn from ``(seed, epoch, segment)`` when shuffling, else its last rows; ``'pad'``
  repeats ``-total % num_ranks`` rows, the stream read cyclically from an offset drawn
  the same way, else from its first row;
* every rank keeps the first ``quota`` rows of its home (the span aside); the rest of
  every home, home after home, then the padding, is the *pool*, and ranks short of the
  quota take their shortfall from it in rank order.

So a rank's rows are a few ranges of the stream (:meth:`Deal.ranges`): integer arithmetic
on a handful of values per rank, the same in every process. What the ranges hold is the
caller's to find (the planner's stream of chunks, or the resumer's pool of pieces).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from torch_dataloader_utils.plan.shuffle import random_offset
from torch_dataloader_utils.plan.types import EqualBatches

__all__ = ["DROP_SALT", "PAD_SALT", "Deal", "Range", "crossed", "deal"]

Array = np.ndarray[Any, Any]

DROP_SALT = 0x64726F70
"""Salt of the offset of the rows ``equal_batches='drop'`` leaves out."""
PAD_SALT = 0x70616400
"""Salt of the offset of the rows ``equal_batches='pad'`` repeats."""


class Range(NamedTuple):
    """Stream positions ``[lo, hi)``; ``padding``: rows repeated to pad a rank."""

    lo: int
    hi: int
    padding: bool = False


def _without(a: int, b: int, span: tuple[int, int]) -> list[tuple[int, int]]:
    """``[a, b)`` without the span, as at most two ranges."""
    s0, s1 = span
    if s1 <= a or s0 >= b or s0 == s1:
        return [(a, b)] if b > a else []
    return [(x, y) for x, y in ((a, s0), (s1, b)) if y > x]


def crossed(starts: Array, a: int, b: int) -> zip[tuple[int, int, int]]:
    """``(item, lo, hi)``: the items positions ``[a, b)`` cross, and rows ``[lo, hi)`` of each.

    ``starts`` holds each item's first position and the total, last; items of no
    positions are left out.
    """
    i0 = max(0, int(np.searchsorted(starts, a, side="right")) - 1)
    i1 = min(int(np.searchsorted(starts, b, side="left")), len(starts) - 1)
    first = starts[i0:i1]
    lo, hi = np.maximum(a - first, 0), np.minimum(b, starts[i0 + 1 : i1 + 1]) - first
    keep = hi > lo
    return zip(np.arange(i0, i1)[keep].tolist(), lo[keep].tolist(), hi[keep].tolist(), strict=True)


def _slice(ranges: Sequence[tuple[int, int]], skip: int, count: int) -> list[tuple[int, int]]:
    """Positions ``[skip, skip + count)`` of ``ranges`` taken one after another."""
    starts = np.cumsum([0, *(b - a for a, b in ranges)])
    return [(ranges[k][0] + x, ranges[k][0] + y) for k, x, y in crossed(starts, skip, skip + count)]


@dataclass(frozen=True, eq=False)
class Deal:
    """Which stream positions every rank reads: its home (off), or its quota (equal batches).

    Attributes:
        homes: Stream position of each home's start, and the total, last (``num_ranks + 1``).
        own: Rows each rank keeps of its home (all of them without equal batches).
        surplus: Pool position of each home's rows over the quota (and their total, last).
        deficit: Pool position of each rank's shortfall (and their total, last).
        span: Positions ``'drop'`` leaves out (empty otherwise).
        pad_offset: Position the padding starts at (``'pad'``).
        pad_rows: Rows of padding.
    """

    homes: Array
    own: Array
    surplus: Array
    deficit: Array
    span: tuple[int, int] = (0, 0)
    pad_offset: int = 0
    pad_rows: int = 0

    @property
    def num_ranks(self) -> int:
        """Ranks dealt to."""
        return len(self.homes) - 1

    @property
    def total(self) -> int:
        """Positions of the stream."""
        return int(self.homes[-1])

    def _home(self, rank: int) -> list[tuple[int, int]]:
        return _without(int(self.homes[rank]), int(self.homes[rank + 1]), self.span)

    def ranges(self, rank: int) -> list[Range]:
        """What ``rank`` reads, in order: its own rows, then its share of the pool."""
        if not 0 <= rank < self.num_ranks:
            raise ValueError(f"rank must be in [0, {self.num_ranks}), got {rank}")
        own = [Range(a, b) for a, b in _slice(self._home(rank), 0, int(self.own[rank]))]
        return own + self.pool(int(self.deficit[rank]), int(self.deficit[rank + 1]))

    def pool(self, x: int, y: int) -> list[Range]:
        """Pool positions ``[x, y)`` as stream ranges: homes' rows over the quota, then padding."""
        out = [
            Range(*r)
            for rank, lo, hi in crossed(self.surplus, x, y)
            for r in _slice(self._home(rank), int(self.own[rank]) + lo, hi - lo)
        ]
        first = int(self.surplus[-1])
        a, b = max(x, first) - first, min(y, first + self.pad_rows) - first
        total = self.total
        while a < b and total:  # the padding: the stream read cyclically from pad_offset
            s = (self.pad_offset + a) % total
            n = min(b - a, total - s)
            out.append(Range(s, s + n, True))
            a += n
        return out

    def dropped(self) -> list[Range]:
        """The positions no rank reads (``'drop'``)."""
        return [Range(*self.span)] if self.span[1] > self.span[0] else []

    def padding(self) -> list[Range]:
        """The positions read a second time to pad ranks (``'pad'``)."""
        if not self.pad_rows:
            return []
        first = int(self.surplus[-1])
        return self.pool(first, first + self.pad_rows)


def deal(
    total: int,
    num_ranks: int,
    policy: EqualBatches,
    *,
    homes: Array | None = None,
    shuffle: bool = False,
    seed: int = 0,
    key: tuple[int, ...] = (0,),
) -> Deal:
    """Deal a stream of ``total`` positions to ``num_ranks`` ranks under ``policy``.

    Args:
        total: Positions of the stream (rows; or items, when row counts are unknown and
            equal batches are off).
        num_ranks: Ranks to deal to.
        policy: The equal-batches policy (acts with more than one rank).
        homes: Each home's start and the total (``num_ranks + 1`` positions), or ``None``
            for even homes: ranges of ``quota`` rows (the span aside), or of
            ``ceil(total / num_ranks)`` without equal batches.
        shuffle: Draw the dropped span and the padding's start from ``(seed, *key)``.
        seed: The shuffle seed.
        key: ``(epoch, *salt)``: what the draws depend on besides the seed.
    """
    ranks = np.arange(num_ranks + 1, dtype=np.int64)
    epoch, salt = key[0], key[1:]
    span, pad_offset, pad_rows = (total, total), 0, 0
    quota: int | None = None
    if not policy.acts_on(num_ranks):
        even = np.minimum(ranks * -(-total // num_ranks), total)
    elif policy is EqualBatches.PAD:
        pad_rows = -total % num_ranks
        quota = (total + pad_rows) // num_ranks
        if shuffle and total and pad_rows:
            pad_offset = random_offset(total, seed, epoch, PAD_SALT, *salt)
        even = np.minimum(ranks * quota, total)
    else:
        k = total % num_ranks
        quota = (total - k) // num_ranks
        lo = random_offset(total - k + 1, seed, epoch, DROP_SALT, *salt) if shuffle and k else total - k
        span = (lo, lo + k)
        even = np.where(ranks * quota > lo, ranks * quota + k, ranks * quota)
        even[-1] = total
    homes = even if homes is None else np.asarray(homes, dtype=np.int64)
    inside = np.clip(np.minimum(homes[1:], span[1]) - np.maximum(homes[:-1], span[0]), 0, None)
    kept = np.diff(homes) - inside
    want = kept if quota is None else quota  # without equal batches a rank keeps its whole home
    own = np.minimum(kept, want)
    surplus, deficit = (np.concatenate(([0], np.cumsum(n))) for n in (kept - own, want - own))
    return Deal(homes, own, surplus, deficit, span, pad_offset, pad_rows)
