"""The README's and docs' Python snippets pass ``mypy --strict`` against the library in src/.

Convention (for whoever writes docs):

- Every fenced block opened with ```` ```python ```` in README.md and docs/*.md is checked.
  Each becomes one module; all of them go through ONE mypy run (the repo's mypy options:
  strict, plus ``ignore_missing_imports`` for its untyped dependencies and for the
  untyped libraries the docs show next to ours, :data:`UNTYPED_DOC_IMPORTS`).
- Snippets are fragments: a shared prelude is prepended. It imports what docs use
  without importing (``torch``, ``torch.distributed as dist``, ``json``, ``os``, ``Any``,
  ``Sequence`` and the library's public names, as if earlier snippets had), and
  declares, typed, the training-loop names that a snippet uses before (or without)
  defining them: ``model``, ``optimizer``, ``num_epochs``,
  ``loader``, ``batch``, ... (:data:`DECLARATIONS`). A name the snippet defines first is
  not declared, so the snippet's own types win.
- A block that cannot be checked (deliberately partial, pseudo-code, methods shown out of
  their class) is marked by the HTML comment ``<!-- snippet: skip -->`` on the last
  non-blank line before its fence. Keep these rare: :data:`MAX_SKIPPED` bounds them.

A mypy error fails the test naming the doc file and the line in it.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_MARKER = "<!-- snippet: skip -->"
MAX_SKIPPED = 3
UNTYPED_DOC_IMPORTS = ("accelerate", "horovod", "transformers")
"""Libraries the docs use next to ours that ship no type information (mypy treats them as Any)."""

PRELUDE_IMPORTS = """\
import json
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from torch_dataloader_utils import (
    Chunk,
    FileInfo,
    IcebergDataset,
    StructuredDataset,
    create_dataloader,
    gather_state,
    merge_states,
)
"""

DECLARATIONS: dict[str, str] = {
    "model": "model: torch.nn.Module",
    "optimizer": "optimizer: torch.optim.Optimizer",
    "num_epochs": "num_epochs: int",
    "epochs": "epochs: int",
    "step": "step: int",
    "rank": "rank: int",
    "old_world": "old_world: int",
    "path": "path: str",
    "batch": "batch: dict[str, torch.Tensor]",
    "per_row_loss": "per_row_loss: torch.Tensor",
    "accelerator": "from accelerate import Accelerator\naccelerator: Accelerator",
    "train_step": "def train_step(batch: dict[str, torch.Tensor]) -> None: ...",
    "loader": 'loader = create_dataloader("data/")[0]',
    "dataset": 'dataset = create_dataloader("data/")[1]',
}
"""Name -> its typed declaration, added when a snippet uses the name before defining it."""

FENCE_OPEN = re.compile(r"^(\s*)```python\s*$")
FENCE_CLOSE = re.compile(r"^\s*```\s*$")
MYPY_LINE = re.compile(r"^(?P<file>[^:\s]+\.py):(?P<line>\d+): (?P<kind>error|note): (?P<msg>.*)$")


@dataclass(frozen=True)
class Snippet:
    """One ```python block: its doc (relative path), the doc line of its first code line, its code."""

    doc: str
    line: int
    code: str
    skip: bool

    @property
    def module(self) -> str:
        stem = re.sub(r"\W", "_", self.doc.removesuffix(".md"))
        return f"snippet_{stem}_L{self.line}"


def extract_snippets(text: str, doc: str) -> list[Snippet]:
    """Every ```python block of the Markdown ``text`` (fences may be indented; code is dedented)."""
    lines = text.splitlines()
    out: list[Snippet] = []
    i = 0
    while i < len(lines):
        if not FENCE_OPEN.match(lines[i]):
            i += 1
            continue
        before = [line.strip() for line in lines[:i] if line.strip()]
        skip = bool(before) and before[-1] == SKIP_MARKER
        end = i + 1
        while end < len(lines) and not FENCE_CLOSE.match(lines[end]):
            end += 1
        code = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        out.append(Snippet(doc, i + 2, code, skip))
        i = end + 1
    return out


def needed_declarations(code: str) -> list[str]:
    """Names of :data:`DECLARATIONS` that ``code`` reads before (or without) binding them."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []  # mypy reports the syntax error with its line
    first_load: dict[str, tuple[int, int]] = {}
    first_store: dict[str, tuple[int, int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            # On one line the right-hand side is read before the target is bound.
            where = (node.lineno, 1 if isinstance(node.ctx, ast.Store) else 0)
            table = first_store if isinstance(node.ctx, ast.Store) else first_load
            table[node.id] = min(table.get(node.id, where), where)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                first_store[name] = min(first_store.get(name, (node.lineno, 1)), (node.lineno, 1))
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            first_store[node.name] = min(first_store.get(node.name, (node.lineno, 1)), (node.lineno, 1))
    return [
        name
        for name in DECLARATIONS
        if name in first_load and (name not in first_store or first_load[name] < first_store[name])
    ]


def module_source(snippet: Snippet) -> tuple[str, int]:
    """The module mypy checks for ``snippet`` and the number of prelude lines before its code."""
    declared = "\n".join(DECLARATIONS[name] for name in needed_declarations(snippet.code))
    prelude = PRELUDE_IMPORTS + (declared + "\n" if declared else "") + "\n"
    return prelude + snippet.code, prelude.count("\n")


def mypy_config(root: Path, cache_dir: Path) -> Path:
    """A mypy ini file with the repo's options (minus ``files``) plus :data:`UNTYPED_DOC_IMPORTS`."""
    repo = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    modules = [m for o in repo.get("overrides", []) if o.get("ignore_missing_imports") for m in o["module"]]
    modules += [f"{name}.*" for name in UNTYPED_DOC_IMPORTS]
    lines = ["[mypy]", f"python_version = {repo.get('python_version', '3.11')}", "strict = True"]
    lines += ["warn_unused_ignores = False", f"cache_dir = {cache_dir}", ""]
    lines += [f"[mypy-{','.join(modules)}]", "ignore_missing_imports = True", ""]
    path = root / "mypy.ini"
    path.write_text("\n".join(lines))
    return path


def doc_errors(output: str, placed: dict[str, tuple[Snippet, int]]) -> list[str]:
    """mypy's ``file:line: error`` lines rewritten as ``doc:line: error`` (notes follow their error)."""
    found: list[str] = []
    for raw in output.splitlines():
        m = MYPY_LINE.match(raw.strip())
        if m is None:
            continue
        snippet, offset = placed[Path(m["file"]).stem]
        line = int(m["line"])
        where = (
            f"{snippet.doc}:{snippet.line + line - offset - 1}" if line > offset else f"{snippet.doc}:prelude"
        )
        found.append(f"{where}: {m['kind']}: {m['msg']}  (snippet at line {snippet.line})")
    return found


def all_snippets() -> list[Snippet]:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return [
        s for d in docs for s in extract_snippets(d.read_text(encoding="utf-8"), str(d.relative_to(REPO)))
    ]


# -- the convention itself ---------------------------------------------------------------------


def test_blocks_are_found_with_their_doc_lines_and_skip_markers() -> None:
    text = (
        "# T\n\n```python\nx = 1\n```\n\n<!-- snippet: skip -->\n\n```python\ny = (\n```\n"
        "- item\n\n  ```python\n  z = 2\n  ```\n```bash\nls\n```\n"
    )
    got = extract_snippets(text, "docs/t.md")
    assert [(s.line, s.code, s.skip) for s in got] == [
        (4, "x = 1\n", False),
        (10, "y = (\n", True),
        (15, "z = 2\n", False),
    ]
    assert got[0].module == "snippet_docs_t_L4"


def test_prelude_declares_only_names_read_before_they_are_bound() -> None:
    code = "model, optimizer = prepare(model, optimizer)\nfor batch in loader:\n    train_step(batch)\n"
    assert needed_declarations(code) == ["model", "optimizer", "train_step", "loader"]
    assert needed_declarations("loader, dataset = f()\nloader.state_dict()\n") == []
    source, offset = module_source(Snippet("README.md", 10, code, False))
    assert source.splitlines()[offset:] == code.splitlines()
    assert "model: torch.nn.Module" in source.splitlines()[:offset]


def test_mypy_errors_are_reported_at_the_doc_line() -> None:
    snippet = Snippet("docs/resume.md", 70, "a = 1\nb: str = a\n", False)
    placed = {snippet.module: (snippet, 12)}
    out = f"{snippet.module}.py:14: error: Incompatible types in assignment  [assignment]\nSuccess: no\n"
    assert doc_errors(out, placed) == [
        "docs/resume.md:71: error: Incompatible types in assignment  [assignment]  (snippet at line 70)"
    ]


# -- the docs ----------------------------------------------------------------------------------


def test_few_snippets_are_skipped() -> None:
    skipped = [f"{s.doc}:{s.line}" for s in all_snippets() if s.skip]
    assert len(skipped) <= MAX_SKIPPED, f"too many snippets marked {SKIP_MARKER!r}: {skipped}"


@pytest.mark.slow
def test_readme_and_docs_snippets_pass_mypy_strict(tmp_path: Path) -> None:
    snippets = [s for s in all_snippets() if not s.skip]
    assert len(snippets) >= 10, "the extractor found too few snippets"
    placed: dict[str, tuple[Snippet, int]] = {}
    for snippet in snippets:
        source, offset = module_source(snippet)
        (tmp_path / f"{snippet.module}.py").write_text(source)
        placed[snippet.module] = (snippet, offset)
    config = mypy_config(tmp_path, REPO / ".mypy_cache" / "doc-snippets")
    env = {**os.environ, "MYPYPATH": str(REPO / "src")}  # this checkout's library, not an installed one
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--no-error-summary", "--no-pretty",
         "--show-error-codes", *sorted(f"{m}.py" for m in placed)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    errors = sorted(doc_errors(done.stdout, placed), key=lambda e: (e.split(":")[0], int(e.split(":")[1])))
    assert not errors, "\n".join(errors)
    assert done.returncode == 0, done.stdout + done.stderr
