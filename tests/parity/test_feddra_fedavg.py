"""FedAvg on FedDRA's image-text model (Tables 2, 5, 6; Fig. 3), one round, under each backbone objective.

Specification (FedAvg, McMahan et al. 2017, as FedDRA's code averages: ``avg_param``): every client
copies the global model, trains it in training mode with a fresh AdamW (lr, betas, weight decay of
the run) for the round's local steps on the backbone objective (ConVIRT, GLoRIA or MGCA as
:mod:`tests.parity.vlp_spec` states them), and the server replaces every floating-point entry of the
state (parameters and BatchNorm statistics) by the unweighted mean of the clients' (FedDRA's
``aggregation: uniform``). The global model is then evaluated by in-domain retrieval on every
client's test pairs.
"""

import copy

import pytest

from .harness import assert_close
from .vlp_harness import drive_tiny, float64, float_state, mean_states, vlp_run  # noqa: F401
from .vlp_spec import (
    Objective,
    check_code_defaults,
    check_retrieval,
    loaded,
    train_client,
)

pytestmark = pytest.mark.usefixtures("one_thread", "float64")

VARIANTS = {"convirt": "fedavg_convirt", "gloria": "fedavg_gloria", "mgca": "fedavg_mgca"}


def fedavg_round(run, fed, start, objective):
    states = []
    for client in fed.clients:
        model = copy.deepcopy(start)
        train_client(run, client, 0, model, lambda m, b: objective.loss(m, b)[0])
        states.append(float_state(model))
    assert run["train"]["aggregation"]["weights"] == "uniform"
    return mean_states(states)


@pytest.mark.parametrize("objective", sorted(VARIANTS))
def test_fedavg_round_matches_the_specification(objective, tmp_path):
    run = vlp_run("feddra", VARIANTS[objective], train={"rounds": 1, "local": {"steps": 2}, "batch_size": 4})
    assert run["train"]["model"]["objective"] == objective
    check_code_defaults(run["train"]["model"])
    fed, start, driven = drive_tiny(run, tmp_path)
    spec = Objective(driven.method.family)
    expected = fedavg_round(run, fed, start, spec)
    assert_close(driven.method.server.state_dict(), expected, "server after one round")
    check_retrieval(driven, loaded(start, expected), fed, run)
