"""Figure kinds drawn from the class probabilities of the runs' selected round (``predictions.npz``,
``selected:<eval>/probs|labels``), a curve per method, over every configured seed (FAA-CLIP Figs. 5, 8, 10):

- ``roc``: macro one-vs-rest ROC, mean TPR over seeds on a common FPR grid, macro AUC (mean ± 95% CI half-width)
  in the legend. ``options.grid_points`` (101).
- ``dca``: decision curves (class-averaged net benefit vs threshold) plus "treat all" / "treat none".
  ``options.thresholds`` ([lo, hi, n], default [0.01, 0.99, 100]).
- ``reliability``: reliability diagrams in equal-width bins (seeds pooled), a panel per (eval set,
  method), ECE (mean ± 95% CI half-width over seeds) in the title. ``options.bins`` (15).

The curve maths is :mod:`fedrepro.metrics`. Spec keys: ``settings``, ``methods``, ``evals`` (default
``[global]``), ``title``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .. import metrics as M
from ..io import read_json
from ..registry import register_figure_kind
from .item import ReportItem, run_inputs
from .plotting import finish, grid, pyplot
from .stats import plus_minus, summarise

ROUND_RULES = {"best_test": "each eval set at its best test round", "best_val": "best validation round",
               "last": "last round", "best_test_round": "the round best on the global test set"}
INPUTS = run_inputs("predictions.npz", "metrics.json")


def load_predictions(item: ReportItem, setting: str, method: str, seed: int, eval_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(probs N x C, labels N) of the selected round of one run on one eval set."""
    path = item.run_file(setting, method, seed, "predictions.npz")
    with np.load(path) as data:
        key = f"selected:{eval_key}/probs"
        if key not in data:
            available = sorted(k.split(":", 1)[1].rsplit("/", 1)[0] for k in data.files if k.startswith("selected:"))
            raise KeyError(f"{path} has no predictions for eval set {eval_key!r}; available: {sorted(set(available))}")
        return np.asarray(data[key], dtype=float), np.asarray(data[f"selected:{eval_key}/labels"]).astype(int)


def evals(item: ReportItem) -> list[str]:
    return item.spec.get("evals") or [item.spec.get("eval", "global")]


def _panels(item: ReportItem) -> list[tuple[str, str]]:
    return [(s, e) for s in item.spec["settings"] for e in evals(item)]


def _panel_title(item: ReportItem, setting: str, eval_key: str) -> str:
    return f"{item.setting_label(setting)} — {eval_key}"


def _rounds_note(item: ReportItem) -> str:
    """Which round the curves' predictions come from (the runs' selection rule), for the subtitle."""
    spec = item.spec
    rules = sorted({read_json(item.run_file(s, m, seed)).get("selection", {}).get("rule", "?")
                    for s in spec["settings"] for m in spec["methods"] for seed in item.seeds})
    return "predictions: " + "; ".join(ROUND_RULES.get(r, r) for r in rules)


@register_figure_kind("roc", inputs=INPUTS, reads=("eval",))
def roc(item: ReportItem, out_png: Path) -> None:
    """Macro one-vs-rest ROC per method (mean TPR over seeds on a common FPR grid); legend: macro AUC."""
    fpr_grid = np.linspace(0.0, 1.0, int(item.options(("settings", "methods"), {"grid_points": 101})["grid_points"]))
    plt = pyplot()
    panels = _panels(item)
    fig, axes = grid(plt, len(panels), 3, size=(4.2, 4.0))
    for ax, (setting, eval_key) in zip(axes, panels):
        for method in item.spec["methods"]:
            curves = [M.macro_roc(labels, probs, fpr_grid)
                      for probs, labels in (load_predictions(item, setting, method, s, eval_key) for s in item.seeds)]
            auc = summarise([c["auc"] for c in curves])
            spread = "" if math.isnan(auc["ci95"]) else f" ± {auc['ci95']:.3f}"
            ax.plot(fpr_grid, np.mean([c["grid_tpr"] for c in curves], axis=0),
                    label=f"{item.method_label(method)} (AUC {auc['mean']:.3f}{spread})")
        ax.plot([0, 1], [0, 1], linestyle=":", color="grey", linewidth=0.8)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate (macro)")
        ax.set_title(_panel_title(item, setting, eval_key))
        ax.legend(fontsize=6, loc="lower right")
    finish(fig, plt, item.title, f"macro one-vs-rest, mean over {len(item.seeds)} seeds, AUC {plus_minus(len(item.seeds))}; "
                                 f"{_rounds_note(item)}", out_png)


@register_figure_kind("dca", inputs=INPUTS, reads=("eval",))
def dca(item: ReportItem, out_png: Path) -> None:
    """Decision curves: class-averaged net benefit vs threshold per method, treat-all and treat-none."""
    lo, hi, n = item.options(("settings", "methods"), {"thresholds": [0.01, 0.99, 100]})["thresholds"]
    plt = pyplot()
    thresholds = np.linspace(float(lo), float(hi), int(n))
    panels = _panels(item)
    fig, axes = grid(plt, len(panels), 3, size=(4.2, 3.6))
    methods = item.spec["methods"]
    for ax, (setting, eval_key) in zip(axes, panels):
        treat_all, top = [], 0.0
        for method in methods:
            curves = []
            for seed in item.seeds:
                probs, labels = load_predictions(item, setting, method, seed, eval_key)
                curves.append(M.net_benefit(labels, probs, thresholds))
                if method == methods[0]:
                    treat_all.append(M.net_benefit_treat_all(labels, probs.shape[1], thresholds))
            mean = np.mean(curves, axis=0)
            top = max(top, float(mean.max()))
            ax.plot(thresholds, mean, label=item.method_label(method))
        all_mean = np.mean(treat_all, axis=0)
        top = max(top, float(all_mean.max()), 1e-3)
        ax.plot(thresholds, all_mean, color="grey", linestyle="--", linewidth=1, label="treat all")
        ax.axhline(0.0, color="black", linewidth=1, label="treat none")
        ax.set_ylim(-0.25 * top, 1.1 * top)  # treat-all falls steeply; keep the useful range visible
        ax.set_xlabel("threshold probability")
        ax.set_ylabel("net benefit (class mean)")
        ax.set_title(_panel_title(item, setting, eval_key))
    finish(fig, plt, item.title, f"one-vs-rest, mean over {len(item.seeds)} seeds; {_rounds_note(item)}",
           out_png, legend_ax=axes[0])


@register_figure_kind("reliability", inputs=INPUTS, reads=("eval",))
def reliability(item: ReportItem, out_png: Path) -> None:
    """Reliability diagrams: accuracy vs confidence in equal-width bins (seeds pooled), one panel per
    (setting, eval set, method), ECE (mean ± 95% CI half-width over seeds) in the title."""
    n_bins = int(item.options(("settings", "methods"), {"bins": 15})["bins"])
    plt = pyplot()
    methods = item.spec["methods"]
    panels = [(s, e, m) for s, e in _panels(item) for m in methods]
    fig, axes = grid(plt, len(panels), len(methods), size=(3.6, 3.6))
    for ax, (setting, eval_key, method) in zip(axes, panels):
        runs = [load_predictions(item, setting, method, s, eval_key) for s in item.seeds]
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
        spread = "" if math.isnan(ece["ci95"]) else f" ± {100 * ece['ci95']:.2f}"
        ax.set_title(f"{item.method_label(method)}, {item.setting_label(setting)} — {eval_key}\n"
                     f"ECE {100 * ece['mean']:.2f}{spread} %", fontsize=8)
    finish(fig, plt, item.title, f"{n_bins} equal-width bins, {len(item.seeds)} seeds pooled; ECE "
                                 f"{plus_minus(len(item.seeds))}; {_rounds_note(item)}",
           out_png, legend_ax=axes[0])
