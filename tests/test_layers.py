"""One-way layers: no module imports a higher layer, discovery and io never import each other,
and no import cycle exists anywhere in the package (imports inside functions and
``TYPE_CHECKING`` blocks count too: a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "torch_dataloader_utils"

# Bottom to top. A module belongs to the layer of its longest matching prefix.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "storage.redact", "upstream"),  # leaves: errors; redaction; third-party private APIs
    ("plan",),  # pure planning (stdlib + numpy; tests/plan/test_purity.py)
    ("config", "compat"),  # config objects; 0.2.0 names adapted onto them
    ("storage",),  # filesystems, ranged fetch, footers, record scanning, shared metadata types
    # metadata; data; conversion (and sequence packing); batches across processes
    ("discovery", "io", "convert", "packing", "transfer"),
    ("runtime",),  # the only package touching torch.utils.data / torch.distributed
    ("", "cli", "__main__", "splits", "tools", "lightning"),  # the public top level, command line,
    # 0.2.0 paths, the Lightning data module (an optional extra over runtime/)
)
SEPARATE = {frozenset({"discovery", "io"})}
"""Packages of one layer that must not import each other (shared parts go to storage/)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every ``torch_dataloader_utils.*`` module ``path`` imports, wherever the import is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == PACKAGE:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
    return found


def package_graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in (SRC / PACKAGE).rglob("*.py")}


def _inside(module: str) -> str:
    return module[len(PACKAGE) + 1 :] if module != PACKAGE else ""


def layer_of(module: str) -> tuple[int, str]:
    """``(layer index, matched prefix)`` of a module of the package."""
    inner = _inside(module)
    best: tuple[int, str] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = inner == prefix or (prefix and inner.startswith(prefix + "."))
            if matches and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    if best is None:
        raise AssertionError(f"module {module} is in no layer of tests/test_layers.py: add it to LAYERS")
    return best


def violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Upward imports and imports between separated siblings, as messages."""
    out = []
    for importer, imported in sorted(graph.items()):
        low, low_prefix = layer_of(importer)
        for target in sorted(imported):
            high, high_prefix = layer_of(target)
            top_a, top_b = low_prefix.split(".")[0], high_prefix.split(".")[0]
            if high > low:
                out.append(
                    f"{importer} (layer {low}: {LAYERS[low]}) imports {target} from the higher layer "
                    f"{high} ({LAYERS[high]}): move the shared part down or the importer up"
                )
            elif frozenset({top_a, top_b}) in SEPARATE:
                out.append(
                    f"{importer} imports {target}: {top_a}/ and {top_b}/ are siblings that must not "
                    "import each other; move what both need to storage/"
                )
    return out


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_upward_imports_and_siblings_stay_apart() -> None:
    problems = violations(package_graph())
    assert not problems, "\n".join(problems)


def test_no_import_cycles() -> None:
    found = cycles(package_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_module_has_a_layer() -> None:
    for module in package_graph():
        layer_of(module)


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({f"{PACKAGE}.plan.x": {f"{PACKAGE}.runtime.y"}, f"{PACKAGE}.runtime.y": set()}, "higher layer"),
        ({f"{PACKAGE}.discovery.a": {f"{PACKAGE}.io.b"}, f"{PACKAGE}.io.b": set()}, "siblings"),
        (
            {f"{PACKAGE}.storage.fs": {f"{PACKAGE}.discovery.a"}, f"{PACKAGE}.discovery.a": set()},
            "higher layer",
        ),
    ],
)
def test_the_check_catches_planted_violations(graph: dict[str, set[str]], expected: str) -> None:
    problems = violations(graph)
    assert problems
    assert expected in problems[0]


def test_the_check_catches_a_planted_cycle() -> None:
    a, b, c = (f"{PACKAGE}.runtime.{n}" for n in "abc")
    assert cycles({a: {b}, b: {c}, c: {a}}) == [sorted([a, b, c])]
    assert cycles({a: {b}, b: set(), c: {a}}) == []
