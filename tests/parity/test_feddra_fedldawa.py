"""FedLDAWA on FedDRA's image-text model (Table 2, MGCA; also ConVIRT and GLoRIA), one round.

Specification (L-DAWA, Rehman et al., ICCV 2023; code yasar-rehman/L-DAWA ``L-DAWA-Agg.py``): local
training is FedAvg's (the backbone objective, fresh AdamW). The server then takes, for every client k
and every non-scalar entry x of its state (parameters and BatchNorm statistics alike: the code
scales the whole weight list), the cosine with the same entry g of the global model the round
started from, caps it at 1 and multiplies x by it (a client entry that is all zeros is left as it
is; an all-zero global entry - zero-initialised biases - has no angle and is left as it is too,
where the code would divide by zero); scalar entries are left as they are. The new global entry is
the mean over clients (the code divides by the number of clients; FedDRA's weights are uniform).
"""

import copy

import pytest

from .harness import assert_close
from .vlp_harness import drive_tiny, float64, float_state, vlp_run  # noqa: F401
from .vlp_spec import Objective, check_retrieval, loaded, train_client

pytestmark = pytest.mark.usefixtures("one_thread", "float64")


def ldawa(states, reference):
    out = {}
    for key in states[0]:
        scaled = []
        for state in states:
            x, g = state[key].double(), reference[key].double()
            if x.dim() > 0 and x.norm() > 0 and g.norm() > 0:
                x = x * min(float((x * g).sum() / (x.norm() * g.norm())), 1.0)
            scaled.append(x)
        out[key] = sum(scaled) / len(scaled)
    return out


@pytest.mark.parametrize("objective", ["convirt", "gloria", "mgca"])
def test_fedldawa_round_matches_the_specification(objective, tmp_path):
    run = vlp_run("feddra", "fedldawa_mgca", objective, train={"rounds": 1, "local": {"steps": 2}, "batch_size": 4})
    fed, start, driven = drive_tiny(run, tmp_path)
    spec = Objective(driven.method.family)
    states = []
    for client in fed.clients:
        model = copy.deepcopy(start)
        train_client(run, client, 0, model, lambda m, b: spec.loss(m, b)[0])
        states.append(float_state(model))
    expected = ldawa(states, float_state(start))
    # the rule does act: some entries of the aggregate are shrunk below the plain mean
    plain = {k: sum(s[k] for s in states) / len(states) for k in expected}
    assert any((expected[k] - plain[k]).abs().max() > 1e-9 for k in expected)
    assert_close(driven.method.server.state_dict(), expected, "server after one round")
    check_retrieval(driven, loaded(start, expected), fed, run)
