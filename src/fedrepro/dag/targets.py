"""Which jobs building one file needs, found the way the rules find them (the configuration's tables, figures and
runs; a figure's declared inputs, :meth:`~fedrepro.dag.Dag.figure_files`), without planning the DAG. A target is a
file ``snakemake`` builds (a table, figure, scorecard, a run's file, a downstream result) or ``all``;
``fedrepro estimate <target>`` prices what :func:`resolve` finds (:mod:`fedrepro.cost.estimate`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .. import paths
from ..config import ConfigError, did_you_mean

# what each report rule writes, by the name its rule gives the file (workflow/rules/report.smk binds these)
# (a table's and a scorecard's record, written last: the digests of its files and of what it was made from)
TABLE_FILES = {"md": ".md", "csv": ".csv", "tex": ".tex", "seeds": ".seeds.csv", "provenance": paths.provenance(".md")}
FIGURE_FILES = {"png": ".png", "pdf": ".pdf"}
SCORECARD_FILES = {"html": ".html", "md": ".md", "csv": ".csv", "png": ".png", "pdf": ".pdf",
                   "provenance": paths.provenance(".html")}


def table_outputs(protocol: str, paper: str, table: str) -> dict[str, str]:
    return {name: paths.table(protocol, paper, table, suffix) for name, suffix in TABLE_FILES.items()}


def figure_outputs(protocol: str, paper: str, figure: str) -> dict[str, str]:
    return {name: paths.figure(protocol, paper, figure, suffix) for name, suffix in FIGURE_FILES.items()}


def scorecard_outputs(paper: str) -> dict[str, str]:
    return {name: paths.scorecard(paper, suffix) for name, suffix in SCORECARD_FILES.items()}


@dataclass
class Target:
    path: str
    what: str
    runs: list = field(default_factory=list)              # RunKeys
    downstream: list = field(default_factory=list)        # (RunKey, task)
    embeds: list = field(default_factory=list)            # (RunKey, figure)


def _table_needs(dag, protocol: str, paper: str, table: str) -> tuple[list, list]:
    plan = dag.project.plan
    return plan.table_runs(paper, table, protocol), plan.table_downstream(paper, table, protocol)


def _figure_needs(dag, protocol: str, paper: str, figure: str) -> tuple[list, list]:
    embeds = []
    for path in dag.figure_files(protocol, paper, figure):
        key = paths.run_key_of(path)
        if key is not None and path == paths.embedding(key, figure):
            embeds.append((key, figure))
    return dag.project.plan.figure_runs(paper, figure, protocol), embeds


def _union(*lists) -> list:
    return list(dict.fromkeys(x for items in lists for x in items))


def candidates(dag) -> dict[str, callable]:
    """Target path -> a function giving its Target (every file ``snakemake`` can be asked for here)."""
    plan = dag.project.plan
    out: dict[str, callable] = {}
    for protocol, paper, table in plan.tables():
        def make(protocol=protocol, paper=paper, table=table, path=None):
            runs, downstream = _table_needs(dag, protocol, paper, table)
            return Target(path, f"table {table} of {paper} ({protocol} protocol)", runs, downstream)
        for path in table_outputs(protocol, paper, table).values():
            out[path] = make
    for protocol, paper, figure in plan.figures():
        def make(protocol=protocol, paper=paper, figure=figure, path=None):
            runs, embeds = _figure_needs(dag, protocol, paper, figure)
            return Target(path, f"figure {figure} of {paper} ({protocol} protocol)", runs, embeds=embeds)
        for path in figure_outputs(protocol, paper, figure).values():
            out[path] = make
    for paper in [*dag.project.papers, "all"]:
        def make(paper=paper, path=None):
            tables = [t for t in plan.tables() if paper == "all" or t[1] == paper]
            needs = [_table_needs(dag, *t) for t in tables]
            return Target(path, f"scorecard of {'every paper' if paper == 'all' else paper}",
                          _union(*(n[0] for n in needs)), _union(*(n[1] for n in needs)))
        for path in scorecard_outputs(paper).values():
            out[path] = make
    for key in plan.runs():
        def make(key=key, path=None):
            return Target(path, f"run {key.path}", [key])
        for name in paths.RUN_FILES:
            out[paths.run_file(key, name)] = make
        out[paths.run_dir(key)] = make
        out[paths.model_file(key)] = make
    for key, task in dag.downstream_jobs.values():
        out[paths.downstream(key, task)] = lambda key=key, task=task, path=None: Target(
            path, f"downstream evaluation {task} of {key.path}", [key], [(key, task)])
    return out


def everything(dag) -> Target:
    plan = dag.project.plan
    figures = [_figure_needs(dag, *f) for f in plan.figures()]
    return Target("all", "every output of the configuration", plan.runs(),
                  list(dag.downstream_jobs.values()), _union(*(f[1] for f in figures)))


def resolve(dag, target: str) -> Target:
    """The Target of a file name as ``snakemake`` is given it, or a ConfigError with the closest names."""
    name = os.path.normpath(target)
    if name == "all":
        return everything(dag)
    found = candidates(dag)
    if name in found:
        return found[name](path=name)
    raise ConfigError(f"{target} is not a target of this configuration{did_you_mean(name, found, n=3)} (targets: "
                      f"{paths.table('<protocol>', '<paper>', '<table>')}, "
                      f"{paths.figure('<protocol>', '<paper>', '<figure>')}, {paths.scorecard('<paper>')}, a run's "
                      f"files, or all; fedrepro validate counts them)")
