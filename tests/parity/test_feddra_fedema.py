"""FedEMA on FedDRA's image-text model (Table 2, ConVIRT; also GLoRIA and MGCA), three rounds.

Specification (FedEMA, Zhuang, Wen and Zhang, ICLR 2022; code EasyFL ``applications/fedssl`` with
``--update_encoder dynamic_ema_online --update_predictor dynamic_dapu --auto_scaler y
--auto_scaler_target 0.7``): BYOL as :mod:`tests.parity.byol_spec` states it, added to the backbone
objective; uniform averaging of the clients' online models and predictors (FedDRA). At the start
of a round a client that trained before blends the global model into its own:
w <- mu w_own + (1 - mu) w_global for every parameter (encoders, alignment blocks, heads,
predictor), with mu = min(lambda d, 1), d the divergence of its previous round's local training
(mean per-layer L2 of the online image encoder, start vs end) and lambda = tau / d fixed at the
first blend (tau = 0.7, so the first blend has mu = tau). Buffers are the global model's, except
the predictor's when mu > 0.5 (the code then blends into the local predictor). Its target is the
one it kept. Three rounds, so the second blend uses a divergence other than the one that set lambda.
"""

import pytest

from .byol_spec import byol_rounds
from .harness import assert_close
from .vlp_harness import drive_tiny, float64, float_state, vlp_run  # noqa: F401
from .vlp_spec import Objective, check_retrieval

pytestmark = pytest.mark.usefixtures("one_thread", "float64")


def fedema_rounds(run, fed, start, objective, rounds):
    tau = run["algorithm"]["params"]["tau"]
    scale, mus = {}, []

    def receive(name, model, last):
        _, local, div = last
        scale.setdefault(name, tau / div)
        mu = min(scale[name] * div, 1.0)
        mus.append(mu)
        params = dict(model.named_parameters())
        blended = model.state_dict()
        blended.update({n: mu * local[n] + (1 - mu) * blended[n] for n in params})
        if mu > 0.5:
            blended.update({k: v for k, v in local.items() if k.startswith("predictor.") and k not in params})
        model.load_state_dict(blended)

    return byol_rounds(run, fed, start, objective, rounds, receive), mus


@pytest.mark.parametrize("objective", ["convirt", "gloria", "mgca"])
def test_fedema_rounds_match_the_specification(objective, tmp_path):
    run = vlp_run("feddra", "fedema_convirt", objective,
                  train={"rounds": 3, "eval_every": 3, "local": {"steps": 1}, "batch_size": 4})
    fed, start, driven = drive_tiny(run, tmp_path)
    expected, mus = fedema_rounds(run, fed, start, Objective(driven.method.family), 3)
    # the first blend has mu = tau exactly; the second follows the divergence (with Adam's normalised
    # steps it stays close to tau): the method's own mu must be the specification's to 1e-9
    assert mus[:2] == pytest.approx([0.7, 0.7], abs=1e-12) and all(mu != 0.7 for mu in mus[2:])
    assert [driven.method.mu[c.name] for c in fed.clients] == pytest.approx(mus[2:], abs=1e-9)
    assert_close(driven.method.server.state_dict(), float_state(expected), "server after three rounds")
    check_retrieval(driven, expected, fed, run)
