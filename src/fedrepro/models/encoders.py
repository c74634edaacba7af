"""Encoders by name: open_clip models (name + pretrained tag, a local checkpoint, or random init)
and timm backbones.

- ``pretrained="openai"`` (or any open_clip tag) downloads weights the normal way (real use).
- ``pretrained="/path/to/open_clip_pytorch_model.bin"`` loads a local checkpoint (offline clusters).
- ``name="local-dir:/path"`` loads an open_clip export folder (config + weights).
- ``pretrained="none"`` builds a random-init model; with ``name="fedrepro-tiny-clip"`` (a 64-px,
  2-layer config shipped with this package) that is what tests and the demo use.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

CONFIG_DIR = Path(__file__).parent / "configs"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

ENCODER_SCHEMA = {   # train.model.encoder of the CLIP families
    "description": "A frozen open_clip encoder (its image features are cached once per image where the family "
                   "trains on features).",
    "type": "object",
    "additionalProperties": False,
    "default": {},
    "properties": {
        "name": {"type": "string", "default": "ViT-B-16"},
        "pretrained": {
            "description": 'open_clip pretrained tag (e.g. openai), a local checkpoint path, or "none" (random init)',
            "type": "string",
            "default": "openai",
        },
        "preprocess": {
            "description": "clip = open_clip's own transform (FACMIC); resize_imagenet = Resize(224x224) + ImageNet "
                           "norm (FAA-CLIP)",
            "enum": ["clip", "resize_imagenet"],
            "default": "clip",
        },
        "image_size": {"type": "integer", "minimum": 8},
        "prompt": {
            "description": "Class prompt template; text features of every class are cached with the image features.",
            "type": "string",
            "default": "a picture of a {}",
        },
    },
}


def _open_clip():
    import open_clip

    for config in CONFIG_DIR.glob("*.json"):
        open_clip.add_model_config(config)
    return open_clip


def load_open_clip(name: str, pretrained: str = "none", device: str = "cpu"):
    """-> (model in eval mode, open_clip's own eval preprocess, tokenizer)."""
    open_clip = _open_clip()
    tag = None if pretrained in ("none", "", None) else pretrained
    if tag is not None and ("/" in tag or tag.endswith((".bin", ".pt", ".pth", ".safetensors"))) and not Path(tag).is_file():
        raise FileNotFoundError(f"open_clip checkpoint {tag} not found")
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=tag, device=device)
    model.eval()
    return model, preprocess, open_clip.get_tokenizer(name)


_FROZEN: dict[tuple, tuple] = {}
_BUILD_DEVICE = ["cpu"]


@contextlib.contextmanager
def on_meta():
    """Build models on the meta device (shapes only, nothing allocated; fedrepro.fl.memory): frozen CLIP
    encoders are built there too, under their own cache key, instead of being loaded on the CPU."""
    import torch

    _BUILD_DEVICE.append("meta")
    try:
        with torch.device("meta"):
            yield
    finally:
        _BUILD_DEVICE.pop()


def frozen_clip(encoder: dict, device: str | None = None):
    """-> (open_clip model with requires_grad off, its preprocess, tokenizer), loaded once per process.

    A random-init model (``pretrained: none``, tests and demo) is built under the same fixed seed as the
    feature-cache job (``fedrepro features``), so the uncached path sees the cache's encoder and every
    run seed starts from the same "pretrained" weights; the caller's random state is left untouched.
    """
    from ..seeding import kept_rng_state, seed_global

    device = device or _BUILD_DEVICE[-1]
    key = (encoder["name"], encoder["pretrained"], device)
    if key not in _FROZEN:
        with kept_rng_state():
            seed_global(0, "init")
            model, preprocess, tokenizer = load_open_clip(encoder["name"], encoder["pretrained"], device=device)
        _FROZEN[key] = (model.requires_grad_(False), preprocess, tokenizer)
    return _FROZEN[key]


def clip_image_size(model) -> int:
    size = model.visual.image_size
    return size[0] if isinstance(size, (tuple, list)) else int(size)


def feature_transform(kind: str, image_size: int, clip_preprocess=None):
    """The deterministic preprocessing whose outputs are cached.

    ``clip``: open_clip's own eval transform (FACMIC's code path: the CLIP preprocess wins).
    ``resize_imagenet``: Resize(size x size) + ImageNet normalisation (FAA-CLIP's code path).
    """
    from torchvision import transforms as T

    if kind == "clip":
        if clip_preprocess is not None:
            return clip_preprocess
        return T.Compose([T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(image_size),
                          T.ToTensor(), T.Normalize(CLIP_MEAN, CLIP_STD)])
    if kind == "resize_imagenet":
        return T.Compose([T.Resize((image_size, image_size)), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    raise ValueError(f"unknown preprocessing {kind!r}; allowed: clip, resize_imagenet")


def encoder_transform(encoder: dict, model, clip_preprocess):
    """The deterministic transform of an encoder spec (``preprocess``, optional ``image_size``): what the
    feature cache applies, and what a family that runs the frozen encoder on every batch must apply."""
    size = encoder.get("image_size") or clip_image_size(model)
    return feature_transform(encoder["preprocess"], size, None if encoder.get("image_size") else clip_preprocess)


def create_timm(name: str, num_classes: int, pretrained: bool | str = False, **kwargs):
    """A timm model; ``pretrained`` may be a checkpoint path (loaded with the classifier head left
    at its fresh init, since the number of classes differs)."""
    import timm
    import torch

    if not isinstance(pretrained, str):
        return timm.create_model(name, pretrained=bool(pretrained), num_classes=num_classes, **kwargs)
    model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    state = torch.load(pretrained, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    head = model.pretrained_cfg.get("classifier", "fc")
    own = model.state_dict()
    body = {k: v for k, v in state.items() if k in own and not k.startswith(head + ".")}
    missing = [k for k in own if k not in body and not k.startswith(head + ".")]
    wrong_shape = [k for k, v in body.items() if own[k].shape != v.shape]
    if missing or wrong_shape:
        raise ValueError(f"checkpoint {pretrained} does not fit timm model {name}: "
                         f"missing {missing[:5]}, wrong shape {wrong_shape[:5]}")
    model.load_state_dict(body, strict=False)
    return model


def tokenize(tokenizer, texts: list[str]):
    """Token ids on the CPU, also while models are built on the meta device (:func:`on_meta`)."""
    import torch

    with torch.device("cpu"):
        return tokenizer(texts)


def prompt_texts(template: str, class_names: list[str]) -> list[str]:
    return [template.format(name) for name in class_names]


def encode_prompts(model, tokenizer, template: str, class_names: list[str], device):
    """Frozen text features of every class prompt (C x D, float32, on the CPU)."""
    import torch

    with torch.no_grad():
        features = model.encode_text(tokenize(tokenizer, prompt_texts(template, class_names)).to(device)).float()
    return features if features.is_meta else features.cpu()
