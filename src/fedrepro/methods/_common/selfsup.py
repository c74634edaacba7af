"""Building blocks of the federated self-supervised baselines FedDRA adapts to image-text
pre-training (FedEMA, FedU: BYOL; FedX: contrastive + relational distillation). FedDRA (§5.1):
"to adapt uni-modal self-supervised learning baselines to our setting, we added an image-text
contrastive loss, applying the same hyper-parameters" — so each of these keeps its own image-side
objective on the image tower (E_I -> A_I -> g_I) and adds the backbone objective of the ``vlp`` family.

- Views: two random augmentations of the image batch (random resized crop + horizontal flip),
  drawn from the global RNG the engine seeds per (seed, round, client).
- BYOL (Grill et al., NeurIPS 2020) as FedU/FedEMA's code (EasyFL ``applications/fedssl``) runs it:
  online embedding z -> predictor q; target = EMA of the online image tower (momentum 0.99, applied
  after every optimiser step); L = mean_batch [2 - 2 cos(q(z_1), z'_2) + 2 - 2 cos(q(z_2), z'_1)]
  (the two directions summed). In a client's first round the target *is* the online tower (the code
  assigns the same module to both), so the target gives the online tower's own, detached outputs.
- Model divergence as FedU/FedEMA's code measures it: the mean, over the online encoder's layers, of
  the L2 distance between a layer's weights at the start and at the end of the client's local
  training (the code counts a ResNet's convolutions; here the ViT image encoder's weight matrices).
- NT-Xent (SimCLR, Chen et al. 2020) and the relational loss of FedX (code Sungwon-Han/FEDX): both
  views' similarity distributions over a set of anchors are pulled to their (sharpened) mixture.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...device import full_precision
from ...fl.method import ModelAveraging
from ...models.vlp import require_vlp

IMAGE_TOWER = ("image_encoder.", "image_align.", "image_head.")


def two_views(x: torch.Tensor, min_scale: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Two augmented copies of an image batch (per sample: random square crop of area fraction in
    [min_scale, 1] resized back, random horizontal flip)."""
    return augment(x, min_scale), augment(x, min_scale)


def augment(x: torch.Tensor, min_scale: float = 0.5) -> torch.Tensor:
    b, _, h, w = x.shape
    out = torch.empty_like(x)
    for i in range(b):
        scale = min_scale + (1 - min_scale) * float(torch.rand(()))
        ch, cw = max(1, int(round(h * math.sqrt(scale)))), max(1, int(round(w * math.sqrt(scale))))
        top = int(torch.randint(0, h - ch + 1, ()))
        left = int(torch.randint(0, w - cw + 1, ()))
        crop = x[i:i + 1, :, top:top + ch, left:left + cw]
        crop = F.interpolate(crop, size=(h, w), mode="bilinear", align_corners=False)
        out[i] = crop[0].flip(-1) if float(torch.rand(())) < 0.5 else crop[0]
    return out


@full_precision
def byol_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """2 - 2 cos(q, z') per sample (target detached), averaged over the batch."""
    return (2 - 2 * F.cosine_similarity(prediction, target.detach(), dim=-1)).mean()


@full_precision
def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's NT-Xent: for each of the 2B embeddings, its other view is the positive and the
    remaining 2B - 2 embeddings are negatives."""
    z = F.normalize(torch.cat([z1, z2]), dim=-1)
    n = len(z1)
    logits = z @ z.t() / temperature
    logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(logits, targets)


@full_precision
def relational_loss(a: torch.Tensor, b: torch.Tensor, anchors: torch.Tensor, temperature: float,
                    target_temperature: float) -> torch.Tensor:
    """FedX's relational loss (its ``js_loss``): with r(x) = cos(x, anchors), the two views' relation
    distributions p_a = softmax(r(a)/τ), p_b = softmax(r(b)/τ) are both pulled to the mixture
    m = ½ [softmax(r(a)/τ_t) + softmax(r(b)/τ_t)]: ½ [KL(m ‖ p_a) + KL(m ‖ p_b)], averaged over the
    batch. As in FedX's code, gradients flow through the mixture and through the anchors (the caller
    detaches what FedX computes without gradient)."""
    anchors = F.normalize(anchors, dim=-1)
    sim_a = F.normalize(a, dim=-1) @ anchors.t()
    sim_b = F.normalize(b, dim=-1) @ anchors.t()
    mixture = 0.5 * (torch.softmax(sim_a / target_temperature, dim=1) + torch.softmax(sim_b / target_temperature, dim=1))
    kl_a = F.kl_div(torch.log_softmax(sim_a / temperature, dim=1), mixture, reduction="batchmean")
    kl_b = F.kl_div(torch.log_softmax(sim_b / temperature, dim=1), mixture, reduction="batchmean")
    return 0.5 * (kl_a + kl_b)


@torch.no_grad()
def ema_(target: nn.Module, online: nn.Module, momentum: float, prefixes: tuple[str, ...] = ()) -> None:
    """target <- m target + (1 - m) online, for the parameters whose names start with ``prefixes``."""
    online_params = dict(online.named_parameters())
    for name, p in target.named_parameters():
        if not prefixes or name.startswith(prefixes):
            p.mul_(momentum).add_(online_params[name].detach(), alpha=1 - momentum)


def state_distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], keys) -> float:
    """‖a − b‖₂ over the floating-point tensors ``keys`` (model divergence)."""
    total = 0.0
    for k in keys:
        if a[k].is_floating_point():
            total += float(((a[k].float() - b[k].float().to(a[k].device)) ** 2).sum())
    return math.sqrt(total)


def layer_divergence(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], keys) -> float:
    """FedU/FedEMA's divergence: the mean over layers (``keys``) of ‖after_l − before_l‖₂."""
    keys = list(keys)
    if not keys:
        raise ValueError("no layers to measure the divergence on")
    return sum(float(torch.dist(after[k].double(), before[k].double().to(after[k].device))) for k in keys) / len(keys)


def encoder_layers(model: nn.Module) -> list[str]:
    """The online encoder's layers FedU/FedEMA's divergence counts: the image encoder's convolution
    and linear weight matrices (the code's ``'conv' in name and 'weight' in name`` on a ResNet)."""
    return [n for n, p in model.named_parameters() if n.startswith("image_encoder.") and n.endswith(".weight") and p.ndim >= 2]


class Predictor(nn.Module):
    """BYOL's predictor MLP: Linear -> BN -> ReLU -> Linear."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True), nn.Linear(hidden, dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class ImageSelfSupervised(ModelAveraging):
    """Model averaging of a ``vlp`` model that carries a predictor (``model.predictor``, shared and
    averaged like the rest) for an image-side self-supervised objective."""

    def setup(self) -> None:
        require_vlp(self)
        super().setup()

    def make_predictor(self, dim: int) -> nn.Module:
        return Predictor(dim, self.params["predictor_hidden"])

    def build_model(self) -> nn.Module:
        model = super().build_model()
        model.predictor = self.make_predictor(self.ctx.train["model"]["head"]["dim"])
        return model


# the params BYOLBaseline reads; FedEMA and FedU include them in their own schemas
BYOL_PARAMS = {
    "divergence": {
        "description": "code = the mean, over the online image encoder's weight matrices, of the L2 distance "
                       "they moved in the client's last local training (the code); paper = ||W_global - W_k||_2"
                       " between the global online encoder the client now receives and its own after its last "
                       "round, over the same layers",
        "enum": ["code", "paper"],
        "default": "code",
    },
    "byol_weight": {"type": "number", "minimum": 0, "default": 1.0},
    "target_momentum": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.99},
    "predictor_hidden": {"type": "integer", "minimum": 1, "default": 512},
}


class BYOLBaseline(ImageSelfSupervised):
    """BYOL on the image tower + the backbone objective. Each client keeps its own target tower (never
    communicated): in its first round the target is the online tower itself; afterwards the target
    it ended its previous round with, moved towards the online tower after every optimiser step.
    After local training the client's divergence (:func:`layer_divergence` of the online image
    encoder between the start and the end of its training) is recorded for FedU/FedEMA's rules."""

    def setup(self) -> None:
        super().setup()
        self.target = copy.deepcopy(self.work).requires_grad_(False)
        self.targets = self.client_states("targets")     # client -> target image-tower state
        self.divergences: dict[str, float] = {}  # client -> divergence of its last local training
        self.encoders = self.client_states("encoders")   # client -> its online encoder's layers after its last round
        self.layers = encoder_layers(self.work)
        self.aliased, self.steps, self.start = False, 0, {}

    def before_local_training(self, client, rnd):
        state = self.work.state_dict()
        self.start = {k: state[k].detach().clone() for k in self.layers}
        self.steps = 0
        own = self.targets.get(client.name)
        self.aliased = own is None
        if own is not None:
            self.target.load_state_dict({**state, **{k: v.to(self.device) for k, v in own.items()}})
            self.target.train()

    def after_local_training(self, client, rnd):
        if not self.aliased:
            ema_(self.target, self.work, self.params["target_momentum"], IMAGE_TOWER)   # after the last step
        source = self.work if self.aliased else self.target
        self.targets[client.name] = {k: v.detach().cpu().clone() for k, v in source.state_dict().items()
                                     if k.startswith(IMAGE_TOWER)}
        state = self.work.state_dict()
        self.divergences[client.name] = layer_divergence(self.start, state, self.layers)
        self.encoders[client.name] = {k: state[k].detach().cpu().clone() for k in self.layers}

    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        layout["device_models"] += 1                 # the target network
        state = self.server.state_dict()
        layout["per_client"]["targets"] = self.state_bytes({k for k in state if k.startswith(IMAGE_TOWER)})
        layout["per_client"]["encoders"] = self.state_bytes(set(encoder_layers(self.server)))
        return layout

    def divergence(self, client, received: dict) -> float:
        """The divergence FedU's and FedEMA's rules use when ``client`` receives the global model:
        ``code`` = the mean per-layer distance its online encoder moved in its last local training
        (the code); ``paper`` = ‖W_global − W_k‖₂ between the online encoder it receives now and the
        one it ended its last round with (the papers' formula), over the same layers."""
        if self.params["divergence"] == "code":
            return self.divergences[client.name]
        return state_distance(received, self.encoders[client.name], self.layers)

    def byol(self, model, x: torch.Tensor) -> torch.Tensor:
        if not self.aliased and self.steps > 0:
            ema_(self.target, model, self.params["target_momentum"], IMAGE_TOWER)   # after the previous step
        self.steps += 1
        v1, v2 = two_views(x)
        z1, z2 = self.family.image_embedding(model, v1), self.family.image_embedding(model, v2)
        target = model if self.aliased else self.target
        with torch.no_grad():
            t1, t2 = self.family.image_embedding(target, v1), self.family.image_embedding(target, v2)
        return byol_loss(model.predictor(z1), t2) + byol_loss(model.predictor(z2), t1)

    def local_loss(self, model, batch, client, rnd):
        out = self.family.forward(model, batch)
        loss = self.family.loss(out, batch) + self.params["byol_weight"] * self.byol(model, batch["x"])
        return loss, out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "targets": self.targets.state_dict(), "divergences": self.divergences,
                "encoders": self.encoders.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.targets.load_state_dict(state["targets"])
        self.divergences = state["divergences"]
        self.encoders.load_state_dict(state["encoders"])

