"""One contract, every reader: Parquet, ORC, CSV, JSONL and Iceberg behind ``ChunkReader``.

As a contract test reused for every implementation (the way torchdata checks every node
with one save/load routine), each format's reader is built the way a dataset builds it
and must:

* be a :class:`ChunkReader` with every capability declared (none probed);
* read every chunk of the plan into exactly the dataset's rows (an ``id`` once each), in
  the dataset's schema;
* read a chunk cut at a row (equal batches, resume) as exactly its two halves;
* read the same rows with its capabilities used (``schedule``, ``use_threads(False)``,
  ``with_read_rows``), after a pickle round trip (as in a DataLoader worker), and count
  its I/O monotonically (``io_totals``, when it counts).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.orc as orc
import pytest

from tests.fixtures.data import write_parquet_files
from tests.fixtures.iceberg import create_id_table, id_table, make_catalog, sql_catalog_config
from torch_dataloader_utils import IcebergDataset, StructuredDataset
from torch_dataloader_utils.io.base import ChunkReader
from torch_dataloader_utils.plan.pieces import cut_chunk
from torch_dataloader_utils.plan.types import Chunk

ROWS = [120, 75, 90]
TOTAL = sum(ROWS)


def _rows(n: int, start: int) -> list[dict[str, Any]]:
    return [{"id": i, "x": i * 0.5, "label": i % 7} for i in range(start, start + n)]


def _parquet(root: Path) -> StructuredDataset:
    write_parquet_files(root, ROWS, row_group_size=25, with_strings=False)
    return StructuredDataset(str(root), split_rows=40)


def _orc(root: Path) -> StructuredDataset:
    root.mkdir(parents=True)
    start = 0
    for i, n in enumerate(ROWS):
        orc.write_table(pa.Table.from_pylist(_rows(n, start)), root / f"part-{i}.orc", stripe_size=1024)
        start += n
    return StructuredDataset(str(root), format="orc")


def _text(root: Path, fmt: str) -> StructuredDataset:
    root.mkdir(parents=True)
    start = 0
    for i, n in enumerate(ROWS):
        rows = _rows(n, start)
        if fmt == "csv":
            text = "id,x,label\n" + "".join(f"{r['id']},{r['x']},{r['label']}\n" for r in rows)
        else:
            text = "".join(json.dumps(r) + "\n" for r in rows)
        (root / f"part-{i}.{fmt}").write_text(text)
        start += n
    return StructuredDataset(str(root), format=fmt, split_bytes=700, count_rows=True)


def _iceberg(root: Path) -> IcebergDataset:
    config = sql_catalog_config(root)
    table = create_id_table(make_catalog(config), row_group_limit=25)
    start = 0
    for n in ROWS:
        table.append(id_table(start, n))
        start += n
    return IcebergDataset("ns.t", catalog_config=config)


READERS: dict[str, Callable[[Path], Any]] = {
    "parquet": _parquet,
    "orc": _orc,
    "csv": lambda root: _text(root, "csv"),
    "jsonl": lambda root: _text(root, "jsonl"),
    "iceberg": _iceberg,
}


@pytest.fixture(params=sorted(READERS), scope="module")
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return READERS[request.param](tmp_path_factory.mktemp(request.param) / "data")


def _ids(reader: ChunkReader, chunks: list[Chunk], schema: pa.Schema) -> list[int]:
    out: list[int] = []
    for chunk in chunks:
        for batch in reader.read(chunk):
            assert batch.schema.equals(schema), (batch.schema, schema)
            out += batch.column("id").to_pylist()
    return out


def test_reader_contract(built: Any) -> None:
    reader, schema = built.reader, built.schema
    chunks = list(built.rank_plan(0, num_workers=1).chunks_for(0))
    assert isinstance(reader, ChunkReader)
    assert len(chunks) > 1
    assert sorted(_ids(reader, chunks, schema)) == list(range(TOTAL))  # every row once

    # Cut at a row: the two halves hold exactly the chunk's rows, in order.
    files = built.file_table
    chunk = max(chunks, key=lambda c: c.num_rows or 0)
    whole = _ids(reader, [chunk], schema)
    head, tail = cut_chunk(chunk, files[chunk.path], len(whole) // 2)
    assert _ids(reader, [head], schema) + _ids(reader, [tail], schema) == whole

    # Capabilities used, and in another process's copy: the same rows.
    before = reader.io_totals()
    reader.schedule(chunks)
    reader.use_threads(False)
    assert _ids(reader.with_read_rows(16), chunks, schema) == _ids(reader, chunks, schema)
    after = reader.io_totals()
    assert (before is None) == (after is None)
    if before is not None and after is not None:
        assert len(after) == 5
        assert all(a >= b for a, b in zip(after, before, strict=True))
    assert isinstance(reader.fetches_ahead, bool)
    copy = pickle.loads(pickle.dumps(reader))
    assert _ids(copy, chunks, schema) == _ids(reader, chunks, schema)
