"""Figure kinds drawn as grouped bars or lines from numbers the runs or the tables already hold:

- ``client_bars``: per-client test accuracy (or ``metric``/``metrics``), bars grouped by eval set, one bar
  per method, a panel per setting, mean ± 95% t-interval half-width over seeds (FAA-CLIP Fig. 4).
- ``backbones``: BACC and macro-F1 (or ``metrics``) per client for backbone variants (FAA-CLIP Fig. 7).
- ``table_plot``: tables of the paper drawn from their CSVs (mean ± 95% t-interval half-width over seeds, the
  published value as a hollow marker where the table has one), a panel per table in ``spec.tables``. ``options.style: bars`` = grouped bars,
  x = columns, one bar per row (FedDRA Fig. 3); ``lines`` = x = the table's rows (a sweep's values),
  one line per column (FedDRA Fig. 4a-c). ``options.columns`` restricts the columns drawn.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from .. import paths
from ..config import ConfigError
from ..io import read_json
from ..registry import register_figure_kind
from .item import ReportItem, run_inputs
from .plotting import finish, grid, pyplot, save_figure, suptitle
from .predictions import evals
from .stats import plus_minus, summarise
from .tables import metric_value


def metric_summary(item: ReportItem, setting: str, method: str, eval_key: str, metric: str) -> dict:
    values = [metric_value(read_json(item.run_file(setting, method, seed)), eval_key, metric) for seed in item.seeds]
    return summarise(values)


def _bars(item: ReportItem, out_png: Path, metrics: list[str]) -> None:
    """A panel per (setting, metric): groups = eval sets, one bar per method, mean ± error over seeds."""
    item.options(("settings", "methods"), {})
    plt = pyplot()
    eval_keys, methods = evals(item), item.spec["methods"]
    panels = [(s, m) for s in item.spec["settings"] for m in metrics]
    fig, axes = grid(plt, len(panels), 3, size=(max(4.2, 0.9 * len(eval_keys) * max(1, len(methods) / 2)), 3.4))
    width = 0.8 / len(methods)
    x = np.arange(len(eval_keys))
    for ax, (setting, metric) in zip(axes, panels):
        for i, method in enumerate(methods):
            stats = [metric_summary(item, setting, method, e, metric) for e in eval_keys]
            mean = np.array([100 * s["mean"] for s in stats])
            err = np.array([0.0 if math.isnan(s["ci95"]) else 100 * s["ci95"] for s in stats])
            ax.bar(x + (i - (len(methods) - 1) / 2) * width, mean, width, yerr=err, capsize=2,
                   label=item.method_label(method))
        ax.set_xticks(x)
        ax.set_xticklabels(eval_keys, rotation=30 if len(eval_keys) > 4 else 0)
        ax.set_ylabel(f"{metric} (%)")
        ax.set_title(item.setting_label(setting) + (f" — {metric}" if len(metrics) > 1 else ""))
    finish(fig, plt, item.title, f"bars: {plus_minus(len(item.seeds))}", out_png, legend_ax=axes[0])


@register_figure_kind("client_bars", inputs=run_inputs("metrics.json"), reads=("metric", "eval"))
def client_bars(item: ReportItem, out_png: Path) -> None:
    """Per-client test accuracy (or ``metric``), grouped by eval set, one bar per method, a panel per setting."""
    _bars(item, out_png, item.spec.get("metrics") or [item.spec.get("metric", "acc")])


@register_figure_kind("backbones", inputs=run_inputs("metrics.json"), reads=("metric", "eval"))
def backbones(item: ReportItem, out_png: Path) -> None:
    """BACC and macro-F1 (or ``metrics``) per client for backbone variants (the methods)."""
    _bars(item, out_png, item.spec.get("metrics") or ["bacc", "f1"])


def table_csv_inputs(item: ReportItem) -> list[str]:
    return [paths.table(item.protocol, item.paper, table, ".csv") for table in item.spec.get("tables") or []]


def _table_frame(item: ReportItem, table: str) -> pd.DataFrame:
    return pd.read_csv(item.table_csv(table), dtype={"row": str, "column": str}, keep_default_na=False, na_values=[""])


@register_figure_kind("table_plot", inputs=table_csv_inputs)
def table_plot(item: ReportItem, out_png: Path) -> None:
    from matplotlib.lines import Line2D

    options = item.options(("tables",), {"style": "bars", "columns": None})
    style = options["style"]
    if style not in ("bars", "lines"):
        raise ConfigError(f"figures/{item.name}/options/style = {style!r}; allowed: bars, lines")
    plt = pyplot()
    tables = item.spec["tables"]
    fig, axes = plt.subplots(1, len(tables), figsize=(5.5 * len(tables), 3.8), squeeze=False)
    published_drawn = False
    for ax, table in zip(axes.flat, tables):
        frame = _table_frame(item, table)
        rows = list(dict.fromkeys(frame["row"]))
        columns = options["columns"] or list(dict.fromkeys(frame["column"]))
        unknown = sorted(set(columns) - set(frame["column"]))
        if unknown:
            raise ConfigError(f"figures/{item.name}/options/columns: {unknown} are not columns of table {table}")
        cell = frame.set_index(["row", "column"])

        def values(name: str, row: str, column: str) -> float:
            return cell.loc[(row, column), name] if (row, column) in cell.index else np.nan

        if style == "bars":
            width = 0.8 / max(1, len(rows))
            x = np.arange(len(columns))
            for i, row in enumerate(rows):
                offset = x + (i - (len(rows) - 1) / 2) * width
                bars = ax.bar(offset, [values("mean", row, c) for c in columns], width,
                              yerr=np.nan_to_num([values("ci95", row, c) for c in columns]), label=row, capsize=2)
                published = np.array([values("published", row, c) for c in columns], dtype=float)
                published_drawn |= bool(np.isfinite(published).any())
                ax.scatter(offset, published, marker="o", facecolors="none",
                           edgecolors=bars.patches[0].get_facecolor() if bars.patches else "k", zorder=3)
            ax.set_xticks(x, columns, rotation=30, ha="right")
        else:
            x = np.arange(len(rows))
            for column in columns:
                mean = np.array([values("mean", r, column) for r in rows], dtype=float)
                half = np.nan_to_num(np.array([values("ci95", r, column) for r in rows], dtype=float))
                line, = ax.plot(x, mean, marker="o", label=column)
                ax.fill_between(x, mean - half, mean + half, alpha=0.2, color=line.get_color())
                published = np.array([values("published", r, column) for r in rows], dtype=float)
                published_drawn |= bool(np.isfinite(published).any())
                ax.plot(x, published, linestyle="--", marker="o", markerfacecolor="none", color=line.get_color(), alpha=0.7)
            ax.set_xticks(x, rows)
        title = item.project.papers[item.paper]["tables"][table].get("title", table)
        ax.set_title(textwrap.fill(title, 62), fontsize=9)        # the whole title, on as many lines as it takes
        handles, labels = ax.get_legend_handles_labels()
        if published_drawn:       # the legend says what the hollow markers are only where the panel draws some
            handles.append(Line2D([], [], marker="o", markerfacecolor="none", markeredgecolor="grey", color="grey",
                                  linestyle="--" if style == "lines" else "none"))
            labels.append("published (hollow" + (", dashed)" if style == "lines" else ")"))
        ax.legend(handles, labels, fontsize=7)
    what = "bars" if style == "bars" else "lines and bands"
    published = "" if published_drawn else "; no published value to draw (the paper's rows and columns are not these)"
    suptitle(fig, item.title, f"{what}: {plus_minus(len(item.seeds))}{published}")
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)
