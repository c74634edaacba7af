"""FedAvg (FedAdapterProto Table 1 baseline), one round.

Specification: FedAvg (McMahan et al.; :mod:`tests.parity.spec_fedavg`) on the baselines' model of
FedAdapterProto's grid - a ResNet with its max-pool and a linear head on the pooled features, no
adapters - with the paper's training recipe: every client copies the global model, trains it with a
fresh Adam (lr 1e-4, weight decay 5e-4) for one class-balanced epoch on the cross-entropy, and the
server averages the whole state with weights n_k (training-set sizes). Table 1 reports one accuracy
per client: client k is evaluated with its model after its local update (before aggregation).
"""

import pytest

from .spec_fedadapterproto import ADAM, cross_entropy, drive_tiny, logits
from .spec_fedavg import check_global, check_local_models, fedavg_round

pytestmark = pytest.mark.usefixtures("one_thread")



def test_one_round_matches_the_specification(tmp_path):
    run, fed, start, driven = drive_tiny("fedavg", tmp_path, rounds=1, batch_size=8)
    server, models, _ = fedavg_round(run, fed, start, cross_entropy, 0, ADAM)
    check_global(driven, fed, server, logits)
    check_local_models(driven, fed, models, logits)
