"""``plan``: its summary, detail, JSON and picture equal the library's plan."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixtures.data import write_parquet_files
from tests.fixtures.iceberg import create_id_table, id_table
from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.cli import main
from torch_dataloader_utils.plan.summary import summarize_plan
from torch_dataloader_utils.tools.picture import draw_plan, file_colours
from torch_dataloader_utils.tools.plan import PlanRequest, compute
from torch_dataloader_utils.tools.source import Source

ROWS = [1300, 170, 940, 55, 610]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plan_cli")
    write_parquet_files(root, ROWS, row_group_size=100)
    return root


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_text_summary_and_detail_equal_the_plan(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "plan", str(data), "--num-ranks", "3", "--num-workers", "2", "--split-rows", "200",
              "--batch-size", "64", "--shuffle", "--seed", "5", "--epoch", "1")  # fmt: skip
    dataset = StructuredDataset(str(data), num_ranks=3, rank=0, num_workers=2, split_rows=200, batch_size=64,
                                shuffle=True, shuffle_seed=5)  # fmt: skip
    plan = dataset.plan(1, 2)
    s = summarize_plan(plan)
    assert s.rows is not None
    assert out.startswith(f"plan of {str(data)!r} (parquet) for 3 ranks x 2 workers\n")
    assert (
        "options: batch_size 64, split row_group (split_rows=200), equal_batches drop, shuffle on (seed 5)"
        in out
    )
    rank_rows = s.rows.sum(axis=1)
    assert re.search(rf"rows per rank +{rank_rows.min():,} +{rank_rows.max():,} ", out)
    assert f"rows left out to equalize ranks: {sum(ROWS) % 3}; rows padded: 0" in out
    assert f"epoch 1: {len(plan.all_chunks())} chunks of 5 files, {int(s.rows.sum()):,} rows" in out
    # Every worker line of the detail: its rows and chunk count, and its first chunks in order.
    for r in range(3):
        for w in range(2):
            chunks = plan.chunks_for(r, w)
            first = " ".join(f"{Path(c.path).name}[{c.start}:{c.stop})" for c in chunks[:3])
            assert re.search(
                rf"\n +{r} +{w} +{plan.rows_for(r, w):,} +\S+ \S+ +{len(chunks)}  {re.escape(first)}", out
            )


def test_large_jobs_are_summarized(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(pa.table({"id": np.arange(12_000)}), tmp_path / "a.parquet", row_group_size=10)
    out = run(
        capsys,
        "plan",
        str(tmp_path),
        "--num-ranks",
        "1200",
        "--detail",
        "2",
        "--split-rows",
        "10",
        "--equal-batches",
        "off",
    )
    assert "for 1,200 ranks x 1 workers" in out
    assert "rows per rank:\n" in out
    assert "(ranks 0-1 of 1,200; --detail N for more)" in out
    assert len(out.splitlines()) < 40
    assert "idle ranks: 0; idle workers: 0" in out


def test_json_has_every_chunk_of_the_plan(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "plan", str(data), "--num-ranks", "2", "--num-workers", "3", "--split-rows", "300",
              "--equal-batches", "pad", "--epochs", "2", "--json")  # fmt: skip
    payload = json.loads(out)
    dataset = StructuredDataset(
        str(data), num_ranks=2, rank=0, num_workers=3, split_rows=300, equal_batches="pad"
    )
    assert payload["num_ranks"] == 2
    assert payload["num_workers"] == 3
    assert payload["files"]["rows"] == sum(ROWS)
    assert [e["summary"]["epoch"] for e in payload["epochs"]] == [0, 1]
    for entry in payload["epochs"]:
        plan = dataset.plan(entry["summary"]["epoch"], 3)
        assert (
            entry["summary"]["rows_padded"]
            == sum(c.num_rows or 0 for c in plan.all_chunks() if c.padding)
            == 1
        )
        for rank in entry["ranks"]:
            for worker in rank["workers"]:
                got = [(c["path"], c["start"], c["stop"], c["rows"], c["padding"]) for c in worker["chunks"]]
                want = [
                    (c.path, c.start, c.stop, c.num_rows, c.padding)
                    for c in plan.chunks_for(rank["rank"], worker["worker"])
                ]
                assert got == want
            assert rank["rows"] == plan.rank_rows(rank["rank"])


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_picture_draws_exactly_the_plan(data: Path, tmp_path: Path, suffix: str) -> None:
    request = PlanRequest(
        source=Source(path=str(data), options={"split_rows": 250, "shuffle": True, "equal_batches": "pad"}),
        num_ranks=2,
        num_workers=2,
        epochs=2,
    )
    result = compute(request)
    out = tmp_path / f"plan{suffix}"
    drawn = draw_plan(result.views, out, max_ranks=16, title="test")
    assert out.stat().st_size > 1000
    colours = file_colours(result.views)
    expected = []
    for view in result.views:
        for r in range(2):
            for w in range(2):
                x = 0
                for i, c in enumerate(view.chunks_for(r, w)):
                    assert c.num_rows is not None
                    expected.append(
                        (view.epoch, r, w, i, float(x), float(c.num_rows), colours[c.path], c.padding)
                    )
                    x += c.num_rows
    got = sorted((d.epoch, d.rank, d.worker, d.index, d.x, d.width, d.colour, d.hatched) for d in drawn)
    assert got == sorted(expected)
    assert any(d.hatched for d in drawn)  # padding drawn hatched
    assert len(set(colours.values())) == len(ROWS)  # one colour per file
    if suffix == ".svg":
        ids = re.findall(r'id="(chunk-e\d+-r\d+-w\d+-\d+)"', out.read_text())
        assert sorted(ids) == sorted(f"chunk-e{e}-r{r}-w{w}-{i}" for e, r, w, i, *_ in expected)
    else:
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_picture_of_a_large_job_draws_the_first_ranks(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    picture = tmp_path / "p.png"
    out = run(capsys, "plan", str(data), "--num-ranks", "40", "--split-rows", "50", "--picture", str(picture),
              "--picture-ranks", "4", "--detail", "0")  # fmt: skip
    plan = StructuredDataset(str(data), num_ranks=40, rank=0, num_workers=0, split_rows=50).plan(0, 1)
    drawn = sum(len(plan.rank_chunks(r)) for r in range(4))
    assert out.rstrip().endswith(f"picture: {picture} ({drawn} chunks drawn)")
    assert "detail of epoch" not in out  # --detail 0: summary only


def test_missing_matplotlib_is_a_clear_error(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    assert main(["plan", str(data), "--picture", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "matplotlib, which is not installed; pip install 'torch-dataloader-utils[plot]'" in err


def test_options_reach_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for year in (2023, 2024):
        write_parquet_files(tmp_path / "d" / f"year={year}", [300], row_group_size=100, start_id=year * 1000)
    out = run(capsys, "plan", str(tmp_path / "d"), "--partitioning", "hive", "--filter", "year == 2024",
              "--filter", "id < 2024250", "--count-rows", "--columns", "id,year", "--storage-option",
              "auto_mkdir=false", "--json")  # fmt: skip
    payload = json.loads(out)
    [epoch] = payload["epochs"]
    chunks = [c for r in epoch["ranks"] for w in r["workers"] for c in w["chunks"]]
    assert {Path(c["path"]).parent.name for c in chunks} == {"year=2024"}  # partition pruned
    assert sum(c["rows"] for c in chunks) == 250  # the filter counted


def test_iceberg_table(iceberg_catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    config, catalog = iceberg_catalog
    table = create_id_table(catalog)
    table.append(id_table(0, 40))
    table.append(id_table(40, 25))
    conf = tmp_path / "catalog.json"
    conf.write_text(json.dumps(config))
    out = run(capsys, "plan", "--table", "ns.t", "--catalog-config", str(conf), "--num-ranks", "2", "--json")
    payload = json.loads(out)
    assert payload["source"] == "Iceberg table 'ns.t'"
    assert payload["files"]["rows"] == 65
    assert payload["epochs"][0]["summary"]["rows"] == 64  # 'drop' leaves one row out over 2 ranks
    inline = run(capsys, "plan", "--table", "ns.t", "--catalog-config", json.dumps(config))
    assert "plan of Iceberg table 'ns.t' for 1 ranks x 1 workers" in inline


def test_expected_files_per_batch_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28, item 4: ``plan`` says how many files a batch draws from, with the split it uses."""
    write_parquet_files(tmp_path, [2000] * 8, row_group_size=125, with_strings=False)
    argv = ["plan", str(tmp_path), "--num-ranks", "4", "--num-workers", "2", "--detail", "0"]
    plain = run(capsys, *argv)
    assert "expected files per batch: 1.0" in plain  # unshuffled: a batch is one chunk's rows
    assert "split row_group (split_bytes=67,108,864)" in plain
    mixed = run(capsys, *argv, "--shuffle")
    found = re.search(r"expected files per batch: ([0-9.]+)", mixed)
    assert found is not None
    assert float(found.group(1)) >= 4.0
    assert "split row_group (split_bytes=" in mixed
    assert "split row_group (split_bytes=67,108,864)" not in mixed  # split finer for the mixing
    payload = json.loads(run(capsys, *argv, "--shuffle", "--json"))
    assert payload["epochs"][0]["files_per_batch"] == pytest.approx(float(found.group(1)), abs=0.05)
