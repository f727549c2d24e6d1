"""``plan_epoch``: the one composition of split, shuffle, rank slicing and LPT.

    files ──split──▶ chunks ──shuffle(seed, epoch)──▶ ──[rank::num_ranks] + equalize──▶
        ──LPT + quotas──▶ workers

With ``equal_batches`` on (and more than one rank), every rank gets the same number
of rows and every worker a multiple of ``batch_size`` (see :mod:`.ranks`).

Every rank and every DataLoader worker calls :func:`plan_epoch` with the same values
and so computes the same plan, with no communication.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_dataloader_utils.plan.assign import assign
from torch_dataloader_utils.plan.ranks import equalize_ranks, fill_quotas, slice_for_rank, worker_quotas
from torch_dataloader_utils.plan.shuffle import shuffled
from torch_dataloader_utils.plan.splits import (
    RankAwareStrategy,
    Splitter,
    check_no_overlap,
    normalize_chunks,
)
from torch_dataloader_utils.plan.types import Chunk, EpochPlan, EqualBatches, FileInfo

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
        equal_batches: The equal-batches policy (applies when ``num_ranks > 1``).
        batch_size: Rows per batch (worker quotas are multiples of it).
    """

    files: tuple[FileInfo, ...]
    strategy: Splitter | RankAwareStrategy
    num_ranks: int = 1
    num_workers: int = 1
    shuffle: bool = False
    seed: int = 0
    equal_batches: EqualBatches = EqualBatches.OFF
    batch_size: int = 1

    @property
    def equalized(self) -> bool:
        """Whether ranks are given equal row counts (a policy is on and there are ranks)."""
        return self.equal_batches.acts_on(self.num_ranks)

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {self.num_ranks}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 in a plan, got {self.num_workers}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


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
    dropped: list[Chunk] = []
    files = {f.path: f for f in spec.files}
    if spec.equalized:
        shares, dropped = equalize_ranks(shares, files, pad=spec.equal_batches is EqualBatches.PAD)
    per_rank = []
    for share in shares:
        bins = assign(share, spec.num_workers, _weight)
        if spec.equalized:
            rows = sum(c.num_rows or 0 for c in share)
            bins, rest = fill_quotas(bins, worker_quotas(rows, spec.num_workers, spec.batch_size), files)
            assert not rest, "worker quotas add up to the rank's rows"
        per_rank.append(tuple(tuple(b) for b in bins))
    return EpochPlan(
        epoch=epoch,
        seed=spec.seed if spec.shuffle else None,
        num_ranks=spec.num_ranks,
        num_workers=spec.num_workers,
        assignments=tuple(per_rank),
        dropped=tuple(dropped),
    )


def _weight(chunk: Chunk) -> int:
    return chunk.weight
