"""Decentralized (local-only) training: the lower reference of FedDRA's tables (docs/papers/feddra.md).

Every client trains its own model on its own data and nothing is communicated or aggregated; the
method is evaluated with every client's model (the paper reports "the averaged performance of the
local models": retrieval per client = mean over the local models, downstream = mean over them).

With ``federated_rounds = R > 0`` the first R rounds are plain FedAvg and every later round is local
training that starts from the client's own previous model (the first local round from the round-R
global model): the "local re-training after 25 communication turns" of Fig. 3b. The client models
of round R itself (each client's model after its local training in that round, before the
aggregation that makes the round-R server) are kept too and scored on every client's split as
``turn<R>.<model client>@<data client>`` and ``turn<R>.<data client>`` (mean over the models): the
figure's turn-25 rows.

With ``shallow_rounds = S > 0`` the last S rounds re-train only the shallow layers (patch/word
embeddings and the first ``shallow_blocks`` transformer blocks of both encoders) of every client's
own model on the *combined* training data of all clients, the deeper layers frozen: Fig. 3c
("re-training the first four shallow layers of the decentralized pre-trained model on the combined
local datasets"). The paper does not say for how long: the grid's one round of 50 local steps
(``shallow_rounds: 1``) is a guess.
"""

from __future__ import annotations

from ..fl.evaluation import score_models
from ..fl.federation import ClientData
from ..fl.method import ModelAveraging, _cpu
from ..registry import register_method
from .centralized import pool_datasets

DECENTRALIZED_PARAMS = {
    "federated_rounds": {
        "type": "integer",
        "minimum": 0,
        "default": 0,
        "description": "rounds of FedAvg before local training (Fig. 3b)",
        "x-counts": "rounds",
    },
    "shallow_rounds": {
        "description": "the last rounds re-train only the shallow layers of each client's model on all clients'"
                       " data (Fig. 3c; the paper does not say for how long: 1 round is a guess)",
        "x-counts": "rounds",
        "type": "integer",
        "minimum": 0,
        "default": 0,
    },
    "shallow_blocks": {"type": "integer", "minimum": 0, "default": 4},
}


@register_method("decentralized", params=DECENTRALIZED_PARAMS)
class Decentralized(ModelAveraging):
    personalized = True

    @classmethod
    def eval_prefixes(cls, params: dict) -> list[str]:
        return [f"turn{params['federated_rounds']}."] if params["federated_rounds"] else []

    def setup(self) -> None:
        super().setup()
        self.local_states = self.client_states("own_models")   # client -> its own full model after its last local round
        self.turn_states = self.client_states("turn_models")   # client -> its model after local training in round R
        self.rnd = 0
        if self.params["shallow_rounds"]:
            if not hasattr(self.work, "shallow_parameters"):
                raise ValueError("shallow_rounds needs a model with shallow_parameters() (the vlp family)")
            self.pooled = pool_datasets([c.train for c in self.fed.clients])

    def local_phase(self, rnd: int) -> bool:
        return rnd >= self.params["federated_rounds"]

    def shallow_phase(self, rnd: int) -> bool:
        return bool(self.params["shallow_rounds"]) and rnd >= self.ctx.train["rounds"] - self.params["shallow_rounds"]

    def trainable_parameters(self, model):
        if self.shallow_phase(self.rnd):
            return model.shallow_parameters(self.params["shallow_blocks"])
        return super().trainable_parameters(model)

    def broadcast(self, rnd):
        self.rnd = rnd
        return {} if self.local_phase(rnd) else super().broadcast(rnd)

    def load_client_model(self, client, message):
        if self.local_phase(self.rnd) or not message:
            own = self.local_states.get(client.name)
            state = own if own is not None else self.server.state_dict()
            self.work.load_state_dict({k: v.to(self.device) for k, v in state.items()})
            return self.work
        return super().load_client_model(client, message)

    def local_update(self, client, message, rnd):
        data = client
        if self.shallow_phase(rnd):   # client k's own model, trained on everyone's data
            data = ClientData(client.name, client.index, self.pooled, client.val, client.test)
        update = super().local_update(data, message, rnd)
        if self.params["federated_rounds"] and rnd == self.params["federated_rounds"] - 1:
            self.turn_states[client.name] = _cpu(self.work.state_dict())
        if self.local_phase(rnd):
            self.local_states[client.name] = _cpu(self.work.state_dict())
            update.payload = {}          # nothing leaves the client
        return update

    def aggregate(self, updates, rnd):
        if not self.local_phase(rnd):
            super().aggregate(updates, rnd)

    def model_for(self, client):
        if client is None or client.name not in self.local_states:
            return self.server
        return self.load_client_model(client, {})

    def evaluate(self, fed):
        metrics, preds = super().evaluate(fed)
        if self.turn_states and self.family.task == "retrieval":
            metrics.update(score_models(self, fed, self.turn_states, *self.eval_prefixes(self.params)))
        return metrics, preds

    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        layout["per_client"]["own_models"] = self.state_bytes()
        if self.params["federated_rounds"]:
            layout["per_client"]["turn_models"] = self.state_bytes()
        return layout

    def state_dict(self) -> dict:
        return {**super().state_dict(), "local": self.local_states.state_dict(), "turn": self.turn_states.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.local_states.load_state_dict(state["local"])
        self.turn_states.load_state_dict(state["turn"])

    def final_model(self) -> dict:
        """The server model (the initial or round-R global model) and every client's own model;
        downstream tasks evaluate each client model and report their mean."""
        return {**super().final_model(), "clients": self.local_states.materialise()}
