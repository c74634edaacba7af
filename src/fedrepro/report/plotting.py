"""Matplotlib plumbing shared by the figure kinds: the backend, panel grids, legends, titles that wrap instead of
being cut, PNG + PDF output, and the line on every figure's face that says what data it ran on (:func:`data_note`)."""

from __future__ import annotations

import contextlib
import math
import textwrap
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


# what data the figure being drawn ran on (set by :func:`data_note` around a figure's drawing; drawn by save_figure)
_NOTE: dict[str, str | None] = {"text": None}


@contextlib.contextmanager
def data_note(text: str | None):
    """Every figure saved inside this block carries ``text`` above its title (e.g. "demo: stand-in data, ..."), so a
    figure taken out of its page still says what it shows. None: no line."""
    before, _NOTE["text"] = _NOTE["text"], text
    try:
        yield
    finally:
        _NOTE["text"] = before


def wrap(fig, text: str, fontsize: float) -> str:
    """``text`` broken into lines that fit the figure's width at ``fontsize`` (about 0.55 em per character)."""
    width = max(30, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))
    return "\n".join(textwrap.fill(part, width) for part in text.split("\n"))


def suptitle(fig, title: str, subtitle: str = "", fontsize: float = 10) -> None:
    """The figure's title and, on its own line(s), its subtitle in parentheses; wrapped, never cut."""
    fig.suptitle(wrap(fig, title + (f"\n({subtitle})" if subtitle else ""), fontsize), fontsize=fontsize)


def save_figure(fig, out_png: str | Path) -> None:
    """Write ``out_png`` and the PDF beside it, each atomically; with :func:`data_note`'s line above everything."""
    out_png = Path(out_png)
    if _NOTE["text"]:     # above the figure's top edge, where no title or panel is; the tight box takes it in
        fig.text(0.5, 1.005, wrap(fig, _NOTE["text"], 8), ha="center", va="bottom", fontsize=8, color="#8a4b00")
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
    suptitle(fig, title, subtitle)
    fig.tight_layout(rect=(0, 0.07 if legend_ax is not None else 0, 1, 0.95))
    save_figure(fig, out_png)
    plt.close(fig)


def plot_mean_band(ax, table: pd.DataFrame, label: str, scale: float = 1.0, **style) -> None:
    """The mean over a table's columns (seeds) as a line, ± the 95% t-interval half-width of that mean as a band in
    the line's colour (:data:`fedrepro.report.stats.PLUS_MINUS`)."""
    from .stats import ci95_per_row

    mean, half = scale * table.mean(axis=1), scale * ci95_per_row(table)
    line, = ax.plot(mean.index, mean, label=label, **style)
    ax.fill_between(mean.index, mean - half, mean + half, alpha=0.2, color=line.get_color())
