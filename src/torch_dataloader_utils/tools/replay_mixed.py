"""Replaying a pass of a mix of sources (``create_mixed_dataloader``) from its ledger record.

The mixed order (:class:`~torch_dataloader_utils.runtime.orders.mixed.MixedOrder`) is built
again over the sources' files from the ledger's manifests (no discovery), with the options
recorded, and loaded with the resume state its epochs were counted from (the pass record's
start), so that where every source stands when the pass starts and every batch's rows of
each source come out of the order's own plan:

* step ``s`` of the rank is lane ``w``'s batch ``t``: batch ``t`` of every lane of the rank,
  lane after lane (the order's :class:`~torch_dataloader_utils.runtime.orders.mixed.Sequencer`);
* lane batch ``t`` holds ``counts_of(t)[s]`` rows of source ``s``: rows
  ``[consumed(t)[s], consumed(t)[s] + counts)`` of the lane's stream of that source, which
  runs from where the source stood (its begun epochs, then whole ones);
* the rows of a batch are its sources' rows, source after source, in a seeded order when
  shuffling.

With ``on_bad_data='skip'`` (no padding) the rows of a unit that did not decode leave the
batch they fall in (later batches do not shift): :meth:`MixedReplay.lineage` lists the
planned rows, :meth:`MixedReplay.read` gives the batch exactly as it was delivered.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.config import PADDING_COLUMN, EqualBatches, FileFormat, MixConfig, OnExhausted
from torch_dataloader_utils.errors import ConfigError, LedgerError
from torch_dataloader_utils.io.pieces import gathered, read_piece
from torch_dataloader_utils.plan.lineage import Span, WorkerStream
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.schedule import weights_of_record
from torch_dataloader_utils.plan.shuffle import permutation
from torch_dataloader_utils.runtime.ledger import decode, read_json
from torch_dataloader_utils.runtime.options import (
    MIX_ONLY,
    FileReadOptions,
    IcebergReadOptions,
    MixedLoaderOptions,
    build_options,
)
from torch_dataloader_utils.runtime.orders.mixed import ORDER_SALT, MixedOrder
from torch_dataloader_utils.runtime.orders.planned import STANDIN_COLUMN
from torch_dataloader_utils.runtime.orders.source import SourcePlan
from torch_dataloader_utils.runtime.split_choice import strategy_for
from torch_dataloader_utils.tools.replay import (
    LINEAGE_SCHEMA,
    BatchLineage,
    LedgerPass,
    Store,
    check_files,
    span_rows,
)

__all__ = ["MixedReplay"]

_MIX_ONLY = (MIX_ONLY | {"row_interleave"}) - {
    "num_ranks",
    "rank",
    "num_workers",
    "show_progress",
    "progress_interval_sec",
    "progress_all_ranks",
    "on_exhausted",
    "source_column",
}
"""Recorded options given to the mix as a whole when it is built again: the mix's own, with
``row_interleave`` (given to every source), less the world (the record's) and
``on_exhausted`` / ``source_column`` (the mix's record's)."""


class MixedReplay:
    """A pass of a mix planned again from its record (see the module).

    Args:
        ledger: The ledger's files.
        ledger_pass: The pass.
    """

    def __init__(self, ledger: Store, ledger_pass: LedgerPass) -> None:
        self.ledger = ledger
        self.ledger_pass = ledger_pass
        self.record = record = ledger_pass.record
        self.config = ledger.config(record.config)
        self.tables = [ledger.table(name) for name in record.files]
        self.names = [str(n) for n in self.config["names"]]
        mix = self.config["mix"]
        try:
            weights = weights_of_record(mix["weights"], ledger.overrides.get("weights"))
        except ConfigError as exc:
            raise LedgerError(str(exc)) from None
        self.mix = MixConfig(
            weights=weights,
            on_exhausted=OnExhausted(mix["on_exhausted"]),
            source_column=mix["source_column"],
            allow_recipe_change=True,  # the job loaded the pass's start state: with a changed recipe, on it
        )
        world = {"num_ranks": record.num_ranks, "rank": record.rank, "num_workers": record.num_workers}
        self.keywords = {**decode(self.config.get("options", {})), **world}
        self.options = build_options(self.keywords, MixedLoaderOptions, "Ledger", FileFormat.PARQUET)
        sources = [self._source(i, spec) for i, spec in enumerate(self.config["sources"])]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.order = MixedOrder(sources, self.names, self.mix, self.options)
            if record.start is not None:
                self.order.load(read_json(ledger.root / record.start))
        self.epoch = record.epoch
        self.plan = self.order.pass_plan(self.epoch)
        start = self.order.start_of(self.epoch)
        self.start, self.segment = start.positions, start.segment
        self.first = self.order.first_batches(self.epoch)
        self.readers = self.order.readers
        self.exact = True  # a mix's sources have exact row counts

    def _source(self, index: int, spec: Mapping[str, Any]) -> SourcePlan:
        """Source ``index`` planned over the ledger's manifest (no discovery, no reader)."""
        recorded = spec["source"]
        fmt = FileFormat(recorded.get("format", "parquet"))
        allowed = IcebergReadOptions if recorded["type"] == "iceberg" else FileReadOptions
        given = {k: v for k, v in decode(spec.get("options", {})).items() if k not in ("collate_fn",)}
        given.update(num_ranks=self.record.num_ranks, rank=self.record.rank, num_workers=0)
        options = build_options(given, allowed, "Ledger", fmt, standalone=True)
        fingerprint = spec["fingerprint"]
        table = self.tables[index]
        source = SourcePlan(
            files=table.infos,
            table=table,
            reader=None,  # type: ignore[arg-type]  # planning only: reading goes through the rebuilt mix
            schema=decode(spec["schema"]),
            options=options,
            row_count_issue=spec.get("row_count_issue"),
            identity=fingerprint["options"],
            name=self.names[index],
        )
        sizes = fingerprint["options"].get("split_auto")
        if sizes is not None:
            strategy = strategy_for(options.strategy, sizes)
            if strategy is None:
                raise LedgerError(
                    f"source {self.names[index]!r}: the recorded split {sizes!r} cannot be rebuilt"
                )
            source.use_split(strategy, dict(sizes))
        return source

    # -- the step's lane and batch -------------------------------------------------------------
    @property
    def num_batches(self) -> int:
        """Batches of the pass on this rank."""
        return sum(max(0, self.plan.batches - f) for f in self.first)

    def locate(self, step: int) -> tuple[int, int]:
        """``(worker, batch of its lane)`` of ``step``: batch ``t`` of every lane, lane after lane.

        Raises:
            LedgerError: the pass has no such step.
        """
        offset = step - self.record.step
        if not 0 <= offset < self.num_batches:
            raise LedgerError(
                f"step {step} is not in rank {self.record.rank}'s pass from step {self.record.step}, which "
                f"delivers {self.num_batches} batches"
            )
        first = np.asarray(self.first, dtype=np.int64)
        t = int(first.min())
        while True:  # the batch index of the step: the steps before batch t of every lane
            live = first <= t
            if offset < int(live.sum()):
                return int(np.flatnonzero(live)[offset]), t
            offset -= int(live.sum())
            t += 1

    def _lane(self, worker: int) -> int:
        return self.record.rank * self.readers + worker

    def _source_spans(self, s: int, lane: int, t: int) -> list[tuple[Piece, Span]]:
        """The runs of source ``s``'s rows in lane batch ``t``: ``(piece, span)``, in order."""
        count = int(self.plan.counts_of(t, t + 1)[0][s])
        if not count:
            return []
        position = self.start[s]
        lo = position.skip + int(self.plan.consumed(t)[s])
        hi = lo + count
        entries = [*position.entries]
        next_epoch = position.next_epoch
        out: list[tuple[Piece, Span]] = []
        begin = 0
        while begin < hi:
            if entries:
                epoch, segments = entries.pop(0)
            else:
                epoch, segments = next_epoch, ()
                next_epoch += 1
            pieces = self.order.sources[s].pieces(epoch, segments, lane)
            stream = WorkerStream(pieces, self.options.batching.batch_size, False)
            end = begin + stream.rows
            if end > lo:
                a, b = max(lo, begin) - begin, min(hi, end) - begin
                out.extend((stream.pieces[span.piece], span) for span in stream.spans(a, b))
            begin = end
        return out

    def _order(self, lane: int, t: int, total: int) -> np.ndarray[Any, Any] | None:
        """The seeded order of a batch's ``total`` rows (``None``: as they are)."""
        shuffle = self.options.shuffle
        if not shuffle.shuffle or total < 2:
            return None
        key = (self.epoch, self.segment, lane, t)
        return permutation(total, shuffle.shuffle_seed, *key, ORDER_SALT)

    def lineage(self, step: int) -> BatchLineage:
        """Where every row of ``step``'s batch came from (the planned rows; no data read)."""
        worker, t = self.locate(step)
        lane = self._lane(worker)
        parts = []
        for s in range(len(self.names)):
            for piece, span in self._source_spans(s, lane, t):
                parts.append(span_rows(piece, span, self.tables[s], s))
        table = pa.concat_tables(parts) if parts else LINEAGE_SCHEMA.empty_table()
        order = self._order(lane, t, table.num_rows)
        if order is not None:
            table = table.take(pa.array(order))
        table = table.set_column(0, "position", pa.array(np.arange(table.num_rows, dtype=np.int64)))
        return BatchLineage(step, self.record.rank, self.epoch, self.record.step, worker, t, table)

    # -- reading ---------------------------------------------------------------------------------
    @cached_property
    def dataset(self) -> Any:
        """The mix built again from its recorded sources and options (for reading and converting)."""
        from torch_dataloader_utils.runtime.recipes import create_mixed_dataloader

        specs = []
        overrides = dict(self.ledger.overrides)
        for spec in self.config["sources"]:
            recorded = spec["source"]
            given = {k: v for k, v in decode(spec.get("options", {})).items() if k not in _MIX_ONLY}
            given.update(decode(recorded.get("keywords", {})))
            if recorded["type"] == "iceberg":
                given.update(table=recorded["table"], snapshot_id=recorded.get("snapshot_id"))
            else:
                given.update(path=decode(recorded["path"]), format=recorded["format"])
            given.update({k: v for k, v in overrides.items() if k in ("storage_options", "catalog_config")})
            specs.append(given)
        mix_options = {k: v for k, v in self.keywords.items() if k in _MIX_ONLY or k in ("num_ranks", "rank")}
        mix_options["num_workers"] = self.record.num_workers
        for name in ("collate_fn",):
            if name in overrides:
                mix_options[name] = overrides[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, dataset = create_mixed_dataloader(
                specs,
                self.mix.weights,
                on_exhausted=self.mix.on_exhausted.value,
                source_column=self.mix.source_column,
                **{k: v for k, v in mix_options.items() if not hasattr(v, "shown")},
            )
        return dataset

    def read(self, step: int) -> pa.RecordBatch:
        """``step``'s batch as Arrow, the same rows in the same order as delivered (before conversion)."""
        worker, t = self.locate(step)
        lane = self._lane(worker)
        dataset = self.dataset
        padded = self.options.batching.equal_batches is EqualBatches.PAD
        skipping = self.options.bad_data.skipping and not padded
        flag = PADDING_COLUMN if padded else STANDIN_COLUMN if skipping else None
        names = list(dataset.sources[0].schema.names) + ([flag] if flag else [])
        parts: list[pa.RecordBatch] = []
        for s, member in enumerate(dataset.sources):
            spans = self._source_spans(s, lane, t)
            paths = (c.path for p, _ in spans for c in p.chunks)
            check_files(self.tables[s], self.record, member.file_table, paths)
            for piece, span in spans:
                items = read_piece(
                    member.reader,
                    dataclasses.replace(piece, lo=span.lo, hi=span.hi),
                    flag_column=flag,
                    batch_size=self.options.batching.batch_size,
                    files=self.tables[s],
                )
                parts.extend(
                    p for p in (self._part(b, names, s, skipping) for b in gathered(items)) if p.num_rows
                )
        table = pa.Table.from_batches(parts) if parts else None
        if table is None:
            raise LedgerError(f"step {step}: every row of its batch was a skipped unit's")
        order = self._order(lane, t, table.num_rows)
        if order is not None:
            table = table.take(pa.array(order))
        return table.combine_chunks().to_batches()[0]

    def _part(self, batch: pa.RecordBatch, names: list[str], source: int, skipping: bool) -> pa.RecordBatch:
        """A part of a batch as the mix assembles it: its columns, no stand-ins, the source column."""
        part = batch.select(names)
        if skipping:  # stand-ins of skipped units leave the batch (as the mix's lanes do)
            part = part.filter(pc.invert(part.column(STANDIN_COLUMN))).drop_columns([STANDIN_COLUMN])
        column = self.mix.source_column
        if column is not None:
            field = pa.field(column, pa.int32(), nullable=False)
            part = part.append_column(field, pa.repeat(pa.scalar(source, pa.int32()), part.num_rows))
        return part

    def convert(self, batch: pa.RecordBatch) -> Any:
        """``batch`` converted as the mixed loader converted it (``collate_fn`` too)."""
        out = self.dataset.convert_batch(batch)
        collate = self.dataset.options.output.collate_fn
        return out if collate is None else collate(out)
