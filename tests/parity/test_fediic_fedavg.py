"""FedAvg (FedIIC Table 1 and Table 2 row 1), one round.

Specification: FedAvg (McMahan et al.; :mod:`tests.parity.spec_fedavg`) with FedIIC's shared recipe
(:mod:`tests.parity.spec_fediic`): every client copies the global model, trains it with a fresh Adam
(lr 3e-4, weight decay 5e-4) for one epoch on the cross-entropy of the classifier's scores
f(dropout(g(x))) on view 1, and the server averages every floating-point entry of the state
(weights and BatchNorm statistics) with weights n_k (client sizes). The global model is evaluated.
"""

import pytest

from .spec_fedavg import check_global, fedavg_round
from .spec_fediic import ADAM, cross_entropy, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")


def test_one_round_matches_the_specification(tmp_path):
    run, fed, start, driven = drive_tiny("fedavg", tmp_path, rounds=1)
    server, _, _ = fedavg_round(run, fed, start, cross_entropy, 0, ADAM)
    check_global(driven, fed, server, logits)
