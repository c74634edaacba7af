"""FACMIC (MICCAI 2024) as the authors' code runs it (``--method ours``), and its paper-text variants.

Specification. Each client trains a feature attention module (FAM) a(.) on frozen CLIP image features I
(cached; the code recomputes the same features every batch) and masks them, I~ = a(I) * I. Every local
step takes a labelled source batch (x, y) and the next batch x_t of the unlabeled target stream:

    L = L_contr + lambda L_DA,   lambda = 1 (eq. 7; 0 = "w/o L_DA", Table 3)
    L_contr = 1/2 [CE(S, arange B) + CE(S^T, arange B)],  S = 100 n(I~) n(T_y)^T         (eq. 4)

The FAM runs in training mode on the source batch and then on the target batch (so its BatchNorm
statistics see both, in that order). The target's class probabilities q = softmax(100 n(I~_t) n(T_c)^T)
are never differentiated. L_DA is LMMD (eq. 5-6) between the normalised masked source features and,

- in the code (``adaptation.LMMDLoss``, the default): the normalised *raw* target features I_t; weights
  w^s_ic = 1(y_i = c) / n_c and soft w^t_jc = q_jc / sum_j q_jc; only the classes present both in y and
  in argmax q, averaged over their number; kernel = sum of 5 Gaussians exp(-d^2 / (b/4 * 2^m)), b = the
  mean squared distance between distinct points of the 2B-point batch (not differentiated):
      L_DA = sum_ij (W_ss K_ss + W_tt K_tt - 2 W_st K_st)_ij,  W_ss = (1/|C|) sum_c w^s_c w^s_c^T, ...
  and 0 if the kernel has a NaN;
- in the paper text (``facmic_lmmd_paper``): the normalised *masked* target features (differentiated), hard
  pseudo-labels w^t_jc = 1(argmax q_j = c) / m_c, all K classes averaged with 1/K (an empty class has a
  zero weight column), one Gaussian exp(-d^2 / b) with b the median squared distance.

Adam over the FAM (lr 5e-5, betas (0.9, 0.98), eps 1e-6, wd 0.02), kept across rounds. The server averages
every FAM state entry, BatchNorm running statistics included, with weights (n_i // B) x B. Predictions:
softmax(100 n(I~) n(T_c)^T) with the FAM in eval mode.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from .clip_spec import adaptation_step, check_on_features

pytestmark = pytest.mark.usefixtures("one_thread")


def fam_mask(model, features):
    return model.attention(features) * features


def pairwise(points):
    return ((points[None, :, :] - points[:, None, :]) ** 2).sum(2)


def lmmd_code(source, target, labels, probs):
    """adaptation.LMMDLoss (num_class = K), written out: class weights in float64, cast to float32."""
    k = probs.shape[1]
    s = np.eye(k)[labels.numpy()]
    s_sum = s.sum(0, keepdims=True)
    s = s / np.where(s_sum == 0, 100, s_sum)
    t = probs.detach().double().numpy()
    t_sum = t.sum(0, keepdims=True)
    t = t / np.where(t_sum == 0, 100, t_sum)
    common = [c for c in range(k) if c in set(labels.tolist()) and c in set(probs.argmax(1).tolist())]
    if not common:
        return source.sum() * 0.0
    w_ss = sum(np.outer(s[:, c], s[:, c]) for c in common) / len(common)
    w_tt = sum(np.outer(t[:, c], t[:, c]) for c in common) / len(common)
    w_st = sum(np.outer(s[:, c], t[:, c]) for c in common) / len(common)
    d2 = pairwise(torch.cat([source, target]))
    n = len(d2)
    bandwidth = d2.detach().sum() / (n * n - n) / 2 ** (5 // 2)
    kernels = sum(torch.exp(-d2 / (bandwidth * 2 ** m)) for m in range(5))
    if torch.isnan(kernels).any():
        return source.sum() * 0.0
    b = len(source)
    w = {name: torch.from_numpy(v.astype("float32")) for name, v in (("ss", w_ss), ("tt", w_tt), ("st", w_st))}
    return (w["ss"] * kernels[:b, :b] + w["tt"] * kernels[b:, b:] - 2 * w["st"] * kernels[:b, b:]).sum()


def lmmd_paper(source, target, labels, probs):
    """Eq. 5-6 as written: hard pseudo-labels, every class with 1/K, one Gaussian, median bandwidth."""
    k = probs.shape[1]
    s = F.one_hot(labels, k).float()
    t = F.one_hot(probs.argmax(1), k).float()
    s, t = s / s.sum(0).clamp_min(1), t / t.sum(0).clamp_min(1)
    d2 = pairwise(torch.cat([source, target]))
    off = d2.detach()[~torch.eye(len(d2), dtype=torch.bool)]
    kernel = torch.exp(-d2 / float(np.median(off.numpy())))
    b = len(source)
    total = 0.0
    for c in range(k):
        total = total + s[:, c] @ kernel[:b, :b] @ s[:, c] + t[:, c] @ kernel[b:, b:] @ t[:, c] - 2 * s[:, c] @ kernel[:b, b:] @ t[:, c]
    return total / k


def lmmd_against(lmmd, target: str):
    """L_DA of a step: LMMD between n(masked source) and n(raw or masked target), q never differentiated."""
    def adaptation(model, masked, masked_t, x_t, y, text):
        q = torch.softmax(100.0 * F.normalize(masked_t.detach(), dim=-1) @ F.normalize(text, dim=-1).t(), dim=1)
        target_side = masked_t if target == "masked" else x_t
        return lmmd(F.normalize(masked, dim=-1), F.normalize(target_side, dim=-1), y, q)
    return adaptation


CODE = lmmd_against(lmmd_code, "raw")
PAPER = lmmd_against(lmmd_paper, "masked")


@pytest.mark.parametrize("variant, step", [
    ("facmic", adaptation_step(fam_mask, CODE, 1.0)),                                # the code's LMMD (default)
    ("facmic_lmmd_paper", adaptation_step(fam_mask, PAPER, 1.0, target_grad=True)),  # eq. 5-6 as the paper writes them
    ("facmic_no_da", adaptation_step(fam_mask, CODE, 0.0)),                          # Table 3: without L_DA (target pass kept)
    ("facmic_bs8", adaptation_step(fam_mask, CODE, 0.1)),                            # Table 4: L_DA x 1/10
])
def test_facmic_round_matches_the_specification(variant, step, tmp_path):
    check_on_features(tmp_path, "facmic", variant, step, fam_mask, rounds=2)
