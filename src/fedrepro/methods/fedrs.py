"""FedRS (Li and Zhan, "FedRS: Federated Learning with Restricted Softmax for Label Distribution
Non-IID Data", KDD 2021), a baseline of FedIIC's Table 1 with alpha = 0 (supplementary Table 1).

A client that lacks some classes would push their scores down during local training ("missing
class" drift of the classifier). FedRS restricts the softmax during local training: the score of
class c is the classifier's w_c . h (no bias), scaled by

    ``scaling: distribution`` (default; the official code, lxcnju/FedRepo ``algorithms/fedrs.py``,
    ``FedRS.update_local``):   s_c = ((p_c / max_j p_j) (1 - alpha) + alpha) w_c . h
    ``scaling: presence`` (the paper's text):   s_c = w_c . h if the client has class c, else alpha w_c . h

with p the client's class distribution, and the local loss is the cross-entropy of these restricted
scores. The code's scale follows each class's share: with alpha = 0 a class with half the examples
of the client's largest class gets half its score, an absent one 0; the text's is 1 or alpha.
h is what the classifier reads (here the pooled features after dropout) and W its weight: the scores
are h W^T, computed from h as the code does; ``bias: true`` scales the whole score w . h + b instead.
Evaluation uses the unrestricted model; aggregation is FedAvg's. (FedRepo's training loop also clips
gradients; that is its generic recipe, not FedRS, and FedIIC's shared recipe has no clipping.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import full_precision
from ..fl.method import ModelAveraging
from ..registry import register_method
from ._common.imbalance import class_counts, classifier_input, head_of


def class_scale(counts: torch.Tensor, alpha: float, scaling: str) -> torch.Tensor:
    """The per-class factor of the restricted scores: (n_c / max n)(1 - alpha) + alpha (``distribution``)
    or 1 / alpha for present / absent classes (``presence``)."""
    if scaling == "distribution":
        return counts / counts.max().clamp_min(1e-12) * (1.0 - alpha) + alpha
    return torch.where(counts > 0, torch.ones_like(counts), torch.full_like(counts, float(alpha)))


@full_precision
def restricted_scores(h: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """scale_c (w_c . h (+ b_c)) for the classifier input ``h`` (B x d) and weight (C x d); no bias by default."""
    return scale.to(h.device)[None, :] * F.linear(h, weight, bias)


FEDRS_PARAMS = {
    "alpha": {
        "type": "number",
        "minimum": 0,
        "maximum": 1,
        "default": 0.0,
        "description": "FedIIC supplementary Table 1: alpha = 0",
    },
    "scaling": {
        "enum": ["distribution", "presence"],
        "default": "distribution",
        "description": "distribution = the official code (lxcnju/FedRepo algorithms/fedrs.py): every class scaled "
                       "by (p_c / max p)(1 - alpha) + alpha with the client's class distribution p; presence = the "
                       "paper's text: 1 for the classes the client holds, alpha for the others",
    },
    "bias": {
        "type": "boolean",
        "default": False,
        "description": "false = the restricted score is w_c . h without the classifier's bias (code and paper); "
                       "true = the whole score w_c . h + b_c is scaled",
    },
}


@register_method("fedrs", params=FEDRS_PARAMS)
class FedRS(ModelAveraging):
    def setup(self) -> None:
        super().setup()
        head_of(self.server)
        p = self.params
        self.scale = {c.name: class_scale(class_counts(c.train, self.fed.num_classes), p["alpha"], p["scaling"])
                      for c in self.fed.clients}

    def local_loss(self, model, batch, client, rnd):
        head = head_of(model)
        with classifier_input(model) as read:
            out = self.family.forward(model, batch)
        h = read()[: len(batch["y"])]                     # the first view's rows, as the objective's logits
        scores = restricted_scores(h, head.weight, self.scale[client.name], head.bias if self.params["bias"] else None)
        return F.cross_entropy(scores, batch["y"]), out
