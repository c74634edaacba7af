"""Decentralized pre-training and the local re-training of Fig. 3b (FedDRA Tables 2, 6; Fig. 3a-b).

Specification: decentralized = every client trains its own model from the common initial model on
its own data (run's optimizer and backbone objective), nothing is communicated or averaged, and
FedDRA reports "the averaged performance of the local models": every local model is scored on every
client's test pairs (``<model client>@<data client>``) and a client's score is the mean over the
models. Fig. 3b: R rounds of FedAvg (uniform mean), then every client re-trains the round-R server
on its own data; the turn-R rows are the clients' models of round R itself (after their local
training, before the aggregation), scored the same way (``turn<R>.`` keys).
"""

import copy

import numpy as np
import pytest

from .harness import assert_close
from .vlp_harness import (  # noqa: F401
    drive_tiny,
    float64,
    float_state,
    mean_states,
    recorded,
    vlp_run,
)
from .vlp_spec import Objective, check_retrieval, loaded, train_client

pytestmark = pytest.mark.usefixtures("one_thread", "float64")

VARIANTS = {"convirt": "decentralized_convirt", "gloria": "decentralized_gloria", "mgca": "decentralized_mgca"}


def local_models(run, fed, start, spec, rnd):
    models = {}
    for client in fed.clients:
        model = copy.deepcopy(start)
        train_client(run, client, rnd, model, lambda m, b: spec.loss(m, b)[0])
        models[client.name] = model
    return models


def check_mean_over_models(driven, fed, prefix=""):
    for data in fed.clients:
        for metric in ("recall@1", "recall@5", "cos_sim"):
            own = [recorded(driven, f"{prefix}{o.name}@{data.name}")[metric] for o in fed.clients]
            assert recorded(driven, f"{prefix}{data.name}")[metric] == pytest.approx(np.mean(own), abs=1e-12)


@pytest.mark.parametrize("objective", sorted(VARIANTS))
def test_decentralized_round_matches_the_specification(objective, tmp_path):
    run = vlp_run("feddra", VARIANTS[objective], train={"rounds": 1, "eval_every": 1, "local": {"steps": 2}, "batch_size": 4})
    fed, start, driven = drive_tiny(run, tmp_path)
    models = local_models(run, fed, start, Objective(driven.method.family), 0)
    assert_close(driven.method.server.state_dict(), float_state(start), "the server is never updated")
    for name, model in models.items():
        assert_close(driven.method.local_states[name], float_state(model), f"{name}'s own model")
        check_retrieval(driven, model, fed, run, owner=name)
    check_mean_over_models(driven, fed)


def test_local_retraining_keeps_and_scores_the_turn_models(tmp_path):
    """Fig. 3b with R = 1 (the grid's R = 25, 26 rounds, shrunk): round 0 FedAvg, round 1 local."""
    run = vlp_run("feddra", "local_retrain", train={"rounds": 2, "eval_every": 2, "local": {"steps": 1}, "batch_size": 4})
    run["algorithm"]["params"]["federated_rounds"] = 1
    fed, start, driven = drive_tiny(run, tmp_path)
    spec = Objective(driven.method.family)
    turn = local_models(run, fed, start, spec, 0)
    server = loaded(start, mean_states([float_state(m) for m in turn.values()]))
    retrained = local_models(run, fed, server, spec, 1)
    for name in turn:
        check_retrieval(driven, turn[name], fed, run, prefix="turn1.", owner=name)
        check_retrieval(driven, retrained[name], fed, run, owner=name)
    check_mean_over_models(driven, fed, "turn1.")
    check_mean_over_models(driven, fed)
