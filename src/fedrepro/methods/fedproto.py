"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang and Zhang, "FedProto: Federated Prototype Learning across
Heterogeneous Clients", AAAI 2022), a baseline of FedAdapterProto (docs/papers/fedadapterproto.md).

No model weights are exchanged: every client keeps its whole model and sends class prototypes, the
mean representation f(x) of its training samples of each class (collected during local training),

    C_k^(i) = mean_{(x, y) in D_i, y = k} f_i(x).

The server averages them per class into global prototypes,

    C_k = sum_i w_ik C_k^(i) / sum_i w_ik,   w_ik = |D_i,k| (paper, eq. 6) or 1 (official code),

and each client trains on CE + lambda * R(f(x), C_y), R = the mean squared difference over the
feature dimensions (code's MSELoss; samples of a class without a global prototype contribute 0) or
the squared L2 distance. Prediction: the client's own head (``predict: head``) or the nearest global
prototype (``nearest_prototype``, probabilities = softmax of minus the distance). FedProto has no
global model; the ``global`` evaluation key is the mean of the clients' predicted probabilities.
As in the FedProto code (and FedAdapterProto's, derived from it), every client's model is built on
its own: pretrained weights are shared, the random parts (the head) differ per client.
"""

from __future__ import annotations

import numpy as np
import torch

from ..device import fp32, full_precision
from ..fl.method import ModelAveraging
from ..registry import register_method


@full_precision
def feature_distance(features: torch.Tensor, prototypes: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean (mse) or sum (squared_l2) of squared differences over the last dimension (broadcasting:
    B x D vs B x D gives B paired distances, B x 1 x D vs 1 x K x D gives B x K)."""
    sq = (features - prototypes) ** 2
    if kind == "mse":
        return sq.mean(dim=-1)
    if kind == "squared_l2":
        return sq.sum(dim=-1)
    raise ValueError(f"unknown FedProto distance {kind!r}; allowed: mse, squared_l2")


def prototype_regulariser(features: torch.Tensor, labels: torch.Tensor, global_protos: torch.Tensor,
                          present: torch.Tensor, kind: str) -> torch.Tensor:
    """mean_b R(f(x_b), C_{y_b}), with 0 for samples whose class has no global prototype yet."""
    per_sample = feature_distance(features, global_protos[labels], kind)
    return (per_sample * present[labels].to(per_sample.dtype)).mean()


def aggregate_prototypes(local: list[torch.Tensor], counts: list[torch.Tensor], weighting: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class (weighted) mean of the clients' prototypes -> (K x D global prototypes, K present mask)."""
    stacked, n = torch.stack(local), torch.stack(counts).to(torch.float64)       # N x K x D, N x K
    if weighting == "mean":
        w = (n > 0).to(torch.float64)
    elif weighting == "weighted":
        w = n
    else:
        raise ValueError(f"unknown prototype weighting {weighting!r}; allowed: mean, weighted")
    total = w.sum(dim=0)
    glob = (w[..., None] * stacked.to(torch.float64)).sum(dim=0) / total.clamp(min=1e-12)[:, None]
    return glob.to(stacked.dtype), total > 0


FEDPROTO_PARAMS = {
    "lambda": {
        "type": "number",
        "minimum": 0,
        "default": 1.0,
        "description": "weight of the prototype regulariser (FedProto code --ld 1)",
    },
    "distance": {
        "description": "mse = mean squared difference over feature dimensions (FedProto code's MSELoss, "
                       "default); squared_l2 = their sum",
        "enum": ["mse", "squared_l2"],
        "default": "mse",
    },
    "weighting": {
        "description": "Global prototype of a class: mean = plain mean over the clients that have the class "
                       "(official FedProto code, which FedAdapterProto's code base derives from; default); "
                       "weighted = weighted by the clients' class counts (FedProto paper, eq. 6; "
                       "yuetan031/FedProto issue #6).",
        "enum": ["mean", "weighted"],
        "default": "mean",
    },
    "predict": {
        "description": "head = the client's own classifier (default); nearest_prototype = the closest global "
                       "prototype",
        "enum": ["head", "nearest_prototype"],
        "default": "head",
    },
}


@register_method("fedproto", params=FEDPROTO_PARAMS)
class FedProto(ModelAveraging):
    personalized = True

    def setup(self) -> None:
        super().setup()
        self.global_protos: torch.Tensor | None = None
        self.present: torch.Tensor | None = None
        for name, state in self.separate_client_builds():
            self.private[name] = state

    def shared_keys(self) -> list[str]:
        return []            # every client keeps its whole model

    def broadcast(self, rnd):
        if self.global_protos is None:
            return {}
        return {"prototypes": self.global_protos, "present": self.present}

    def load_client_model(self, client, message):
        return super().load_client_model(client, {})

    def local_update(self, client, message, rnd):
        self.round_protos = message.get("prototypes")
        self.round_present = message.get("present")
        self.sums, self.counts = None, torch.zeros(self.fed.num_classes, device=self.device)
        update = super().local_update(client, message, rnd)
        update.payload = {"prototypes": self.sums / self.counts.clamp(min=1)[:, None], "counts": self.counts}
        return update

    def local_loss(self, model, batch, client, rnd):
        out = self.family.forward(model, batch)
        loss = self.family.loss(out, batch)
        features, y = out.features, batch["y"]
        if self.sums is None:
            self.sums = torch.zeros(self.fed.num_classes, features.shape[1], device=features.device)
        self.sums.index_add_(0, y, fp32(features.detach()))
        self.counts.index_add_(0, y, torch.ones_like(y, dtype=self.counts.dtype))
        if self.round_protos is not None:
            loss = loss + self.params["lambda"] * prototype_regulariser(features, y, self.round_protos, self.round_present,
                                                                        self.params["distance"])
        return loss, out

    def aggregate(self, updates, rnd):
        self.global_protos, self.present = aggregate_prototypes(
            [u.payload["prototypes"] for u in updates], [u.payload["counts"] for u in updates], self.params["weighting"])

    def predict(self, dataset, client):
        if client is None:    # no global model: the clients' models as an ensemble
            return np.mean([self.predict(dataset, c) for c in self.fed.clients], axis=0)
        return super().predict(dataset, client)

    def class_scores(self, model, batch):
        if self.params["predict"] == "head" or self.global_protos is None:
            return super().class_scores(model, batch)
        features = self.family.forward(model, batch).features
        dist = feature_distance(features[:, None, :], self.global_protos[None], self.params["distance"])
        return (-dist).masked_fill(~self.present, float("-inf"))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "prototypes": self.global_protos, "present": self.present}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        on_device = lambda t: None if t is None else t.to(self.device)  # noqa: E731
        self.global_protos, self.present = on_device(state["prototypes"]), on_device(state["present"])

    def final_model(self) -> dict:
        clients = {c.name: {k: v.detach().cpu().clone() for k, v in self.model_for(c).state_dict().items()}
                   for c in self.fed.clients}
        return {"clients": clients, "prototypes": self.global_protos, "present": self.present}
