"""FedRS (FedIIC Table 1 baseline, alpha = 0 from the supplementary Table 1), one round.

Specification: FedRS (Li and Zhan, KDD'21): FedAvg with FedIIC's shared recipe
(:mod:`tests.parity.spec_fediic`) whose local loss restricts the softmax: the scores of the classes
a client has no training image of are multiplied by alpha,

    s_c = f_c(dropout(g(x)))  if the client holds class c,   alpha * f_c(...)  otherwise,
    L = CE(s, y),   alpha = 0,

(the classifier has a bias here, so the whole score is scaled). Client 0 lacks class 3. Evaluation
uses the unrestricted global model.
"""

import pytest
import torch
import torch.nn.functional as F

from .spec_fedavg import check_global, fedavg_round
from .spec_fediic import ADAM, CLASSES, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA = 0.0


def restricted(model, batch, client, global_model):
    held = torch.zeros(CLASSES, dtype=torch.bool)
    held[torch.as_tensor(client.train.labels)] = True
    scale = torch.where(held, 1.0, ALPHA)
    return F.cross_entropy(logits(model, batch["x"]) * scale, batch["y"])


def test_one_round_matches_the_specification(tmp_path):
    run, fed, start, driven = drive_tiny("fedrs", tmp_path, rounds=1)
    assert 3 not in set(fed.clients[0].train.labels.tolist())
    server, _, _ = fedavg_round(run, fed, start, restricted, 0, ADAM)
    check_global(driven, fed, server, logits)
