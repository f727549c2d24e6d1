"""accelerate: the flag that makes ``Accelerator.prepare`` leave an object as it is.

Accelerate 1.x marks what it prepared with the attribute ``_is_accelerate_prepared`` and
returns such an object unchanged from ``prepare()``. The library's loader carries it:
the dataset shards itself by rank, and Accelerate's own wrapping of an
``IterableDataset`` would have rank 0 read its share and dispatch it to every process,
so the other ranks' rows would never be read. There is no public way to opt out.
"""

from __future__ import annotations

__all__ = ["PREPARED_FLAG"]

PREPARED_FLAG = "_is_accelerate_prepared"
"""The attribute ``Accelerator.prepare`` checks (``getattr(obj, PREPARED_FLAG, False)``)."""
