"""``plan --mix`` and ``simulate --mix``: the mixed loader's own plan, on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.recipes import write_source
from torch_dataloader_utils import create_mixed_dataloader
from torch_dataloader_utils.cli import main


@pytest.fixture
def recipe(tmp_path: Path) -> tuple[Path, list[str]]:
    paths = [write_source(tmp_path / f"s{i}", i, n) for i, n in enumerate((300, 90))]
    body = {
        "sources": [{"path": paths[0], "name": "web"}, {"path": paths[1], "filters": ["label >= 0"]}],
        "weights": [3, 1],
        "on_exhausted": "cycle",
    }
    file = tmp_path / "recipe.json"
    file.write_text(json.dumps(body))
    return file, paths


def test_plan_json_is_the_loaders_plan(
    recipe: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    file, paths = recipe
    code = main(["plan", "--mix", str(file), "--num-ranks", "2", "--num-workers", "2", "--batch-size", "16",
                 "--epochs", "2", "--json"])  # fmt: skip
    assert code == 0
    shown = json.loads(capsys.readouterr().out)
    loader, dataset = create_mixed_dataloader(
        [{"path": paths[0], "name": "web"}, {"path": paths[1]}],
        [3, 1],
        num_ranks=2,
        rank=0,
        num_workers=2,
        batch_size=16,
    )
    assert shown["epochs"][0] == dataset.describe(0)
    assert shown["epochs"][1] == dataset.describe(1)
    assert shown["epochs"][0]["batches_per_rank"] == len(loader)
    assert [s["name"] for s in shown["epochs"][0]["sources"]] == ["web", "s1"]


def test_plan_text(recipe: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    file, _ = recipe
    assert main(["plan", "--mix", file.read_text(), "--batch-size", "10"]) == 0
    out = capsys.readouterr().out
    assert "a mix of 2 sources" in out
    assert "epoch 0:" in out
    assert "75.0%" in out


def test_simulate_mix(recipe: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    file, _ = recipe
    code = main(["simulate", "--mix", str(file), "--decode-rate", "100000", "--worker-start", "0", "--json"])
    assert code == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["epoch_sec"] > 0
    assert [s["name"] for s in shown["sources"]] == ["web", "s1"]
    assert shown["sources"][0]["share_of_its_epoch"] == pytest.approx(1.0)  # the anchor: one epoch


def test_mix_errors(recipe: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    file, paths = recipe
    assert main(["plan", "--mix", str(file), paths[0]]) == 2
    assert "--mix alone" in capsys.readouterr().err
    assert main(["inspect", "--mix", str(file)]) == 2
    assert "not --mix" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "--mix", '{"sources": []}'])
    assert "weights" in capsys.readouterr().err


def test_plan_explains_a_last_batch_filled_from_a_small_sources_epochs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two sources of 100 rows, batches of 1,024: the one batch holds 100 rows of a and 924 of b.

    Documented (docs/recipes.md, "The last batch of an epoch"): the anchor's last batch is
    filled up from the other sources by weight; the plan says so, and which batch size
    keeps the weights.
    """
    for name, s in (("a", 0), ("b", 1)):
        write_source(tmp_path / name, s, 100)
    recipe = {"sources": [{"path": str(tmp_path / "a")}, {"path": str(tmp_path / "b")}], "weights": [1, 1]}
    assert main(["plan", "--mix", json.dumps(recipe)]) == 0
    out = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()[-1] for line in out.splitlines() if line.strip()[:2] in ("a ", "b ")
    }
    assert rows == {"a": "100", "b": "924"}
    assert "'a', whose epoch ends the mix's, has 100 rows per lane" in out
    assert "'b' takes 924 rows there, 412 more than a batch at the weights holds" in out
    assert "9.24 of its epochs this epoch" in out
    assert "With batch_size <= 20 the epoch has 10 or more batches" in out
    assert main(["plan", "--mix", json.dumps(recipe), "--batch-size", "20"]) == 0
    assert "note:" not in capsys.readouterr().out  # batches of 20: the weights hold, nothing to explain


def test_plan_shows_a_schedules_stages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recipe's weights may be stages by step or a schedule by rows; plan shows where each starts."""
    paths = [write_source(tmp_path / name, s, 100) for s, name in enumerate("ab")]
    sources = [{"path": p} for p in paths]
    for weights, second in (
        ([[0, [1, 1]], [3, [3, 1]]], 3),
        ({"unit": "rows", "stages": [[0, [1, 1]], [60, [3, 1]]]}, 6),
    ):
        assert (
            main(
                ["plan", "--mix", json.dumps({"sources": sources, "weights": weights}), "--batch-size", "10"]
            )
            == 0
        )
        out = capsys.readouterr().out
        assert "  stage 0 from step 0: weights [1, 1]" in out
        assert f"  stage 1 from step {second}: weights [3, 1]" in out  # rows: the first batch from row 60
    bad = {"sources": sources, "weights": {"unit": "days", "stages": [[0, [1, 1]]]}}
    with pytest.raises(SystemExit):
        main(["plan", "--mix", json.dumps(bad)])
    assert "\"weights\": unit='days' is not a schedule unit; use 'step'" in capsys.readouterr().err
