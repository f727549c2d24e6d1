"""Measure the three bugs of torch-dataloader-utils 0.2.0 named in docs/migrating-from-0.2.md.

Run it with the Python of a venv that has 0.2.0 installed, outside this repository's
venv (tests never need 0.2.0)::

    python3 -m venv /tmp/v020
    /tmp/v020/bin/pip install -c constraints.txt torch==2.13.0 torch-dataloader-utils==0.2.0 \
        "pyiceberg[sql-sqlite]"
    /tmp/v020/bin/python benchmarks/measure_020_bugs.py

and with this repository's venv for the same scenarios on this library (it accepts
0.2.0's calls): ``.venv/bin/python benchmarks/measure_020_bugs.py``. Only 0.2.0's
public API is called (``create_dataloader``, ``dataset.state_dict()`` /
``load_state_dict()``), on small local data; Iceberg tables live in a SQLite catalog
and their delete files are written with ``testsupport.iceberg_tables``.

Scenarios (each prints one JSON line, and a summary at the end):

* ``resume``: Parquet files read by 2 workers; after ``k`` batches the loop waits
  ``--settle`` seconds (workers fill their prefetch queues), saves
  ``dataset.state_dict()`` and stops; a new dataset loads the state and reads the rest
  of the epoch. Rows never delivered (lost) and delivered twice are counted.
* ``iceberg_deletes``: one data file of ``--rows`` rows in row groups of 100, a position
  delete file removing 10 of them, read with ``split_rows=200``.
* ``rename``: column ``x`` renamed to ``y`` after the first file was written, a new
  column ``x`` added, then a second file; rows whose ``x`` / ``y`` come back wrong.
* ``accelerate`` (with ``--accelerate``): the README's Accelerate example
  (``num_ranks=accelerator.num_processes``, ``rank=accelerator.process_index``, then
  ``accelerator.prepare(loader)``) under ``accelerate launch`` with 2 CPU processes
  (``Accelerator(cpu=True)``); rows the two processes received.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testsupport/

import torch_dataloader_utils as tdu

VERSION = getattr(tdu, "__version__", None) or __import__("importlib.metadata").metadata.version(
    "torch-dataloader-utils"
)


def _ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


def resume(
    root: Path, files: int, rows: int, batch: int, workers: int, steps: list[int], settle: float
) -> list[dict[str, Any]]:
    data = root / "resume"
    data.mkdir()
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), data / f"part-{f}.parquet", row_group_size=100)
    total = files * rows
    out = []
    for k in steps:
        loader, dataset = tdu.StructuredDataset.create_dataloader(
            str(data), "parquet", batch_size=batch, num_workers=workers
        )
        dataset.set_epoch(0)
        before: list[int] = []
        it = iter(loader)
        for _ in range(k):
            before.extend(int(i) for i in next(it)["id"])
        time.sleep(settle)  # the workers fill their prefetch queues, as during a training step
        state = dataset.state_dict()
        del it
        loader, dataset = tdu.StructuredDataset.create_dataloader(
            str(data), "parquet", batch_size=batch, num_workers=workers
        )
        dataset.load_state_dict(state)
        after = _ids(loader)
        seen = Counter(before + after)
        out.append(
            {
                "scenario": "resume",
                "rows": total,
                "batches_before_checkpoint": k,
                "rows_before": len(before),
                "rows_after_resume": len(after),
                "lost": total - len(seen),
                "delivered_twice": sum(1 for c in seen.values() if c > 1),
            }
        )
    return out


def _catalog(root: Path) -> tuple[dict[str, str], Any]:
    from testsupport.iceberg_tables import make_catalog, sql_catalog_config

    config = sql_catalog_config(root)
    return config, make_catalog(config, namespace="ns")


def iceberg_deletes(root: Path, rows: int, workers: int) -> dict[str, Any]:
    from testsupport.iceberg_tables import commit_deletes, data_files, position_delete_file

    config, catalog = _catalog(root / "deletes")
    ids = np.arange(rows, dtype=np.int64)
    arrow = pa.table({"id": ids, "x": ids * 0.5})
    table = catalog.create_table(
        "ns.t", schema=arrow.schema, properties={"write.parquet.row-group-limit": "100"}
    )
    table.append(arrow)
    (path,) = data_files(table)
    deleted = list(range(5, rows, rows // 10))[:10]
    table = commit_deletes(table, [position_delete_file(table, {path: deleted})])
    loader, _ = tdu.IcebergDataset.create_dataloader(
        "ns.t", catalog_config=config, split_rows=200, num_workers=workers, batch_size=100
    )
    got = Counter(_ids(loader))
    live = set(range(rows)) - set(deleted)
    return {
        "scenario": "iceberg_deletes",
        "live_rows": len(live),
        "rows_read": sum(got.values()),
        "distinct": len(got),
        "extra_copies": sum(got.values()) - len(got),
        "deleted_rows_returned": len(set(got) & set(deleted)),
        "live_rows_missing": len(live - set(got)),
    }


def rename(root: Path, rows: int) -> dict[str, Any]:
    from pyiceberg.types import LongType

    config, catalog = _catalog(root / "rename")
    first = np.arange(rows, dtype=np.int64)
    table = catalog.create_table("ns.r", schema=pa.table({"id": first, "x": first * 10}).schema)
    table.append(pa.table({"id": first, "x": first * 10}))
    with table.update_schema() as update:
        update.rename_column("x", "y")
    with table.update_schema() as update:
        update.add_column("x", LongType())
    second = np.arange(rows, 2 * rows, dtype=np.int64)
    new = pa.table({"id": second, "y": second * 10, "x": np.full(rows, -1, dtype=np.int64)})
    table.append(new.cast(table.schema().as_arrow()))
    try:
        loader, _ = tdu.IcebergDataset.create_dataloader(
            "ns.r", catalog_config=config, num_workers=0, output_format="dict", collate_fn=lambda b: b
        )
        batches = list(loader)
    except Exception as exc:
        return {"scenario": "rename", "rows": 2 * rows, "error": f"{type(exc).__name__}: {exc}"[:300]}
    wrong_y = wrong_x = 0
    columns: set[str] = set()
    for b in batches:
        columns |= set(b)
        n = len(b["id"])
        for i, x, y in zip(b["id"], b.get("x", [None] * n), b.get("y", [None] * n), strict=True):
            wrong_y += y != i * 10
            wrong_x += x != (None if i < rows else -1)
    return {
        "scenario": "rename",
        "rows": 2 * rows,
        "columns_returned": sorted(columns),
        "rows_with_wrong_y": wrong_y,
        "rows_with_wrong_x": wrong_x,
    }


def accelerate_child(data: str, out: str) -> None:
    """One process of the ``accelerate`` scenario: the README's Accelerate example."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    loader, _dataset = tdu.StructuredDataset.create_dataloader(
        path=data,
        format="parquet",
        num_workers=2,
        batch_size=100,
        num_ranks=accelerator.num_processes,
        rank=accelerator.process_index,
    )
    loader = accelerator.prepare(loader)
    ids = _ids(loader)
    with open(os.path.join(out, f"rank{accelerator.process_index}.json"), "w") as f:
        json.dump(ids, f)
    accelerator.wait_for_everyone()


def accelerate(root: Path, files: int, rows: int) -> dict[str, Any]:
    data, out = root / "acc-data", root / "acc-out"
    data.mkdir()
    out.mkdir()
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), data / f"part-{f}.parquet", row_group_size=100)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = str(Path(sys.executable).with_name("accelerate"))
    cmd = [
        launcher, "launch", "--multi_gpu", "--num_processes=2", "--num_machines=1", "--mixed_precision=no",
        "--dynamo_backend=no", "--main_process_ip=127.0.0.1", f"--main_process_port={port}",
        __file__, "--accelerate-child", str(data), str(out),
    ]  # fmt: skip
    env = {**os.environ, "HF_HOME": str(root / "hf"), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300
    )
    got = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    seen = Counter(got[0] + got[1])
    return {
        "scenario": "accelerate",
        "rows": files * rows,
        "rows_per_process": [len(g) for g in got],
        "distinct_rows_received": len(seen),
        "lost": files * rows - len(seen),
    }


def main() -> None:
    if sys.argv[1:2] == ["--accelerate-child"]:
        accelerate_child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rows", type=int, default=1000, help="rows per file")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", default="10,30,36,37,38,39", help="batches consumed before the checkpoint")
    parser.add_argument("--settle", type=float, default=0.5, help="seconds before state_dict()")
    parser.add_argument("--accelerate", action="store_true", help="also run the Accelerate scenario")
    args = parser.parse_args()
    print(json.dumps({"library": "torch-dataloader-utils", "version": VERSION, "python": sys.executable}))
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tdu-020-bugs-") as tmp:
        root = Path(tmp)
        steps = [int(s) for s in args.steps.split(",")]
        results += resume(root, args.files, args.rows, args.batch_size, args.workers, steps, args.settle)
        results.append(iceberg_deletes(root, args.rows, args.workers))
        results.append(rename(root, args.rows // 2))
        if args.accelerate:
            results.append(accelerate(root, args.files, args.rows))
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
