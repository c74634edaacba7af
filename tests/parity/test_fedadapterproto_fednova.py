"""FedNova (FedAdapterProto Table 1 baseline), one round.

Specification: FedNova (Wang et al., NeurIPS'20) on the baselines' model of FedAdapterProto's grid
(a ResNet with a linear head, no adapters). Clients train as in FedAvg (fresh Adam, lr 1e-4, weight
decay 5e-4, one class-balanced epoch on the cross-entropy) but run different numbers of local steps
tau_k; the server normalises each update by its local work a_k = tau_k (plain local steps; the paper
defines no other normalisation for Adam) and rescales by the effective number of steps:

    p_k = n_k / n,   tau_eff = sum_k p_k a_k,   w_g <- w_g - tau_eff sum_k p_k (w_g - w_k) / a_k

for the parameters; BatchNorm statistics are averaged with p_k. Clients of 8, 10 and 12 images with
batches of 8 run 1, 2 and 2 steps, so FedNova differs from FedAvg. Each client is evaluated with its
model after its local update.
"""

import pytest
import torch

from .harness import mean_state, train_sizes
from .spec_fedadapterproto import ADAM, cross_entropy, drive_tiny, logits
from .spec_fedavg import check_global, check_local_models, local_models

pytestmark = pytest.mark.usefixtures("one_thread")



def test_one_round_matches_the_specification(tmp_path):
    run, fed, start, driven = drive_tiny("fednova", tmp_path, rounds=1, batch_size=8)
    models, steps = local_models(run, fed, start, cross_entropy, 0, ADAM)
    assert steps == [1, 2, 2]
    n = torch.tensor(train_sizes(fed), dtype=torch.float64)
    p, a = n / n.sum(), torch.tensor(steps, dtype=torch.float64)
    tau_eff = float((p * a).sum())
    states = [m.state_dict() for m in models]
    expected = mean_state(states, train_sizes(fed))                      # buffers: the weighted mean
    g = start.state_dict()
    for name, _ in start.named_parameters():
        d = sum(p[k] * (g[name].double() - states[k][name].double()) / a[k] for k in range(len(states)))
        expected[name] = g[name].double() - tau_eff * d
    server = start
    server.load_state_dict({k: v.float() for k, v in expected.items()}, strict=False)
    check_global(driven, fed, server, logits)
    check_local_models(driven, fed, models, logits)
