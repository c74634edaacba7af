"""CLIMB (FedIIC Table 1 baseline; (eta_d, eps) = (0.1, 0.1) for ISIC from the supplementary Table 1), two rounds.

Specification: CLIMB (Shen, Cervino, Hassani and Ribeiro, ICLR'22; shenzebang/Federated-Learning-
Pytorch ``core/imbalance_fl.py``), primal-dual FedAvg with FedIIC's shared training recipe
(:mod:`tests.parity.spec_fediic`). Each round, with duals lambda (0 at the start):

1. f_k = the loss of the round's global model on client k's training data, as the code's
   ``_evaluate``: the sum over the client's mini-batches (batches of 4, in order; eval mode) of the
   batch's mean cross-entropy;
2. every client trains the global model as in FedAvg (cross-entropy);
3. the server averages the client models with weights w_k = 1 + lambda_k - mean(lambda) (the
   uniform objective: base weights 1, normalised by their sum N);
4. lambda_k <- clip(lambda_k + eta_d (f_k - mean f - eps) / N, 0, 100).

The second round is where the duals weigh the average.
"""

import pytest
import torch
import torch.nn.functional as F

from .harness import assert_close
from .spec_fedavg import averaged, check_global, local_models
from .spec_fediic import ADAM, cross_entropy, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")

ETA, EPS, LAMBDA_MAX, BATCH = 0.1, 0.1, 100.0, 4


@torch.no_grad()
def batch_sum_loss(model, dataset) -> float:
    model.eval()
    total = 0.0
    for start in range(0, len(dataset), BATCH):
        items = [dataset[i] for i in range(start, min(start + BATCH, len(dataset)))]
        x, y = torch.stack([it["x"] for it in items]), torch.tensor([it["y"] for it in items])
        total += float(F.cross_entropy(logits(model, x), y))
    return total


def test_two_rounds_match_the_specification(tmp_path):
    run, fed, server, driven = drive_tiny("climb", tmp_path, rounds=2)
    lambdas = torch.zeros(len(fed.clients), dtype=torch.float64)
    for rnd in range(2):
        losses = torch.tensor([batch_sum_loss(server, c.train) for c in fed.clients], dtype=torch.float64)
        models, _ = local_models(run, fed, server, cross_entropy, rnd, ADAM)
        weights = (1.0 + lambdas - lambdas.mean()).tolist()
        server = averaged(server, [m.state_dict() for m in models], weights)
        lambdas = (lambdas + ETA * (losses - losses.mean() - EPS) / len(losses)).clamp(0.0, LAMBDA_MAX)
        if rnd == 0:
            assert (lambdas > 0).any() and (lambdas == 0).any()          # the second round's weights differ
    assert_close(driven.method.lambdas, lambdas, "duals")
    check_global(driven, fed, server, logits)
