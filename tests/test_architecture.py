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
             "fedrepro.config", "fedrepro.embed", "fedrepro.downstream", "fedrepro.cost", "fedrepro.dag"),
    "models": ("fedrepro.fl", "fedrepro.methods", "fedrepro.report", "fedrepro.train", "fedrepro.features",
               "fedrepro.config", "fedrepro.embed", "fedrepro.downstream", "fedrepro.cost", "fedrepro.dag"),
    "fl": ("fedrepro.methods", "fedrepro.report", "fedrepro.train", "fedrepro.config", "fedrepro.embed",
           "fedrepro.cost", "fedrepro.dag"),
    "methods": ("fedrepro.report", "fedrepro.train", "fedrepro.config", "fedrepro.embed", "fedrepro.downstream",
                "fedrepro.cost", "fedrepro.dag"),
    "report": ("fedrepro.train", "fedrepro.fl.engine", "fedrepro.methods", "fedrepro.embed", "fedrepro.downstream",
               "fedrepro.dag", "fedrepro.cost"),
    "cost": ("fedrepro.methods", "fedrepro.report", "fedrepro.train", "fedrepro.config", "fedrepro.embed",
             "fedrepro.downstream", "fedrepro.dag", "fedrepro.cli"),
    "dag": ("fedrepro.cli", "fedrepro.forkserver", "fedrepro.train", "fedrepro.features", "fedrepro.downstream"),
}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


STRING_IMPORTS = {"import_module", "__import__"}     # importlib.import_module("x"), import_module("x"), __import__("x")


def _strings(node: ast.AST, constants: dict[str, list[str]]) -> list[str]:
    """The module names an argument can be, where they can be read without running the code: a literal, an
    f-string of literals and such names, or a name bound to literals (a module-level constant, a loop over a tuple)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        return constants.get(node.id, [])
    if isinstance(node, ast.JoinedStr):
        out = [""]
        for part in node.values:
            options = _strings(part.value if isinstance(part, ast.FormattedValue) else part, constants)
            if not options:
                return []
            out = [a + b for a in out for b in options]
        return out
    return []


def _constants(tree: ast.AST) -> dict[str, list[str]]:
    """Names bound to string literals anywhere in the file: ``NAME = "..."`` and ``for name in ("...", ...)``."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                found.setdefault(node.targets[0].id, []).append(node.value.value)
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, (ast.Tuple, ast.List)):
            found.setdefault(node.target.id, []).extend(
                e.value for e in node.iter.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return found


def imports_of(path: Path, package: Path = PACKAGE) -> set[str]:
    """Every module of ``package`` that ``path`` imports, at module level or inside functions: import statements,
    and calls of ``importlib.import_module``, ``import_module`` or ``__import__`` with a name that can be read."""
    root = package.name
    name = module_name(path, package)
    parent = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    constants = _constants(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name == root or a.name.startswith(root + ".")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parent.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == root or target.startswith(root + "."):
                # "from . import x" imports the submodule x
                found |= {f"{target}.{a.name}" if _is_module(f"{target}.{a.name}", package) else target
                          for a in node.names}
        elif isinstance(node, ast.Call) and node.args:
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in STRING_IMPORTS:
                found |= {m for m in _strings(node.args[0], constants) if m == root or m.startswith(root + ".")}
    return found


def _is_module(name: str, package: Path = PACKAGE) -> bool:
    path = package.parent / Path(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    return {module_name(p, package): imports_of(p, package) for p in package.rglob("*.py")}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_layers_only_point_down(graph):
    wrong = []
    for module, targets in graph.items():
        layer = module.split(".")[1] if module.count(".") else ""
        for target in targets:
            if any(target == bad or target.startswith(bad + ".") for bad in FORBIDDEN.get(layer, ())):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports that reach up a layer:\n" + "\n".join(sorted(wrong))


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (module -> the modules it imports): Tarjan's strongly connected components
    of more than one module, less a package's __init__ importing its own submodules."""
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
    return circles


def test_no_import_circles(graph):
    circles = import_circles(graph)
    assert not circles, f"import circles: {circles}"


def test_an_import_by_name_is_read_and_its_circle_found(tmp_path):
    """A circle closed by importing a module by its name (the registry once loaded data/folder.py so) is a circle:
    the checker reads literal names, f-strings of them and names bound to them, as `import` statements."""
    package = tmp_path / "pkg"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / "__init__.py").write_text("")
    (package / "registry.py").write_text("import importlib\n\n\ndef load():\n"
                                         "    importlib.import_module(\"pkg.data.folder\").declare()\n")
    (package / "data" / "folder.py").write_text("from ..registry import load\n")
    assert import_circles(import_graph(package)) == [["pkg.data.folder", "pkg.registry"]]
    for call in ('from importlib import import_module\nimport_module(f"pkg.{PART}.folder")\nPART = "data"\n',
                 '__import__(name)\nfor name in ("os", "pkg.data.folder"):\n    pass\n'):
        (package / "registry.py").write_text(call)
        assert import_circles(import_graph(package)) == [["pkg.data.folder", "pkg.registry"]], call
    (package / "registry.py").write_text("import importlib\n\n\ndef load(name):\n    importlib.import_module(name)\n")
    assert import_circles(import_graph(package)) == []


def test_snakemake_lint_is_clean():
    result = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Congratulations, your workflow is in a good condition!" in output, output[-3000:]
