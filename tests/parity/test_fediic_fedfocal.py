"""FedFocal (FedIIC Table 1 baseline, gamma = 2 from the supplementary Table 1), one round.

Specification: FedAvg with FedIIC's shared recipe (:mod:`tests.parity.spec_fediic`) and the focal
loss (Lin et al.) in place of the cross-entropy, as the Fed-Focal baseline (Sarkar et al.):

    FL = mean_b -(1 - p_{b, y_b})^gamma log p_{b, y_b},   p = softmax(f(dropout(g(x)))),   gamma = 2.
"""

import pytest
import torch

from .spec_fedavg import check_global, fedavg_round
from .spec_fediic import ADAM, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")

GAMMA = 2.0


def focal(model, batch, client, global_model):
    log_p = torch.log_softmax(logits(model, batch["x"]), dim=1).gather(1, batch["y"][:, None]).squeeze(1)
    return (-(1 - log_p.exp()) ** GAMMA * log_p).mean()


def test_one_round_matches_the_specification(tmp_path):
    run, fed, start, driven = drive_tiny("fedfocal", tmp_path, rounds=1)
    server, _, _ = fedavg_round(run, fed, start, focal, 0, ADAM)
    check_global(driven, fed, server, logits)
