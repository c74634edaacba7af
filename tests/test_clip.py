"""FACMIC and FAA-CLIP: losses against hand-computed values, the CLIP model families, the methods'
communication rules, the cached/uncached equivalence, and the demo configs end to end (Python API)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedrepro.config import ConfigError, load_project, method_schema, model_schema, validate
from fedrepro.data.loader import FeatureSet
from fedrepro.fl.comm import CommLedger
from fedrepro.fl.federation import ClientData, Federation
from fedrepro.fl.method import MethodContext
from fedrepro.methods.faa_clip import (
    DomainClassifier,
    domain_adversarial_loss,
    grad_reverse,
)
from fedrepro.methods.facmic import (
    gaussian_kernels,
    kernel_bandwidth,
    lmmd,
    pairwise_sq_dists,
    source_weights,
    target_weights,
)
from fedrepro.models.fam import FeatureAttention
from fedrepro.models.families import clip_batch_objective, cross_entropy_over
from fedrepro.registry import method_class, model_class

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")
TINY = {"name": "fedrepro-tiny-clip", "pretrained": "none", "preprocess": "clip", "prompt": "a picture of a {}"}


# --------------------------------------------------------------------------------------------
# losses on tiny tensors

def test_contrastive_loss_matches_hand_computation():
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    text = torch.tensor([[1.0, 0.0], [1.0, 1.0]])       # class 0, class 1
    loss = cross_entropy_over(clip_batch_objective(image, torch.tensor([0, 1]), text, 2.0))
    r = math.sqrt(2.0)                                    # 2 * cos(45 deg)
    rows = [-math.log(math.exp(2) / (math.exp(2) + math.exp(r))), -math.log(math.exp(r) / (1 + math.exp(r)))]
    cols = [-math.log(math.exp(2) / (math.exp(2) + 1)), -math.log(0.5)]
    assert loss.item() == pytest.approx(0.5 * (sum(rows) / 2 + sum(cols) / 2), rel=1e-6)


def test_kernel_bandwidth_and_multi_kernel_by_hand():
    points = torch.tensor([[0.0], [1.0], [2.0], [4.0]])
    d2 = pairwise_sq_dists(points, points)
    assert torch.allclose(d2[0], torch.tensor([0.0, 1.0, 4.0, 16.0])) and torch.allclose(d2, d2.t())
    # squared distances between distinct points: 1, 4, 16, 1, 9, 4 (each twice)
    assert kernel_bandwidth(d2, "mean").item() == pytest.approx(2 * 35 / 12)
    assert kernel_bandwidth(d2, "median").item() == pytest.approx(4.0)
    # squared distances 1, 9, 49, 4, 36, 16 (each twice): the median is the mean of the two middle values
    # (9 + 16) / 2, as np.median; torch.median would give the lower one, 9
    spread = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
    assert kernel_bandwidth(pairwise_sq_dists(spread, spread), "median").item() == pytest.approx(12.5)
    one, b = torch.tensor(1.0), torch.tensor(2.0)
    five = sum(math.exp(-1.0 / (2.0 / 4 * 2 ** m)) for m in range(5))      # (b/4) * 2^m, m = 0..4
    assert gaussian_kernels(one, b, 5, 2.0).item() == pytest.approx(five)
    assert gaussian_kernels(one, b, 1, 2.0).item() == pytest.approx(math.exp(-0.5))
    with pytest.raises(ValueError, match="allowed: mean, median"):
        kernel_bandwidth(d2, "mode")


def test_lmmd_class_weights_by_hand():
    ws = source_weights(torch.tensor([0, 0, 2]), 3)
    assert torch.allclose(ws, torch.tensor([[0.5, 0, 0], [0.5, 0, 0], [0, 0, 1.0]]))
    probs = torch.tensor([[0.8, 0.2], [0.4, 0.6]])
    assert torch.allclose(target_weights(probs, "soft"), torch.tensor([[0.8 / 1.2, 0.2 / 0.8], [0.4 / 1.2, 0.6 / 0.8]]))
    hard = target_weights(torch.tensor([[0.8, 0.2], [0.6, 0.4], [0.1, 0.9]]), "hard")
    assert torch.allclose(hard, torch.tensor([[0.5, 0.0], [0.5, 0.0], [0.0, 1.0]]))


def _reference_lmmd(src, tgt, ws, wt, classes, denom, bandwidth, kernels):
    """LMMD written out as the sums of eq. 6, point by point."""
    def k(x, y):
        d2 = sum((a - b) ** 2 for a, b in zip(x, y))
        base = bandwidth / 2 ** (kernels // 2)
        return sum(math.exp(-d2 / (base * 2 ** m)) for m in range(kernels))
    total = 0.0
    for c in classes:
        total += sum(ws[i][c] * ws[j][c] * k(src[i], src[j]) for i in range(len(src)) for j in range(len(src)))
        total += sum(wt[i][c] * wt[j][c] * k(tgt[i], tgt[j]) for i in range(len(tgt)) for j in range(len(tgt)))
        total -= 2 * sum(ws[i][c] * wt[j][c] * k(src[i], tgt[j]) for i in range(len(src)) for j in range(len(tgt)))
    return total / denom


def test_lmmd_code_and_paper_variants_match_the_sums_of_eq6():
    src, tgt = [[0.0], [1.0]], [[0.5], [2.0]]
    s, t, y = torch.tensor(src), torch.tensor(tgt), torch.tensor([0, 1])
    all_d2 = [1, 0.25, 4, 0.25, 1, 2.25]                 # between the 4 distinct points
    mean_b = sum(all_d2) / len(all_d2)
    median_b = float(np.median(all_d2 * 2))               # 1.0

    # code defaults: soft weights, common classes, 5 kernels, mean bandwidth; both target argmax classes exist
    probs = torch.tensor([[0.8, 0.2], [0.4, 0.6]])
    wt = [[0.8 / 1.2, 0.2 / 0.8], [0.4 / 1.2, 0.6 / 0.8]]
    expected = _reference_lmmd(src, tgt, [[1, 0], [0, 1]], wt, [0, 1], 2, mean_b, 5)
    assert lmmd(s, t, y, probs).item() == pytest.approx(expected, rel=1e-5)

    # the target argmax is class 0 for both: code = class 0 only; paper = (1/K) over both classes
    probs = torch.tensor([[0.8, 0.2], [0.6, 0.4]])
    soft = [[0.8 / 1.4, 0.2 / 0.6], [0.6 / 1.4, 0.4 / 0.6]]
    assert lmmd(s, t, y, probs).item() == pytest.approx(
        _reference_lmmd(src, tgt, [[1, 0], [0, 1]], soft, [0], 1, mean_b, 5), rel=1e-5)
    paper = lmmd(s, t, y, probs, kernels=1, bandwidth="median", pseudo_labels="hard", classes="all")
    hard = [[0.5, 0.0], [0.5, 0.0]]
    assert paper.item() == pytest.approx(_reference_lmmd(src, tgt, [[1, 0], [0, 1]], hard, [0, 1], 2, median_b, 1), rel=1e-5)


def test_lmmd_vanishes_on_identical_domains_and_only_the_source_gets_gradients():
    x = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]], requires_grad=True)
    y = torch.tensor([0, 1, 1])
    value = lmmd(x, x.detach().clone(), y, F.one_hot(y, 2).float(), pseudo_labels="hard")
    assert value.item() == pytest.approx(0.0, abs=1e-6)
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7]], requires_grad=True)
    lmmd(x, x.detach() + 0.3, y, probs).backward()
    assert x.grad.abs().sum() > 0 and probs.grad is None     # pseudo-labels are never differentiated


def test_lmmd_runs_in_float64_and_agrees_with_float32():
    # the class weights used to be cast to float32, so double-precision features crashed the matmul
    gen = torch.Generator().manual_seed(3)
    s, t = torch.randn(6, 4, generator=gen, dtype=torch.float64), torch.randn(6, 4, generator=gen, dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 1, 2, 2])
    probs = torch.softmax(torch.randn(6, 3, generator=gen, dtype=torch.float64), 1)
    for options in ({}, {"kernels": 1, "bandwidth": "median", "pseudo_labels": "hard", "classes": "all"}):
        double = lmmd(s, t, y, probs, **options)
        assert double.dtype == torch.float64
        assert double.item() == pytest.approx(lmmd(s.float(), t.float(), y, probs.float(), **options).item(), rel=1e-5)


def test_gradient_reversal_layer():
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = grad_reverse(x, 0.5)
    assert torch.equal(y, x)
    (y * torch.tensor([3.0, 4.0])).sum().backward()
    assert torch.allclose(x.grad, torch.tensor([-1.5, -2.0]))


class SumLogit(torch.nn.Module):
    """A 'discriminator' whose logit is the sum of the features (no parameters, no BatchNorm)."""

    def forward(self, x):
        return x.sum(-1)


def test_domain_adversarial_loss_by_hand():
    s = torch.tensor([[0.5, 0.5], [2.0, 0.0]], requires_grad=True)    # logits 1 and 2
    t = torch.tensor([[-1.0, 0.0], [0.0, 0.0]])                        # logits -1 and 0
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    bce_s = [-math.log(sig(1.0)), -math.log(sig(2.0))]
    bce_t = [-math.log(1 - sig(-1.0)), -math.log(1 - sig(0.0))]
    loss = domain_adversarial_loss(SumLogit(), s, t, coeff=1.0)
    assert loss.item() == pytest.approx(0.5 * (sum(bce_s) / 2 + sum(bce_t) / 2))
    joint = domain_adversarial_loss(SumLogit(), s, t, joint=True)
    assert joint.item() == pytest.approx((sum(bce_s) + sum(bce_t)) / 4)
    loss.backward()
    # d/dlogit of -log sig(z) is -(1 - sig(z)); the GRL flips it, and 1/2 * 1/2 averages the two domains
    for row, z in zip(s.grad, (1.0, 2.0)):
        assert torch.allclose(row, torch.full((2,), 0.25 * (1 - sig(z))))


def test_fam_variants_layers_and_parameter_counts():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    linear = 512 * 512 + 512
    assert count(FeatureAttention(512)) == 526_336 == 2 * linear + 2 * 512            # the papers' FAM
    assert count(FeatureAttention(512, variant="deeper")) == 3 * linear + 4 * 512      # ~1.5x (Table VII)
    assert count(FeatureAttention(512, variant="fea1")) == linear
    assert count(FeatureAttention(512, variant="fea4")) == 2 * linear
    kinds = [type(m).__name__ for m in FeatureAttention(8, variant="fea3").attention]
    assert kinds == ["Linear", "BatchNorm1d", "LeakyReLU", "Softmax"]
    fam = FeatureAttention(8).eval()
    x = torch.randn(5, 8)
    mask = fam.attention(x)
    assert torch.allclose(mask.sum(1), torch.ones(5)) and (mask >= 0).all()
    assert torch.allclose(fam(x), mask * x)
    with pytest.raises(ValueError, match="allowed"):
        FeatureAttention(8, variant="fea6")
    assert count(DomainClassifier(512)) == 2 * linear + 4 * 512 + 513


# --------------------------------------------------------------------------------------------
# the methods on a small synthetic federation of cached features

def _federation(dim=8, classes=3, per_client=(12, 16, 20), reference=10, seed=0):
    gen = torch.Generator().manual_seed(seed)
    text = torch.randn(classes, dim, generator=gen)

    def part(n, start, labelled=True):
        y = torch.arange(n) % classes
        x = text[y] + 0.5 * torch.randn(n, dim, generator=gen)
        return FeatureSet(x, y if labelled else torch.full((n,), -1), np.arange(start, start + n))

    clients, row = [], 0
    for i, n in enumerate(per_client):
        clients.append(ClientData(f"client{i}", i, part(n, row), part(4, row + n), part(4, row + n + 4)))
        row += n + 8
    return Federation(clients, part(9, row), part(reference, row + 9, labelled=False) if reference else None,
                      [f"c{i}" for i in range(classes)], {"text_features": text})


def _method(name: str, params: dict | None = None, family: str = "clip_fam", model: dict | None = None, fed=None,
            weights="uniform"):
    params = validate(dict(params or {}), method_schema(name), "params")
    model = validate({"family": family, **(model or {})}, model_schema(family), "model")
    run = {"seed": 0, "setting": "test", "method": name, "algorithm": {"name": name, "params": params},
           "train": {"model": model, "batch_size": 4, "local": {"epochs": 1, "drop_last": True},
                     "optimizer": {"name": "adam", "lr": 1e-2, "weight_decay": 0.0, "persist": False},
                     "aggregation": {"weights": weights}, "eval_batch_size": 64, "num_workers": 0}}
    fed = fed or _federation()
    ctx = MethodContext(run=run, federation=fed, device=torch.device("cpu"), comm=CommLedger(), log=logging.getLogger("t"))
    method = method_class(name)(ctx)
    method.setup()
    return method


def _round(method, rnd=0):
    message = method.broadcast(rnd)
    updates = [method.local_update(c, message, rnd) for c in method.participants()]
    method.aggregate(updates, rnd)
    return updates


def test_facmic_round_weights_clients_by_size_and_needs_a_target_set():
    method = _method("facmic", weights="train_size")
    updates = _round(method)
    assert all(math.isfinite(u.stats["loss"]) for u in updates)
    key = "attention.0.weight"
    sizes = torch.tensor([12.0, 16.0, 20.0])
    expected = sum(w * u.payload[key] for w, u in zip(sizes / sizes.sum(), updates))
    assert torch.allclose(method.server.state_dict()[key], expected, atol=1e-6)
    assert set(updates[0].payload) == set(method.server.state_dict())         # the whole FAM, BN statistics too
    with pytest.raises(ValueError, match="reference_fraction"):
        _method("facmic", fed=_federation(reference=0))
    with pytest.raises(ValueError, match="reference_fraction"):          # without L_DA the target still passes
        _method("facmic", params={"lambda_da": 0}, fed=_federation(reference=0))
    _method("facmic", params={"lambda_da": 0, "target_pass": False}, fed=_federation(reference=0))
    with pytest.raises(ValueError, match="clip_fam or clip_fam_images"):
        _method("facmic", family="clip_adapter")


@pytest.mark.parametrize("paper, variant", [("facmic", "facmic_no_da"), ("faa_clip", "faa_no_da")])
def test_without_da_the_target_batch_still_moves_the_batchnorm_statistics(paper, variant, tmp_path, monkeypatch):
    """FACMIC Table 3 "without" and FAA-CLIP Table VII / Fig. 6 "w/o DA" as the authors' code gives them with a
    zero DA weight (AIPMLab/FACMIC ``utils/training.py::train``, ``--method ours``: the target batch goes
    through ``model.fea_attn`` in training mode to make the pseudo-labels, before ``loss = cla_loss +
    loss_m``; AIPMLab/FAA-CLIP the same function: the ``no_grad`` target pass that feeds D, before ``loss =
    cla_loss + 0.5 * loss_m``): driven through the engine on a target moved far away, every local step sends
    one source and one target batch through the FAM's BatchNorm in training mode, and its running statistics
    differ from those of the no-pass option (``target_pass: false``), which sends the source batch only."""
    from parity.harness import drive, feature_federation, paper_run, shifted_reference

    calls = []
    forward = torch.nn.BatchNorm1d.forward

    def spy(self, x):
        if self.training:
            calls.append(float(x.detach().abs().mean()))
        return forward(self, x)

    monkeypatch.setattr(torch.nn.BatchNorm1d, "forward", spy)
    steps, running = 3, {}
    for target_pass in (True, False):
        run = paper_run(paper, variant, train={"rounds": 1, "local": {"steps": steps}, "batch_size": 4},
                        params={"target_pass": target_pass})
        assert run["algorithm"]["params"]["lambda_da"] == 0
        fed = feature_federation()
        shifted_reference(fed, 12, torch.full((16,), 30.0))
        calls.clear()
        driven = drive(run, fed, tmp_path / str(target_pass))
        far = sum(c > 5.0 for c in calls)              # the FAM's first layer maps the far target far away
        source = steps * len(fed.clients)
        assert (len(calls), far) == ((2 * source, source) if target_pass else (source, 0)), (target_pass, calls)
        assert driven.method.reads_target(run["algorithm"]["params"]) is target_pass
        running[target_pass] = {k: v for k, v in driven.method.server.state_dict().items()
                                if "running_mean" in k and "discriminator" not in k}   # FAA-CLIP's D: unused without DA
    assert running[True] and all(not torch.allclose(running[True][k], running[False][k]) for k in running[True])


def test_full_batch_weights_count_the_samples_each_client_trains_on():
    from fedrepro.fl.method import ClientUpdate

    method = _method("facmic", weights="full_batches")                       # batch size 4
    updates = [ClientUpdate(f"c{i}", {}, n) for i, n in enumerate((3, 10, 13))]
    # FACMIC's code: len(drop_last loader) x B; a client below one batch trains on its partial batch
    assert method.aggregation_weights(updates) == [3.0, 8.0, 12.0]


def test_facmic_lmmd_moves_the_loss_and_the_paper_variant_runs():
    base = _method("facmic", params={"lambda_da": 0})
    with_da = _method("facmic")
    loss0 = _round(base)[0].stats["loss"]
    loss1 = _round(with_da)[0].stats["loss"]
    assert loss1 != pytest.approx(loss0)            # same seed and batches: the only difference is L_DA
    paper = _method("facmic", params={"lmmd": {"kernels": 1, "bandwidth": "median", "pseudo_labels": "hard",
                                               "classes": "all", "target_features": "masked"}})
    assert math.isfinite(_round(paper)[0].stats["loss"])


def test_faa_clip_communicates_the_fam_and_keeps_the_discriminator_local():
    method = _method("faa_clip")
    keys = method.shared_keys()
    assert keys and all(k.startswith("fam.") for k in keys)
    assert "fam.attention.1.running_mean" in keys                     # BN statistics are averaged (code)
    d_before = {k: v.clone() for k, v in method.server.discriminator.state_dict().items()}
    updates = _round(method)
    for name, value in method.server.discriminator.state_dict().items():
        assert torch.equal(value, d_before[name])                     # D never reaches the server
    private = method.private["client0"]
    assert not torch.equal(private["discriminator.net.0.weight"], d_before["net.0.weight"])   # but it trains locally
    key = "fam.attention.0.weight"
    assert torch.allclose(method.server.state_dict()[key], sum(u.payload[key] for u in updates) / 3, atol=1e-6)

    shared_d = _method("faa_clip", params={"share_discriminator": True}).shared_keys()
    assert any(k.startswith("discriminator.") for k in shared_d)
    local_bn = _method("faa_clip", params={"local_bn": True}).shared_keys()
    assert not any(k.startswith("fam.attention.1.") for k in local_bn) and "fam.attention.0.weight" in local_bn
    deeper = _method("faa_clip", model={"variant": "deeper"})
    assert sum(v.numel() for k, v in deeper.server.state_dict().items() if k in deeper.shared_keys()) > \
        sum(v.numel() for k, v in method.server.state_dict().items() if k in keys)


# --------------------------------------------------------------------------------------------
# CLIP tuned on images (tiny random-init CLIP)

@pytest.fixture(scope="module")
def tiny():
    from fedrepro.models.encoders import frozen_clip

    return frozen_clip(TINY)


def _family(family: str, model: dict | None = None, classes=("cat", "dog", "glioma_tumor")):
    cfg = validate({"family": family, "encoder": dict(TINY), **(model or {})}, model_schema(family), "model")
    return model_class(family)(cfg, list(classes), {})


def test_clip_full_class_prompts_equal_per_sample_prompts(tiny):
    clip, _, tokenizer = tiny
    family = _family("clip_full")
    model = family.build()
    x, y = torch.randn(4, 3, 64, 64), torch.tensor([2, 0, 2, 1])
    out = family.forward(model, {"x": x, "y": y})
    # independent: one prompt per sample, as the authors' code encodes them
    text = model.encode_text(tokenizer([f"a picture of a {family.class_names[i]}" for i in y])).float()
    image = model.encode_image(x).float()
    logits = model.logit_scale.exp() * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).t()
    expected = 0.5 * (F.cross_entropy(logits, torch.arange(4)) + F.cross_entropy(logits.t(), torch.arange(4)))
    assert family.loss(out, {"y": y}).item() == pytest.approx(expected.item(), rel=1e-5)
    assert out.logits.shape == (4, 3) and all(p.requires_grad for p in model.parameters())
    assert not any(p.requires_grad for p in clip.parameters())          # the cached pretrained model stays frozen


def test_clip_full_trains_with_the_learned_scale_and_predicts_with_eval_logit_scale(tiny):
    x = torch.randn(3, 3, 64, 64)
    trained = _family("clip_full")
    fixed = _family("clip_full", {"eval_logit_scale": 100})
    model = trained.build()
    with torch.no_grad():
        model.logit_scale.fill_(1.0)       # a learned temperature exp(1) != 100
        cos = F.normalize(model.encode_image(x).float(), dim=-1) @ F.normalize(trained.class_text(model), dim=-1).t()
        assert torch.allclose(trained.class_scores(model, {"x": x}), math.e * cos, atol=1e-5)
        # the authors' test code: softmax(100 cos), whatever temperature training learned
        assert torch.allclose(fixed.class_scores(model, {"x": x}), 100 * cos, atol=1e-4)
        assert torch.allclose(fixed.forward(model, {"x": x, "y": torch.tensor([0, 1, 2])}).logits, math.e * cos, atol=1e-5)


def test_lora_parameter_count_zero_init_and_communication(tiny):
    family = _family("clip_lora")
    model = family.build()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    # q, k, v of 2 image + 2 text blocks, width 64: each projection r * (64 + 64)
    assert sum(p.numel() for p in trainable.values()) == 2 * 2 * 3 * 3 * (64 + 64)
    assert all("lora_" in n for n in trainable)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(model.encode_image(x), tiny[0].encode_image(x), atol=1e-5)   # B = 0 at the start
    everything = _family("clip_lora", {"targets": ["q", "k", "v", "o", "fc", "proj"], "encoders": ["image"]}).build()
    per_block = 3 * 3 * 128 + 3 * 128 + 3 * (64 + 256) + 3 * (256 + 64)
    assert sum(p.numel() for p in everything.parameters() if p.requires_grad) == 2 * per_block

    method = _method("lora", family="clip_lora", model={"encoder": dict(TINY)})
    assert set(method.shared_keys()) == set(trainable)


def test_prompt_context_initialised_from_the_template_reproduces_the_fixed_prompt(tiny):
    clip, _, tokenizer = tiny
    family = _family("clip_prompt", {"init": "template"})
    model = family.build()
    assert model.ctx.shape == (4, 64)                                 # "a picture of a" = 4 tokens
    with torch.no_grad():
        fixed = clip.encode_text(tokenizer([f"a picture of a {c}" for c in family.class_names]))
        assert torch.allclose(model.encode_text(), fixed, atol=1e-5)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["ctx"]
    random_ctx = _family("clip_prompt", {"n_ctx": 6}).build()
    assert random_ctx.ctx.shape == (6, 64) and random_ctx.ctx.std() < 0.05
    out = family.forward(model, {"x": torch.randn(3, 3, 64, 64), "y": torch.tensor([0, 1, 2])})
    family.loss(out, {"y": None}).backward()
    assert model.ctx.grad is not None and model.ctx.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="n_ctx"):
        _family("clip_prompt", {"n_ctx": 40}).build()


# --------------------------------------------------------------------------------------------
# data: the BT2 transfer dataset; cached vs uncached FAM; the demo configs end to end

@pytest.fixture(scope="module")
def demo_data(tmp_path_factory, demo_raw):
    """A scratch project directory: the session's demo raw data and demo_domains' manifest."""
    from fedrepro import cli

    root = tmp_path_factory.mktemp("demo")
    (root / "resources").mkdir()
    (root / "resources/raw").symlink_to(demo_raw, target_is_directory=True)
    manifest = root / "resources/manifests/demo_domains.csv"
    cli.main(["prepare", "demo_domains", "--raw-dir", str(root / "resources/raw"), "--out", str(manifest), "--no-verify"])
    return root


def test_bt_bt2_adds_bt2_as_an_external_source_and_the_clean_variant_drops_its_copies_of_bt(tmp_path):
    """FACMIC's transfer dataset, from tiny folders in the two Kaggle layouts. BT2 (Nickparvar) = figshare +
    SARTAJ + Br35H, and SARTAJ is BT: ``bt_bt2`` (the paper protocol's) keeps all of BT2, ``bt_bt2_disjoint``
    (clean) leaves out BT2's images with the same pixels as a BT image, whatever their file name or format."""
    import shutil

    from PIL import Image

    from fedrepro.data.manifest import write_manifest
    from fedrepro.data.prepare import prepare_dataset
    from fedrepro.registry import dataset

    raw, manifests = tmp_path / "raw", tmp_path / "manifests"
    folders = {"bt": ("glioma_tumor", "no_tumor"), "bt2": ("glioma", "notumor", "pituitary")}
    rng = np.random.default_rng(0)
    for source, classes in folders.items():
        for split in ("Training", "Testing"):
            for name in classes:
                (raw / source / split / name).mkdir(parents=True)
                pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(raw / source / split / name / f"{split}-{name}.png")
    # BT2's copies of BT images under other names: one the same file, one re-saved in another format
    shutil.copy(raw / "bt/Training/glioma_tumor/Training-glioma_tumor.png", raw / "bt2/Training/glioma/Tr-gl_0001.png")
    Image.open(raw / "bt/Testing/no_tumor/Testing-no_tumor.png").save(raw / "bt2/Testing/notumor/Te-no_0001.bmp")
    for source in folders:
        write_manifest(manifests / f"{source}.csv", prepare_dataset(dataset(source), raw))
    frame = prepare_dataset(dataset("bt_bt2"), raw, manifests)
    assert len(frame) == 12 and frame["source"].value_counts().to_dict() == {"bt2": 8, "": 4}
    bt2 = frame[frame["source"] == "bt2"]
    assert set(bt2["class_name"]) == {"glioma_tumor", "no_tumor", "pituitary_tumor"}
    assert bt2["path"].str.startswith("bt2/").all() and set(bt2["split"]) == {"train", "test"}
    assert (frame["label"] == frame["class_name"].map(dataset("bt_bt2").classes.index)).all()
    disjoint = prepare_dataset(dataset("bt_bt2_disjoint"), raw, manifests)
    assert disjoint["source"].value_counts().to_dict() == {"bt2": 6, "": 4}
    assert set(frame["path"]) - set(disjoint["path"]) == {"bt2/Training/glioma/Tr-gl_0001.png",
                                                          "bt2/Testing/notumor/Te-no_0001.bmp"}


def test_clip_prompts_say_the_class_folder_names_the_authors_loaders_read():
    """FACMIC's and FAA-CLIP's ``utils/prepare_data_dg_clip.py::ImageTextData`` prompts with "a picture of a" + the
    ImageFolder class, i.e. the class folder name: for the Kaggle SC sets (FACMIC SC and Real, FAA-CLIP SC) the
    folder names ("actinic keratosis", ...), not our short labels; BT's (glioma_tumor, ..., as the authors'
    README lists them), OfficeHome's, Modern Office-31's and HyperKvasir's class names are their folder names."""
    from fedrepro.data.datasets.skin import SC9_FOLDERS
    from fedrepro.registry import dataset

    folders = {short: folder for folder, short in SC9_FOLDERS.items()}
    assert dataset("sc9").class_texts == tuple(folders[c] for c in dataset("sc9").classes)
    assert dataset("sc9").class_texts[0] == "actinic keratosis"
    for name in ("skin_real", "skin_real_overlap"):
        spec = dataset(name)
        assert spec.class_texts == ("actinic keratosis", "basal cell carcinoma", "dermatofibroma", "melanoma", "nevus",
                                    "pigmented benign keratosis", "vascular lesion"), name
    for name in ("bt", "bt_bt2", "bt_bt2_disjoint", "officehome", "modern_office31", "hyperkvasir"):
        assert dataset(name).class_texts == dataset(name).classes, name
    assert dataset("bt").class_texts == ("glioma_tumor", "meningioma_tumor", "no_tumor", "pituitary_tumor")


def test_training_job_prompts_with_the_class_texts_and_records_the_run_variant(tmp_path, monkeypatch):
    """The real jobs (features, train) on the tiny grid: the feature cache encodes the dataset's class texts,
    the run manifest records them (with their hash), the dataset and its options, the split and the precision,
    and a cache encoded with other texts is refused by name."""
    import dataclasses
    import hashlib

    from fedrepro.registry import DATASETS
    from fedrepro.train import InputMismatch, train_run
    from infra_support import build_tiny_inputs, with_rounds

    entry = DATASETS.get("demo_bt")

    def with_texts(words):
        spec = dataclasses.replace(entry.obj, class_text={c: f"{words} {c}" for c in entry.obj.classes})
        monkeypatch.setitem(DATASETS._entries, "demo_bt", dataclasses.replace(entry, obj=spec))
        return list(spec.class_texts)

    texts = with_texts("folder of")
    monkeypatch.chdir(tmp_path)
    run = with_rounds(build_tiny_inputs(tmp_path), 1)
    assert torch.load(run["paths"]["features"], weights_only=False)["class_names"] == texts
    train_run(run, "out", "ckpt")
    variant = json.loads((tmp_path / "out/run_manifest.json").read_text())["variant"]
    assert variant["class_texts"] == {"texts": texts, "sha256": hashlib.sha256(json.dumps(texts).encode()).hexdigest()}
    assert variant["dataset"] == {"name": "demo_bt", "options": entry.obj.options}
    assert variant["split"]["id"] == run["split_id"] and variant["split"]["spec"]["kind"] == "iid"
    assert variant["precision"] == "fp32" and variant["jpeg_draft"] is False      # the authors' numerics
    assert variant["numerics"] == "authors" and variant["pixels"] == "authors"
    with_texts("another folder of")
    with pytest.raises(InputMismatch, match=r"rebuild it: snakemake --cores all --force .*\.pt"):
        train_run(run, "out2", "ckpt2")


def test_paper_protocol_reads_the_authors_data_and_both_decode_as_the_numerics_say():
    """The paper protocol trains on the data the authors' loaders read: the skin set whose ISIC 2019 client
    keeps its HAM10000 and Kaggle SC images (FACMIC Real / FAA-CLIP SC: 19,766 ISIC images in Table 1 /
    Table I), BT2 with BT's SARTAJ images (FACMIC Table 5); clean de-duplicates. Both decode JPEGs in full
    under the authors' numerics (torchvision's ``datasets.ImageFolder`` + PIL, ``utils/prepare_data_dg_clip.py``)
    and with DCT scaling under the fast ones. The split, its file and the tables' split counts follow the
    protocol's dataset."""
    from fedrepro.config import load_project
    from fedrepro.paths import RunKey
    from fedrepro.report.item import ReportItem
    from parity.harness import ROOT, project

    proj = project()
    cases = {("facmic", "real", "facmic"): ("skin_real", "skin_real_overlap"),
             ("faa_clip", "sc", "faa_clip"): ("skin_real", "skin_real_overlap"),
             ("facmic", "bt_iid", "facmic"): ("bt_bt2_disjoint", "bt_bt2")}
    for (paper, setting, method), datasets in cases.items():
        for protocol, expected in zip(("clean", "paper"), datasets):
            run = proj.resolver.run_config(RunKey(paper, protocol, setting, method, 0))
            assert run["dataset"] == expected and run["paths"]["manifest"].endswith(f"/{expected}.csv")
            assert run["split_id"].startswith(f"{expected}-") and run["split_id"] in run["paths"]["split"]
            assert ReportItem(proj, protocol, paper, "tables", "table2").split_id(setting, 0) == run["split_id"]
            assert run["jpeg_draft"] is False and "-full-" in run["features"]["key"]
    fast = load_project([ROOT / "config/config.yaml"], {"numerics": "fast"}, root=ROOT)
    for project_, full in ((proj, True), (fast, False)):
        for protocol in ("clean", "paper"):
            key = project_.resolver.run_key("facmic", "real", "fedavg", 0, protocol)
            images = project_.resolver.run_config(key)["paths"]["images"]
            assert images and all(path.endswith("-full.u8") is full for path in images.values())
    assert proj.config["data"]["jpeg_draft"] == "auto"


def test_tables_with_centralized_name_its_budget_per_round_in_the_caption():
    """FACMIC Table 2 / 5: Centralized (the code's ``SkinCen``, one training client) takes one client's 199 steps
    per round on BT and SC, 1/3 of the federation's; the caption says so, from the run's own ``budget``."""
    from fedrepro.report.item import ReportItem
    from fedrepro.report.tables import method_notes
    from parity.harness import project

    proj = project()
    for table in ("table2", "table5"):
        assert method_notes(ReportItem(proj, "clean", "facmic", "tables", table)) == [
            "Centralized trains one client's local work per round on the pooled data: with a fixed number of local "
            "steps that is 1/K of the federation's gradient steps (K clients); with local epochs, one epoch over the "
            "pooled data."]
    assert method_notes(ReportItem(proj, "clean", "facmic", "tables", "table3")) == []


def test_cached_features_and_the_uncached_encoder_give_the_same_facmic_round(demo_data, tiny):
    from fedrepro.data.manifest import read_manifest
    from fedrepro.data.partition import make_split
    from fedrepro.features import encode_dataset
    from fedrepro.fl.federation import build_feature_federation, build_image_federation
    from fedrepro.registry import dataset
    from fedrepro.seeding import seed_global

    manifest = read_manifest(demo_data / "resources/manifests/demo_domains.csv")
    manifest = manifest[manifest["source"] == "edges"].iloc[::3].reset_index(drop=True)     # 50 images
    classes = list(dataset("demo_domains").classes)
    split = make_split(manifest, {"kind": "iid", "clients": 2, "global_test": {"fraction": 0.3},
                                  "reference_fraction": 0.5}, seed=0)
    seed_global(0, "init")                                   # what `fedrepro features` does before encoding
    cache = encode_dataset(manifest, demo_data / "resources/raw", classes, TINY, torch.device("cpu"), progress=False)
    feats = build_feature_federation(split, "clean", cache, classes)
    image_family = _family("clip_fam_images", classes=classes)
    images = build_image_federation(split, "clean", manifest, demo_data / "resources/raw", classes,
                                    image_family.train_transform(), image_family.eval_transform())
    batch = next(iter(torch.utils.data.DataLoader(images.clients[0].train, batch_size=8)))
    assert torch.allclose(image_family.image_features(batch), feats.clients[0].train.features[:8], atol=1e-5)
    assert torch.allclose(image_family.text, feats.extras["text_features"], atol=1e-5)

    for name, cached, uncached in (("facmic", "clip_fam", "clip_fam_images"), ("fedclip", "clip_adapter", "clip_adapter_images")):
        results = []
        for fed, family in ((feats, cached), (images, uncached)):
            method = _method(name, family=family, model={"encoder": dict(TINY)}, fed=fed, weights="train_size")
            updates = _round(method)
            results.append((updates[0].stats["loss"], method.server.state_dict()["attention.0.weight"]))
        assert results[0][0] == pytest.approx(results[1][0], rel=1e-4), name
        assert torch.allclose(results[0][1], results[1][1], atol=1e-5), name


def test_faa_clip_table2_times_every_method_on_its_image_path():
    # the paper's minutes per round include CLIP's forward on every batch; runs on cached features leave it out
    project = load_project([REPO / "config/config.yaml"], root=REPO)
    for key in project.plan.table_runs("faa_clip", "table2", "clean"):
        run = project.resolver.run_config(key)
        assert run["input"] == "images", (key, run["train"]["model"]["family"])
    families = {project.resolver.run_config(project.resolver.run_key("faa_clip", "sc", m, 0))["train"]["model"]["family"]
                for m in ("fedclip_images", "faa_clip_images")}
    assert families == {"clip_adapter_images", "clip_fam_images"}


def test_demo_configs_end_to_end(demo_data, monkeypatch):
    """The FACMIC demo (both protocols, external transfer set) and an FAA-CLIP demo run through the Python API."""
    from fedrepro import cli, paths
    from fedrepro.models import composite
    from fedrepro.models.weights import fetch as fetch_weights
    from fedrepro.train import train_run

    monkeypatch.chdir(demo_data)
    project = load_project([REPO / "config/demo.yaml"], {"papers": ["facmic", "faa_clip"]}, root=REPO)
    for spec in project.plan.weights().values():          # the composite CLIP's aligned projections, built offline
        fetch_weights(spec)
    keys = [project.resolver.run_key("facmic", "bt_iid", "facmic", 0), project.resolver.run_key("facmic", "bt_iid", "facmic", 0, "paper"),
            project.resolver.run_key("faa_clip", "oh_acp_r", "faa_clip", 0)]
    for key in keys:
        run = project.resolver.run_config(key)
        split = project.plan.splits()[run["split_id"]]
        if not Path(run["paths"]["split"]).exists():
            cli.main(["split", "--dataset", run["dataset"], "--manifest", run["paths"]["manifest"],
                      "--spec", json.dumps(split["spec"]), "--seed", str(split["seed"]), "--out", run["paths"]["split"]])
        if not Path(run["paths"]["features"]).exists():
            cli.main(["features", "--dataset", run["dataset"], "--manifest", run["paths"]["manifest"],
                      "--raw-dir", run["paths"]["raw_dir"], "--encoder", json.dumps(run["features"]["encoder"]),
                      "--device", "cpu", "--out", run["paths"]["features"]])
        out = Path(paths.run_dir(key))             # the demo's results folder (results/demo)
        summary = train_run(run, out, paths.checkpoint_dir(key))
        for name in ("metrics.json", "history.csv", "predictions.npz", "run_manifest.json"):
            assert (out / name).exists()
        assert json.loads((out / "metrics.json").read_text()) == json.loads(json.dumps(summary))
        evals = summary["eval"]
        assert {"global", "client0", "client1", "client2"} <= set(evals)
        for name, metrics in evals.items():
            assert 0.0 <= metrics["acc"] <= 1.0 and 0.0 <= metrics["bacc"] <= 1.0, name
        for metrics in (evals[k] for k in evals if not k.endswith("_mean")):
            assert 0.0 <= metrics["acc"] <= 1.0 and 0.0 <= metrics["bacc"] <= 1.0 and metrics["n"] > 0
        assert summary["rounds"] == run["train"]["rounds"] and summary["time"]["train_s_per_round"] > 0
        dim = composite.config(run["features"]["encoder"]["name"])["embed_dim"]
        fam = sum(p.numel() for p in FeatureAttention(dim).state_dict().values())       # BN buffers included
        assert summary["comm"]["params_per_client_round"] == 2 * fam
        probs = np.load(out / "predictions.npz")["selected:global/probs"]
        assert np.allclose(probs.sum(1), 1.0, atol=1e-5)

    clean, paper = (json.loads(Path(paths.run_file(k)).read_text()) for k in keys[:2])
    assert clean["run"]["protocol"] == "clean" and clean["selection"]["rule"] in ("best_val", "last")
    assert paper["run"]["protocol"] == "paper" and paper["selection"]["rule"] == "best_test"
    # what test data each read: clean none (and keeps no best-test selection), paper selects and adapts on it
    assert clean["test_data"] == {"protocol": "clean", "allow_test_selection": False, "selection_on_test": False,
                                  "target_is_test": False} and "best_test" not in clean["by_rule"]
    assert paper["test_data"]["selection_on_test"] and paper["test_data"]["target_is_test"]
    # clean tests on the global set minus the unlabeled reference half; paper on (and adapts to) all of it
    split = json.loads(Path(project.resolver.run_config(keys[0])["paths"]["split"]).read_text())
    assert clean["eval"]["global"]["n"] == len(split["global_test"])
    assert paper["eval"]["global"]["n"] == len(split["global_test"]) + len(split["reference"])
    assert clean["eval"]["external"]["n"] == 150 == paper["eval"]["external"]["n"]   # 15% of 'inverted' (1,000): BT2's stand-in


def test_bad_method_options_name_the_key_and_the_allowed_values(tmp_path):
    paper = (REPO / "config/demo/facmic.yaml").read_text()
    bad = paper.replace("params: {lambda_da: 0}", "params: {lambda_da: 0, lmmd: {bandwidth: mode}}")
    (tmp_path / "facmic.yaml").write_text(bad)
    with pytest.raises(ConfigError, match=r"methods/facmic_no_da/params.*bandwidth.*allowed values: \['mean', 'median'\]"):
        load_project([REPO / "config/demo.yaml"], {"papers": ["facmic"], "paper_dir": str(tmp_path)}, root=REPO)
    model = {"family": "clip_lora", "targets": ["qq"]}
    with pytest.raises(ConfigError, match="targets/0"):
        validate(model, model_schema("clip_lora"), "model")
