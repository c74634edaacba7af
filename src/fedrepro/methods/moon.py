"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021).

Besides the family's loss, each client pulls its representation z of an input towards the global
model's representation z_glob and away from its own previous round's representation z_prev:

    l_con = -log( exp(cos(z, z_glob)/tau) / (exp(cos(z, z_glob)/tau) + exp(cos(z, z_prev)/tau)) )
    L = L_task + mu * l_con

z_glob comes from a frozen copy of the anchor global model (the one this round started from, or under
``anchor: previous_round`` the one the previous round started from, as FAA-CLIP's code does; see
:mod:`fedrepro.methods._common.global_anchor`, which also handles ``warmup_updates``). z_prev depends on
``previous``:

- ``last_local`` (MOON; FAA-CLIP's code): a frozen copy of the client's own model at the end of its
  previous round (the global model in its first round);
- ``current`` (FACMIC's code, whose ``previous_nets`` are the very models being trained): the current
  model's own representation, so cos(z, z_prev) = 1 and no gradient flows through the negative.

For CLIP the representation is the image embedding (the code contrasts image features only).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ..device import full_precision
from ..registry import register_method
from ._common.global_anchor import GLOBAL_ANCHOR_PARAMS, GlobalAnchor


@full_precision
def model_contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    pos = F.cosine_similarity(z, z_glob, dim=-1) / tau
    neg = F.cosine_similarity(z, z_prev, dim=-1) / tau
    logits = torch.stack([pos, neg], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


MOON_PARAMS = {
    "mu": {"type": "number", "minimum": 0, "default": 1.0},
    "tau": {"type": "number", "exclusiveMinimum": 0, "default": 0.5},
    "previous": {
        "description": "z_prev from: last_local = the client's own model at the end of its previous round "
                       "(MOON; FAA-CLIP's code); current = the model being trained (FACMIC's code, whose "
                       "previous_nets are the current models)",
        "enum": ["last_local", "current"],
        "default": "last_local",
    },
    **GLOBAL_ANCHOR_PARAMS,
}


@register_method("moon", params=MOON_PARAMS)
class MOON(GlobalAnchor):
    def setup(self) -> None:
        super().setup()
        self.global_model = copy.deepcopy(self.work).eval().requires_grad_(False)
        self.previous_model = copy.deepcopy(self.work).eval().requires_grad_(False) if self.keeps_previous() else None
        self.previous_states = self.client_states("previous")   # client -> its model at the end of its last round

    def keeps_previous(self) -> bool:
        return self.params["previous"] == "last_local"

    def before_local_training(self, client, rnd):
        super().before_local_training(client, rnd)
        state = self.work.state_dict()
        self.global_model.load_state_dict({**state, **self.anchor_state()})
        if self.keeps_previous():
            self.previous_model.load_state_dict(self.previous_states.get(client.name, state))
        self.active = self.regularised(client, rnd)

    def after_local_training(self, client, rnd):
        super().after_local_training(client, rnd)
        if self.keeps_previous():
            self.previous_states[client.name] = {k: v.detach().cpu().clone() for k, v in self.work.state_dict().items()}

    def local_loss(self, model, batch, client, rnd):
        loss, out = super().local_loss(model, batch, client, rnd)
        if not self.active:
            return loss, out
        with torch.no_grad():
            z_glob = self.family.forward(self.global_model, batch).features
            z_prev = self.family.forward(self.previous_model, batch).features if self.keeps_previous() else out.features.detach()
        return loss + self.params["mu"] * model_contrastive_loss(out.features, z_glob, z_prev, self.params["tau"]), out

    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        layout["device_models"] += 2 if self.keeps_previous() else 1          # the global (and previous) model
        if self.keeps_previous():
            layout["per_client"]["previous"] = self.state_bytes()
        return layout

    def state_dict(self) -> dict:
        return {**super().state_dict(), "previous": self.previous_states.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.previous_states.load_state_dict(state["previous"])
