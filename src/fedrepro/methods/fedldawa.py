"""L-DAWA (Rehman et al., "L-DAWA: Layer-wise Divergence Aware Weight Aggregation in Federated
Self-Supervised Visual Representation Learning", ICCV 2023; code yasar-rehman/L-DAWA,
``L-DAWA-Agg.py``), FedDRA's FedLDAWA baseline (docs/papers/feddra.md).

The server scales every *layer* l of client k's model by its angular agreement with the same layer
of the global model w_g the round started from, then averages:

    δ_k^l = min(cos(w_k^l, w_g^l), 1),        w_g'^l = Σ_k (n_k / n) δ_k^l w_k^l

with n_k / n the run's aggregation weights (the code's plain mean, 1/K, is FedDRA's uniform
weighting). As in the code a "layer" is every non-scalar entry of the state dict (BatchNorm running
statistics included, ``layers: state``; ``layers: parameters`` scales only the parameters and
averages buffers as FedAvg does); scalar entries (step counters) are averaged unscaled, and a
client layer that is all zeros is kept unscaled (the code's rule). A global layer that is all zeros
(e.g. zero-initialised biases in the first round) has no angle either: the code would divide by
zero and turn the layer into NaN; here it is kept unscaled too. ``renormalize: true`` divides by
Σ_k (n_k / n) δ_k^l instead, so the weights of a layer sum to 1. Local training is the backbone
objective (L-DAWA is an aggregation rule; FedDRA pairs it with MGCA).
"""

from __future__ import annotations

import torch

from ..fl.method import ModelAveraging, weighted_average
from ..registry import register_method


def layer_cosines(client: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], keys) -> dict[str, float]:
    """δ^l = min(cos(w_k^l, w_g^l), 1) for every key (flattened tensors); 1 (no scaling) when either
    tensor is all zeros (the code leaves an all-zero client layer as it is)."""
    out = {}
    for k in keys:
        a, b = client[k].flatten().double(), reference[k].flatten().double().to(client[k].device)
        if a.norm() == 0 or b.norm() == 0:
            out[k] = 1.0
            continue
        out[k] = min(float(a @ b / (a.norm() * b.norm())), 1.0)
    return out


def ldawa_aggregate(states: list[dict], reference: dict, base_weights: list[float], layer_keys,
                    renormalize: bool = False) -> dict[str, torch.Tensor]:
    """Layer-wise divergence-aware aggregation of ``states`` (keys in ``layer_keys``; other keys are
    averaged with the normalised ``base_weights``)."""
    base = torch.tensor(base_weights, dtype=torch.float64)
    base = base / base.sum()
    out = weighted_average(states, base.tolist())
    cosines = [layer_cosines(s, reference, layer_keys) for s in states]
    for k in layer_keys:
        weights = torch.tensor([c[k] for c in cosines], dtype=torch.float64) * base
        if renormalize:
            weights = weights / weights.sum()
        stacked = torch.stack([s[k].to(torch.float64) for s in states])
        out[k] = torch.tensordot(weights.to(stacked.device), stacked, dims=1).to(states[0][k].dtype)
    return out


FEDLDAWA_PARAMS = {
    "renormalize": {
        "description": "false = weights cos * n_k / n as in L-DAWA (their sum can be < 1, shrinking the layer);"
                       " true = rescale them to sum to 1 per layer",
        "type": "boolean",
        "default": False,
    },
    "layers": {
        "description": "which state entries are scaled by their cosine: state = every non-scalar entry, "
                       "BatchNorm running statistics included (L-DAWA's code, which scales the whole list of "
                       "model weights); parameters = the parameters only, buffers averaged as in FedAvg",
        "enum": ["state", "parameters"],
        "default": "state",
    },
}


@register_method("fedldawa", params=FEDLDAWA_PARAMS)
class FedLDAWA(ModelAveraging):
    def aggregate(self, updates, rnd):
        reference = {k: v.detach().clone() for k, v in self.server.state_dict().items()}
        if self.params["layers"] == "state":
            layer_keys = [k for k, v in updates[0].payload.items() if v.dim() > 0 and v.is_floating_point()]
        else:
            params = {name for name, _ in self.server.named_parameters()}
            layer_keys = [k for k in updates[0].payload if k in params]
        merged = ldawa_aggregate([u.payload for u in updates], reference, self.aggregation_weights(updates), layer_keys,
                                 self.params["renormalize"])
        self.server.load_state_dict(merged, strict=False)
