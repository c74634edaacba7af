"""Figure kinds that draw a metric per round (or per communication turn), one line per method,
mean ± 95% t-interval half-width over seeds (a band), from the runs' ``history.csv``.

- ``curves``: a panel per (setting, metric, eval set), x = round (FACMIC Fig. 2, FAA-CLIP Figs. 3 and 6).
- ``alignment_curves``: a metric per communication turn, a panel per (setting, eval set) (FedDRA Fig.
  4d-f, the mean cosine similarity of paired image and text embeddings). ``options.rounds_per_turn``
  maps a method to the engine rounds that make one turn (FedDRA's code runs a stage-1 and a stage-2
  round per turn: 2).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from ..registry import register_figure_kind
from .item import ReportItem, run_inputs
from .plotting import plot_mean_band, pyplot, save_figure, suptitle
from .stats import plus_minus


def round_series(history: pd.DataFrame, column: str) -> pd.Series:
    """A history column indexed by round (rounds without an evaluation dropped)."""
    return history[["round", column]].dropna().set_index("round")[column]


def turn_series(history: pd.DataFrame, column: str, rounds_per_turn: int) -> pd.Series:
    """A history column per communication turn: the value after the turn's last evaluated round."""
    series = round_series(history, column)
    turns = series.index.map(lambda r: math.ceil(r / rounds_per_turn)).rename("turn")
    return series.groupby(turns).last()


def seed_table(item: ReportItem, setting: str, method: str, column: str,
               per_run: Callable[[pd.DataFrame, str], pd.Series] = round_series) -> pd.DataFrame | None:
    """``per_run(history, column)`` of every seed's run as one column each (None if no run logs ``column``)."""
    series = []
    for seed in item.seeds:
        history = pd.read_csv(item.run_file(setting, method, seed, "history.csv"))
        if column in history:
            series.append(per_run(history, column))
    return pd.concat(series, axis=1) if series else None


@register_figure_kind("curves", inputs=run_inputs("history.csv"), reads=("metric", "eval"))
def curves(item: ReportItem, out_png: Path) -> None:
    """Metric per round, one line per method (mean over seeds, band = 95% t-interval of the mean), one panel per
    setting."""
    from matplotlib.ticker import MaxNLocator

    plt, spec = pyplot(), item.spec
    metrics = spec.get("metrics") or [spec.get("metric", "acc")]
    evals = spec.get("evals") or [spec.get("eval", "global")]
    panels = [(s, m, e) for s in spec["settings"] for m in metrics for e in evals]
    ncols = min(len(panels), 4)
    nrows = int(np.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 3.2 * nrows), squeeze=False)
    labels = item.method_labels(spec["methods"])
    for ax, (setting, metric, eval_key) in zip(axes.flat, panels):
        for method in spec["methods"]:
            table = seed_table(item, setting, method, f"{eval_key}/{metric}")
            if table is not None:
                plot_mean_band(ax, table, labels[method], scale=100)
        ax.set_title(f"{item.setting_label(setting)} — {eval_key}")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"{metric} (%)")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), bbox_to_anchor=(0.5, -0.02))
    suptitle(fig, item.title, f"line and band: {plus_minus(len(item.seeds))}")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    save_figure(fig, out_png)
    plt.close(fig)


@register_figure_kind("alignment_curves", inputs=run_inputs("history.csv"), reads=("metric", "eval"))
def alignment_curves(item: ReportItem, out_png: Path) -> None:
    from matplotlib.ticker import MaxNLocator

    plt, spec = pyplot(), item.spec
    per_turn = (spec.get("options") or {}).get("rounds_per_turn", {})
    metric = spec.get("metric", "cos_sim")
    evals = spec.get("evals") or ["client0", "client1", "clients_mean"]
    panels = [(s, e) for s in spec["settings"] for e in evals]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    labels = item.method_labels(spec["methods"])
    for ax, (setting, eval_key) in zip(axes.flat, panels):
        for method in spec["methods"]:
            rounds_per_turn = int(per_turn.get(method, 1))
            table = seed_table(item, setting, method, f"{eval_key}/{metric}",
                               per_run=lambda history, col: turn_series(history, col, rounds_per_turn))
            if table is not None:
                plot_mean_band(ax, table, labels[method], marker="o")
        ax.set_title(f"{item.setting_label(setting)} — {eval_key}", fontsize=9)
        ax.set_xlabel("communication turn")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(metric)
        ax.legend(fontsize=7)
    suptitle(fig, item.title, f"line and band: {plus_minus(len(item.seeds))}")
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)
