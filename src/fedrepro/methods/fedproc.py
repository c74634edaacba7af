"""FedProc (Mu, Shen, Cheng, Geng, Fu, Zhang and Zhang, "FedProc: Prototypical Contrastive Federated
Learning on Non-IID Data", Future Generation Computer Systems 2023), a baseline of FedIIC's Table 1.

FedProc's local network has a projection layer whose outputs r = h(g(x)) are the representations
whose class means are the prototypes. Here h is the projector branch of the shared proj_classifier
family (the classifier stays on the backbone features, like for every method of FedIIC's table, which
share one backbone). After local
training each client uploads its class prototypes c_k^j (mean of r over its samples of class j) and
class counts; the server averages them weighted by the counts into global prototypes c^j, sent with
the next round's model.

Global prototypical contrastive loss (cosine similarity s, temperature tau):

    L_GPC = -log( exp(s(r_i, c^{y_i}) / tau) / sum_j exp(s(r_i, c^j) / tau) )

Hybrid local objective with a curriculum weight that moves from the prototype loss to the
cross-entropy over the R rounds:

    L = alpha_r L_GPC + (1 - alpha_r) L_CE,   alpha_r = 1 - r / R.

Round 0 (no global prototypes yet) and classes no client has seen use the cross-entropy alone /
are left out of the prototype softmax. FedIIC gives no FedProc hyper-parameters; tau = 0.5 is our
choice [GAP], ``schedule: constant`` replaces the curriculum by a fixed alpha.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import full_precision
from ..fl.method import ModelAveraging
from ..models.families import cross_entropy_over
from ..registry import register_method
from .imbalance import fixed_randomness, outputs_over, projector_of, split_payload


@full_precision
def prototype_contrastive(r: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor, known: torch.Tensor,
                          tau: float) -> torch.Tensor:
    """L_GPC with cosine similarities; prototypes of classes no client has (``known`` False) are masked out."""
    scores = F.normalize(r, dim=1) @ F.normalize(prototypes, dim=1).t() / tau
    scores = scores.masked_fill(~known.to(scores.device)[None, :], float("-inf"))
    keep = known.to(labels.device)[labels]
    if not keep.any():
        return r.sum() * 0.0
    return F.cross_entropy(scores[keep], labels[keep])


def curriculum_weight(rnd: int, rounds: int) -> float:
    """alpha_r = 1 - r / R (r counted from 0)."""
    return 1.0 - rnd / rounds


def weighted_prototypes(means: list[torch.Tensor], counts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_k n_k^j c_k^j / sum_k n_k^j per class, which classes have any sample)."""
    n = torch.stack(counts)                       # K x L
    total = n.sum(0)
    summed = (torch.stack(means) * n[:, :, None]).sum(0)
    return summed / total.clamp_min(1.0)[:, None], total > 0


FEDPROC_PARAMS = {
    "tau": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.5,
        "description": "temperature of the prototype contrast [GAP: FedIIC gives none]",
    },
    "schedule": {
        "enum": ["linear", "constant"],
        "default": "linear",
        "description": "linear = alpha_r = 1 - r/R (FedProc); constant = alpha_r = alpha",
    },
    "alpha": {
        "type": "number",
        "minimum": 0,
        "maximum": 1,
        "default": 0.5,
        "description": "the weight when schedule = constant",
    },
}


@register_method("fedproc", params=FEDPROC_PARAMS)
class FedProc(ModelAveraging):
    PROTOTYPES, KNOWN = "fedproc.prototypes", "fedproc.known"

    def setup(self) -> None:
        super().setup()
        projector_of(self.server)
        self.global_prototypes: torch.Tensor | None = None
        self.known: torch.Tensor | None = None
        self.current = None

    def broadcast(self, rnd):
        message = super().broadcast(rnd)
        if self.global_prototypes is not None:
            message[self.PROTOTYPES] = self.global_prototypes
            message[self.KNOWN] = self.known
        return message

    def alpha(self, rnd: int) -> float:
        if self.params["schedule"] == "constant":
            return float(self.params["alpha"])
        return curriculum_weight(rnd, self.ctx.train["rounds"])

    def local_update(self, client, message, rnd):
        message = dict(message)
        protos, known = message.pop(self.PROTOTYPES, None), message.pop(self.KNOWN, None)
        self.current = (protos.to(self.device), known.to(self.device)) if protos is not None else None
        update = super().local_update(client, message, rnd)
        means, counts = self.local_prototypes(client)        # with the model just trained
        update.payload.update({"fedproc.means": means, "fedproc.counts": counts})
        return update

    def local_loss(self, model, batch, client, rnd):
        out = self.family.forward(model, batch)
        ce = cross_entropy_over(out.objective)
        if self.current is None:
            return ce, out
        alpha = self.alpha(rnd)
        r = self.family.project(model, out)[: len(batch["y"])]
        gpc = prototype_contrastive(r, batch["y"], *self.current, self.params["tau"])
        return alpha * gpc + (1.0 - alpha) * ce, out

    @torch.no_grad()
    def local_prototypes(self, client) -> tuple[torch.Tensor, torch.Tensor]:
        num = self.fed.num_classes
        sums, counts = None, torch.zeros(num, device=self.device)
        with fixed_randomness(self.ctx.seed, "augment", "fedproc-prototypes", client.index):
            for out, batch in outputs_over(self.family, self.work, client.train, self.ctx.train, self.compute):
                r = self.family.project(self.work, out)
                if sums is None:
                    sums = torch.zeros(num, r.shape[1], device=self.device)
                sums.index_add_(0, batch["y"], r)
                counts += torch.bincount(batch["y"], minlength=num).float()
        return sums / counts.clamp_min(1.0)[:, None], counts

    def aggregate(self, updates, rnd):
        means, counts = [], []
        for u in updates:
            u.payload, extra = split_payload(u.payload, "fedproc.")
            means.append(extra["fedproc.means"])
            counts.append(extra["fedproc.counts"])
        super().aggregate(updates, rnd)
        self.global_prototypes, self.known = weighted_prototypes(means, counts)

    def state_dict(self):
        return {**super().state_dict(), "prototypes": self.global_prototypes, "known": self.known}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.global_prototypes, self.known = state["prototypes"], state["known"]
