"""The ONLY place that reads the environment: ranks, world size, workers, CPUs.

Planning code receives plain ints built here; nothing else in the library looks at
``RANK``/``WORLD_SIZE``, ``torch.distributed`` or the DataLoader's worker info.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist
import torch.utils.data

from torch_dataloader_utils.errors import DistributedConfigError
from torch_dataloader_utils.plan.types import World

__all__ = [
    "DetectedWorld",
    "WorkerSlot",
    "collect_before_fork",
    "cpus_per_rank",
    "detect",
    "freeze_inherited",
    "local_rank",
    "resolve_world",
    "stderr_is_terminal",
    "worker_slot",
]


@dataclass(frozen=True)
class DetectedWorld:
    """Ranks as seen by the running process.

    Attributes:
        num_ranks: World size.
        rank: Global rank.
        local_rank: Rank on this node, when the launcher says (``LOCAL_RANK``).
        local_world_size: Ranks on this node, when the launcher says.
        source: ``"torch.distributed"``, ``"env"`` or ``"default"``.
    """

    num_ranks: int
    rank: int
    local_rank: int | None
    local_world_size: int | None
    source: str


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise DistributedConfigError(f"environment variable {name}={value!r} is not an int") from exc


def detect(strict: bool = True) -> DetectedWorld:
    """Ranks from an initialized ``torch.distributed`` group, else ``RANK``/``WORLD_SIZE``.

    Args:
        strict: Raise on launcher variables that cannot describe a world (only one of
            ``RANK`` / ``WORLD_SIZE`` set, or a rank out of range); without it such
            variables are ignored (explicit ``num_ranks`` / ``rank`` were given).

    Raises:
        DistributedConfigError: naming the variables and their values, with the fix.
    """
    local_rank = _env_int("LOCAL_RANK")
    local_world = _env_int("LOCAL_WORLD_SIZE")
    if dist.is_available() and dist.is_initialized():
        return DetectedWorld(
            dist.get_world_size(), dist.get_rank(), local_rank, local_world, "torch.distributed"
        )
    rank = _env_int("RANK")
    world = _env_int("WORLD_SIZE")
    fix = (
        "set both (torchrun does), initialize torch.distributed before building the dataset, "
        "or pass num_ranks= and rank= explicitly"
    )
    if not strict and (rank is None or world is None or world < 1 or not 0 <= rank < world):
        return DetectedWorld(1, 0, local_rank, local_world, "default")
    if rank is None and world is not None and world != 1:
        raise DistributedConfigError(
            f"environment variable WORLD_SIZE={world} is set but RANK is not, so this process "
            f"cannot know its share and would read the whole dataset; {fix}"
        )
    if world is None and rank is not None and rank != 0:
        raise DistributedConfigError(f"environment variable RANK={rank} is set but WORLD_SIZE is not; {fix}")
    if rank is not None and world is not None:
        if world < 1 or not 0 <= rank < world:
            raise DistributedConfigError(
                f"environment variables RANK={rank} and WORLD_SIZE={world} disagree: RANK must be "
                f"in [0, WORLD_SIZE) and WORLD_SIZE >= 1; check the launcher, or pass num_ranks= "
                "and rank= explicitly"
            )
        return DetectedWorld(world, rank, local_rank, local_world, "env")
    return DetectedWorld(1, 0, local_rank, local_world, "default")


def resolve_world(num_ranks: int | None, rank: int | None) -> World:
    """The world to plan for: explicit values, checked against the runtime, or detected.

    With neither value given, an initialized ``torch.distributed`` group decides, else
    the launcher's ``RANK`` / ``WORLD_SIZE``, else a single process. Explicit values
    (Horovod: ``hvd.size()``, ``hvd.rank()``) are used as given when nothing in the
    runtime contradicts them.

    Raises:
        DistributedConfigError: only one of the two was given; they disagree with an
            initialized process group; or ``rank`` looks like a local rank on a
            multi-node job.
    """
    detected = detect(strict=num_ranks is None and rank is None)
    if num_ranks is None and rank is None:
        return World(detected.num_ranks, detected.rank)
    if num_ranks is None or rank is None:
        raise DistributedConfigError(
            f"pass both num_ranks and rank or neither (got num_ranks={num_ranks!r}, rank={rank!r}); "
            "with neither they come from torch.distributed or RANK/WORLD_SIZE"
        )
    from torch_dataloader_utils.config import DistributedConfig  # validates ints and range

    DistributedConfig(num_ranks=num_ranks, rank=rank)
    looks_local = detected.local_rank is not None and rank == detected.local_rank and rank != detected.rank
    hint = (
        f" rank={rank} equals LOCAL_RANK={detected.local_rank}: pass the global rank "
        f"(RANK={detected.rank}, torch.distributed.get_rank()), not the rank on this node."
        if looks_local
        else ""
    )
    if detected.source == "torch.distributed":
        if num_ranks != detected.num_ranks or rank != detected.rank:
            raise DistributedConfigError(
                f"num_ranks={num_ranks}, rank={rank} disagree with the initialized process group "
                f"(world size {detected.num_ranks}, rank {detected.rank}); pass "
                "torch.distributed.get_world_size() and get_rank(), or leave both unset." + hint
            )
    elif detected.source == "env" and looks_local:
        nodes = ""
        if detected.local_world_size is not None and detected.local_world_size < detected.num_ranks:
            nodes = (
                f" (a multi-node job: LOCAL_WORLD_SIZE={detected.local_world_size} < "
                f"WORLD_SIZE={detected.num_ranks})"
            )
        raise DistributedConfigError(
            f"rank={rank} equals LOCAL_RANK but RANK={detected.rank}{nodes}; pass the global "
            f"rank (RANK={detected.rank}), not the local rank, with num_ranks={num_ranks}"
        )
    return World(num_ranks, rank)


@dataclass(frozen=True)
class WorkerSlot:
    """Which DataLoader worker this code runs in (``id=0, count=1`` in the main process)."""

    id: int
    count: int
    in_worker: bool


def worker_slot() -> WorkerSlot:
    """The current DataLoader worker, from ``torch.utils.data.get_worker_info()``.

    In a worker, the first call also freezes what the worker inherited (see
    :func:`freeze_inherited`).
    """
    info = torch.utils.data.get_worker_info()
    if info is None:
        return WorkerSlot(0, 1, False)
    freeze_inherited()
    return WorkerSlot(info.id, info.num_workers, True)


_done_in: dict[str, int] = {}
"""What ran once per process (:func:`_once`): its name -> the process id it ran in."""


def _once(name: str, action: Callable[[], object]) -> None:
    """Run ``action`` once in this process (a forked child, whose parent ran it, runs it again)."""
    pid = os.getpid()
    if _done_in.get(name) != pid:
        _done_in[name] = pid
        action()


def collect_before_fork() -> None:
    """Once per process, before it forks its first DataLoader workers: one full garbage collection.

    The objects that imports made (pandas', imported by pyarrow whenever it is installed,
    among them) are young until a full collection has walked them; without one here, the
    first comes in the middle of the first epoch, holding the GIL while the workers' groups
    wait to be taken (0.16-0.66 s of S1's epoch at ``num_workers=2`` on a loaded 2-core
    machine, against 0.06-0.20 s run here; ``bench_pandas.py``). Before the fork, not
    after: a collection writes to every object it walks, so run after the fork it made
    the main process copy the pages it shares with its workers (peak PSS +8-14 %,
    ``compare.py``). Once per process: later epochs make few long-lived objects.
    """
    _once("collect", gc.collect)


def freeze_inherited() -> None:
    """Once per process: move every object it holds into the garbage collector's permanent generation.

    Called in a DataLoader worker, before it reads. A forked worker inherits the main
    process's objects (pandas' alone are about 25,000, imported by pyarrow whenever
    pandas is installed), and most were made since the main process's last
    full collection; soon after the fork they trigger one in the worker, which walks
    every inherited object, writing to each, so the worker copies the pages that hold
    them (copy-on-write). Measured with pandas installed (``bench_pandas.py``, S1 at
    ``num_workers=2``): 0.2-1.1 s of the workers' CPU and about 29,000 more page faults
    per epoch (with the main process's first full collection, see
    :func:`collect_before_fork`, the 1.36x slowdown). ``gc.freeze()`` only relinks the
    generations' lists, touching no object, so the worker's collections walk only what it makes;
    objects it inherited are still freed by reference counting (a cycle among them is
    kept until the worker exits).
    """
    _once("freeze", gc.freeze)


def cpus_per_rank() -> int:
    """CPUs this process may use, divided among the ranks of this node."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    local = _env_int("LOCAL_WORLD_SIZE") or 1
    return max(1, cpus // max(1, local))


def local_rank() -> int | None:
    """This process's rank on its node, when the launcher says (``LOCAL_RANK``)."""
    return _env_int("LOCAL_RANK")


def stderr_is_terminal() -> bool:
    """Whether progress can be drawn as a bar: standard error is a terminal, or a Jupyter kernel runs.

    Otherwise (a file, a pipe: a job's log) progress is written as lines.
    """
    if "ipykernel" in sys.modules:  # a notebook: tqdm.auto draws a widget
        return True
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced or closed stream
        return False
