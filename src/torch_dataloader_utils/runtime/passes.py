"""The loader's protocol: a :class:`Pass` over an epoch, opened by the dataset, run by the loader.

The library's loader talks to its dataset through one call,
:meth:`~torch_dataloader_utils.runtime.dataset.OrderedDataset.open_pass`, which gives a
:class:`Pass`: the loader hands it every item a worker sent (:meth:`Pass.deliver`, where a
joiner or a sequencer stands between the workers and the loop), records every batch as
consumed when the loop takes it (:meth:`Pass.consume`), tells it when its workers started
(:meth:`Pass.started`: they took the :class:`Handoff`) and when the pass is over.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import pyarrow as pa

from torch_dataloader_utils.runtime.ledger import PassLedger
from torch_dataloader_utils.runtime.orders import Delivery, Order
from torch_dataloader_utils.runtime.state import EpochProgress, PassLog, Tagged
from torch_dataloader_utils.transfer import SegmentPool

__all__ = ["MEASURED_ROWS", "Handoff", "Pass", "PassOwner", "files_bytes_per_row"]

MEASURED_ROWS = 65536
"""Rows of a pass's first groups whose Arrow bytes size later passes' groups."""


def files_bytes_per_row(order: Order) -> float:
    """The Arrow bytes per row an order's first batches will have, estimated before any arrived.

    Per source: the columns read of a fixed width count their width (exact); if any column
    read has a variable width (strings, lists), twice the bytes per row of the files on
    disk are added for them (decoded rows are larger than compressed ones, and the files'
    bytes include columns not read). Later passes use the bytes measured.
    """
    sources = getattr(order, "sources", None)
    plans = [s.source for s in sources] if sources is not None else [order.source]  # type: ignore[attr-defined]
    total = rows = 0.0
    for plan in plans:
        table = plan.table
        live = float(table.live[table.live > 0].sum())
        fixed, variable = _fixed_width_bytes(plan.schema)
        per_row = fixed + (2.0 * float(table.size.sum()) / max(1.0, live) if variable else 0.0)
        total += per_row * live
        rows += live
    return total / max(1.0, rows)


def _fixed_width_bytes(schema: pa.Schema) -> tuple[float, bool]:
    """Bytes per row of ``schema``'s fixed-width columns, and whether it has any other."""
    fixed, variable = 0.0, False
    for field in schema:
        width = _width(field.type)
        if width is None:
            variable = True
        else:
            fixed += width
    return fixed, variable


def _width(kind: pa.DataType) -> float | None:
    """Bytes of one value of ``kind`` (``None``: not of a fixed width)."""
    if pa.types.is_fixed_size_list(kind):
        inner = _width(kind.value_type)
        return None if inner is None else inner * kind.list_size
    try:
        return kind.bit_width / 8
    except ValueError:
        return None


class PassOwner(Protocol):
    """The dataset a pass runs over: its order, its hand-off to workers, its rows per source."""

    _handoff: Handoff | None
    bytes_per_row: float | None

    @property
    def order(self) -> Order:
        """How its epochs are read."""
        ...

    def count_sources(self, rows: Sequence[int]) -> None:
        """Add the rows a consumed batch held of every source."""
        ...


class Handoff(NamedTuple):
    """What a pass of the library's loader tells its workers: ``transport``, the segments they send in."""

    transport: SegmentPool | None


class Pass:
    """One pass over the current epoch, as the loader (or a loop over the dataset) runs it.

    The loader opens it before its workers start (:meth:`OrderedDataset.open_pass`),
    hands every item a worker sent to :meth:`deliver` (when :attr:`delivers`), records each
    batch as consumed when the loop takes it (:meth:`consume`), and ends it.
    """

    def __init__(self, dataset: PassOwner, progress: EpochProgress, handoff: Handoff | None) -> None:
        self._dataset = dataset
        self.progress = progress
        self._handoff = handoff
        self._delivery: Delivery | None = None
        self.handed = 0
        """Batches handed to the loop (the training ledger's steps of this pass)."""
        self.ledger: PassLedger | None = None
        """The dataset's training ledger (``ledger=``), which recorded the pass's start."""
        self._measured = (0, 0)

    @property
    def delivers(self) -> bool:
        """Items must go through :meth:`deliver` (a joiner or a sequencer stands between)."""
        return self._delivery is not None

    def deliver(self, item: Tagged) -> Iterable[Any]:
        """Main process: one batch (or part) a worker sent; the loop's batches it completes."""
        if self._delivery is None:
            return (item,)
        return self._delivery.add(item)

    def consume(self, item: Any) -> Any:
        """Record ``item`` as consumed by the loop (a tagged batch); return the batch."""
        self.handed += 1
        if not isinstance(item, Tagged):  # a batch joined of parts, recorded as they were joined
            return item
        tag = item.tag
        if len(tag) > 7:  # rows of every source (a mix)
            self._dataset.count_sources(tag[7:])
        # Plain stores last, no call after them: an exception raised asynchronously in the
        # main thread (a signal handler) cannot land between the record and the hand-over.
        self.progress.record(tag)
        return item.batch

    def received(self, item: Tagged) -> None:
        """Main process: a worker's group arrived (before its batches go on to the loop).

        Its rows left out (stand-ins of skipped units) go to the ledger now, before the loop
        receives a batch after them; its first groups' bytes per row size later passes'
        groups (:func:`~torch_dataloader_utils.runtime.emit.group_cap`).
        """
        if item.removed and self.ledger is not None and item.work is not None:
            self.ledger.skipped(item.work[0], item.removed)
        rows, nbytes = self._measured
        if rows < MEASURED_ROWS:
            tags: Sequence[Sequence[int]] = item.tag  # type: ignore[assignment]  # a group's: one per batch
            rows += sum(t[5] for t in tags)
            nbytes += sum(t[6] for t in tags)
            self._measured = (rows, nbytes)
            if rows:
                self._dataset.bytes_per_row = nbytes / rows

    def _consume_part(self, part: Tagged) -> Any:
        """A worker's part of a joined batch, recorded as consumed when the batch is made."""
        self.progress.record(part.tag)
        return part.batch

    def started(self) -> None:
        """The workers started (they took the hand-off): the dataset keeps no transport."""
        dataset = self._dataset
        if dataset._handoff is self._handoff and self._handoff is not None:
            dataset._handoff = Handoff(None)
            self._handoff = dataset._handoff

    def finish(self) -> None:
        """The pass ran to its end (every worker's parts were joined)."""
        if self._delivery is not None:
            self._delivery.check_done()
        self._dataset.order.passes.finish(self.progress)
        if self.ledger is not None:
            self.ledger.end(self.handed, True)
            self.ledger = None

    def end(self) -> None:
        """The pass ended (exhausted, closed or failed): a later pass is not nested in it."""
        PassLog.end(self.progress)
        if self.ledger is not None:
            self.ledger.end(self.handed, False)
            self.ledger = None
        if self._dataset._handoff is self._handoff:
            self._dataset._handoff = None
