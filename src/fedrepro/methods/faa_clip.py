"""FAA-CLIP (Wu, Chaddad, Desrosiers, Daqqaq, Kateb, "FAA-CLIP: Federated Adversarial Adaptation of CLIP",
journal extension of FACMIC; paper text vs code: docs/papers/faa_clip.md).

Each client i trains the feature attention module att_i of FACMIC (:mod:`fedrepro.models.fam`) with the same
contrastive loss (eq. 4), and a local domain classifier D_i (Linear-BN-ReLU-Linear-BN-ReLU-Linear-Sigmoid)
that tells the client's adapted features I* = att_i(I) ⊙ I (domain z = 1) from those of a global set of
unlabeled target images (z = 0):

    L_DA = -(1 / 2B) sum_j [ z_j log D_i(I*_j) + (1 - z_j) log(1 - D_i(I*_j)) ]                    (eq. 5)
    min_att max_D  L = L_contr(att) - lambda L_DA(att, D),   lambda = 0.5                           (eq. 6)

The min-max is a single minimisation through a gradient reversal layer (Ganin & Lempitsky, ICML 2015):
GRL is the identity forward and multiplies the gradient by -1 backward, so minimising
L_contr + lambda L_DA(D(GRL(I*))) trains D to classify domains and att_i to confuse it. The server takes
the simple average of the FAMs (eq. 7; ``aggregation.weights: uniform`` in the paper configs); D_i never
leaves the client.

Where the paper and the authors' code differ, the parameters choose; defaults = the **code**, which
produced the published numbers:

- ``target_grad`` (false): the code computes the target's I* under no_grad, so only the source branch
  trains att_i adversarially; true = the paper's objective, where att_i also moves the target features.
- ``discriminator_batches`` (separate): the code calls D on the source and on the target batch
  separately (each BatchNorm batch holds one domain) and averages the two BCE means; joint = one 2B
  batch, as eq. 5 is written. With equal batch sizes both are the same mean over 2B terms.
- Features given to D are L2-normalised, as in the code.

Ablations (Table VII): ``share_discriminator`` (D averaged like the FAM), ``local_bn`` (w/o shared BN:
the FAM's BatchNorm weights and statistics stay on each client, FedBN-style), ``lambda_da: 0`` (without
DA: the target batch still passes through the FAM in training mode, as in the code with a zero weight;
``target_pass: false`` drops it); the deeper FAM and the FAM layer sets of Table VIII are model options
(``variant``).

Under ``local_bn`` the server never holds trained BatchNorm, so it cannot score anything. Evaluation is
FedBN's: each client's test split is scored by that client's model (the averaged FAM with its own BN),
and a set no client owns (the global target) by the mean of the clients' models' class probabilities,
p(y | x) = (1/N) sum_i p_i(y | x) (an ensemble; the paper does not say, the table caption does).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..registry import register_method
from ._common.target_domain import TARGET_PASS_PARAMS, DomainAdaptation


class GradientReversal(torch.autograd.Function):
    """y = x forward; dL/dx = -coeff * dL/dy backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, coeff: float) -> torch.Tensor:
        ctx.coeff = coeff
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return -ctx.coeff * grad, None


def grad_reverse(x: torch.Tensor, coeff: float = 1.0) -> torch.Tensor:
    return GradientReversal.apply(x, coeff)


class DomainClassifier(nn.Module):
    """D: Linear(D, D) - BN - ReLU - Linear(D, D) - BN - ReLU - Linear(D, 1) - Sigmoid. ``forward`` returns
    the logit (the sigmoid is applied inside the loss, which is the same function, computed stably)."""

    def __init__(self, dim: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or dim
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


class FamWithDiscriminator(nn.Module):
    """The client's trainable modules: ``fam`` (predicts, communicated) and ``discriminator`` (local)."""

    def __init__(self, fam: nn.Module, discriminator: nn.Module):
        super().__init__()
        self.fam, self.discriminator = fam, discriminator

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:
        return self.fam(image_features)


def domain_adversarial_loss(discriminator: nn.Module, source: torch.Tensor, target: torch.Tensor, *,
                            coeff: float = 1.0, joint: bool = False) -> torch.Tensor:
    """Eq. 5 on D(GRL(features)): source domain label 1, target 0.

    separate: 1/2 [BCE(D(s), 1) + BCE(D(t), 0)], D called once per domain (the code);
    joint: the mean BCE over the concatenated 2B batch (eq. 5 as written)."""
    s, t = grad_reverse(source, coeff), grad_reverse(target, coeff)
    if joint:
        logits = discriminator(torch.cat([s, t]))
        labels = torch.cat([torch.ones(len(s)), torch.zeros(len(t))]).to(logits)
        return F.binary_cross_entropy_with_logits(logits, labels)
    ls, lt = discriminator(s), discriminator(t)
    return 0.5 * (F.binary_cross_entropy_with_logits(ls, torch.ones_like(ls))
                  + F.binary_cross_entropy_with_logits(lt, torch.zeros_like(lt)))


FAA_CLIP_PARAMS = {
    "lambda_da": {
        "description": "λ of eq. 6 (paper and code: 0.5); 0 = FAA-CLIP without DA (Table VII, Fig. 6; see target_pass)",
        "type": "number",
        "minimum": 0,
        "default": 0.5,
    },
    **TARGET_PASS_PARAMS,
    "grl_coeff": {
        "type": "number",
        "minimum": 0,
        "default": 1.0,
        "description": "gradient reversal coefficient (code: 1, its DANN schedule is off)",
    },
    "target_grad": {
        "description": "false = the target features are computed without gradient, only the source branch "
                       "trains the FAM adversarially (code); true = the paper's min-max over both domains",
        "type": "boolean",
        "default": False,
    },
    "discriminator_batches": {
        "description": "separate = D called on the source and the target batch separately, one domain per "
                       "BatchNorm batch (code); joint = one 2B batch (eq. 5 as written)",
        "enum": ["separate", "joint"],
        "default": "separate",
    },
    "share_discriminator": {
        "type": "boolean",
        "default": False,
        "description": "average D like the FAM (Table VII 'w/ shared D'); default: D stays local",
    },
    "local_bn": {
        "description": "keep the FAM's BatchNorm weights and statistics on each client (Table VII 'w/o shared "
                       "BN', FedBN); each client's test split is then scored by its own model, the global set "
                       "by the mean of the clients' models' probabilities",
        "type": "boolean",
        "default": False,
    },
    "discriminator_hidden": {
        "type": "integer",
        "minimum": 1,
        "description": "width of D's hidden layers (default: the feature dim; the code hard-codes 512)",
    },
}


@register_method("faa_clip", params=FAA_CLIP_PARAMS)
class FAACLIP(DomainAdaptation):
    def setup(self) -> None:
        super().setup()
        if self.params["local_bn"]:
            self.personalized = True      # every client is scored with its own BatchNorm

    def predict(self, dataset, client):
        """Under ``local_bn`` a set no client owns (client None) gets the mean of the clients' models' probabilities."""
        if client is None and self.params["local_bn"]:
            return np.mean([super(FAACLIP, self).predict(dataset, c) for c in self.fed.clients], axis=0)
        return super().predict(dataset, client)

    def build_model(self) -> nn.Module:
        fam = self.family.build()
        return FamWithDiscriminator(fam, DomainClassifier(self.family.dim, self.params.get("discriminator_hidden")))

    def shared_keys(self) -> list[str]:
        """The FAM (without its BatchNorm under ``local_bn``), plus D under ``share_discriminator``."""
        local_bn = {f"fam.{name}." for name, m in self.server.fam.named_modules()
                    if isinstance(m, nn.modules.batchnorm._BatchNorm)} if self.params["local_bn"] else set()
        keys = []
        for key in self.server.state_dict():
            if key.startswith("fam."):
                if not any(key.startswith(prefix) for prefix in local_bn):
                    keys.append(key)
            elif key.startswith("discriminator.") and self.params["share_discriminator"]:
                keys.append(key)
        return keys

    def target_needs_grad(self) -> bool:
        return self.params["target_grad"]

    def adaptation_loss(self, model, source_masked, batch, target_raw, target_masked):
        return domain_adversarial_loss(model.discriminator, F.normalize(source_masked, dim=-1),
                                       F.normalize(target_masked, dim=-1), coeff=self.params["grl_coeff"],
                                       joint=self.params["discriminator_batches"] == "joint")
