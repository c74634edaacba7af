"""FedProx (FedIIC Table 1 baseline, mu = 0.01 from the supplementary Table 1), two rounds.

Specification: FedProx (Li et al., MLSys'20): FedAvg with FedIIC's shared recipe
(:mod:`tests.parity.spec_fediic`) and the local loss

    CE(f(dropout(g(x))), y) + (mu / 2) || w - w_g ||^2,   mu = 0.01,

over every trainable parameter, w_g = the global model the round started from (the paper's squared
norm). The term acts from the second local step on; the second round starts from an aggregate.
"""

import pytest

from .spec_fedavg import check_global, fedavg_round
from .spec_fediic import ADAM, cross_entropy, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")

MU = 0.01


def fedprox_loss(model, batch, client, global_model):
    anchor = dict(global_model.named_parameters())
    prox = sum(((p - anchor[k]) ** 2).sum() for k, p in model.named_parameters() if p.requires_grad)
    return cross_entropy(model, batch) + MU / 2 * prox


def test_two_rounds_match_the_specification(tmp_path):
    run, fed, server, driven = drive_tiny("fedprox", tmp_path, rounds=2)
    for rnd in range(2):
        server, _, _ = fedavg_round(run, fed, server, fedprox_loss, rnd, ADAM)
    check_global(driven, fed, server, logits)
