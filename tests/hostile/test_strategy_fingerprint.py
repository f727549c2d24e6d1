"""Hostile case (issue 28, item 13): a custom split strategy's parameters and the resume state.

The fingerprint named a custom strategy by its class only: a state saved while reading
with ``Cut(2)`` loaded into a loader built with ``Cut(4)``, whose chunks (and so whose
plan and cursors) are other ones, and rows were read twice while others were never read,
with no error (823 of 4,000 here). A state now records, per rank, a digest of the chunks
the strategy generated for its plan, and a resume refuses other chunks.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from tests.fixtures.data import write_parquet_files
from torch_dataloader_utils import Chunk, FileInfo, StateMismatchError, StructuredDataset

ROWS = [1000, 1000, 1000, 1000]


class Cut:
    """Every file cut into ``parts`` row ranges (the older signature: every chunk)."""

    def __init__(self, parts: int) -> None:
        self.parts = parts

    def generate(self, files: Sequence[FileInfo], num_workers: int, epoch: int) -> list[Chunk]:
        out = []
        for f in files:
            n = f.num_rows or 0
            edges = [n * k // self.parts for k in range(self.parts + 1)]
            out += [Chunk.rows(f, a, b) for a, b in itertools.pairwise(edges) if b > a]
        return out


def _dataset(root: str, parts: int) -> StructuredDataset:
    with pytest.warns(UserWarning, match="older generate"):
        return StructuredDataset(root, split_strategy=Cut(parts), batch_size=40, shuffle=True, shuffle_seed=1)


def _ids(batches: Any) -> list[int]:
    return [i for b in batches for i in b["id"].tolist()]


def test_custom_strategy_parameters_are_in_the_resume_fingerprint(tmp_path: Any) -> None:
    root = str(tmp_path / "data")
    write_parquet_files(tmp_path / "data", ROWS, row_group_size=100, with_strings=False)
    saved = _dataset(root, 2)
    seen: list[int] = []
    for n, batch in enumerate(saved, start=1):
        seen += batch["id"].tolist()
        if n == 30:
            break
    state = saved.state_dict()

    same = _dataset(root, 2)  # the same strategy resumes exactly
    same.load_state_dict(state)
    assert Counter(seen + _ids(iter(same))) == Counter(range(sum(ROWS)))

    other = _dataset(root, 4)  # other parameters: other chunks, so the cursors mean other rows
    with pytest.raises(StateMismatchError, match=r"custom split strategy returns other chunks for rank 0"):
        other.load_state_dict(state)
