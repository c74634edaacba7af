"""FedCLIP (Lu et al., 2023) as the FACMIC and FAA-CLIP code runs it (``--method fedclip``), one round.

Specification: CLIP stays frozen; each client trains an attention adapter a(I) = softmax(W2 tanh(W1 I
+ b1) + b2) on the image features I = e_I(x) and masks them, I' = a(I) * I. The local loss is the B x B
contrastive loss with CLIP's frozen temperature, 100:

    logits = 100 n(I') n(T_y)^T,   L = 1/2 [CE(logits, arange B) + CE(logits^T, arange B)],

T_y = e_T("a picture of a {class of sample j}"); Adam over the adapter only (lr 5e-5, betas (0.9, 0.98),
eps 1e-6, wd 0.02), kept across rounds. ``--aggmode att`` averages the adapter: FACMIC weighs client i by
(n_i // B) x B, FAA-CLIP by 1/3. Predictions: softmax(100 n(I') n(T_c)^T). CLIP being frozen and the
preprocessing deterministic, I is cached once per image: the same features the code recomputes per batch.
"""

import pytest

from .clip_spec import check_on_features, contrastive_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def adapter_mask(model, features):
    return model.attention(features) * features        # a(I) * I


def fedclip_step(text):
    return lambda model, batch, ctx: contrastive_loss(adapter_mask(model, batch["x"]), text[batch["y"]], 100.0)


@pytest.mark.parametrize("paper", ["facmic", "faa_clip"])
def test_fedclip_round_matches_the_code(paper, tmp_path):
    check_on_features(tmp_path, paper, "fedclip", fedclip_step, adapter_mask)
