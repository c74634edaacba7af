"""FedRS (Li and Zhan, "FedRS: Federated Learning with Restricted Softmax for Label Distribution
Non-IID Data", KDD 2021), a baseline of FedIIC's Table 1 with alpha = 0 (supplementary Table 1).

A client that lacks some classes would push their scores down during local training ("missing
class" drift of the classifier). FedRS restricts the softmax: the scores of the classes the client
has no examples of are scaled by alpha in [0, 1] during local training,

    s_c = w_c . h            if the client has class c
    s_c = alpha * (w_c . h)  otherwise,

and the local loss is the cross-entropy of these restricted scores. With alpha = 0 the missing
classes' scores are 0. (The classifier here has a bias; the whole score w_c . h + b_c is scaled.)
Evaluation uses the unrestricted model; aggregation is FedAvg's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import full_precision
from ..fl.method import ModelAveraging
from ..registry import register_method
from .imbalance import class_counts


@full_precision
def restricted_scores(scores: torch.Tensor, present: torch.Tensor, alpha: float) -> torch.Tensor:
    """Scale the columns of classes the client lacks (``present`` False) by ``alpha``."""
    scale = torch.where(present.to(scores.device), torch.ones((), device=scores.device),
                        torch.full((), float(alpha), device=scores.device))
    return scores * scale[None, :]


FEDRS_PARAMS = {
    "alpha": {
        "type": "number",
        "minimum": 0,
        "maximum": 1,
        "default": 0.0,
        "description": "FedIIC supplementary Table 1: alpha = 0",
    },
}


@register_method("fedrs", params=FEDRS_PARAMS)
class FedRS(ModelAveraging):
    def setup(self) -> None:
        super().setup()
        self.present = {c.name: class_counts(c.train, self.fed.num_classes) > 0 for c in self.fed.clients}

    def local_loss(self, model, batch, client, rnd):
        out = self.family.forward(model, batch)
        present, alpha = self.present[client.name], self.params["alpha"]
        loss = sum(F.cross_entropy(restricted_scores(s, present, alpha), t) for s, t in out.objective) / len(out.objective)
        return loss, out
