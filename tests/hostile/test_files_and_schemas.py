"""Hostile cases 2, 4, 6, 7 and the obscure errors of text files and schemas.

Each ends as the correct rows or a specific error naming the file or option and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils import (
    ConversionError,
    CorruptFileError,
    ReadError,
    RecordBoundaryError,
    SchemaError,
    SchemaMismatchError,
    create_dataloader,
)


def _ids(loader: object, column: str = "id") -> list[int]:
    out: list[int] = []
    for batch in loader:  # type: ignore[attr-defined]
        values = batch[column]
        out.extend(values.to_pylist() if isinstance(values, pa.Array) else values.tolist())
    return sorted(out)


def _across_ranks(path: Path, ranks: int, **options: object) -> list[int]:
    seen: list[int] = []
    for rank in range(ranks):
        loader, _ = create_dataloader(str(path), num_ranks=ranks, rank=rank, **options)  # type: ignore[arg-type]
        seen.extend(_ids(loader))
    return sorted(seen)


# -- case 2: CR-only line endings -------------------------------------------------------


@pytest.fixture
def cr_csv(tmp_path: Path) -> Path:
    path = tmp_path / "cr.csv"
    path.write_bytes(b"id,x\r" + b"".join(b"%d,%d.5\r" % (i, i) for i in range(200)))
    assert pcsv.read_csv(path).num_rows == 200  # what pyarrow reads
    return path


@pytest.mark.parametrize("count_rows", [None, True, False])
def test_case_2_csv_with_cr_only_line_endings(cr_csv: Path, count_rows: bool | None) -> None:
    loader, _ = create_dataloader(str(cr_csv), format="csv", num_workers=0, count_rows=count_rows)
    assert _ids(loader) == list(range(200))


@pytest.mark.parametrize("equal_batches", ["off", "pad"])
def test_case_2_csv_with_cr_only_line_endings_on_three_ranks(cr_csv: Path, equal_batches: str) -> None:
    seen = _across_ranks(
        cr_csv,
        3,
        format="csv",
        split_bytes=300,
        num_workers=2,
        batch_size=16,
        equal_batches=equal_batches,
        multiprocessing_context="fork",
    )
    if equal_batches == "pad":
        seen = sorted(set(seen))
    assert seen == list(range(200))


def test_case_2_jsonl_with_cr_only_line_endings(tmp_path: Path) -> None:
    path = tmp_path / "cr.jsonl"
    path.write_bytes(b"".join(json.dumps({"id": i}).encode() + b"\r" for i in range(120)))
    assert _across_ranks(
        path, 2, format="jsonl", split_bytes=200, num_workers=0, equal_batches="off"
    ) == list(range(120))


def test_case_2_crlf_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "crlf.csv"
    path.write_bytes(b"id\r\n" + b"".join(b"%d\r\n" % i for i in range(50)))
    assert _across_ranks(path, 2, format="csv", split_bytes=40, num_workers=0, count_rows=True) == list(
        range(50)
    )


# -- case 4: a path with glob characters that exists -------------------------------------


def test_case_4_existing_path_with_glob_characters_is_read_literally(tmp_path: Path) -> None:
    (tmp_path / "run[1]").mkdir()
    (tmp_path / "run1").mkdir()
    pq.write_table(pa.table({"id": np.arange(10)}), tmp_path / "run[1]" / "a.parquet")
    pq.write_table(pa.table({"id": np.arange(100, 107)}), tmp_path / "run1" / "a.parquet")
    loader, _ = create_dataloader(str(tmp_path / "run[1]"), num_workers=0)
    assert _ids(loader) == list(range(10))
    # a pattern that names nothing literally is still a pattern (its matches are literal)
    loader, _ = create_dataloader(str(tmp_path / "run*"), num_workers=0)
    assert _ids(loader) == [*range(10), *range(100, 107)]
    loader, _ = create_dataloader(str(tmp_path / "run[1]*"), num_workers=0)
    assert _ids(loader) == list(range(100, 107))
    # a matched file whose own name holds glob characters is kept
    pq.write_table(pa.table({"id": np.arange(200, 203)}), tmp_path / "run1" / "b[2].parquet")
    loader, _ = create_dataloader(str(tmp_path / "run1" / "*.parquet"), num_workers=0)
    assert _ids(loader) == [*range(100, 107), *range(200, 203)]


# -- case 6: a file with one extra column ----------------------------------------------


@pytest.mark.parametrize("extra_in", ["first", "last"])
def test_case_6_extra_column_is_an_error_whichever_file_has_it(tmp_path: Path, extra_in: str) -> None:
    plain = pa.table({"id": np.arange(5)})
    extra = plain.append_column("z", pa.array(np.arange(5)))
    pq.write_table(extra if extra_in == "first" else plain, tmp_path / "a.parquet")
    pq.write_table(plain if extra_in == "first" else extra, tmp_path / "b.parquet")
    with pytest.raises(SchemaMismatchError) as exc:
        create_dataloader(str(tmp_path), num_workers=0)
    text = str(exc.value)
    assert "'z'" in text
    assert "a.parquet" in text
    assert "b.parquet" in text
    assert "columns" in text
    # naming the shared columns reads every row, in either order
    loader, _ = create_dataloader(str(tmp_path), columns=["id"], num_workers=0)
    assert _ids(loader) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


# -- case 7: null_fill of the wrong type, invalid UTF-8 in JSONL -------------------------


@pytest.fixture
def int_nulls(tmp_path: Path) -> Path:
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"id": pa.array([1, None, 3]), "f": pa.array([0.5, None, 1.5])}), path)
    return path


@pytest.mark.parametrize("fill", [0.7, "x", {"id": 0.7}, {"id": True}, {"id": 2**70}])
def test_case_7_null_fill_that_does_not_fit_is_refused_at_construction(int_nulls: Path, fill: object) -> None:
    with pytest.raises(ConversionError) as exc:
        create_dataloader(str(int_nulls), num_workers=0, null_fill=fill)
    text = str(exc.value)
    assert "null_fill=" in text
    assert "'id'" in text
    assert "int64" in text


def test_case_7_null_fill_that_fits_fills(int_nulls: Path) -> None:
    loader, _ = create_dataloader(str(int_nulls), num_workers=0, null_fill=-1.0)
    (batch,) = list(loader)
    assert batch["id"].tolist() == [1, -1, 3]
    assert batch["f"].tolist() == [0.5, -1.0, 1.5]


@pytest.mark.parametrize("output_format", ["arrow", "torch", "dict"])
def test_case_7_jsonl_with_invalid_utf8(tmp_path: Path, output_format: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"s": "ok"}\n{"s": "caf\xe9"}\n')
    loader, _ = create_dataloader(str(path), format="jsonl", num_workers=0, output_format=output_format)
    with pytest.raises(ReadError) as exc:
        list(loader)
    text = str(exc.value)
    assert "bad.jsonl" in text
    assert "column 's' at byte 22" in text
    assert "UTF-8" in text
    assert "iconv" in text


def test_case_7_jsonl_raw_bytes_with_a_binary_schema(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"s": "ok"}\n{"s": "caf\xe9"}\n')
    schema = pa.schema([("s", pa.binary())])
    loader, _ = create_dataloader(
        str(path), format="jsonl", num_workers=0, schema=schema, output_format="dict"
    )
    assert [v for b in loader for v in b["s"]] == [b"ok", b"caf\xe9"]


# -- obscure errors ------------------------------------------------------------------------


def test_obscure_latin1_csv_header(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes("caf\xe9,b\n1,2\n".encode("latin-1"))
    with pytest.raises(
        CorruptFileError, match=r"CSV header of .*latin\.csv.* is not UTF-8 .*offset 3.*iconv"
    ):
        create_dataloader(str(path), format="csv", num_workers=0)


def test_obscure_latin1_csv_body_with_string_schema(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes("a,b\n1,caf\xe9\n".encode("latin-1"))
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    loader, _ = create_dataloader(str(path), format="csv", num_workers=0, schema=schema)
    with pytest.raises(ReadError, match=r"latin\.csv.* is not valid UTF-8.*iconv"):
        list(loader)


def test_obscure_duplicate_column_names_in_one_file(tmp_path: Path) -> None:
    path = tmp_path / "dup.parquet"
    pq.write_table(pa.table([pa.array([1]), pa.array([2]), pa.array([3])], names=["a", "a", "b"]), path)
    with pytest.raises(SchemaError, match=r"dup\.parquet.* more than one column named \['a'\].*unique"):
        create_dataloader(str(path), num_workers=0)
    loader, _ = create_dataloader(str(path), num_workers=0, columns=["b"])  # not needed: fine
    assert _ids(loader, "b") == [3]
    csv = tmp_path / "dup.csv"
    csv.write_text("a,a\n1,2\n")
    with pytest.raises(SchemaError, match=r"dup\.csv.* names the columns \['a'\] more than once"):
        create_dataloader(str(csv), format="csv", num_workers=0)


@pytest.mark.parametrize("not_null_first", [True, False])
@pytest.mark.parametrize("output_format", ["torch", "arrow"])
def test_obscure_files_differing_only_in_not_null_are_unified(
    tmp_path: Path, not_null_first: bool, output_format: str
) -> None:
    strict = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("v", pa.list_(pa.field("item", pa.float32(), nullable=False)), nullable=False),
        ]
    )
    loose = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.list_(pa.float32()))])
    first, second = (strict, loose) if not_null_first else (loose, strict)
    values = [[float(i)] for i in range(5)]
    pq.write_table(pa.table({"id": np.arange(5), "v": values}, schema=first), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": np.arange(5, 10), "v": values}, schema=second), tmp_path / "b.parquet")
    loader, dataset = create_dataloader(
        str(tmp_path), num_workers=0, batch_size=8, output_format=output_format
    )
    assert _ids(loader) == list(range(10))
    assert dataset.discovered.output_schema.field("id").nullable


def test_obscure_pretty_printed_jsonl_says_one_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "pretty.jsonl"
    path.write_text('{\n  "id": 1\n}\n{"id": 2}\n')
    loader, _ = create_dataloader(str(path), format="jsonl", num_workers=0)
    with pytest.raises(RecordBoundaryError) as exc:
        list(loader)
    text = str(exc.value)
    assert "pretty.jsonl" in text
    assert "one JSON object per line" in text
    assert "quoted_newlines" not in text  # JSONL rejects that option
