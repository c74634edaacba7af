"""Shared set-up of the parity tests of FedIIC's grid (config/papers/fediic.yaml): the setting's
model (proj_classifier: a timm backbone g, dropout and a linear classifier f on g's pooled
features, and a projector h fed with the features before dropout), shrunk to timm
``test_efficientnet`` at 48 px with a small projector, and the training recipe every method of
Table 1 shares: a fresh Adam (lr 3e-4, betas (0.9, 0.999), weight decay 5e-4) per client and round,
one local epoch, batches of 4, FedAvg weighted by client size. Three long-tailed clients over four
classes; client 0 holds no image of class 3 (FedRS, FedLC and DALA treat absent classes apart).
Methods with two views per image (FedIIC) see the image and its horizontal flip.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .harness import (
    configured_model,
    drive,
    image_federation,
    initial_server,
    paper_run,
    without_class,
)

ADAM = {"name": "adam", "lr": 3.0e-4, "betas": (0.9, 0.999), "weight_decay": 5.0e-4}
SIZE, CLASSES = 48, 4


def two_views(x: torch.Tensor) -> torch.Tensor:
    """The training transform of the two-view methods here: the image and its mirror image."""
    return torch.stack([x, x.flip(-1)])


def federation(views: int = 1):
    fed = image_federation(size=SIZE, classes=CLASSES, sizes=(10, 12, 14), val=4, test=2, global_test=8, skew=0.7)
    fed.clients[0].train = without_class(fed.clients[0].train, CLASSES - 1)
    if views == 2:
        for client in fed.clients:
            client.train.transform = two_views
    return fed


def drive_tiny(method: str, tmp_path, rounds: int, setting: str = "isic", batch_size: int = 4, **model):
    """A run of FedIIC's grid, shrunk, driven through the engine -> (run, federation, initial server, driven)."""
    cfg = configured_model("fediic", method, setting, backbone="test_efficientnet", image_size=SIZE,
                           projector={"hidden": 32, "out": 16}, **model)
    run = paper_run("fediic", method, setting, train={"rounds": rounds, "batch_size": batch_size, "num_workers": 0},
                    model=cfg)
    fed = federation(run["train"]["model"]["views"])
    start = initial_server(run, fed)
    return run, fed, start, drive(run, fed, tmp_path)


def logits(model, x):
    """Class scores f(dropout(g(x)))."""
    return model(x)[0]


def cross_entropy(model, batch, client=None, global_model=None):
    return F.cross_entropy(logits(model, batch["x"]), batch["y"])


# ---- FedIIC itself (wnn2000/FedIIC: train_FedIIC.py, utils/local_training.py::train_FedIIC, utils/losses.py) ----

K1 = K2 = 2.0
Q, T, INTER_TAU, ORTH_STEPS, ORTH_LR = 0.25, 0.5, 0.1, 1000, 0.1


@torch.no_grad()
def class_loss(server, fed) -> torch.Tensor:
    """l(y) = sum_k (sum of the CE of the global model on client k's view-1 images of class y) /
    (1e-5 + sum_k n_k(y)), the model in eval mode (``compute_loss_of_classes``)."""
    server.eval()
    per_client = []
    for client in fed.clients:
        x = torch.stack([client.train[i]["x"][0] for i in range(len(client.train))])
        y = torch.as_tensor(client.train.labels)
        ce = F.cross_entropy(logits(server, x), y, reduction="none")
        per_client.append((torch.stack([ce[y == c].sum() for c in range(CLASSES)]), torch.bincount(y, minlength=CLASSES)))
    total = 1e-5 + sum(n for _, n in per_client).float()
    return torch.stack([s / total for s, _ in per_client]).sum(0)        # loss_matrix / (1e-5 + num), summed


def prototypes(server, orthogonalize: bool) -> torch.Tensor:
    """V = rows of h_g(W_fc), pushed apart by 1000 SGD steps (lr 0.1) on sum_i max_j (cos * (1 - I))_ij,
    then L2-normalised (the main loop and ``train_FedIIC``)."""
    with torch.no_grad():
        v = server.projector(server.head.weight).detach().clone()
    if orthogonalize:
        v.requires_grad_(True)
        opt = torch.optim.SGD([v], lr=ORTH_LR)
        mask = 1 - torch.eye(len(v))
        for _ in range(ORTH_STEPS):
            unit = F.normalize(v, dim=1)
            loss = ((unit @ unit.t()) * mask).max(1)[0].sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return F.normalize(v.detach(), dim=1)


def fediic_loss(model, batch, prior, margin, protos, k1, k2, t):
    """DALA on view 1 + k1 intra-client SCL + k2 inter-client prototype contrast, both views."""
    x, y = batch["x"], batch["y"]
    b = len(y)
    flat = torch.cat([x[:, 0], x[:, 1]])                 # [all first views; all second views]
    scores, features = model(flat)
    loss = F.cross_entropy(scores[:b] + margin, y)
    if k1 == 0 and k2 == 0:
        return loss
    z = F.normalize(model.projector(features), dim=1)
    labels = y.repeat(2)
    if k1:
        p = prior[labels]
        temp = torch.clamp((p[:, None] * p[None, :]) ** t, min=0.07)
        sim = z @ z.t() / temp
        off = 1 - torch.eye(2 * b)
        sim = sim - sim.max(1, keepdim=True)[0].detach()
        log_prob = sim - torch.log((sim.exp() * off).sum(1, keepdim=True))
        pos = (labels[:, None] == labels[None, :]).float() * off
        loss = loss + k1 * (-(pos * log_prob).sum(1) / pos.sum(1)).mean()
    if k2:
        loss = loss + k2 * F.cross_entropy(z @ protos.t() / INTER_TAU, labels)
    return loss


def fediic_rounds(run, fed, server, rounds, *, k1=K1, k2=K2, q=Q, t=T, orthogonalize=True):
    """-> the global model after ``rounds`` rounds of FedIIC (all clients every round, size-weighted FedAvg)."""
    from .spec_fedavg import fedavg_round

    for rnd in range(rounds):
        protos = prototypes(server, orthogonalize)
        lbar = class_loss(server, fed)

        def loss(model, batch, client, global_model):
            counts = torch.bincount(torch.as_tensor(client.train.labels), minlength=CLASSES).float()
            prior = counts / counts.sum()
            margin = torch.log(prior / (lbar ** q + 1e-5))      # -inf for a class the client lacks
            return fediic_loss(model, batch, prior, margin, protos, k1, k2, t)

        server, _, _ = fedavg_round(run, fed, server, loss, rnd, ADAM)
    return server
