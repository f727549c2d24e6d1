"""``inspect``: files, rows, bytes, row groups, schema, partitions, compression; warnings and advice."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils.plan.summary as summary_module
from tests.fixtures.data import write_parquet_files
from tests.fixtures.s3 import S3Server
from torch_dataloader_utils.cli import main

ROWS = [1300, 170, 940, 55, 610]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_json_describes_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_parquet_files(tmp_path, ROWS, row_group_size=100)
    payload = json.loads(run(capsys, "inspect", str(tmp_path), "--json", "--top", "2"))
    sizes = [p.stat().st_size for p in paths]
    groups = [pq.read_metadata(p).num_row_groups for p in paths]
    assert (payload["files"], payload["rows"], payload["bytes"]) == (5, sum(ROWS), sum(sizes))
    assert payload["row_groups"] == sum(groups)
    assert payload["row_groups_per_file"] == {"min": 1, "median": 7, "max": 13}
    assert groups == [13, 2, 10, 1, 7]
    assert sum(c for _, _, c in payload["file_size_histogram"]) == 5
    assert payload["file_size"]["min"] == min(sizes)
    assert payload["file_size"]["max"] == max(sizes)
    assert payload["schema"] == ["id: int64", "x: float", "label: int64", "s: string"]
    assert payload["compression"] == {"SNAPPY": sum(groups) * 4}
    assert [f["path"] for f in payload["largest_files"]] == [str(paths[0]), str(paths[2])]
    assert payload["partitions"] == []
    assert payload["split"] == {"split_rows": 769}  # small data: ~4 chunks for the one reader
    assert payload["data_path"] == "local files (pyarrow)"


@pytest.mark.slow
def test_the_data_path_of_an_object_store_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], s3_server: S3Server
) -> None:
    paths = write_parquet_files(tmp_path, ROWS[:2], row_group_size=100)
    fs = s3_server.fs()
    prefix = s3_server.new_prefix()
    for p in paths:
        fs.pipe_file(f"{prefix}/{p.name}", p.read_bytes())
    options = [f"--storage-option={k}={v}" for k, v in s3_server.options().items() if k != "client_kwargs"]
    text = run(capsys, "inspect", f"s3://{prefix}", *options)
    assert f"data bytes read through: pyarrow's native S3 client (endpoint {s3_server.endpoint})" in text
    text = run(capsys, "inspect", f"s3://{prefix}", *options, "--storage-option=version_aware=false")
    assert "data bytes read through: s3fs (an option has no native equivalent" in text


def test_text_report_with_partitions_warnings_and_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(summary_module, "SMALL_FILES_MIN_COUNT", 6)
    for year in (2023, 2024, 2025):
        write_parquet_files(tmp_path / f"year={year}", [100, 100], row_group_size=50, start_id=year * 1000)
    out = run(
        capsys, "inspect", str(tmp_path), "--partitioning", "hive", "--num-ranks", "2", "--num-workers", "2"
    )
    assert out.startswith(f"{str(tmp_path)!r} (parquet): 6 files: 600 rows, ")
    assert "row groups per file: min 2, median 2, max 2" in out
    assert "compression: SNAPPY (48 column chunks)" in out
    assert "schema:\n  id: int64\n  x: float\n  label: int64\n  s: string\n  year: int64\n" in out
    assert "partitions: year (3 values)" in out
    assert "warning: 6 files with a median size of " in out
    # 12 row groups of 50 rows: split_rows=38 cannot cut them, so each reader gets 3 chunks, not 4.
    assert (
        "recommendation:\n  split_rows=38 gives each of the 4 readers (ranks x workers) about 3.0 chunks"
        in out
    )
    assert "the row groups allow no more (12 in all: a chunk holds whole row groups)" in out
    assert (
        "reshard the 6 small files into about 1 files of ~128.0 MiB: `torch-dataloader-utils reshard`" in out
    )


def test_recommendation_respects_the_smallest_unit_and_shows_files_per_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28, item 4: 'about 7 chunks per reader' where 32 row groups give 8 readers 4 each."""
    write_parquet_files(tmp_path, [4000] * 8, row_group_size=1000, with_strings=False)
    argv = ("inspect", str(tmp_path), "--num-ranks", "4", "--num-workers", "2", "--shuffle")
    assert main(list(argv)) == 0
    out, err = capsys.readouterr()
    assert "inspect: warning: shuffle=True mixes the rows of 8 chunks per reader" in err
    assert "about 4.0 each" in err
    assert "about 4.0 chunks" in out
    assert "the row groups allow no more (32 in all" in out
    assert "expected files per batch: " in out
    payload = json.loads(run(capsys, *argv, "--json"))
    assert 3.0 < payload["files_per_batch"] <= 8.0  # the library split to single row groups
    assert payload["split_used"].startswith("row_group (split_bytes=")
