"""The report: one self-contained page (``<results>/report.html``) of whatever this configuration has built so far,
one table's worth or the whole grid, opening on what a reader came for.

Per paper, in this order: what ran (protocols, numerics, seeds, stand-in data and models, as the runs' own
``run_manifest.json`` record them), whether the published numbers reproduced (the scorecard's summary, in words),
whether every method learned (the learning bar's verdict, where the configuration sets one), the tables rendered
with their captions and the paper's rounding (the ``.md`` the table job wrote), then the figures; what is planned
but not built yet is listed with the command that builds it. The rule graph of the workflow comes last.

It reads only files that exist (nothing is required), so it is the one report that works on a partial build; the
``report`` rule runs it after bringing every existing table, figure and scorecard up to date.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import paths
from ..config import Project
from ..io import read_json, write_text
from ..registry import FIGURE_KINDS
from . import scorecard
from .html import data_uri, page, pipe_table
from .item import method_labels, stand_in, stand_in_warning


@dataclass(frozen=True)
class Output:
    """One planned table, figure or scorecard: where it is and whether it is there."""

    kind: str            # "table", "figure", "scorecard"
    protocol: str
    paper: str
    name: str
    path: str            # the Snakemake target

    @property
    def built(self) -> bool:
        return Path(self.path).exists()


def planned_outputs(project: Project) -> list[Output]:
    """Every table, figure and scorecard the configuration plans, in the order of the paper files."""
    out = [Output("table", protocol, paper, table, paths.table(protocol, paper, table))
           for protocol, paper, table in project.plan.tables()]
    out += [Output("figure", protocol, paper, figure, paths.figure(protocol, paper, figure))
            for protocol, paper, figure in project.plan.figures()]
    out += [Output("scorecard", "", paper, paper, paths.scorecard(paper)) for paper in project.papers]
    return out


def report_inputs(project: Project) -> list[str]:
    """What the report reads that exists now: the ``report`` rule's inputs (so Snakemake brings each up to date
    first, and builds nothing that is not there)."""
    files = []
    for item in planned_outputs(project):
        if item.built:
            files.append(item.path)
            if item.kind == "scorecard":
                files.append(paths.scorecard(item.paper, ".csv"))
    files += [paths.run_file(key, "run_manifest.json") for key in project.plan.runs()
              if Path(paths.run_file(key, "run_manifest.json")).exists()]
    if project.config.get("evidence") and Path(paths.evidence("bar.csv")).exists():
        files.append(paths.evidence("bar.csv"))
    return files


def build_command(project: Project, target: str) -> str:
    config = project.snakemake_config_args()
    return f"snakemake {target} --cores all" + (f" {config}" if config else "")


# ---- what ran ------------------------------------------------------------------------------------

def _count(values) -> str:
    """``Counter`` of values as "fp32 (12 runs), bf16 (3 runs)"."""
    return ", ".join(f"{v} ({n} run{'s' if n != 1 else ''})" for v, n in Counter(values).most_common())


def what_ran(project: Project, paper: str) -> list[str]:
    """Lines on the runs of ``paper`` that exist: per protocol how many of the planned, the seeds, and the
    numerics their manifests record (precision, the frozen encoder's, JPEG decoding, device)."""
    keys = [k for k in project.plan.runs() if k.paper == paper]
    done = [k for k in keys if Path(paths.run_file(k)).exists()]
    lines = []
    for protocol in dict.fromkeys(k.protocol for k in keys):
        planned = [k for k in keys if k.protocol == protocol]
        present = [k for k in done if k.protocol == protocol]
        what = "no test data used for selection or adaptation" if protocol == "clean" else "what the authors' code did"
        lines.append(f"Protocol {protocol} ({what}): {len(present)} of {len(planned)} planned runs done.")
    seeds = sorted({k.seed for k in done})
    lines.append(f"Seeds: {len(seeds)} of the {len(project.seeds)} configured ({', '.join(map(str, project.seeds))})"
                 + (f" have runs: {', '.join(map(str, seeds))}." if seeds else "; no run yet."))
    manifests = [read_json(p) for p in (paths.run_file(k, "run_manifest.json") for k in done) if Path(p).exists()]
    if manifests:
        variant = [m.get("variant") or {} for m in manifests]
        lines.append(f"Numerics: precision {_count(v.get('precision', '?') for v in variant)}"
                     + (f"; frozen encoder {_count(v['encoder_precision'] for v in variant if v.get('encoder_precision'))}"
                        if any(v.get("encoder_precision") for v in variant) else "")
                     + f"; large JPEGs {_count('DCT-scaled' if v.get('jpeg_draft') else 'decoded in full' for v in variant)}"
                     + f"; device {_count((m.get('hardware') or {}).get('device', '?') for m in manifests)}.")
    downstream = [paths.downstream(key, task) for key, task in project.plan.downstream_jobs().values() if key.paper == paper]
    if downstream:
        lines.append(f"Downstream evaluations: {sum(Path(d).exists() for d in downstream)} of {len(downstream)} done.")
    description = stand_in(project, paper)
    lines.append("Data and models: stand-ins for the paper's (the note above)." if description else
                 "Data and models: the paper's own (see docs/datasets.md).")
    return lines


# ---- did it reproduce, did it learn ---------------------------------------------------------------

def scorecard_summary(project: Project, paper: str) -> list[str]:
    csv = Path(paths.scorecard(paper, ".csv"))
    if not csv.exists():
        return [f"No scorecard yet: {build_command(project, paths.scorecard(paper))}"]
    card = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    return scorecard.summary_line(card, paper).splitlines() if len(card) else ["The paper's tables here have no published value to score."]


def evidence_verdict(project: Project, paper: str) -> list[str]:
    """The learning bar's verdict on the (setting, method) rows of ``paper`` (empty: no bar configured)."""
    if not project.config.get("evidence"):
        return []
    csv = Path(paths.evidence("bar.csv"))
    if not csv.exists():
        return [f"No learning-bar page yet: {build_command(project, paths.evidence())}"]
    from .evidence import read_bar, summary_table

    scores = read_bar(csv)
    rows = summary_table(scores[scores["paper"] == paper]) if (scores["paper"] == paper).any() else pd.DataFrame()
    if rows.empty:
        return ["No run of this paper on the learning-bar page yet."]
    labels = method_labels(project, paper, rows["method"])
    passed = rows["cleared"]
    explained = rows["explanation"] != ""
    lines = [f"{int(passed.sum())} of {len(rows)} (setting, method) rows clear the learning bar with every seed; "
             f"{int((~passed & explained).sum())} fall below it with the reason their paper file gives, "
             f"{int((~passed & ~explained).sum())} without one."]
    for r in rows[~passed].to_dict("records"):
        why = f" Its paper file says why: {r['explanation']}" if r["explanation"] else ""
        lines.append(f"Below the bar: {labels[r['method']]} on {r['setting']} ({r['protocol']}), measured "
                     f"{100 * r['mean']:.1f}% against a bar of {100 * r['bar']:.1f}% ({r['seeds passed']} seeds "
                     f"passed).{why}")
    return lines


# ---- tables and figures ---------------------------------------------------------------------------

def table_html(md: Path) -> str:
    """A table as its job wrote it (``<table>.md``: the caption line, then the pipe table) as an HTML table with
    that caption."""
    first, *rest = md.read_text().split("\n")
    match = re.match(r"\*\*(.+?)\*\*\s*(.*)", first)
    caption = (f"<b>{html.escape(match.group(1))}</b> {html.escape(match.group(2))}" if match else html.escape(first))
    return f"<p class='caption'>{caption}</p>{pipe_table(rest)}"


def figure_caption(project: Project, item: Output) -> str:
    spec = project.papers[item.paper]["figures"][item.name]
    doc = (FIGURE_KINDS.get(spec["kind"]).obj.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    parts = [f"<b>{html.escape(item.name)}.</b> {html.escape(spec.get('title', item.name))}.",
             f"Protocol: {html.escape(item.protocol)}."]
    if doc:
        parts.append(html.escape(doc))
    description = stand_in(project, item.paper)
    if description:
        parts.append(html.escape(stand_in_warning(description)))
    return " ".join(parts)


def paper_section(project: Project, paper: str, outputs: list[Output]) -> str:
    mine = [o for o in outputs if o.paper == paper]
    title = project.papers[paper].get("title", paper)
    parts = [f"<h2 id='{paper}'>{html.escape(title)}</h2>"]
    description = stand_in(project, paper)
    if description:
        parts.append(f"<p class='warning'>{html.escape(stand_in_warning(description))}</p>")
    parts.append("<h3>What ran</h3><ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in what_ran(project, paper))
                 + "</ul>")
    parts.append("<h3>Did the published numbers reproduce?</h3>"
                 + "".join(f"<p>{html.escape(line)}</p>" for line in scorecard_summary(project, paper)))
    verdict = evidence_verdict(project, paper)
    if verdict:
        parts.append("<h3>Did every method learn?</h3>" + "".join(f"<p>{html.escape(line)}</p>" for line in verdict))
    tables = [o for o in mine if o.kind == "table"]
    figures = [o for o in mine if o.kind == "figure"]
    if any(o.built for o in tables):
        parts.append("<h3>Tables</h3>" + "".join(table_html(Path(o.path)) for o in tables if o.built))
    if any(o.built for o in figures):
        parts.append("<h3>Figures</h3>" + "".join(
            f"<figure><img src='{data_uri(o.path)}' alt='{html.escape(o.name)}' style='max-width:100%'>"
            f"<figcaption>{figure_caption(project, o)}</figcaption></figure>" for o in figures if o.built))
    missing = [o for o in tables + figures if not o.built]
    if missing:
        parts.append(f"<h3>Not built yet ({len(missing)} of {len(tables) + len(figures)})</h3><ul>" + "".join(
            f"<li>{o.kind} {html.escape(o.name)} ({o.protocol}): <code>{html.escape(build_command(project, o.path))}</code></li>"
            for o in missing) + "</ul>")
    return "".join(parts)


# ---- the rule graph ------------------------------------------------------------------------------

def rule_graph_dot(configfiles: list[str] | None, timeout: int = 600) -> str | None:
    """``snakemake --rulegraph`` of ``all`` under this configuration (the DOT text), or None where Snakemake
    cannot say (it only reads; it runs inside a job too, Snakemake only warns about the lock)."""
    config = ["--configfile", *configfiles] if configfiles else []
    try:
        proc = subprocess.run([sys.executable, "-m", "snakemake", "--rulegraph", "--forceall", *config, "--", "all"],
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 and "digraph" in proc.stdout else None


def parse_rule_graph(dot: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(node id -> rule name, edges) of Snakemake's rule-graph DOT text."""
    nodes = dict(re.findall(r'^\s*(\d+)\[label = "([^"]+)"', dot, re.M))
    edges = re.findall(r"^\s*(\d+) -> (\d+)", dot, re.M)
    return nodes, [(a, b) for a, b in edges if a in nodes and b in nodes]


def draw_rule_graph(dot: str, out_png: Path) -> None:
    """The rules as boxes in layers (a rule one below the deepest rule it reads from), arrows from producer to
    consumer."""
    from .plotting import pyplot, save_figure

    nodes, edges = parse_rule_graph(dot)
    layer = {n: 0 for n in nodes}
    for _ in nodes:                               # longest path from the sources; the graph is small
        for a, b in edges:
            layer[b] = max(layer[b], layer[a] + 1)
    rows: dict[int, list[str]] = {}
    for n in sorted(nodes, key=lambda n: (layer[n], nodes[n])):
        rows.setdefault(layer[n], []).append(n)
    width = max(len(r) for r in rows.values())
    where: dict[str, tuple[float, float]] = {}
    for depth in sorted(rows):                     # each rule under the mean place of what it reads (fewer crossings)
        parents = {n: [where[a][0] for a, b in edges if b == n and a in where] for n in rows[depth]}
        row = sorted(rows[depth], key=lambda n: sum(parents[n]) / len(parents[n]) if parents[n] else 0.0)
        where.update({n: ((i + 1) / (len(row) + 1) * width, -depth) for i, n in enumerate(row)})
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 1.8 * width), 0.9 * len(rows) + 0.6))
    for a, b in edges:
        ax.annotate("", xy=where[b], xytext=where[a],
                    arrowprops={"arrowstyle": "->", "color": "grey", "shrinkA": 11, "shrinkB": 11})
    for n, (x, y) in where.items():
        ax.text(x, y, nodes[n], ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round", "facecolor": "#e8f0fe", "edgecolor": "#4a6fa5"})
    ax.set_xlim(0, width + 0.5)
    ax.set_ylim(-len(rows) + 0.5, 0.5)
    ax.axis("off")
    save_figure(fig, out_png)
    plt.close(fig)


# ---- the page ------------------------------------------------------------------------------------

def render(project: Project, rule_graph_png: Path | None = None) -> str:
    outputs = planned_outputs(project)
    runs = project.plan.runs()
    done = sum(Path(paths.run_file(k)).exists() for k in runs)
    kinds = {kind: [o for o in outputs if o.kind == kind] for kind in ("table", "figure", "scorecard")}
    built = "; ".join(f"{sum(o.built for o in items)} of {len(items)} {kind}s" for kind, items in kinds.items())
    config = ", ".join(project.configfiles) if project.configfiles else "config/config.yaml"
    head = ["<h1>fedrepro report</h1>",
            f"<p>Configuration: {html.escape(config)}. Written {time.strftime('%Y-%m-%d %H:%M')}. Built so far: "
            f"{done} of {len(runs)} training runs; {built}. This page shows what exists; what is planned but not built "
            f"is listed under each paper with the command that builds it.</p>",
            "<p>Contents: " + ", ".join(f"<a href='#{p}'>{html.escape(p)}</a>" for p in project.papers)
            + ", <a href='#rulegraph'>rule graph</a>.</p>"]
    body = head + [paper_section(project, paper, outputs) for paper in project.papers]
    body.append("<h2 id='rulegraph'>How it is built: the rule graph</h2>")
    if rule_graph_png is not None and Path(rule_graph_png).exists():
        body.append(f"<figure><img src='{data_uri(rule_graph_png)}' alt='rule graph' style='max-width:100%'>"
                    "<figcaption>The workflow's rules for this configuration (<code>snakemake --rulegraph</code>): "
                    "an arrow goes from the rule that writes a file to the rule that reads it.</figcaption></figure>")
    else:
        body.append("<p>Not drawn (Snakemake could not be asked for it here): <code>snakemake --rulegraph "
                    "--forceall all</code> prints it.</p>")
    return page("fedrepro report", "".join(body))


def write(project: Project, out: str | Path, rule_graph: str | None = None) -> None:
    """Write the report to ``out``; ``rule_graph``: Snakemake's rule-graph DOT text, drawn last."""
    out = Path(out)
    png = None
    if rule_graph:
        png = out.with_name(f".{out.stem}.rulegraph.png")
        draw_rule_graph(rule_graph, png)
    try:
        write_text(out, render(project, png))
    finally:
        for path in (png, png.with_suffix(".pdf")) if png else ():
            path.unlink(missing_ok=True)
