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

FedProc has no official code, and FedIIC does not say which implementation it ran. The one most used
is the FedProc of the FPL / RethinkFL code bases (WenkeHuang/RethinkFL ``models/fedproc.py``,
``FedProc._train_net`` and ``proto_aggregation``), ``implementation: rethinkfl``. It differs from the
reading above in five places: the similarity is the plain cosine (no temperature); the representation
is the backbone's features (no projection layer); a client's prototypes are the means of the features
its training batches produced during local training (train mode, before each step), not a pass of the
trained model; the server takes the plain mean of the clients' prototypes (not weighted by counts);
alpha_r = 1 - r / (R - 1) (0 in the last round). Its prototype loss is summed over the samples whose
class has a global prototype and divided by the batch size, and in round 0 (no prototypes, alpha = 1)
its loss alpha * 0 + (1 - alpha) CE is 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import full_precision
from ..fl.method import ModelAveraging
from ..models.families import cross_entropy_over
from ..registry import register_method
from ._common.imbalance import fixed_randomness, outputs_over, projector_of, split_payload


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


@full_precision
def rethinkfl_contrastive(f: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor,
                          known: torch.Tensor) -> torch.Tensor:
    """RethinkFL's InfoNCE in its arithmetic: per sample -log(exp(cos(f, c^y)) / sum_j exp(cos(f, c^j))) over
    the known classes (plain cosine, no temperature), summed over the samples of known classes, divided
    by the batch size."""
    known = known.to(f.device)
    exp = torch.exp(F.cosine_similarity(f[:, None, :], prototypes[None, :, :], dim=2)) * known[None, :]
    keep = known[labels]
    if not keep.any():
        return f.sum() * 0.0
    rows = torch.arange(len(labels), device=f.device)[keep]
    return -torch.log(exp[rows, labels[keep]] / exp[keep].sum(1)).sum() / len(labels)


def curriculum_weight(rnd: int, rounds: int) -> float:
    """alpha_r = 1 - r / R (r counted from 0)."""
    return 1.0 - rnd / rounds


def weighted_prototypes(means: list[torch.Tensor], counts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_k n_k^j c_k^j / sum_k n_k^j per class, which classes have any sample)."""
    n = torch.stack(counts)                       # K x L
    total = n.sum(0)
    summed = (torch.stack(means) * n[:, :, None]).sum(0)
    return summed / total.clamp_min(1.0)[:, None], total > 0


def client_mean_prototypes(means: list[torch.Tensor], counts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the plain mean of c_k^j over the clients that have class j, which classes any client has)."""
    has = (torch.stack(counts) > 0).float()       # K x L
    holders = has.sum(0)
    summed = (torch.stack(means) * has[:, :, None]).sum(0)
    return summed / holders.clamp_min(1.0)[:, None], holders > 0


class ClassSums:
    """Per-class sums and counts of feature vectors, accumulated in float64 (fp32 where the device has no
    float64, e.g. MPS) and returned as fp32 means: a client's prototype is the mean of thousands of
    features added batch by batch, and an fp32 running sum loses about one rounding of the sum per batch,
    so the mean would depend on the number and order of the batches rather than on the features alone."""

    def __init__(self, classes: int, dim: int, device: torch.device):
        dtype = torch.float32 if torch.device(device).type == "mps" else torch.float64
        self.sums = torch.zeros(classes, dim, device=device, dtype=dtype)
        self.counts = torch.zeros(classes, device=device, dtype=dtype)

    def add(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.sums.index_add_(0, labels, features.to(self.sums.dtype))
        self.counts += torch.bincount(labels, minlength=len(self.counts)).to(self.counts.dtype)

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(class means in fp32, class counts in fp32); a class without features has a zero mean."""
        return (self.sums / self.counts.clamp_min(1.0)[:, None]).float(), self.counts.float()


FEDPROC_PARAMS = {
    "implementation": {
        "enum": ["paper", "rethinkfl"],
        "default": "paper",
        "description": "paper = FedProc's text (projection-layer prototypes of the trained model, count-weighted, "
                       "temperature tau, alpha = 1 - r/R); rethinkfl = the widely used implementation of the FPL / "
                       "RethinkFL code bases (models/fedproc.py: plain cosine, backbone features, prototypes from the "
                       "training batches, plain mean over clients, alpha = 1 - r/(R-1)). FedProc has no official code.",
    },
    "tau": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.5,
        "description": "temperature of the prototype contrast [GAP: FedIIC gives none]; not used by rethinkfl",
    },
    "schedule": {
        "enum": ["linear", "constant"],
        "default": "linear",
        "description": "linear = alpha_r = 1 - r/R (FedProc; rethinkfl: 1 - r/(R-1)); constant = alpha_r = alpha",
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
        self.rethinkfl = self.params["implementation"] == "rethinkfl"
        if not self.rethinkfl:
            projector_of(self.server)
        self.global_prototypes: torch.Tensor | None = None
        self.known: torch.Tensor | None = None
        self.current = None
        self.seen: tuple[torch.Tensor, torch.Tensor] | None = None     # rethinkfl: sums and counts of the round's features

    def broadcast(self, rnd):
        message = super().broadcast(rnd)
        if self.global_prototypes is not None:
            message[self.PROTOTYPES] = self.global_prototypes
            message[self.KNOWN] = self.known
        return message

    def alpha(self, rnd: int) -> float:
        if self.params["schedule"] == "constant":
            return float(self.params["alpha"])
        rounds = self.ctx.train["rounds"]
        return curriculum_weight(rnd, max(rounds - 1, 1) if self.rethinkfl else rounds)

    def local_update(self, client, message, rnd):
        message = dict(message)
        protos, known = message.pop(self.PROTOTYPES, None), message.pop(self.KNOWN, None)
        self.current = (protos.to(self.device), known.to(self.device)) if protos is not None else None
        self.seen = None
        update = super().local_update(client, message, rnd)
        means, counts = self.seen_prototypes() if self.rethinkfl else self.local_prototypes(client, rnd)
        update.payload.update({"fedproc.means": means, "fedproc.counts": counts})
        return update

    def local_loss(self, model, batch, client, rnd):
        out = self.family.forward(model, batch)
        ce = cross_entropy_over(out.objective)
        if self.rethinkfl:
            self.remember(out.features, batch["y"])
        if self.current is None:
            return ((1.0 - self.alpha(rnd)) * ce if self.rethinkfl else ce), out
        alpha = self.alpha(rnd)
        if self.rethinkfl:
            gpc = rethinkfl_contrastive(out.features, batch["y"], *self.current)
        else:
            r = self.family.project(model, out)[: len(batch["y"])]
            gpc = prototype_contrastive(r, batch["y"], *self.current, self.params["tau"])
        return alpha * gpc + (1.0 - alpha) * ce, out

    @torch.no_grad()
    def remember(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """rethinkfl: add the batch's features (as trained on, before the step) to the round's class sums."""
        if self.seen is None:
            self.seen = ClassSums(self.fed.num_classes, features.shape[1], features.device)
        self.seen.add(features.detach(), labels)

    def seen_prototypes(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.seen.means()

    @torch.no_grad()
    def local_prototypes(self, client, rnd: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The trained model's class means over the client's training images, each round under new
        augmentation draws (a training loader iterated again, as RethinkFL's prototypes come from the
        round's training batches)."""
        sums = None
        with fixed_randomness(self.ctx.seed, "augment", "fedproc-prototypes", rnd, client.index):
            for out, batch in outputs_over(self.family, self.work, client.train, self.ctx.train, self.compute):
                r = self.family.project(self.work, out)
                if sums is None:
                    sums = ClassSums(self.fed.num_classes, r.shape[1], r.device)
                sums.add(r, batch["y"])
        return sums.means()

    def aggregate(self, updates, rnd):
        means, counts = [], []
        for u in updates:
            u.payload, extra = split_payload(u.payload, "fedproc.")
            means.append(extra["fedproc.means"])
            counts.append(extra["fedproc.counts"])
        super().aggregate(updates, rnd)
        combine = client_mean_prototypes if self.rethinkfl else weighted_prototypes
        self.global_prototypes, self.known = combine(means, counts)

    def state_dict(self):
        return {**super().state_dict(), "prototypes": self.global_prototypes, "known": self.known}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.global_prototypes, self.known = state["prototypes"], state["known"]
