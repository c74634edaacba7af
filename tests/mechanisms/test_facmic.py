"""Mechanism test of FACMIC's domain adaptation (Wu et al., MICCAI 2024, eq. 5-7): the LMMD term
lambda L_DA aligns each class of the clients' FAM-masked features with the same class of the
unlabeled target (reference) features.

Claim: after the same local steps on the same batches, lambda_da > 0 leaves a smaller
class-conditional MMD between the clients' masked features and the reference features than
lambda_da = 0 ("FACMIC w/o L_DA", Table 3).

Data: three clients of 40 cached CLIP-like features (16-d, three classes, class text feature + noise)
and a reference set of 60 features drawn the same way and then shifted by a fixed vector as long as
an average text feature (the known shift: the class-conditional MMD of the raw features is 3.1-6.3x
larger between a client and the reference than between two clients, seeds 0-5; asserted > 2.5x). The method sees the reference unlabeled.

Runs: the paper file's ``facmic`` (the authors' code's LMMD: masked source vs the *raw* target
features, lambda = 1), ``facmic_lmmd_paper`` (eq. 5-6 as printed: masked vs *masked* target, one
Gaussian, hard pseudo-labels) and ``facmic_no_da`` (lambda = 0), driven through the engine with the
same seed, so the same batches: 2 rounds of 100 local steps, batches of 32 (the paper's). Only the
learning rate is raised, from the paper's 5e-5 to 1e-3: Adam moves each weight by about lr per step,
so this compresses the paper's ~20,000 local steps (100 rounds of 199) into 200; at 5e-5 the
contrastive term dominates the first hundreds of steps and the two runs barely differ.

Measure: an estimator written here, not the method's: the biased Gaussian-kernel MMD^2 (bandwidths
0.25, 0.5, 1, 2 on L2-normalised features, fixed for every run) between the client features of class
c and the reference features of class c by their *true* labels (the method only has pseudo-labels),
averaged over the classes; features through the aggregated FAM in training mode, i.e. with BatchNorm
on the batch's own statistics, the mode L_DA acts in. Each variant is measured on the pair its L_DA
aligns (code: masked clients vs raw reference; paper: masked vs masked).

Measured (seeds 0-5), MMD ratio lambda > 0 / lambda = 0: code 0.66-0.89, asserted < 0.93; paper
0.75-0.89, asserted < 0.95. Both runs pass the target batches through the FAM in training mode (FACMIC's
code does so with a zero DA weight too: ``target_pass``), so their weights differ only through L_DA and
both runs' BatchNorm running statistics, which evaluation mode reads, average the target batches.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity.harness import drive, feature_federation, paper_run, shifted_reference

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES, DIM = 3, 16
BANDWIDTHS = (0.25, 0.5, 1.0, 2.0)


def mmd2(a: torch.Tensor, b: torch.Tensor) -> float:
    """Biased MMD^2 with a sum of Gaussian kernels exp(-||x - y||^2 / h), h in BANDWIDTHS."""
    def k(x, y):
        d2 = torch.cdist(x, y) ** 2
        return sum(torch.exp(-d2 / h) for h in BANDWIDTHS)
    return float(k(a, a).mean() + k(b, b).mean() - 2 * k(a, b).mean())


def class_conditional_mmd(source, source_labels, target, target_labels) -> float:
    return float(np.mean([mmd2(F.normalize(source[source_labels == c], dim=1), F.normalize(target[target_labels == c], dim=1))
                          for c in range(CLASSES)]))


def federation(seed: int):
    fed = feature_federation(dim=DIM, classes=CLASSES, sizes=(40, 40, 40), reference=0, seed=seed)
    text = fed.extras["text_features"]
    gen = torch.Generator().manual_seed(1000 + seed)
    shift = F.normalize(torch.randn(DIM, generator=gen), dim=0) * text.norm(dim=1).mean()
    labels = shifted_reference(fed, 60, shift, seed=1000 + seed)
    return fed, labels


def trained_mmd(method: str, seed: int, tmp_path, target: str) -> tuple[float, float]:
    """-> (MMD of the pair ``target`` = raw | masked after training, MMD of the raw features)."""
    fed, reference_labels = federation(seed)
    run = paper_run("facmic", method, seed=seed,
                    train={"rounds": 2, "eval_every": 2, "batch_size": 32, "local": {"steps": 100},
                           "optimizer": {"lr": 1e-3}})
    fam = copy.deepcopy(drive(run, fed, tmp_path / method).method.server).train()    # BatchNorm on batch statistics
    source = torch.cat([c.train.features for c in fed.clients])
    labels = torch.cat([c.train.labels for c in fed.clients])
    reference = fed.reference.features
    assert (fed.reference.labels == -1).all()
    with torch.no_grad():
        masked_source = fam(source)
        target_side = reference if target == "raw" else fam(reference)
    return (class_conditional_mmd(masked_source, labels, target_side, reference_labels),
            class_conditional_mmd(source, labels, reference, reference_labels))


def test_the_reference_is_shifted():
    """The construction: the raw reference is far from the clients, class by class, compared with
    two clients' raw features."""
    fed, reference_labels = federation(0)
    a, b = fed.clients[0].train, fed.clients[1].train
    across = class_conditional_mmd(a.features, a.labels, fed.reference.features, reference_labels)
    within = class_conditional_mmd(a.features, a.labels, b.features, b.labels)
    assert across > 2.5 * within, (across, within)


@pytest.mark.parametrize("variant, target, bound", [
    ("facmic", "raw", 0.93),                   # the authors' code: masked clients vs raw reference
    ("facmic_lmmd_paper", "masked", 0.95),     # eq. 5-6 as printed: masked vs masked
])
def test_lmmd_lowers_the_class_conditional_mmd(variant, target, bound, tmp_path):
    with_da, raw = trained_mmd(variant, 0, tmp_path, target)
    without, raw_again = trained_mmd("facmic_no_da", 0, tmp_path, target)
    assert raw == raw_again                    # the same data in both runs
    assert with_da < bound * without, f"{variant}: MMD with L_DA {with_da:.4f}, without {without:.4f}"
