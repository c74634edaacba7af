"""FedMOON on FedDRA's image-text model (Table 2, ConVIRT; also GLoRIA and MGCA), two rounds.

Specification (MOON, Li, He and Song, CVPR 2021; code QinbinLi/MOON ``train_net_fedcon``): each
client starts from the global model and minimises the backbone objective plus
mu · CE([cos(z, z_glob), cos(z, z_prev)] / tau, 0), where z is the representation (here FedDRA's
joint image-text representation [û; ŵ], both L2-normalised), z_glob comes from the frozen global
model of the round and z_prev from the client's own model at the end of its previous round, both in
evaluation mode. In a client's first round MOON's pool of previous models is empty and the term has
only the positive logit (zero loss, zero gradient). mu = 1, tau = 0.5. The server averages
uniformly (FedDRA). Checked after the second round, so the previous-model term is active.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from .harness import assert_close
from .vlp_harness import drive_tiny, float64, float_state, mean_states, vlp_run  # noqa: F401
from .vlp_spec import Objective, check_retrieval, loaded, towers, train_client

pytestmark = pytest.mark.usefixtures("one_thread", "float64")


def representation(family, model, batch):
    t = towers(family, model, batch)
    return torch.cat([F.normalize(t.u, dim=-1), F.normalize(t.w, dim=-1)], dim=1)


def moon_rounds(run, fed, start, objective, rounds):
    mu, tau = run["algorithm"]["params"]["mu"], run["algorithm"]["params"]["tau"]
    family = objective.family
    server, previous = copy.deepcopy(start), {}
    for rnd in range(rounds):
        glob = copy.deepcopy(server).eval()
        states = []
        for client in fed.clients:
            prev = previous.get(client.name)

            def step_loss(model, batch, prev=prev):
                loss, t = objective.loss(model, batch)
                z = torch.cat([F.normalize(t.u, dim=-1), F.normalize(t.w, dim=-1)], dim=1)
                with torch.no_grad():
                    others = [representation(family, glob, batch)]
                    if prev is not None:
                        others.append(representation(family, prev, batch))
                logits = [F.cosine_similarity(z, other, dim=-1) for other in others]
                logits = torch.stack(logits, dim=1) / tau
                return loss + mu * F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long))

            model = copy.deepcopy(server)
            train_client(run, client, rnd, model, step_loss)
            previous[client.name] = copy.deepcopy(model).eval()
            states.append(float_state(model))
        server = loaded(start, mean_states(states))
    return server


@pytest.mark.parametrize("objective", ["convirt", "gloria", "mgca"])
def test_fedmoon_rounds_match_the_specification(objective, tmp_path):
    run = vlp_run("feddra", "fedmoon_convirt", objective,
                  train={"rounds": 2, "eval_every": 2, "local": {"steps": 1}, "batch_size": 4})
    fed, start, driven = drive_tiny(run, tmp_path)
    expected = moon_rounds(run, fed, start, Objective(driven.method.family), 2)
    assert_close(driven.method.server.state_dict(), float_state(expected), "server after two rounds")
    check_retrieval(driven, expected, fed, run)
