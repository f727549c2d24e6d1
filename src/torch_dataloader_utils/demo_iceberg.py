"""The Iceberg demo: a local SQLite-backed table with deletes, read as ranks x workers.

``python -m torch_dataloader_utils demo-iceberg`` builds a small table in a SQLite
``SqlCatalog`` under the demo directory (no server), commits position and equality
deletes, and reads it as 2 ranks x 2 DataLoader workers, checking that every live row
arrives exactly once.

pyiceberg 0.12 cannot write delete files through its public API, so
:func:`commit_deletes` writes Parquet delete files, describes them with
``DataFile.from_args`` and commits them in a DELETES manifest through pyiceberg's
fast-append snapshot producer. These are private pyiceberg APIs, which is why the
demo (and the tests that reuse these helpers) pin pyiceberg.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "commit_deletes",
    "equality_delete_file",
    "iceberg_demo",
    "make_demo_table",
    "position_delete_file",
]

POS_PATH_ID = 2147483546
"""Reserved field id of ``file_path`` in position delete files."""
POS_POS_ID = 2147483545
"""Reserved field id of ``pos`` in position delete files."""

DEMO_ROWS = (12_000, 8_000, 5_000)
DEMO_ROW_GROUP = 2_000


def _manifest_classes() -> tuple[Any, Any]:
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2
    from pyiceberg.table.update.snapshot import _FastAppendFiles

    class DeleteManifestWriter(ManifestWriterV2):  # type: ignore[misc]
        def content(self) -> Any:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    class AppendDeletes(_FastAppendFiles):  # type: ignore[misc]
        def new_manifest_writer(self, spec: Any) -> Any:
            return DeleteManifestWriter(
                spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression
            )

    return DeleteManifestWriter, AppendDeletes


def _write(table: Any, arrow: pa.Table) -> tuple[str, int]:
    path = f"{table.location()}/data/delete-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(path).create() as stream:
        pq.write_table(arrow, stream)
    return path, len(table.io.new_input(path))


def _empty_partition() -> Any:
    from pyiceberg.typedef import Record

    return Record()


def position_delete_file(table: Any, deletes: Mapping[str, Iterable[int]], partition: Any = None) -> Any:
    """Write a position delete file for ``{data_file_path: positions}``; return its ``DataFile``."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    paths: list[str] = []
    positions: list[int] = []
    for data_path in sorted(deletes):
        for pos in sorted({int(p) for p in deletes[data_path]}):
            paths.append(data_path)
            positions.append(pos)
    fields: list[pa.Field[Any]] = [
        pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": str(POS_PATH_ID)}),
        pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": str(POS_POS_ID)}),
    ]
    schema = pa.schema(fields)
    arrow = pa.table([pa.array(paths, pa.string()), pa.array(positions, pa.int64())], schema=schema)
    path, size = _write(table, arrow)
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition if partition is not None else _empty_partition(),
        record_count=len(positions),
        file_size_in_bytes=size,
        spec_id=table.spec().spec_id,
    )


def equality_delete_file(table: Any, rows: Mapping[str, Sequence[Any]], partition: Any = None) -> Any:
    """Write an equality delete file over the named columns (by the table's field ids)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    schema = table.schema()
    fields, arrays, ids = [], [], []
    for name, values in rows.items():
        nested = schema.find_field(name)
        arrow_type = schema_to_pyarrow(schema.select(name)).field(0).type
        fields.append(pa.field(name, arrow_type, metadata={b"PARQUET:field_id": str(nested.field_id)}))
        arrays.append(pa.array(list(values), arrow_type))
        ids.append(nested.field_id)
    path, size = _write(table, pa.table(arrays, schema=pa.schema(fields)))
    return DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition if partition is not None else _empty_partition(),
        record_count=len(arrays[0]),
        file_size_in_bytes=size,
        equality_ids=ids,
        spec_id=table.spec().spec_id,
    )


def commit_deletes(table: Any, delete_files: Sequence[Any]) -> Any:
    """Commit ``delete_files`` as one DELETE snapshot (a DELETES manifest); return the refreshed table."""
    from pyiceberg.table.snapshots import Operation

    _, append_deletes = _manifest_classes()
    with table.transaction() as tx:
        producer = append_deletes(operation=Operation.DELETE, transaction=tx, io=table.io)
        for f in delete_files:
            producer.append_data_file(f)
        producer.commit()
    return table.refresh()


def _rows(start: int, n: int, rng: np.random.Generator) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "f0": rng.standard_normal(n).astype(np.float32),
            "f1": rng.standard_normal(n).astype(np.float32),
            "label": rng.integers(0, 10, n),
        }
    )


def make_demo_table(root: Path) -> tuple[dict[str, str], str, set[int]]:
    """Build the demo table afresh under ``root``: (catalog_config, table name, live ids).

    Three appends; 5 % of the first file's rows position-deleted; an equality delete of
    every id divisible by 97, committed before the third append (whose rows it spares,
    by sequence number).
    """
    from pyiceberg.catalog.sql import SqlCatalog

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    config = {
        "type": "sql",
        "uri": f"sqlite:///{root / 'catalog.db'}",
        "warehouse": f"file://{root.resolve() / 'warehouse'}",
    }
    catalog = SqlCatalog("default", **{k: v for k, v in config.items() if k != "type"})
    catalog.create_namespace("demo")
    rng = np.random.default_rng(0)
    schema = _rows(0, 1, rng).schema
    table = catalog.create_table(
        "demo.events", schema=schema, properties={"write.parquet.row-group-limit": str(DEMO_ROW_GROUP)}
    )
    live: set[int] = set()
    start = 0
    first_path = ""
    for i, n in enumerate(DEMO_ROWS):
        if i == 2:
            doomed = [x for x in range(start) if x % 97 == 0]
            table = commit_deletes(table, [equality_delete_file(table, {"id": doomed})])
            live -= set(doomed)
        table.append(_rows(start, n, rng))
        if i == 0:
            first_path = table.inspect.files().column("file_path")[0].as_py()
        live |= set(range(start, start + n))
        start += n
    positions = rng.choice(DEMO_ROWS[0], DEMO_ROWS[0] // 20, replace=False)
    table = commit_deletes(table, [position_delete_file(table, {first_path: positions.tolist()})])
    live -= {int(p) for p in positions}  # the first file holds ids 0.. at positions 0..
    return config, "demo.events", live


def iceberg_demo(data_dir: str | Path = "demo_data", num_ranks: int = 2, num_workers: int = 2) -> int:
    """Build the demo table and read it as ``num_ranks`` x ``num_workers``; 0 when every row arrived once."""
    from torch_dataloader_utils.runtime.iceberg import IcebergDataset

    config, name, live = make_demo_table(Path(data_dir) / "iceberg")
    total = sum(DEMO_ROWS)
    print(f"iceberg table {name} in {config['uri']}: {total} rows written, {len(live)} live after deletes")
    print(f"reading as {num_ranks} ranks x {num_workers} workers, split_rows=1000")
    print("  rank  rows     batches  seconds")
    seen: list[np.ndarray[Any, Any]] = []
    counts = set()
    dropped = 0
    for rank in range(num_ranks):
        t0 = time.perf_counter()
        loader, dataset = IcebergDataset.create_dataloader(
            name,
            catalog_config=config,
            num_ranks=num_ranks,
            rank=rank,
            num_workers=num_workers,
            batch_size=1000,
            split_rows=1000,
            shuffle=True,
            shuffle_seed=7,
            timeout=120,
        )
        rows = batches = 0
        for batch in loader:
            seen.append(batch["id"].numpy().copy())
            rows += len(batch["id"])
            batches += 1
        counts.add(batches)
        # Equal batches (the default) leave fewer than num_ranks rows out of the epoch.
        dropped = sum(c.num_rows or 0 for c in dataset.plan().dropped)
        print(f"  {rank:<5d} {rows:<8d} {batches:<8d} {time.perf_counter() - t0:.2f}")
    ids = np.concatenate(seen) if seen else np.empty(0, dtype=np.int64)
    got = set(ids.tolist())
    repeated = len(ids) - len(got)
    if repeated == 0 and got <= live and len(got) + dropped == len(live) and len(counts) == 1:
        print(
            f"  OK: {len(got)} of {len(live)} live rows arrived exactly once, deleted rows never, "
            f"{dropped} left out of this epoch to even the ranks; every rank yielded {counts.pop()} batches"
        )
        return 0
    missing = len(live - got) - dropped
    print(
        f"  FAIL: {len(ids)} rows read, {missing} missing, {repeated} repeated, {len(got - live)} deleted, "
        f"batches per rank {sorted(counts)}"
    )
    return 1
