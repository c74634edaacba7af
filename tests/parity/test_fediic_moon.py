"""MOON (FedIIC Table 1 baseline; mu = 10 from the supplementary Table 1, tau = 0.5 MOON's default), two rounds.

Specification: MOON (Li, He and Song, CVPR'21; QinbinLi/MOON ``train_net_fedcon``): FedAvg with
FedIIC's shared recipe (:mod:`tests.parity.spec_fediic`) and the local loss

    CE(f(dropout(g(x))), y) + mu * CE([cos(z, z_glob), cos(z, z_prev)] / tau, 0)

with z the representation of the local model being trained (here g(x), the family's pooled features),
z_glob that of the frozen global model of the round and z_prev that of the client's own model at the
end of its previous round, both in eval mode. In the first round there is no previous model: MOON's
code then has no negative (a softmax over one logit, the term is 0); the global model stands in for
it here, which makes the term the constant log 2 (no gradient, up to float rounding, which Adam
would amplify on parameters with near-zero gradients). The second round is where the term acts.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from .harness import train_sizes
from .spec_fedavg import averaged, check_global, local_models
from .spec_fediic import ADAM, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")

MU, TAU = 10.0, 0.5


def test_two_rounds_match_the_specification(tmp_path):
    run, fed, server, driven = drive_tiny("moon", tmp_path, rounds=2)
    previous = {}
    for rnd in range(2):
        def loss(model, batch, client, global_model):
            out, z = model(batch["x"])
            ce = F.cross_entropy(out, batch["y"])
            with torch.no_grad():
                z_glob = global_model(batch["x"])[1]
                z_prev = previous.get(client.name, global_model)(batch["x"])[1]
            pair = torch.stack([F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)], 1)
            return ce + MU * F.cross_entropy(pair / TAU, torch.zeros(len(z), dtype=torch.long))

        models, _ = local_models(run, fed, server, loss, rnd, ADAM)
        previous = {c.name: copy.deepcopy(m).eval().requires_grad_(False) for c, m in zip(fed.clients, models)}
        server = averaged(server, [m.state_dict() for m in models], train_sizes(fed))
    check_global(driven, fed, server, logits)
