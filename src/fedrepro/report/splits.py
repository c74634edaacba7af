"""Pictures of client splits, from the split rule's count files (``resources/splits/<id>.counts.csv``).

- :func:`split_heatmap`: the client x class heatmap the split rule writes beside every split.
- figure ``splits``: the heatmaps of several settings side by side.
- figure ``radar``: kite plot of the client x class training counts, a polygon per client and a panel
  per setting (FAA-CLIP Figs. 2 and 9); averaged over the distinct splits the seeds use.
  ``options.normalize``: fractions of each client's images.
- figure ``bubbles``: client x class training counts as bubbles whose radius is proportional to the
  count, with the imbalance ratio of the pooled training data (FedIIC Fig. 2).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..registry import register_figure_kind
from .item import ReportItem, split_count_inputs
from .plotting import finish, grid, pyplot, save_figure, suptitle
from .tables import NON_CLIENT_ROWS, imbalance_ratio, pooled_train_counts


def split_heatmap(counts: pd.DataFrame, class_names: list[str], title: str, out_png: Path) -> None:
    """Client x class training counts as an annotated heatmap (written by the split rule)."""
    import seaborn as sns

    plt = pyplot()
    rows = counts[counts["client"] != "reference"].set_index("client")[class_names]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(class_names) + 2), max(2.5, 0.45 * len(rows) + 1.2)))
    sns.heatmap(rows, annot=len(class_names) <= 20, fmt="d", cmap="viridis", cbar_kws={"label": "images"}, ax=ax)
    ax.set_xlabel("class")
    ax.set_ylabel("")
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)


@register_figure_kind("splits", inputs=split_count_inputs())
def splits(item: ReportItem, out_png: Path) -> None:
    """The client x class count heatmaps of several settings side by side."""
    import seaborn as sns

    plt = pyplot()
    settings = item.spec["settings"]
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 3.5), squeeze=False)
    for ax, setting in zip(axes.flat, settings):
        classes = item.classes(setting)
        counts = item.split_counts(setting)
        rows = counts[~counts["client"].isin(["reference"])].set_index("client")[classes]
        sns.heatmap(rows, annot=len(classes) <= 12, fmt="d", cmap="viridis", cbar=False, ax=ax)
        ax.set_title(item.setting_label(setting))
        ax.set_ylabel("")
    suptitle(fig, item.title)
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)


def client_class_counts(item: ReportItem, setting: str) -> pd.DataFrame:
    """Client x class training counts (mean over the distinct splits the seeds use)."""
    classes = item.classes(setting)
    seeds = {item.split_id(setting, seed): seed for seed in item.seeds}
    tables = []
    for seed in seeds.values():
        counts = item.split_counts(setting, seed)
        tables.append(counts[~counts["client"].isin(NON_CLIENT_ROWS)].set_index("client")[classes].astype(float))
    return sum(tables) / len(tables)


@register_figure_kind("radar", inputs=split_count_inputs(all_seeds=True))
def radar(item: ReportItem, out_png: Path) -> None:
    """A kite per setting: one closed polygon per client over the class axes."""
    normalize = bool(item.options(("settings",), {"normalize": False})["normalize"])
    plt = pyplot()
    settings = item.spec["settings"]
    fig, axes = grid(plt, len(settings), 3, size=(4.6, 4.6), subplot_kw={"projection": "polar"})
    for ax, setting in zip(axes, settings):
        counts = client_class_counts(item, setting)
        if normalize:
            counts = counts.div(counts.sum(axis=1).replace(0, 1), axis=0)
        angles = np.linspace(0, 2 * np.pi, counts.shape[1], endpoint=False)
        closed = np.r_[angles, angles[:1]]
        for client, row in counts.iterrows():
            values = row.to_numpy()
            ax.plot(closed, np.r_[values, values[:1]], linewidth=1.2, label=str(client))
            ax.fill(closed, np.r_[values, values[:1]], alpha=0.12)
        ax.set_xticks(angles)
        ax.set_xticklabels(counts.columns, fontsize=6 if counts.shape[1] > 12 else 8)
        ax.set_title(item.setting_label(setting), pad=14)
    what = "fraction of each client's training images" if normalize else "training images per class"
    finish(fig, plt, item.title, what, out_png, legend_ax=axes[0])


@register_figure_kind("bubbles", inputs=split_count_inputs())
def bubbles(item: ReportItem, out_png: Path) -> None:
    """One panel per setting; bubble radius proportional to the client's count of the class."""
    plt = pyplot()
    settings = item.spec["settings"]
    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 4.0), squeeze=False)
    max_size = float(item.options((), {"max_marker_area": 600.0})["max_marker_area"])
    for ax, setting in zip(axes.flat, settings):
        classes = item.classes(setting)
        counts = item.split_counts(setting)
        clients = counts[~counts["client"].isin(NON_CLIENT_ROWS)].reset_index(drop=True)
        values = clients[classes].to_numpy(dtype=float)
        top = values.max() if values.size and values.max() > 0 else 1.0
        ys, xs = np.meshgrid(np.arange(len(clients)), np.arange(len(classes)), indexing="ij")
        # marker area ~ radius^2, radius ~ count
        ax.scatter(xs.ravel(), ys.ravel(), s=max_size * (values.ravel() / top) ** 2, alpha=0.7, edgecolors="k", linewidths=0.3)
        ax.set_xticks(range(len(classes)), classes, rotation=45, ha="right")
        ax.set_yticks(range(len(clients)), [str(c) for c in clients["client"]])
        ax.set_xlim(-0.7, len(classes) - 0.3)
        ax.set_ylim(len(clients) - 0.3, -0.7)
        ratio = imbalance_ratio(pooled_train_counts(counts, classes))
        ax.set_title(f"{item.setting_label(setting)}\nimbalance ratio {ratio:.2f}")
    suptitle(fig, item.title)
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)
