"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017).

Each round every client starts from the global model, runs its local work on the model family's own
objective, and the server replaces the global model by the average of the client models, weighted
by client training-set size (``train.aggregation.weights: train_size``) or uniformly.
"""

from __future__ import annotations

from ..fl.method import ModelAveraging
from ..registry import register_method


@register_method("fedavg")
class FedAvg(ModelAveraging):
    """Model averaging with nothing added: the reference every other method is compared with."""
