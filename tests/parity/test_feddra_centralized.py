"""Centralized pre-training (FedDRA Tables 2-6 "Centralized", Table 4 "FedGlobal"; Fig. 3a), one round.

Specification: all clients' training pairs are pooled into one dataset and one model is trained on
it with the run's optimizer and backbone objective. FedDRA compares it with federated pre-training
at the same amount of local work: the pooled model takes the federation's total number of local
batches per round, K x ``local.steps`` (here K = 2 clients x 2 steps = 4 batches), drawn like a
single client's (the engine's per-participant stream, participant index 0). It is evaluated like the
federated models: retrieval on every original client's test pairs.
"""

import copy

import pytest

from fedrepro.fl.federation import ClientData
from fedrepro.fl.local import local_batches
from fedrepro.methods.centralized import pool_datasets

from .harness import assert_close
from .vlp_harness import drive_tiny, float64, float_state, vlp_run  # noqa: F401
from .vlp_spec import Objective, check_retrieval, train_client

pytestmark = pytest.mark.usefixtures("one_thread", "float64")

VARIANTS = {"convirt": "centralized_convirt", "gloria": "centralized_gloria", "mgca": "centralized_mgca"}


@pytest.mark.parametrize("objective", sorted(VARIANTS))
def test_centralized_round_takes_the_federations_steps(objective, tmp_path):
    run = vlp_run("feddra", VARIANTS[objective], train={"rounds": 1, "local": {"steps": 2}, "batch_size": 4})
    fed, start, driven = drive_tiny(run, tmp_path)
    spec = Objective(driven.method.family)
    pooled = ClientData("pooled", 0, pool_datasets([c.train for c in fed.clients]), None, None)   # the data plumbing
    budget = {**run["train"], "local": {**run["train"]["local"], "steps": len(fed.clients) * run["train"]["local"]["steps"]}}
    batches = list(local_batches(pooled.train, budget, run["seed"], 0, 0))
    assert len(batches) == 4
    model = copy.deepcopy(start)
    train_client(run, pooled, 0, model, lambda m, b: spec.loss(m, b)[0], batches=batches)
    assert_close(driven.method.server.state_dict(), float_state(model), "pooled model after one round")
    assert driven.result.history["loss"].notna().all()
    check_retrieval(driven, model, fed, run)
