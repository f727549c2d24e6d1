"""The ledger's commands: ``replay`` (which rows a step saw, its batch again) and ``ledger`` (queries).

::

    torch-dataloader-utils replay LEDGER --step N [--rank R] [--read] [--out F.parquet]
    torch-dataloader-utils ledger DIR                      # the passes of every rank
    torch-dataloader-utils ledger DIR --where "id = 123"   # the steps that saw a row
    torch-dataloader-utils ledger DIR --deleted SNAPSHOT   # Iceberg: deleted rows trained on

Secrets are not in a ledger: give them again with ``--storage-option KEY=VALUE`` and
``--catalog-config JSON``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.tools.ledger import Ledger
from torch_dataloader_utils.tools.replay import BatchLineage
from torch_dataloader_utils.tools.source import parse_catalog_config, parse_filter, parse_storage_option

__all__ = ["add_commands", "delivered_table"]

Typed = Callable[[Callable[[str], Any], str], Callable[[str], Any]]
"""The command line's wrapper of a parser into an argparse ``type``."""


def _secrets(p: argparse.ArgumentParser, typed: Typed) -> None:
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=typed(parse_storage_option, "storage option"),
        help="a filesystem option the job used (credentials are not in a ledger); repeat for more",
    )
    p.add_argument(
        "--catalog-config",
        type=typed(parse_catalog_config, "catalog config"),
        help="Iceberg catalog properties (a JSON object or file), merged over the recorded ones",
    )


def add_commands(sub: Any, formatter: type[argparse.HelpFormatter], typed: Typed, step: Any) -> None:
    """Add ``replay`` and ``ledger`` to the command line's subparsers.

    ``typed`` wraps a parser into an argparse ``type`` (the command line's own), ``step``
    is the ``type`` of an int >= 0.
    """
    replay = sub.add_parser(
        "replay",
        help="which rows step N saw (file, row group or byte range, row), or its batch again (--read)",
        description=(
            "Replay one step of a training ledger (create_dataloader(..., ledger=DIR)) without the job: "
            "no GPU, no process group, no workers; --read reads only that batch's chunks."
        ),
        formatter_class=formatter,
    )
    replay.add_argument("ledger", help="the ledger directory")
    replay.add_argument("--step", required=True, type=step, help="the step (batch) replayed")
    replay.add_argument("--rank", type=step, default=0, help="the rank")
    replay.add_argument("--read", action="store_true", help="read the batch, converted as it was delivered")
    replay.add_argument(
        "--out", metavar="FILE", help="with --read: write the batch to FILE (Parquet) (default: stdout)"
    )
    replay.add_argument("--json", action="store_true", help="print JSON for machines")
    _secrets(replay, typed)
    replay.set_defaults(fn=_replay)

    ledger = sub.add_parser(
        "ledger",
        help="a ledger's passes; the steps that saw a row (--where); deleted rows trained on (--deleted)",
        description="Ask a training ledger which steps saw rows, without re-reading the whole data.",
        formatter_class=formatter,
    )
    ledger.add_argument("dir", help="the ledger directory")
    what = ledger.add_mutually_exclusive_group()
    what.add_argument(
        "--where",
        metavar="CONDITION",
        type=typed(parse_filter, "condition"),
        help='COLUMN OP VALUE, e.g. "id = 123": list the steps and ranks that saw such a row',
    )
    what.add_argument(
        "--deleted",
        metavar="SNAPSHOT",
        type=int,
        help="Iceberg: the rows this later snapshot deleted that earlier steps trained on",
    )
    ledger.add_argument("--rank", type=step, help="only this rank (default: every rank)")
    ledger.add_argument("--json", action="store_true", help="print JSON for machines")
    _secrets(ledger, typed)
    ledger.set_defaults(fn=_ledger)


def _open(args: argparse.Namespace, path: str) -> Ledger:
    overrides: dict[str, Any] = {}
    if args.storage_option:
        overrides["storage_options"] = dict(args.storage_option)
    if args.catalog_config is not None:
        overrides["catalog_config"] = args.catalog_config
    return Ledger(path, **overrides)


def _replay(args: argparse.Namespace) -> int:
    ledger = _open(args, args.ledger)
    if args.read:
        table = delivered_table(ledger.rows(args.step, args.rank))
        if args.out:
            pq.write_table(table, args.out)
            print(f"step {args.step} rank {args.rank}: {table.num_rows} rows written to {args.out}")
            return 0
        for row in table.to_pylist():
            print(json.dumps(row, default=str))
        return 0
    lineage = ledger.batch(args.step, args.rank)
    if args.json:
        print(json.dumps(_lineage_json(lineage)))
    else:
        print(lineage)
    return 0


def _lineage_json(lineage: BatchLineage) -> dict[str, Any]:
    return {
        "step": lineage.step,
        "rank": lineage.rank,
        "epoch": lineage.epoch,
        "pass_step": lineage.pass_step,
        "worker": lineage.worker,
        "index": lineage.index,
        "rows": lineage.rows.to_pylist(),
    }


def _ledger(args: argparse.Namespace) -> int:
    ledger = _open(args, args.dir)
    ranks = ledger.ranks if args.rank is None else [args.rank]
    if args.where is None and args.deleted is None:
        return _summary(ledger, ranks, args.json)
    if args.where is not None:
        found = ledger.where(args.where, ranks=ranks)
    else:
        found = ledger.deleted(args.deleted, ranks=ranks)
    if args.json:
        print(json.dumps([dataclasses.asdict(s) for s in found]))
        return 0
    what = (
        f"rows where {args.where}" if args.where is not None else f"rows deleted by snapshot {args.deleted}"
    )
    print(f"{len(found)} sighting(s) of {what}:")
    for s in found:
        row = f"file row {s.file_row}" if s.file_row >= 0 else f"row {s.offset} of its chunk"
        pad = " (padding)" if s.padding else ""
        print(f"  step {s.step} rank {s.rank} epoch {s.epoch} position {s.position}: {s.file} {row}{pad}")
    return 0


def _summary(ledger: Ledger, ranks: list[int], as_json: bool) -> int:
    rows = []
    for rank in ranks:
        for p in ledger.passes(rank):
            r = p.record
            rows.append(
                {
                    "rank": rank,
                    "step": r.step,
                    "epoch": r.epoch,
                    "num_ranks": r.num_ranks,
                    "num_workers": r.num_workers,
                    "order": r.order,
                    "resumed": r.start is not None,
                    "batches": None if p.end is None else p.end.batches,
                    "skipped_runs": sum(len(v) for v in p.skips.values()),
                }
            )
    if as_json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        end = "running or stopped" if row["batches"] is None else f"{row['batches']} batches"
        resumed = ", resumed" if row["resumed"] else ""
        print(
            f"rank {row['rank']} step {row['step']}: epoch {row['epoch']}, {row['num_ranks']} ranks x "
            f"{row['num_workers']} workers, {row['order']} order{resumed}: {end}"
        )
    return 0


def delivered_table(batch: Any) -> pa.Table:
    """A delivered batch (tensors, arrays, lists or Arrow) as an Arrow table, values as they were."""
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if isinstance(batch, pa.Table):
        return batch
    if not isinstance(batch, dict):
        return pa.table({"value": [str(batch)]})
    return pa.table({str(k): _column(v) for k, v in batch.items()})


def _column(value: Any) -> Any:
    from torch_dataloader_utils.convert import FlatList, PaddedList

    if isinstance(value, (PaddedList, FlatList)):
        return pa.array([str(value)])
    if hasattr(value, "is_nested") and value.is_nested:
        offsets = value.offsets().numpy()
        values = value.values().numpy()
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), _column(values))
    if hasattr(value, "numpy"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        if value.ndim <= 1:
            return pa.array(value) if value.dtype != object else pa.array(value.tolist())
        flat = _column(value.reshape(value.shape[0] * value.shape[1], *value.shape[2:]))
        return pa.FixedSizeListArray.from_arrays(flat, value.shape[1])
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
    return pa.array(list(value))
