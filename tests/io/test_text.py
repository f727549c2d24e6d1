"""Byte-range reading of CSV and JSONL: every record exactly once, whatever the cut."""

from __future__ import annotations

import bz2
import gzip
import io
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies_text import TextCase, TypedCase, text_files, typed_text_files
from torch_dataloader_utils import (
    InferredSchemaError,
    ReadError,
    RecordBoundaryError,
    StructuredDataset,
    create_dataloader,
)
from torch_dataloader_utils.config import PADDING_COLUMN
from torch_dataloader_utils.discovery import text as discovery_text
from torch_dataloader_utils.plan.types import ChunkUnit


def read_plan(ds: StructuredDataset, num_workers: int) -> tuple[list[int], dict[tuple[int, int], int]]:
    """Every id read by every (rank, worker) of the plan, and rows read per worker."""
    plan = ds.plan(0, num_workers=num_workers)
    ids: list[int] = []
    per_worker: dict[tuple[int, int], int] = {}
    for rank in range(plan.num_ranks):
        for worker in range(plan.num_workers):
            n = 0
            for chunk in plan.chunks_for(rank, worker):
                got = [i for b in ds._reader.read(chunk) for i in b.column("id").to_pylist()]
                if chunk.num_rows is not None:
                    assert chunk.num_rows == len(got), chunk
                ids += got
                n += len(got)
            per_worker[(rank, worker)] = n
    return ids, per_worker


def oracle(path: Path, fmt: str) -> dict[int, str]:
    data = path.read_bytes()
    if fmt == "csv":
        table = pcsv.read_csv(
            io.BytesIO(data), convert_options=pcsv.ConvertOptions(column_types={"s": pa.string()})
        )
    else:
        table = pjson.read_json(io.BytesIO(data))
    return dict(zip(table.column("id").to_pylist(), table.column("s").to_pylist(), strict=True))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@settings(max_examples=50)
@given(data=st.data())
def test_every_record_exactly_once(tmp_path: Path, fmt: str, data: st.DataObject) -> None:
    case: TextCase = data.draw(text_files(fmt))
    path = tmp_path / f"f.{fmt}"
    path.write_bytes(case.data)
    split = data.draw(st.integers(1, max(1, len(case.data) + 5)))
    num_ranks = data.draw(st.integers(1, 3))
    workers = data.draw(st.integers(1, 3))
    count = data.draw(st.booleans())
    ds = StructuredDataset(
        str(path),
        format=fmt,
        split_bytes=split,
        num_ranks=num_ranks,
        rank=0,
        count_rows=count,
        output_format="arrow",
        equal_batches="off",  # byte-range exactness; equal batches over text: test_text_equal_batches
    )
    ids, per_worker = read_plan(ds, workers)
    assert sorted(ids) == sorted(case.records)  # each exactly once
    if case.records:  # pyarrow itself cannot read a header-only file without a newline
        assert oracle(path, fmt) == case.records
    rows = {}
    plan = ds.plan(0, num_workers=workers)
    for chunk in plan.all_chunks():
        assert chunk.unit is ChunkUnit.BYTES
        for b in ds._reader.read(chunk):
            rows.update(zip(b.column("id").to_pylist(), b.column("s").to_pylist(), strict=True))
    assert rows == case.records
    if count:
        for (rank, worker), n in per_worker.items():
            assert plan.rows_for(rank, worker) == n


def write_csv_with_quoted_newline(path: Path, rows: int = 400) -> None:
    lines = ["id,s"]
    for i in range(rows):
        lines.append(f'{i},"line one\nline two {i}"' if i % 50 == 7 else f"{i},plain {i}")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("count_rows", [False, True])
@pytest.mark.parametrize("on_bad_data", ["raise", "skip"])
def test_quoted_newlines_undeclared_is_refused(tmp_path: Path, count_rows: bool, on_bad_data: str) -> None:
    """Never skipped as bad lines (issue 33, item 10): the other lines of the record would be made-up rows."""
    path = tmp_path / "q.csv"
    write_csv_with_quoted_newline(path)
    ds = StructuredDataset(
        str(path),
        format="csv",
        split_bytes=500,
        count_rows=count_rows,
        output_format="arrow",
        on_bad_data=on_bad_data,
    )
    chunks = ds.plan(0).all_chunks()
    with pytest.raises(RecordBoundaryError, match="quoted_newlines=True") as info:
        [b for chunk in chunks for b in ds._reader.read(chunk)]
    assert str(path) in str(info.value)


def test_quoted_newline_inside_one_piece_is_a_record_boundary_error(tmp_path: Path) -> None:
    path = tmp_path / "q.csv"
    write_csv_with_quoted_newline(path)
    ds = StructuredDataset(str(path), format="csv", output_format="arrow")  # one chunk
    with pytest.raises(RecordBoundaryError, match=r"bytes \[5, \d+\).*quoted_newlines=True"):
        list(ds)


@pytest.mark.parametrize("count_rows", [False, True])
def test_quoted_newlines_declared_reads_whole_file(tmp_path: Path, count_rows: bool) -> None:
    path = tmp_path / "q.csv"
    write_csv_with_quoted_newline(path)
    ds = StructuredDataset(
        str(path),
        format="csv",
        split_bytes=500,
        quoted_newlines=True,
        count_rows=count_rows,
        output_format="arrow",
    )
    chunks = ds.plan(0).all_chunks()
    assert len(chunks) == 1
    assert chunks[0].num_rows == (400 if count_rows else None)
    table = pa.Table.from_batches(list(ds))
    assert table.column("id").to_pylist() == list(range(400))
    assert table.column("s")[7].as_py() == "line one\nline two 7"


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [(".gz", gzip.compress), (".bz2", bz2.compress), (".zst", None)],
)
def test_compressed_files_are_whole_chunks(tmp_path: Path, suffix: str, compress: object) -> None:
    raw = "id,s\n" + "".join(f"{i},x{i}\n" for i in range(3000))
    path = tmp_path / f"c.csv{suffix}"
    if compress is None:
        with pa.CompressedOutputStream(str(path), "zstd") as out:
            out.write(raw.encode())
    else:
        path.write_bytes(compress(raw.encode()))  # type: ignore[operator]
    (tmp_path / "plain.csv").write_text("id,s\n" + "".join(f"{i},y{i}\n" for i in range(3000, 3100)))
    ds = StructuredDataset(
        str(tmp_path), format="csv", split_bytes=100, count_rows=True, output_format="arrow"
    )
    chunks = ds.plan(0).all_chunks()
    compressed = [c for c in chunks if c.path.endswith(suffix)]
    assert len(compressed) == 1
    assert (compressed[0].start, compressed[0].stop, compressed[0].num_rows) == (0, path.stat().st_size, 3000)
    ids, _ = read_plan(ds, 2)
    assert sorted(ids) == list(range(3100))


def test_header_applied_and_columns_selected(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text("a,id,b\n" + "".join(f"{i * 2},{i},b{i}\n" for i in range(500)))
    ds = StructuredDataset(
        str(path), format="csv", split_bytes=64, columns=["b", "id"], output_format="arrow"
    )
    batches = [b for c in ds.plan(0).all_chunks() for b in ds._reader.read(c)]
    table = pa.Table.from_batches(batches).sort_by("id")
    assert table.schema.names == ["b", "id"]
    assert table.column("b").to_pylist() == [f"b{i}" for i in range(500)]


def test_types_consistent_across_chunks(tmp_path: Path) -> None:
    # Late rows alone would be inferred as int64; the file-level schema says double.
    path = tmp_path / "t.csv"
    path.write_text("id,v\n0,0.5\n" + "".join(f"{i},{i}\n" for i in range(1, 2000)))
    ds = StructuredDataset(str(path), format="csv", split_bytes=100, output_format="arrow")
    types = {b.schema.field("v").type for c in ds.plan(0).all_chunks() for b in ds._reader.read(c)}
    assert types == {pa.float64()}


def test_user_schema(tmp_path: Path) -> None:
    path = tmp_path / "u.jsonl"
    path.write_text("".join(f'{{"id": {i}, "v": {i}, "extra": 1}}\n' for i in range(300)))
    schema = pa.schema([("id", pa.int32()), ("v", pa.float32())])
    ds = StructuredDataset(str(path), format="jsonl", schema=schema, split_bytes=200, output_format="arrow")
    assert ds.discovered.output_schema == schema
    batches = [b for c in ds.plan(0).all_chunks() for b in ds._reader.read(c)]
    assert sorted(i for b in batches for i in b.column("id").to_pylist()) == list(range(300))
    assert {b.schema for b in batches} == {schema}


def test_late_type_change_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "late.csv"
    with open(path, "w") as f:
        f.write("id,v\n")
        f.writelines(f"{i},{i}\n" for i in range(200_000))  # > the 1 MiB inference sample
        f.write("200000,not-a-number\n")
    ds = StructuredDataset(str(path), format="csv", output_format="arrow")
    with pytest.raises(ReadError, match="pass schema="):
        list(ds)
    ds = StructuredDataset(
        str(path),
        format="csv",
        schema=pa.schema([("id", pa.int64()), ("v", pa.string())]),
        output_format="arrow",
    )
    assert sum(b.num_rows for b in ds) == 200_001


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("policy", ["drop", "pad"])
@settings(max_examples=30)
@given(data=st.data())
def test_equal_batches_over_byte_ranges(tmp_path: Path, fmt: str, policy: str, data: st.DataObject) -> None:
    """Byte ranges cut at a record (record windows): equal rows per rank, every record once."""
    case: TextCase = data.draw(text_files(fmt))
    path = tmp_path / f"f.{fmt}"
    path.write_bytes(case.data)
    split = data.draw(st.integers(1, max(1, len(case.data) + 5)))
    num_ranks = data.draw(st.integers(2, 4))
    workers = data.draw(st.integers(1, 3))
    ds = StructuredDataset(
        str(path), format=fmt, split_bytes=split, num_ranks=num_ranks, rank=0,
        output_format="arrow", equal_batches=policy, shuffle=data.draw(st.booleans()),
    )  # fmt: skip
    plan = ds.plan(0, num_workers=workers)
    real: list[int] = []
    per_rank = []
    for rank in range(num_ranks):
        n = 0
        for worker in range(workers):
            for chunk in plan.chunks_for(rank, worker):
                got = [i for b in ds._reader.read(chunk) for i in b.column("id").to_pylist()]
                assert chunk.num_rows == len(got), chunk
                n += len(got)
                if not chunk.padding:
                    real += got
        per_rank.append(n)
    assert len(set(per_rank)) == 1, per_rank  # every rank gets the same number of rows
    assert len(real) == len(set(real))
    total = len(case.records)
    if policy == "drop":
        assert set(real) <= set(case.records)
        assert total - len(real) == total % num_ranks
    else:
        assert sorted(real) == sorted(case.records)


def _data_ids(path: Path, fmt: str, **options: object) -> list[int]:
    """Every id the loader delivers as data (rows flagged as padding left out)."""
    loader, _ = create_dataloader(
        str(path), format=fmt, num_workers=0, output_format="arrow", equal_batches="off", **options
    )
    ids: list[int] = []
    for batch in loader:
        pad = batch.column(PADDING_COLUMN).to_pylist() if PADDING_COLUMN in batch.schema.names else None
        ids += [i for k, i in enumerate(batch.column("id").to_pylist()) if pad is None or not pad[k]]
    return ids


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@settings(max_examples=40)
@given(data=st.data())
def test_inferred_types_never_drop_valid_rows(tmp_path: Path, fmt: str, data: st.DataObject) -> None:
    """Issue 33, items 8 and 9: with ``on_bad_data='skip'`` and types inferred from each file's head,
    every line that is data under some type arrives exactly once, or the job raises
    :class:`InferredSchemaError` (a decimal after a head of integers); bad lines in the head do
    not stop inference. Never fewer rows with no error.
    """
    case: TypedCase = data.draw(typed_text_files(fmt))
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / f"f.{fmt}"
    path.write_bytes(case.data)
    options = {"split_bytes": data.draw(st.integers(8, 600)), "on_bad_data": "skip"}
    error: InferredSchemaError | None = None
    with pytest.MonkeyPatch.context() as patch:  # a small head, so that later lines exist
        patch.setattr(discovery_text, "SAMPLE_BYTES", data.draw(st.integers(16, 400)))
        try:
            ids = _data_ids(path, fmt, **options)
        except InferredSchemaError as exc:
            error = exc
    if error is None:
        assert sorted(ids) == sorted(case.good)
    else:
        assert case.decimals, error
        assert "column 'x' from int64 to double" in str(error)
        assert "schema=pyarrow.schema([('id', 'int64'), ('x', 'double')])" in str(error)
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    assert sorted(_data_ids(path, fmt, schema=schema, **options)) == sorted(case.good)
