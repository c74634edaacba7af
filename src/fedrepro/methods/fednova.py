"""FedNova (Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020), a baseline of FedAdapterProto (docs/papers/fedadapterproto.md).

Clients that run different numbers of local steps tau_i pull a weighted average of their models
towards the objective of the clients that worked most. FedNova normalises each client's update by
its amount of local work a_i before averaging, then rescales by the effective number of steps:

    d_i = (w_g - w_i) / a_i,      tau_eff = sum_i p_i a_i,      w_g <- w_g - tau_eff * sum_i p_i d_i

with p_i = n_i / n (``train.aggregation.weights``), a_i = tau_i for plain local SGD (and, as an
approximation, for Adam, for which the paper defines no normalisation), and for SGD with momentum
rho a_i = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho) (the paper's local-momentum case).
With equal a_i this is FedAvg. Parameters are normalised; buffers (BatchNorm statistics) are
averaged with the same p_i.
"""

from __future__ import annotations

import torch

from ..fl.method import ModelAveraging, weighted_average
from ..registry import register_method


def normalising_factor(steps: int, momentum: float = 0.0) -> float:
    """||a_i||_1 of FedNova: tau for SGD, the accumulated momentum weights for momentum SGD."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)


def fednova_update(global_state: dict[str, torch.Tensor], client_states: list[dict[str, torch.Tensor]],
                   weights: list[float], factors: list[float], parameter_keys: set[str]) -> dict[str, torch.Tensor]:
    """w_g - tau_eff * sum_i p_i (w_g - w_i) / a_i for the parameters; weighted mean for the rest."""
    p = torch.tensor(weights, dtype=torch.float64)
    p = p / p.sum()
    a = torch.tensor(factors, dtype=torch.float64)
    tau_eff = float((p * a).sum())
    out = weighted_average(client_states, weights)
    for key in parameter_keys & set(global_state):
        g = global_state[key].to(torch.float64)
        d = sum(p[i] * (g - s[key].to(torch.float64)) / a[i] for i, s in enumerate(client_states))
        out[key] = (g - tau_eff * d).to(global_state[key].dtype)
    return out


@register_method("fednova")
class FedNova(ModelAveraging):
    def aggregate(self, updates, rnd):
        opt = self.ctx.train["optimizer"]
        momentum = float(opt.get("momentum", 0.0)) if opt["name"] == "sgd" else 0.0
        working = [u for u in updates if u.stats.get("steps", 0) > 0]
        if not working:
            return
        factors = [normalising_factor(int(u.stats["steps"]), momentum) for u in working]
        server = self.server.state_dict()
        parameter_keys = {name for name, _ in self.server.named_parameters()} & set(self.shared)
        new = fednova_update({k: server[k] for k in self.shared}, [u.payload for u in working],
                             self.aggregation_weights(working), factors, parameter_keys)
        self.server.load_state_dict(new, strict=False)
