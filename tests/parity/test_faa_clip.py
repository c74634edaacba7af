"""FAA-CLIP as the authors' code runs it (``--method ours``), and its Table VII/VIII variants.

Specification. Each client i trains the FACMIC feature attention module a_i (see test_facmic.py;
I* = a_i(I) * I on frozen CLIP features) and a local domain classifier D_i (Linear-BN-ReLU-Linear-BN-
ReLU-Linear-Sigmoid). Every local step takes a labelled source batch (x, y) and the next target batch x_t:

    s = n(a_i(I) * I)                       (FAM in training mode, differentiated)
    t = n(a_i(I_t) * I_t)                   (FAM in training mode - BN statistics see the target - no gradient)
    L_adv = 1/2 [BCE(D_i(GRL(s)), 1) + BCE(D_i(GRL(t)), 0)]   (D called once per domain; GRL: identity
                                                             forward, gradient x -1 backward)
    L = L_contr + 0.5 L_adv,   L_contr = 1/2 [CE(S, arange B) + CE(S^T, arange B)], S = 100 s n(T_y)^T

One Adam (lr 5e-5, betas (0.9, 0.98), eps 1e-6, wd 0.02) over the FAM and D, kept across rounds. The server
takes the simple average (1/3 each) of every FAM state entry, BatchNorm running statistics included; D
never leaves the client. Predictions: softmax(100 n(I*) n(T_c)^T) with the server's FAM in eval mode.

Variants (Table VII/VIII): ``faa_shared_d`` averages D like the FAM; ``faa_local_bn`` (w/o shared BN)
keeps the FAM's BatchNorm on each client (FedBN) - each client's test split is scored by its own model,
the global set by the mean of the clients' models' probabilities; ``faa_deeper`` is the 8-layer FAM
(same step), ``faa_fea1`` the FAM without BatchNorm (Table VIII); ``faa_no_da`` drops L_adv but, as the
code with a zero weight, still passes the target batch through the FAM in training mode (D untouched).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .clip_spec import adaptation_step, check_on_features, predict_probs

pytestmark = pytest.mark.usefixtures("one_thread")

LAMBDA = 0.5        # loss = cla_loss + 0.5 * loss_m


class Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return -grad


def fam_mask(model, features):
    return model.fam.attention(features) * features


def domain_bce(discriminator, features, label: float):
    p = torch.sigmoid(discriminator(Reverse.apply(features)))       # the code's D ends in a Sigmoid
    return F.binary_cross_entropy(p, torch.full_like(p, label))     # nn.BCELoss


def adversarial(model, masked, masked_t, x_t, y, text):
    s, t = F.normalize(masked, dim=-1), F.normalize(masked_t, dim=-1)
    return 0.5 * (domain_bce(model.discriminator, s, 1.0) + domain_bce(model.discriminator, t, 0.0))


def faa_step(lam):
    return adaptation_step(fam_mask, adversarial, lam)


def fam_keys(model, with_bn=True, with_d=False):
    bn = {f"fam.{name}." for name, m in model.fam.named_modules() if isinstance(m, nn.BatchNorm1d)}
    return [k for k in model.state_dict() if (k.startswith("fam.") and (with_bn or not any(k.startswith(b) for b in bn)))
            or (with_d and k.startswith("discriminator."))]


def own_bn_scores(server, models, key, x, text):
    """FedBN: a client's split by its own model; the global set by the mean of the clients' probabilities."""
    with torch.no_grad():
        if key in models:
            return predict_probs(fam_mask(models[key].eval(), x), text)
        return torch.stack([predict_probs(fam_mask(m.eval(), x), text) for m in models.values()]).mean(0)


@pytest.mark.parametrize("variant, lam, keys", [
    ("faa_clip", LAMBDA, fam_keys),
    ("faa_shared_d", LAMBDA, lambda m: fam_keys(m, with_d=True)),
    ("faa_local_bn", LAMBDA, lambda m: fam_keys(m, with_bn=False)),
    ("faa_deeper", LAMBDA, fam_keys),
    ("faa_fea1", LAMBDA, fam_keys),             # Table VIII: Linear + Softmax, no BatchNorm
    ("faa_no_da", 0.0, fam_keys),
])
def test_faa_clip_rounds_match_the_code(variant, lam, keys, tmp_path):
    _, _, models = check_on_features(tmp_path, "faa_clip", variant, faa_step(lam), fam_mask, rounds=2, keys=keys,
                                     scored=own_bn_scores if variant == "faa_local_bn" else None)
    if variant == "faa_local_bn":
        # the clients really score with BatchNorm of their own
        a, b = (models[c].state_dict()["fam.attention.1.running_mean"] for c in ("client0", "client1"))
        assert not np.allclose(a.numpy(), b.numpy())
