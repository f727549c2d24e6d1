"""Which data files could hold twins of each other's rows, from the column bounds in the manifests.

Comparing rows by content (:mod:`~torch_dataloader_utils.discovery.iceberg_delta`) reads
the files added since a snapshot and the files removed since. A row has a twin only in
a file whose values overlap its own on *every* column, so a file whose range of some
column (its manifest's lower and upper bounds) meets no range of the other side on that
column cannot hold a twin, and is not read. Appended files whose ids or timestamps grow
past those of the files a compaction rewrote are the usual case.

The test is conservative: a column is used only when every file of the other side has
bounds for it, and not when both sides may hold nulls there (nulls are outside the
bounds and match nulls), nor NaN for floating point columns. Truncated string bounds
(lower bound a prefix, upper bound rounded up) stay valid bounds.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Any

__all__ = ["may_match"]

_FLOATS = ("float", "double")


def may_match(files: Mapping[str, Any], others: Mapping[str, Any], types: Mapping[int, Any]) -> set[str]:
    """The paths of ``files`` (pyiceberg ``DataFile`` values) that may hold a row of ``others``.

    Args:
        files: Data files by path.
        others: The other side's data files by path.
        types: Iceberg type of each field id (primitive fields only are used).
    """
    if not files or not others:
        return set()
    usable = sorted(fid for fid, t in types.items() if t.is_primitive)
    ranges = {fid: _Ranges.of(others.values(), fid, types[fid]) for fid in usable}
    out = set()
    for path, df in files.items():
        if not any(r is not None and r.apart(df) for r in ranges.values()):
            out.add(path)
    return out


class _Ranges:
    """One column's bounds over a side's files: sorted lower bounds and the running upper maximum."""

    def __init__(self, fid: int, field_type: Any, lows: list[Any], highs: list[Any], nulls: bool, nans: bool):
        order = sorted(range(len(lows)), key=lambda i: lows[i])
        self.fid = fid
        self.type = field_type
        self.lows = [lows[i] for i in order]
        self.top: list[Any] = []
        for i in order:
            self.top.append(highs[i] if not self.top or highs[i] > self.top[-1] else self.top[-1])
        self.nulls = nulls
        self.nans = nans

    @classmethod
    def of(cls, files: Any, fid: int, field_type: Any) -> _Ranges | None:
        """The ranges of column ``fid`` over ``files``, or ``None`` when a file has no bounds for it."""
        lows, highs = [], []
        nulls = nans = False
        for df in files:
            low, high = _bound(df.lower_bounds, fid, field_type), _bound(df.upper_bounds, fid, field_type)
            if low is None or high is None:
                return None
            lows.append(low)
            highs.append(high)
            nulls = nulls or _may_have(df.null_value_counts, fid)
            nans = nans or _may_have(df.nan_value_counts, fid)
        return cls(fid, field_type, lows, highs, nulls, nans)

    def apart(self, df: Any) -> bool:
        """Whether no row of ``df`` can equal a row of this side on this column."""
        if self.nulls and _may_have(df.null_value_counts, self.fid):
            return False
        if str(self.type) in _FLOATS and self.nans and _may_have(df.nan_value_counts, self.fid):
            return False
        low, high = _bound(df.lower_bounds, self.fid, self.type), _bound(df.upper_bounds, self.fid, self.type)
        if low is None or high is None:
            return False
        try:
            below = bisect.bisect_right(self.lows, high)  # the other files starting at or below `high`
            return below == 0 or self.top[below - 1] < low
        except TypeError:  # values that do not compare (a type changed): no conclusion
            return False


def _bound(bounds: Mapping[int, bytes] | None, fid: int, field_type: Any) -> Any:
    from pyiceberg.conversions import from_bytes

    raw = (bounds or {}).get(fid)
    if raw is None:
        return None
    try:
        return from_bytes(field_type, raw)
    except (ValueError, TypeError, NotImplementedError):
        return None


def _may_have(counts: Mapping[int, int] | None, fid: int) -> bool:
    """Whether a file may have nulls (or NaN) in a column: unknown counts say it may."""
    if counts is None or fid not in counts:
        return True
    return int(counts[fid]) > 0
