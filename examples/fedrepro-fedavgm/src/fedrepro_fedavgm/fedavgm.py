"""FedAvgM: federated averaging with server momentum.

Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated Visual Classification"
(arXiv:1909.06335, 2019), Section 3 ("FedAvgM"). Clients train exactly as in FedAvg (McMahan et al. 2017); the
server treats the change the clients make to the global model as a gradient and accumulates it with momentum:

    Δ_t     = w_t − Σ_k (n_k / n) w_t^k        the pseudo-gradient: global model minus the clients' weighted average
    v_t     = β v_{t−1} + Δ_t,  v_{−1} = 0     the server's momentum buffer (``momentum`` = β)
    w_{t+1} = w_t − η v_t                       the server step (``server_lr`` = η; the paper's update has η = 1)

With β = 0 and η = 1 this is FedAvg. The paper varies β in [0, 0.997] and finds momentum helps most when the clients'
label distributions differ strongly (small Dirichlet α), reading the result through the effective learning rate
η / (1 − β). The same update, with the server learning rate as a parameter, is Flower's ``FedAvgM`` strategy
(adap/flower, ``flwr/server/strategy/fedavgm.py``, ``FedAvgM.aggregate_fit``), against which the formula was read.

Momentum applies to the model's trainable parameters. Buffers (BatchNorm running statistics, step counters) take
the plain weighted average, as in FedAvg: a momentum step on a running variance could turn it negative. The
aggregation weights n_k are fedrepro's (``train.aggregation.weights``), so a row of FedAvgM runs with the same
weights as the FedAvg row beside it.
"""

from __future__ import annotations

import torch

from fedrepro.fl.method import ModelAveraging
from fedrepro.registry import register_method

PARAMS = {
    "momentum": {"type": "number", "minimum": 0, "exclusiveMaximum": 1, "default": 0.9,
                 "description": "β, the server momentum (Hsu et al.: 0.9 and above under strong non-IID data)"},
    "server_lr": {"type": "number", "exclusiveMinimum": 0, "default": 1.0,
                  "description": "η, the server learning rate (1 = the paper's update)"},
}


def server_step(global_state: dict, averaged: dict, velocity: dict, keys, momentum: float, lr: float) -> dict:
    """One FedAvgM server step on the tensors ``keys``: -> the new global tensors; ``velocity`` is updated in place."""
    out = {}
    for key in keys:
        delta = global_state[key] - averaged[key]
        velocity[key] = momentum * velocity[key] + delta if key in velocity else delta
        out[key] = global_state[key] - lr * velocity[key]
    return out


@register_method("fedavgm", params=PARAMS)
class FedAvgM(ModelAveraging):
    """FedAvg's clients; a server that steps along the momentum of the clients' average change."""

    def setup(self) -> None:
        super().setup()
        self.velocity: dict[str, torch.Tensor] = {}       # parameter name -> v (on the device)

    def momentum_keys(self) -> list[str]:
        shared = set(self.shared)
        return [name for name, p in self.server.named_parameters() if p.requires_grad and name in shared]

    def aggregate(self, updates, rnd: int) -> None:
        keys = self.momentum_keys()
        before = {k: v.detach().clone() for k, v in self.server.state_dict().items() if k in set(keys)}
        super().aggregate(updates, rnd)                   # the weighted average (buffers keep it)
        averaged = self.server.state_dict()
        stepped = server_step(before, averaged, self.velocity, keys, self.params["momentum"], self.params["server_lr"])
        self.server.load_state_dict(stepped, strict=False)
        self.compute.round_weights(self.server)           # fp16_weights: the new model is copied into fp16 weights

    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        layout["device_models"] += 1                      # the momentum buffer: one more copy of the parameters
        return layout

    def state_dict(self) -> dict:
        return {**super().state_dict(), "velocity": {k: v.detach().cpu().clone() for k, v in self.velocity.items()}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.velocity = {k: v.to(self.device) for k, v in state["velocity"].items()}
