"""tests/ and benchmarks/ never import each other; shared code lives in testsupport/.

Every ``.py`` file under tests/, benchmarks/ and testsupport/ is parsed with ``ast``; an
``import`` or ``from ... import`` (at any depth, including inside functions) of a
forbidden top-level package fails, naming the file and line. The library in src/ may
import none of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FORBIDDEN: dict[str, frozenset[str]] = {
    "tests": frozenset({"benchmarks"}),
    "benchmarks": frozenset({"tests"}),
    "testsupport": frozenset({"tests", "benchmarks"}),
    "src": frozenset({"tests", "benchmarks", "testsupport"}),
}


def imported_roots(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``source``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return sorted(found)


def violations(path: Path, source: str, forbidden: frozenset[str]) -> list[str]:
    """``file:line: imports X`` for each import of a package in ``forbidden``."""
    rel = path.relative_to(REPO) if path.is_absolute() else path
    return [
        f"{rel}:{line}: imports {root!r}, which {rel.parts[0]}/ must not import"
        for line, root in imported_roots(source, str(path))
        if root in forbidden
    ]


def test_finds_imports_at_any_depth_with_their_lines() -> None:
    source = "import os\nfrom benchmarks.common import x\n\ndef f():\n    import benchmarks.latency_fs as l\n"
    source += "from . import sibling\nimport tests.fixtures, numpy\n"
    expected = [(1, "os"), (2, "benchmarks"), (5, "benchmarks"), (7, "numpy"), (7, "tests")]
    assert imported_roots(source) == expected


def test_a_forbidden_import_is_reported_with_file_and_line() -> None:
    path = REPO / "tests" / "io" / "test_x.py"
    found = violations(path, "import numpy\n\nimport benchmarks.latency_fs as latency\n", FORBIDDEN["tests"])
    assert found == ["tests/io/test_x.py:3: imports 'benchmarks', which tests/ must not import"]
    assert violations(path, "from testsupport import latency_fs\n", FORBIDDEN["tests"]) == []


@pytest.mark.parametrize("top", sorted(FORBIDDEN))
def test_no_forbidden_imports_between_tests_benchmarks_and_src(top: str) -> None:
    files = sorted((REPO / top).rglob("*.py"))
    assert files, f"no Python files under {top}/"
    found = [v for f in files for v in violations(f, f.read_text(encoding="utf-8"), FORBIDDEN[top])]
    assert not found, "\n".join(found)
