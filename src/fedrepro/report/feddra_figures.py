"""FedDRA's figure kinds (registered in :data:`fedrepro.report.figures.FIGURE_PLUGINS`).

- ``table_plot``: draws tables of the paper from their CSVs (mean ± std over seeds, the published
  value as a hollow marker), one panel per table in ``spec.tables``. ``options.style: bars`` =
  grouped bars, x = columns, one bar per row (Fig. 3: per-client retrieval of centralized / FedAvg /
  local models); ``lines`` = x = the table's rows (a sweep's values), one line per column
  (Fig. 4a-c: number of clients, uncertainty radius, constraint degree). ``options.columns``
  restricts the columns drawn.
- ``alignment_curves``: the mean cosine similarity of paired image and text embeddings of the global
  model per communication turn (Fig. 4d-f), one panel per eval key (a client, or ``clients_mean``),
  one line per method. ``options.rounds_per_turn`` maps a method to the engine rounds that make one
  communication turn (FedDRA's code schedule runs a stage-1 and a stage-2 round per turn: 2).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import Project
from .figures import _plt, method_label, plot_mean_band, round_series, save_figure, seed_table, setting_label


def _table_frame(project: Project, paper: str, table: str) -> pd.DataFrame:
    path = Path("results/tables") / paper / f"{table}.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: build the table first (snakemake does this)")
    return pd.read_csv(path, dtype={"row": str, "column": str}, keep_default_na=False, na_values=[""])


def table_plot(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    plt = _plt()
    options = spec.get("options", {})
    style = options.get("style", "bars")
    if style not in ("bars", "lines"):
        raise ValueError(f"figures/{name}/options/style = {style!r}; allowed: bars, lines")
    tables = spec.get("tables") or []
    if not tables:
        raise ValueError(f"figures/{name}: table_plot needs `tables`")
    fig, axes = plt.subplots(1, len(tables), figsize=(5.5 * len(tables), 3.6), squeeze=False)
    for ax, table in zip(axes.flat, tables):
        frame = _table_frame(project, paper, table)
        rows = list(dict.fromkeys(frame["row"]))
        columns = options.get("columns") or list(dict.fromkeys(frame["column"]))
        unknown = sorted(set(columns) - set(frame["column"]))
        if unknown:
            raise ValueError(f"figures/{name}/options/columns: {unknown} are not columns of table {table}")
        cell = frame.set_index(["row", "column"])
        if style == "bars":
            width = 0.8 / max(1, len(rows))
            x = np.arange(len(columns))
            for i, row in enumerate(rows):
                mean = [cell.loc[(row, c), "mean"] if (row, c) in cell.index else np.nan for c in columns]
                std = [cell.loc[(row, c), "std"] if (row, c) in cell.index else np.nan for c in columns]
                bars = ax.bar(x + (i - (len(rows) - 1) / 2) * width, mean, width, yerr=np.nan_to_num(std), label=row, capsize=2)
                published = [cell.loc[(row, c), "published"] if (row, c) in cell.index else np.nan for c in columns]
                ax.scatter(x + (i - (len(rows) - 1) / 2) * width, published, marker="o", facecolors="none",
                           edgecolors=bars.patches[0].get_facecolor() if bars.patches else "k", zorder=3)
            ax.set_xticks(x, columns, rotation=30, ha="right")
        else:
            x = np.arange(len(rows))
            for column in columns:
                mean = np.array([cell.loc[(r, column), "mean"] if (r, column) in cell.index else np.nan for r in rows], dtype=float)
                std = np.array([cell.loc[(r, column), "std"] if (r, column) in cell.index else np.nan for r in rows], dtype=float)
                line, = ax.plot(x, mean, marker="o", label=column)
                ax.fill_between(x, mean - np.nan_to_num(std), mean + np.nan_to_num(std), alpha=0.2, color=line.get_color())
                published = [cell.loc[(r, column), "published"] if (r, column) in cell.index else np.nan for r in rows]
                ax.plot(x, published, linestyle="--", marker="o", markerfacecolor="none", color=line.get_color(), alpha=0.7)
            ax.set_xticks(x, rows)
        title = project.papers[paper]["tables"][table].get("title", table)
        ax.set_title(title if len(title) < 60 else title[:57] + "...", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(spec.get("title", name) + f"  (mean ± std over {len(project.config['seeds'])} seeds; hollow/dashed: published)")
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)


def turn_series(history: pd.DataFrame, column: str, rounds_per_turn: int) -> pd.Series:
    """A history column per communication turn: the value after the turn's last evaluated round."""
    series = round_series(history, column)
    turns = series.index.map(lambda r: math.ceil(r / rounds_per_turn)).rename("turn")
    return series.groupby(turns).last()


def alignment_curves(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    options = spec.get("options", {})
    per_turn = options.get("rounds_per_turn", {})
    metric = spec.get("metric", "cos_sim")
    evals = spec.get("evals") or ["client0", "client1", "clients_mean"]
    panels = [(s, e) for s in spec["settings"] for e in evals]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, (setting, eval_key) in zip(axes.flat, panels):
        column = f"{eval_key}/{metric}"
        for method in spec["methods"]:
            rounds_per_turn = int(per_turn.get(method, 1))
            table = seed_table(project, paper, setting, method, column,
                               per_run=lambda history, col: turn_series(history, col, rounds_per_turn))
            if table is not None:
                plot_mean_band(ax, table, method_label(project, paper, method), marker="o")
        ax.set_title(f"{setting_label(project, paper, setting)} — {eval_key}", fontsize=9)
        ax.set_xlabel("communication turn")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(metric)
        ax.legend(fontsize=7)
    fig.suptitle(spec.get("title", name) + f"  (mean ± std over {len(project.config['seeds'])} seeds)")
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)
