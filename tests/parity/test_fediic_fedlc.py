"""FedLC (FedIIC Table 1 baseline; tau = 1, FedLC's default, FedIIC gives none), one round.

Specification: FedLC (Zhang et al., ICML'22): FedAvg with FedIIC's shared recipe
(:mod:`tests.parity.spec_fediic`) whose local loss calibrates the logits by the client's class
counts n_c before the softmax,

    L = -log( exp(z_y - tau n_y^(-1/4)) / sum_c exp(z_c - tau n_c^(-1/4)) ),   tau = 1,

so a class the client lacks (n_c = 0: an infinite margin, exp(-inf) = 0 as in FedLC's code) leaves
the softmax. Client 0 lacks class 3. Evaluation uses the raw logits of the global model.
"""

import pytest
import torch

from .spec_fedavg import check_global, fedavg_round
from .spec_fediic import ADAM, CLASSES, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")

TAU = 1.0


def calibrated(model, batch, client, global_model):
    n = torch.bincount(torch.as_tensor(client.train.labels), minlength=CLASSES).float()
    z = logits(model, batch["x"]) - TAU * n.pow(-0.25)           # n = 0 -> -inf
    return -torch.log_softmax(z, dim=1).gather(1, batch["y"][:, None]).mean()


def test_one_round_matches_the_specification(tmp_path):
    run, fed, start, driven = drive_tiny("fedlc", tmp_path, rounds=1)
    server, _, _ = fedavg_round(run, fed, start, calibrated, 0, ADAM)
    check_global(driven, fed, server, logits)
