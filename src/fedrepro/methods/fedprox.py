"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

Local objective: the family's loss plus a proximal term that keeps the client near a global model,

    L = L_task + (mu / 2) * ||w - w_anchor||^2                      (the paper; ``squared: true``)
    L = L_task + (mu / 2) * sqrt(1e-10 + ||w - w_anchor||^2)         (FACMIC/FAA-CLIP code; ``squared: false``)

over the communicated (shared) trainable parameters; the code's "1e-2 / 2 * w_diff" is mu = 0.01 with
squared: false. The anchor is the global model this round started from, or (FAA-CLIP's code) the one
the previous round started from; the first ``warmup_updates`` client updates of the run go without
the term (both papers' code: 1), see :mod:`fedrepro.methods._common.global_anchor`. Aggregation is FedAvg's.
"""

from __future__ import annotations

import torch

from ..registry import register_method
from ._common.global_anchor import GLOBAL_ANCHOR_PARAMS, GlobalAnchor

NORM_EPS = 1e-10   # inside the square root of the non-squared norm, as the authors' code starts its sum


def proximal_term(model: torch.nn.Module, anchor: dict[str, torch.Tensor], mu: float, squared: bool = True) -> torch.Tensor:
    """(mu/2) ||w - anchor||^2, or (mu/2) sqrt(1e-10 + ||w - anchor||^2) when ``squared`` is false. On an fp16
    model (precision fp16_weights) as the FACMIC and FAA-CLIP code computes it there (AIPMLab/FACMIC
    ``utils/training.py::train``, fedprox: ``torch.pow(torch.norm(w - w_t), 2).float()`` per parameter): each
    parameter's difference and norm in fp16, squared, then summed in fp32 (squaring the fp16 differences
    element-wise would underflow)."""
    params = dict(model.named_parameters())
    if any(params[name].dtype == torch.float16 for name in anchor):
        # the code's order: w_diff = tensor(1e-10); w_diff += ... per parameter; sqrt(w_diff)
        device = next(iter(params.values())).device
        total = torch.tensor(0.0 if squared else NORM_EPS, device=device)
        for name, ref in anchor.items():
            total = total + torch.pow(torch.norm(params[name] - ref), 2).float()
        return (mu / 2) * (total if squared else torch.sqrt(total))
    sq = sum(((params[name] - ref) ** 2).sum() for name, ref in anchor.items())
    if not isinstance(sq, torch.Tensor):
        return torch.zeros((), device=next(model.parameters()).device)
    return (mu / 2) * (sq if squared else torch.sqrt(sq + NORM_EPS))


FEDPROX_PARAMS = {
    "mu": {"type": "number", "minimum": 0, "default": 0.01},
    "squared": {
        "description": "true = (mu/2)||w - w_g||^2 as in the FedProx paper; false = (mu/2)||w - w_g|| as in the"
                       " FACMIC/FAA-CLIP code (whose 1e-2/2 * ||w - w_g|| is mu = 0.01)",
        "type": "boolean",
        "default": True,
    },
    **GLOBAL_ANCHOR_PARAMS,
}


@register_method("fedprox", params=FEDPROX_PARAMS)
class FedProx(GlobalAnchor):
    def before_local_training(self, client, rnd):
        super().before_local_training(client, rnd)
        anchor = self.anchor_state()
        self.anchor = {n: anchor[n].detach().clone() for n, p in self.work.named_parameters() if n in anchor and p.requires_grad}
        self.active = self.regularised(client, rnd)

    def local_loss(self, model, batch, client, rnd):
        loss, out = super().local_loss(model, batch, client, rnd)
        if not self.active:
            return loss, out
        return loss + proximal_term(model, self.anchor, self.params["mu"], self.params["squared"]), out
