"""Model families: what a federated method trains, its base objective, and how it predicts.

A family turns a batch into an :class:`Output`: class scores for prediction, a representation
(what MOON or prototype methods contrast), and the *objective pairs* - (scores, targets) - whose
mean cross-entropy is the family's base loss. Generic algorithms (FedAvg, FedProx, MOON, FedFocal,
...) work on any family through this interface: FedFocal swaps the cross-entropy for a focal loss
over the same pairs, FedProx adds a proximal term to it, and so on.

A family registers itself with ``@register_model`` (:mod:`fedrepro.registry`): its name, what it
trains on (``input``), the schema of its hyper-parameters, and for image families its decode specs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..device import fp32, full_precision
from ..registry import register_model
from . import encoders
from .decoding import classifier_specs, clip_specs
from .encoders import FROZEN_ENCODER_SCHEMA
from .weights import clip_weights, timm_weights


@dataclass
class Output:
    logits: torch.Tensor                                   # B x C class scores
    features: torch.Tensor                                 # B x D representation
    objective: list[tuple[torch.Tensor, torch.Tensor]]     # (scores, integer targets) pairs
    extra: dict = field(default_factory=dict)


def cross_entropy_over(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Mean cross-entropy of (scores, targets) pairs, on fp32 scores (mixed precision: 16-bit logits are cast up)."""
    return sum(F.cross_entropy(fp32(scores), targets) for scores, targets in pairs) / len(pairs)


class ModelFamily:
    """Base: ``build`` a fresh module; ``forward`` a batch; ``loss`` defaults to cross-entropy."""

    input_kind = "images"
    task = "classification"               # how fedrepro.fl.evaluation scores it (classification | retrieval)
    extra_columns: tuple[str, ...] = ()   # manifest columns a batch must carry besides the image (e.g. caption)

    def __init__(self, cfg: dict, class_names: list[str], extras: dict):
        self.cfg, self.class_names, self.extras = cfg, list(class_names), extras
        self.num_classes = len(class_names)

    @classmethod
    def check_run(cls, params: dict, train: dict) -> list[str]:
        """What the family cannot train correctly with its block ``params`` (``train.model``) under the resolved train
        block ``train``: one line per problem, naming the key (``train/model/...``) and the fix; [] when it can. Asked
        before any job, as :meth:`fedrepro.fl.method.FederatedMethod.check_run`."""
        return []

    def build(self) -> nn.Module:
        raise NotImplementedError

    def forward(self, model: nn.Module, batch: dict) -> Output:
        raise NotImplementedError

    def loss(self, out: Output, batch: dict) -> torch.Tensor:
        return cross_entropy_over(out.objective)

    def class_scores(self, model: nn.Module, batch: dict) -> torch.Tensor:
        """B x C scores whose softmax is the prediction at evaluation (default: the training logits)."""
        return self.forward(model, batch).logits

    def train_transform(self):
        return None

    def eval_transform(self):
        return None

    # the authors' layouts this family can start from (``run["replay"]["layout"]``): name -> what it is
    authors_layouts: dict[str, str] = {}

    def authors_state(self, state: dict, layout: str | None, own: dict) -> dict:
        """A whole model saved by the authors' code (``state``, in their key ``layout``) under this family's keys
        (``own``: the built model's state dict, whose every key must be matched with its shape), for a replay
        (:mod:`fedrepro.fl.replay`). Families that know an authors' layout override this."""
        if layout not in self.authors_layouts:
            known = ", ".join(self.authors_layouts) or "none"
            raise ValueError(f"model family {type(self).__name__} cannot start from the authors' layout {layout!r} "
                             f"(it knows: {known})")
        raise NotImplementedError

    def to(self, device) -> "ModelFamily":
        """Move tensors the family holds (e.g. frozen text features) to ``device``."""
        return self

    def frozen_modules(self) -> dict[str, tuple[nn.Module, str]]:
        """Networks the family holds besides the trained model, for the memory estimate: name ->
        (module, "host" or "device")."""
        return {}


def build_family(cfg: dict, class_names: list[str], extras: dict) -> ModelFamily:
    """The model family registered as ``cfg["family"]``, configured by ``cfg`` (a resolved ``train.model``)."""
    from ..registry import model_class

    return model_class(cfg["family"])(cfg, class_names, extras)


# --------------------------------------------------------------------------------------------
# CLIP on cached image features

@full_precision
def clip_scores(image_features: torch.Tensor, text_features: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale`` x cosine similarity, rows = images, columns = texts."""
    return scale * F.normalize(image_features, dim=-1) @ F.normalize(text_features, dim=-1).t()


def clip_batch_objective(image_features, labels, class_text, scale) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The B x B image-text contrastive objective of the FedCLIP/FACMIC code: sample j's positive is
    the prompt of its own class; the other samples' prompts are negatives, including same-class
    duplicates (as in the authors' code). Both directions, averaged."""
    text = class_text[labels]
    scores = clip_scores(image_features, text, scale)
    targets = torch.arange(len(labels), device=labels.device)
    return [(scores, targets), (scores.t(), targets)]


class ClipOnFeatures(ModelFamily):
    """Shared plumbing for families trained on cached CLIP image features (input ``x``: B x D)."""

    input_kind = "features"

    def __init__(self, cfg, class_names, extras):
        super().__init__(cfg, class_names, extras)
        self.text = extras["text_features"].float()      # C x D, frozen, one prompt per class
        self.dim = self.text.shape[1]
        self.scale = float(cfg.get("logit_scale", 100.0))

    def to(self, device):
        self.text = self.text.to(device)
        return self

    def image_features(self, batch: dict) -> torch.Tensor:
        """The frozen CLIP image features I of a batch (what the module on top of CLIP adapts)."""
        return batch["x"]

    def forward(self, model: nn.Module, batch: dict) -> Output:
        return self.output_from(model(self.image_features(batch)), batch)

    def output_from(self, adapted: torch.Tensor, batch: dict) -> Output:
        return Output(
            logits=clip_scores(adapted, self.text, self.scale),
            features=adapted,
            objective=clip_batch_objective(adapted, batch["y"], self.text, self.scale) if batch["y"].min() >= 0 else [],
        )


class ClipAdapter(nn.Module):
    """FedCLIP's attention adapter: Linear -> Tanh -> Linear -> Softmax, used as a feature mask."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.attention = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, dim), nn.Softmax(dim=1))

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:
        return self.attention(image_features) * image_features


CLIP_ADAPTER_PARAMS = {
    "encoder": FROZEN_ENCODER_SCHEMA,
    "hidden": {"type": "integer", "minimum": 1, "description": "adapter width (default: feature dim)"},
    "logit_scale": {"type": "number", "exclusiveMinimum": 0, "default": 100.0},
}


@register_model("clip_adapter", input="features", params=CLIP_ADAPTER_PARAMS)
class ClipAdapterFamily(ClipOnFeatures):
    def build(self) -> nn.Module:
        return ClipAdapter(self.dim, int(self.cfg.get("hidden") or self.dim))


class ClipOnImages:
    """Mixin for a :class:`ClipOnFeatures` family: the frozen CLIP encoder runs on every batch of images,
    as the authors' code does, instead of reading cached features. Same model, same numbers (up to float
    rounding), many times slower: kept to check that equivalence and to time the code's path."""

    input_kind = "images"

    def __init__(self, cfg, class_names, extras):
        from .encoders import encode_prompts

        encoder = cfg["encoder"]
        self.encoder, self.preprocess, tokenizer = encoders.frozen_clip(encoder)
        device = next(self.encoder.parameters()).device     # the CPU (or meta: fedrepro.cost.memory)
        text = encode_prompts(self.encoder, tokenizer, encoder["prompt"], class_names, device)
        super().__init__(cfg, class_names, {**extras, "text_features": text})

    def to(self, device):
        self.encoder = self.encoder.to(device)
        return super().to(device)

    def frozen_modules(self):
        return {"frozen CLIP": (self.encoder, "device")}

    @torch.no_grad()
    def image_features(self, batch: dict) -> torch.Tensor:
        return self.encoder.encode_image(encoders.image_input(self.encoder, batch["x"])).float()

    def eval_transform(self):
        return encoders.encoder_transform(self.cfg["encoder"], self.encoder, self.preprocess)

    def train_transform(self):
        return self.eval_transform()   # deterministic, as in both papers' code (no augmentation)


@register_model("clip_adapter_images", input="images", params=CLIP_ADAPTER_PARAMS, decode=clip_specs, weights=clip_weights)
class ClipAdapterOnImages(ClipOnImages, ClipAdapterFamily):
    """FedCLIP's adapter with CLIP run on every batch (FAA-CLIP Table II times the code's path)."""


# --------------------------------------------------------------------------------------------
# timm classifiers on images

NORMALISATION = {
    "imagenet": (encoders.IMAGENET_MEAN, encoders.IMAGENET_STD),
    "clip": (encoders.CLIP_MEAN, encoders.CLIP_STD),
    "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}


class TimmClassifierNet(nn.Module):
    """A timm backbone whose pooled features feed a linear head (kept apart so methods can reach both)."""

    def __init__(self, backbone: nn.Module, num_classes: int, drop_rate: float):
        super().__init__()
        self.backbone = backbone
        self.dropout = nn.Dropout(drop_rate)
        self.head = nn.Linear(backbone.num_features, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.embed(x)
        return self.head(self.dropout(features)), features


CLASSIFIER_PARAMS = {
    "backbone": {"type": "string", "default": "resnet18"},
    "pretrained": {
        "description": "false, true (timm hub weights), or a checkpoint file (a path or package:<module>)",
        "oneOf": [{"type": "boolean"}, {"type": "string"}],
        "default": False,
    },
    "image_size": {"type": "integer", "minimum": 8, "default": 224},
    "in_chans": {"type": "integer", "default": 3},
    "drop_rate": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.0},
    "normalize": {"enum": ["imagenet", "clip", "half"], "default": "imagenet"},
    "augment": {"enum": ["none", "flip", "standard"], "default": "none"},
}


@register_model("classifier", input="images", params=CLASSIFIER_PARAMS, decode=classifier_specs,
                weights=timm_weights)
class TimmClassifierFamily(ModelFamily):
    def build(self) -> nn.Module:
        backbone = encoders.create_timm(self.cfg["backbone"], num_classes=0, pretrained=self.cfg["pretrained"],
                                        in_chans=self.cfg["in_chans"])
        return TimmClassifierNet(backbone, self.num_classes, self.cfg["drop_rate"])

    def forward(self, model, batch) -> Output:
        logits, features = model(batch["x"])
        objective = [(logits, batch["y"])] if batch["y"].min() >= 0 else []
        return Output(logits=logits, features=features, objective=objective)

    def _normalise(self):
        from torchvision import transforms as T

        mean, std = NORMALISATION[self.cfg["normalize"]]
        return T.Normalize(mean, std)

    def eval_transform(self):
        from torchvision import transforms as T

        size = self.cfg["image_size"]
        return T.Compose([T.Resize((size, size)), T.ToTensor(), self._normalise()])

    def train_transform(self):
        from torchvision import transforms as T

        size = self.cfg["image_size"]
        augment = {
            "none": [T.Resize((size, size))],
            "flip": [T.Resize((size, size)), T.RandomHorizontalFlip()],
            "standard": [T.RandomResizedCrop(size, scale=(0.6, 1.0)), T.RandomHorizontalFlip()],
        }[self.cfg["augment"]]
        return T.Compose([*augment, T.ToTensor(), self._normalise()])
