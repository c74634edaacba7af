"""FedProx (FedAdapterProto Table 1 baseline), two rounds.

Specification: FedProx (Li et al., MLSys'20) on the baselines' model of FedAdapterProto's grid (a
ResNet with a linear head, no adapters): FedAvg (:mod:`tests.parity.spec_fedavg`) with the local loss

    CE(f(x), y) + (mu / 2) || w - w_g ||^2,   mu = 0.01 (the authors' proximal weight),

over every trainable parameter, w_g = the global model the round started from; fresh Adam (lr 1e-4,
weight decay 5e-4), one class-balanced epoch, server average weighted by training-set size; each
client evaluated with its model after its last local update. Two rounds: in the first w = w_g at
the first step, so the term acts from the second step and the second round on.
"""

import pytest
import torch.nn.functional as F

from .spec_fedadapterproto import ADAM, drive_tiny, logits
from .spec_fedavg import check_global, check_local_models, fedavg_round

pytestmark = pytest.mark.usefixtures("one_thread")

MU = 0.01


def fedprox_loss(model, batch, client, global_model):
    anchor = dict(global_model.named_parameters())
    prox = sum(((p - anchor[k]) ** 2).sum() for k, p in model.named_parameters() if p.requires_grad)
    return F.cross_entropy(logits(model, batch["x"]), batch["y"]) + MU / 2 * prox


def test_two_rounds_match_the_specification(tmp_path):
    run, fed, server, driven = drive_tiny("fedprox", tmp_path, rounds=2, batch_size=4)
    for rnd in range(2):
        server, models, _ = fedavg_round(run, fed, server, fedprox_loss, rnd, ADAM)
    check_global(driven, fed, server, logits)
    check_local_models(driven, fed, models, logits)
