"""The library's DataLoader: it hands batches to the loop and knows what the loop consumed.

With workers, a thread of the main process receives their batches while the training
step runs (:func:`received`): unpickling a group, the shared-memory handshake and
building the tensors happen behind the step, and the loop takes a batch that is ready.

``pin_memory=True`` with CUDA and workers: the workers' shared-memory segments are
page-locked once in the main process (``transfer.SegmentPool`` with a
:class:`~torch_dataloader_utils.upstream.torch.CudaHostPinner`), so batches arrive in
pinned memory with no copy and no pin thread. ``device=``: the loop's thread queues each
group's copy to the GPU on a stream of its own one group ahead of the one it hands over
(:mod:`.device`), and the loop gets batches already on the device.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import torch
from torch.utils.data import DataLoader, Sampler

from torch_dataloader_utils.config import LoaderConfig
from torch_dataloader_utils.errors import IncompatibleOptionsError
from torch_dataloader_utils.plan.state import keyed_state
from torch_dataloader_utils.runtime import env
from torch_dataloader_utils.runtime.dataset import OrderedDataset
from torch_dataloader_utils.runtime.device import DeviceStage, OnDevice, copied_ahead
from torch_dataloader_utils.runtime.emit import GROUP_BYTES
from torch_dataloader_utils.runtime.metrics import LoaderMetrics, gather_metrics, stall_clock
from torch_dataloader_utils.runtime.passes import Pass
from torch_dataloader_utils.runtime.state import Tagged
from torch_dataloader_utils.storage.threads import join_at_exit
from torch_dataloader_utils.transfer import BatchGroup, HostPinner, SegmentPool, can_pin_segments
from torch_dataloader_utils.upstream.accelerate import PREPARED_FLAG
from torch_dataloader_utils.upstream.torch import CudaHostPinner, loader_items

__all__ = [
    "COPY_AHEAD_GROUPS",
    "COPY_IN_RECEIVER",
    "PINNED_SEGMENT_BYTES",
    "RECEIVE_AHEAD",
    "SPARE_SEGMENTS",
    "EpochSampler",
    "ResumableDataLoader",
    "build_loader",
    "make_loader",
    "received",
]

RECEIVE_AHEAD = 2
"""Items (groups of batches) the receiving thread holds ready beyond the one in use."""

COPY_AHEAD_GROUPS = 1
"""With ``device=`` and workers: groups whose device copy the loop's thread has queued
beyond the one it is handing over (taken from the receiving thread's queue)."""

COPY_IN_RECEIVER = False
"""Where a group's device copy is queued with workers: ``False`` (the default), in the
loop's thread, ``COPY_AHEAD_GROUPS`` ahead; ``True``, in the receiving thread as each group
arrives (the first design). On an H200 the receiving-thread copies cost the training
loop about ten points of stall more than the loop's own copies (docs/benchmarks.md);
the likely reason: the receiving thread's tensor calls contend with the loop's for the
GIL while the step is bound by its kernel launches. Switchable for
``benchmarks/bench_gpu.py`` (``--copy-in``), to measure both on one machine."""

SPARE_SEGMENTS = RECEIVE_AHEAD + 2
"""Shared-memory segments per worker beyond ``prefetch_factor``: the groups the receiving
thread holds, the one being yielded and the previous one, which the loop may still hold
(see ``transfer.SegmentPool``); with a device copy queued by the loop's thread,
``COPY_AHEAD_GROUPS`` more. A worker that finds no free segment sends its group outside
the pool (not page-locked: a device copy of it is then synchronous)."""

PINNED_SEGMENT_BYTES = GROUP_BYTES + GROUP_BYTES // 4
"""A page-locked pool's segments hold at least this much: a full group (``GROUP_BYTES``,
32 MiB) and a quarter more, so a worker's first, growing groups do not replace (and
register again) its segments."""

_POLL = 0.05

log = logging.getLogger(__name__)


def _host_pinner() -> HostPinner | None:
    """What page-locks the workers' segments: CUDA's host registration, when there is CUDA."""
    return CudaHostPinner() if torch.cuda.is_available() else None


class _Receiver:
    """A thread that takes items from a DataLoader iterator into a small queue.

    ``prepare``, when given, is applied to each item in the thread (the device copy).
    """

    def __init__(
        self, source: Iterator[Any], ahead: int, prepare: Callable[[Any], Any] | None = None
    ) -> None:
        self.queue: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=max(1, ahead))
        self.stopped = threading.Event()
        self.superseded = False
        """Set when a new pass took over the persistent workers this thread reads from."""
        self.prepare = prepare
        self.thread = threading.Thread(
            target=self._run, args=(source,), name="torch_dataloader_utils-receive", daemon=True
        )
        self.thread.start()
        join_at_exit(self.thread, self.stopped)  # never left running while Python finalizes

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
            prepare = self.prepare
            for item in loader_items(source):
                if not self._put(0, item if prepare is None else prepare(item)):
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


def superseded() -> IncompatibleOptionsError:
    """The error of a pass whose persistent workers a newer pass took over."""
    return IncompatibleOptionsError(
        "this pass over the loader was ended by a new pass over the same loader: with "
        "persistent_workers=True every pass uses the same workers, so a pass started inside "
        "another (e.g. an evaluation over the training loader) ends the outer one. Evaluate "
        "with a loader of its own, or use persistent_workers=False (each pass then has its "
        "own workers and the resume state keeps describing the outer pass)"
    )


def received(receiver: _Receiver) -> Iterator[Any]:
    """The items of ``receiver``, in order; its error, raised here; never a silent hang."""
    try:
        while True:
            if receiver.superseded:
                raise superseded()
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


class EpochSampler(Sampler[None]):
    """``loader.sampler``: the object trainers call ``set_epoch`` on; it reaches the dataset.

    Lightning calls ``loader.sampler.set_epoch(epoch)`` at every epoch (and
    ``loader.batch_sampler.sampler``, which this loader has none of); HF Trainer and
    Accelerate call ``loader.set_epoch``. Both select the dataset's epoch, so each epoch
    gets its own order with ``shuffle=True``. Iterated, it yields ``None`` forever, as the
    sampler torch gives an ``IterableDataset`` does (the DataLoader draws one per batch
    and ignores it).
    """

    def __init__(self, dataset: OrderedDataset) -> None:
        super().__init__()
        self.dataset = dataset

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)

    def set_epoch(self, epoch: int) -> None:
        """``dataset.set_epoch(epoch)``: the epoch the next pass reads."""
        self.dataset.set_epoch(epoch)


def _copier(stage: DeviceStage) -> Callable[[Any], Any]:
    """Queue the device copy of a tagged batch or group (nothing else is copied)."""

    def copy(item: Any) -> Any:
        if isinstance(item, Tagged) and not (isinstance(item.batch, BatchGroup) and not item.batch):
            return item._replace(batch=stage.copy(item.batch))
        return item

    return copy


def _passthrough(batch: Any) -> Any:
    """DataLoader ``collate_fn``: batches are already built by the dataset."""
    return batch


D = TypeVar("D", bound=OrderedDataset)


class ResumableDataLoader(DataLoader[Any], Generic[D]):
    """The DataLoader of ``create_dataloader`` (and of a mix): it knows what the loop consumed.

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

    It talks to its dataset through one protocol: :meth:`OrderedDataset.open_pass` gives
    a :class:`~torch_dataloader_utils.runtime.dataset.Pass`, which records what the loop
    consumed and stands between the workers and the loop where an order needs it. The
    type parameter is the dataset's type (``ResumableDataLoader[MixedDataset]`` for a mix).
    """

    dataset: D
    _receiver: _Receiver | None = None
    _pass: Pass | None = None
    _epoch_sampler: EpochSampler | None = None

    @property
    def sampler(self) -> EpochSampler:
        """An :class:`EpochSampler`: ``loader.sampler.set_epoch(epoch)`` selects the dataset's epoch."""
        if self._epoch_sampler is None:
            self._epoch_sampler = EpochSampler(self.dataset)
        return self._epoch_sampler

    @sampler.setter
    def sampler(self, value: object) -> None:
        # DataLoader.__init__ assigns the sampler torch gives an IterableDataset (None
        # forever); EpochSampler iterates the same way and forwards set_epoch. After
        # __init__ torch's __setattr__ refuses the assignment, as for any DataLoader.
        self._epoch_sampler = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next pass reads (``dataset.set_epoch``); call it before every epoch."""
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches of a full pass over the current epoch on this rank, also after ``load_state_dict``.

        As torchdata's ``StatefulDataLoader`` reports it: trainers read ``len()`` once and
        keep it for every epoch. The batches left of a resumed or running pass are
        :attr:`remaining_batches`. With ``on_bad_data='skip'`` or ``'quarantine'`` and
        ``equal_batches`` other than ``'pad'``, the rows of skipped units are removed and
        a pass may yield fewer batches than this count (known only once the units are
        read); with ``equal_batches='pad'`` they arrive flagged and the count is exact.

        Raises:
            UnknownLengthError: row counts are unknown before reading (a ``TypeError``).
        """
        return self.dataset.num_batches()

    @property
    def remaining_batches(self) -> int:
        """Batches left in the current epoch from the consumed (or loaded) position.

        During a pass, what it has still to yield; after ``load_state_dict``, the batches
        of the resumed rest of the epoch; otherwise the full epoch (``len()``); 0 once a
        pass ran to its end, until ``set_epoch``. See :attr:`OrderedDataset.remaining_batches`.
        """
        return self.dataset.remaining_batches

    _transport: SegmentPool | None = None
    device: torch.device | None = None
    """Where batches are handed over (``device=``); ``None``: where they were built."""
    _pinner: HostPinner | None = None

    def _lease_transport(self) -> SegmentPool | None:
        """The segments this iteration's workers send batches in (see ``transfer``)."""
        if self.num_workers == 0:
            return None
        # Every worker seeds numpy.random, which numpy 2 imports on first use: imported
        # here once, forked workers find it loaded (about 20 ms less per worker and epoch).
        import numpy.random  # noqa: F401

        env.collect_before_fork()
        if self._transport is None:
            slots = (self.prefetch_factor or 2) + SPARE_SEGMENTS
            if self.device is not None and self.device.type == "cuda" and not COPY_IN_RECEIVER:
                slots += COPY_AHEAD_GROUPS  # the groups copied ahead are held too
            least = PINNED_SEGMENT_BYTES if self._pinner is not None else 0
            self._transport = SegmentPool(self.num_workers, slots, pinner=self._pinner, min_segment=least)
            if self._pinner is not None:  # page-locked memory goes back with the loader
                weakref.finalize(self, self._transport.close).atexit = False
        return self._transport if self._transport.lease() else None

    def _device_stage(self) -> DeviceStage | None:
        device = self.device
        return DeviceStage(device) if device is not None and device.type == "cuda" else None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._end_previous_pass()
        # len() may differ between epochs (equal_batches='off' deals them anew); drop torch's cached value.
        self._IterableDataset_len_called = None
        metrics = self.dataset.metrics
        completed: list[bool] = []
        passes: list[Pass] = []
        try:
            # The loop's wait is timed around this loader's batches, up to StopIteration.
            for item in stall_clock(self._batches(completed, passes), metrics):
                # A batch counts as consumed here, in the generator the loop resumes, with
                # nothing that can raise between the record and the hand-over: torch's SIGCHLD
                # handler raises in the main thread wherever it runs (a worker died), and a
                # batch recorded but never handed over would be skipped by a resume.
                yield passes[0].consume(item)
        finally:
            metrics.finish(bool(completed))

    def _end_previous_pass(self) -> None:
        """With persistent workers: the previous pass's thread out of the shared iterator first.

        A pass that is still running (not exhausted, closed or failed) is ended: it raises
        if it is used again. The thread is waited for while the workers live; if one died,
        the thread may never return (a read the dead worker left half written), so the
        workers are dropped instead (:meth:`_drop_workers`). Without persistent workers
        each pass has its own iterator and thread, and passes may nest.
        """
        receiver, opened = self._receiver, self._pass
        self._receiver = self._pass = None
        if receiver is None or not self.persistent_workers:
            return
        receiver.superseded = True
        if opened is not None:
            opened.end()
        receiver.stop()
        while receiver.thread.is_alive():
            receiver.thread.join(_POLL)
            workers = getattr(self._iterator, "_workers", ())
            if any(not w.is_alive() for w in workers):
                self._drop_workers()
                return

    def _drop_workers(self) -> None:
        """Shut down the persistent workers; the next pass starts new ones.

        After a pass failed (a worker died or raised): reusing its workers would hang or
        fail again (torch waits for every worker to acknowledge the new pass). The
        failed pass's thread is not waited for.
        """
        iterator, self._iterator = self._iterator, None
        self._receiver = self._pass = None
        self._transport = None  # the failed pass's segments may still be leased
        _shut_down(iterator)

    def _batches(self, completed: list[bool], passes: list[Pass]) -> Iterator[Any]:
        """This pass's items, tagged (``__iter__`` records them); its :class:`Pass` goes to ``passes``."""
        pool = self._lease_transport()
        # Opened before the workers start: they pickle the dataset, and with it the hand-off.
        opened = self._pass = self.dataset.open_pass(self.num_workers, pool)
        passes.append(opened)
        receiver: _Receiver | None = None
        stage: DeviceStage | None = None
        workers: Iterator[Any] | None = None  # torch's iterator, which owns this pass's workers
        try:
            try:
                source: Iterator[Any] = super().__iter__()  # starts (or resets) the workers, here
                workers = source
            except BaseException:
                self._transport = None  # workers may have started: a fresh pool next time
                raise
            finally:
                opened.started()
            if pool is not None:
                # Free for the next iteration once this one's workers are gone.
                weakref.finalize(source, pool.release)
            stage = self._device_stage()
            copy = None if stage is None else _copier(stage)
            if self.num_workers > 0:
                in_receiver = COPY_IN_RECEIVER
                receiver = self._receiver = _Receiver(source, RECEIVE_AHEAD, copy if in_receiver else None)
                source = received(receiver)
                if copy is not None and not in_receiver:
                    # Queued by the loop's thread: no tensor calls in the receiving thread
                    # beyond building the host batches, so none contend with the step's.
                    source = copied_ahead(source, copy, COPY_AHEAD_GROUPS)
            elif copy is not None:
                source = copied_ahead(source, copy)
            yield from self._delivered(source, stage, receiver, opened, pool)
            opened.finish()
            completed.append(True)
        except GeneratorExit:  # the loop left the pass early (break, close): workers stay
            raise
        except BaseException:
            if self.persistent_workers and (receiver is None or not receiver.superseded):
                self._drop_workers()  # the next pass starts new workers, never a hang
            elif not self.persistent_workers and workers is not None:
                # Now, while its queues are open: the traceback holds this frame in a cycle,
                # and torch's own shutdown in the garbage collector ran after the queues'
                # finalizers, so the workers never got their stop and the join waited 5 s each.
                _shut_down(workers)
            raise
        finally:
            opened.end()
            if receiver is not None:  # this pass's thread (another pass may have started since)
                receiver.stop()
            if stage is not None:
                stage.close()

    def _delivered(
        self,
        source: Iterator[Any],
        stage: DeviceStage | None,
        receiver: _Receiver | None,
        opened: Pass,
        pool: SegmentPool | None,
    ) -> Iterator[Any]:
        """The received items as the loop's batches: groups split, device copies handed over."""
        metrics = self.dataset.metrics
        record = metrics.record
        fenced = pool is not None and pool.pinned
        for item in source:
            if fenced:  # segments dropped under queued copies: free those whose copies ran
                pool.free_fenced()  # type: ignore[union-attr]
            if stage is not None and isinstance(item, Tagged) and isinstance(item.batch, OnDevice):
                on = item.batch
                handed = stage.hand(on)
                item = item._replace(batch=BatchGroup(handed) if on.group else handed[0])
            if isinstance(item, Tagged) and isinstance(item.batch, BatchGroup):
                # Several batches of one worker that travelled together, and the
                # worker's timers and counters since its previous group.
                if item.work is not None:
                    metrics.add_work(*item.work)
                opened.received(item)
                # Without a joiner or a sequencer a batch goes to the loop as it came: no
                # call per batch beyond the metrics' count.
                delivers = opened.delivers
                for batch, tag in zip(item.batch, item.tag, strict=True):
                    if receiver is not None and receiver.superseded:
                        raise superseded()
                    record(tag)  # type: ignore[arg-type]
                    if delivers:
                        yield from opened.deliver(Tagged(batch, tag))  # type: ignore[arg-type]
                    else:
                        yield Tagged(batch, tag)  # type: ignore[arg-type]
            else:
                if isinstance(item, Tagged):
                    record(item.tag)
                    yield from opened.deliver(item)
                else:
                    yield item

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

    def state_dict(self) -> dict[str, str]:
        """This rank's resume state, under a key of its own: ``{"rank<r>": "<the state as JSON>"}``.

        The JSON is the dataset's state (:meth:`OrderedDataset.state_dict`, readable as
        ``loader.dataset.state_dict()``). Keyed by rank, so ``torch.distributed.checkpoint``
        keeps every rank's entry (``dcp.save({"model": model, "data": loader})``), and one
        string however far the epoch went. Several ranks' states merge by dict union (or
        ``merge_states``); ``gather_state`` gives the merged state of every rank.
        """
        return keyed_state(self.dataset.state_dict(), self.dataset.world.rank)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state of :meth:`state_dict` (one rank's, several, or merged).

        Also takes the dataset's plain state. See :meth:`OrderedDataset.load_state_dict`.
        """
        self.dataset.load_state_dict(state)


# Accelerate's prepare() returns this loader unchanged (see upstream/accelerate.py): the
# dataset already shards itself by rank. Batches are not moved to accelerator.device.
setattr(ResumableDataLoader, PREPARED_FLAG, True)


def make_loader(dataset: D, loader: LoaderConfig) -> ResumableDataLoader[D]:
    """The DataLoader over ``dataset`` (which yields whole batches).

    ``loader.num_workers=None`` (automatic) takes the count the dataset resolved.
    """
    return build_loader(dataset, dataset.num_workers, loader)


def build_loader(dataset: D, num_workers: int, loader: LoaderConfig) -> ResumableDataLoader[D]:
    """The library's loader over ``dataset``, which resolved its ``num_workers`` already."""
    if loader.num_workers is None and num_workers == 0:
        # Automatic sizing chose the main process: a start method has nothing to start.
        loader = dataclasses.replace(loader, multiprocessing_context=None)
    config = dataclasses.replace(loader, num_workers=num_workers)  # re-checks the combination
    kwargs: dict[str, Any] = {}
    if config.prefetch_factor is not None:
        kwargs["prefetch_factor"] = config.prefetch_factor
    if config.multiprocessing_context is not None:
        kwargs["multiprocessing_context"] = config.multiprocessing_context
    device = config.device
    # Workers' segments page-locked once: with pin_memory=True, or when batches are
    # copied to a GPU (its copies are then asynchronous). Otherwise torch pins (a copy).
    wants_pinned = config.pin_memory or (device is not None and device.type == "cuda")
    pinner = _host_pinner() if wants_pinned and num_workers > 0 and can_pin_segments() else None
    result: ResumableDataLoader[D] = ResumableDataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        collate_fn=_passthrough,
        pin_memory=config.pin_memory and pinner is None,
        persistent_workers=config.persistent_workers,
        timeout=config.timeout,
        **kwargs,
    )
    result.device = device
    result._pinner = pinner
    return result


def _shut_down(iterator: Any) -> None:
    """Stop the workers of torch's ``iterator`` (if it has any), whatever state they are in."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:  # already shut down or half gone: nothing left to stop
            log.debug("shutting down the workers of a failed pass", exc_info=True)
