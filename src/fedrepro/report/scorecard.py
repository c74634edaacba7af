"""The reproduction scorecard: for every published cell, did our number reproduce it?

For each cell of every table that has a published value, under each protocol that was run:
our mean over seeds, its 95% t-interval (mean ± t_{n-1, 0.975} · sd / √n), the published value, the
difference (ours − published) and a verdict:

- ``reproduced``  the published value lies inside our 95% interval;
- ``above`` / ``below``  our whole interval lies above / below the published value;
- ``no interval``  fewer than two seeds: there is no interval to judge by;
- ``not run``  the paper printed a value, we have none;
- ``unpublished``  a cell an extension added (its method's row, or its setting's table: docs/plugins.md): ours
  only, beside the published cells it is compared with in the table; not counted in the summary line.

Cells of the tables that describe the data rather than results (table kinds ``split_counts`` and
``class_balance``: client sizes, imbalance ratios) come from one split, not from runs over seeds: they are
judged exactly (``reproduced`` when ours equals the published value to its two printed decimals, else
``above`` / ``below``), counted apart in the summary line and drawn in a panel of their own (log axes:
counts up to tens of thousands would squash the results' scatter).

Cells whose published value the project derived or assembled (formulas expanded, values taken from
another table) are marked ``derived`` by the published CSV itself (:mod:`fedrepro.report.published`); the
table CSV carries the mark and its footnote, and the scorecard prints both.
One line per paper says how many cells reproduced ("12 of 40 cells within the 95% interval"). The
scorecard is written as Markdown, HTML (with a figure: published vs ours, one point per cell with its
interval, the diagonal drawn; embedded in the page, so the page stands alone, e.g. in the Snakemake report)
and CSV, the figure also as PNG and PDF.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..io import write_csv, write_text

VERDICTS = ("reproduced", "above", "below", "no interval", "not run", "unpublished")
VERDICT_COLOURS = {"reproduced": "#2e7d32", "above": "#ef6c00", "below": "#c62828", "no interval": "#757575",
                   "not run": "#757575", "unpublished": "#1565c0"}
COLUMNS = ["paper", "table", "protocol", "row", "column", "mean", "ci_low", "ci_high", "n", "published",
           "delta", "verdict", "derived", "published_mark", "published_note", "quantity"]
# table kinds whose cells describe the data (one split), not results over seeds
DATA_KINDS = ("split_counts", "class_balance")
EXACT = 0.005 + 1e-9         # the published values carry at most two decimals


def verdict(mean: float, half_width: float, n: int, published: float) -> str:
    if n == 0 or math.isnan(mean):
        return "not run"
    if n < 2 or math.isnan(half_width):
        return "no interval"
    if published < mean - half_width:
        return "above"
    if published > mean + half_width:
        return "below"
    return "reproduced"


def exact_verdict(value: float, published: float) -> str:
    """A data cell (a client's size, an imbalance ratio): the published value, to its printed decimals, or not."""
    if value is None or math.isnan(value):
        return "not run"
    return "reproduced" if abs(value - published) <= EXACT else "above" if value > published else "below"


def cells(table_csv: str | Path, paper: str, table: str, protocol: str, kind: str = "runs",
          added: dict | None = None) -> pd.DataFrame:
    """The scorecard rows of one table CSV (``results/tables/...csv``): its cells with a published value, and the
    cells an extension ``added`` ({"rows", "columns": labels, "all": the whole table is the extension's});
    ``kind``: the table's kind (:data:`DATA_KINDS` are judged exactly)."""
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
    out["verdict"] = ([exact_verdict(m, p) for m, p in zip(frame["mean"], frame["published"])] if data else
                      [verdict(m, h, n, p) for m, h, n, p in zip(frame["mean"], frame["ci95"], out["n"], frame["published"])])
    out.loc[frame["published"].isna().to_numpy(), "verdict"] = "unpublished"
    return out[COLUMNS].reset_index(drop=True)


def build(tables: list[tuple], added: dict | None = None) -> pd.DataFrame:
    """``tables``: (paper, table, protocol, csv path[, table kind]) of every table to score; ``added``: (paper,
    table) -> the cells an extension added to it (:func:`cells`)."""
    parts = [cells(path, paper, table, protocol, *kind, added=(added or {}).get((paper, table)))
             for paper, table, protocol, path, *kind in tables]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)


def _results_and_data(card: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    data = card["quantity"] == "data" if "quantity" in card else pd.Series(False, index=card.index)
    return card[~data], card[data]


def summary_line(card: pd.DataFrame, paper: str | None = None) -> str:
    """e.g. "FACMIC (clean): 12 of 40 cells within the 95% interval (30 above, 2 below, 1 not run); split sizes and
    data statistics: 24 of 24 as published"."""
    lines = []
    for (name, protocol), part in card.groupby(["paper", "protocol"], sort=False):
        ours = int((part["verdict"] == "unpublished").sum())
        results, data = _results_and_data(part[part["verdict"] != "unpublished"])
        counts = results["verdict"].value_counts()
        judged = len(results) - counts.get("not run", 0) - counts.get("no interval", 0)
        rest = ", ".join(f"{counts[v]} {v}" for v in VERDICTS[1:-1] if counts.get(v, 0))
        line = (f"{paper or name} ({protocol}): {counts.get('reproduced', 0)} of {len(results)} cells within the "
                f"95% interval" + (f" ({rest})" if rest else "") + (f"; {judged} judged" if judged != len(results) else ""))
        if len(data):
            off = data["verdict"].value_counts()
            rest = ", ".join(f"{off[v]} {v}" for v in ("above", "below", "not run") if off.get(v, 0))
            line += (f"; split sizes and data statistics: {off.get('reproduced', 0)} of {len(data)} as published"
                     + (f" ({rest})" if rest else ""))
        lines.append(line + (f"; and {ours} cells of the extension, which have no published value" if ours else ""))
    return "\n".join(lines) if lines else f"{paper or 'all papers'}: no published cell to score"


def _fmt(value: float, decimals: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{decimals}f}"


def _rows(card: pd.DataFrame) -> list[list[str]]:
    return [[r.table, r.protocol, r.row, r.column, _fmt(r.mean),
             f"[{_fmt(r.ci_low)}, {_fmt(r.ci_high)}]" if r.n > 1 else "–", str(r.n),
             _fmt(r.published) + r.published_mark, _fmt(r.delta), r.verdict] for r in card.itertuples()]


HEADER = ["table", "protocol", "row", "column", "ours (mean)", "95% interval", "n", "published", "ours − published", "verdict"]
FOOTNOTE = "Intervals are 95% t-intervals of the mean over seeds."


def footnotes(card: pd.DataFrame) -> list[str]:
    """One line per (paper, table, mark) of the derived published values on the card: what the published
    CSV's footnote says the mark means."""
    derived = card[card["derived"]] if len(card) else card
    seen = dict.fromkeys((r.paper, r.table, r.published_mark, r.published_note) for r in derived.itertuples())
    return [f"{mark} {paper} {table}: {note or 'the published value was derived or assembled by this project'}"
            for paper, table, mark, note in seen]


STAND_IN_NOTE = "Stand-in data and models: a verdict here says nothing about the paper."


def render_markdown(card: pd.DataFrame, title: str, stand_ins: list[str] | None = None) -> str:
    """``stand_ins``: what the papers' stand-in data and models are (the demo), each said above the table."""
    lines = [f"# {title}", "", summary_line(card).replace("\n", "  \n"), ""]
    if stand_ins:
        lines += [f"**{STAND_IN_NOTE}** " + " ".join(stand_ins), ""]
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(card)]
    return "\n".join(lines + [""] + [f"{line}  " for line in footnotes(card)] + [FOOTNOTE, ""])


def render_html(card: pd.DataFrame, title: str, figure: str | Path | None, stand_ins: list[str] | None = None) -> str:
    """The scorecard page; ``figure``: a PNG file, embedded as a data URI."""
    colour = {"reproduced": "#d9f2d9", "above": "#fff2cc", "below": "#f8d7da", "not run": "#eeeeee", "no interval": "#eeeeee",
              "unpublished": "#e3f2fd"}
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
    if figure:
        data = base64.b64encode(Path(figure).read_bytes()).decode("ascii")
        parts.append(f"<img id='scorecard-figure' src='data:image/png;base64,{data}' alt='published vs ours' "
                     f"style='max-width:900px'>")
    notes = "".join(f"{html.escape(line)}<br>" for line in footnotes(card))
    parts += [f"<table id='scorecard'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>",
              f"<p id='footnotes'>{notes}{html.escape(FOOTNOTE)}</p></body></html>"]
    return "\n".join(parts)


def plot(card: pd.DataFrame, title: str, out_png: str | Path) -> None:
    """Published (x) vs ours (y), one point per cell, the diagonal drawn: the results with their 95% interval
    bars, and, where the card has them, the split sizes and data statistics in a panel of their own on log axes."""
    from .plotting import pyplot, save_figure

    plt = pyplot()
    results, data = _results_and_data(card[card["published"].notna()])   # an extension's cells have no x
    panels = [("results", results, "ours (mean, 95% interval)", False)]
    if len(data):
        panels.append(("split sizes and data statistics", data, "ours (one split)", True))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5.2), squeeze=False)
    for ax, (name, part, ylabel, log) in zip(axes[0], panels):
        _scatter(ax, part[part["n"] > 0], log)
        ax.set_xlabel("published")
        ax.set_ylabel(ylabel)
        ax.set_title(name if len(panels) > 1 else title, fontsize=10)
    if len(panels) > 1:
        fig.suptitle(title, fontsize=10)
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


def write(card: pd.DataFrame, title: str, files: ScorecardFiles, stand_ins: list[str] | None = None) -> None:
    write_csv(files.csv, card)
    plot(card, title, files.png)
    write_text(files.md, render_markdown(card, title, stand_ins))
    write_text(files.html, render_html(card, title, files.png, stand_ins))
