"""Text discovery: options validation, header and schema errors, the record-count cache."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pytest

from torch_dataloader_utils import (
    ConfigError,
    CorruptFileError,
    IncompatibleOptionsError,
    SchemaMismatchError,
    StructuredDataset,
    create_dataloader,
)
from torch_dataloader_utils.discovery import text as text_discovery


@pytest.fixture
def csv_file(tmp_path: Path) -> Path:
    path = tmp_path / "a.csv"
    path.write_text("id,s\n" + "".join(f"{i},s{i}\n" for i in range(1000)))
    return path


@pytest.fixture
def parquet_file(write_parquet):  # type: ignore[no-untyped-def]
    return write_parquet([10])[0]


@pytest.mark.parametrize(
    ("fmt", "kwargs", "error", "match"),
    [
        (
            "csv",
            {"schema": {"id": "int64"}},
            ConfigError,
            r"schema=\{'id': 'int64'\} must be a py",
        ),
        ("csv", {"quoted_newlines": "yes"}, ConfigError, r"quoted_newlines='yes' must be True or False"),
        ("csv", {"count_rows": 1}, ConfigError, r"count_rows=1 must be True or False"),
        ("csv", {"count_cache_dir": 5, "count_rows": True}, ConfigError, r"count_cache_dir=5 must be"),
        (
            "csv",
            {"count_cache_dir": "/tmp/x", "count_rows": False},
            IncompatibleOptionsError,
            r"count_cache_dir='/tmp/x'.*count_rows=True",
        ),
        (
            "jsonl",
            {"quoted_newlines": True},
            IncompatibleOptionsError,
            r"quoted_newlines=True applies to format='csv'",
        ),
        ("csv", {"split_rows": 10}, IncompatibleOptionsError, r"split_rows=10 cannot size byte ranges"),
        (
            "csv",
            {"split_strategy": "row_group"},
            IncompatibleOptionsError,
            r"'row_group' needs format=",
        ),
        ("csv", {"split_bytes": 0}, ConfigError, r"split_bytes=0"),
    ],
)
def test_bad_text_options(
    csv_file: Path, fmt: str, kwargs: dict[str, object], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        create_dataloader(str(csv_file), format=fmt, **kwargs)  # type: ignore[arg-type]


def test_text_options_on_parquet(parquet_file: Path) -> None:
    with pytest.raises(IncompatibleOptionsError, match=r"schema= applies to format='csv' or 'jsonl'"):
        StructuredDataset(str(parquet_file), schema=pa.schema([("id", pa.int64())]))
    with pytest.raises(IncompatibleOptionsError, match=r"split_strategy='byte_range' needs format='csv'"):
        StructuredDataset(str(parquet_file), split_strategy="byte_range")


def test_empty_csv_has_no_header(tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_bytes(b"")
    with pytest.raises(CorruptFileError, match=r"e\.csv' has no header line"):
        StructuredDataset(str(tmp_path / "e.csv"), format="csv")


def test_jsonl_without_records_needs_schema(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_bytes(b"\n\n")
    with pytest.raises(CorruptFileError, match=r"pass schema="):
        StructuredDataset(str(tmp_path / "e.jsonl"), format="jsonl")
    ds = StructuredDataset(str(tmp_path / "e.jsonl"), format="jsonl", schema=pa.schema([("id", pa.int64())]))
    assert list(ds) == []


def test_missing_column_in_a_header(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("id,s\n1,x\n")
    (tmp_path / "b.csv").write_text("id,t\n2,y\n")
    with pytest.raises(SchemaMismatchError, match=r"\['s'\] are not in the CSV header of .*b\.csv"):
        StructuredDataset(
            str(tmp_path), format="csv", schema=pa.schema([("id", pa.int64()), ("s", pa.string())])
        )


def test_types_unified_across_files(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 1, "v": 1}\n')
    (tmp_path / "b.jsonl").write_text('{"id": 2, "v": 2.5}\n')
    ds = StructuredDataset(str(tmp_path), format="jsonl", output_format="arrow")
    assert ds.discovered.schema.field("v").type == pa.float64()
    assert sorted(v for b in ds for v in b["v"].to_pylist()) == [1.0, 2.5]
    (tmp_path / "c.jsonl").write_text('{"id": 3, "v": "text"}\n')
    with pytest.raises(SchemaMismatchError, match=r"c\.jsonl.*pass schema="):
        StructuredDataset(str(tmp_path), format="jsonl")


def test_unknown_column_and_filter(csv_file: Path) -> None:
    import pyarrow.compute as pc

    from torch_dataloader_utils import UnknownColumnError

    with pytest.raises(UnknownColumnError, match="nope"):
        StructuredDataset(str(csv_file), format="csv", columns=["nope"])
    ds = StructuredDataset(
        str(csv_file), format="csv", columns=["s"], filters=pc.field("id") >= 990, output_format="arrow"
    )
    assert [v for b in ds for v in b["s"].to_pylist()] == [f"s{i}" for i in range(990, 1000)]


def test_hive_partitions_on_jsonl(tmp_path: Path) -> None:
    for day in (1, 2):
        d = tmp_path / f"day={day}"
        d.mkdir()
        (d / "f.jsonl").write_text("".join(f'{{"id": {day * 100 + i}}}\n' for i in range(50)))
    ds = StructuredDataset(
        str(tmp_path), format="jsonl", partitioning="hive", split_bytes=100, output_format="arrow"
    )
    table = pa.Table.from_batches([b for c in ds.plan(0).all_chunks() for b in ds._reader.read(c)])
    assert sorted(zip(table["id"].to_pylist(), table["day"].to_pylist(), strict=True)) == [
        (d * 100 + i, d) for d in (1, 2) for i in range(50)
    ]


def test_counts_cached_per_path_size_mtime(tmp_path: Path, csv_file: Path) -> None:
    text_discovery.clear_count_cache()
    cache = tmp_path / "cache"
    ds = StructuredDataset(
        str(csv_file), format="csv", count_rows=True, count_cache_dir=str(cache), split_bytes=1000
    )
    assert sum(c.num_rows or 0 for c in ds.plan(0).all_chunks()) == 1000
    stored = list(cache.glob("counts-*.json"))
    assert len(stored) == 1
    # The on-disk entry is used when the process cache is empty: tamper with it to prove it.
    entry = json.loads(stored[0].read_text())
    entry["counts"] = [c + 1 for c in entry["counts"]]
    stored[0].write_text(json.dumps(entry))
    text_discovery.clear_count_cache()
    ds = StructuredDataset(
        str(csv_file), format="csv", count_rows=True, count_cache_dir=str(cache), split_bytes=1000
    )
    tampered = sum(c.num_rows or 0 for c in ds.plan(0).all_chunks())
    assert tampered == 1000 + len(entry["counts"])
    # A rewritten file (new size and mtime) is counted again.
    csv_file.write_text("id,s\n" + "".join(f"{i},s{i}\n" for i in range(1500)))
    os.utime(csv_file, (1_000_000, 1_000_000))
    ds = StructuredDataset(
        str(csv_file), format="csv", count_rows=True, count_cache_dir=str(cache), split_bytes=1000
    )
    assert sum(c.num_rows or 0 for c in ds.plan(0).all_chunks()) == 1500


def test_counts_need_no_parse(tmp_path: Path) -> None:
    # The count pass counts lines: a quoted newline makes the count differ from the parse,
    # and the reader refuses the chunk instead of yielding a wrong number of rows.
    path = tmp_path / "q.csv"
    path.write_text('id,s\n0,"a\nb"\n1,c\n')
    ds = StructuredDataset(str(path), format="csv", count_rows=True)
    assert [c.num_rows for c in ds.plan(0).all_chunks()] == [3]
    from torch_dataloader_utils import RecordBoundaryError

    with pytest.raises(RecordBoundaryError, match="parsed into 2 records but hold 3"):
        list(ds)


@pytest.mark.parametrize("real", ["parquet", "orc"])
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_columnar_file_read_as_text_names_its_format(tmp_path: Path, real: str, fmt: str) -> None:
    """Issue 28, item 5: Parquet read as CSV was told to iconv its header; ORC gave a row of garbage."""
    import pyarrow.orc as po
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(10))})
    path = tmp_path / f"data.{real}"
    (pq.write_table if real == "parquet" else po.write_table)(table, path)
    with pytest.raises(CorruptFileError) as err:
        create_dataloader(str(path), format=fmt, num_workers=0)
    label = {"parquet": "a Parquet", "orc": "an ORC"}[real]
    assert f"is {label} file" in str(err.value)
    assert f"not {fmt.upper()}: pass format={real!r}" in str(err.value)
    assert "iconv" not in str(err.value)


def test_text_that_starts_like_a_magic_is_text(tmp_path: Path) -> None:
    path = tmp_path / "ids.csv"
    path.write_text("ORCID,PAR1\n" + "".join(f"{i},{i}\n" for i in range(5)))
    loader, _ = create_dataloader(str(path), format="csv", num_workers=0)
    assert [int(i) for b in loader for i in b["ORCID"]] == list(range(5))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_types_are_inferred_past_bad_lines_in_the_head(tmp_path: Path, fmt: str) -> None:
    """Issue 33, item 9: a line that does not parse is the reader's to skip or raise, not discovery's."""
    bad = "3,0.5,extra" if fmt == "csv" else '{"id": 3, "x": '
    lines = [f"{i},{i}.5" if fmt == "csv" else json.dumps({"id": i, "x": i + 0.5}) for i in range(6)]
    lines[3] = bad
    path = tmp_path / f"a.{fmt}"
    path.write_text(("id,x\n" if fmt == "csv" else "") + "\n".join(lines) + "\n")
    found = StructuredDataset(str(path), format=fmt).discovered
    assert found.schema == pa.schema([("id", pa.int64()), ("x", pa.float64())])


def test_head_lines_that_disagree_on_a_type_name_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 1, "x": 1}\n{"id": 2, "x": "two"}\n')
    match = r"its lines disagree on a column's type \(.*\); pass schema="
    with pytest.raises(SchemaMismatchError, match=match):
        StructuredDataset(str(path), format="jsonl")


def test_the_search_for_lines_that_parse_is_bounded(tmp_path: Path) -> None:
    """A file of another format is not parsed line by line through its whole head (tens of seconds)."""
    path = tmp_path / "really-csv.jsonl"
    path.write_text("id,x\n" + "".join(f"{i},{i}\n" for i in range(200_000)))
    with pytest.raises(CorruptFileError, match=r"none of its ([\d,]+) first lines parses") as exc:
        StructuredDataset(str(path), format="jsonl")
    searched = int(re.search(r"none of its ([\d,]+) first", str(exc.value))[1].replace(",", ""))  # type: ignore[index]
    assert 0 < searched <= text_discovery._SEARCH_PARSES < 100_000  # the head holds ~100,000 lines
