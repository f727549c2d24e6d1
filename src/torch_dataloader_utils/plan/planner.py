"""``plan_epoch``: the one composition of split, shuffle, rank slicing and LPT.

    files ──split──▶ chunks ──shuffle(seed, epoch)──▶ ──[rank::num_ranks]──▶ ──LPT──▶ workers

Every rank and every DataLoader worker calls :func:`plan_epoch` with the same values
and so computes the same plan, with no communication.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_dataloader_utils.plan.assign import assign
from torch_dataloader_utils.plan.ranks import slice_for_rank
from torch_dataloader_utils.plan.shuffle import shuffled
from torch_dataloader_utils.plan.splits import (
    RankAwareStrategy,
    Splitter,
    check_no_overlap,
    normalize_chunks,
)
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, FileInfo

__all__ = ["PlanSpec", "plan_epoch"]


@dataclass(frozen=True)
class PlanSpec:
    """Everything a plan depends on, apart from the epoch.

    Attributes:
        files: The dataset's files, in a deterministic (sorted) order.
        strategy: A built-in or adapted split strategy (see ``resolve_strategy``).
        num_ranks: Number of ranks in the job.
        num_workers: Reading workers per rank (>= 1).
        shuffle: Whether chunk order is shuffled every epoch.
        seed: The shuffle seed.
    """

    files: tuple[FileInfo, ...]
    strategy: Splitter | RankAwareStrategy
    num_ranks: int = 1
    num_workers: int = 1
    shuffle: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {self.num_ranks}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 in a plan, got {self.num_workers}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


def rank_shares(spec: PlanSpec, epoch: int) -> list[list[Chunk]]:
    """Each rank's chunks for ``epoch``, shuffled, before assignment to workers."""
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    by_path = {f.path: f for f in spec.files}
    strategy = spec.strategy
    if isinstance(strategy, RankAwareStrategy):
        shares = []
        for rank in range(spec.num_ranks):
            chunks = strategy.split_rank(
                spec.files,
                num_workers=spec.num_workers,
                epoch=epoch,
                num_ranks=spec.num_ranks,
                rank=rank,
            )
            chunks = normalize_chunks(chunks, by_path, strategy.name)
            if spec.shuffle:
                chunks = shuffled(chunks, spec.seed, epoch, rank)
            shares.append(chunks)
        check_no_overlap(
            (c for share in shares for c in share),
            f"split strategy {strategy.name!r} across {spec.num_ranks} ranks",
        )
        return shares
    chunks = strategy.split(spec.files, num_workers=spec.num_workers, epoch=epoch)
    chunks = normalize_chunks(chunks, by_path, strategy.name)
    check_no_overlap(chunks, f"split strategy {strategy.name!r}")
    if spec.shuffle:
        chunks = shuffled(chunks, spec.seed, epoch)
    return [slice_for_rank(chunks, spec.num_ranks, r) for r in range(spec.num_ranks)]


def plan_epoch(spec: PlanSpec, epoch: int) -> EpochPlan:
    """The plan of one epoch: which chunks each (rank, worker) reads, in order.

    Args:
        spec: What the plan depends on besides the epoch.
        epoch: The epoch (>= 0); with shuffling on, each epoch has its own order.

    Returns:
        The :class:`EpochPlan` for every rank and worker.
    """
    shares = rank_shares(spec, epoch)
    assignments = tuple(tuple(tuple(b) for b in assign(share, spec.num_workers, _weight)) for share in shares)
    return EpochPlan(
        epoch=epoch,
        seed=spec.seed if spec.shuffle else None,
        num_ranks=spec.num_ranks,
        num_workers=spec.num_workers,
        assignments=assignments,
    )


def _weight(chunk: Chunk) -> int:
    return chunk.weight
