"""What each derived output is made from besides its input files: the part of the configuration that defines it.

A table is made from its runs' files (the rule's inputs) and from its definition: its spec in the paper file, the
labels of the methods and settings it names, the seeds, what stand-in data and models it has. The
``table``, ``figure``, ``scorecard``, ``evidence`` and ``report`` rules take the hash of exactly that definition as a param, so
editing a table's ``metric``, or renaming a method it shows, rebuilds that table (and what is made from it) and
nothing else; adding a paper or changing a training setting leaves the tables of other papers alone.
"""

from __future__ import annotations

from ..config import Project
from ..io import hash_obj
from .code_changes import changed_code
from .item import ReportItem, stand_in
from .scorecard import margin_of


def named(item: ReportItem, what: str) -> list[str]:
    """The method variants (``what="method"``) or settings (``"setting"``) a table or figure names: in its
    ``methods``/``settings`` list, its rows and columns, and (tables) the runs of its cells."""
    spec = item.spec
    names = list(spec.get(f"{what}s", []))
    for entry in [*spec.get("rows", []), *spec.get("columns", [])]:
        names += [entry[what]] if entry.get(what) else []
        names += list((entry.get(f"{what}s") or {}).values())
    if item.kind == "tables":
        names += [getattr(key, what) for key in item.project.plan.table_runs(item.paper, item.name, item.protocol)]
    return sorted(set(names))


def method_entries(project: Project, paper: str, methods) -> dict:
    """What a report shows of each method variant: its label and why it may not clear the learning bar."""
    entries = project.papers[paper]["methods"]
    return {m: {"label": entries[m].get("label", m), "bar_explanation": entries[m].get("bar_explanation")} for m in methods}


def setting_entries(project: Project, paper: str, settings) -> dict:
    entries = project.papers[paper]["settings"]
    return {s: {k: entries[s].get(k) for k in ("label", "dataset", "protocol")} for s in settings}


def item_definition(item: ReportItem) -> dict:
    """Everything a table or figure is built from that is not one of its input files."""
    project = item.project
    tables = project.papers[item.paper].get("tables", {})
    return {
        "kind": item.kind, "name": item.name, "protocol": item.protocol, "paper": item.paper,
        "spec": item.spec,
        "methods": method_entries(project, item.paper, named(item, "method")),
        "settings": setting_entries(project, item.paper, named(item, "setting")),
        "tables": {t: tables[t].get("title", t) for t in item.spec.get("tables", [])},   # figures drawn from tables
        "seeds": item.seeds,
        "stand_in": stand_in(project, item.paper),
        "learning_bar": bool(project.config.get("evidence")),     # table captions name the variants that may fall below it, and why
        **code_definition(item),
    }


def code_definition(item: ReportItem) -> dict:
    """A table's: its runs made by other code than the installed one, with what changed (a change of code makes the
    table again, whose caption then names them: :mod:`.code_changes`); nothing while there are none (a definition
    as it was before runs recorded their code), and nothing for a figure."""
    if item.kind != "tables":
        return {}
    changed = changed_code(item.project, item.project.plan.table_runs(item.paper, item.name, item.protocol))
    return {"code": changed} if changed else {}


def scorecard_definition(project: Project, paper: str) -> dict:
    """A scorecard: the tables it reads (under every protocol), the papers' titles, their stand-in data and models."""
    papers = list(project.papers) if paper == "all" else [paper]
    definition = {
        "paper": paper,
        "titles": {p: project.papers[p]["title"] for p in papers},
        "tables": [[protocol, p, table] for protocol, p, table in project.plan.tables() if p in papers],
        "stand_in": {p: stand_in(project, p) for p in papers},
        "margins": {f"{p}/{table}": margin_of(project, p, table) for _, p, table in project.plan.tables() if p in papers},
    }
    changed = changed_code(project, [k for protocol, p, table in definition["tables"]
                                     for k in project.plan.table_runs(p, table, protocol)])
    if changed:                 # runs made by other code (only then: a card of current runs keeps its definition)
        definition["code"] = changed
    if project.extension:       # the cells it adds are on the card too (only then: a plain card's definition stays)
        definition["extension"] = {f"{p}/{t}": {k: sorted(v) if isinstance(v, set) else v for k, v in added.items()}
                                   for (p, t), added in project.extension.added.items() if p in papers}
    return definition


def evidence_definition(project: Project) -> dict:
    """The evidence page: the learning bar, the runs it scores and how it names them."""
    runs: dict[str, dict] = {}
    for key in project.plan.runs():
        paper = runs.setdefault(key.paper, {"title": project.papers[key.paper]["title"], "methods": set(), "settings": set()})
        paper["methods"].add(key.method)
        paper["settings"].add(key.setting)
    return {
        "evidence": project.config.get("evidence"),
        "seeds": project.seeds,
        "protocols": project.protocols,
        "papers": {p: {"title": entry["title"], "methods": method_entries(project, p, sorted(entry["methods"])),
                       "settings": setting_entries(project, p, sorted(entry["settings"]))}
                   for p, entry in sorted(runs.items())},
    }


def report_definition(project: Project) -> dict:
    """The report: what is planned (it lists what is not built yet), the papers' titles and stand-ins, the labels of
    the methods it names and the figures' specs (their captions)."""
    from .overview import planned_outputs

    return {
        "planned": [o.path for o in planned_outputs(project)],
        "runs": len(project.plan.runs()),
        "seeds": project.seeds,
        "papers": {p: {"title": spec.get("title"), "stand_in": stand_in(project, p), "figures": spec.get("figures", {}),
                       "methods": method_entries(project, p, spec["methods"])}
                   for p, spec in project.papers.items()},
        "learning_bar": project.config.get("evidence"),
        "margins": {f"{p}/{table}": margin_of(project, p, table) for _, p, table in project.plan.tables()},   # its verdicts
    }


def definition_hash(definition: dict) -> str:
    return hash_obj(definition)
