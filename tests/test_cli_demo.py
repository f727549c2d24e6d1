"""The README's main job: ``python -m torch_dataloader_utils demo`` runs real torchrun ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_runs_as_real_ranks_and_verifies_every_row(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO / "src")
    done = subprocess.run(
        [sys.executable, "-m", "torch_dataloader_utils", "demo", f"--data-dir={tmp_path}", "--epochs=1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "launching torchrun: 2 ranks x 2 workers" in out
    assert out.count("  OK: every rank yielded 100 batches; all 200000 rows arrived exactly once") == 1
    assert "FAIL" not in out


def _make_demo_commands() -> list[list[str]]:
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("demo:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.split())
    return recipe


def test_make_demo_runs_modules_found_from_a_fresh_clone():
    """Every ``$(PY) -m MODULE`` of ``make demo`` resolves from the repository root, without installing it."""
    import importlib.util

    commands = _make_demo_commands()
    modules = [cmd[cmd.index("-m") + 1] for cmd in commands]
    assert modules == ["torch_dataloader_utils", "testsupport.demo_iceberg"]
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
    assert (REPO / "testsupport" / "demo_iceberg.py").is_file()
    assert not (REPO / "src" / "torch_dataloader_utils" / "demo_iceberg.py").exists()


def test_the_installed_cli_has_no_iceberg_demo(capsys):
    from torch_dataloader_utils.cli import main

    with pytest.raises(SystemExit):
        main(["demo-iceberg"])
    assert "invalid choice: 'demo-iceberg'" in capsys.readouterr().err


def test_plan_command_verifies_every_rank(tmp_path, capsys):
    from tests.fixtures.data import write_parquet_files
    from torch_dataloader_utils.cli import main

    write_parquet_files(tmp_path / "data", [100, 60, 80], row_group_size=20, with_strings=False)
    args = ["plan", str(tmp_path / "data"), "--num-ranks", "20", "--num-workers", "2", "--shuffle"]
    assert main([*args, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "verified: no row is planned for two ranks in epoch 0" in out
    assert main(args) == 0
    assert "verified" not in capsys.readouterr().out


def test_make_demo_installs_only_what_the_demo_uses():
    """Issue 37: ``make demo`` installed the whole test toolchain (3m57s from a fresh clone)."""
    text = (REPO / "Makefile").read_text()
    rules = {}
    for block in text.split("\n\n"):
        for i, line in enumerate(block.splitlines()):
            if ":" in line and not line.startswith(("\t", "#", " ")) and "=" not in line.split(":")[0]:
                target, deps = line.split(":", 1)
                rules[target.strip()] = (deps.split(), block.splitlines()[i + 1 :])
    demo_deps, _ = rules["demo"]
    assert demo_deps == ["$(DEMO_STAMP)"]
    _, recipe = rules["$(DEMO_STAMP)"]
    installs = [line for line in recipe if "$(PIP)" in line]
    assert installs == ['\t$(PIP) -e ".[iceberg]"']
    assert "npm" not in "\n".join(recipe)
    dev_deps, dev_recipe = rules["$(STAMP)"]
    assert "$(DEMO_STAMP)" in dev_deps  # make test adds the dev tools on top
    assert any('-e ".[dev]"' in line for line in dev_recipe)
