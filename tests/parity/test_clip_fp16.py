"""The FACMIC and FAA-CLIP full fine-tuning baselines in the authors' numbers (``precision: fp16_weights``,
their paper file's ``authors_numerics``): pure fp16 with fp32 LayerNorm, as their code runs CLIP.

Specification (written independently in clip_spec.py from the authors' code): the model ``clip.load`` returns on
a GPU (openai/CLIP ``clip/model.py::convert_weights`` and ``clip/model.py::LayerNorm``; ``encode_image`` feeds it
fp16 images), trained by AIPMLab/FACMIC and AIPMLab/FAA-CLIP ``utils/training.py::train``: forward and backward in
fp16 (no autocast, no loss scaling), then ``utils/clip_util.py::convert_models_to_fp32`` (every weight and
gradient to fp32), ``optimizer.step()`` (Adam, its moments fp32), ``clip.model.convert_weights`` (the fp16 weights
back to fp16); aggregated by ``utils/aggregation.py::communication`` (each w_i x weight in fp16, summed in fp32,
copied into the fp16 server). FedProx's term as the code computes it on that model: per parameter
``torch.pow(torch.norm(w - w_t), 2).float()``, summed onto ``torch.tensor(1e-10)``, square root, x 0.005.

The engine (fedrepro.device: ``Compute.round_weights``, ``Compute.keep_fp16_weights``; fedrepro.fl.method
``weighted_average``) must give the same weights and probabilities bit for bit: both sides run the same
arithmetic in the same dtypes on the same CPU. (Both encode each class prompt once where the code encodes one
prompt per sample: the same forward values; in fp16 the gradients of a class's rows are summed before their
rounding instead of after - clip_spec.clip_logits.)
"""

import pytest
import torch

from .clip_spec import check_full_clip, clip_loss
from .test_clip_fedprox import CODE_COEFFICIENT

pytestmark = pytest.mark.usefixtures("one_thread")

EXACT = 0.0


def fedavg_step(tokens):
    return lambda model, batch, ctx: clip_loss(model, tokens, batch["x"], batch["y"])


def fp16_prox_step(tokens):
    def step(model, batch, ctx):
        loss = clip_loss(model, tokens, batch["x"], batch["y"])
        if ctx.regularise:
            w_diff = torch.tensor(1e-10)
            for w, w_t in zip(ctx.server.parameters(), model.parameters()):
                w_diff = w_diff + torch.pow(torch.norm(w.detach() - w_t), 2).float()
            loss = loss + CODE_COEFFICIENT * torch.sqrt(w_diff)
        return loss
    return step


@pytest.mark.parametrize("paper", ["facmic", "faa_clip"])
def test_fedavg_on_the_authors_fp16_clip_matches_their_loop_bit_for_bit(paper, tmp_path):
    check_full_clip(tmp_path, paper, "fedavg", fedavg_step, precision="fp16_weights", tol=EXACT)


def test_fedprox_on_the_authors_fp16_clip_matches_their_loop_bit_for_bit(tmp_path):
    check_full_clip(tmp_path, "facmic", "fedprox", fp16_prox_step, protocol="paper", gate=True,
                    precision="fp16_weights", tol=EXACT)


def test_the_full_fine_tuning_baselines_run_in_the_authors_numbers_by_default():
    """Under the default (authors') numerics every full fine-tuning baseline of both papers resolves to
    fp16_weights, under both protocols; under the fast numerics to auto (bf16 on a capable GPU)."""
    from fedrepro.config import load_project

    from .harness import ROOT

    for numerics, expected in (("authors", "fp16_weights"), ("fast", "auto")):
        proj = load_project([ROOT / "config/config.yaml"], {"numerics": numerics}, root=ROOT)
        for paper, methods in (("facmic", ("centralized", "fedavg", "fedprox", "moon", "fedfocal")),
                               ("faa_clip", ("fedavg", "fedprox", "moon"))):
            setting = next(iter(proj.papers[paper]["settings"]))
            for method in methods:
                for protocol in ("clean", "paper"):
                    train = proj.resolver.train_config(paper, setting, method, protocol)
                    assert train["model"]["family"] == "clip_full" and train["precision"] == expected, \
                        (numerics, paper, method, protocol)
