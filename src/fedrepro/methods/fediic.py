"""FedIIC (Wu, Yu, Yang, Cheng and Yan, "FedIIC: Towards Robust Federated Learning for
Class-Imbalanced Medical Image Classification", MICCAI 2023; paper text vs the authors' code:
docs/papers/fediic.md).

Model: classifier f on a feature extractor g, plus a projector h; z = h(g(x)) / ||h(g(x))|| for
every image of a multi-view batch (two augmentations per image, index set I of size 2B).

Intra-client contrastive learning (eq. 3), a supervised contrastive loss whose temperature depends
on the local class priors p (t = 0.5):

    L_intra = sum_{i in I} -1/|P(i)| sum_{j in P(i)} log( exp(z_i.z_j / tau'_ij) / sum_{a in A(i)} exp(z_i.z_a / tau'_ia) )
    tau'_ij = (p_{y_i} p_{y_j})^t * tau,   A(i) = I \\ {i},   P(i) = {j in A(i): y_j = y_i}

  The authors' code clamps tau' at 0.07 and never applies its tau = 0.1 (tau = 1 in effect):
  ``intra_tau`` / ``intra_tau_floor`` default to the code (1.0, 0.07).

Inter-client contrastive learning (eq. 4) against class prototypes V = {v^1..v^L}:

    L_inter = sum_{i in I} -log( exp(z_i.v^{y_i} / tau) / sum_c exp(z_i.v^c / tau) ),   tau = 0.1

  (the 1/|P(i)| of the printed equation has no P(i) to refer to; the code is this cross-entropy).
  The prototypes cost the clients no upload: after aggregation the server feeds the global
  classifier's weight rows W (L x d) through the global projector, V~ = h_g(W), lowers their largest
  mutual cosine by gradient descent (eq. 5, SGD lr 0.1 for 1000 steps in the code),

    V~ <- V~ - grad sum_i max_{j != i} cos(v~_i, v~_j),

  and sends V = row-normalised V~.

Difficulty-aware logit adjustment (eq. 6), on the first view only:

    L_DALA = sum_i -log softmax(f(g(x_i)) - delta)_{y_i},   delta_y = log( lbar(y)^q / p(y) ),  q = 0.25

  with p(y) the local class frequency and lbar(y) the global mean cross-entropy of class y under the
  received global model: before local training every client uploads only its per-class loss sums
  (and counts), lbar(y) = sum_k l_k(y) / sum_k n_k(y). Locally absent classes get delta = +inf, i.e.
  they leave the softmax (as in the code).

Total (eq. 7): L = L_DALA + k1 L_intra + k2 L_inter, k1 = k2 = 2; FedAvg weighted by client size.
The code averages the contrastive losses over anchors (``reduction: mean``); the paper sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import full_precision
from ..fl.method import ModelAveraging
from ..models.families import cross_entropy_over
from ..registry import register_method
from ._common.imbalance import (
    class_counts,
    class_prior,
    fixed_randomness,
    head_of,
    logit_adjusted_cross_entropy,
    outputs_over,
    projector_of,
)
from .fediic_params import FEDIIC_PARAMS

# ---- the losses -----------------------------------------------------------------------------

def pairwise_temperature(sample_prior: torch.Tensor, t: float, tau: float, floor: float) -> torch.Tensor:
    """tau'_ij = max((p_i p_j)^t * tau, floor) for the class priors p_i of the samples."""
    return torch.clamp((sample_prior[:, None] * sample_prior[None, :]) ** t * tau, min=floor)


@full_precision
def intra_client_contrastive(z: torch.Tensor, labels: torch.Tensor, prior: torch.Tensor, t: float = 0.5,
                             tau: float = 1.0, floor: float = 0.07, reduction: str = "mean") -> torch.Tensor:
    """Eq. 3 on normalised embeddings ``z`` (N x D) with labels (N) and the local class prior (L), in
    the code's arithmetic (``utils/losses.py::IntraSCL``: each row shifted by its maximum, self-pair
    included; the self-pair left out of the denominator and of the positives). Anchors without a
    positive are left out."""
    n = len(z)
    others = 1.0 - torch.eye(n, device=z.device)
    logits = (z @ z.t()) / pairwise_temperature(prior[labels], t, tau, floor)
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    log_prob = logits - torch.log((logits.exp() * others).sum(dim=1, keepdim=True))
    positive = (labels[:, None] == labels[None, :]).float() * others
    n_pos = positive.sum(dim=1)
    has = n_pos > 0
    per_anchor = -(positive * log_prob).sum(dim=1)[has] / n_pos[has]
    if not len(per_anchor):
        return z.sum() * 0.0
    return per_anchor.mean() if reduction == "mean" else per_anchor.sum()


@full_precision
def inter_client_contrastive(z: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor, tau: float = 0.1,
                             reduction: str = "mean") -> torch.Tensor:
    """Eq. 4: cross-entropy of z_i . v^c / tau over the L prototypes, target y_i."""
    return F.cross_entropy(z @ prototypes.t() / tau, labels, reduction=reduction)


@full_precision
def contrastive_as_code(z: torch.Tensor, labels: torch.Tensor, prior: torch.Tensor, prototypes: torch.Tensor,
                        t: float = 0.5, tau: float = 1.0, floor: float = 0.07,
                        inter_tau: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_intra, L_inter) of a two-view batch (``z``: both views' normalised embeddings, view-major, 2B x D) in the
    authors' own steps (wnn2000/FedIIC ``utils/local_training.py::train_FedIIC`` and ``utils/losses.py::IntraSCL``,
    ``InterSCL``): the embeddings regrouped B x 2 x D, each loss reading its own copy of them view-major; the
    inter-client logits taken against the anchors and the prototypes together, the anchor block masked out, shifted by
    a row maximum that is each anchor's self-similarity; both means over the 2 x B anchors, mean reduction only.
    The same numbers as :func:`intra_client_contrastive` and :func:`inter_client_contrastive` up to rounding; with
    these steps the gradients reach ``z`` summed in the code's order too (``train.arithmetic: authors``)."""
    n = len(z)
    b = n // 2
    first, second = torch.split(z, [b, b], dim=0)
    grouped = torch.cat([first.unsqueeze(1), second.unsqueeze(1)], dim=1)           # B x 2 x D
    anchor_labels = labels[:b].reshape(-1, 1).repeat(2, 1)
    rows = torch.arange(n, device=z.device).view(-1, 1)

    # inter-client: the anchors' logits against [anchors; prototypes], only the prototype columns kept
    everyone = torch.cat([anchor_labels, torch.arange(len(prototypes), device=z.device).view(-1, 1)], dim=0)
    positive = torch.eq(anchor_labels, everyone.T).float()
    kept = torch.scatter(torch.ones_like(positive), 1, rows, 0)
    kept[:n, :n] = 0
    positive = positive * kept
    features = torch.cat([torch.cat(torch.unbind(grouped, dim=1), dim=0), prototypes], dim=0)
    inter = _mean_positive_log_prob(torch.div(features[:n].mm(features.T), inter_tau), kept, positive, b)

    # intra-client: pairwise temperatures from the class priors
    positive = torch.eq(anchor_labels, anchor_labels.T).float()
    kept = torch.scatter(torch.ones_like(positive), 1, rows, 0)
    positive = positive * kept
    anchors = torch.cat(torch.unbind(grouped, dim=1), dim=0)
    sample_prior = prior.gather(0, anchor_labels.view(-1)).view(-1, 1)
    temperature = torch.clamp(sample_prior.mm(sample_prior.T) ** t * tau, min=floor)
    intra = _mean_positive_log_prob(torch.div(anchors.mm(anchors.T), temperature), kept, positive, b)
    return intra, inter


def _mean_positive_log_prob(logits: torch.Tensor, kept: torch.Tensor, positive: torch.Tensor, b: int) -> torch.Tensor:
    """-mean over anchors of the mean log-probability of their positives, the code's way (shift by the row maximum,
    the kept entries' exponentials summed, the mean taken over the 2 x B grid)."""
    logits = logits - torch.max(logits, dim=1, keepdim=True)[0].detach()
    log_prob = logits - torch.log((torch.exp(logits) * kept).sum(1, keepdim=True))
    return (-1 * ((positive * log_prob).sum(1) / positive.sum(1))).view(2, b).mean()


def orthogonalize_prototypes(initial: torch.Tensor, steps: int = 1000, lr: float = 0.1,
                             zero_diagonal: bool = True) -> torch.Tensor:
    """Eq. 5 by SGD on a copy of ``initial`` (L x D); returns the row-normalised result.

    ``zero_diagonal``: the code takes the row maximum of the cosine matrix with its diagonal set
    to 0 (a row whose cosines are all negative then contributes nothing); otherwise the maximum is
    over j != i exactly."""
    v = initial.detach().clone().float().requires_grad_(True)
    if len(v) < 2:
        return F.normalize(v.detach(), dim=1)
    off_diagonal = ~torch.eye(len(v), dtype=torch.bool, device=v.device)
    optimizer = torch.optim.SGD([v], lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            unit = F.normalize(v, dim=1)
            cos = unit @ unit.t()
            cos = cos * off_diagonal if zero_diagonal else cos.masked_fill(~off_diagonal, float("-inf"))
            loss = cos.max(dim=1).values.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return F.normalize(v.detach(), dim=1)


def dala_adjustment(prior: torch.Tensor, class_loss: torch.Tensor, q: float = 0.25, eps: float = 1e-5) -> torch.Tensor:
    """-delta_y = log( p(y) / (lbar(y)^q + eps) ), added to the logits (-inf for absent classes); the
    code's arithmetic (``utils/losses.py::DALA``)."""
    return torch.log(prior / (class_loss.clamp_min(0.0) ** q + eps))


@full_precision
def class_loss_sums(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the cross-entropy of the samples of each class, number of samples of each class); the
    code sums each class's per-sample losses at once (``val.py::compute_loss_of_classes``)."""
    ce = F.cross_entropy(logits.float(), labels, reduction="none")
    sums = torch.stack([ce[labels == c].sum() for c in range(num_classes)]) if len(ce) else \
        torch.zeros(num_classes, device=logits.device)
    counts = torch.bincount(labels, minlength=num_classes).float()
    return sums, counts


def fedavg_as_code(states: list[dict[str, torch.Tensor]], sizes: list[int]) -> dict[str, torch.Tensor]:
    """FedAvg weighted by client size in the authors' steps (wnn2000/FedIIC ``utils/FedAvg.py``): per entry, in the
    entry's own dtype, n_0 w_0 + n_1 w_1 + ... accumulated in client order, then divided by sum(n); an integer
    entry (a BatchNorm step counter) comes out of the division as a float, which loading into the model truncates.
    fedrepro's :func:`~fedrepro.fl.method.weighted_average` sums normalised weights in float64: the same mean,
    rounded otherwise (``train.arithmetic: authors`` takes these steps)."""
    total = sum(sizes)
    averaged = {}
    for key, first in states[0].items():
        accumulated = first * sizes[0]
        for state, size in zip(states[1:], sizes[1:]):
            accumulated += state[key] * size
        averaged[key] = (accumulated / total).to(first.dtype)
    return averaged


def mean_class_loss(sums: list[torch.Tensor], counts: list[torch.Tensor], eps: float = 1e-5) -> torch.Tensor:
    """lbar(y) = sum_k l_k(y) / (eps + sum_k n_k(y)) over the clients' uploads (each client's sums
    divided first, then added, as the code)."""
    total = eps + torch.stack(counts).sum(0)
    return torch.stack([s / total for s in sums]).sum(0)


# ---- the method -------------------------------------------------------------------------------

@register_method("fediic", params=FEDIIC_PARAMS)
class FedIIC(ModelAveraging):
    PROTOTYPES, CLASS_LOSS = "fediic.prototypes", "fediic.class_loss"

    @classmethod
    def check_run(cls, params: dict, train: dict) -> list[str]:
        views = train["model"].get("views", 1)
        if (params["k1"] > 0 or params["k2"] > 0) and views != 2:
            return [f"train/model/views is {views}, but FedIIC with k1={params['k1']}, k2={params['k2']} contrasts two "
                    f"views per image: set train.model.views: 2 (family proj_classifier), or k1 = k2 = 0"]
        return []

    def setup(self) -> None:
        for problem in self.check_run(self.params, self.ctx.train):     # a job fed its run by hand is checked too
            raise ValueError(problem)
        super().setup()
        p = self.params
        self.contrastive = p["k1"] > 0 or p["k2"] > 0
        if self.contrastive:
            projector_of(self.server)
        head_of(self.server)
        # the authors' steps (train.arithmetic: authors) for what their code computes: FedAvg by client size, both
        # contrastive losses, mean reduction (the Table 2 and 3 variants that switch a term off or sum ran code that
        # was not published)
        self.authors_steps = self.ctx.train.get("arithmetic") == "authors"
        self.as_code = self.authors_steps and p["k1"] > 0 and p["k2"] > 0 and p["reduction"] == "mean"
        self.counts = {c.name: class_counts(c.train, self.fed.num_classes) for c in self.fed.clients}
        self.current: dict = {}

    # ---- server side ----------------------------------------------------------------------
    def broadcast(self, rnd: int) -> dict[str, torch.Tensor]:
        message = super().broadcast(rnd)
        if self.params["k2"] > 0:
            message[self.PROTOTYPES] = self.prototypes()
        if self.params["dala"]:
            message[self.CLASS_LOSS] = self.global_class_loss(rnd)
        return message

    @torch.no_grad()
    def prototypes(self) -> torch.Tensor:
        """V = normalise(orthogonalise(h_g(W_fc))) from the current global model."""
        initial = projector_of(self.server)(head_of(self.server).weight)
        if not self.params["orthogonalize"]:
            return F.normalize(initial, dim=1)
        return orthogonalize_prototypes(initial, self.params["orth_steps"], self.params["orth_lr"],
                                        self.params["orth_zero_diagonal"])

    def global_class_loss(self, rnd: int) -> torch.Tensor:
        """Each participant measures the received global model on its data and uploads per-class
        loss sums and counts; the server divides the totals."""
        sums, counts = [], []
        for client in self.participants():
            with self.ctx.phases("difficulty pass"):
                s, n = self.client_class_losses(client, rnd)
            self.ctx.comm.record(rnd, "up", {"loss_sums": s, "counts": n})
            sums.append(s)
            counts.append(n)
        return mean_class_loss(sums, counts, self.params["dala_eps"])

    def client_class_losses(self, client, rnd: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys = (client.index,) if self.params["difficulty_augment"] == "fixed" else (rnd, client.index)
        logits, labels = [], []
        plan = self.recorded_pass("fediic-difficulty", *keys)      # a replay: the recorded run's images
        with fixed_randomness(self.ctx.seed, "augment", "fediic-difficulty", *keys):
            for out, batch in outputs_over(self.family, self.server, client.train, self.ctx.train, self.compute,
                                           plan=plan):
                logits.append(out.logits)
                labels.append(batch["y"])
        if not logits:
            return (torch.zeros(self.fed.num_classes, device=self.device),) * 2
        return class_loss_sums(torch.cat(logits), torch.cat(labels), self.fed.num_classes)

    def aggregate(self, updates, rnd):
        if not self.authors_steps or self.ctx.train["aggregation"]["weights"] != "train_size":
            return super().aggregate(updates, rnd)
        averaged = fedavg_as_code([u.payload for u in updates], [u.num_examples for u in updates])
        self.server.load_state_dict(averaged, strict=False)
        self.compute.round_weights(self.server)

    # ---- client side ----------------------------------------------------------------------
    def local_update(self, client, message, rnd):
        message = dict(message)
        prior = class_prior(self.counts[client.name]).to(self.device)
        class_loss = message.pop(self.CLASS_LOSS, None)
        self.current = {
            "prior": prior,
            "prototypes": message.pop(self.PROTOTYPES, None),
            "adjustment": dala_adjustment(prior, class_loss, self.params["q"], self.params["dala_eps"])
            if class_loss is not None else None,
        }
        update = super().local_update(client, message, rnd)
        # what the server sent besides the model, for comparisons with the authors' run (fedrepro.parity)
        update.stats["received"] = {"class_loss": class_loss, "prototypes": self.current["prototypes"]}
        return update

    def local_loss(self, model, batch, client, rnd):
        p, cur = self.params, self.current
        out = self.family.forward(model, batch)
        y = batch["y"]
        if cur["adjustment"] is not None:
            loss = logit_adjusted_cross_entropy(out.logits, y, cur["adjustment"])
        else:
            loss = cross_entropy_over(out.objective)
        terms = {"ce": loss}
        if self.as_code:
            z = F.normalize(self.family.project(model, out), dim=1)
            terms["intra"], terms["inter"] = contrastive_as_code(
                z, self.family.view_labels(out, y), cur["prior"], cur["prototypes"], p["t"], p["intra_tau"],
                p["intra_tau_floor"], p["inter_tau"])
            loss = loss + p["k1"] * terms["intra"] + p["k2"] * terms["inter"]
        elif self.contrastive:
            z = F.normalize(self.family.project(model, out), dim=1)
            labels = self.family.view_labels(out, y)
            if p["k1"] > 0:
                terms["intra"] = intra_client_contrastive(z, labels, cur["prior"], p["t"], p["intra_tau"],
                                                          p["intra_tau_floor"], p["reduction"])
                loss = loss + p["k1"] * terms["intra"]
            if p["k2"] > 0:
                terms["inter"] = inter_client_contrastive(z, labels, cur["prototypes"], p["inter_tau"], p["reduction"])
                loss = loss + p["k2"] * terms["inter"]
        out.extra["terms"] = terms        # each term unweighted, as the authors' code logs them
        return loss, out
