"""``reshard``: exactly once, sizes, row groups, grouping, partitions, the manifest, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testsupport import latency_fs

from tests.tools.helpers import (
    FORMATS,
    id_rows,
    manifest_doc,
    read_output,
    run_ranks,
    write_source,
)
from torch_dataloader_utils import (
    ConfigError,
    CorruptFileError,
    DestinationConflictError,
    IncompatibleOptionsError,
    ReshardError,
    SourceChangedError,
    StructuredDataset,
    UnknownColumnError,
    create_dataloader,
    reshard,
)
from torch_dataloader_utils.cli import main as cli_main
from torch_dataloader_utils.tools import reshard as reshard_module

ROWS = [700, 50, 1200, 3, 640, 910]
TOTAL = sum(ROWS)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    write_source(tmp_path / "src", "parquet", ROWS, row_group_rows=128)
    return tmp_path / "src"


def loader_ids(path: Path | str, **options: object) -> np.ndarray:
    loader, _ = create_dataloader(str(path), num_workers=0, batch_size=500, output_format="numpy", **options)
    parts = [b["id"] for b in loader]
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)


# -- exactly once -----------------------------------------------------------------------


@settings(max_examples=12)
@given(
    fmt=st.sampled_from(FORMATS),
    rows=st.lists(st.integers(0, 400), min_size=1, max_size=5).filter(
        lambda r: sum(r) > 0
    ),  # text needs a row
    target_kib=st.integers(2, 24),
    workers=st.sampled_from([1, 2]),
    ranks=st.sampled_from([1, 1, 2]),
)
def test_every_source_row_lands_in_exactly_one_shard(
    tmp_path_factory: pytest.TempPathFactory,
    fmt: str,
    rows: list[int],
    target_kib: int,
    workers: int,
    ranks: int,
) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    total = write_source(tmp / "src", fmt, rows, row_group_rows=64)
    kwargs = {
        "src": str(tmp / "src"),
        "dst": str(tmp / "dst"),
        "format": fmt,
        "target_file_size": f"{target_kib}KiB",
        "row_group_rows": 100,
        "workers": workers,
    }
    if ranks == 1:
        reshard(**kwargs)  # type: ignore[arg-type]
    else:
        results = run_ranks(ranks, tmp, **kwargs)
        # Every rank reports the shards written by all ranks.
        assert [r["written"] for r in results] == [len(manifest_doc(tmp / "dst")["shards"])] * ranks
    ids = np.sort(read_output(tmp / "dst").column("id").to_numpy())
    assert np.array_equal(ids, np.arange(total))
    assert sorted(os.listdir(tmp / "dst")) == sorted(
        ["_manifest.json", *[s["path"] for s in manifest_doc(tmp / "dst")["shards"]]]
    )  # the job's own files are gone


def test_shards_are_within_ten_percent_of_the_target(tmp_path: Path) -> None:
    write_source(tmp_path / "src", "parquet", [4000] * 30, row_group_rows=1000)
    report = reshard(str(tmp_path / "src"), str(tmp_path / "dst"), target_file_size="160KiB", workers=2)
    sizes = [(tmp_path / "dst" / s.path).stat().st_size for s in report.manifest.shards]
    assert len(sizes) >= 6
    target = 160 * 1024
    assert all(abs(size - target) <= 0.1 * target for size in sizes[:-1]), sizes
    assert sizes[-1] <= 1.1 * target
    assert [s.bytes for s in report.manifest.shards] == sizes
    assert report.num_rows == 120_000


def test_row_groups_by_rows_or_bytes_and_compression(source: Path, tmp_path: Path) -> None:
    report = reshard(str(source), str(tmp_path / "rows"), target_file_size="64KiB", row_group_rows=250)
    for shard in report.manifest.shards[:-1]:
        meta = pq.read_metadata(tmp_path / "rows" / shard.path)
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert all(c == 250 for c in counts[:-1])
        assert counts[-1] <= 250
        assert [g.num_rows for g in shard.row_groups] == counts
        assert meta.row_group(0).column(0).compression == "ZSTD"
    report = reshard(
        str(source),
        str(tmp_path / "bytes"),
        target_file_size="64KiB",
        row_group_bytes="16KiB",
        compression="snappy",
    )
    meta = pq.read_metadata(tmp_path / "bytes" / report.manifest.shards[0].path)
    assert meta.num_row_groups >= 3  # a 64 KiB shard in row groups of about 16 KiB
    assert meta.row_group(0).column(0).compression == "SNAPPY"


def test_columns_filters_and_sort_by(source: Path, tmp_path: Path) -> None:
    report = reshard(
        str(source),
        str(tmp_path / "dst"),
        columns=["id", "s", "label"],
        filters=pc.field("label") != 2,
        target_file_size="20KiB",
        sort_by="s",
        verify=True,
    )
    out = read_output(tmp_path / "dst")
    assert out.column_names == ["id", "s", "label"]
    expected = [i for i in range(TOTAL) if i % 5 != 2]
    assert sorted(out.column("id").to_pylist()) == expected
    assert report.verified
    for shard in report.manifest.shards:
        values = pq.read_table(tmp_path / "dst" / shard.path).column("s").to_pylist()
        assert values == sorted(values)


# -- group_by and partition_by -----------------------------------------------------------


def test_group_by_keeps_every_group_whole_and_contiguous(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    ids = np.arange(20_000)
    users = rng.integers(0, 300, size=len(ids))  # 300 groups of varied sizes, spread over files
    for i in range(8):
        part = slice(i * 2500, (i + 1) * 2500)
        table = pa.table({"id": ids[part], "user": users[part], "v": rng.standard_normal(2500)})
        (tmp_path / "src").mkdir(exist_ok=True)
        pq.write_table(table, tmp_path / "src" / f"f{i}.parquet", row_group_size=500)
    report = reshard(
        str(tmp_path / "src"),
        str(tmp_path / "dst"),
        target_file_size="40KiB",
        group_by="user",
        workers=2,
        verify=True,
    )
    assert report.num_shards >= 4
    home: dict[int, str] = {}
    for shard in report.manifest.shards:
        column = pq.read_table(tmp_path / "dst" / shard.path).column("user").to_numpy()
        starts = np.flatnonzero(np.diff(column)) + 1
        runs = np.split(column, starts)
        assert len({int(r[0]) for r in runs}) == len(runs)  # each user in one run: contiguous
        for user in np.unique(column):
            assert home.setdefault(int(user), shard.path) == shard.path  # whole: one shard per user
    out = read_output(tmp_path / "dst")
    assert np.array_equal(np.sort(out.column("id").to_numpy()), ids)


def test_partition_by_writes_hive_directories_the_loader_reads_back(source: Path, tmp_path: Path) -> None:
    report = reshard(
        str(source),
        str(tmp_path / "dst"),
        target_file_size="8KiB",
        partition_by="label",
        workers=2,
        verify=True,
    )
    paths = [s.path for s in report.manifest.shards]
    assert {p.split("/")[0] for p in paths} == {f"label={v}" for v in range(5)}
    for shard in report.manifest.shards:
        assert "label" not in pq.read_schema(tmp_path / "dst" / shard.path).names
    loader, dataset = create_dataloader(
        str(tmp_path / "dst"), num_workers=0, batch_size=10_000, output_format="arrow"
    )
    table = pa.Table.from_batches(list(loader))
    assert dataset.schema.field("label").type == pa.int64()
    assert sorted(zip(table.column("id").to_pylist(), table.column("label").to_pylist(), strict=True)) == [
        (i, i % 5) for i in range(TOTAL)
    ]
    # A filter on the partition column drops whole shards, so counts stay exact.
    _, only = create_dataloader(str(tmp_path / "dst"), filters=pc.field("label") == 3, num_workers=0)
    assert {f.path.split("/")[-2] for f in only.files} == {"label=3"}
    assert sum(f.num_rows or 0 for f in only.files) == sum(1 for i in range(TOTAL) if i % 5 == 3)


# -- the manifest in the loader ----------------------------------------------------------


def test_the_loader_opens_the_manifest_without_listing_or_footers(source: Path, tmp_path: Path) -> None:
    report = reshard(str(source), str(tmp_path / "dst"), target_file_size="4KiB")
    assert report.num_shards >= 5
    options = {"delay": 0.0, "stats_key": "reshard-manifest"}
    stats = latency_fs.stats("reshard-manifest")
    stats.reset()
    dataset = StructuredDataset(f"latency://{tmp_path / 'dst'}", storage_options=options)
    assert stats.requests == 1  # the manifest: no listing, no footer
    assert len(dataset.files) == report.num_shards
    stats.reset()
    listed = StructuredDataset(f"latency://{tmp_path / 'dst'}", storage_options=options, use_manifest=False)
    assert stats.requests >= report.num_shards + 1  # a listing and a footer per shard
    assert [f.num_rows for f in listed.files] == [f.num_rows for f in dataset.files]
    # Same rows, through the manifest and through a listing, and the same as the source.
    assert np.array_equal(loader_ids(tmp_path / "dst"), np.arange(TOTAL))
    assert np.array_equal(loader_ids(tmp_path / "dst", use_manifest=False), np.arange(TOTAL))
    assert np.array_equal(loader_ids(tmp_path / "dst" / "_manifest.json"), np.arange(TOTAL))
    # Two ranks, two workers each: every row once, equal batch counts.
    seen = []
    for rank in range(2):
        loader, _ = create_dataloader(
            str(tmp_path / "dst"), num_ranks=2, rank=rank, num_workers=2, batch_size=64, output_format="numpy"
        )
        seen.append(np.concatenate([b["id"] for b in loader]))
    assert len(seen[0]) == len(seen[1]) == TOTAL // 2


def test_manifest_errors_name_the_file_and_the_fix(source: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"use_manifest=True but .*does not exist"):
        StructuredDataset(str(source), use_manifest=True)
    with pytest.raises(IncompatibleOptionsError, match="format='parquet'"):
        StructuredDataset(str(source), format="csv", use_manifest=True)
    reshard(str(source), str(tmp_path / "dst"), target_file_size="64KiB")
    doc = manifest_doc(tmp_path / "dst")
    doc["version"] = 99
    (tmp_path / "dst" / "_manifest.json").write_text(json.dumps(doc))
    with pytest.raises(CorruptFileError, match=r"version 99.*use_manifest=False"):
        StructuredDataset(str(tmp_path / "dst"))
    assert len(StructuredDataset(str(tmp_path / "dst"), use_manifest=False).files) == len(doc["shards"])


# -- restarts and bad input --------------------------------------------------------------


class Interrupted(Exception):
    pass


def interrupt_before_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: object) -> bytes:
        raise Interrupted("stopped before the manifest")

    monkeypatch.setattr(reshard_module._Job, "_finish", fail)


def test_a_rerun_skips_done_shards_and_rewrites_the_rest(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst = tmp_path / "dst"
    with monkeypatch.context() as patch:
        interrupt_before_manifest(patch)
        with pytest.raises(Interrupted):
            reshard(str(source), str(dst), target_file_size="4KiB")
    done = sorted((dst / "_reshard" / "done").iterdir())
    assert len(done) >= 5
    assert not (dst / "_manifest.json").exists()
    done[1].unlink()  # shard 1 lost its marker: it is written again; a half-written temp file is ignored
    (dst / "_reshard" / "tmp" / "dead-part-00003.parquet").write_bytes(b"PAR1 partial")
    report = reshard(str(source), str(dst), target_file_size="4KiB")
    assert report.shards_written == 1
    assert report.shards_skipped == len(done) - 1
    assert np.array_equal(np.sort(read_output(dst).column("id").to_numpy()), np.arange(TOTAL))
    assert not (dst / "_reshard").exists()
    again = reshard(str(source), str(dst), target_file_size="4KiB")  # complete: nothing to do
    assert (again.shards_written, again.shards_skipped) == (0, report.num_shards)


def test_a_destination_with_other_files_or_another_job_is_never_overwritten(
    source: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(
        DestinationConflictError, match=r"holds 1 entries not written by reshard \('keep.txt'\)"
    ):
        reshard(str(source), str(other))
    assert os.listdir(other) == ["keep.txt"]
    dst = tmp_path / "dst"
    reshard(str(source), str(dst), target_file_size="4KiB")
    before = {p: p.stat().st_mtime_ns for p in dst.rglob("*")}
    with pytest.raises(
        DestinationConflictError, match=r"target_file_size=4096 there, 32768 now.*nothing was"
    ):
        reshard(str(source), str(dst), target_file_size="32KiB")
    with pytest.raises(DestinationConflictError, match=r"group_by=\[\] there, \['label'\] now"):
        reshard(str(source), str(dst), target_file_size="4KiB", group_by="label")
    assert {p: p.stat().st_mtime_ns for p in dst.rglob("*")} == before
    (tmp_path / "file").write_text("x")
    with pytest.raises(DestinationConflictError, match="is a file"):
        reshard(str(source), str(tmp_path / "file"))


def test_a_source_changed_since_the_job_started_is_an_error(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst = tmp_path / "dst"
    with monkeypatch.context() as patch:
        interrupt_before_manifest(patch)
        with pytest.raises(Interrupted):
            reshard(str(source), str(dst), target_file_size="4KiB")
    pq.write_table(id_rows(TOTAL, 10), source / "part-9999.parquet")
    with pytest.raises(SourceChangedError, match=r"files 6 then, 7 now.*nothing was overwritten.*delete"):
        reshard(str(source), str(dst), target_file_size="4KiB")
    (source / "part-9999.parquet").unlink()
    reshard(str(source), str(dst), target_file_size="4KiB")  # restored: the job finishes
    pq.write_table(id_rows(0, 700), source / "part-0000.parquet", row_group_size=7)  # same rows, new file
    with pytest.raises(SourceChangedError, match="since a finished reshard job"):
        reshard(str(source), str(dst), target_file_size="4KiB")


def test_an_unwritable_destination_is_a_clear_error(source: Path, tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("x")
    with pytest.raises(ReshardError, match=r"cannot (write to|read) the destination .*plain-file/out"):
        reshard(str(source), str(tmp_path / "plain-file" / "out"))


def test_verify_finds_a_shard_that_differs_from_the_source(source: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    report = reshard(str(source), str(dst), target_file_size="4KiB", row_group_rows=100)
    shard = dst / report.manifest.shards[1].path
    table = pq.read_table(shard)
    changed = table.set_column(table.schema.get_field_index("x"), "x", pc.add(table.column("x"), 1.0))
    pq.write_table(changed, shard, row_group_size=100)
    # The rewritten shard's size no longer matches the manifest: caught before its values.
    with pytest.raises(ReshardError, match=r"verify: .*part-00001\.parquet.* changed after"):
        reshard(str(source), str(dst), target_file_size="4KiB", row_group_rows=100, verify=True)


def test_verify_finds_values_changed_in_place(source: Path, tmp_path: Path) -> None:
    import struct

    dst = tmp_path / "dst"
    options = {"target_file_size": "4KiB", "row_group_rows": 100, "compression": "none"}
    report = reshard(str(source), str(dst), **options)  # type: ignore[arg-type]
    shard = dst / report.manifest.shards[1].path
    first = pq.read_table(shard).column("x")[0].as_py()
    data = shard.read_bytes()
    old = struct.pack("<d", first)
    assert data.count(old) >= 1
    stat = shard.stat()
    shard.write_bytes(data.replace(old, struct.pack("<d", first + 1.0), 1))  # same size
    with pytest.raises(ReshardError, match=r"verify: a file differs .* the manifest .* is stale"):
        reshard(str(source), str(dst), verify=True, **options)  # type: ignore[arg-type]
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same time: the checksums tell
    with pytest.raises(ReshardError, match=r"verify: .*column 'x' holds other values"):
        reshard(str(source), str(dst), verify=True, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (
            {"row_group_bytes": "1MiB", "row_group_rows": 10},
            IncompatibleOptionsError,
            "one of row_group_bytes",
        ),
        ({"compression": "xz"}, ConfigError, "compression='xz' is not supported; use one of 'none'"),
        ({"target_file_size": "big"}, ConfigError, "target_file_size='big' is not a size"),
        ({"workers": 0}, ConfigError, "workers=0 must be >= 1"),
        ({"group_by": "nope"}, UnknownColumnError, "group_by=['nope']: ['nope'] not found"),
        ({"partition_by": "x"}, ConfigError, "partition_by column 'x' is double"),
        ({"sort_by": "label", "partition_by": "label"}, IncompatibleOptionsError, "drop it from sort_by"),
        ({"format": "avro"}, ConfigError, "format='avro' is not supported"),
        ({"snapshot_id": 3}, IncompatibleOptionsError, "snapshot_id= applies to format='iceberg'"),
    ],
)
def test_bad_options_name_the_parameter(
    source: Path, tmp_path: Path, kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        reshard(str(source), str(tmp_path / "dst"), **kwargs)  # type: ignore[arg-type]
    assert words in str(info.value)
    assert not (tmp_path / "dst").exists()


@pytest.mark.filterwarnings("ignore:filters=.*excludes every row group")
def test_an_empty_selection_writes_one_empty_shard(source: Path, tmp_path: Path) -> None:
    report = reshard(str(source), str(tmp_path / "dst"), filters=pc.field("id") < 0)
    assert report.num_shards == 1
    assert report.num_rows == 0
    assert len(loader_ids(tmp_path / "dst")) == 0


# -- command line ---------------------------------------------------------------------------


def test_cli_reshards_and_reports_errors_in_one_line(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "dst"
    args = ["reshard", str(source), str(dst), "--target-file-size", "4KiB", "--row-group-size", "300rows"]
    assert cli_main([*args, "--filter", "label in [1, 2]", "--columns", "id,label", "--workers", "2"]) == 0
    assert "shards" in capsys.readouterr().out
    assert sorted(read_output(dst).column("id").to_pylist()) == [i for i in range(TOTAL) if i % 5 in (1, 2)]
    assert cli_main([*args, "--compression", "snappy"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("torch-dataloader-utils reshard: error: DestinationConflictError: dst=")
    assert "compression='zstd' there, 'snappy' now" in err
    assert len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as exit_:  # argparse's own error, one line too
        cli_main(["reshard", str(source), str(tmp_path / "x"), "--filter", "label ~ 3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "is not 'COLUMN OP VALUE'" in err
    assert err.count("\n") == 1
    with pytest.raises(SystemExit):
        cli_main(["reshard", "--help"])
    assert "(default: 256MiB)" in capsys.readouterr().out
