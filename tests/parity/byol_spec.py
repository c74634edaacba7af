"""Specification of BYOL as FedU's and FedEMA's code runs it (EasyFL ``applications/fedssl``:
``model.py`` BYOLModel, ``client.py`` FedSSLClient), on FedDRA's image tower, shared by the FedU and
FedEMA parity tests.

Per step: two views v1, v2 of the batch (the augmentation is plumbing shared with the project);
online z = u(v) of the image tower (encoder + alignment block + head), q = predictor(z); target
t = u_target(v) without gradient, in training mode; loss = mean over the batch of
[2 - 2 cos(q(z1), t(v2))] + [2 - 2 cos(q(z2), t(v1))] (the two directions summed), added to the
backbone objective with weight ``byol_weight``. After every optimiser step the target's image
tower moves to 0.99 target + 0.01 online. A client's target: in its first round the online tower
itself (the code hands the same module to both, so the EMA does nothing); afterwards the target it
ended its previous round with. Divergence of a client's round: the mean over the image encoder's
layers (its weight matrices, as the code counts a ResNet's convolution weights) of the L2 distance
between the weights at the start and at the end of its local training.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from fedrepro.methods._common.selfsup import two_views

from .vlp_harness import float_state, mean_states
from .vlp_spec import image_embedding, loaded, train_client

TOWER = ("image_encoder.", "image_align.", "image_head.")


def byol(prediction, target):
    return (2 - 2 * F.cosine_similarity(prediction, target.detach(), dim=-1)).mean()


def encoder_layers(model) -> list[str]:
    return [n for n, p in model.named_parameters() if n.startswith("image_encoder.") and n.endswith("weight") and p.dim() >= 2]


def divergence(before: dict, after: dict, layers) -> float:
    return sum(float((after[k] - before[k]).norm()) for k in layers) / len(layers)


def byol_client_round(run, client, rnd, model, objective, target_state):
    """Train ``model`` one round; -> (the client's new target state, its divergence)."""
    params = run["algorithm"]["params"]
    layers = encoder_layers(model)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    target = None
    if target_state is not None:
        target = copy.deepcopy(model).train()
        target.load_state_dict({**target.state_dict(), **target_state})

    def step_loss(m, batch):
        loss, _ = objective.loss(m, batch)
        v1, v2 = two_views(batch["x"])
        z1, z2 = image_embedding(m, v1), image_embedding(m, v2)
        with torch.no_grad():
            source = m if target is None else target
            t1, t2 = image_embedding(source, v1), image_embedding(source, v2)
        return loss + params["byol_weight"] * (byol(m.predictor(z1), t2) + byol(m.predictor(z2), t1))

    def ema(m):
        if target is None:
            return
        online = dict(m.named_parameters())
        with torch.no_grad():
            for name, p in target.named_parameters():
                if name.startswith(TOWER):
                    p.copy_(params["target_momentum"] * p + (1 - params["target_momentum"]) * online[name])

    train_client(run, client, rnd, model, step_loss, after_step=ema)
    source = model if target is None else target
    new_target = {k: v.detach().clone() for k, v in source.state_dict().items() if k.startswith(TOWER)}
    return new_target, divergence(start, model.state_dict(), layers)


def byol_rounds(run, fed, start, objective, rounds, receive):
    """``rounds`` of BYOL clients and uniform averaging. A client that trained before first adjusts
    the global model it receives with ``receive(client_name, model, (target, state, divergence))``
    (its own last target, model state and divergence): FedU's or FedEMA's rule."""
    server, own = copy.deepcopy(start), {}
    for rnd in range(rounds):
        states = []
        for client in fed.clients:
            model = copy.deepcopy(server)
            last = own.get(client.name)
            if last is not None:
                receive(client.name, model, last)
            target, div = byol_client_round(run, client, rnd, model, objective, None if last is None else last[0])
            own[client.name] = (target, {k: v.detach().clone() for k, v in model.state_dict().items()}, div)
            states.append(float_state(model))
        server = loaded(start, mean_states(states))
    return server
