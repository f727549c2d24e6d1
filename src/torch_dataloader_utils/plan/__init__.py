"""The pure planning core: stdlib and numpy only.

Nothing in this package imports pyarrow, fsspec, pyiceberg or torch (a test enforces
it), and nothing reads the environment: a plan is a function of values alone.
"""

from torch_dataloader_utils.plan.assign import assign
from torch_dataloader_utils.plan.planner import PlanSpec, plan_epoch
from torch_dataloader_utils.plan.shuffle import permutation, shuffled
from torch_dataloader_utils.plan.splits import (
    ByteRangeSplit,
    FileSplit,
    LegacySplitStrategy,
    RowGroupSplit,
    SplitStrategy,
    resolve_strategy,
)
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
    "LegacySplitStrategy",
    "PlanSpec",
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
]
