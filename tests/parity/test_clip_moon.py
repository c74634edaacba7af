"""MOON on a fully fine-tuned CLIP (FACMIC Table 2, FAA-CLIP Tables III-IX), as both papers' code runs it.

Specification (``--method moon``, ``utils/training.py``; mu = 1, tau = ``--temp`` 0.5): each local step
adds to the B x B contrastive loss (see test_clip_fedavg.py) the model-contrastive term on the image
embeddings only,

    pos = cos(z, z_glob),  neg = cos(z, z_prev),  l = CE([pos, neg] / tau, class 0),   L += mu * l

with z = e_I(x) of the model being trained, z_glob = e_I(x) of ``server_model_pre`` and z_prev = e_I(x)
of ``previous_nets[client]``. The term is added only when ``args.step > 0`` (not for the run's very
first client update). What the two models are is where the papers' code differs from MOON:

- FACMIC: ``server_model_pre = server_model`` (so z_glob comes from G_r, the round's start) and
  ``previous_nets = models`` - the very models being trained, so z_prev = z: neg = 1 / tau, and the
  negative carries no gradient (the ``paper`` protocol's ``previous: current``);
- FAA-CLIP: both are deep copies taken before each aggregation, so z_glob comes from G_{r-1} (G_0 in
  rounds 0 and 1) and z_prev from the client's own model at the end of its previous round;
- MOON as published (``clean`` protocol): z_glob from G_r, z_prev from the client's previous-round
  model, on every update.

Aggregation as FedAvg (FACMIC: weights (n_i // B) x B; FAA-CLIP: 1/3 each); predictions softmax(100 cos).
"""

import pytest
import torch
import torch.nn.functional as F

from .clip_spec import check_full_clip, clip_loss

pytestmark = pytest.mark.usefixtures("one_thread")

MU, TEMP = 1.0, 0.5        # the code's mu = 1 and --temp 0.5


def moon_step(tokens):
    def step(model, batch, ctx):
        x = batch["x"]
        z = model.encode_image(x).float()
        loss = clip_loss(model, tokens, x, batch["y"], image=z)
        if ctx.regularise:
            # neither model is trained by this step (FACMIC: previous_nets[client] is the model being
            # trained, so z_prev = z; cos(z, z) is constant, whether it is differentiated does not matter)
            with torch.no_grad():
                z_glob = ctx.server.encode_image(x).float()
                z_prev = ctx.previous.encode_image(x).float()
            logits = torch.stack([F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)], 1) / TEMP
            loss = loss + MU * F.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long))
        return loss
    return step


@pytest.mark.parametrize("paper, protocol, rounds", [
    ("facmic", "paper", 1),       # z_prev = the current model's z; first client update without the term
    ("faa_clip", "paper", 2),     # z_glob from G_{r-1}: the second round tells it from G_r
    ("facmic", "clean", 2),       # MOON: z_prev from the client's previous-round model (differs from G_r in round 2)
])
def test_moon_full_clip_matches_the_code(paper, protocol, rounds, tmp_path):
    code = protocol == "paper"
    check_full_clip(tmp_path, paper, "moon", moon_step, protocol=protocol, rounds=rounds, gate=code,
                    anchor="copy" if code and paper == "faa_clip" else "live",
                    previous="live" if code and paper == "facmic" else "copy")
