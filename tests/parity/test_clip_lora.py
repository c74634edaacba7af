"""LoRA r = 3 (FAA-CLIP's "LoRA r=3" baseline; not in the authors' code), one round.

Specification (Hu et al., ICLR 2022, federated as in FedIT: FedAvg of the factors): CLIP is frozen; the
q, k and v projections of every attention block of both encoders (CLIP-LoRA's choice, FAA-CLIP names no
layers) compute with W + (alpha / r) B A, A in R^{r x d}, B in R^{d x r}, B = 0 at the start, r = 3,
alpha = r. Clients train only (A, B) with Adam (FAA-CLIP's optimiser settings, kept across rounds) on
the B x B contrastive loss with CLIP's frozen temperature exp(t); the server replaces each factor by the
mean of the clients' (FAA-CLIP: 1/3 each), nothing else is communicated. Predictions: softmax(exp(t) cos)
over the class prompts.
"""

import pytest

from .clip_spec import check_full_clip, clip_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def trainable(model):
    return [name for name, p in model.named_parameters() if p.requires_grad]


def test_lora_round_matches_the_specification(tmp_path):
    check_full_clip(tmp_path, "faa_clip", "lora", lambda tokens: lambda model, batch, ctx: clip_loss(
        model, tokens, batch["x"], batch["y"]), keys=trainable, predict_scale=lambda m: m.logit_scale.exp().item())
