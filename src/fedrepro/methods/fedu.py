"""FedU (Zhuang et al., "Collaborative Unsupervised Visual Representation Learning from
Decentralized Data", ICCV 2021; code EasyFL ``applications/fedssl``, ``--update_predictor dapu``),
adapted to image-text pre-training as FedDRA does (docs/papers/feddra.md): BYOL on the image tower
plus the backbone's image-text objective.

Clients upload their online model and predictor; the server averages them. A client always takes
the global online model (and keeps its own target), but takes the global predictor only if its
online encoder did not drift far in its previous round (divergence-aware predictor update, DAPU):

    predictor_k <- predictor_g   if  d_k < mu,   else keep predictor_k,

    d_k = mean over the online encoder's layers l of ‖W_l(end of k's last local training) − W_l(its start)‖₂

(:func:`~fedrepro.methods._common.selfsup.layer_divergence`; the start of FedU's local training is the global
online encoder). The decision is made when a client finishes training and applied when it next
receives the global model; in its first round a client takes everything global. mu = 0.4, FedU's
``--dapu_threshold``. ``divergence: paper`` measures instead ‖W_g − W_k‖₂ between the global online
encoder the client now receives and its own after its last round, as FedU's paper writes it.
"""

from __future__ import annotations

from ..registry import register_method
from ._common.selfsup import BYOL_PARAMS, BYOLBaseline

PREDICTOR = ("predictor.",)


def keep_local_predictor(divergence: float, threshold: float) -> bool:
    """FedU's rule: the local predictor stays when the encoder's divergence is >= mu."""
    return divergence >= threshold


FEDU_PARAMS = {
    "threshold": {
        "description": "mu of the divergence-aware predictor update: a client takes the global predictor when "
                       "the mean per-layer L2 divergence of its online image encoder over its last local "
                       "training is below mu (FedU's code, --dapu_threshold 0.4)",
        "type": "number",
        "minimum": 0,
        "default": 0.4,
    },
    **BYOL_PARAMS,
}


@register_method("fedu", params=FEDU_PARAMS)
class FedU(BYOLBaseline):
    def setup(self) -> None:
        super().setup()
        self.predictors = self.client_states("predictors")   # client -> its predictor after its last round
        self.kept: dict[str, bool] = {}

    def load_client_model(self, client, message):
        model = super().load_client_model(client, message)
        own = self.predictors.get(client.name)
        if own is None:
            return model
        self.kept[client.name] = keep_local_predictor(self.divergence(client, model.state_dict()), self.params["threshold"])
        if self.kept[client.name]:
            model.load_state_dict({**model.state_dict(), **{k: v.to(self.device) for k, v in own.items()}})
        return model

    def after_local_training(self, client, rnd):
        super().after_local_training(client, rnd)
        self.predictors[client.name] = {k: v.detach().cpu().clone() for k, v in self.work.state_dict().items()
                                        if k.startswith(PREDICTOR)}

    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        layout["per_client"]["predictors"] = self.state_bytes({k for k in self.server.state_dict() if k.startswith(PREDICTOR)})
        return layout

    def state_dict(self) -> dict:
        return {**super().state_dict(), "predictors": self.predictors.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.predictors.load_state_dict(state["predictors"])
