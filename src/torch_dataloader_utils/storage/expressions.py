"""Row filters identified losslessly: a digest of the serialized expression, never its text.

``str()`` of a ``pyarrow.compute.Expression`` abbreviates long literals: an ``is_in``
with 22 or more values prints its first and last ten, so two different filters print
the same. Everything that decides "is this the same filter?" (the metadata cache, the
resume state's fingerprint, a reshard job's options) compares :func:`filter_key`, the
SHA-256 of the expression as pickle serializes it (pyarrow's own serialization: every
literal, in full). The text stays next to it, for people.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import Any

__all__ = ["filter_identity", "filter_key", "lossless_text"]


def filter_key(filters: object) -> str | None:
    """SHA-256 (hex) of ``filters`` serialized, or ``None`` without a filter.

    Equal for equal expressions, in every process and run; different whenever any
    literal, field or operator differs. An object pickle cannot serialize is keyed by
    its ``repr``.
    """
    if filters is None:
        return None
    try:
        data = pickle.dumps(filters, protocol=4)
    except Exception:  # not picklable: its repr is the best identity there is
        data = repr(filters).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def lossless_text(text: str) -> bool:
    """Whether a filter's text (``str(expression)``) shows it whole (pyarrow abbreviates with ``...``)."""
    return "..." not in text


def filter_identity(filters: object) -> dict[str, Any]:
    """A filter as a record of what was read (a resume state, a reshard job) holds it.

    ``{"filters": text}`` for people, plus ``"filters_sha256"`` (:func:`filter_key`)
    when a filter is set, which is what tells two filters apart. Without a filter the
    record is ``{"filters": None}``, as before the key existed.
    """
    if filters is None:
        return {"filters": None}
    return {"filters": str(filters), "filters_sha256": filter_key(filters)}
