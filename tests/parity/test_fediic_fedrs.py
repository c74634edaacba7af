"""FedRS (FedIIC Table 1 baseline, alpha = 0 from the supplementary Table 1), one round.

Specification: FedRS's official code (lxcnju/FedRepo ``algorithms/fedrs.py``, ``FedRS.update_local``)
with FedIIC's shared recipe (:mod:`tests.parity.spec_fediic`). From the client's training class counts
n, ``dist = n / n.sum()`` and ``cdist = (dist / dist.max()) (1 - alpha) + alpha``; the local loss is
the cross-entropy of ``cdist * (h @ W^T)``, with h the classifier's input (here dropout(g(x)), as
``model(x)`` feeds the classifier) and W the classifier's weight - no bias:

    s_c = ((p_c / max p) (1 - alpha) + alpha) w_c . h,   L = CE(s, y),   alpha = 0.

Client 0 lacks class 3 (scale 0); the other classes are scaled by their share of the largest class.
Evaluation uses the unrestricted global model.
"""

import pytest
import torch
import torch.nn.functional as F

from .spec_fedavg import check_global, fedavg_round
from .spec_fediic import ADAM, CLASSES, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA = 0.0


def restricted(model, batch, client, global_model):
    counts = torch.bincount(torch.as_tensor(client.train.labels), minlength=CLASSES).float()
    dist = counts / counts.sum()
    cdist = (dist / dist.max()) * (1.0 - ALPHA) + ALPHA
    h = model.dropout(model.embed(batch["x"]))          # what the classifier reads
    return F.cross_entropy(cdist[None, :] * (h @ model.head.weight.t()), batch["y"])


def test_one_round_matches_the_specification(tmp_path):
    run, fed, start, driven = drive_tiny("fedrs", tmp_path, rounds=1)
    assert 3 not in set(fed.clients[0].train.labels.tolist())
    counts = torch.bincount(torch.as_tensor(fed.clients[1].train.labels), minlength=CLASSES)
    assert len(set(counts.tolist()) - {0}) > 1          # a client with unequal classes: proportional scales matter
    server, _, _ = fedavg_round(run, fed, start, restricted, 0, ADAM)
    check_global(driven, fed, server, logits)
