"""Hypothesis strategies for storage faults: what fails, how often, under which reading options."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

__all__ = ["FS_FAULTS", "PROXY_FAULTS", "FaultCase", "fault_cases", "formats_for"]

PROXY_FAULTS = ("503", "reset", "cut", "flip")
"""Faults the HTTP proxy in front of the S3 server injects (``testsupport.faults.FaultProxy``)."""
FS_FAULTS = ("eio", "eacces", "memory")
"""Faults a ``filesystem=`` object's reads raise (``testsupport.faults.FaultyFileSystem``)."""
FORMATS = ("parquet", "orc", "jsonl", "csv", "iceberg")


def formats_for(kind: str) -> tuple[str, ...]:
    """The formats a fault applies to.

    A flipped byte is detectable where the bytes carry a checksum (Parquet written with
    page checksums) or where ``0xFF`` never decodes (UTF-8 text); ORC and the Parquet
    files pyiceberg writes carry none, and a flip that still decodes is not detectable
    there (docs/failure-modes.md). Iceberg reads through its own FileIO, not ``filesystem=``.
    """
    if kind == "flip":
        return ("parquet", "jsonl", "csv")
    if kind in FS_FAULTS:
        return ("parquet", "orc", "jsonl", "csv")
    return FORMATS


@dataclass(frozen=True)
class FaultCase:
    """One storage fault while a loader reads.

    Attributes:
        kind: What fails (:data:`PROXY_FAULTS`, :data:`FS_FAULTS`).
        fmt: The files' format.
        policy: ``on_bad_data``: ``"skip"`` or ``"quarantine"``.
        cache: Whether reads go through a ``data_cache``.
        every: Every how many matching requests fail.
        limit: How many fail at most (``-1``: all of them from then on, an outage).
    """

    kind: str
    fmt: str
    policy: str
    cache: bool
    every: int
    limit: int


@st.composite
def fault_cases(draw: st.DrawFn) -> FaultCase:
    """A :class:`FaultCase`: any fault, a format it applies to, either policy, with or without a cache."""
    kind = draw(st.sampled_from(PROXY_FAULTS + FS_FAULTS))
    return FaultCase(
        kind=kind,
        fmt=draw(st.sampled_from(formats_for(kind))),
        policy=draw(st.sampled_from(("skip", "quarantine"))),
        cache=draw(st.booleans()),
        every=draw(st.integers(1, 4)),
        limit=draw(st.sampled_from((1, 2, 3, -1))),
    )
