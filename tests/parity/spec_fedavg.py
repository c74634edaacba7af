"""FedAvg (McMahan et al., AISTATS'17), the round every model-averaging baseline builds on, written
from the paper for the parity tests: every client copies the global model w_g, minimises its local
loss with a fresh optimiser over its local batches (training mode), and the server replaces w_g by

    w_g <- sum_k n_k w_k / sum_k n_k      (n_k = the client's training-set size; or uniform weights)

over every floating-point entry of the state (weights and BatchNorm statistics). A baseline is
FedAvg with another local loss (FedProx, FedRS, FedLC, FedFocal, ...): ``loss(model, batch, client,
global_model)``.
"""

from __future__ import annotations

import copy

from .harness import (
    assert_close,
    client_batches,
    floating,
    mean_state,
    probabilities,
    seed_client,
    sgd_steps,
    train_sizes,
)


def local_models(run, fed, server, loss, rnd: int, opt: dict, start=None):
    """Every client's model after its local work of round ``rnd`` -> (models, local steps).
    ``start(client)`` gives a client's starting model (default: a copy of the server)."""
    models, steps = [], []
    for client in fed.clients:
        model = copy.deepcopy(server) if start is None else start(client)
        frozen = copy.deepcopy(server).eval().requires_grad_(False)
        seed_client(run, rnd, client)
        steps.append(sgd_steps(model, client_batches(run, client, rnd),
                               lambda m, b, c=client: loss(m, b, c, frozen), opt))
        models.append(model)
    return models, steps


def averaged(server, states: list[dict], weights):
    """A copy of ``server`` holding sum_k w_k state_k / sum_k w_k (floating-point entries)."""
    new = copy.deepcopy(server)
    new.load_state_dict({k: v.float() for k, v in mean_state(states, weights).items()}, strict=False)
    return new


def fedavg_round(run, fed, server, loss, rnd: int, opt: dict, weights: str = "train_size"):
    """-> (the new global model, the clients' models after local training, their local steps)."""
    models, steps = local_models(run, fed, server, loss, rnd, opt)
    sizes = train_sizes(fed) if weights == "train_size" else [1.0] * len(fed.clients)
    return averaged(server, [m.state_dict() for m in models], sizes), models, steps


def check_global(driven, fed, server, scores, what="global", held=None) -> None:
    """The server's floating-point state (or ``held``'s, the model the method evaluates) and its
    probabilities on the global test set."""
    held = driven.method.server if held is None else held
    assert_close(floating(held.state_dict()), floating(server.state_dict()), f"{what} model")
    model = server.eval()
    assert_close(driven.probs("global"), probabilities(lambda x: scores(model, x), fed.global_test), f"{what} probs")
    if not driven.method.personalized:         # every client's validation part, with the same model
        for client in fed.clients:
            assert_close(driven.probs(f"{client.name}.val"), probabilities(lambda x: scores(model, x), client.val),
                         f"{client.name}.val probs")


def check_local_models(driven, fed, models, scores) -> None:
    """``client_eval: local``: client k answers with its model after its last local update."""
    for client, local in zip(fed.clients, models):
        local.eval()
        assert_close(floating(driven.method.model_for(client).state_dict()), floating(local.state_dict()), client.name)
        for key, data in ((f"{client.name}@global", fed.global_test), (f"{client.name}.val", client.val)):
            assert_close(driven.probs(key), probabilities(lambda x: scores(local, x), data), key)
