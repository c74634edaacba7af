"""FedFocal on a fully fine-tuned CLIP (FACMIC Table 2), one round, as FACMIC's code runs it.

Specification (``--method fedfocal``, ``utils/clip_util.FocalLossWithSmoothing(num_classes=32)`` at
batch size 32, gamma = 1, label smoothing 0.1): the cross-entropies of the B x B image-text logits (see
test_clip_fedavg.py) are replaced, in both directions, by

    FL(logits, y) = - sum_k d_k q_k log softmax(logits)_k,   averaged over the rows,
    q_y = 1 - eps, q_k = eps / (K - 1) (k != y),   d = (1 - onehot(y) * softmax(logits))^gamma

with K = the batch size (the "classes" are batch positions), so d_y = (1 - p_y)^gamma and d_k = 1
elsewhere; L = 1/2 [FL(logits, arange B) + FL(logits^T, arange B)]. Adam as FedAvg's; aggregation
weights (n_i // B) x B; predictions softmax(100 cos).
"""

import pytest
import torch
import torch.nn.functional as F

from .clip_spec import check_full_clip, clip_logits

pytestmark = pytest.mark.usefixtures("one_thread")

GAMMA, SMOOTHING = 1.0, 0.1      # FocalLossWithSmoothing's defaults, as FACMIC constructs it


def focal_with_smoothing(logits: torch.Tensor, label: torch.Tensor, num_classes: int) -> torch.Tensor:
    # p = exp(log p) and the product in the order q * d * log p: the same numbers as softmax and the
    # code's d * log p * q, with the implementation's float rounding (see clip_spec.clip_logits)
    log_p = F.log_softmax(logits, dim=1)
    onehot = F.one_hot(label, num_classes).float()
    target = onehot * (1.0 - SMOOTHING) + (1.0 - onehot) * (SMOOTHING / (num_classes - 1))
    difficulty = (1.0 - onehot * log_p.exp()) ** GAMMA
    return -(target * difficulty * log_p).sum(dim=1).mean()


def focal_step(tokens):
    def step(model, batch, ctx):
        logits = clip_logits(model, tokens, batch["x"], batch["y"])
        positions = torch.arange(len(logits))
        return 0.5 * (focal_with_smoothing(logits, positions, len(logits))
                      + focal_with_smoothing(logits.t(), positions, len(logits)))
    return step


def test_fedfocal_full_clip_matches_the_code(tmp_path):
    check_full_clip(tmp_path, "facmic", "fedfocal", focal_step)
