"""FedX on FedDRA's image-text model (Tables 2 and 4; under each backbone objective), one round.

Specification (FedX, Han et al., ECCV 2022; code Sungwon-Han/FEDX ``main.py`` train_net_fedx,
``losses.py``): each step takes two views x1, x2 of the batch and xr, a view of a batch from a
second loader over the client's data shuffled on its own stream (the views and the stream are
plumbing shared with the project), and runs the image tower on [x1; x2; xr] at once: z (FedX's
projection), p = predictor(z) with FedX's prediction MLP (Linear(d, d) - ReLU - Linear(d, d));
the frozen global model, in evaluation mode, gives g on the same images. With FedX's
nt_xent(a, b, t) = mean over the 2B rows of -log(exp(a_i·b_i/t) / Σ_{j≠i} exp(s_ij/t)) on
normalised [a; b], and js(a, b, anchors, t, t2) = ½ [KL(m ‖ softmax(a·A/t)) + KL(m ‖
softmax(b·A/t))] with m = ½ [softmax(a·A/t2) + softmax(b·A/t2)] (cosines to the normalised
anchors A, KL 'batchmean', gradients through m and through A):

    loss = nt_xent(z1, z2) + nt_xent(p1, g2) + js(p1, p2, g_r, t, tt) + js(z1, z2, z_r, t, ts)

(t = tt = ts = 0.1, FedX's defaults), added to the backbone objective. FedAvg aggregation (uniform).
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedrepro.data.loader import batches
from fedrepro.methods._common.selfsup import augment, two_views
from fedrepro.seeding import torch_generator

from .harness import assert_close
from .vlp_harness import drive_tiny, float64, float_state, mean_states, vlp_run  # noqa: F401
from .vlp_spec import Objective, check_retrieval, image_embedding, loaded, train_client

pytestmark = pytest.mark.usefixtures("one_thread", "float64")


def nt_xent(x1, x2, t):
    x1, x2 = F.normalize(x1, dim=1), F.normalize(x2, dim=1)
    out = torch.cat([x1, x2])
    sim = torch.exp(out @ out.t() / t)
    sim = sim.masked_select(~torch.eye(len(out), dtype=torch.bool)).view(len(out), -1)
    pos = torch.exp((x1 * x2).sum(dim=-1) / t).repeat(2)
    return (-torch.log(pos / sim.sum(dim=-1))).mean()


def js(x1, x2, anchors, t, t2):
    a = F.normalize(anchors, dim=1)
    s1, s2 = F.normalize(x1, dim=1) @ a.t(), F.normalize(x2, dim=1) @ a.t()
    target = 0.5 * (F.softmax(s1 / t2, dim=1) + F.softmax(s2 / t2, dim=1))
    kl = lambda s: (target * (torch.log(target) - F.log_softmax(s / t, dim=1))).sum() / len(s)  # noqa: E731
    return 0.5 * (kl(s1) + kl(s2))


def random_loader(run, client, rnd):
    p = 0
    while True:
        yield from batches(client.train, run["train"]["batch_size"], shuffle=True, drop_last=True,
                           generator=torch_generator(run["seed"], "fedx-random", rnd, client.index, p))
        p += 1


@pytest.mark.parametrize("objective", ["convirt", "gloria", "mgca"])
def test_fedx_round_matches_the_specification(objective, tmp_path):
    run = vlp_run("feddra", "fedx_gloria", objective, train={"rounds": 1, "local": {"steps": 2}, "batch_size": 4})
    params = run["algorithm"]["params"]
    t, ts, tt = params["temperature"], params["student_temperature"], params["teacher_temperature"]
    assert (t, ts, tt, params["weight"]) == (0.1, 0.1, 0.1, 1.0) and run["train"]["local"]["drop_last"]
    fed, start, driven = drive_tiny(run, tmp_path)
    head = start.predictor
    d = run["train"]["model"]["head"]["dim"]
    assert [type(m) for m in head] == [nn.Linear, nn.ReLU, nn.Linear] and head[0].out_features == head[2].in_features == d
    spec = Objective(driven.method.family)
    glob = copy.deepcopy(start).eval()
    states = []
    for client in fed.clients:
        randoms = random_loader(run, client, 0)

        def step_loss(m, batch, randoms=randoms):
            loss, _ = spec.loss(m, batch)
            v1, v2 = two_views(batch["x"])
            x = torch.cat([v1, v2, augment(next(randoms)["x"])])
            n = len(v1)
            z = image_embedding(m, x)
            p = m.predictor(z)
            with torch.no_grad():
                g = image_embedding(glob, x)
            z1, z2, zr = z[:n], z[n:2 * n], z[2 * n:]
            p1, p2 = p[:n], p[n:2 * n]
            fedx = nt_xent(z1, z2, t) + nt_xent(p1, g[n:2 * n], t) + js(p1, p2, g[2 * n:], t, tt) + js(z1, z2, zr, t, ts)
            return loss + params["weight"] * fedx

        model = copy.deepcopy(start)
        train_client(run, client, 0, model, step_loss)
        states.append(float_state(model))
    expected = mean_states(states)
    assert_close(driven.method.server.state_dict(), expected, "server after one round")
    check_retrieval(driven, loaded(start, expected), fed, run)
