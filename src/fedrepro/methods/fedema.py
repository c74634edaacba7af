"""FedEMA (Zhuang, Wen and Zhang, "Divergence-aware Federated Self-Supervised Learning", ICLR 2022;
code EasyFL ``applications/fedssl``, ``--update_encoder dynamic_ema_online --update_predictor
dynamic_dapu --auto_scaler y``), adapted to image-text pre-training as FedDRA does
(docs/papers/feddra.md): BYOL on the image tower plus the backbone's image-text objective.

Instead of overwriting a client's model with the global one, FedEMA blends them by the client's
divergence:

    w_k <- mu w_k + (1 - mu) w_g,     mu = min(lambda_k d_k, 1),

with d_k the divergence of the client's previous local training as the code measures it (mean over
the online encoder's layers of the L2 distance between the weights at the start and at the end of
that training, :func:`~fedrepro.methods._common.selfsup.layer_divergence`) and the autoscaler
lambda_k = tau / d_k fixed at the first blend (so mu = tau then; tau = 0.7 as in FedEMA's run
command). ``divergence: paper`` uses the paper's d_k = ‖W_g − W_k‖₂ between the global online
encoder it receives and its own after its last round. The blend covers the parameters of everything the client communicates (encoders,
alignment modules, heads and predictor); buffers (BatchNorm statistics) are the global model's,
except the predictor's when mu > 0.5 (the code then blends into the local predictor). In its first
round a client takes the global model.
"""

from __future__ import annotations

from ..registry import register_method
from ._common.selfsup import BYOL_PARAMS, BYOLBaseline
from .fedu import PREDICTOR


def divergence_aware_mu(divergence: float, scale: float) -> float:
    """mu = min(lambda * divergence, 1)."""
    return min(scale * divergence, 1.0)


def ema_blend(own: dict, global_state: dict, mu: float, keys) -> dict:
    """mu * own + (1 - mu) * global for ``keys`` (the other entries of ``global_state`` unchanged)."""
    out = dict(global_state)
    for k in keys:
        out[k] = mu * own[k].to(global_state[k].device) + (1.0 - mu) * global_state[k]
    return out


FEDEMA_PARAMS = {
    "tau": {
        "type": "number",
        "minimum": 0,
        "default": 0.7,
        "description": "autoscaler target (FedEMA's tau = 0.7)",
    },
    **BYOL_PARAMS,
}


@register_method("fedema", params=FEDEMA_PARAMS)
class FedEMA(BYOLBaseline):
    def setup(self) -> None:
        super().setup()
        self.scales: dict[str, float] = {}        # client -> lambda_k (the autoscaler)
        self.mu: dict[str, float] = {}

    def load_client_model(self, client, message):
        model = super().load_client_model(client, message)
        own = self.local_models.get(client.name)
        if own is None:
            return model
        state = model.state_dict()
        divergence = self.divergence(client, state)
        if client.name not in self.scales:
            self.scales[client.name] = self.params["tau"] / max(divergence, 1e-12)
        mu = divergence_aware_mu(divergence, self.scales[client.name])
        self.mu[client.name] = mu
        blended = ema_blend(own, state, mu, [name for name, _ in model.named_parameters()])
        if mu > 0.5:   # the code blends the global predictor into the local one, whose buffers stay
            params = dict(model.named_parameters())
            blended.update({k: own[k].to(self.device) for k in own if k.startswith(PREDICTOR) and k not in params})
        model.load_state_dict(blended)
        return model

    def after_local_training(self, client, rnd):
        super().after_local_training(client, rnd)
        self.local_models[client.name] = {k: v.detach().cpu().clone() for k, v in self.work.state_dict().items()}

    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        layout["per_client"]["local_models"] = self.state_bytes()
        return layout

    def state_dict(self) -> dict:
        return {**super().state_dict(), "scales": self.scales}   # local_models: the base's store (every client's model)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.scales = state["scales"]
