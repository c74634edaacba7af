"""FedProx on a fully fine-tuned CLIP (FACMIC Table 2, FAA-CLIP Tables III-IX), as both papers' code runs it.

Specification (``--method fedprox``, ``utils/training.py``): each local step adds to the B x B
contrastive loss (see test_clip_fedavg.py) the code's proximal term

    0.005 * sqrt(1e-10 + sum over every CLIP parameter ||w - w_anchor||^2)       ("1e-2 / 2. * w_diff")

- a *non-squared* norm with coefficient 0.005, i.e. mu = 0.01 in FedProx's (mu / 2) convention. It is
added only when ``args.step > 0``, a count of client updates never reset, so the run's very first client
update (client 0, round 0) trains without it. The anchor is the code's ``server_model_pre``:

- FACMIC: the server model object itself, so in round r the global model G_r the clients started from;
- FAA-CLIP: a deep copy of the server taken before each aggregation, so in round r it is G_{r-1} (G_0
  in rounds 0 and 1): the previous round's starting model.

Aggregation as FedAvg (FACMIC: weights (n_i // B) x B; FAA-CLIP: 1/3 each); predictions softmax(100 cos).
Both quirks (the gate and FAA-CLIP's lagged anchor) are the ``paper`` protocol's; under ``clean`` the
proximal term (same strength) is on for every update and anchored at G_r, as FedProx is published.
"""

import pytest
import torch

from .clip_spec import check_full_clip, clip_loss

pytestmark = pytest.mark.usefixtures("one_thread")

CODE_COEFFICIENT = 1e-2 / 2.0     # hard-coded in both papers' utils/training.py


def prox_step(tokens):
    def step(model, batch, ctx):
        loss = clip_loss(model, tokens, batch["x"], batch["y"])
        if ctx.regularise:
            # sum_p ||w_p - w_t,p||^2 (the code sums torch.norm(.)^2 per parameter: the same number)
            squares = sum(((w_t - w.detach()) ** 2).sum() for w, w_t in zip(ctx.server.parameters(), model.parameters()))
            loss = loss + CODE_COEFFICIENT * torch.sqrt(squares + 1e-10)
        return loss
    return step


@pytest.mark.parametrize("paper, protocol, rounds", [
    ("facmic", "paper", 1),       # anchor = G_r, first client update unregularised
    ("faa_clip", "paper", 2),     # anchor = G_{r-1}: the second round tells it from G_r
    ("faa_clip", "clean", 1),     # FedProx as published, the code's strength
])
def test_fedprox_full_clip_matches_the_code(paper, protocol, rounds, tmp_path):
    code = protocol == "paper"
    check_full_clip(tmp_path, paper, "fedprox", prox_step, protocol=protocol, rounds=rounds, gate=code,
                    anchor="copy" if code and paper == "faa_clip" else "live")
