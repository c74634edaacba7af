"""The reproduction scorecard: for every published cell, did our number reproduce it?

For each cell of every table that has a published value, under each protocol that was run: our mean over seeds, its
95% t-interval (mean ± t_{n-1, 0.975} · sd / √n, the one ± of every page: :mod:`fedrepro.report.stats`), the
published value, the difference (measured − published), the table's **equivalence margin** and a verdict. The rule
(docs/reading-results.md, "The scorecard's verdict") is an equivalence test, so that noise alone cannot make a number
reproduce: a wider interval (fewer seeds, a noisier method) makes a verdict harder to reach, never easier.

- ``reproduced``  the whole 95% interval lies within published ± margin;
- ``inconclusive``  the interval reaches past published ± margin on one side or both but does not lie wholly
  beyond it: these seeds cannot tell (an interval wider than the margin band is always inconclusive or beyond);
- ``above`` / ``below``  the whole interval lies beyond published + margin / below published − margin: not
  reproduced;
- ``no interval``  fewer than two seeds: there is no interval to judge by;
- ``not run``  the paper printed a value, we have none;
- ``stand-in data``  the paper file runs on stand-in data and models (``stand_in``: the demo, the evidence run): the
  numbers say whether the methods learn (the learning bar), nothing about the paper, so no cell gets a verdict;
- ``unpublished``  a cell an extension added (its method's row, or its setting's table: docs/plugins.md): ours
  only, beside the published cells it is compared with in the table; not counted in the summary line.

The margin is in the table's units (percentage points for the tables in %): the configuration's
``report.equivalence_margin`` (2.0 by default), a paper file's ``equivalence_margin``, or a table's; ``{relative: r}``
is r x the published value (for times and counts). It is stated before any result is read and never tuned against
them.

Cells of the tables that describe the data rather than results (table kinds ``split_counts`` and
``class_balance``: client sizes, imbalance ratios) come from one split, not from runs over seeds: they are
judged exactly (``reproduced`` when ours equals the published value to its two printed decimals, else
``above`` / ``below``), counted apart in the summary line and drawn in a panel of their own (log axes:
counts up to tens of thousands would squash the results' scatter).

Cells whose published value the project derived or assembled (formulas expanded, values taken from
another table) are marked ``derived`` by the published CSV itself (:mod:`fedrepro.report.published`); the
table CSV carries the mark and its footnote, and the scorecard prints both.
One line per paper and protocol says, in words, how many published numbers reproduced, how many were
inconclusive or off and in which direction, and how many could not be judged and why (:func:`summary_line`). The
scorecard is written as Markdown, HTML (with a figure: published vs measured, one point per cell with its
interval, the diagonal drawn; embedded in the page, so the page stands alone, e.g. in the Snakemake report)
and CSV, the figure also as PNG and PDF. "Measured" is always this pipeline's value, never a paper's
method (FedAdapterProto's method is labelled "Ours" in its paper).
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..io import write_csv, write_text
from .html import data_uri
from .stats import PLUS_MINUS

STAND_IN = "stand-in data"
VERDICTS = ("reproduced", "inconclusive", "above", "below", "no interval", "not run", STAND_IN, "unpublished")
VERDICT_COLOURS = {"reproduced": "#2e7d32", "inconclusive": "#8d6e63", "above": "#ef6c00", "below": "#c62828",
                   "no interval": "#757575", "not run": "#757575", STAND_IN: "#757575", "unpublished": "#1565c0"}
COLUMNS = ["paper", "table", "protocol", "row", "column", "mean", "ci_low", "ci_high", "n", "published",
           "delta", "margin", "verdict", "derived", "published_mark", "published_note", "quantity"]
# table kinds whose cells describe the data (one split), not results over seeds
DATA_KINDS = ("split_counts", "class_balance")
EXACT = 0.005 + 1e-9         # the published values carry at most two decimals
DEFAULT_MARGIN = 2.0         # the configuration's report.equivalence_margin when nothing sets one (its schema default)


def margin_of(project, paper: str, table: str):
    """The equivalence margin of ``table``: its own, else its paper file's, else the configuration's."""
    spec = project.papers[paper]
    for source in (spec.get("tables", {}).get(table, {}), spec, project.config.get("report") or {}):
        if source.get("equivalence_margin") is not None:
            return source["equivalence_margin"]
    return DEFAULT_MARGIN


def margin_value(margin, published: float) -> float:
    """A margin (a number, or ``{relative: r}``) in the units of the cell whose published value is ``published``."""
    if isinstance(margin, dict):
        return abs(published) * float(margin["relative"])
    return float(margin)


def margin_words(margin) -> str:
    """"± 2 points" / "± 5% of the published value"."""
    if isinstance(margin, dict):
        return f"± {100 * float(margin['relative']):g}% of the published value"
    return f"± {float(margin):g} (in the table's units; points for %)"


def verdict(mean: float, half_width: float, n: int, published: float, margin: float = DEFAULT_MARGIN) -> str:
    """The equivalence verdict of one cell: its 95% interval ``mean ± half_width`` against published ± ``margin``."""
    if n == 0 or math.isnan(mean):
        return "not run"
    if n < 2 or math.isnan(half_width):
        return "no interval"
    low, high = mean - half_width, mean + half_width
    if low >= published - margin and high <= published + margin:
        return "reproduced"
    if high < published - margin:
        return "below"
    if low > published + margin:
        return "above"
    return "inconclusive"


def exact_verdict(value: float, published: float) -> str:
    """A data cell (a client's size, an imbalance ratio): the published value, to its printed decimals, or not."""
    if value is None or math.isnan(value):
        return "not run"
    return "reproduced" if abs(value - published) <= EXACT else "above" if value > published else "below"


def cells(table_csv: str | Path, paper: str, table: str, protocol: str, kind: str = "runs",
          added: dict | None = None, margin=DEFAULT_MARGIN, stand_in: bool = False) -> pd.DataFrame:
    """The scorecard rows of one table CSV (``results/tables/...csv``): its cells with a published value, and the
    cells an extension ``added`` ({"rows", "columns": labels, "all": the whole table is the extension's});
    ``kind``: the table's kind (:data:`DATA_KINDS` are judged exactly); ``margin``: its equivalence margin
    (:func:`margin_of`); ``stand_in``: its paper runs on stand-in data (no cell gets a verdict)."""
    frame = pd.read_csv(table_csv, dtype={"row": str, "column": str}, keep_default_na=False, na_values=[""])
    added = added or {}
    ours = frame["row"].isin(added.get("rows", ())) | frame["column"].isin(added.get("columns", ()))
    ours = ours | bool(added.get("all"))
    frame = frame[frame["published"].notna() | ours]
    if "derived" not in frame:
        frame = frame.assign(derived=False)
    for column in ("published_mark", "published_note"):
        frame[column] = frame[column].fillna("").astype(str) if column in frame else ""
    frame["derived"] = frame["derived"].astype(bool)
    frame.loc[frame["derived"] & (frame["published_mark"] == ""), "published_mark"] = "*"
    out = pd.DataFrame({
        "paper": paper, "table": table, "protocol": protocol, "row": frame["row"], "column": frame["column"],
        "mean": frame["mean"], "ci_low": frame["mean"] - frame["ci95"], "ci_high": frame["mean"] + frame["ci95"],
        "n": frame["n"].astype(int), "published": frame["published"],
        "delta": frame["mean"] - frame["published"], "derived": frame["derived"],
        "published_mark": frame["published_mark"], "published_note": frame["published_note"],
    })
    data = kind in DATA_KINDS
    out["quantity"] = "data" if data else "results"
    out["margin"] = math.nan if data else [margin_value(margin, p) for p in frame["published"].fillna(0.0)]
    if stand_in:
        out["verdict"] = STAND_IN
    else:
        out["verdict"] = ([exact_verdict(m, p) for m, p in zip(frame["mean"], frame["published"])] if data else
                          [verdict(m, h, n, p, d) for m, h, n, p, d in
                           zip(frame["mean"], frame["ci95"], out["n"], frame["published"], out["margin"])])
    out.loc[frame["published"].isna().to_numpy(), "verdict"] = "unpublished"
    return out[COLUMNS].reset_index(drop=True)


def build(tables: list[tuple], added: dict | None = None, margins: dict | None = None,
          stand_ins=()) -> pd.DataFrame:
    """``tables``: (paper, table, protocol, csv path[, table kind]) of every table to score; ``added``: (paper,
    table) -> the cells an extension added to it; ``margins``: (paper, table) -> its equivalence margin (default
    :data:`DEFAULT_MARGIN`); ``stand_ins``: the papers on stand-in data (:func:`cells`)."""
    parts = [cells(path, paper, table, protocol, *kind, added=(added or {}).get((paper, table)),
                   margin=(margins or {}).get((paper, table), DEFAULT_MARGIN), stand_in=paper in stand_ins)
             for paper, table, protocol, path, *kind in tables]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)


def project_card(project, papers: list[str], built_only: bool = False) -> pd.DataFrame:
    """The card of ``papers`` as the configuration defines it: every table of theirs under every protocol (from the
    table CSVs; ``built_only``: those that exist, for the report), each with its margin (:func:`margin_of`), the cells
    an extension adds, no verdict on stand-in data."""
    from .. import paths
    from .item import stand_in

    tables = [(paper, table, protocol, paths.table(protocol, paper, table, ".csv"),
               project.papers[paper]["tables"][table].get("kind", "runs"))
              for protocol, paper, table in project.plan.tables() if paper in papers]
    if built_only:
        tables = [t for t in tables if Path(t[3]).exists()]
    added = project.extension.added if project.extension else {}
    return build(tables, {(paper, table): added[(paper, table)] for paper, table, *_ in tables if (paper, table) in added},
                 margins={(paper, table): margin_of(project, paper, table) for paper, table, *_ in tables},
                 stand_ins={p for p in papers if stand_in(project, p)})


def _results_and_data(card: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    data = card["quantity"] == "data" if "quantity" in card else pd.Series(False, index=card.index)
    return card[~data], card[data]


def summary_line(card: pd.DataFrame, paper: str | None = None) -> str:
    """What the card says, in words a first-time reader gets right, one line per (paper, protocol), e.g.
    "FACMIC (clean): of the 11 published numbers that could be judged, 2 reproduced (...), 7 inconclusive (...) and
    2 below the published value (...). Not judged: 8 ran with one seed only, so there is no interval to judge by."
    The cells that describe the data (split sizes, imbalance ratios: one split, judged exactly) are counted apart at
    the end; a paper on stand-in data gets no verdict at all."""
    lines = []
    for (name, protocol), part in card.groupby(["paper", "protocol"], sort=False):
        ours = int((part["verdict"] == "unpublished").sum())          # an extension's cells: nothing to judge
        published = part[part["verdict"] != "unpublished"]
        label = f"{paper or name} ({protocol})"
        if len(published) and (published["verdict"] == STAND_IN).all():
            text = (f"{label}: stand-in data and models, so no reproduction verdict: its {len(published)} published "
                    f"numbers stand beside the measured ones for reference only (whether the methods learn is the "
                    f"learning bar's question).")
            lines.append(text + (f" And {ours} numbers of the extension, which have no published value." if ours else ""))
            continue
        results, data = _results_and_data(published)
        counts = {v: int(n) for v, n in results["verdict"].value_counts().items()}
        no_interval, not_run = counts.get("no interval", 0), counts.get("not run", 0)
        judged = len(results) - no_interval - not_run
        if judged:
            parts = [f"{counts.get('reproduced', 0)} reproduced (the whole 95% interval of the measured mean within "
                     f"the equivalence margin of the published value)"]
            if counts.get("inconclusive"):
                parts.append(f"{counts['inconclusive']} inconclusive (the interval reaches past the margin: these seeds "
                             f"cannot tell)")
            below, above = counts.get("below", 0), counts.get("above", 0)
            if below or above:
                sides = " and ".join(([f"{below} below"] if below else []) + ([f"{above} above"] if above else []))
                parts.append(f"{sides} the published value (the whole interval beyond the margin: not reproduced)")
            listed = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
            text = f"{label}: of the {judged} published numbers that could be judged, {listed}."
        elif len(results):
            text = f"{label}: none of the {len(results)} published numbers could be judged."
        else:
            text = f"{label}: no published result here."
        unjudged = ([f"{no_interval} ran with one seed only, so there is no interval to judge by"] if no_interval else []) \
            + ([f"{not_run} not run here"] if not_run else [])
        if unjudged:
            text += (" Not judged: " if judged else " ") + "; ".join(unjudged) + "."
        if len(data):
            off = {v: int(n) for v, n in data["verdict"].value_counts().items()}
            rest = ", ".join(f"{off[v]} {'larger' if v == 'above' else 'smaller' if v == 'below' else v}"
                             for v in ("above", "below", "not run") if off.get(v, 0))
            text += (f" Split sizes and data statistics: {off.get('reproduced', 0)} of {len(data)} as published"
                     + (f" ({rest})" if rest else "") + ".")
        if ours:
            text += f" And {ours} numbers of the extension, which have no published value."
        lines.append(text)
    return "\n".join(lines) if lines else f"{paper or 'all papers'}: no published number to score."


def table_counts(card: pd.DataFrame) -> dict[tuple[str, str, str], dict[str, int]]:
    """(paper, protocol, table) -> {verdict: cells} of the card's published cells (what the report's summary
    shows per table)."""
    published = card[card["verdict"] != "unpublished"]
    return {key: {v: int(n) for v, n in part["verdict"].value_counts().items()}
            for key, part in published.groupby(["paper", "protocol", "table"], sort=False)}


def _fmt(value: float, decimals: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{decimals}f}"


def _measured(r) -> str:
    """"46.61 ± 5.53" (the 95% half-width), or the mean alone where there is no interval."""
    if r.n > 1 and not math.isnan(r.ci_high):
        return f"{_fmt(r.mean)} ± {_fmt(r.ci_high - r.mean)}"
    return _fmt(r.mean)


def _rows(card: pd.DataFrame) -> list[list[str]]:
    return [[r.table, r.protocol, r.row, r.column, _measured(r), str(r.n), _fmt(r.published) + r.published_mark,
             _fmt(r.delta), f"± {_fmt(r.margin)}" if not math.isnan(r.margin) else "exact", r.verdict]
            for r in card.itertuples()]


HEADER = ["table", "protocol", "row", "column", "measured (mean ± 95% CI)", "n (seeds)", "published",
          "measured − published", "margin", "verdict"]
FOOTNOTE = (f"Measured: this pipeline's value, {PLUS_MINUS} over the n seeds of its row; every seed's value is in the "
            f"table's .seeds.csv. Verdicts (an equivalence test, docs/reading-results.md): reproduced = the whole 95% "
            f"interval within published ± margin; inconclusive = the interval reaches past the margin; below / above = "
            f"the whole interval beyond it; no interval (one seed); not run; stand-in data = no verdict (the numbers "
            f"show whether the methods learn, not the paper's). The margin is fixed in the configuration "
            f"(report.equivalence_margin, a paper's or a table's equivalence_margin) before any result is read. Split "
            f"sizes and data statistics come from one split and are judged exactly, to the published decimals.")


def footnotes(card: pd.DataFrame) -> list[str]:
    """One line per (paper, table, mark) of the derived published values on the card: what the published
    CSV's footnote says the mark means."""
    derived = card[card["derived"]] if len(card) else card
    seen = dict.fromkeys((r.paper, r.table, r.published_mark, r.published_note) for r in derived.itertuples())
    return [f"{mark} {paper} {table}: {note or 'the published value was derived or assembled by this project'}"
            for paper, table, mark, note in seen]


STAND_IN_NOTE = "Stand-in data and models: no reproduction verdict; the numbers show whether the methods learn."
RULE = ("Verdict rule: reproduced when the whole 95% interval of the measured mean lies within published ± the "
        "equivalence margin (column margin, fixed in the configuration before any result); inconclusive when it "
        "reaches past the margin; below / above when it lies wholly beyond (docs/reading-results.md).")


def seeds_links(card: pd.DataFrame) -> list[tuple[str, str]]:
    """(label, path relative to the scorecard page) of every scored table's per-seed values (``.seeds.csv``)."""
    from .. import paths

    tables = dict.fromkeys(zip(card["protocol"], card["paper"], card["table"])) if len(card) else {}
    here = Path(paths.scorecard("x")).parent
    return [(f"{paper} {table} ({protocol})", Path(os.path.relpath(paths.table(protocol, paper, table, ".seeds.csv"), here)).as_posix())
            for protocol, paper, table in tables]


def render_markdown(card: pd.DataFrame, title: str, stand_ins: list[str] | None = None, code: str | None = None) -> str:
    """``stand_ins``: what the papers' stand-in data and models are (the demo), each said above the table; ``code``:
    which cells hold runs made by other code than the installed one (:mod:`.code_changes`), said there too."""
    lines = [f"# {title}", "", summary_line(card).replace("\n", "  \n"), ""]
    if stand_ins:
        lines += [f"**{STAND_IN_NOTE}** " + " ".join(stand_ins), ""]
    else:
        lines += [RULE, ""]
    if code:
        lines += [code, ""]
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(card)]
    links = ", ".join(f"[{label}]({target})" for label, target in seeds_links(card))
    return "\n".join(lines + [""] + [f"{line}  " for line in footnotes(card)] + [FOOTNOTE, ""]
                     + ([f"Every seed's value: {links}.", ""] if links else []))


def render_html(card: pd.DataFrame, title: str, figure: str | Path | None, stand_ins: list[str] | None = None,
                code: str | None = None) -> str:
    """The scorecard page; ``figure``: a PNG file, embedded as a data URI."""
    colour = {"reproduced": "#d9f2d9", "inconclusive": "#efe7e2", "above": "#fff2cc", "below": "#f8d7da",
              "not run": "#eeeeee", "no interval": "#eeeeee", STAND_IN: "#eeeeee", "unpublished": "#e3f2fd"}
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "".join("<tr style='background:{}'>{}</tr>".format(colour[r[-1]], "".join(f"<td>{html.escape(c)}</td>" for c in r))
                   for r in _rows(card))
    summary = "<br>".join(html.escape(line) for line in summary_line(card).splitlines())
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>", f"<p id='summary'>{summary}</p>"]
    if stand_ins:
        parts.append(f"<p><b>{html.escape(STAND_IN_NOTE)}</b> {html.escape(' '.join(stand_ins))}</p>")
    else:
        parts.append(f"<p id='rule'>{html.escape(RULE)}</p>")
    if code:
        parts.append(f"<p id='code'>{html.escape(code)}</p>")
    if figure:
        parts.append(f"<img id='scorecard-figure' src='{data_uri(figure)}' alt='published vs measured' "
                     f"style='max-width:900px'>")
    notes = "".join(f"{html.escape(line)}<br>" for line in footnotes(card))
    links = ", ".join(f"<a href='{html.escape(target)}'>{html.escape(label)}</a>" for label, target in seeds_links(card))
    parts += [f"<table id='scorecard'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>",
              f"<p id='footnotes'>{notes}{html.escape(FOOTNOTE)}</p>"
              + (f"<p id='seeds'>Every seed's value: {links}.</p>" if links else "") + "</body></html>"]
    return "\n".join(parts)


def plot(card: pd.DataFrame, title: str, out_png: str | Path) -> None:
    """Published (x) vs measured here (y), one point per cell, the diagonal drawn: the results with their 95% interval
    bars, and, where the card has them, the split sizes and data statistics in a panel of their own on log axes."""
    from .plotting import pyplot, save_figure, suptitle

    plt = pyplot()
    results, data = _results_and_data(card[card["published"].notna()])   # an extension's cells have no x
    n = int(results["n"].max()) if len(results) else 0
    panels = [("results", results, f"measured here (mean ± 95% CI, n = {n} seeds)", False)]
    if len(data):
        panels.append(("split sizes and data statistics", data, "measured here (one split)", True))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5.2), squeeze=False)
    for ax, (name, part, ylabel, log) in zip(axes[0], panels):
        _scatter(ax, part[part["n"] > 0], log)
        ax.set_xlabel("published")
        ax.set_ylabel(ylabel)
        ax.set_title(name if len(panels) > 1 else title, fontsize=10)
    if len(panels) > 1:
        suptitle(fig, title)
    save_figure(fig, out_png)
    plt.close(fig)


def _scatter(ax, run: pd.DataFrame, log: bool) -> None:
    markers = {"clean": "o", "paper": "s"}
    for (protocol, verdict_name), part in run.groupby(["protocol", "verdict"]):
        err = np.vstack([part["mean"] - part["ci_low"], part["ci_high"] - part["mean"]])
        ax.errorbar(part["published"], part["mean"], yerr=np.nan_to_num(err), fmt=markers.get(protocol, "o"),
                    color=VERDICT_COLOURS[verdict_name], ms=4, capsize=2, alpha=0.8, label=f"{verdict_name} ({protocol})")
    values = pd.concat([run["published"], run["ci_low"], run["ci_high"]]).dropna()
    if log:
        values = values[values > 0]
    if len(values):
        lo, hi = float(values.min()), float(values.max())
        lo, hi = (lo / 1.3, hi * 1.3) if log else (lo - 0.05 * (hi - lo or 1.0), hi + 0.05 * (hi - lo or 1.0))
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--")
        margins = run["margin"].dropna().unique() if "margin" in run else []
        if not log and len(margins) == 1:     # one absolute margin: the band a reproduced interval must lie in
            ax.fill_between([lo, hi], [lo - margins[0], hi - margins[0]], [lo + margins[0], hi + margins[0]],
                            color="grey", alpha=0.12, lw=0, label=f"published ± margin ({margins[0]:g})")
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    if len(run):
        ax.legend(fontsize=7, loc="upper left")


@dataclass
class ScorecardFiles:
    md: Path
    html: Path
    csv: Path
    png: Path

    @classmethod
    def at(cls, stem: str | Path) -> "ScorecardFiles":
        stem = Path(stem)
        return cls(stem.with_suffix(".md"), stem.with_suffix(".html"), stem.with_suffix(".csv"), stem.with_suffix(".png"))


def write(card: pd.DataFrame, title: str, files: ScorecardFiles, stand_ins: list[str] | None = None,
          code: str | None = None) -> None:
    from .item import run_name
    from .plotting import data_note

    write_csv(files.csv, card)
    with data_note(f"({run_name() or 'stand-in run'}: stand-in data) {STAND_IN_NOTE}" if stand_ins else None):
        plot(card, title, files.png)
    write_text(files.md, render_markdown(card, title, stand_ins, code))
    write_text(files.html, render_html(card, title, files.png, stand_ins, code))
