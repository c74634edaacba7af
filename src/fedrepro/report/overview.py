"""The report: one self-contained page (``<results>/report.html``) of whatever this configuration has built so far,
one table's worth or the whole grid, opening on what a reader came for.

It opens on the answer: one summary table across the papers (:func:`summary`), whose first screen says per paper
what data it ran on (the paper's, or stand-ins), per table whether its published numbers reproduced (the
scorecard's equivalence verdict, :mod:`fedrepro.report.scorecard`; no verdict on stand-in data; "not built" with the
command), and whether every method learned (the learning bar, where the configuration sets one), each paper linked to
its section. Per paper, in this order: what stands in (once), what ran (protocols, numerics, seeds, as the runs' own
``run_manifest.json`` record them), whether the published numbers reproduced (in words), whether every method
learned, the tables rendered with their captions and the paper's rounding (the ``.md`` the table job wrote, linking
its per-seed values), then the figures; what is planned but not built yet is listed with the command that builds it.
The rule graph of the workflow comes last.

It reads only files that exist (nothing is required), so it is the one report that works on a partial build; the
``report`` rule runs it after bringing every existing table, figure and scorecard up to date.
"""

from __future__ import annotations

import html
import os
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
from .html import data_uri, inline, page, pipe_table
from .item import method_labels, run_name, short_title, stand_in, stand_in_warning
from .stats import PLUS_MINUS


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

def built_card(project: Project, paper: str) -> pd.DataFrame:
    """The scorecard of ``paper``'s tables that are built (the same verdicts as its scorecard page)."""
    return scorecard.project_card(project, [paper], built_only=True)


def scorecard_summary(project: Project, paper: str) -> list[str]:
    card = built_card(project, paper)
    if not any(Path(o.path).exists() for o in planned_outputs(project) if o.paper == paper and o.kind == "table"):
        return ["No table of this paper is built yet."]
    lines = scorecard.summary_line(card, short_title(project, paper)).splitlines() if len(card) else \
        ["The paper's tables built here have no published value to score."]
    if not stand_in(project, paper) and len(card):
        lines.append(f"Equivalence margin: {margin_summary(project, paper)} (docs/reading-results.md).")
    return lines


def margin_summary(project: Project, paper: str) -> str:
    margins = {scorecard.margin_words(scorecard.margin_of(project, paper, t)) for t in project.papers[paper].get("tables", {})}
    return "; ".join(sorted(margins))


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


def learning_cell(project: Project, paper: str) -> tuple[str, str]:
    """(text, colour class) of the summary's "did every method learn?" for ``paper``."""
    if not project.config.get("evidence"):
        return "no learning bar in this configuration", "none"
    csv = Path(paths.evidence("bar.csv"))
    if not csv.exists():
        return "not built yet", "none"
    from .evidence import read_bar, summary_table

    scores = read_bar(csv)
    rows = summary_table(scores[scores["paper"] == paper]) if (scores["paper"] == paper).any() else pd.DataFrame()
    if rows.empty:
        return "no run yet", "none"
    cleared = int(rows["cleared"].sum())
    below = len(rows) - cleared
    text = f"{cleared} of {len(rows)} clear the bar"
    if below:
        reasoned = int((~rows["cleared"] & (rows["explanation"] != "")).sum())
        text += f"; {below} below ({reasoned} with a reason on file)"
    return text, "good" if not below else "bad" if below > reasoned else "mixed"


# ---- tables and figures ---------------------------------------------------------------------------

def table_html(md: Path, drop: str = "") -> str:
    """A table as its job wrote it (``<table>.md``: the caption line, then the pipe table) as an HTML table with
    that caption, its link to the per-seed values pointing at the file beside the table; ``drop``: a sentence the
    caption has that the page says once above (the paper's stand-in note)."""
    first, *rest = md.read_text().split("\n")
    match = re.match(r"\*\*(.+?)\*\*\s*(.*)", first)
    name, text = (match.group(1), match.group(2)) if match else ("", first)
    text = text.replace(drop, "").replace("  ", " ") if drop else text
    folder = Path(os.path.relpath(md.parent, Path(paths.report()).parent)).as_posix()
    text = re.sub(r"\]\(([^)/]+\.seeds\.csv)\)", lambda m: f"]({folder}/{m.group(1)})", text)
    caption = (f"<b>{html.escape(name)}</b> " if name else "") + inline(text)
    return f"<p class='caption'>{caption}</p>{pipe_table(rest)}"


def figure_caption(project: Project, item: Output) -> str:
    spec = project.papers[item.paper]["figures"][item.name]
    doc = (FIGURE_KINDS.get(spec["kind"]).obj.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    parts = [f"<b>{html.escape(item.name)}.</b> {html.escape(spec.get('title', item.name))}.",
             f"Protocol: {html.escape(item.protocol)}."]
    if doc:
        parts.append(html.escape(doc))
    return " ".join(parts)


def paper_section(project: Project, paper: str, outputs: list[Output]) -> str:
    mine = [o for o in outputs if o.paper == paper]
    title = project.papers[paper].get("title", paper)
    parts = [f"<h2 id='{paper}'>{html.escape(title)} <a class='top' href='#summary'>(summary)</a></h2>"]
    description = stand_in(project, paper)
    if description:
        parts.append(f"<p class='warning'>{html.escape(stand_in_warning(description))}</p>")
    parts.append("<h3>What ran</h3><ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in what_ran(project, paper))
                 + "</ul>")
    card = Path(paths.scorecard(paper))
    link = (f" <a href='{Path(os.path.relpath(card, Path(paths.report()).parent)).as_posix()}'>The scorecard, cell by "
            f"cell</a>." if card.exists() else "")
    lines = scorecard_summary(project, paper)
    parts.append("<h3>Did the published numbers reproduce?</h3>"
                 + "".join(f"<p>{html.escape(line)}{link if i == len(lines) - 1 else ''}</p>" for i, line in enumerate(lines)))
    verdict = evidence_verdict(project, paper)
    if verdict:
        parts.append("<h3>Did every method learn?</h3>" + "".join(f"<p>{html.escape(line)}</p>" for line in verdict))
    tables = [o for o in mine if o.kind == "table"]
    figures = [o for o in mine if o.kind == "figure"]
    if any(o.built for o in tables):
        drop = stand_in_warning(description) if description else ""
        parts.append("<h3>Tables</h3>" + "".join(table_html(Path(o.path), drop) for o in tables if o.built))
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


# ---- the summary across papers ----------------------------------------------------------------------

CHIP = {"good": "#d9f2d9", "mixed": "#fff2cc", "bad": "#f8d7da", "none": "#eeeeee"}


def table_status(project: Project, item: Output, counts: dict[str, int] | None) -> tuple[str, str]:
    """(text, colour class) of one table in the summary: not built / no verdict (stand-in data) / nothing published /
    how its published numbers fell."""
    if not item.built:
        return "not built", "none"
    if stand_in(project, item.paper):
        return "", "none"             # the row says it once: no verdict on stand-in data
    if not counts:
        return "nothing published", "none"
    judged = sum(n for v, n in counts.items() if v in ("reproduced", "inconclusive", "above", "below"))
    if not judged:
        return f"{sum(counts.values())} not judged (one seed or not run)", "none"
    words = [f"{counts.get('reproduced', 0)}/{judged} reproduced"]
    words += [f"{counts[v]} {v}" for v in ("inconclusive", "below", "above") if counts.get(v)]
    unjudged = counts.get("no interval", 0) + counts.get("not run", 0)
    words += [f"{unjudged} not judged"] if unjudged else []
    off = counts.get("below", 0) + counts.get("above", 0)
    return ", ".join(words), ("good" if counts.get("reproduced", 0) == judged else "bad" if off == judged else "mixed")


def summary(project: Project, outputs: list[Output]) -> str:
    """The page's first screen: one row per paper, linked to its section: what data it ran on, per table whether
    its published numbers reproduced (or why there is no verdict), whether every method learned, what is built."""
    rows = []
    protocols = len(project.protocols) > 1
    for paper in project.papers:
        mine = [o for o in outputs if o.paper == paper]
        tables = [o for o in mine if o.kind == "table"]
        counts = scorecard.table_counts(built_card(project, paper))
        chips = []
        for o in tables:
            text, tone = table_status(project, o, counts.get((paper, o.protocol, o.name)))
            label = o.name + (f" ({o.protocol})" if protocols else "")
            chips.append(f"<span class='chip' style='background:{CHIP[tone]}'><b>{html.escape(label)}</b>"
                         + (f" {html.escape(text)}" if text else "") + "</span>")
        description = stand_in(project, paper)
        if description and tables:
            chips.insert(0, "<b>no verdict</b>: stand-in data. Tables: ")
        data = (f"<span title='{html.escape(description)}'><b>stand-in</b> ({html.escape(run_name() or 'stand-in run')}): "
                f"not comparable to the paper</span>" if description else "the paper's own")
        learned, tone = learning_cell(project, paper)
        runs = [k for k in project.plan.runs() if k.paper == paper]
        built = (f"{sum(Path(paths.run_file(k)).exists() for k in runs)}/{len(runs)} runs, "
                 f"{sum(o.built for o in tables)}/{len(tables)} tables, "
                 f"{sum(o.built for o in mine if o.kind == 'figure')}/{sum(o.kind == 'figure' for o in mine)} figures")
        rows.append(f"<tr><td><a href='#{paper}'><b>{html.escape(short_title(project, paper))}</b></a></td>"
                    f"<td>{data}</td><td>{''.join(chips) or 'no tables'}</td>"
                    f"<td style='background:{CHIP[tone]}'>{html.escape(learned)}</td><td>{built}</td></tr>")
    margin = scorecard.margin_words(project.config.get("report", {}).get("equivalence_margin", scorecard.DEFAULT_MARGIN))
    legend = (f"Reproduced: the whole 95% interval of the measured mean lies within the published value {margin} "
              f"(the equivalence margin; a paper or table may set its own); inconclusive: the interval reaches past it; "
              f"below / above: it lies wholly beyond. Stand-in data gets no reproduction verdict, only the learning "
              f"bar's. Every ± on this page is the {PLUS_MINUS} over the n seeds it names. "
              f"docs/reading-results.md explains each.")
    return ("<table id='summary'><tr><th>paper</th><th>data</th><th>did the published numbers reproduce? (per table)</th>"
            "<th>did every method learn? (rows of the learning bar)</th><th>built</th></tr>" + "".join(rows)
            + f"</table><p class='legend'>{html.escape(legend)}</p>")


# ---- the page ------------------------------------------------------------------------------------

def render(project: Project, rule_graph_png: Path | None = None) -> str:
    outputs = planned_outputs(project)
    runs = project.plan.runs()
    done = sum(Path(paths.run_file(k)).exists() for k in runs)
    kinds = {kind: [o for o in outputs if o.kind == kind] for kind in ("table", "figure", "scorecard")}
    built = "; ".join(f"{sum(o.built for o in items)} of {len(items)} {kind}s" for kind, items in kinds.items())
    config = ", ".join(project.configfiles) if project.configfiles else "config/config.yaml"
    name = run_name()
    head = [f"<h1>fedrepro report{': ' + html.escape(name) if name else ''}</h1>",
            f"<p>Configuration: {html.escape(config)} (results in {html.escape(paths.results_dir())}/). Written "
            f"{time.strftime('%Y-%m-%d %H:%M')}. Built so far: {done} of {len(runs)} training runs; {built}.</p>",
            summary(project, outputs),
            "<p>Below, per paper: what ran, the verdicts in words, the tables and the figures; what is not built yet, "
            "with the command that builds it. Last: <a href='#rulegraph'>the rule graph</a>.</p>"]
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
