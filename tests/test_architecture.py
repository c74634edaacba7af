"""The shape of the package stays as docs/ARCHITECTURE.md draws it: layers only point down, no import
circles, and the Snakemake workflow lints clean."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "fedrepro"

# package -> what it must never import (a lower layer never reaches up)
FORBIDDEN = {
    "data": ("fedrepro.fl", "fedrepro.methods", "fedrepro.models", "fedrepro.report", "fedrepro.train",
             "fedrepro.config", "fedrepro.embed", "fedrepro.downstream"),
    "models": ("fedrepro.fl", "fedrepro.methods", "fedrepro.report", "fedrepro.train", "fedrepro.features",
               "fedrepro.config", "fedrepro.embed", "fedrepro.downstream"),
    "fl": ("fedrepro.methods", "fedrepro.report", "fedrepro.train", "fedrepro.config", "fedrepro.embed"),
    "methods": ("fedrepro.report", "fedrepro.train", "fedrepro.config", "fedrepro.embed", "fedrepro.downstream"),
    "report": ("fedrepro.train", "fedrepro.fl.engine", "fedrepro.methods", "fedrepro.embed", "fedrepro.downstream"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every fedrepro module ``path`` imports, at module level or inside functions."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fedrepro")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("fedrepro"):
                # "from . import x" imports the submodule x
                found |= {f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target for a in node.names}
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / Path(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def test_layers_only_point_down(graph):
    wrong = []
    for module, targets in graph.items():
        layer = module.split(".")[1] if module.count(".") else ""
        for target in targets:
            if any(target == bad or target.startswith(bad + ".") for bad in FORBIDDEN.get(layer, ())):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports that reach up a layer:\n" + "\n".join(sorted(wrong))


def test_no_import_circles(graph):
    modules = set(graph)
    edges = {m: {t for t in targets if t in modules and t != m} for m, targets in graph.items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            # a package's __init__ importing its own submodules is not a circle of design
            if len(component) > 1 and not all(c.startswith(min(component, key=len)) for c in component):
                circles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_snakemake_lint_is_clean():
    result = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Congratulations, your workflow is in a good condition!" in output, output[-3000:]
