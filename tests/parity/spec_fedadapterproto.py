"""The FedAdapterProto algorithm as the authors' code runs it (berenslab/FedAdapterProto,
``exps/federated_main.py::FedProtoAdap_heter`` and ``lib/update.py::LocalUpdate``), written from
their description, for the parity tests of FedAdapterProto and of the baselines that are the same
algorithm on another model (FedAdapter with and without its proximal term, FedPrototypical) and of
the paper-text variant.

Client k holds a whole model of its own, built separately (``ResNet(args)`` once per client): a
ResNet whose max-pool is skipped, an adapter after each stage (adapters.*) and a head (head.*: the
prototype layer, or a linear layer on the pooled features). Every round it trains its model with a
fresh Adam (lr 1e-4, weight decay 5e-4, all parameters) for one class-balanced epoch on

    CE(logits, y)
    + 0.8 Clst - 0.08 Sep + 1e-4 || W_last * (1 - I^T) ||_1                     (prototype head only)
    + 1e-5 sum_{adapter tensors p} ||p||_2                                       (adapters only)
    + (0.01 / 2) sum_{adapter and head tensors p} || p - p_g ||^2                (from the second round on)

    Clst = mean_b [max_dist - max_j (max_dist - d_bj) [j is a prototype of y_b]]
    Sep  = mean_b [max_dist - max_j (max_dist - d_bj) [j is a prototype of another class]]
    max_dist = prototype channels x k x k,   d_bj = min over positions of || z - p_j ||^2,

where prototype j belongs to class j // (prototypes per class) and p_g is the server's aggregate.
The server averages the adapters with weights tau_k n_k (local steps x size of the client's site
list, train and validation together) and the head uniformly. The aggregate is never loaded into a
client: each client continues from its own model; the aggregate anchors only the proximal term.
After the last round every client is evaluated with its own model, without any prototype push.

Paper text (``paper_text=True``): every round the clients load the aggregate (the server's initial
adapters and head in the first round), the backbone is frozen, the adapter penalty is
1e-5 ||alpha||_2^2, and both parts are averaged with weights n_k; after the last round a client
holds the aggregate.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .harness import (
    assert_close,
    built_model,
    client_batches,
    configured_model,
    drive,
    floating,
    image_federation,
    initial_server,
    mean_state,
    paper_run,
    probabilities,
    seed_client,
    sgd_steps,
)

ADAPTERS, HEAD = "adapters.", "head."
ADAM = {"name": "adam", "lr": 1.0e-4, "weight_decay": 5.0e-4}
LAMBDA_CLST, LAMBDA_SEP, GAMMA_L1, BETA, MU = 0.8, 0.08, 1.0e-4, 1.0e-5, 0.01


def prototype_loss(model, out, y, per_class: int) -> torch.Tensor:
    protos = model.head.prototypes
    m, channels, kh, kw = protos.shape
    max_dist = channels * kh * kw
    own = (torch.arange(m)[None, :] // per_class == y[:, None]).float()          # B x m
    d = out["min_distances"]
    cluster = (max_dist - ((max_dist - d) * own).max(dim=1).values).mean()
    separation = (max_dist - ((max_dist - d) * (1 - own)).max(dim=1).values).mean()
    identity_t = (torch.arange(m)[None, :] // per_class == torch.arange(model.head.last_layer.weight.shape[0])[:, None])
    l1 = (model.head.last_layer.weight * (1 - identity_t.float())).abs().sum()
    return LAMBDA_CLST * cluster - LAMBDA_SEP * separation + GAMMA_L1 * l1


def local_loss(model, batch, anchor, per_class, mu, squared_norm):
    x, y = batch["x"], batch["y"]
    out = model(x)
    loss = F.cross_entropy(out["logits"], y)
    if "min_distances" in out:
        loss = loss + prototype_loss(model, out, y, per_class)
    if model.adapters is not None:
        norms = [(p ** 2).sum() if squared_norm else p.norm(p=2) for p in model.adapters.parameters()]
        loss = loss + BETA * sum(norms)
    if anchor:
        named = dict(model.named_parameters())
        loss = loss + (mu / 2) * sum(((named[k] - v) ** 2).sum() for k, v in anchor.items())
    return loss


def client_share(client) -> int:
    return len(client.train) + len(client.val) + len(client.test)


def reference_rounds(run, fed, server, rounds: int, *, mu: float = MU, paper_text: bool = False):
    """-> (server state, {client: its model after the last round}) after ``rounds`` rounds."""
    per_class = run["train"]["model"]["prototypes_per_class"]
    shared = [k for k in server.state_dict() if k.startswith((ADAPTERS, HEAD))]
    models = {c.name: built_model(run, fed, c.index) for c in fed.clients}
    if paper_text:
        for model in models.values():
            model.backbone.requires_grad_(False)
    server = copy.deepcopy(server)
    for rnd in range(rounds):
        glob = {k: v.clone() for k, v in server.state_dict().items() if k in shared}
        states, steps = [], []
        for client in fed.clients:
            model = models[client.name]
            if paper_text:
                model.load_state_dict(glob, strict=False)
            trainable = {k for k, p in model.named_parameters() if p.requires_grad}
            anchor = {k: v for k, v in glob.items() if k in trainable} if rnd >= 1 else {}
            seed_client(run, rnd, client)
            steps.append(sgd_steps(model, client_batches(run, client, rnd),
                                   lambda m, b: local_loss(m, b, anchor, per_class, mu, paper_text), ADAM))
            states.append(floating(model.state_dict(), shared))
        shares = [client_share(c) for c in fed.clients]
        adapter_w = shares if paper_text else [t * n for t, n in zip(steps, shares)]
        head_w = shares if paper_text else [1.0] * len(shares)
        new = {**mean_state(states, adapter_w, [k for k in shared if k.startswith(ADAPTERS)]),
               **mean_state(states, head_w, [k for k in shared if k.startswith(HEAD)])}
        server.load_state_dict({k: v.float() for k, v in new.items()}, strict=False)
    if paper_text:
        final = {k: v.clone() for k, v in server.state_dict().items() if k in shared}
        for model in models.values():
            model.load_state_dict(final, strict=False)
    return server.state_dict(), models


def check(driven, fed, server, models) -> None:
    """Server adapters/head, every client's model and its probabilities on the global test set and on
    its own test and validation parts."""
    shared = [k for k in server if k.startswith((ADAPTERS, HEAD))]
    assert_close(floating(driven.method.server.state_dict(), shared), floating(server, shared), "server")
    for client in fed.clients:
        model = models[client.name].eval()
        held = driven.method.model_for(client).state_dict()
        assert_close(floating(held), floating(model.state_dict()), f"{client.name} model")
        scores = lambda x, m=model: m(x)["logits"]  # noqa: E731
        for key, data in ((f"{client.name}@global", fed.global_test), (client.name, client.test),
                          (f"{client.name}.val", client.val)):
            assert_close(driven.probs(key), probabilities(scores, data), key)


def tensors_as_they_are(monkeypatch) -> None:
    """The push reads the training images through the family's eval transform (PIL -> tensor); the
    in-memory images of the parity federations are already network inputs."""
    import fedrepro.methods.fedadapterproto as module

    monkeypatch.setattr(module, "with_transform", lambda dataset, transform: dataset)


def drive_tiny(method: str, tmp_path, rounds: int, batch_size: int = 8):
    """A run of FedAdapterProto's grid on test_resnet at 32 px, driven through the engine, on three
    clients of 8, 10 and 12 long-tailed binary images -> (run, federation, initial server, driven)."""
    model = configured_model("fedadapterproto", method, backbone="test_resnet", image_size=32)
    run = paper_run("fedadapterproto", method, train={"rounds": rounds, "batch_size": batch_size, "num_workers": 0},
                    model=model)
    fed = image_federation(size=32, classes=2, sizes=(8, 10, 12), val=2, test=4, global_test=6, skew=0.8)
    start = initial_server(run, fed)
    return run, fed, start, drive(run, fed, tmp_path)


def verify(method: str, tmp_path, monkeypatch, **spec):
    """Two rounds of ``method`` through the engine against :func:`reference_rounds` (``spec``: its options)."""
    tensors_as_they_are(monkeypatch)
    run, fed, start, driven = drive_tiny(method, tmp_path, rounds=2)
    server, models = reference_rounds(run, fed, start, rounds=2, **spec)
    check(driven, fed, server, models)
    return run, driven


def logits(model, x):
    """The class scores of the grid's networks (dict outputs)."""
    return model(x)["logits"]


def cross_entropy(model, batch, client=None, global_model=None):
    """The baselines' local loss (FedAvg, FedNova): plain cross-entropy."""
    return F.cross_entropy(logits(model, batch["x"]), batch["y"])
