"""The feature attention module (FAM) of FACMIC and FAA-CLIP, and the model families that train it.

FACMIC (Wu et al., MICCAI 2024, §2.1) and FAA-CLIP (its journal extension, §III) keep CLIP frozen and
train a small module a(.) on the image features I = e_I(x) in R^D whose output is a feature mask:

    I~ = a(I) ⊙ I,   a(I) in [0, 1]^D (a softmax over the D feature dimensions)
    p(y = c | x) = softmax_c( cos(I~, T_c) / tau ),  T_c = e_T("a picture of a {class}"),  1/tau = 100

The papers' FAM has five layers, L1 Linear(D, D) - L2 BatchNorm1d(D) - L3 LeakyReLU(0.01) - L4 Linear(D, D)
- L5 Softmax: 2 * (D^2 + D) + 2D = 526,336 trainable parameters for D = 512 (plus 2D BN running
statistics). FAA-CLIP's ablations remove layers (Table VIII: fea1 = L1+L5, fea2 = L1+L2+L5,
fea3 = L1+L2+L3+L5, fea4 = L1+L3+L4+L5, fea5 = all five; the check marks were lost in the paper
text, these sets follow the variants commented in the authors' models.py) or deepen it ("deeper":
Linear-BN-LeakyReLU-Linear-BN-LeakyReLU-Linear-Softmax, 790,016 parameters for D = 512, the
"nearly 1.5x" of the paper).

Two families train the same FAM:

- ``clip_fam`` (input: cached features): CLIP's image features are computed once per image by the
  feature-cache rule. With the papers' deterministic preprocessing this is exactly what the authors'
  code computes by re-encoding every batch, at a fraction of the cost.
- ``clip_fam_images`` (input: images): the authors' code path, the frozen encoder runs on every
  batch. Same model, same numbers (up to float rounding); kept to check that equivalence and to time
  it (benchmarks/facmic_cache.py, FAA-CLIP Table II).
"""

from __future__ import annotations

import torch
from torch import nn

from ..registry import register_model
from .decoding import clip_specs
from .encoders import FROZEN_ENCODER_SCHEMA
from .families import ClipOnFeatures, ClipOnImages
from .weights import clip_weights

FAM_VARIANTS: dict[str, tuple[str, ...]] = {
    "fea1": ("linear", "softmax"),
    "fea2": ("linear", "bn", "softmax"),
    "fea3": ("linear", "bn", "leaky", "softmax"),
    "fea4": ("linear", "leaky", "linear", "softmax"),
    "fea5": ("linear", "bn", "leaky", "linear", "softmax"),
    "deeper": ("linear", "bn", "leaky", "linear", "bn", "leaky", "linear", "softmax"),
}


def fam_layers(dim: int, hidden: int, variant: str, negative_slope: float = 0.01) -> list[nn.Module]:
    """The layers of a FAM variant. Linear layers go D -> H -> ... -> H -> D (a single one is D -> D)."""
    if variant not in FAM_VARIANTS:
        raise ValueError(f"unknown FAM variant {variant!r}; allowed: {sorted(FAM_VARIANTS)}")
    codes = FAM_VARIANTS[variant]
    n_linear = codes.count("linear")
    layers, width, seen = [], dim, 0
    for code in codes:
        if code == "linear":
            seen += 1
            out = dim if seen == n_linear else hidden
            layers.append(nn.Linear(width, out))
            width = out
        elif code == "bn":
            layers.append(nn.BatchNorm1d(width))
        elif code == "leaky":
            layers.append(nn.LeakyReLU(negative_slope))
        else:
            layers.append(nn.Softmax(dim=1))
    return layers


class FeatureAttention(nn.Module):
    """I -> a(I) ⊙ I, with a(.) one of :data:`FAM_VARIANTS`."""

    def __init__(self, dim: int, hidden: int | None = None, variant: str = "fea5", negative_slope: float = 0.01):
        super().__init__()
        self.attention = nn.Sequential(*fam_layers(dim, hidden or dim, variant, negative_slope))

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:
        return self.attention(image_features) * image_features


CLIP_FAM_PARAMS = {
    "encoder": FROZEN_ENCODER_SCHEMA,
    "variant": {
        "description": "fea1 = L1+L5, fea2 = L1+L2+L5, fea3 = L1+L2+L3+L5, fea4 = L1+L3+L4+L5, fea5 = all (L1 "
                       "Linear, L2 BN, L3 LeakyReLU, L4 Linear, L5 Softmax); deeper = "
                       "Linear-BN-LeakyReLU-Linear-BN-LeakyReLU-Linear-Softmax",
        "enum": ["fea1", "fea2", "fea3", "fea4", "fea5", "deeper"],
        "default": "fea5",
    },
    "hidden": {
        "type": "integer",
        "minimum": 1,
        "description": "width of the inner linear layers (default: the feature dim)",
    },
    "negative_slope": {"type": "number", "minimum": 0, "default": 0.01},
    "logit_scale": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 100.0,
        "description": "1/tau of eq. 3 (code: CLIP's frozen exp(t) = 100)",
    },
}


@register_model("clip_fam", input="features", params=CLIP_FAM_PARAMS)
class FamOnFeatures(ClipOnFeatures):
    """FAM on cached CLIP image features (``batch["x"]``: B x D); prompts' text features from the cache."""

    def build(self) -> nn.Module:
        return FeatureAttention(self.dim, self.cfg.get("hidden"), self.cfg["variant"], self.cfg["negative_slope"])


@register_model("clip_fam_images", input="images", params=CLIP_FAM_PARAMS, decode=clip_specs, weights=clip_weights)
class FamOnImages(ClipOnImages, FamOnFeatures):
    """FAM with the frozen CLIP encoder run on every batch of images, as the authors' code does."""
