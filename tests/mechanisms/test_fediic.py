"""Mechanism tests of FedIIC's two components (Wu et al., MICCAI 2023): difficulty-aware logit
adjustment (DALA, eq. 6) raises the recall of the tail class of a long-tailed federation, and the
intra-client supervised contrastive loss (eq. 3) pulls same-class features together.

Both drive FedIIC's registered method through the engine with the paper file's variants (setting
``isic``: Adam lr 3e-4, weight decay 5e-4, q = 0.25, t = 0.5, k1 = 2), on its ``proj_classifier``
with timm ``test_convnext`` at 32 px and a small projector (32 -> 16). Only one parameter differs
between the two runs of a test; same seed, data and batches.

**DALA** (``fediic_dala``: k1 = k2 = 0, DALA on, vs the same with ``dala: false``, i.e. plain
cross-entropy on the same path). Three clients of 60 images of two classes, long-tailed (class 1
5.6-11% of the training images), the class mean colours 0.5 apart under per-pixel noise 6 (overlapping
classes, so the prior matters); the global test set (200 images) is balanced. Tail recall = the
recall of class 1 on the global test set, from the probabilities the engine recorded. One view per
image (DALA reads only the first view). Measured (seeds 0-5): plain CE 0.05-0.26, DALA 0.25-0.39,
difference +0.11 to +0.30 (asserted >= +0.08); the mean probability of the true class on tail images
rises by +0.07 to +0.24 (asserted >= +0.05). The head class's recall falls, as logit adjustment trades it.

**Intra-client SCL** (``fediic_dala_intra``: k1 = 2, k2 = 0, vs ``fediic_dala``: k1 = 0; DALA in
both). Three clients of 40 images of four classes (mean colours 1 apart, noise 2), two views per
image (the image and its mirror image, as the parity tests). Gap = mean cosine similarity of
same-class pairs minus that of different-class pairs, on the clients' held-out test images (90) with
the aggregated model in evaluation mode: of the normalised projections z (what eq. 3 acts on) and of
the backbone features g (what the classifier reads). Measured (seeds 0-5): z 0.22-0.63 without,
0.68-1.11 with, +0.40 to +0.70 and 1.7-3.6x (asserted: at least +0.25 and 1.5x; without the term the
projector is never trained); g grows by +0.10 to +0.24 (asserted > +0.03).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity.harness import configured_model, drive, image_federation, paper_run, stacked
from parity.spec_fediic import two_views

pytestmark = pytest.mark.usefixtures("one_thread")

BACKBONE, SIZE = "test_convnext", 32
PROJECTOR = {"hidden": 32, "out": 16}


def fediic_run(variant: str, seed: int, params=None, *, rounds: int, epochs: int, views: int):
    model = configured_model("fediic", variant, "isic", backbone=BACKBONE, image_size=SIZE, views=views,
                             projector=PROJECTOR)
    return paper_run("fediic", variant, "isic", seed=seed, model=model, params=params,
                     train={"rounds": rounds, "eval_every": rounds, "batch_size": 16, "local": {"epochs": epochs}})


def tail_recall(dala: bool, seed: int, tmp_path) -> tuple[float, float, int]:
    """-> (recall of the tail class, mean probability of the true class on tail images, tail share of training)."""
    run = fediic_run("fediic_dala", seed, {"dala": dala}, rounds=3, epochs=2, views=1)
    assert run["algorithm"]["params"]["dala"] is dala and run["algorithm"]["params"]["k1"] == 0
    fed = image_federation(size=SIZE, classes=2, sizes=(60, 60, 60), val=4, test=4, global_test=200, skew=2.2,
                           eval_skew=0.0, noise=6.0, separation=0.5, seed=seed)
    driven = drive(run, fed, tmp_path / f"dala{dala}")
    probs, labels = driven.probs("global"), driven.result.predictions["last"]["global/labels"]
    tail = labels == 1
    share = np.concatenate([c.train.labels for c in fed.clients]).mean()
    return float((probs[tail].argmax(1) == 1).mean()), float(probs[tail, 1].mean()), share


def test_dala_raises_the_recall_of_the_tail_class(tmp_path):
    ce, ce_soft, share = tail_recall(False, 0, tmp_path)
    dala, dala_soft, _ = tail_recall(True, 0, tmp_path)
    assert share < 0.15                                  # the construction: a long tail
    assert dala >= ce + 0.08, (ce, dala)
    assert dala_soft >= ce_soft + 0.05, (ce_soft, dala_soft)


def cosine_gap(features: torch.Tensor, labels: torch.Tensor) -> float:
    """mean cos(same class, i != j) - mean cos(different classes)."""
    z = F.normalize(features, dim=1)
    cos = z @ z.t()
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~torch.eye(len(labels), dtype=torch.bool)
    return float(cos[same & off_diagonal].mean() - cos[~same].mean())


def contrastive_gaps(variant: str, seed: int, tmp_path) -> tuple[float, float]:
    """-> (gap of the projections z, gap of the backbone features g) on held-out images."""
    run = fediic_run(variant, seed, rounds=2, epochs=2, views=2)
    fed = image_federation(size=SIZE, classes=4, sizes=(40, 40, 40), val=4, test=30, global_test=8, skew=0.5,
                           noise=2.0, separation=1.0, seed=seed)
    for client in fed.clients:
        client.train.transform = two_views
    net = drive(run, fed, tmp_path / variant).method.server.eval()
    x = torch.cat([stacked(c.test)[0] for c in fed.clients])
    y = torch.cat([torch.as_tensor(stacked(c.test)[1]) for c in fed.clients])
    with torch.no_grad():
        _, g = net(x)
        z = net.projector(g)
    return cosine_gap(z, y), cosine_gap(g, y)


def test_intra_client_contrast_pulls_same_class_features_together(tmp_path):
    without_z, without_g = contrastive_gaps("fediic_dala", 0, tmp_path)
    with_z, with_g = contrastive_gaps("fediic_dala_intra", 0, tmp_path)
    assert with_z >= without_z + 0.25 and with_z >= 1.5 * without_z, (without_z, with_z)
    assert with_g > without_g + 0.03, (without_g, with_g)
