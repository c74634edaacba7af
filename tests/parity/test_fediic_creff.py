"""CReFF (FedIIC Table 1 baseline; the CReFF code's defaults), two rounds.

Specification: CReFF (Shang et al., IJCAI'22; shangxinyi/CReFF-FL ``main.py``) with FedIIC's shared
recipe (:mod:`tests.parity.spec_fediic`). The server holds m = 100 federated features per class F_c
and a re-trained linear classifier phi (at first: the model's classifier init). Each round:

1. client k, for every class c it holds, 10 times: its images of class c (at most 32, a random
   draw), un-augmented, passed through Differentiable Siamese Augmentation (one group of
   color / crop / cutout / flip / scale / rotate chosen from a seed s, its parameters drawn after
   seeding s + 1, s + 2, ...; the whole batch alike), features g(x) of the round's global model in
   eval mode, and the gradient of CE(phi(g(x)), c) w.r.t. phi's weight and bias; the mean of the
   10 draws is uploaded (``compute_gradient``);
2. the clients train as in FedAvg (cross-entropy) and the server averages the models (sizes);
3. the per-class gradients are averaged over the clients holding the class (uniformly), and the
   features take 100 SGD steps (lr 0.1) on sum_c D(grad_phi CE(phi(F_c), c), g^c), D = sum over
   rows (the bias one row) of 1 - cos (eps 1e-6 in the denominator) (``update_feature_syn``);
4. a fresh linear classifier is trained on (F, labels) for 300 epochs of SGD (lr 0.01, shuffled,
   the local batch size) (``feature_re_train``); it is the next round's phi and replaces the
   classifier of the evaluated global model; the next round starts from the FedAvg model.

Batches of 64 here (one local step per client; 7 re-training steps per epoch). The second round is
where the re-trained classifier and the matched features act.
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from fedrepro.seeding import derive_seed, numpy_rng

from .harness import (
    assert_close,
    floating,
    initial_method,
    seed_server,
    torch_generator_for,
)
from .spec_fedavg import check_global, fedavg_round
from .spec_fediic import ADAM, CLASSES, cross_entropy, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")

M, MATCH_STEPS, RETRAIN_EPOCHS, LR_F, LR_PHI, BATCH_REAL, REPEATS = 100, 100, 300, 0.1, 0.01, 32, 10


# ---- DSA, single mode, Siamese (CReFF's Dataset/param_aug.py with ParamDiffAug) -------------------

def seeded(seed):
    return torch.Generator().manual_seed(seed)


def dsa(x, seed):
    b, _, h, w = x.shape
    group = "color crop cutout flip scale rotate".split()[int(torch.randint(0, 6, (1,), generator=seeded(seed)))]
    first = lambda t: t[0]  # noqa: E731   (Siamese: the first image's draw for all)
    u = lambda k: first(torch.rand(b, generator=seeded(seed + k)))  # noqa: E731
    if group == "color":
        x = x + (u(1) - 0.5)
        mean = x.mean(1, keepdim=True)
        x = (x - mean) * (u(2) * 2.0) + mean
        mean = x.mean([1, 2, 3], keepdim=True)
        return (x - mean) * (u(3) + 0.5) + mean
    if group == "flip":
        return x.flip(3) if u(1) < 0.5 else x
    if group in ("scale", "rotate"):
        if group == "scale":
            sx, sy = [float(u(k) * (1.2 - 1 / 1.2) + 1 / 1.2) for k in (1, 2)]
            theta = [[sx, 0, 0], [0, sy, 0]]
        else:
            a = float((u(1) - 0.5) * 2 * 15 / 180 * math.pi)
            theta = [[math.cos(a), math.sin(-a), 0], [math.sin(a), math.cos(a), 0]]
        grid = F.affine_grid(torch.tensor(theta).expand(b, 2, 3), list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)
    ints = lambda k, lo, hi: int(first(torch.randint(lo, hi, [b, 1, 1], generator=seeded(seed + k))))  # noqa: E731
    if group == "crop":
        sx, sy = int(h * 0.125 + 0.5), int(w * 0.125 + 0.5)
        tx, ty = ints(1, -sx, sx + 1), ints(2, -sy, sy + 1)
        padded = F.pad(x, [1, 1, 1, 1])
        rows = (torch.arange(h) + tx + 1).clamp(0, h + 1)
        cols = (torch.arange(w) + ty + 1).clamp(0, w + 1)
        return padded[:, :, rows][:, :, :, cols]
    ch, cw = int(h * 0.5 + 0.5), int(w * 0.5 + 0.5)
    ox, oy = ints(1, 0, h + (1 - ch % 2)), ints(2, 0, w + (1 - cw % 2))
    mask = torch.ones(h, w)
    rows = (torch.arange(ch) + ox - ch // 2).clamp(0, h - 1)
    cols = (torch.arange(cw) + oy - cw // 2).clamp(0, w - 1)
    mask[rows[:, None], cols[None, :]] = 0
    return x * mask


# ---- the rest of CReFF ------------------------------------------------------------------------------

def phi_gradients(features, c, weight, bias, create_graph=False):
    loss = F.cross_entropy(F.linear(features, weight, bias), torch.full((len(features),), c))
    return torch.autograd.grad(loss, (weight, bias), create_graph=create_graph)


def client_gradients(run, client, model, phi, rnd):
    model = copy.deepcopy(model).eval()
    rng = numpy_rng(run["seed"], "sampling", "creff", rnd, client.index)
    labels = client.train.labels
    out = {}
    for c in sorted(set(labels.tolist())):
        members = [i for i in range(len(labels)) if labels[i] == c]
        draws = []
        for repeat in range(REPEATS):
            pick = rng.permutation(members)[:BATCH_REAL]
            x = torch.stack([client.train[int(i)]["x"] for i in pick])
            x = dsa(x, derive_seed(run["seed"], "augment", "creff-dsa", rnd, client.index, c, repeat) % 2**31)
            with torch.no_grad():
                feats = model(x)[1]
            w, b = phi.weight.detach().requires_grad_(True), phi.bias.detach().requires_grad_(True)
            draws.append(phi_gradients(feats, c, w, b))
        out[c] = [torch.stack([d[j] for d in draws]).mean(0) for j in range(2)]
    return out


def distance(synthetic, real):
    total = 0
    for gs, gr in zip(synthetic, real):
        gs, gr = gs.reshape(len(gs), -1) if gs.dim() > 1 else gs[None], gr.reshape(len(gr), -1) if gr.dim() > 1 else gr[None]
        total = total + (1 - (gs * gr).sum(-1) / (gs.norm(dim=-1) * gr.norm(dim=-1) + 1e-6)).sum()
    return total


def test_two_rounds_match_the_creff_code(tmp_path, monkeypatch):
    import fedrepro.methods.creff as creff

    monkeypatch.setattr(creff, "with_transform", lambda dataset, transform: dataset, raising=False)   # tensors
    run, fed, server, driven = drive_tiny("creff", tmp_path, rounds=2, batch_size=64)
    start = initial_method(run, fed)
    features = start.features.detach().clone().requires_grad_(True)
    labels = torch.arange(CLASSES).repeat_interleave(M)
    phi = copy.deepcopy(start.retrained)
    feature_opt = torch.optim.SGD([features], lr=LR_F)
    for rnd in range(2):
        grads = [client_gradients(run, c, server, phi, rnd) for c in fed.clients]
        server, _, _ = fedavg_round(run, fed, server, cross_entropy, rnd, ADAM)
        real = {c: [torch.stack([g[c][j] for g in grads if c in g]).mean(0) for j in range(2)]
                for c in range(CLASSES) if any(c in g for g in grads)}
        w, b = phi.weight.detach().requires_grad_(True), phi.bias.detach().requires_grad_(True)
        for _ in range(MATCH_STEPS):
            loss = sum(distance(phi_gradients(features[c * M:(c + 1) * M], c, w, b, create_graph=True), real[c])
                       for c in sorted(real))
            feature_opt.zero_grad()
            loss.backward()
            feature_opt.step()
        seed_server(run, rnd)
        phi = torch.nn.Linear(features.shape[1], CLASSES)
        opt = torch.optim.SGD(phi.parameters(), lr=LR_PHI)
        gen = torch_generator_for(run, "shuffle", "creff-retrain", rnd)
        for _ in range(RETRAIN_EPOCHS):
            order = torch.randperm(len(labels), generator=gen)
            for first in range(0, len(labels), run["train"]["batch_size"]):
                idx = order[first:first + run["train"]["batch_size"]]
                opt.zero_grad()
                F.cross_entropy(phi(features.detach()[idx]), labels[idx]).backward()
                opt.step()
    assert_close(driven.method.features, features, "federated features")
    evaluated = copy.deepcopy(server)
    evaluated.head.load_state_dict(phi.state_dict())
    assert_close(floating(driven.method.server.state_dict()), floating(server.state_dict()), "FedAvg model")
    check_global(driven, fed, evaluated, logits, what="FedAvg model + re-trained classifier", held=driven.method.eval_model)
