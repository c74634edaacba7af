"""FedAvg on a fully fine-tuned CLIP (FACMIC Table 2 / FAA-CLIP Tables III-IX baseline), one round.

Specification (both papers' code, ``--method fedavg --aggmode avg`` with every CLIP weight trainable):
every client copies the global CLIP and trains both encoders and CLIP's temperature t with Adam
(lr 5e-5, betas (0.9, 0.98), eps 1e-6, weight decay 0.02) on the B x B image-text contrastive loss

    logits = exp(t) n(e_I(x)) n(e_T(prompt_y))^T,   L = 1/2 [CE(logits, arange B) + CE(logits^T, arange B)]

(row j's positive is the prompt of sample j's class; other samples' prompts, same-class duplicates
included, are negatives). The server replaces every weight by the weighted mean of the clients' -
FACMIC: weights len(drop_last loader) x B = (n_i // B) x B; FAA-CLIP: 1/3 each. Every test split and
the global set are scored with softmax(100 n(e_I(x)) n(e_T(prompt_c))^T): the code's test uses a fixed
100, not the learned temperature.
"""

import pytest

from .clip_spec import check_full_clip, clip_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def fedavg_step(tokens):
    return lambda model, batch, ctx: clip_loss(model, tokens, batch["x"], batch["y"])


@pytest.mark.parametrize("paper", ["facmic", "faa_clip"])
def test_fedavg_full_clip_round_matches_the_specification(paper, tmp_path):
    check_full_clip(tmp_path, paper, "fedavg", fedavg_step)
