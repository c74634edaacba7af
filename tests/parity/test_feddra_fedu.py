"""FedU on FedDRA's image-text model (Tables 2 and 4; under each backbone objective), two rounds.

Specification (FedU, Zhuang et al., ICCV 2021; code EasyFL ``applications/fedssl`` with
``--update_encoder online --update_predictor dapu --dapu_threshold 0.4``): BYOL as
:mod:`tests.parity.byol_spec` states it, added to the backbone objective. The server averages the
clients' online models and predictors (uniformly, FedDRA); targets stay with the clients. At the
start of a round a client takes the global online model; it takes the global predictor if the
divergence of its online encoder over its previous round (mean per-layer L2 between the start and
the end of that local training) was below mu = 0.4, otherwise it keeps its own predictor
(parameters and statistics). In its first round it takes everything global.
"""

import pytest

from .byol_spec import byol_rounds
from .harness import assert_close
from .vlp_harness import drive_tiny, float64, float_state, vlp_run  # noqa: F401
from .vlp_spec import Objective, check_retrieval

pytestmark = pytest.mark.usefixtures("one_thread", "float64")


def fedu_rounds(run, fed, start, objective, rounds):
    mu = run["algorithm"]["params"]["threshold"]
    decisions = []

    def receive(name, model, last):
        _, state, div = last
        decisions.append(div < mu)
        if div >= mu:       # keep the own predictor (parameters and statistics)
            model.load_state_dict({**model.state_dict(), **{k: v for k, v in state.items() if k.startswith("predictor.")}})

    return byol_rounds(run, fed, start, objective, rounds, receive), decisions


@pytest.mark.parametrize("objective, lr, global_predictor", [
    ("convirt", None, True), ("gloria", None, True), ("mgca", None, True),
    ("convirt", 0.05, False),     # a large step size drives the encoder past mu: the local predictor stays
])
def test_fedu_rounds_match_the_specification(objective, lr, global_predictor, tmp_path):
    train = {"rounds": 2, "eval_every": 2, "local": {"steps": 1}, "batch_size": 4}
    if lr is not None:
        train["optimizer"] = {"lr": lr}
    run = vlp_run("feddra", "fedu_gloria", objective, train=train)
    assert run["algorithm"]["params"]["threshold"] == 0.4
    fed, start, driven = drive_tiny(run, tmp_path)
    expected, decisions = fedu_rounds(run, fed, start, Objective(driven.method.family), 2)
    assert decisions == [global_predictor] * len(fed.clients)
    assert_close(driven.method.server.state_dict(), float_state(expected), "server after two rounds")
    check_retrieval(driven, expected, fed, run)
