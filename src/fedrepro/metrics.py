"""Classification metrics in plain NumPy.

Conventions follow scikit-learn, which the papers' code uses (tests compare against it), so the
numbers are comparable with the published ones; NumPy keeps training jobs free of the sklearn import.

- ACC: fraction correct.
- BACC: mean recall over the classes present in ``y_true`` (``balanced_accuracy_score``).
- macro-F1: mean F1 over the classes present in ``y_true`` or ``y_pred`` (``f1_score(average="macro")``).
- AUC: one-vs-rest ROC AUC per class, averaged over classes that have both positives and negatives.
- ECE: expected calibration error with equal-width confidence bins (15 by default).

Curves for figures (FAA-CLIP Fig. 5, its ``DCA_ROC.py``):
- macro ROC: one-vs-rest ROC per class, each class's polyline interpolated on the union of the
  classes' FPRs and averaged (scikit-learn's recipe); macro AUC = trapezoidal area under that mean curve.
- decision curves: net benefit NB(t) = (TP - FP * t / (1 - t)) / N of "treat if p_c >= t", per class
  one-vs-rest and averaged over classes; "treat all" NB(t) = pi - (1 - pi) * t / (1 - t) with the
  class prevalence pi, averaged over classes; "treat none" is 0.
- Recall@k (image-text retrieval): the paired item is among the k most similar candidates.
"""

from __future__ import annotations

import numpy as np


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return float(np.mean(y_true == y_pred)) if y_true.size else float("nan")


def balanced_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if not y_true.size:
        return float("nan")
    recalls = [np.mean(y_pred[y_true == c] == c) for c in np.unique(y_true)]
    return float(np.mean(recalls))


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if not y_true.size:
        return float("nan")
    scores = []
    for c in np.union1d(np.unique(y_true), np.unique(y_pred)):
        tp = np.sum((y_pred == c) & (y_true == c))
        fp = np.sum((y_pred == c) & (y_true != c))
        fn = np.sum((y_pred != c) & (y_true == c))
        denom = 2 * tp + fp + fn
        scores.append(2 * tp / denom if denom else 0.0)
    return float(np.mean(scores))


def binary_auc(y_true: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic, with average ranks for ties."""
    y_true = np.asarray(y_true).astype(bool)
    n_pos, n_neg = int(y_true.sum()), int((~y_true).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _average_ranks(np.asarray(score, dtype=float))
    return float((ranks[y_true].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def macro_auc_ovr(y_true: np.ndarray, probs: np.ndarray) -> float:
    y_true = np.asarray(y_true)
    aucs = [binary_auc(y_true == c, probs[:, c]) for c in range(probs.shape[1])]
    aucs = [a for a in aucs if not np.isnan(a)]
    return float(np.mean(aucs)) if aucs else float("nan")


def reliability_bins(y_true: np.ndarray, probs: np.ndarray, n_bins: int = 15) -> dict[str, np.ndarray]:
    """Per-bin confidence, accuracy and count for reliability diagrams (equal-width bins on max prob)."""
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == np.asarray(y_true)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # bin i holds (edges[i], edges[i+1]]; a confidence of exactly 0 goes to the first bin
    index = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, n_bins - 1)
    count = np.bincount(index, minlength=n_bins)
    conf_sum = np.bincount(index, weights=confidence, minlength=n_bins)
    acc_sum = np.bincount(index, weights=correct.astype(float), minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "edges": edges,
            "count": count,
            "confidence": np.where(count > 0, conf_sum / count, np.nan),
            "accuracy": np.where(count > 0, acc_sum / count, np.nan),
        }


def expected_calibration_error(y_true: np.ndarray, probs: np.ndarray, n_bins: int = 15) -> float:
    if not len(y_true):
        return float("nan")
    bins = reliability_bins(y_true, probs, n_bins)
    filled = bins["count"] > 0
    gaps = np.abs(bins["accuracy"][filled] - bins["confidence"][filled])
    return float(np.sum(gaps * bins["count"][filled]) / len(y_true))


def classification_metrics(y_true: np.ndarray, probs: np.ndarray, n_bins: int = 15) -> dict[str, float]:
    """Every per-evaluation metric the tables use, from labels and class probabilities."""
    y_true = np.asarray(y_true)
    y_pred = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=int)
    return {
        "acc": accuracy(y_true, y_pred),
        "bacc": balanced_accuracy(y_true, y_pred),
        "f1": macro_f1(y_true, y_pred),
        "auc": macro_auc_ovr(y_true, probs) if len(probs) else float("nan"),
        "ece": expected_calibration_error(y_true, probs, n_bins),
        "n": int(len(y_true)),
    }


def roc_curve(y_true: np.ndarray, score: np.ndarray, drop_intermediate: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Binary ROC (fpr, tpr) with one point per distinct score, from (0, 0) to (1, 1); tied scores
    form one step (``sklearn.metrics.roc_curve(drop_intermediate=False)``). ``drop_intermediate``
    drops the points sklearn's default drops: a point whose FP and TP counts both have a zero second
    difference (the middle of equal, collinear increments). The polyline is the same either way, but
    the set of FPRs is not, and the macro average interpolates on the union of the classes' FPRs."""
    y_true = np.asarray(y_true).astype(bool)
    score = np.asarray(score, dtype=float)
    n_pos, n_neg = int(y_true.sum()), int((~y_true).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"a ROC curve needs positives and negatives (got {n_pos} and {n_neg})")
    order = np.argsort(-score, kind="mergesort")
    score, y_true = score[order], y_true[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(score)), len(score) - 1]
    tps = np.cumsum(y_true)[last_of_tie]
    fps = (last_of_tie + 1) - tps
    if drop_intermediate and len(fps) > 2:
        keep = np.r_[True, (np.diff(fps, 2) != 0) | (np.diff(tps, 2) != 0), True]
        fps, tps = fps[keep], tps[keep]
    return np.r_[0.0, fps / n_neg], np.r_[0.0, tps / n_pos]


def roc_interpolate(x: np.ndarray, fpr: np.ndarray, tpr: np.ndarray) -> np.ndarray:
    """TPR of the ROC polyline (``fpr`` non-decreasing, vertical steps as repeated FPRs) at the FPRs ``x``:
    linear between consecutive points, and at an FPR reached by a vertical step the top of the step.
    This is what ``np.interp(x, fpr, tpr)`` gives on sklearn's ``roc_curve`` output (the macro-average
    recipe of the authors' code), written out so it does not rest on np.interp's handling of repeats."""
    x = np.asarray(x, dtype=float)
    last = np.clip(np.searchsorted(fpr, x, side="right") - 1, 0, len(fpr) - 1)   # last point with fpr <= x
    nxt = np.minimum(last + 1, len(fpr) - 1)
    run = fpr[nxt] - fpr[last]
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(run > 0, (tpr[nxt] - tpr[last]) / run, 0.0)
    return tpr[last] + slope * np.clip(x - fpr[last], 0.0, None)


def macro_roc(y_true: np.ndarray, probs: np.ndarray, grid: np.ndarray | None = None) -> dict[str, np.ndarray | float]:
    """Macro-averaged one-vs-rest ROC, exactly scikit-learn's recipe (FAA-CLIP's ``DCA_ROC.py``): every
    class's ROC points as sklearn's default ``roc_curve`` returns them (vertical steps included,
    collinear points dropped) are interpolated on the union of all classes' FPRs (:func:`roc_interpolate`)
    and the TPRs averaged; ``auc`` is the trapezoidal area under that mean curve (it can exceed the mean
    of the per-class AUCs: between two union FPRs the mean is a chord, and at a union FPR that is a
    vertical step of some class it takes that class's top of the step). Classes without positives
    or without negatives are left out (``classes`` lists the ones used). With ``grid`` the mean curve
    is also resampled on it (``grid_tpr``), so curves of several runs can be averaged."""
    y_true, probs = np.asarray(y_true), np.asarray(probs, dtype=float)
    curves = {}
    for c in range(probs.shape[1]):
        positives = y_true == c
        if positives.any() and (~positives).any():
            curves[c] = roc_curve(positives, probs[:, c], drop_intermediate=True)
    if not curves:
        raise ValueError("no class has both positives and negatives: the macro ROC is undefined")
    fpr = np.unique(np.concatenate([f for f, _ in curves.values()]))
    tpr = np.mean([roc_interpolate(fpr, f, t) for f, t in curves.values()], axis=0)
    out = {"fpr": fpr, "tpr": tpr, "auc": float(np.trapezoid(tpr, fpr)), "classes": np.array(sorted(curves))}
    if grid is not None:
        out["grid_tpr"] = np.interp(np.asarray(grid, dtype=float), fpr, tpr)
    return out


def net_benefit(y_true: np.ndarray, probs: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Decision-curve net benefit at each threshold t, averaged over the classes (one-vs-rest):
    NB_c(t) = (TP_c(t) - FP_c(t) * t / (1 - t)) / N with "positive" meaning p_c >= t."""
    y_true, probs = np.asarray(y_true), np.asarray(probs, dtype=float)
    t = np.asarray(thresholds, dtype=float)
    if np.any((t <= 0) | (t >= 1)):
        raise ValueError("decision-curve thresholds must lie strictly between 0 and 1")
    n, k = probs.shape
    onehot = y_true[:, None] == np.arange(k)[None, :]                      # N x C
    treated = probs[:, :, None] >= t[None, None, :]                         # N x C x T
    tp = np.sum(treated & onehot[:, :, None], axis=0)                       # C x T
    fp = np.sum(treated & ~onehot[:, :, None], axis=0)
    return np.mean((tp - fp * (t / (1 - t))[None, :]) / n, axis=0)


def net_benefit_treat_all(y_true: np.ndarray, num_classes: int, thresholds: np.ndarray) -> np.ndarray:
    """Net benefit of treating everyone, per class pi_c - (1 - pi_c) * t / (1 - t), averaged over classes."""
    t = np.asarray(thresholds, dtype=float)
    prevalence = np.bincount(np.asarray(y_true), minlength=num_classes)[:num_classes] / len(y_true)
    return np.mean(prevalence[:, None] - (1 - prevalence)[:, None] * (t / (1 - t))[None, :], axis=0)
def recall_at_k(similarity: np.ndarray, k: int, ties: str = "against") -> float:
    """Retrieval Recall@k: the fraction of queries (rows) whose paired item (the same index) is among
    the ``k`` most similar candidates (columns). ``ties="against"``: every other candidate at least as
    similar as the pair ranks above it (rank = number of such candidates), so a collapsed model whose
    similarities are all equal scores 0 on any pool of more than k items; ``ties="index"``: a tied
    candidate ranks above the pair only when it comes first (a top-k that returns ties in index order).
    A NaN similarity of the pair is a miss."""
    similarity = np.asarray(similarity, dtype=float)
    if not similarity.size:
        return float("nan")
    paired = np.diag(similarity)[:, None]
    others = ~np.eye(*similarity.shape, dtype=bool)
    if ties == "index":
        earlier = np.arange(similarity.shape[1])[None] < np.arange(similarity.shape[0])[:, None]
        rank = ((similarity > paired) | ((similarity == paired) & earlier)).sum(axis=1)
    elif ties == "against":
        rank = ((similarity >= paired) & others).sum(axis=1)
    else:
        raise ValueError(f"recall_at_k: unknown ties {ties!r}; allowed: against, index")
    rank = np.where(np.isnan(paired[:, 0]), similarity.shape[1], rank)
    return float(np.mean(rank < k))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks; tied values share the mean of their ranks (scipy.stats.rankdata 'average')."""
    order = np.argsort(values, kind="mergesort")
    position = np.empty(len(values), dtype=int)
    position[order] = np.arange(len(values))
    sorted_values = values[order]
    new_group = np.r_[True, sorted_values[1:] != sorted_values[:-1]]
    group = np.cumsum(new_group)[position]  # 1-based group id of each value
    bounds = np.r_[np.nonzero(new_group)[0], len(values)]  # group g spans [bounds[g-1], bounds[g])
    return 0.5 * (bounds[group - 1] + 1 + bounds[group])
