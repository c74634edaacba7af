"""Mechanism test of CReFF (Shang et al., IJCAI 2022), a baseline of FedIIC's Table 1: the classifier re-trained
on the federated (synthetic) features beats the FedAvg classifier on the tail classes of a long-tailed federation;
and why the demo's CReFF sat at chance.

CReFF's registered method is driven through the engine with the paper file's variant (``creff``: 100 federated
features per class, 100 matching steps and 300 re-training epochs per round, the CReFF code's defaults) on
``proj_classifier`` with timm ``test_convnext`` at 32 px. Three clients of 80 images of four classes, long-tailed
(about 72/20/6/3% of the training images), class mean colours 1 apart under per-pixel noise 4; the global test
set (400 images) is balanced. The same run holds both classifiers: the evaluated model's head is the re-trained
one (``evaluate_with: retrained``), the aggregated model's is FedAvg's. Tail recall = the mean recall of the two
rarest classes on the global test set. Measured (seeds 0, 1): re-trained 0.82 / 0.99, FedAvg 0.24 / 0.79.

With the demo's budget (10 features per class, 10 matching steps and 20 re-training epochs per round) the
re-trained classifier is a fresh linear layer that takes 20 epochs x 2 batches = 40 SGD steps (lr 0.01) per round
on features that barely left their random start: it stays close to its random init. That, not a defect, put the
demo's CReFF at chance; the same construction measures it (seed 0: tail recall 0.54 and balanced accuracy 0.45,
against 0.82 and 0.79 with the paper's budget).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity.harness import configured_model, drive, image_federation, paper_run, stacked

pytestmark = pytest.mark.usefixtures("one_thread")

SIZE, CLASSES, TAIL = 32, 4, [2, 3]
DEMO_BUDGET = {"num_features": 10, "match_epochs": 10, "retrain_epochs": 20, "batch_real": 4, "gradient_repeats": 2}


def recalls(budget: dict | None, seed: int, tmp_path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (per-class recall of the re-trained classifier, of the FedAvg classifier, training class counts)."""
    model = configured_model("fediic", "creff", "isic", backbone="test_convnext", image_size=SIZE, views=1,
                             projector={"hidden": 32, "out": 16})
    run = paper_run("fediic", "creff", "isic", seed=seed, model=model, params=budget,
                    train={"rounds": 4, "eval_every": 4, "batch_size": 16, "local": {"epochs": 2}})
    assert run["algorithm"]["params"]["evaluate_with"] == "retrained"
    fed = image_federation(size=SIZE, classes=CLASSES, sizes=(80, 80, 80), val=4, test=4, global_test=400, skew=1.2,
                           eval_skew=0.0, noise=4.0, separation=1.0, seed=seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("fedrepro.methods.creff.with_transform", lambda dataset, transform: dataset)   # in-memory tensors
        method = drive(run, fed, tmp_path / f"creff{seed}{bool(budget)}").method
    x, y = stacked(fed.global_test)
    y = torch.as_tensor(y)
    out = []
    for net in (method.eval_model, method.server):          # re-trained head; FedAvg's aggregated head
        with torch.no_grad():
            predicted = method.family.forward(net.eval(), {"x": x, "y": y}).logits.argmax(1)
        out.append(np.array([float((predicted[y == c] == c).float().mean()) for c in range(CLASSES)]))
    counts = np.bincount(np.concatenate([c.train.labels for c in fed.clients]), minlength=CLASSES)
    return out[0], out[1], counts


@pytest.fixture(scope="module")
def paper_budget(tmp_path_factory):
    return recalls(None, 0, tmp_path_factory.mktemp("creff"))


def test_the_retrained_classifier_beats_fedavg_on_the_tail(paper_budget):
    retrained, fedavg, counts = paper_budget
    assert counts[TAIL].sum() / counts.sum() < 0.12                    # the construction: a long tail
    assert retrained[TAIL].mean() >= fedavg[TAIL].mean() + 0.3, (retrained, fedavg)
    assert retrained.mean() >= fedavg.mean() + 0.1, (retrained, fedavg)     # balanced accuracy too


def test_the_demo_budget_leaves_the_retrained_classifier_near_its_start(paper_budget, tmp_path):
    paper = paper_budget[0]
    demo, _, _ = recalls(DEMO_BUDGET, 0, tmp_path)
    assert demo.mean() <= paper.mean() - 0.15, (demo, paper)
