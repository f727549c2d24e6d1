"""What a value handed to ``load_state_dict`` is, when it is not the resume state expected.

A loader's ``state_dict()`` is ``{"rank<r>": "<JSON>"}``; the JSON is a state of one
format: a loader of files or an Iceberg table (``torch_dataloader_utils.resume``), a
mixed loader (``torch_dataloader_utils.mix``), or the merged view ``GatheredState``
writes (``torch_dataloader_utils.gathered``). :func:`not_a_state` says what went wrong
with a value that is none of the expected kind: a state of another kind of loader, rank
keys spelled otherwise (``rank00``, ``Rank0``), entries already decoded from JSON, an
empty or unrelated dict. Only messages are decided here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from torch_dataloader_utils.errors import ResumeStateError

__all__ = ["GATHERED_FORMAT", "MIX_FORMAT", "PLAIN_FORMAT", "RANK_KEY", "not_a_state"]

PLAIN_FORMAT = "torch_dataloader_utils.resume"
"""The ``format`` of the state of a loader of files or of an Iceberg table."""
MIX_FORMAT = "torch_dataloader_utils.mix"
"""The ``format`` of the state of a mixed loader."""
GATHERED_FORMAT = "torch_dataloader_utils.gathered"
"""The ``format`` of what ``GatheredState.state_dict()`` returns."""
RANK_KEY = re.compile(r"rank(0|[1-9][0-9]{0,5})")
"""A key of a loader's state: ``rank`` and the rank, in lower case, without leading zeros."""


@dataclass(frozen=True)
class _Kind:
    title: str  # what the error starts with
    name: str  # what saves states of this format
    source: str  # the call that returns them
    load: str  # how such a state is loaded


_KINDS = {
    PLAIN_FORMAT: _Kind(
        "not a torch_dataloader_utils resume state",
        "a loader of files or an Iceberg table (create_dataloader)",
        "loader.state_dict()",
        "load it into a loader of create_dataloader (or IcebergDataset.create_dataloader)",
    ),
    MIX_FORMAT: _Kind(
        "not the resume state of a mixed dataset",
        "a mixed loader (create_mixed_dataloader)",
        "the mixed loader's state_dict()",
        "load it into a loader of create_mixed_dataloader",
    ),
    GATHERED_FORMAT: _Kind(
        "not a GatheredState",
        "GatheredState(loader), every rank's state merged",
        "GatheredState(loader).state_dict()",
        "load it with GatheredState(loader).load_state_dict()",
    ),
}
_RANKISH = re.compile(r"(?i)rank[ _-]?\d+|\d+")
"""Keys that were meant as rank keys: ``Rank0``, ``rank_1``, ``rank00``, ``0``."""
_SHOWN = 6


def not_a_state(value: object, expected: str) -> ResumeStateError:
    """The error for ``value``, which is not a resume state of the format ``expected``.

    Args:
        value: What was handed over (a loader's state unwrapped, or the whole of it).
        expected: The format the loading object reads (one of the ``*_FORMAT`` values).

    Returns:
        A :class:`ResumeStateError` whose message says what ``value`` is instead and
        what to pass.
    """
    kind = _KINDS[expected]
    what, fix = _what(value, expected)
    return ResumeStateError(f"{kind.title}: {what}; {fix or f'pass what {kind.source} returned, unchanged'}")


def _what(value: object, expected: str) -> tuple[str, str | None]:
    """What ``value`` is, and the fix when it is not "pass the state unchanged"."""
    if not isinstance(value, Mapping):
        return f"got a {type(value).__name__}, not the dict state_dict() returns", None
    if not value:
        return "the state is an empty dict", None
    found = value.get("format")
    if isinstance(found, str) and found in _KINDS and found != expected:
        other = _KINDS[found]
        return f"it is the state of {other.name}, from {other.source}", other.load
    keys = list(value)
    if all(isinstance(k, int) or (isinstance(k, str) and _RANKISH.fullmatch(k)) for k in keys):
        wrong = [k for k in keys if not (isinstance(k, str) and RANK_KEY.fullmatch(k))]
        if wrong:
            return (
                f"its keys {_few(wrong)} are not rank keys: a loader's state_dict() has the keys 'rank0', "
                "'rank1', ... ('rank' and the rank, in lower case, without leading zeros)"
            ), None
        decoded = [f"{k!r} is a {type(v).__name__}" for k, v in value.items() if not isinstance(v, str)]
        if decoded:
            return (
                f"its entry {', '.join(decoded[:_SHOWN])}, not the JSON string state_dict() returns "
                "(decoded on the way, by json.loads or a config store?)"
            ), "keep each entry a JSON string (json.dumps it back), or pass the state unchanged"
        return (
            f"it is a loader's own state_dict() (keys {_few(keys)})",
            "load it with the loader's load_state_dict(), or checkpoint GatheredState(loader) instead",
        )
    if found is None:
        return f"a dict with the keys {_few(keys)} and no 'format' {expected!r}", None
    return f"its format is {found!r}, not {expected!r}", None


def _few(keys: list[object]) -> str:
    shown = ", ".join(repr(k) for k in keys[:_SHOWN])
    return f"[{shown}{', ...' if len(keys) > _SHOWN else ''}]"
