"""What FedProx and MOON share: which global model their regulariser looks at, and from which client
update on it is applied.

- ``anchor: round_start`` (FedProx and MOON as published, FACMIC's code): the global model the
  clients received at the start of this round, G_r.
- ``anchor: previous_round`` (FAA-CLIP's code): the global model the *previous* round started from,
  G_{r-1} (G_0 in the first two rounds). Its ``server_model_pre`` is a deep copy of the server taken
  before each aggregation, so in round r the clients start from G_r but are pulled towards G_{r-1}.
- ``warmup_updates: n``: the first n client updates of the run train without the regulariser. Both
  papers' code gates it with ``args.step > 0``, a counter of client updates that is never reset, so
  only the very first update (client 0 in round 0) is unregularised: n = 1. An update's number is
  rnd x (participants per round) + its position in the round.
"""

from __future__ import annotations

import torch

from ...fl.federation import ClientData
from ...fl.method import ModelAveraging

# the params GlobalAnchor reads; FedProx and MOON include them in their own schemas
GLOBAL_ANCHOR_PARAMS = {
    "anchor": {
        "description": "the global model the regulariser looks at: round_start = the one this round started "
                       "from; previous_round = the one the previous round started from (FAA-CLIP's code)",
        "enum": ["round_start", "previous_round"],
        "default": "round_start",
    },
    "warmup_updates": {
        "description": "the first n client updates of the run go without the regulariser (FACMIC/FAA-CLIP code:"
                       " 1, gated by args.step > 0)",
        "type": "integer",
        "minimum": 0,
        "default": 0,
    },
}


class GlobalAnchor(ModelAveraging):
    def setup(self) -> None:
        super().setup()
        self.previous_start: dict[str, torch.Tensor] | None = None   # G_{r-1}, kept for anchor: previous_round

    def anchor_state(self) -> dict[str, torch.Tensor]:
        """The shared tensors of the anchor model for the round under way (call after the client's model is loaded)."""
        if self.params["anchor"] == "previous_round" and self.previous_start is not None:
            return {k: v.to(self.device) for k, v in self.previous_start.items()}
        state = self.work.state_dict()
        return {k: state[k] for k in self.shared}

    def regularised(self, client: ClientData, rnd: int) -> bool:
        """Whether this client update adds the regulariser (not during the first ``warmup_updates`` updates)."""
        participants = [c.name for c in self.participants()]
        number = rnd * len(participants) + participants.index(client.name)
        return number >= self.params["warmup_updates"]

    def aggregate(self, updates, rnd):
        if self.params["anchor"] == "previous_round":
            state = self.server.state_dict()
            self.previous_start = {k: state[k].detach().cpu().clone() for k in self.shared}
        super().aggregate(updates, rnd)

    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        if self.params["anchor"] == "previous_round":
            layout["host_extra"] += self.state_bytes(set(self.shared))
        return layout

    def state_dict(self) -> dict:
        return {**super().state_dict(), "previous_start": self.previous_start}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.previous_start = state.get("previous_start")
