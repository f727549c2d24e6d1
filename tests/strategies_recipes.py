"""Hypothesis strategies of the training-data recipes: weights of a mix, documents to pack."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

__all__ = ["document_lengths", "float_weights", "int_weights", "offsets_of", "schedule_starts"]

int_weights = st.lists(st.integers(1, 60), min_size=1, max_size=6)
"""Integer weights of 1 to 6 sources."""

float_weights = st.lists(st.floats(0.01, 100, allow_nan=False, allow_infinity=False), min_size=1, max_size=5)
"""Weights as users write them (fractions like 0.3, counts like 50)."""

schedule_starts = st.lists(st.integers(1, 60), min_size=0, max_size=4).map(
    lambda gaps: [0, *np.cumsum(gaps).tolist()]
)
"""Where the stages of a schedule start: 0, then increasing."""

document_lengths = st.lists(st.integers(0, 40), min_size=0, max_size=60)
"""Token counts of the documents of one batch (empty documents included)."""


def offsets_of(lengths: list[int]) -> np.ndarray:
    """Arrow list offsets (from 0) of documents of ``lengths`` tokens."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out
