"""Centralized training on a fully fine-tuned CLIP (FACMIC Table 2's upper reference), one round.

Specification (FACMIC's code with the ``SkinCen`` dataset key: one client holding every training image):
the training parts of all clients are pooled into a single participant, which runs the FedAvg recipe
(both CLIP encoders and the temperature, Adam, B x B contrastive loss; see test_clip_fedavg.py); its
model is the global model. Every client's test split and the global set are scored with that model,
softmax(100 cos), so the row lines up with the federated ones.
"""

import numpy as np
import pytest
import torch

from fedrepro.fl.federation import ClientData

from .clip_spec import check_full_clip, clip_loss
from .harness import TensorImages

pytestmark = pytest.mark.usefixtures("one_thread")


def pooled(fed) -> list[ClientData]:
    """One site holding every client's training part, in client order."""
    parts = [c.train for c in fed.clients]
    data = TensorImages(torch.cat([p.images for p in parts]), np.concatenate([p.labels for p in parts]),
                        np.concatenate([p.rows for p in parts]))
    return [ClientData("pooled", 0, data, None, None)]


def test_centralized_full_clip_matches_the_specification(tmp_path):
    check_full_clip(tmp_path, "facmic", "centralized", lambda tokens: lambda model, batch, ctx: clip_loss(
        model, tokens, batch["x"], batch["y"]), steps=3, clients=pooled)
