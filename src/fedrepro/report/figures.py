"""Figures from per-run files. Each figure kind is a function
``(project, paper, name, spec, out_png) -> None`` registered in :data:`FIGURE_KINDS` (or, for
kinds that live in another module, as a 'module:function' path in :data:`FIGURE_PLUGINS`).
Every figure is written as PNG and PDF.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..config import Project
from ..io import atomic_path
from .tables import run_dir


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt


def save_figure(fig, out_png: str | Path) -> None:
    out_png = Path(out_png)
    for path in (out_png, out_png.with_suffix(".pdf")):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix[1:], dpi=150, bbox_inches="tight")


def method_label(project: Project, paper: str, method: str) -> str:
    return project.papers[paper]["methods"][method].get("label", method)


def setting_label(project: Project, paper: str, setting: str) -> str:
    return project.papers[paper]["settings"][setting].get("label", setting)


def round_series(history: pd.DataFrame, column: str) -> pd.Series:
    """A history column indexed by round (rounds without an evaluation dropped)."""
    return history[["round", column]].dropna().set_index("round")[column]


def seed_table(project: Project, paper: str, setting: str, method: str, column: str,
               per_run=round_series) -> pd.DataFrame | None:
    """``per_run(history, column)`` of every seed's run as one column each (None if no run logs ``column``)."""
    series = []
    for seed in project.config["seeds"]:
        history = pd.read_csv(run_dir(paper, setting, method, seed) / "history.csv")
        if column in history:
            series.append(per_run(history, column))
    return pd.concat(series, axis=1) if series else None


def plot_mean_band(ax, table: pd.DataFrame, label: str, scale: float = 1.0, **style) -> None:
    """The mean over a table's columns (seeds) as a line, ± their std as a band."""
    mean, std = scale * table.mean(axis=1), scale * table.std(axis=1).fillna(0)
    line, = ax.plot(mean.index, mean, label=label, **style)
    ax.fill_between(mean.index, mean - std, mean + std, alpha=0.2, color=line.get_color())


def curves(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    """Metric per round, one line per method (mean over seeds, band = ± std), one panel per setting."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    metrics = spec.get("metrics") or [spec.get("metric", "acc")]
    evals = spec.get("evals") or [spec.get("eval", "global")]
    settings = spec["settings"]
    panels = [(s, m, e) for s in settings for m in metrics for e in evals]
    ncols = min(len(panels), 4)
    nrows = int(np.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 3.2 * nrows), squeeze=False)
    for ax, (setting, metric, eval_key) in zip(axes.flat, panels):
        column = f"{eval_key}/{metric}"
        for method in spec["methods"]:
            table = seed_table(project, paper, setting, method, column)
            if table is not None:
                plot_mean_band(ax, table, method_label(project, paper, method), scale=100)
        ax.set_title(f"{setting_label(project, paper, setting)} — {eval_key}")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"{metric} (%)")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(spec.get("title", name) + f"  (mean ± std over {len(project.config['seeds'])} seeds)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    save_figure(fig, out_png)
    plt.close(fig)


def split_heatmap(counts: pd.DataFrame, class_names: list[str], title: str, out_png: Path) -> None:
    """Client x class training counts as an annotated heatmap (written by the split rule)."""
    plt = _plt()
    import seaborn as sns

    rows = counts[counts["client"] != "reference"].set_index("client")[class_names]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(class_names) + 2), max(2.5, 0.45 * len(rows) + 1.2)))
    sns.heatmap(rows, annot=len(class_names) <= 20, fmt="d", cmap="viridis", cbar_kws={"label": "images"}, ax=ax)
    ax.set_xlabel("class")
    ax.set_ylabel("")
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)


def splits(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    """The client x class count heatmaps of several settings side by side."""
    from ..data import registry

    plt = _plt()
    import seaborn as sns

    settings = spec["settings"]
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 3.5), squeeze=False)
    for ax, setting in zip(axes.flat, settings):
        s = project.papers[paper]["settings"][setting]
        classes = list(registry.get(s["dataset"]).classes)
        counts = pd.read_csv(Path("resources/splits") / f"{project.split_id(paper, setting, project.config['seeds'][0])}.counts.csv")
        rows = counts[~counts["client"].isin(["reference"])].set_index("client")[classes]
        sns.heatmap(rows, annot=len(classes) <= 12, fmt="d", cmap="viridis", cbar=False, ax=ax)
        ax.set_title(setting_label(project, paper, setting))
        ax.set_ylabel("")
    fig.suptitle(spec.get("title", name))
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)


FIGURE_KINDS = {"curves": curves, "splits": splits}
FIGURE_PLUGINS: dict[str, str] = {   # kind -> "module:function", for kinds defined elsewhere
    "radar": "fedrepro.report.clip_figures:radar",
    "client_bars": "fedrepro.report.clip_figures:client_bars",
    "roc": "fedrepro.report.clip_figures:roc",
    "dca": "fedrepro.report.clip_figures:dca",
    "reliability": "fedrepro.report.clip_figures:reliability",
    "backbones": "fedrepro.report.clip_figures:backbones",
    "prototypes": "fedrepro.report.proto_figures:prototype_activations",
    "bubbles": "fedrepro.report.fediic:bubbles",
    "tsne": "fedrepro.report.fediic:tsne",
    "table_plot": "fedrepro.report.feddra_figures:table_plot",
    "alignment_curves": "fedrepro.report.feddra_figures:alignment_curves",
}


def make_figure(project: Project, paper: str, name: str, out_png: str | Path) -> None:
    spec = project.papers[paper]["figures"][name]
    kind = spec["kind"]
    if kind in FIGURE_KINDS:
        fn = FIGURE_KINDS[kind]
    elif kind in FIGURE_PLUGINS:
        from ..methods import load_class

        fn = load_class(FIGURE_PLUGINS[kind])
    else:
        raise KeyError(f"unknown figure kind {kind!r}; known: {sorted(FIGURE_KINDS) + sorted(FIGURE_PLUGINS)}")
    fn(project, paper, name, spec, Path(out_png))
