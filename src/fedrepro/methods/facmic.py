"""FACMIC (Wu, Desrosiers, Chaddad, "FACMIC: Federated Adaptative CLIP Model for
Medical Image Classification", MICCAI 2024; paper text vs code: docs/papers/facmic.md).

Each client trains a feature attention module a_i on frozen CLIP image features (:mod:`fedrepro.models.fam`)
with two losses:

- contrastive (eq. 4): S_{jj'} = cos(a(I_j) ⊙ I_j, T_{y_j'}) over a batch of B images, P = softmax_row(S/tau),
  Q = softmax_row(S^T/tau), L_contr = -(1/B) sum_j 1/2 (log P_jj + log Q_jj), 1/tau = 100;
- LMMD domain adaptation (eq. 5-6, Zhu et al., "Deep Subdomain Adaptation Network", TNNLS 2021) towards a
  global set of unlabeled target images (:mod:`fedrepro.methods._common.target_domain`):

      L_DA = (1/|C|) sum_{c in C} [ sum_ss w^s_ic w^s_jc k(s_i, s_j) + sum_tt w^t_ic w^t_jc k(t_i, t_j)
                                     - 2 sum_st w^s_ic w^t_jc k(s_i, t_j) ],
      w^s_ic = 1(y_i = c) / sum_j 1(y_j = c),

and L = L_contr + lambda L_DA (eq. 7, lambda = 1; Table 4 scales it by 1/10 for batches of 4 and 8).
The server averages the FAMs weighted by client training-set size (eq. 8; the code, and so the FACMIC
configs with ``aggregation.weights: full_batches``, weigh by the samples in full batches, (n_i // B) x B;
BN running statistics are averaged too, as in the code).

Where the paper and the authors' code disagree, each choice is a parameter (``lmmd``); the
defaults follow the **code**, because the published numbers come from it:

=====================  ==========================================  =====================================
parameter              authors' code (default)                     paper text
=====================  ==========================================  =====================================
``kernels``            5 Gaussians, bandwidths (b/4) * 2^m, m=0..4  1 Gaussian
``bandwidth``          b = mean pairwise squared distance           b = median pairwise squared distance
                                                                    (of an even count: the mean of the
                                                                    two middle values)
``pseudo_labels``      soft: w^t_jc = q_jc / sum_j q_jc             hard: one-hot argmax q_j, normalised
``classes``            C = classes in the source labels and in      C = all K classes (1/K; an empty
                       the target argmax                            class contributes its other side)
``target_features``    raw CLIP features of the target (no grad)    masked features a(I)⊙I, as the source
=====================  ==========================================  =====================================

q_j = softmax(100 cos(a(I^t_j) ⊙ I^t_j, T_c)) are the target's class probabilities (eq. 3), never
differentiated. Source features are always the masked ones; both sides are L2-normalised; distances
for the bandwidth are over the 2B points (i != j) and not differentiated. As in the code, the target
batch passes through the FAM in training mode, so BatchNorm statistics also see target images, and a
non-finite L_DA counts as 0. The paper writes x = I in eq. 5 but trains the FAM with L_DA, so its
reading uses the masked features on both sides. Without L_DA (lambda = 0, Table 3) the target batch still
passes through the FAM, as in the code with a zero weight (``target_pass``; false drops it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import full_precision
from ..models.families import clip_scores
from ..registry import register_method
from ._common.target_domain import TARGET_PASS_PARAMS, DomainAdaptation


def pairwise_sq_dists(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||x_i - y_j||^2 for every pair (n x m), as ||x||^2 + ||y||^2 - 2 x.y (clamped at 0)."""
    return (x.pow(2).sum(1, keepdim=True) + y.pow(2).sum(1) - 2 * x @ y.t()).clamp_min(0.0)


def kernel_bandwidth(d2: torch.Tensor, rule: str) -> torch.Tensor:
    """Mean or median of the squared distances between distinct points (the off-diagonal of the square
    matrix ``d2``), not differentiated. The median of an even count is the mean of the two middle values
    (as np.median; torch.median would take the lower one)."""
    off = d2.detach()[~torch.eye(len(d2), dtype=torch.bool, device=d2.device)]
    if rule == "mean":
        return off.mean()
    if rule == "median":
        return torch.quantile(off, 0.5)
    raise ValueError(f"unknown bandwidth rule {rule!r}; allowed: mean, median")


def gaussian_kernels(d2: torch.Tensor, bandwidth: torch.Tensor, n_kernels: int, mul: float) -> torch.Tensor:
    """sum_m exp(-d2 / b_m) with b_m = bandwidth / mul^(n//2) * mul^m, m = 0..n-1 (n = 1: exp(-d2 / bandwidth))."""
    base = bandwidth / mul ** (n_kernels // 2)
    return sum(torch.exp(-d2 / (base * mul ** m)) for m in range(n_kernels))


def source_weights(labels: torch.Tensor, num_classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """w^s_ic = 1(y_i = c) / n_c (B x K in ``dtype``; an absent class has a zero column)."""
    onehot = F.one_hot(labels, num_classes).to(dtype)
    return onehot / onehot.sum(0).clamp_min(1.0)


def target_weights(probs: torch.Tensor, mode: str) -> torch.Tensor:
    """Soft (q_jc / sum_j q_jc) or hard (one-hot argmax, normalised per class) target weights (B x K)."""
    if mode == "hard":
        probs = F.one_hot(probs.argmax(1), probs.shape[1]).to(probs.dtype)
    elif mode != "soft":
        raise ValueError(f"unknown pseudo_labels {mode!r}; allowed: soft, hard")
    mass = probs.sum(0)
    return probs / torch.where(mass > 0, mass, torch.ones_like(mass))


@full_precision
def lmmd(source: torch.Tensor, target: torch.Tensor, source_labels: torch.Tensor, target_probs: torch.Tensor, *,
         kernels: int = 5, kernel_mul: float = 2.0, bandwidth: str = "mean", pseudo_labels: str = "soft",
         classes: str = "common") -> torch.Tensor:
    """Local MMD between a labelled source batch and an unlabeled target batch (see the module docstring).
    The class weights take the features' dtype (float32 or float64 alike)."""
    num_classes = target_probs.shape[1]
    ws = source_weights(source_labels, num_classes, source.dtype)
    wt = target_weights(target_probs.detach().to(source.dtype), pseudo_labels)
    if classes == "common":
        present = (ws.sum(0) > 0) & (F.one_hot(target_probs.argmax(1), num_classes).sum(0) > 0)
        if not present.any():
            return source.sum() * 0.0
        ws, wt, count = ws[:, present], wt[:, present], int(present.sum())
    elif classes == "all":
        count = num_classes
    else:
        raise ValueError(f"unknown classes rule {classes!r}; allowed: common, all")
    points = torch.cat([source, target])
    d2 = pairwise_sq_dists(points, points)
    k = gaussian_kernels(d2, kernel_bandwidth(d2, bandwidth), kernels, kernel_mul)
    n = len(source)
    k_ss, k_tt, k_st = k[:n, :n], k[n:, n:], k[:n, n:]
    value = ((ws.t() @ k_ss @ ws).diagonal().sum() + (wt.t() @ k_tt @ wt).diagonal().sum()
             - 2 * (ws.t() @ k_st @ wt).diagonal().sum()) / count
    return value if torch.isfinite(value) else source.sum() * 0.0


FACMIC_PARAMS = {
    "lambda_da": {
        "description": "λ of eq. 7 (paper and code: 1). 0 = FACMIC without L_DA (Table 3; see target_pass); Table 4"
                       " uses 0.1 for batches of 4 and 8.",
        "type": "number",
        "minimum": 0,
        "default": 1.0,
    },
    **TARGET_PASS_PARAMS,
    "lmmd": {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {
            "kernels": {
                "description": "number of Gaussian kernels summed (code: 5, bandwidths (b/4)*2^m; paper: 1)",
                "type": "integer",
                "minimum": 1,
                "default": 5,
            },
            "kernel_mul": {
                "type": "number",
                "exclusiveMinimum": 1,
                "default": 2.0,
                "description": "ratio between successive kernel bandwidths",
            },
            "bandwidth": {
                "description": "b = mean (code) or median (paper) of the squared distances between the 2B batch"
                               " points",
                "enum": ["mean", "median"],
                "default": "mean",
            },
            "pseudo_labels": {
                "description": "target class weights: soft = column-normalised softmax probabilities (code); "
                               "hard = argmax (paper)",
                "enum": ["soft", "hard"],
                "default": "soft",
            },
            "classes": {
                "description": "common = only classes in the source labels and the target argmax, averaged over"
                               " them (code); all = (1/K) sum over every class (paper eq. 5)",
                "enum": ["common", "all"],
                "default": "common",
            },
            "target_features": {
                "description": "raw = the target's unmasked CLIP features, no gradient (code); masked = a(I)⊙I "
                               "like the source (paper)",
                "enum": ["raw", "masked"],
                "default": "raw",
            },
        },
    },
}


@register_method("facmic", params=FACMIC_PARAMS)
class FACMIC(DomainAdaptation):
    def target_needs_grad(self) -> bool:
        return self.params["lmmd"]["target_features"] == "masked"

    def adaptation_loss(self, model, source_masked, batch, target_raw, target_masked):
        cfg = self.params["lmmd"]
        target_side = target_masked if cfg["target_features"] == "masked" else target_raw
        # eq. 3 on the target: q = softmax(100 cos(a(I_t) ⊙ I_t, T_c)), never differentiated
        probs = torch.softmax(clip_scores(target_masked.detach(), self.family.text, self.family.scale), dim=1)
        return lmmd(F.normalize(source_masked, dim=-1), F.normalize(target_side, dim=-1), batch["y"], probs,
                    kernels=cfg["kernels"], kernel_mul=cfg["kernel_mul"], bandwidth=cfg["bandwidth"],
                    pseudo_labels=cfg["pseudo_labels"], classes=cfg["classes"])
