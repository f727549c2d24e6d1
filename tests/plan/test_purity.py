"""plan/ must not import pyarrow, fsspec, pyiceberg or torch (directly or transitively)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import torch_dataloader_utils.plan as plan_pkg

FORBIDDEN = ("pyarrow", "fsspec", "pyiceberg", "torch")
PLAN_DIR = Path(plan_pkg.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_plan_sources_import_no_heavy_library() -> None:
    offenders = {
        f"{p.name}: {m}"
        for p in PLAN_DIR.glob("*.py")
        for m in _imported_modules(p)
        if m.split(".")[0] in FORBIDDEN
        or (m.startswith("torch_dataloader_utils.") and m.split(".")[1] not in ("plan", "errors"))
    }
    assert not offenders


def test_importing_plan_loads_no_heavy_library() -> None:
    code = (
        "import sys, torch_dataloader_utils.plan\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
