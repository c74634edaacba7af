"""FedFocal: FedAvg with the focal loss (Lin et al., ICCV 2017) in place of cross-entropy, as the
federated baseline of Sarkar et al. ("Fed-Focal Loss for imbalanced data classification in FL",
IJCAI 2020 FL workshop) that FACMIC, FAA-CLIP and FedIIC compare with.

With p = softmax(scores), K classes, target y, focusing parameter gamma and label smoothing eps:

    FL = -(1 - eps) (1 - p_y)^gamma log p_y  -  sum_{k != y} eps / (K - 1) log p_k,

averaged over the batch. This is FACMIC's ``FocalLossWithSmoothing`` (gamma = 1, eps = 0.1): the
smoothed target puts 1 - eps on the label and eps / (K - 1) on every other class, and the focal
factor (1 - p_k)^gamma is taken with p_k = onehot_k * p_k, so it is (1 - p_y)^gamma on the label and
1 on the other classes. eps = 0 gives the usual -(1 - p_y)^gamma log p_y (FedIIC: gamma = 2). It is
applied to the same (scores, target) pairs the family's cross-entropy would use (for CLIP: the B x B
image-text logits in both directions, so K = B, the code's ``num_classes=32`` at batch size 32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import full_precision
from ..fl.method import ModelAveraging
from ..registry import register_method


@full_precision
def focal_loss(scores: torch.Tensor, targets: torch.Tensor, gamma: float, smoothing: float = 0.0) -> torch.Tensor:
    log_p = F.log_softmax(scores, dim=1)
    k = scores.shape[1]
    onehot = F.one_hot(targets, k).to(log_p.dtype)
    q = onehot * (1.0 - smoothing) + (1.0 - onehot) * (smoothing / (k - 1) if k > 1 else 0.0)
    focus = (1.0 - onehot * log_p.exp()) ** gamma          # (1 - p_y)^gamma on the label, 1 elsewhere
    return -(q * focus * log_p).sum(dim=1).mean()


FEDFOCAL_PARAMS = {
    "gamma": {"type": "number", "minimum": 0, "default": 2.0},
    "smoothing": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.0},
}


@register_method("fedfocal", params=FEDFOCAL_PARAMS)
class FedFocal(ModelAveraging):
    def local_loss(self, model, batch, client, rnd):
        out = self.family.forward(model, batch)
        loss = sum(focal_loss(s, t, self.params["gamma"], self.params["smoothing"]) for s, t in out.objective) / len(out.objective)
        return loss, out
