"""The pure planning core: stdlib and numpy only.

Nothing in this package imports pyarrow, fsspec, pyiceberg or torch (a test enforces
it), and nothing reads the environment: a plan is a function of values alone.
Metadata is kept as numpy columns (:class:`FileTable`); a process plans its own rank
(:class:`Planner`), and :func:`plan_epoch` gives every rank's plan.
"""

from torch_dataloader_utils.plan.assign import assign
from torch_dataloader_utils.plan.planner import Planner, PlanSpec, RankPlan, plan_epoch, verify_plan
from torch_dataloader_utils.plan.shuffle import permutation, shuffled
from torch_dataloader_utils.plan.splits import (
    ByteRangeSplit,
    FileSplit,
    LegacySplitStrategy,
    RowGroupSplit,
    SplitStrategy,
    resolve_strategy,
)
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import (
    Chunk,
    ChunkUnit,
    EpochPlan,
    FileInfo,
    RecordIndex,
    RowGroup,
    World,
)

__all__ = [
    "ByteRangeSplit",
    "Chunk",
    "ChunkUnit",
    "EpochPlan",
    "FileInfo",
    "FileSplit",
    "FileTable",
    "LegacySplitStrategy",
    "PlanSpec",
    "Planner",
    "RankPlan",
    "RecordIndex",
    "RowGroup",
    "RowGroupSplit",
    "SplitStrategy",
    "World",
    "assign",
    "permutation",
    "plan_epoch",
    "resolve_strategy",
    "shuffled",
    "verify_plan",
]
