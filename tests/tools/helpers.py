"""Sources in every format and readers of a reshard output that do not trust the code under test."""

from __future__ import annotations

import json
import multiprocessing
import os
import traceback
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.orc as orc
import pyarrow.parquet as pq

FORMATS = ("parquet", "orc", "csv", "jsonl")


def id_rows(start: int, n: int) -> pa.Table:
    """Rows with a unique ``id``, a ``label`` (id % 5), a float and a string of varying length."""
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "label": ids % 5,
            "x": ids * 0.25,
            "s": pa.array([f"r{i}-" + "z" * (i % 13) for i in ids], pa.string()),
        }
    )


def write_source(root: Path, fmt: str, rows_per_file: Sequence[int], *, row_group_rows: int = 100) -> int:
    """One file per entry of ``rows_per_file`` in ``fmt`` under ``root``; ids are 0..total-1."""
    root.mkdir(parents=True, exist_ok=True)
    start = 0
    for i, n in enumerate(rows_per_file):
        table = id_rows(start, n)
        path = root / f"part-{i:04d}.{fmt}"
        if fmt == "parquet":
            pq.write_table(table, path, row_group_size=max(1, row_group_rows))
        elif fmt == "orc":
            orc.write_table(table, path, stripe_size=4096)
        elif fmt == "csv":
            pcsv.write_csv(table, path)
        else:
            with open(path, "w") as f:
                for row in table.to_pylist():
                    f.write(json.dumps(row) + "\n")
        start += n
    return start


def manifest_doc(dst: Path) -> dict[str, Any]:
    return json.loads((dst / "_manifest.json").read_text())


def read_output(dst: Path) -> pa.Table:
    """Every row of every shard named in the manifest, read with plain pyarrow."""
    doc = manifest_doc(dst)
    tables = []
    for shard in doc["shards"]:
        table = pq.read_table(dst / shard["path"])
        assert table.num_rows == shard["rows"]
        assert (dst / shard["path"]).stat().st_size == shard["bytes"]
        for name, value in zip(doc["partition_by"], shard.get("partition", []), strict=True):
            table = table.append_column(name, pa.array([value] * table.num_rows))
        tables.append(table)
    return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})


def visible_shards(dst: Path) -> list[Path]:
    """Data files a listing would show (names starting with '.' or '_' are hidden)."""
    return sorted(
        p
        for p in dst.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(dst).parts)
    )


def _rank_main(init: str, rank: int, world: int, kwargs: dict[str, Any], out: str) -> None:
    code = 1
    try:
        import torch.distributed as dist

        from torch_dataloader_utils import reshard

        dist.init_process_group(
            "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60)
        )
        try:
            report = reshard(**kwargs)
            Path(out).write_text(json.dumps({"written": report.shards_written, "rows": report.num_rows}))
            code = 0
        finally:
            dist.destroy_process_group()
    except BaseException:
        Path(out).write_text(json.dumps({"error": traceback.format_exc()}))
    finally:
        os._exit(code)


def run_ranks(world: int, tmp: Path, **kwargs: Any) -> list[dict[str, Any]]:
    """``reshard(**kwargs)`` on ``world`` forked processes joined in a gloo group (a short timeout)."""
    context = multiprocessing.get_context("fork")
    init = f"file://{tmp}/pg-{uuid.uuid4().hex}"
    outs = [str(tmp / f"rank-{uuid.uuid4().hex}.json") for _ in range(world)]
    procs = [context.Process(target=_rank_main, args=(init, r, world, kwargs, outs[r])) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.exitcode is None:
            p.kill()
    results = [json.loads(Path(o).read_text()) if Path(o).exists() else {"error": "no result"} for o in outs]
    for r in results:
        assert "error" not in r, r["error"]
    return results
