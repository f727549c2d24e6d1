"""A rank's rows dealt to its workers: LPT by weight, then worker quotas.

What a rank reads comes from :mod:`.deal` as ranges of the epoch's stream, found in the
stream as :data:`Span` values (a few ints each: no object per chunk until a worker reads
it). They are spread over the rank's workers by LPT (:func:`~.assign.assign`), keeping
their order inside each worker, and, with equal batches, every worker is then given an
exact quota of rows (:func:`worker_quotas`), cutting spans at row granularity, so the
rank's batch count does not depend on how many workers it has:

* every worker's quota is a multiple of ``batch_size``, except that one worker of the
  rank also takes the rank's remainder ``rows % batch_size``;
* so a rank yields ``ceil(rows / batch_size)`` batches (``floor`` with ``drop_last``).

Fresh and resumed epochs share all of it; only their streams differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch_dataloader_utils.plan.assign import assign

__all__ = ["Span", "span_rows", "to_workers", "worker_quotas"]

Span = tuple[int, int, int, int, bool]
"""``(segment, item, lo, hi, padding)``: rows ``[lo, hi)`` of one item of a stream's segment
(``hi`` is ``-1`` for a whole item whose row count is unknown); ``padding``: the rows repeat
rows read elsewhere (``equal_batches='pad'``)."""


def span_rows(span: Span) -> int:
    """Rows of a span (of a known row count)."""
    return span[3] - span[2]


def worker_quotas(rows: int, num_workers: int, batch_size: int) -> list[int]:
    """Rows per worker so that a rank's batch count does not depend on ``num_workers``.

    The rank's ``rows // batch_size`` full batches are dealt round-robin to workers;
    the remainder ``rows % batch_size`` (the rank's only short batch) goes to the first
    worker with one full batch fewer than the others (worker 0 when all are even).
    The rank then yields ``ceil(rows / batch_size)`` batches for any ``num_workers``.
    """
    if num_workers < 1 or batch_size < 1:
        raise ValueError(f"num_workers and batch_size must be >= 1, got {num_workers}, {batch_size}")
    full, rest = divmod(rows, batch_size)
    base, extra = divmod(full, num_workers)
    quotas = [(base + (w < extra)) * batch_size for w in range(num_workers)]
    quotas[extra] += rest
    return quotas


def _take(spans: Sequence[Span], rows: int) -> tuple[list[Span], list[Span]]:
    """The first ``rows`` rows of ``spans`` (the span they end in cut there), and the rest."""
    for k, span in enumerate(spans):
        n = span_rows(span)
        if n > rows:
            segment, item, lo, hi, padding = span
            head = [(segment, item, lo, lo + rows, padding)] if rows else []
            return [*spans[:k], *head], [(segment, item, lo + rows, hi, padding), *spans[k + 1 :]]
        rows -= n
    return list(spans), []


def _fill(bins: Sequence[Sequence[Span]], quotas: Sequence[int]) -> list[list[Span]]:
    """Every bin keeps its first ``quota`` rows; the rest, in bin order, tops up the others."""
    kept: list[list[Span]] = []
    pool: list[Span] = []
    for spans, quota in zip(bins, quotas, strict=True):
        head, tail = _take(spans, quota)
        kept.append(head)
        pool += tail
    for out, quota in zip(kept, quotas, strict=True):
        taken, pool = _take(pool, quota - sum(span_rows(s) for s in out))
        out += taken
    assert not pool, "worker quotas add up to the rank's rows"
    return kept


def to_workers(
    spans: Sequence[Span], num_workers: int, weight: Callable[[Span], int], *, batch_size: int, equal: bool
) -> list[list[Span]]:
    """A rank's spans per worker: LPT by ``weight``, then (``equal``) exact worker quotas."""
    bins = assign(spans, num_workers, weight)
    if not equal:
        return bins
    return _fill(bins, worker_quotas(sum(span_rows(s) for s in spans), num_workers, batch_size))
