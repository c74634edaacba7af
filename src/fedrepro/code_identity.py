"""Which code made a run: the fedrepro version and commit, and per registered component the run uses (its method,
model family and dataset, built in or from a plug-in) a digest of the source that defines it.

A component's code is the part of its modules it uses: the class that defines it and its base classes inside
fedrepro or the plug-in's own package (FedAvgM of the example plug-in: ``FedAvgM`` in ``fedrepro_fedavgm.fedavgm``,
``ModelAveraging`` and ``FederatedMethod`` in ``fedrepro.fl.method``; a dataset: its preparer), and every top-level
definition of those modules they name, as far as those name others (a helper function, a constant, a class, an
import). Another class or function of the same module is not part of it: editing the CLIP families of
``fedrepro.models.families`` leaves the code of the timm classifier family, which shares their module and base class,
as it was. Each module's digest is the SHA-256 of that part's syntax tree with every docstring left out, in a form of
our own that names each node and its non-empty fields: a comment, a docstring, blank lines or a re-wrapped line
change nothing, and neither does a Python release that only adds fields to the tree. A component from a plug-in
also records the plug-in, its distribution and version.

:func:`run_code` is what a run manifest records (``code``); :func:`code_changes` compares such a record with the code
installed now. A run's method and model family are compared (they are what trains); its dataset is recorded only,
since what a preparer makes is compared through the manifest's own SHA-256 (:mod:`fedrepro.report.consistency`).
A plug-in's version is compared too: a change in a helper module the digests do not cover is seen once the version
is bumped. fedrepro's own version and commit are recorded, never compared: upgrading fedrepro marks a run as made by
other code only where the code of its own components changed.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import sys
from pathlib import Path

# the components of a run whose code decides its numbers (compared), and the one recorded beside them
COMPARED = ("method", "model family")
RECORDED = (*COMPARED, "dataset")


def _canonical(node) -> str:
    """A syntax tree as text: each node's type and its non-empty fields (positions and empty fields left out)."""
    if isinstance(node, ast.AST):
        return type(node).__name__ + "(" + ",".join(
            f"{name}={_canonical(value)}" for name in node._fields
            if (value := getattr(node, name, None)) is not None and not (isinstance(value, list) and not value)) + ")"
    if isinstance(node, list):
        return "[" + ",".join(map(_canonical, node)) + "]"
    return repr(node)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def _bound_names(node: ast.stmt) -> list[str]:
    """The names a top-level statement binds (a def, a class, an assignment, an import, or any of these inside an
    ``if``/``try``/``with`` at the top)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    names = []
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
            names.append(inner.id)
        elif inner is not node and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                     ast.Import, ast.ImportFrom)):
            names += _bound_names(inner)
    return names


def _used(tree: ast.Module, roots) -> list[ast.stmt] | None:
    """The top-level statements of ``tree`` that bind ``roots`` and, transitively, every top-level name they use, in
    the module's order; None where a root is not defined at the top (a class made inside a function)."""
    binders: dict[str, list[ast.stmt]] = {}
    for node in tree.body:
        for name in _bound_names(node):
            binders.setdefault(name, []).append(node)
    if any(root not in binders for root in roots):
        return None
    chosen: set[int] = set()
    todo, seen = list(roots), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in binders.get(name, []):
            if id(node) not in chosen:
                chosen.add(id(node))
                todo += [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
    return [node for node in tree.body if id(node) in chosen]


def source_digest(source: str | ast.Module, roots=None) -> str:
    """SHA-256 of a module's source as code (comments, docstrings and layout do not count); with ``roots`` (top-level
    names), of the part of it they use only (:func:`_used`; the whole module where one is not at the top).
    ``source`` may be the module's syntax tree without docstrings (:func:`_tree`)."""
    tree = source if isinstance(source, ast.Module) else _without_docstrings(ast.parse(source))
    part = _used(tree, roots) if roots else None
    return hashlib.sha256(_canonical(tree if part is None else part).encode()).hexdigest()


_TREES: dict[tuple[str, int, int], ast.Module] = {}     # a file's version -> its tree without docstrings
_DIGESTS: dict[tuple, str | None] = {}


def _tree(path: str, version: tuple[str, int, int]) -> ast.Module:
    if version not in _TREES:
        _TREES[version] = _without_docstrings(ast.parse(Path(path).read_text(encoding="utf-8")))
    return _TREES[version]


def module_digest(module: str, roots=None) -> str | None:
    """:func:`source_digest` of an imported module's file, of the part ``roots`` use (cached per version of the file);
    None where its source cannot be read (a module made in memory, a compiled extension)."""
    try:
        path = inspect.getsourcefile(sys.modules[module])
        stat = Path(path).stat() if path else None
    except (KeyError, TypeError, OSError):
        return None
    if stat is None:
        return None
    version = (str(path), stat.st_mtime_ns, stat.st_size)
    key = (*version, tuple(sorted(roots or ())))
    if key not in _DIGESTS:
        try:
            _DIGESTS[key] = source_digest(_tree(path, version), roots)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            return None
    return _DIGESTS[key]


def defining_modules(obj, origin: str | None) -> dict[str, list[str]]:
    """The modules whose code is ``obj``'s, each with the top-level names that define it there: its own and, for a
    class, those of its base classes in fedrepro or in the plug-in ``origin``'s package (not the standard library's
    or torch's)."""
    def ours(module: str) -> bool:
        top = module.split(".")[0]
        return top == "fedrepro" or (origin is not None and top == origin)

    out: dict[str, list[str]] = {}
    for c in obj.__mro__ if inspect.isclass(obj) else (obj,):
        module = getattr(c, "__module__", None)
        if module and ours(module):
            out.setdefault(module, []).append(c.__qualname__.split(".")[0])
    return out


def component(kind: str, name: str) -> dict:
    """The code identity of the ``kind`` (method, model family, dataset) registered as ``name``, as installed now."""
    from .registry import DATASETS, METHODS, MODELS, PREPARERS, plugin_distribution

    registry = {"method": METHODS, "model family": MODELS, "dataset": DATASETS}[kind]
    entry = registry.get(name)
    obj = entry.obj
    if kind == "dataset":           # a declaration: its code is the preparer that turns its files into a manifest
        obj = PREPARERS.get(obj.prepare).obj
    origin = entry.origin if entry.origin != "config" else None
    out = {"name": name, "modules": {m: module_digest(m, roots) for m, roots in defining_modules(obj, origin).items()}}
    if entry.origin is not None:
        dist = plugin_distribution(entry.origin) if origin else None
        out.update(plugin=entry.origin, distribution=dist[0] if dist else None, version=dist[1] if dist else None)
    return out


def components(run: dict, kinds=RECORDED) -> dict[str, dict]:
    """The components ``kinds`` (default: every recorded one) of a resolved run config."""
    names = {"method": run["algorithm"]["name"], "model family": run["train"]["model"]["family"],
             "dataset": run["dataset"]}
    return {kind: component(kind, names[kind]) for kind in kinds}


def fedrepro_code() -> dict:
    """fedrepro's version and, where it is imported from a git checkout, its commit (and whether files differ)."""
    from importlib import metadata

    from .provenance import git_state

    try:
        version = metadata.version("fedrepro")
    except metadata.PackageNotFoundError:
        from . import __version__ as version
    root = Path(__file__).resolve().parents[2]       # src/fedrepro/ of a checkout -> the checkout
    state = git_state(root) if (root / ".git").exists() else {"commit": None, "dirty": None}
    return {"version": version, **state}


def run_code(run: dict) -> dict:
    """What a run manifest records as ``code``: fedrepro's version and commit, and every component's identity."""
    return {"fedrepro": fedrepro_code(), "components": components(run)}


def fingerprint(identity: dict) -> str:
    """One short digest of a component's identity (what a report's definition and a memory profile's key hold)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def code_changes(recorded: dict | None, now: dict[str, dict]) -> list[str] | None:
    """How the code of a run's method and model family differs from what is installed (``now``: :func:`components`
    of its config): one phrase each; [] when it is the same; None when the run recorded no code (made before fedrepro
    recorded it, or without a readable source): unknown, never counted as changed."""
    if not recorded or "components" not in recorded:
        return None
    changes = []
    for kind in COMPARED:
        then, current = recorded["components"].get(kind), now[kind]
        if then is None:
            return None
        what = f"{kind} {current['name']}"
        if then.get("plugin") != current.get("plugin"):
            changes.append(f"{what}: {_maker(then)} then, {_maker(current)} now")
            continue
        if then.get("version") != current.get("version"):
            changes.append(f"{what}: {then.get('distribution') or then.get('plugin')} {then.get('version')} then, "
                           f"{current.get('version')} now")
        before, installed = then["modules"], current["modules"]
        if None in before.values() or None in installed.values():
            return None             # a source that could not be read, then or now: nothing can be said
        changed = [m for m in dict.fromkeys([*before, *installed]) if before.get(m) != installed.get(m)]
        if changed:
            changes.append(f"{what}: {', '.join(changed)} changed")
    return changes


def _maker(identity: dict) -> str:
    return f"plug-in {identity['plugin']}" if identity.get("plugin") else "built in"
