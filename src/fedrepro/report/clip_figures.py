"""Figure kinds of FAA-CLIP (and FACMIC), each ``(project, paper, name, spec, out_png)`` writing PNG + PDF.

- ``radar``: kite plot of the client x class training counts (FAA-CLIP Fig. 2 and 9), a polygon
  per client and a panel per setting, from ``resources/splits/<split id>.counts.csv``.
- ``client_bars``: per-client test accuracy, bars grouped by eval set, one bar per method (Fig. 4).
- ``roc``: macro one-vs-rest ROC with the macro AUC in the legend, a curve per method (Fig. 5 left).
- ``dca``: decision curves (net benefit vs threshold) per method plus "treat all"/"treat none"
  (Fig. 5 right).
- ``reliability``: reliability diagrams with ECE, a panel per (eval set, method) (Fig. 8 and 10).
- ``backbones``: BACC and macro-F1 per client for backbone variants, grouped bars (Fig. 7).

Runs are read from ``results/runs/<paper>/<setting>/<method>/seed<k>/`` (metrics.json for bars,
predictions.npz ``selected:<eval>/probs|labels`` for curves). Everything is over the configured
seeds: bars show the mean with the configured error bar (``report.error_bars``, std by default),
ROC and decision curves are averaged over seeds on a common grid (the legend gives AUC mean ± std),
reliability diagrams pool the seeds' predictions into one set of bins and give the ECE as mean ±
std over seeds. The numbers come from :mod:`fedrepro.metrics`.

Spec keys: ``settings``, ``methods``, ``evals`` (default ``[global]``), ``metric``/``metrics``,
``title``; ``options``: ``normalize`` (radar: fractions of each client's images), ``bins``
(reliability, 15), ``thresholds`` ([lo, hi, n], dca, default [0.01, 0.99, 100]), ``grid_points``
(roc, 101).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from .. import metrics as M
from ..config import Project
from ..io import read_json
from .figures import _plt, method_label, save_figure, setting_label
from .stats import ERROR_BARS, summarise
from .tables import metric_value, run_dir

NOT_CLIENTS = ("global_test", "reference")


# --------------------------------------------------------------------------------------------
# reading runs

def _require(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: the figure needs this run; build it first "
                                f"(snakemake {path.parent / 'metrics.json'})")
    return path


def load_predictions(paper: str, setting: str, method: str, seed: int, eval_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(probs N x C, labels N) of the selected round of one run on one eval set."""
    path = _require(run_dir(paper, setting, method, seed) / "predictions.npz")
    with np.load(path) as data:
        key = f"selected:{eval_key}/probs"
        if key not in data:
            available = sorted(k.split(":", 1)[1].rsplit("/", 1)[0] for k in data.files if k.startswith("selected:"))
            raise KeyError(f"{path} has no predictions for eval set {eval_key!r}; available: {sorted(set(available))}")
        return np.asarray(data[key], dtype=float), np.asarray(data[f"selected:{eval_key}/labels"]).astype(int)


def metric_summary(project: Project, paper: str, setting: str, method: str, eval_key: str, metric: str) -> dict:
    values = [metric_value(read_json(_require(run_dir(paper, setting, method, seed) / "metrics.json")), eval_key, metric)
              for seed in project.config["seeds"]]
    return summarise(values)


def _checked(spec: dict, name: str, needs: tuple[str, ...], options: dict) -> dict:
    """The figure's options with defaults filled in; missing keys or unknown options are errors
    that name the figure and what is allowed."""
    missing = [k for k in needs if not spec.get(k)]
    if missing:
        raise ValueError(f"figures/{name} (kind {spec['kind']}) needs {missing}")
    given = spec.get("options") or {}
    unknown = sorted(set(given) - set(options))
    if unknown:
        raise ValueError(f"figures/{name}/options: unknown key(s) {unknown} for kind {spec['kind']}; allowed: {sorted(options)}")
    return options | given


def _evals(spec: dict) -> list[str]:
    return spec.get("evals") or [spec.get("eval", "global")]


def _error_bar(project: Project) -> str:
    return project.config["report"]["error_bars"]


def _grid(plt, n_panels: int, ncols: int, size=(4.2, 3.4), **kw):
    ncols = max(1, min(n_panels, ncols))
    nrows = int(math.ceil(n_panels / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, **kw)
    for ax in list(axes.flat)[n_panels:]:
        ax.axis("off")
    return fig, list(axes.flat)[:n_panels]


def _finish(fig, plt, spec: dict, name: str, subtitle: str, out_png: Path, legend_ax=None) -> None:
    if legend_ax is not None:
        handles, labels = legend_ax.get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), bbox_to_anchor=(0.5, -0.01))
    fig.suptitle(f"{spec.get('title', name)}  ({subtitle})")
    fig.tight_layout(rect=(0, 0.07 if legend_ax is not None else 0, 1, 0.95))
    save_figure(fig, out_png)
    plt.close(fig)


def _seeds_note(project: Project) -> str:
    return f"{len(project.config['seeds'])} seeds"


ROUND_RULES = {"best_test": "each eval set at its best test round", "best_val": "best validation round",
               "last": "last round", "best_test_round": "the round best on the global test set"}


def _rounds_note(project: Project, paper: str, spec: dict) -> str:
    """Which round the curves' predictions come from (the runs' selection rule), for the figure's subtitle."""
    rules = sorted({read_json(_require(run_dir(paper, s, m, seed) / "metrics.json")).get("selection", {}).get("rule", "?")
                    for s in spec["settings"] for m in spec["methods"] for seed in project.config["seeds"]})
    return "predictions: " + "; ".join(ROUND_RULES.get(r, r) for r in rules)


# --------------------------------------------------------------------------------------------
# radar (kite) plot of the split

def client_class_counts(project: Project, paper: str, setting: str, splits_root: str | Path = "resources/splits") -> pd.DataFrame:
    """Client x class training counts (mean over the distinct splits the seeds use)."""
    from ..data import registry

    classes = list(registry.get(project.papers[paper]["settings"][setting]["dataset"]).classes)
    ids = dict.fromkeys(project.split_id(paper, setting, seed) for seed in project.config["seeds"])
    tables = []
    for split_id in ids:
        counts = pd.read_csv(_require(Path(splits_root) / f"{split_id}.counts.csv"))
        tables.append(counts[~counts["client"].isin(NOT_CLIENTS)].set_index("client")[classes].astype(float))
    return sum(tables) / len(tables)


def radar(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    """A kite per setting: one closed polygon per client over the class axes."""
    normalize = bool(_checked(spec, name, ("settings",), {"normalize": False})["normalize"])
    plt = _plt()
    settings = spec["settings"]
    fig, axes = _grid(plt, len(settings), 3, size=(4.6, 4.6), subplot_kw={"projection": "polar"})
    for ax, setting in zip(axes, settings):
        counts = client_class_counts(project, paper, setting)
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
        ax.set_title(setting_label(project, paper, setting), pad=14)
    what = "fraction of each client's training images" if normalize else "training images per class"
    _finish(fig, plt, spec, name, what, out_png, legend_ax=axes[0])


# --------------------------------------------------------------------------------------------
# grouped bars (client_bars, backbones)

def _bars(project: Project, paper: str, name: str, spec: dict, out_png: Path, metrics: list[str]) -> None:
    """A panel per (setting, metric): groups = eval sets, one bar per method, mean ± error over seeds."""
    _checked(spec, name, ("settings", "methods"), {})
    plt = _plt()
    evals, methods, bars = _evals(spec), spec["methods"], _error_bar(project)
    panels = [(s, m) for s in spec["settings"] for m in metrics]
    fig, axes = _grid(plt, len(panels), 3, size=(max(4.2, 0.9 * len(evals) * max(1, len(methods) / 2)), 3.4))
    width = 0.8 / len(methods)
    x = np.arange(len(evals))
    for ax, (setting, metric) in zip(axes, panels):
        for i, method in enumerate(methods):
            stats = [metric_summary(project, paper, setting, method, e, metric) for e in evals]
            mean = np.array([100 * s["mean"] for s in stats])
            err = np.array([0.0 if math.isnan(s[bars]) else 100 * s[bars] for s in stats])
            ax.bar(x + (i - (len(methods) - 1) / 2) * width, mean, width, yerr=err, capsize=2,
                   label=method_label(project, paper, method))
        ax.set_xticks(x)
        ax.set_xticklabels(evals, rotation=30 if len(evals) > 4 else 0)
        ax.set_ylabel(f"{metric} (%)")
        ax.set_title(setting_label(project, paper, setting) + (f" — {metric}" if len(metrics) > 1 else ""))
    _finish(fig, plt, spec, name, f"mean ± {ERROR_BARS[bars]}, {_seeds_note(project)}", out_png, legend_ax=axes[0])


def client_bars(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    """Per-client test accuracy (or ``metric``), grouped by eval set, one bar per method, a panel per setting."""
    _bars(project, paper, name, spec, out_png, spec.get("metrics") or [spec.get("metric", "acc")])


def backbones(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    """BACC and macro-F1 (or ``metrics``) per client for backbone variants (the methods)."""
    _bars(project, paper, name, spec, out_png, spec.get("metrics") or ["bacc", "f1"])


# --------------------------------------------------------------------------------------------
# curves from predictions

def _curve_panels(spec: dict) -> list[tuple[str, str]]:
    return [(s, e) for s in spec["settings"] for e in _evals(spec)]


def _panel_title(project: Project, paper: str, setting: str, eval_key: str) -> str:
    return f"{setting_label(project, paper, setting)} — {eval_key}"


def roc(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    """Macro one-vs-rest ROC per method (mean TPR over seeds on a common FPR grid); legend: macro AUC."""
    grid = np.linspace(0.0, 1.0, int(_checked(spec, name, ("settings", "methods"), {"grid_points": 101})["grid_points"]))
    plt = _plt()
    panels = _curve_panels(spec)
    fig, axes = _grid(plt, len(panels), 3, size=(4.2, 4.0))
    for ax, (setting, eval_key) in zip(axes, panels):
        for method in spec["methods"]:
            curves = [M.macro_roc(labels, probs, grid)
                      for probs, labels in (load_predictions(paper, setting, method, s, eval_key) for s in project.config["seeds"])]
            auc = summarise([c["auc"] for c in curves])
            spread = "" if math.isnan(auc["std"]) else f" ± {auc['std']:.3f}"
            ax.plot(grid, np.mean([c["grid_tpr"] for c in curves], axis=0),
                    label=f"{method_label(project, paper, method)} (AUC {auc['mean']:.3f}{spread})")
        ax.plot([0, 1], [0, 1], linestyle=":", color="grey", linewidth=0.8)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate (macro)")
        ax.set_title(_panel_title(project, paper, setting, eval_key))
        ax.legend(fontsize=6, loc="lower right")
    _finish(fig, plt, spec, name, f"macro one-vs-rest, mean over {_seeds_note(project)}; {_rounds_note(project, paper, spec)}",
            out_png)


def dca(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    """Decision curves: class-averaged net benefit vs threshold per method, treat-all and treat-none."""
    lo, hi, n = _checked(spec, name, ("settings", "methods"), {"thresholds": [0.01, 0.99, 100]})["thresholds"]
    plt = _plt()
    thresholds = np.linspace(float(lo), float(hi), int(n))
    panels = _curve_panels(spec)
    fig, axes = _grid(plt, len(panels), 3, size=(4.2, 3.6))
    for ax, (setting, eval_key) in zip(axes, panels):
        treat_all, top = [], 0.0
        for method in spec["methods"]:
            curves = []
            for seed in project.config["seeds"]:
                probs, labels = load_predictions(paper, setting, method, seed, eval_key)
                curves.append(M.net_benefit(labels, probs, thresholds))
                if method == spec["methods"][0]:
                    treat_all.append(M.net_benefit_treat_all(labels, probs.shape[1], thresholds))
            mean = np.mean(curves, axis=0)
            top = max(top, float(mean.max()))
            ax.plot(thresholds, mean, label=method_label(project, paper, method))
        all_mean = np.mean(treat_all, axis=0)
        top = max(top, float(all_mean.max()), 1e-3)
        ax.plot(thresholds, all_mean, color="grey", linestyle="--", linewidth=1, label="treat all")
        ax.axhline(0.0, color="black", linewidth=1, label="treat none")
        ax.set_ylim(-0.25 * top, 1.1 * top)  # treat-all falls steeply; keep the useful range visible
        ax.set_xlabel("threshold probability")
        ax.set_ylabel("net benefit (class mean)")
        ax.set_title(_panel_title(project, paper, setting, eval_key))
    _finish(fig, plt, spec, name, f"one-vs-rest, mean over {_seeds_note(project)}; {_rounds_note(project, paper, spec)}",
            out_png, legend_ax=axes[0])


def reliability(project: Project, paper: str, name: str, spec: dict, out_png: Path) -> None:
    """Reliability diagrams: accuracy vs confidence in equal-width bins (seeds pooled), one panel per
    (setting, eval set, method), ECE (mean ± std over seeds) in the title."""
    n_bins = int(_checked(spec, name, ("settings", "methods"), {"bins": 15})["bins"])
    plt = _plt()
    methods = spec["methods"]
    panels = [(s, e, m) for s, e in _curve_panels(spec) for m in methods]
    fig, axes = _grid(plt, len(panels), len(methods), size=(3.6, 3.6))
    for ax, (setting, eval_key, method) in zip(axes, panels):
        runs = [load_predictions(paper, setting, method, s, eval_key) for s in project.config["seeds"]]
        ece = summarise([M.expected_calibration_error(labels, probs, n_bins) for probs, labels in runs])
        bins = M.reliability_bins(np.concatenate([labels for _, labels in runs]),
                                  np.concatenate([probs for probs, _ in runs]), n_bins)
        centers = (bins["edges"][:-1] + bins["edges"][1:]) / 2
        filled = bins["count"] > 0
        width = 1.0 / n_bins
        ax.bar(centers[filled], bins["accuracy"][filled], width, edgecolor="black", linewidth=0.4, label="accuracy")
        ax.bar(centers[filled], (bins["confidence"] - bins["accuracy"])[filled], width, bottom=bins["accuracy"][filled],
               color="tab:red", alpha=0.35, edgecolor="tab:red", linewidth=0.4, label="gap to confidence")
        ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=0.8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
        spread = "" if math.isnan(ece["std"]) else f" ± {100 * ece['std']:.2f}"
        ax.set_title(f"{method_label(project, paper, method)}, {setting_label(project, paper, setting)} — {eval_key}\n"
                     f"ECE {100 * ece['mean']:.2f}{spread} %", fontsize=8)
    _finish(fig, plt, spec, name, f"{n_bins} equal-width bins, {_seeds_note(project)} pooled; "
            f"{_rounds_note(project, paper, spec)}", out_png, legend_ax=axes[0])
