"""The library's DataLoader: it hands batches to the loop and knows what the loop consumed.

With workers, a thread of the main process receives their batches while the training
step runs (:func:`received`): unpickling a group, the shared-memory handshake and
building the tensors happen behind the step, and the loop takes a batch that is ready.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from torch.utils.data import DataLoader, IterableDataset

from torch_dataloader_utils.config import LoaderConfig
from torch_dataloader_utils.runtime.dataset import PlannedDataset
from torch_dataloader_utils.runtime.metrics import LoaderMetrics, gather_metrics, stall_clock
from torch_dataloader_utils.runtime.state import Tagged
from torch_dataloader_utils.transfer import BatchGroup, SegmentPool
from torch_dataloader_utils.upstream.accelerate import PREPARED_FLAG

__all__ = [
    "RECEIVE_AHEAD",
    "SPARE_SEGMENTS",
    "ResumableDataLoader",
    "build_loader",
    "make_loader",
    "received",
]

RECEIVE_AHEAD = 2
"""Items (groups of batches) the receiving thread holds ready beyond the one in use."""

SPARE_SEGMENTS = RECEIVE_AHEAD + 2
"""Shared-memory segments per worker beyond ``prefetch_factor``: the groups the receiving
thread holds, the one being yielded and the previous one, which the loop may still hold
(see ``transfer.SegmentPool``)."""

_POLL = 0.05


class _Receiver:
    """A thread that takes items from a DataLoader iterator into a small queue."""

    def __init__(self, source: Iterator[Any], ahead: int) -> None:
        self.queue: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=max(1, ahead))
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(source,), name="torch_dataloader_utils-receive", daemon=True
        )
        self.thread.start()

    def _put(self, kind: int, value: Any) -> bool:
        while not self.stopped.is_set():
            try:
                self.queue.put((kind, value), timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator[Any]) -> None:
        try:
            for item in source:
                if not self._put(0, item):
                    return
            self._put(1, None)
        except BaseException as exc:  # handed to the loop, raised there
            self._put(2, exc)

    def stop(self) -> None:
        """Stop receiving; returns at once (the thread ends after its current item)."""
        self.stopped.set()

    def join(self) -> None:
        """Stop and wait for the thread (its current item arrives or fails first)."""
        self.stopped.set()
        self.thread.join()


def received(receiver: _Receiver) -> Iterator[Any]:
    """The items of ``receiver``, in order; its error, raised here; never a silent hang."""
    try:
        while True:
            try:
                kind, value = receiver.queue.get(timeout=1.0)
            except queue.Empty:
                if not receiver.thread.is_alive() and receiver.queue.empty():
                    raise RuntimeError(
                        "the thread receiving batches from the workers ended unexpectedly"
                    ) from None
                continue
            if kind == 0:
                yield value
            elif kind == 1:
                return
            else:
                raise value
    finally:
        receiver.stop()


def _passthrough(batch: Any) -> Any:
    """DataLoader ``collate_fn``: batches are already built by the dataset."""
    return batch


class ResumableDataLoader(DataLoader[Any]):
    """The DataLoader of ``create_dataloader``: it knows what the loop consumed.

    Workers tag each batch with its position in their plan; this loader strips the tag
    when it hands the batch to the loop, and records it. ``state_dict()`` therefore
    describes exactly the batches yielded before it was called (prefetched batches are
    not consumed), and ``load_state_dict()`` resumes after them, for any number of
    workers or ranks. It follows the ``state_dict`` / ``load_state_dict`` protocol of
    torchdata's ``StatefulDataLoader``, so trainers that checkpoint such loaders
    (Lightning, Accelerate) save it with the model.

    It also measures what it does (:meth:`metrics`): per worker, rows, batches, chunks,
    bytes and the time spent waiting for storage, decoding, converting and packing; per
    rank, the time the training loop waits on the loader versus the time it spends
    between batches.
    """

    dataset: PlannedDataset
    _receiver: _Receiver | None = None

    _transport: SegmentPool | None = None

    def _lease_transport(self) -> SegmentPool | None:
        """The segments this iteration's workers send batches in (see ``transfer``)."""
        if self.num_workers == 0:
            return None
        # Every worker seeds numpy.random, which numpy 2 imports on first use: imported
        # here once, forked workers find it loaded (about 20 ms less per worker and epoch).
        import numpy.random  # noqa: F401

        if self._transport is None:
            self._transport = SegmentPool(self.num_workers, (self.prefetch_factor or 2) + SPARE_SEGMENTS)
        return self._transport if self._transport.lease() else None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self._receiver is not None and self.persistent_workers:
            # A pass left early: its thread must be out of the persistent iterator first
            # (without persistent workers each pass has its own iterator and thread).
            self._receiver.join()
        self._receiver = None
        # len() may differ between a resumed pass and a full one; drop torch's cached value.
        self._IterableDataset_len_called = None
        metrics = self.dataset.metrics
        completed: list[bool] = []
        try:
            # The loop's wait is timed around this loader's batches, up to StopIteration.
            yield from stall_clock(self._batches(completed), metrics)
        finally:
            metrics.finish(bool(completed))

    def _batches(self, completed: list[bool]) -> Iterator[Any]:
        state = self.dataset._state
        metrics = self.dataset.metrics
        state.begin(self.num_workers, self.dataset.epoch)
        self.dataset.begin_metrics(self.num_workers)
        state.tagging = True  # set before workers start: they pickle the dataset
        pool = self._lease_transport()
        self.dataset.transport = pool  # the workers starting now take it
        receiver: _Receiver | None = None
        try:
            try:
                source: Iterator[Any] = super().__iter__()  # starts (or resets) the workers, here
            except BaseException:
                self._transport = None  # workers may have started: a fresh pool next time
                raise
            finally:
                self.dataset.transport = None
            if pool is not None:
                # Free for the next iteration once this one's workers are gone.
                weakref.finalize(source, pool.release)
            if self.num_workers > 0:
                receiver = self._receiver = _Receiver(source, RECEIVE_AHEAD)
                source = received(receiver)
            for item in source:
                if isinstance(item, Tagged) and isinstance(item.batch, BatchGroup):
                    # Several batches of one worker that travelled together, and the
                    # worker's timers and counters since its previous group.
                    if item.work is not None:
                        metrics.add_work(*item.work)
                    for batch, tag in zip(item.batch, item.tag, strict=True):
                        metrics.record(tag)  # type: ignore[arg-type]
                        yield state.consume(Tagged(batch, tag))  # type: ignore[arg-type]
                else:
                    if isinstance(item, Tagged):
                        metrics.record(item.tag)
                    yield state.consume(item)
            state.finish()
            completed.append(True)
        finally:
            state.tagging = False
            if receiver is not None:  # this pass's thread (another pass may have started since)
                receiver.stop()

    def metrics(self, gather: bool = False, group: Any = None) -> LoaderMetrics:
        """What the loader did since the last ``set_epoch``, ``reset_metrics`` or ``get_metrics``.

        A snapshot (nothing is cleared): per worker, rows, batches, chunks done, bytes
        fetched from storage and needed, requests, retries, rows padded, and the time
        spent waiting for storage, decoding, converting and packing; for the rank, the
        time the training loop was blocked in ``next()`` on this loader versus the time
        it spent between batches, and their ratio, the stall fraction. ``print(...)``
        shows it as a table; ``as_dict()`` gives plain values.

        Args:
            gather: Combine every rank's metrics (``torch.distributed.all_gather_object``
                over the process group; call it on every rank at the same step). Without
                an initialized process group, this rank's.
            group: The process group to gather over (``None``: the default one).
        """
        if gather:
            return gather_metrics(self, group)
        return LoaderMetrics((self.dataset.rank_metrics(),))

    def state_dict(self) -> dict[str, Any]:
        """This rank's resume state; see :meth:`PlannedDataset.state_dict`."""
        return self.dataset.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a (merged) state; see :meth:`PlannedDataset.load_state_dict`."""
        self.dataset.load_state_dict(state)


# Accelerate's prepare() returns this loader unchanged (see upstream/accelerate.py): the
# dataset already shards itself by rank. Batches are not moved to accelerator.device.
setattr(ResumableDataLoader, PREPARED_FLAG, True)


def make_loader(dataset: PlannedDataset, loader: LoaderConfig) -> ResumableDataLoader:
    """The DataLoader over ``dataset`` (which yields whole batches).

    ``loader.num_workers=None`` (automatic) takes the count the dataset resolved.
    """
    return build_loader(ResumableDataLoader, dataset, dataset.num_workers, loader)


L = TypeVar("L", bound=ResumableDataLoader)


def build_loader(
    loader_class: type[L], dataset: IterableDataset[Any], num_workers: int, loader: LoaderConfig
) -> L:
    """A ``loader_class`` over ``dataset``, which resolved its ``num_workers`` already."""
    if loader.num_workers is None and num_workers == 0:
        # Automatic sizing chose the main process: a start method has nothing to start.
        loader = dataclasses.replace(loader, multiprocessing_context=None)
    config = dataclasses.replace(loader, num_workers=num_workers)  # re-checks the combination
    kwargs: dict[str, Any] = {}
    if config.prefetch_factor is not None:
        kwargs["prefetch_factor"] = config.prefetch_factor
    if config.multiprocessing_context is not None:
        kwargs["multiprocessing_context"] = config.multiprocessing_context
    return loader_class(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        collate_fn=_passthrough,
        pin_memory=config.pin_memory,
        persistent_workers=config.persistent_workers,
        timeout=config.timeout,
        **kwargs,
    )
