"""One source's data and how it is split: what every order reads of it.

A :class:`SourcePlan` holds what discovery found (the files as columns, the reader, the
output schema) and the planner of its chunks. The split is the user's or, where the
row mixing needs more chunks than the default split gives, the library's
(:mod:`..split_choice`): the order says for how many readers (:meth:`SourcePlan.choose_split`),
and a resume state saved with another choice is adopted when loaded
(:meth:`SourcePlan.adopt`). The options a state is tied to are here too
(:meth:`SourcePlan.tied_options`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.plan.planner import Planner, PlanSpec
from torch_dataloader_utils.plan.splits import RankAwareStrategy, Splitter
from torch_dataloader_utils.plan.state import fingerprint, saved_options
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import FileInfo
from torch_dataloader_utils.runtime import share
from torch_dataloader_utils.runtime.options import Options
from torch_dataloader_utils.runtime.split_choice import (
    MIN_TEXT_SPLIT_BYTES,
    SplitNeed,
    finer_split,
    need_of,
    strategy_for,
)

__all__ = ["SourcePlan", "tied_options"]

log = logging.getLogger("torch_dataloader_utils.runtime.dataset")
"""The dataset's logger, as before orders were values (what users and tests listen to)."""


def tied_options(options: Options, identity: Mapping[str, Any]) -> dict[str, Any]:
    """The options a resume state is tied to (part of its fingerprint), as JSON-ready values."""
    batching, shuffle = options.batching, options.shuffle
    strategy = repr(options.strategy)
    if " at 0x" in strategy:
        strategy = f"{type(options.strategy).__module__}.{type(options.strategy).__qualname__}"
    if options.canonical is None:
        size: dict[str, Any] = {"batch_size": batching.batch_size}
    else:  # elastic order: any world at the same global batch
        size = {
            "canonical_ranks": options.canonical,
            "global_batch_size": batching.batch_size * options.world.num_ranks,
        }
    return {
        "split_strategy": strategy,
        "shuffle": shuffle.shuffle,
        "shuffle_seed": shuffle.shuffle_seed,
        **size,
        "drop_last": batching.drop_last,
        "equal_batches": batching.equal_batches.value,
        "row_shuffle_window": shuffle.row_window,
        # Only when in effect: states of unshuffled (or chunk-only) reads stay valid.
        **({} if shuffle.mixing is None else {"row_mixing": shuffle.mixing.rows}),
        **identity,
    }


def plan_spec(table: FileTable, options: Options) -> PlanSpec:
    """What every plan of a source depends on (workers are given per plan)."""
    batching, shuffle = options.batching, options.shuffle
    return PlanSpec(
        files=table,
        strategy=options.strategy,
        num_ranks=options.world.num_ranks,
        num_workers=1,
        shuffle=shuffle.shuffle,
        seed=shuffle.shuffle_seed,
        equal_batches=batching.equal_batches,
        batch_size=batching.batch_size,
        verify=options.split.verify_plan,
    )


class SourcePlan:
    """One source: its files, reader and output schema, and the planner of its chunks.

    Args:
        files: The files (metadata only).
        table: The same files as columns (built from ``files`` when ``None``).
        reader: Reads one chunk's rows.
        schema: The Arrow schema of the rows read.
        options: The checked options of the source.
        row_count_issue: Why row counts are not exact (``None``: they are).
        identity: What else a state is tied to (format, columns, filters, table...).
        name: The source as people name it (its path or table), for messages.
    """

    def __init__(
        self,
        *,
        files: Sequence[FileInfo],
        table: FileTable | None,
        reader: ChunkReader,
        schema: pa.Schema,
        options: Options,
        row_count_issue: str | None,
        identity: Mapping[str, Any],
        name: str = "the dataset",
    ) -> None:
        if table is not None and len(table) != len(files):
            raise ValueError(f"a file table of {len(table)} files for {len(files)} files")
        self.files = files if table is not None else tuple(files)
        self.table = table if table is not None else FileTable.from_infos(self.files)
        self.reader = reader
        self.schema = schema
        self.options = options
        self.row_count_issue = row_count_issue
        self.identity = dict(identity)
        self.name = name
        self.planner = Planner(plan_spec(self.table, options))
        self.split_auto: dict[str, int] | None = None
        """The sizes the library chose for the row mixing (``None``: the user's or the default)."""
        self.counted_key = False
        """A state records whether text rows were counted (a source read alone: its chunks and
        their rows depend on it; a mix counts every source)."""
        self._fingerprint: dict[str, Any] | None = None

    @property
    def strategy(self) -> Splitter | RankAwareStrategy:
        """The split strategy planned with: the options', or a finer one the row mixing needed."""
        return self.planner.spec.strategy

    def tied_options(self) -> dict[str, Any]:
        """The options a resume state of the source is tied to (the split chosen included)."""
        tied = tied_options(self.options, self.identity)
        if self.split_auto is not None:  # only when the library split finer for the mixing
            tied["split_auto"] = self.split_auto
        if self.counted_key and self.identity.get("format") in ("csv", "jsonl"):
            tied["rows_counted"] = self.options.counts_rows
        return tied

    def fingerprint(self) -> dict[str, Any]:
        """The source's files digest and tied options (what a state of it is tied to), computed once."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.table, self.tied_options())
        return self._fingerprint

    def need(
        self, readers: int, *, streams: int | None = None, library_only: bool = True
    ) -> SplitNeed | None:
        """What the row mixing of ``readers`` readers needs of the split (see :func:`need_of`)."""
        return need_of(self.options, readers, streams=streams, library_only=library_only)

    def choose_split(self, need: SplitNeed | None, *, shared: bool = False) -> None:
        """Split finer than the default when ``need`` is not met by the default split.

        ``shared``: under a process group every rank takes rank 0's need, so all plan alike
        (when the readers may differ between ranks: ``num_workers=None``).
        """
        table = self.planner.chunk_table()
        if need is None or table is None:
            return
        if shared and self.options.world.num_ranks > 1:
            chosen = need
            need = share.from_rank0(lambda: chosen)
        if need.met_by(table):
            return
        strategy, sizes = finer_split(self.options.strategy, self.table, need)
        self.use_split(strategy, sizes)
        log.info(
            "split %s for the row mixing: %d readers mix %d chunks each, the default split gives %d chunks",
            ", ".join(f"{k}={v:,}" for k, v in sizes.items()),
            need.readers,
            need.streams,
            len(table),
        )

    def use_split(self, strategy: Splitter | RankAwareStrategy, sizes: dict[str, int] | None) -> None:
        """Plan with ``strategy`` from now on (``sizes``: what the library chose, or ``None``)."""
        self.planner = Planner(dataclasses.replace(self.planner.spec, strategy=strategy))
        self.split_auto = sizes
        self._fingerprint = None

    def adopt(self, state: object) -> Callable[[], None] | None:
        """Take the library's split a state (or a source's fingerprint in it) was saved with.

        Returns how to go back, or ``None`` when nothing changed: the split is the user's (a
        state of another split is then a mismatch), or the state's choice is this one.
        """
        if self.need(1) is None:
            return None
        saved = saved_options(state)
        if saved is None or "split_strategy" not in saved:
            return None
        sizes = saved.get("split_auto")
        if sizes == self.split_auto:
            return None
        strategy = strategy_for(self.options.strategy, sizes)
        if strategy is None:
            return None
        previous = (self.strategy, self.split_auto)
        self.use_split(strategy, dict(sizes) if sizes is not None else None)
        log.info(
            "the resume state was saved with split %s; this dataset reads with it", sizes or "by default"
        )
        return lambda: self.use_split(*previous)

    def _units(self) -> int:
        """The most chunks the files can be cut into: row groups (stripes), count blocks, whole files."""
        table = self.table
        groups = np.diff(table.group_offsets).astype(np.int64)
        units = np.where(table.has_groups, groups, 1)
        text = ~table.has_groups & table.splittable
        if text.any():
            block = np.full(len(table), MIN_TEXT_SPLIT_BYTES, dtype=np.int64)
            if table.block_bytes is not None:
                block = np.where(table.block_bytes > 0, table.block_bytes, block)
            units = np.where(text, np.maximum(1, -(-table.size // np.maximum(1, block))), units)
        return int(units.sum())

    def more_chunks(self) -> str:
        """How the source gets more chunks (the fix of idle ranks and workers in warnings)."""
        chunks = self.chunks()
        if chunks is None:
            return "Return more chunks from the split strategy"
        if self._units() > chunks:
            return "Lower split_rows / split_bytes"
        what = (
            "smaller row groups"
            if self.table.has_groups.any()
            else "more files (a text file is cut at 1 MiB)"
        )
        return f"Rewrite the data with {what} (`torch-dataloader-utils reshard`): a lower split gives no more"

    def shortfall(self, need: SplitNeed) -> tuple[str, str] | None:
        """Why the split gives the readers fewer chunks than ``need`` asks, and the fix; ``None`` if not."""
        table = self.planner.chunk_table()
        if table is None or len(table) >= need.chunks:
            return None
        split = self.options.split
        groups = int(np.diff(self.table.group_offsets)[self.table.has_groups].sum())
        given = split.split_bytes is not None or split.split_rows is not None
        if given and not (groups and len(table) >= groups):  # a lower split would give more chunks
            return (
                "split_bytes / split_rows give",
                "Lower split_bytes / split_rows, or leave them out: the library then splits as needed",
            )
        if groups:
            return (
                f"the files' {groups:,} row groups (stripes), the smallest unit of a chunk, give",
                "Rewrite the files with smaller row groups, or into more files (`torch-dataloader-utils "
                "reshard`), or read with fewer workers",
            )
        return (
            f"the {len(self.table):,} files give",
            "Split the data into more files (compressed files and CSV with quoted_newlines are read "
            f"whole; byte ranges are at least {MIN_TEXT_SPLIT_BYTES // 2**20} MiB), or use fewer workers",
        )

    def chunks(self) -> int | None:
        """Chunks of the current split (``None`` for a custom strategy)."""
        table = self.planner.chunk_table()
        return None if table is None else len(table)
