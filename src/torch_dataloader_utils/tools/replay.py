"""Replaying one pass of a training ledger: its plan again, the rows of each step, reading them.

:class:`PassReplay` plans a pass again from its record (:mod:`~torch_dataloader_utils.plan.ledger`)
without the training job: the files come from the ledger's manifest (no listing, no
footers), the options and the start state from its config and state files. Which rows a
step's batch holds then follows from the plan (:mod:`~torch_dataloader_utils.plan.lineage`);
:meth:`PassReplay.read` reads only that batch's chunks, through the source built again
from its recorded config, and the batch is converted as the loader converted it.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.config import PADDING_COLUMN, EqualBatches, FileFormat
from torch_dataloader_utils.errors import ConfigError, FileChangedError, LedgerError
from torch_dataloader_utils.io.bad import is_standin
from torch_dataloader_utils.io.batching import concat_batches
from torch_dataloader_utils.io.pieces import gathered, read_piece
from torch_dataloader_utils.plan.elastic import Canonical
from torch_dataloader_utils.plan.ledger import EndRecord, PassRecord
from torch_dataloader_utils.plan.lineage import Delivery, Span, WorkerStream, emission, stream_rows
from torch_dataloader_utils.plan.pieces import Piece
from torch_dataloader_utils.plan.planner import Planner, PlanSpec
from torch_dataloader_utils.plan.resume import Resumer, group
from torch_dataloader_utils.plan.state import Segment, segments_of
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import ChunkUnit, FileInfo
from torch_dataloader_utils.runtime.elastic import ElasticPlans
from torch_dataloader_utils.runtime.ledger import Unrecorded, decode, read_json
from torch_dataloader_utils.runtime.options import (
    FileReadOptions,
    IcebergReadOptions,
    Options,
    build_options,
    file_source,
    iceberg_source,
)
from torch_dataloader_utils.runtime.orders.planned import STANDIN_COLUMN
from torch_dataloader_utils.runtime.split_choice import strategy_for
from torch_dataloader_utils.storage.redact import HIDDEN

__all__ = ["LINEAGE_SCHEMA", "BatchLineage", "LedgerPass", "PassReplay", "Store", "check_files", "span_rows"]

_LINEAGE_FIELDS: list[pa.Field[Any]] = [
    pa.field("position", pa.int64()),
    pa.field("file", pa.string()),
    pa.field("unit", pa.string()),
    pa.field("chunk_start", pa.int64()),
    pa.field("chunk_stop", pa.int64()),
    pa.field("offset", pa.int64()),
    pa.field("file_row", pa.int64()),
    pa.field("padding", pa.bool_()),
    pa.field("source", pa.int32()),
]
LINEAGE_SCHEMA = pa.schema(_LINEAGE_FIELDS)
"""One row per row of a batch: where it came from.

``file``; ``unit``: ``"rows"`` (a row range of the file: row groups, stripes, an Iceberg
data file) or ``"bytes"`` (a byte range of a text file); ``[chunk_start, chunk_stop)``:
the chunk's rows or bytes; ``offset``: the row's position among the rows the chunk reads
(after deletes and the row filter); ``file_row``: its row in the file (``null`` for a
byte range's records or under a row filter); ``padding``: a repeated row
(``equal_batches='pad'``); ``source``: the source of a mix (0 otherwise)."""


@dataclasses.dataclass(frozen=True)
class LedgerPass:
    """A pass of one rank, as the ledger recorded it.

    Attributes:
        record: Its pass record.
        skips: Rows its workers removed: ``{worker: ((planned position, rows), ...)}``.
        end: Its end record (``None``: the job stopped without one).
        stop: The step at which the rank's next pass started (``None``: none did); the
            pass's steps from there on, if any, were superseded (a resume from an
            earlier checkpoint).
    """

    record: PassRecord
    skips: Mapping[int, tuple[tuple[int, int], ...]]
    end: EndRecord | None
    stop: int | None

    @property
    def step(self) -> int:
        """The step of its first batch."""
        return self.record.step

    @property
    def last_step(self) -> int | None:
        """One past the last step it delivered that counts, when known."""
        ends = [s for s in (self.stop, None if self.end is None else self.step + self.end.batches) if s]
        return min(ends) if ends else None


@dataclasses.dataclass(frozen=True)
class BatchLineage:
    """Where every row of one delivered batch came from.

    Attributes:
        step: The step (the loader's count of batches handed out before it).
        rank: The rank.
        epoch: The epoch of its pass.
        pass_step: The step its pass started at.
        worker: The reading process that read it (DataLoader worker id; 0 in the main process).
        index: Its index among that process's batches of the pass.
        rows: One row per row of the batch, in order (:data:`LINEAGE_SCHEMA`).
    """

    step: int
    rank: int
    epoch: int
    pass_step: int
    worker: int
    index: int
    rows: pa.Table

    def runs(self) -> list[dict[str, Any]]:
        """The rows grouped into runs of consecutive rows of one chunk (what the CLI prints)."""
        table = self.rows
        if not table.num_rows:
            return []
        files = table.column("file").to_pylist()
        offsets = table.column("offset").to_numpy()
        starts = table.column("chunk_start").to_numpy()
        padding = table.column("padding").to_numpy(zero_copy_only=False)
        breaks = np.flatnonzero(
            (np.diff(offsets) != 1)
            | (np.asarray(files[1:], dtype=object) != np.asarray(files[:-1], dtype=object))
            | (np.diff(starts) != 0)
            | (padding[1:] != padding[:-1])
        )
        edges = [0, *(breaks + 1).tolist(), table.num_rows]
        rows = table.to_pylist()
        out = []
        for a, b in itertools.pairwise(edges):
            first = rows[a]
            out.append({**first, "rows": b - a, "last_offset": rows[b - 1]["offset"]})
        return out

    def __str__(self) -> str:
        head = (
            f"step {self.step} rank {self.rank}: epoch {self.epoch}, pass from step {self.pass_step}, "
            f"worker {self.worker} batch {self.index}, {self.rows.num_rows} rows"
        )
        lines = [head]
        for run in self.runs():
            unit = "rows" if run["unit"] == "rows" else "bytes"
            where = f"{run['file']} {unit} [{run['chunk_start']}, {run['chunk_stop']})"
            if run["file_row"] is not None and run["file_row"] >= 0:
                at = f"file row {run['file_row']}" + (f" (+{run['rows'] - 1})" if run["rows"] > 1 else "")
            else:
                at = f"record {run['offset']} of the range" if unit == "bytes" else f"row {run['offset']}"
                at += f" (+{run['rows'] - 1})" if run["rows"] > 1 else ""
            extra = " padding" if run["padding"] else ""
            lines.append(f"  {run['rows']:>6} x {where}: {at}{extra}")
        return "\n".join(lines)


class Store(Protocol):
    """Where a replay finds a ledger's files: its directory, the options given back, parsed files."""

    root: Path
    overrides: dict[str, Any]

    def config(self, name: str) -> dict[str, Any]:
        """A config file of the ledger."""
        ...

    def table(self, name: str) -> FileTable:
        """A files manifest of the ledger."""
        ...


class PassReplay:
    """One pass planned again from its record: which rows every step holds, and reading them.

    Args:
        ledger: The ledger's files.
        ledger_pass: The pass.
    """

    def __init__(self, ledger: Store, ledger_pass: LedgerPass) -> None:
        self.ledger = ledger
        self.ledger_pass = ledger_pass
        record = ledger_pass.record
        self.record = record
        self.config = ledger.config(record.config)
        if record.order == "mixed":
            raise LedgerError(
                "replaying a mix of sources needs the mixed order's replay (not in this ledger)"
            )
        self.table = ledger.table(record.files[0])
        self.source = dict(self.config["source"])
        self.keywords = self._keywords()
        self.options = self._options()
        self.readers = max(1, record.num_workers)
        fingerprint = self.config.get("fingerprint", {})
        tied = fingerprint.get("options", {}) if isinstance(fingerprint, dict) else {}
        strategy = strategy_for(self.options.strategy, tied.get("split_auto"))
        if strategy is None:
            raise LedgerError(f"the ledger's split {tied.get('split_auto')!r} cannot be rebuilt")
        self.exact = not self.config.get("row_count_issue")
        batching, shuffle = self.options.batching, self.options.shuffle
        self.planner = Planner(
            PlanSpec(
                files=self.table,
                strategy=strategy,
                num_ranks=record.num_ranks,
                num_workers=1,
                shuffle=shuffle.shuffle,
                seed=shuffle.shuffle_seed,
                equal_batches=batching.equal_batches,
                batch_size=batching.batch_size,
            )
        )
        self.segments: tuple[Segment, ...] = ()
        if record.start is not None:
            start = read_json(ledger.root / record.start)
            self.segments = segments_of(start.get("segments", []))

    # -- the options, as recorded -------------------------------------------------------------
    def _keywords(self) -> dict[str, Any]:
        given = {**decode(self.config.get("options", {})), **decode(self.source.get("keywords", {}))}
        for name, value in self.ledger.overrides.items():
            if isinstance(value, Mapping) and isinstance(given.get(name), Mapping):
                kept = {k: v for k, v in given[name].items() if v != HIDDEN}
                given[name] = {**kept, **value}
            else:
                given[name] = value
        for name, value in list(given.items()):
            if isinstance(value, Mapping) and any(v == HIDDEN for v in value.values()):
                given[name] = {k: v for k, v in value.items() if v != HIDDEN}
        return given

    def _given(self, for_reading: bool) -> dict[str, Any]:
        record = self.record
        given = {**self.keywords, "num_ranks": record.num_ranks, "rank": record.rank, "num_workers": 0}
        if given.get("on_bad_data") == "quarantine":
            given["on_bad_data"] = "skip"  # the same rows; no report written by a replay
        for name, value in given.items():
            if isinstance(value, Unrecorded) and (for_reading or name == "split_strategy"):
                raise LedgerError(
                    f"the job passed {name}={value.shown}, which a ledger cannot hold (it records "
                    f"objects by name only); pass it again: Ledger(DIR, {name}=...)"
                )
        return {k: v for k, v in given.items() if not isinstance(v, Unrecorded)}

    def reading_keywords(self) -> dict[str, Any]:
        """The source's keywords to build it again with (objects given back by the user).

        Raises:
            LedgerError: an option recorded by name only was not given back.
        """
        return self._given(for_reading=True)

    def _options(self) -> Options:
        allowed = IcebergReadOptions if self.source["type"] == "iceberg" else FileReadOptions
        fmt = FileFormat(self.source.get("format", "parquet"))
        given = self._given(for_reading=False)
        return build_options(given, allowed, "Ledger", fmt, standalone=True)

    # -- the pass's plan ------------------------------------------------------------------------
    def _worker_pieces(self) -> list[list[Piece]]:
        record, shuffle = self.record, self.options.shuffle
        epoch, rank, workers = record.epoch, record.rank, self.readers
        if self.segments:
            resumer = Resumer(
                self.planner,
                epoch,
                self.segments,
                num_ranks=record.num_ranks,
                num_workers=lambda r: workers,
                window_rows=shuffle.row_window,
                exact=self.exact,
                mixing=shuffle.mixing,
            )
            return [list(p) for p in resumer.rank(rank)]
        plan = self.planner.rank_plan(epoch, rank, workers)
        seed = shuffle.shuffle_seed if shuffle.shuffle else 0
        return [
            group(
                plan.pieces_for(w), shuffle.row_window, shuffle.mixing, (seed, epoch, 0, rank, w), self.table
            )
            for w in range(workers)
        ]

    @cached_property
    def elastic(self) -> ElasticPlans | None:
        """Elastic order's canonical streams of the rank (``canonical_ranks``), or ``None``."""
        canonical = self.options.canonical
        if canonical is None:
            return None
        shuffle = self.options.shuffle
        return ElasticPlans(
            self.planner,
            Canonical(canonical, self.record.num_ranks, self.options.batching.batch_size),
            self.record.rank,
            window_rows=shuffle.row_window,
            mixing=shuffle.mixing,
            seed=shuffle.shuffle_seed if shuffle.shuffle else 0,
        )

    @cached_property
    def streams(self) -> list[WorkerStream]:
        """The rows of every reading process of the pass (elastic order: every canonical stream)."""
        batching = self.options.batching
        elastic = self.elastic
        if elastic is not None:
            streams = elastic.streams(self.record.epoch, self.segments)
            layout, workers, rank = elastic.layout, self.record.num_workers, self.record.rank
            # A batch is every reading worker's part, in worker order: its streams, in order.
            order = [
                c for w in range(layout.readers(workers)) for c in layout.of_worker(rank, w, max(1, workers))
            ]
            return [WorkerStream(streams[c], layout.per_stream, batching.drop_last) for c in order]
        skips = self.ledger_pass.skips
        return [
            WorkerStream(pieces, batching.batch_size, batching.drop_last, skips.get(w, ()))
            for w, pieces in enumerate(self._worker_pieces())
        ]

    @cached_property
    def delivery(self) -> Delivery:
        """Which worker's batch every step of the pass is."""
        if self.elastic is not None:
            return Delivery([max(s.num_batches for s in self.streams)], None)
        return Delivery(
            [s.num_batches for s in self.streams], self.record.groups if self.readers > 1 else None
        )

    @property
    def num_batches(self) -> int:
        """Batches of the pass."""
        return self.delivery.total

    def locate(self, step: int) -> tuple[int, int]:
        """``(worker, index)`` of ``step``'s batch (elastic order: ``(0, batch of the pass)``).

        Raises:
            LedgerError: the pass has no such step.
        """
        offset = step - self.record.step
        if not 0 <= offset < self.delivery.total:
            raise LedgerError(
                f"step {step} is not in rank {self.record.rank}'s pass from step {self.record.step}, which "
                f"delivers {self.delivery.total} batches"
            )
        return self.delivery.locate(offset)

    def spans(self, step: int) -> list[tuple[int, Span]]:
        """``(stream, span)`` of every run of ``step``'s rows, in batch order."""
        worker, index = self.locate(step)
        if self.elastic is None:
            return [(worker, s) for s in self.streams[worker].batch(index)]
        out: list[tuple[int, Span]] = []
        for c, stream in enumerate(self.streams):
            if index < stream.num_batches:
                out.extend((c, s) for s in stream.batch(index))
        return out

    def lineage(self, step: int) -> BatchLineage:
        """Where every row of ``step``'s batch came from."""
        worker, index = self.locate(step)
        parts = [self._span_rows(stream, span) for stream, span in self.spans(step)]
        table = pa.concat_tables(parts) if parts else LINEAGE_SCHEMA.empty_table()
        table = table.set_column(0, "position", pa.array(np.arange(table.num_rows, dtype=np.int64)))
        return BatchLineage(step, self.record.rank, self.record.epoch, self.record.step, worker, index, table)

    def _span_rows(self, stream: int, span: Span) -> pa.Table:
        piece = self.streams[stream].pieces[span.piece]
        return span_rows(piece, span, self.table if self.exact_rows else None)

    @property
    def exact_rows(self) -> bool:
        """Whether file rows are known from the plan (a row filter's rows are known by reading)."""
        return self.exact and self.keywords.get("filters") is None

    # -- reading ------------------------------------------------------------------------------
    @cached_property
    def dataset(self) -> Any:
        """The source built again as recorded (for reading and converting)."""
        return _rebuild(self, self._given(for_reading=True))

    @cached_property
    def query_dataset(self) -> Any:
        """The source built again with every column (a condition may need one the job left out)."""
        given = self._given(for_reading=True)
        if given.get("columns") is None:
            return self.dataset
        return _rebuild(self, {k: v for k, v in given.items() if k != "columns"})

    def pruned_groups(self, condition: Any) -> dict[str, list[tuple[int, int]] | None]:
        """Files (and their row groups, ``(first row, rows)``) whose statistics may meet ``condition``.

        The source built again with ``condition`` as its row filter: its discovery drops
        the files and row groups that statistics (Parquet min/max, Iceberg manifest
        bounds, partition values) exclude. ``None`` for a file without row groups (text).
        """
        given = {k: v for k, v in self._given(for_reading=True).items() if k != "columns"}
        recorded = given.get("filters")
        given.update(
            filters=condition if recorded is None else recorded & condition,
            count_rows=False,
            equal_batches="off",
            num_ranks=1,
            rank=0,
            canonical_ranks=None,
        )
        table = _rebuild(self, given).file_table
        out: dict[str, list[tuple[int, int]] | None] = {}
        first, rows, offsets = table.group_first_row, table.group_rows, table.group_offsets
        for i in range(len(table)):
            if not table.has_groups[i]:
                out[table.path(i)] = None
                continue
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            out[table.path(i)] = list(zip(first[lo:hi].tolist(), rows[lo:hi].tolist(), strict=True))
        return out

    def read(self, step: int) -> pa.RecordBatch:
        """``step``'s batch as Arrow, the same rows in the same order as delivered (before conversion)."""
        dataset = self.dataset
        padded = self.options.batching.equal_batches is EqualBatches.PAD
        spans = self.spans(step)
        check_files(
            self.table,
            self.record,
            dataset.file_table,
            (c.path for s, sp in spans for c in self.streams[s].pieces[sp.piece].chunks),
        )
        # Stand-ins of skipped units are flagged as the loader flags them: as padding, or in
        # a column of their own (their rows are not in the spans: a flagged row means the
        # unit did not decode now but did when the job read it).
        skipping = self.options.bad_data.skipping and not padded
        flag = PADDING_COLUMN if padded else STANDIN_COLUMN if skipping else None
        parts: list[pa.RecordBatch] = []
        for stream, span in spans:
            piece = dataclasses.replace(self.streams[stream].pieces[span.piece], lo=span.lo, hi=span.hi)
            items = read_piece(
                dataset.reader,
                piece,
                flag_column=flag,
                batch_size=self.options.batching.batch_size,
                files=self.table if self.exact else None,
            )
            parts.extend(b for b in gathered(items) if b.num_rows)
        return _checked_batch(parts, dataset, STANDIN_COLUMN if skipping else None)

    def convert(self, batch: pa.RecordBatch) -> Any:
        """``batch`` converted as the loader converted it (``collate_fn`` too)."""
        out = self.dataset.convert_batch(batch)
        collate = self.options.output.collate_fn
        return out if collate is None else collate(out)


def span_rows(piece: Piece, span: Span, files: Mapping[str, FileInfo] | None, source: int = 0) -> pa.Table:
    """The rows of a run of ``piece``'s emission order (:data:`LINEAGE_SCHEMA`; positions 0).

    ``files``: the files by path, to give every row its file row (``None``: unknown,
    under a row filter).
    """
    chunk_index, offsets = emission(piece, span.lo, span.hi)
    chunks = piece.chunks
    picked = chunk_index.tolist()
    n = len(offsets)
    file_rows = None if files is None else stream_rows(chunk_index, offsets, piece, files)
    return pa.table(
        {
            "position": pa.array(np.zeros(n, dtype=np.int64)),
            "file": pa.array([chunks[i].path for i in picked], pa.string()),
            "unit": pa.array(["bytes" if chunks[i].unit is ChunkUnit.BYTES else "rows" for i in picked]),
            "chunk_start": pa.array(np.asarray([chunks[i].start for i in picked], dtype=np.int64)),
            "chunk_stop": pa.array(np.asarray([chunks[i].stop for i in picked], dtype=np.int64)),
            "offset": pa.array(offsets + np.asarray([chunks[i].skip for i in picked], dtype=np.int64)),
            "file_row": pa.nulls(n, pa.int64())
            if file_rows is None
            else pa.array(file_rows, mask=file_rows < 0),
            "padding": pa.array([chunks[i].padding for i in picked], pa.bool_()),
            "source": pa.array(np.full(n, source, dtype=np.int32)),
        },
        schema=LINEAGE_SCHEMA,
    )


def _checked_batch(parts: list[pa.RecordBatch], dataset: Any, standins: str | None) -> pa.RecordBatch:
    """The batch of ``parts``; refused when a row of it did not decode now (``standins``: their flag)."""
    changed = LedgerError(
        "a unit of this batch did not decode now but did when the job read it: the data changed since "
        "the ledger recorded it"
    )
    if standins is not None:
        if any(pc.any(b.column(standins)).as_py() for b in parts):
            raise changed
        parts = [b.drop_columns([standins]) for b in parts]
    elif any(is_standin(b) for b in parts):
        raise changed
    if not parts:
        schema = dataset.schema
        return pa.RecordBatch.from_pylist([], schema=schema)
    return concat_batches(parts)


def _rebuild(replay: PassReplay, given: dict[str, Any]) -> Any:
    """The recorded source built again from ``given`` (its layout warnings were the job's: not repeated)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _build(replay, given)


def _build(replay: PassReplay, given: dict[str, Any]) -> Any:
    from torch_dataloader_utils.runtime.files import StructuredDataset
    from torch_dataloader_utils.runtime.iceberg import IcebergDataset

    source = replay.source
    allowed = IcebergReadOptions if source["type"] == "iceberg" else FileReadOptions
    fmt = FileFormat(source.get("format", "parquet"))
    options = (
        replay.options
        if given == replay._given(True)
        else build_options(given, allowed, "Ledger", fmt, standalone=True)
    )
    dataset: StructuredDataset | IcebergDataset
    if source["type"] == "iceberg":
        snapshot = source.get("snapshot_id")
        try:
            dataset = IcebergDataset.from_config(
                iceberg_source(source["table"], {**given, "snapshot_id": snapshot}), options
            )
        except ConfigError as exc:
            raise LedgerError(
                f"the Iceberg table {source['table']!r} cannot be read at snapshot {snapshot}, which the "
                f"ledger recorded (expired since?): {exc}"
            ) from exc
    else:
        path = decode(source["path"])
        dataset = StructuredDataset.from_config(path, file_source(source["format"], given), options)
    return dataset


def check_files(recorded: FileTable, record: PassRecord, now: FileTable, paths: Iterable[str]) -> None:
    """Refuse, naming the file, when one of ``paths`` changed since the ledger recorded it.

    Its size, modification time or rows differ from the manifest's (``recorded``, of the
    pass ``record``), or it is gone.

    Raises:
        FileChangedError: naming the file, what it was and what it is.
    """
    for path in sorted(set(paths)):
        i = recorded.index(path)
        if path not in now:
            raise FileChangedError(
                f"{path!r} is gone since the ledger recorded it (pass of rank {record.rank} from step "
                f"{record.step}): its rows cannot be read again"
            )
        j = now.index(path)
        was = (int(recorded.size[i]), float(recorded.mtime[i]), int(recorded.live[i]))
        is_ = (int(now.size[j]), float(now.mtime[j]), int(now.live[j]))
        same_time = (np.isnan(was[1]) and np.isnan(is_[1])) or abs(was[1] - is_[1]) < 1.0
        if was[0::2] != is_[0::2] or not same_time:
            raise FileChangedError(
                f"{path!r} changed since the ledger recorded it (size, modification time, rows: {was} then, "
                f"{is_} now): replay would read other rows; it refuses"
            )
