"""Metrics against hand-computed values and against scikit-learn (which the papers' code used)."""

import numpy as np
import pytest
from sklearn import metrics as skm

from fedrepro import metrics as M


def test_hand_computed_case():
    y = np.array([0, 0, 0, 1, 1, 2])
    p = np.array([0, 0, 1, 1, 0, 0])
    # acc: correct at 0,1,3 -> 3/6
    assert M.accuracy(y, p) == pytest.approx(0.5)
    # recalls: class0 2/3, class1 1/2, class2 0/1 -> mean 7/18
    assert M.balanced_accuracy(y, p) == pytest.approx(7 / 18)
    # F1: class0 P=2/4 R=2/3 -> 2*2/(2*2+2+1)=4/7; class1 P=1/2 R=1/2 -> 1/2; class2 -> 0
    assert M.macro_f1(y, p) == pytest.approx((4 / 7 + 0.5 + 0) / 3)


def test_binary_auc_with_ties_by_hand():
    # positives scores 0.8, 0.4; negatives 0.4, 0.1 -> pairs: (0.8>0.4)=1, (0.8>0.1)=1, (0.4=0.4)=0.5, (0.4>0.1)=1
    assert M.binary_auc(np.array([1, 1, 0, 0]), np.array([0.8, 0.4, 0.4, 0.1])) == pytest.approx(3.5 / 4)
    assert np.isnan(M.binary_auc(np.array([1, 1]), np.array([0.2, 0.3])))


def test_ece_by_hand():
    # two bins used (15 bins): conf 0.9 (correct), 0.9 (wrong) -> bin acc 0.5 conf 0.9 gap 0.4, weight 2/3;
    # conf 0.6 (correct) -> gap 0.4, weight 1/3 -> ECE 0.4
    probs = np.array([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6]])
    y = np.array([0, 1, 1])
    assert M.expected_calibration_error(y, probs) == pytest.approx(0.4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, 200)
    logits = rng.normal(size=(200, 4)) + 1.5 * np.eye(4)[y]
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    pred = probs.argmax(1)
    assert M.accuracy(y, pred) == pytest.approx(skm.accuracy_score(y, pred))
    assert M.balanced_accuracy(y, pred) == pytest.approx(skm.balanced_accuracy_score(y, pred))
    assert M.macro_f1(y, pred) == pytest.approx(skm.f1_score(y, pred, average="macro"))
    assert M.macro_auc_ovr(y, probs) == pytest.approx(skm.roc_auc_score(y, probs, multi_class="ovr", average="macro"))


def test_macro_auc_skips_absent_classes():
    y = np.array([0, 0, 1, 1])
    probs = np.array([[0.9, 0.1, 0.0], [0.6, 0.4, 0.0], [0.3, 0.7, 0.0], [0.2, 0.8, 0.0]])
    assert M.macro_auc_ovr(y, probs) == pytest.approx(1.0)  # class 2 has no positives and is left out


def sklearn_macro_roc(y, probs):
    """scikit-learn's macro-average recipe (FAA-CLIP's DCA_ROC.py): per-class roc_curve, np.interp of
    every class on the union of their FPRs, mean, trapezoidal AUC."""
    curves = [skm.roc_curve(y == c, probs[:, c]) for c in range(probs.shape[1])]
    fpr = np.unique(np.concatenate([f for f, _, _ in curves]))
    tpr = np.mean([np.interp(fpr, f, t) for f, t, _ in curves], axis=0)
    return fpr, tpr, skm.auc(fpr, tpr)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_macro_roc_matches_sklearn_on_a_split_with_ties(seed):
    # 60 samples, 4 classes, probabilities rounded to one decimal: many tied scores, vertical steps
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, 60)
    logits = rng.normal(size=(60, 4)) + 1.5 * np.eye(4)[y]
    probs = np.round(np.exp(logits) / np.exp(logits).sum(1, keepdims=True), 1)
    sk_fpr, sk_tpr, sk_auc = sklearn_macro_roc(y, probs)
    ours = M.macro_roc(y, probs, grid=np.linspace(0.01, 1, 100))
    np.testing.assert_allclose(ours["fpr"], sk_fpr, atol=1e-12)
    np.testing.assert_allclose(ours["tpr"], sk_tpr, atol=1e-12)
    assert ours["auc"] == pytest.approx(sk_auc, abs=1e-12)
    np.testing.assert_allclose(ours["grid_tpr"], np.interp(np.linspace(0.01, 1, 100), sk_fpr, sk_tpr), atol=1e-12)


def test_roc_curve_drops_the_points_sklearn_drops():
    rng = np.random.default_rng(5)
    y, score = rng.integers(0, 2, 40), np.round(rng.random(40), 1)
    sk_fpr, sk_tpr, _ = skm.roc_curve(y, score)
    np.testing.assert_allclose(M.roc_curve(y, score, drop_intermediate=True), [sk_fpr, sk_tpr])
    full = skm.roc_curve(y, score, drop_intermediate=False)
    np.testing.assert_allclose(M.roc_curve(y, score), [full[0], full[1]])


def test_roc_interpolation_between_steps_takes_the_bottom_of_the_next_step():
    # class polyline (0,0) -> (0,0.5) -> (0.5,0.5) -> (0.5,1) -> (1,1): halfway to the step at 0.5 the TPR
    # is 0.5 (the horizontal run), not 0.75 (a chord to the top of the step)
    fpr, tpr = np.array([0, 0, 0.5, 0.5, 1.0]), np.array([0, 0.5, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(M.roc_interpolate([0, 0.25, 0.5, 0.75, 1], fpr, tpr), [0.5, 0.5, 1, 1, 1])
