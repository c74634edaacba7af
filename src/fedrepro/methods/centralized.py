"""Centralized training: the pooled-data reference the papers list above their FL methods.

All clients' training (and validation) data are pooled into one participant, which trains the
same model family; evaluation still reports every original client's test split and the global test
set, so the numbers line up with the federated rows.

The local work per round (``params.budget``): ``client`` = one client's local work (``train.local``
as it is: with ``local.steps`` the pooled model takes 1/K of the federation's gradient steps);
``federation`` = the federation's total, K times ``local.steps`` per round, so centralized and
federated pre-training see the same number of batches (FedDRA's Centralized / FedGlobal rows). With
``local.epochs`` the two coincide: an epoch over the pooled data is one over every client's data.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch.utils.data import ConcatDataset

from ..data.loader import FeatureSet
from ..fl.federation import ClientData
from ..fl.method import ModelAveraging
from ..registry import register_method


def pool_datasets(parts: list):
    """The union of several client datasets (cached features are concatenated, so batches stay fast)."""
    parts = [p for p in parts if len(p)]
    if not parts:   # e.g. no client has a validation split
        return FeatureSet(torch.zeros(0, 0), torch.zeros(0, dtype=torch.long), np.zeros(0, dtype=np.int64))
    if all(isinstance(p, FeatureSet) for p in parts):
        return FeatureSet(torch.cat([p.features for p in parts]), torch.cat([p.labels for p in parts]),
                          torch.cat([p.rows for p in parts]).numpy())
    pooled = ConcatDataset(parts)
    pooled.labels = np.concatenate([np.asarray(p.labels) for p in parts])
    return pooled


CENTRALIZED_PARAMS = {
    "budget": {
        "description": "local work per round of the pooled model: client = one client's (train.local as it is; "
                       "with local.steps that is 1/K of the federation's gradient steps); federation = K times "
                       "local.steps, the federation's total (same number of batches as the federated runs). "
                       "Equal under local.epochs.",
        "enum": ["client", "federation"],
        "default": "client",
    },
}


@register_method("centralized", params=CENTRALIZED_PARAMS)
class Centralized(ModelAveraging):
    def setup(self) -> None:
        super().setup()
        clients = self.fed.clients
        self.pooled = ClientData("pooled", 0, pool_datasets([c.train for c in clients]),
                                 pool_datasets([c.val for c in clients]), pool_datasets([c.test for c in clients]))

    @classmethod
    def caption_note(cls, params: dict) -> str:
        if params.get("budget", "client") == "client":
            return ("trains one client's local work per round on the pooled data: with a fixed number of local steps "
                    "that is 1/K of the federation's gradient steps (K clients); with local epochs, one epoch over "
                    "the pooled data")
        return "trains the federation's local work per round on the pooled data (K clients x the local steps)"

    def participants(self) -> list[ClientData]:
        return [self.pooled]

    def local_config(self, client, rnd):
        train = self.ctx.train
        if self.params.get("budget", "client") == "federation" and "steps" in train["local"]:
            train = copy.deepcopy(train)
            train["local"]["steps"] *= len(self.fed.clients)
        return train
