"""FedX (Han et al., "FedX: Unsupervised Federated Learning with Cross Knowledge Distillation",
ECCV 2022; code Sungwon-Han/FEDX), adapted to image-text pre-training as FedDRA does
(docs/papers/feddra.md): FedX's four image-side terms on the image tower plus the backbone's
image-text objective.

Each local step takes two augmented views x1, x2 of the batch and the (augmented) images xr of a
separate random batch of the client's data (FedX's second, independently shuffled loader), and
runs the image tower on [x1; x2; xr] at once: z = its embeddings (FedX's projection), p =
predictor(z) (FedX's prediction MLP, Linear-ReLU-Linear); the frozen global model the client
received runs on the same images in evaluation mode: g. With NT-Xent at temperature τ and the
relational loss R(a, b; anchors) of :func:`~fedrepro.methods._common.selfsup.relational_loss`:

    local:   NT-Xent(z1, z2)   + R(z1, z2; anchors z_r, target temperature τ_s)
    global:  NT-Xent(p1, g2)   + R(p1, p2; anchors g_r, target temperature τ_t)

summed (weight 1 each). The local anchors carry gradients, the global ones do not. Aggregation is
FedAvg (the predictor is averaged with the rest).
"""

from __future__ import annotations

import copy
from typing import Iterator

import torch
from torch import nn

from ..data.loader import batches
from ..device import full_precision
from ..registry import register_method
from ..seeding import torch_generator
from ._common.selfsup import ImageSelfSupervised, augment, nt_xent, relational_loss, two_views


@full_precision
def fedx_losses(z: torch.Tensor, p: torch.Tensor, g: torch.Tensor, n: int, temperature: float,
                student_temperature: float, teacher_temperature: float) -> dict[str, torch.Tensor]:
    """FedX's four terms from the local embeddings ``z``, predictions ``p`` and global embeddings
    ``g`` of [view 1; view 2; random batch] (the first two parts have ``n`` rows each)."""
    z1, z2, zr = z[:n], z[n:2 * n], z[2 * n:]
    p1, p2 = p[:n], p[n:2 * n]
    g2, gr = g[n:2 * n].detach(), g[2 * n:].detach()
    return {
        "local_contrastive": nt_xent(z1, z2, temperature),
        "global_contrastive": nt_xent(p1, g2, temperature),
        "global_relational": relational_loss(p1, p2, gr, temperature, teacher_temperature),
        "local_relational": relational_loss(z1, z2, zr, temperature, student_temperature),
    }


class PredictionMLP(nn.Sequential):
    """FedX's prediction head: Linear -> ReLU -> Linear."""

    def __init__(self, dim: int, hidden: int):
        super().__init__(nn.Linear(dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, dim))


FEDX_PARAMS = {
    "temperature": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.1,
        "description": "NT-Xent and relation-distribution temperature (FedX --temperature)",
    },
    "student_temperature": {
        "description": "temperature of the local relational loss's target mixture (FedX --ts; its run command "
                       "leaves the default 0.1; the loss function's own default, a sharper 0.01, is the other "
                       "reading)",
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.1,
    },
    "teacher_temperature": {
        "description": "temperature of the global relational loss's target mixture (FedX --tt, default 0.1; "
                       "0.01 = the sharper reading)",
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.1,
    },
    "weight": {
        "type": "number",
        "minimum": 0,
        "default": 1.0,
        "description": "weight of the four FedX terms together",
    },
    "predictor_hidden": {
        "description": "hidden width of FedX's prediction MLP (Linear-ReLU-Linear); null = the embedding "
                       "dimension (FedX)",
        "oneOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
        "default": None,
    },
}


@register_method("fedx", params=FEDX_PARAMS)
class FedX(ImageSelfSupervised):
    def setup(self) -> None:
        super().setup()
        self.global_model = copy.deepcopy(self.work).requires_grad_(False)
        self.anchor_stream: Iterator[dict] | None = None

    def make_predictor(self, dim: int) -> nn.Module:
        return PredictionMLP(dim, self.params["predictor_hidden"] or dim)

    def random_batches(self, client, rnd: int) -> Iterator[dict]:
        """FedX's random loader: the client's data reshuffled on its own stream, passes repeated."""
        train = self.ctx.train
        p = 0
        while True:
            empty = True
            for batch in batches(client.train, train["batch_size"], shuffle=True,
                                 generator=torch_generator(self.ctx.seed, "fedx-random", rnd, client.index, p),
                                 drop_last=train["local"].get("drop_last", False)):
                empty = False
                yield batch
            if empty:
                return
            p += 1

    def before_local_training(self, client, rnd):
        self.global_model.load_state_dict(self.work.state_dict())
        self.global_model.eval()
        self.anchor_stream = self.random_batches(client, rnd)

    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        layout["device_models"] += 1                 # the frozen global model
        return layout

    def local_loss(self, model, batch, client, rnd):
        out = self.family.forward(model, batch)
        v1, v2 = two_views(batch["x"])
        xr = augment(self.to_device(next(self.anchor_stream))["x"])
        images = torch.cat([v1, v2, xr])
        z = self.family.image_embedding(model, images)
        with torch.no_grad():
            g = self.family.image_embedding(self.global_model, images)
        terms = fedx_losses(z, model.predictor(z), g, len(v1), self.params["temperature"],
                            self.params["student_temperature"], self.params["teacher_temperature"])
        return self.family.loss(out, batch) + self.params["weight"] * sum(terms.values()), out
