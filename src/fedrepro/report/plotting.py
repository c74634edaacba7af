"""Matplotlib plumbing shared by the figure kinds: the backend, panel grids, legends, PNG + PDF output."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..io import atomic_path


def pyplot():
    """matplotlib.pyplot on the Agg backend with seaborn's paper style (imported only when drawing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt


def save_figure(fig, out_png: str | Path) -> None:
    """Write ``out_png`` and the PDF beside it, each atomically."""
    out_png = Path(out_png)
    for path in (out_png, out_png.with_suffix(".pdf")):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix[1:], dpi=150, bbox_inches="tight")


def grid(plt, n_panels: int, ncols: int, size=(4.2, 3.4), **kw):
    """A figure with ``n_panels`` axes in rows of ``ncols`` (unused axes hidden)."""
    ncols = max(1, min(n_panels, ncols))
    nrows = int(math.ceil(n_panels / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, **kw)
    for ax in list(axes.flat)[n_panels:]:
        ax.axis("off")
    return fig, list(axes.flat)[:n_panels]


def finish(fig, plt, title: str, subtitle: str, out_png: Path, legend_ax=None) -> None:
    """One legend below the panels (from ``legend_ax``), the title with its subtitle, save, close."""
    if legend_ax is not None:
        handles, labels = legend_ax.get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), bbox_to_anchor=(0.5, -0.01))
    fig.suptitle(f"{title}  ({subtitle})")
    fig.tight_layout(rect=(0, 0.07 if legend_ax is not None else 0, 1, 0.95))
    save_figure(fig, out_png)
    plt.close(fig)


def plot_mean_band(ax, table: pd.DataFrame, label: str, scale: float = 1.0, **style) -> None:
    """The mean over a table's columns (seeds) as a line, ± their std as a band in the line's colour."""
    mean, std = scale * table.mean(axis=1), scale * table.std(axis=1).fillna(0)
    line, = ax.plot(mean.index, mean, label=label, **style)
    ax.fill_between(mean.index, mean - std, mean + std, alpha=0.2, color=line.get_color())
