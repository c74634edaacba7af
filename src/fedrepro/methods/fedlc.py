"""FedLC (Zhang, Li, Li, Xu, Wu and Wu, "Federated Learning with Label Distribution Skew via Logits
Calibration", ICML 2022), a baseline of FedIIC's Table 1.

Each client calibrates its logits by a class-wise margin that shrinks with the local class count
n_c before the softmax:

    L = -log( exp(z_y - tau * n_y^(-1/4)) / sum_c exp(z_c - tau * n_c^(-1/4)) ),

tau = 1 (FedIIC gives no value; FedLC's default). A class the client lacks (n_c = 0) has an infinite
margin and leaves the softmax. Evaluation uses the raw logits; aggregation is FedAvg's.
"""

from __future__ import annotations

import torch

from ..fl.method import ModelAveraging
from ..registry import register_method
from ._common.imbalance import class_counts, logit_adjusted_cross_entropy


def calibration(counts: torch.Tensor, tau: float) -> torch.Tensor:
    """-tau * n_c^(-1/4) per class (-inf where n_c = 0), to be added to the logits."""
    return torch.where(counts > 0, -tau * counts.clamp_min(1e-12) ** -0.25, torch.full_like(counts, float("-inf")))


FEDLC_PARAMS = {
    "tau": {
        "type": "number",
        "minimum": 0,
        "default": 1.0,
        "description": "not given by FedIIC; FedLC's default 1.0",
    },
}


@register_method("fedlc", params=FEDLC_PARAMS)
class FedLC(ModelAveraging):
    def setup(self) -> None:
        super().setup()
        self.margins = {c.name: calibration(class_counts(c.train, self.fed.num_classes), self.params["tau"]).to(self.device)
                        for c in self.fed.clients}

    def local_loss(self, model, batch, client, rnd):
        out = self.family.forward(model, batch)
        margin = self.margins[client.name]
        loss = sum(logit_adjusted_cross_entropy(s, t, margin) for s, t in out.objective) / len(out.objective)
        return loss, out
