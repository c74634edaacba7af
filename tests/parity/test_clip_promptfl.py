"""PromptFL (Guo et al., IEEE TMC 2023; FAA-CLIP's prompt-learning baseline, not in the authors' code), one round.

Specification: both CLIP encoders are frozen; the prompt of class c is [SOS] v_1 ... v_M [name_c] [EOS]
with M context vectors shared by all classes (CoOp). Clients train only v with Adam (FAA-CLIP's
optimiser settings, kept across rounds) on the B x B contrastive loss - text features of the learned
class prompts, CLIP's frozen temperature exp(t) - and the server replaces v by the clients' mean
(FAA-CLIP: 1/3 each); only v is communicated. Predictions: softmax(exp(t) cos) over the class prompts.
"""

import pytest

from .clip_spec import check_full_clip, clip_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def test_promptfl_round_matches_the_specification(tmp_path):
    # the prompted model encodes every class prompt with the current context (its argument is unused)
    check_full_clip(tmp_path, "faa_clip", "promptfl", lambda tokens: lambda model, batch, ctx: clip_loss(
        model, tokens, batch["x"], batch["y"]), keys=lambda m: ["ctx"], predict_scale=lambda m: m.logit_scale.exp().item())
