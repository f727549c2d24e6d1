"""Durations in tests: bounds that machine load cannot break (issue 37).

A test of a deadline proves that the call ends and that its error names the deadline
(a server that never answers makes the cause certain); how long it took is checked
only against a generous outer limit, ``LOADED`` times the budget the test sets: on a
busy 2-core machine a 3 s budget took 6.9 s, which failed ``< 3 + 3``.
"""

from __future__ import annotations

LOADED = 10
"""How much longer than its budget a call may take on a loaded machine."""


def assert_ends_within(elapsed: float, budget: float) -> None:
    """``elapsed`` seconds are under ``LOADED`` times ``budget`` (the call did not hang)."""
    assert elapsed < LOADED * budget, f"{elapsed:.1f} s for a budget of {budget:g} s (limit {LOADED}x)"
