"""How each image model family decodes its images, known without building the model.

The DAG must name a run's decode-once image caches (:mod:`fedrepro.data.image_cache`) before any
job runs, and building a family (it may load a CLIP) is far too slow for that. So each image family
states here, from its config alone, the :class:`~fedrepro.data.decode.DecodeSpec` of its training
and evaluation pipelines: the first resize its transforms apply. This module imports neither torch
nor torchvision. ``tests/test_image_cache.py`` checks, for every image run of the full grid and the
demo, that these specs equal :func:`fedrepro.data.decode.spec_of` of the family's real transforms.
"""

from __future__ import annotations

import json
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path

from ..data.decode import RANDOM_CROP_FACTOR, DecodeSpec

CONFIG_DIR = Path(__file__).parent / "configs"


def clip_image_size(name: str) -> int:
    """The input size of an open_clip architecture, read from its model config file (no import)."""
    if name.startswith("local-dir:"):
        config = json.loads((Path(name.removeprefix("local-dir:")) / "open_clip_config.json").read_text())["model_cfg"]
    else:
        ours = CONFIG_DIR / f"{name}.json"
        spec = find_spec("open_clip")
        theirs = Path(spec.submodule_search_locations[0]) / "model_configs" / f"{name}.json" if spec else None
        path = ours if ours.exists() else theirs
        if path is None or not path.exists():
            raise KeyError(f"no open_clip model config {name!r}")
        config = json.loads(path.read_text())
    size = config["vision_cfg"]["image_size"]
    return size[0] if isinstance(size, list) else int(size)


def _clip(cfg: dict) -> DecodeSpec:
    encoder = cfg["encoder"]
    size = encoder.get("image_size") or clip_image_size(encoder["name"])
    if encoder["preprocess"] == "resize_imagenet":
        return DecodeSpec(size, "square", "bilinear")
    return DecodeSpec(size, "shorter", "bicubic")       # open_clip: Resize(size, bicubic) + CenterCrop


def _square(size: int) -> DecodeSpec:
    return DecodeSpec(size, "square", "bilinear")


def _random_crop(size: int) -> DecodeSpec:
    return DecodeSpec(RANDOM_CROP_FACTOR * size, "shorter", "bilinear")


def _classifier_train(cfg: dict) -> DecodeSpec:
    return _random_crop(cfg["image_size"]) if cfg["augment"] == "standard" else _square(cfg["image_size"])


def _classifier(cfg: dict) -> dict[str, DecodeSpec]:
    return {"train": _classifier_train(cfg), "eval": _square(cfg["image_size"])}


def _projected(cfg: dict) -> dict[str, DecodeSpec]:
    size = cfg["image_size"]
    evaluate = DecodeSpec(round(size * 256 / 224), "shorter", "bilinear") if cfg["eval_crop"] == "center" else _square(size)
    train = {"skin": _random_crop(size), "ich": _square(size)}.get(cfg["augment"]) or _classifier_train(cfg)
    return {"train": train, "eval": evaluate}


def _adapter_protonet(cfg: dict) -> dict[str, DecodeSpec]:
    size = cfg["image_size"]
    return {"train": _square(size) if cfg["augment"] == "fundus" else _classifier_train(cfg), "eval": _square(size)}


def _vision_language(cfg: dict) -> dict[str, DecodeSpec]:
    spec = DecodeSpec(cfg["image"]["resize"], "longer", "bicubic")   # MGCA's pad-to-square resize
    return {"train": spec, "eval": spec}


def _clip_family(cfg: dict) -> dict[str, DecodeSpec]:
    spec = _clip(cfg)
    return {"train": spec, "eval": spec}       # both papers' code trains without augmentation


SPECS = {
    "classifier": _classifier,
    "proj_classifier": _projected,
    "adapter_protonet": _adapter_protonet,
    "vlp": _vision_language,
    "clip_full": _clip_family,
    "clip_lora": _clip_family,
    "clip_prompt": _clip_family,
    "clip_fam_images": _clip_family,
    "clip_adapter_images": _clip_family,
}


def decode_specs(model: dict, draft: bool = True) -> dict[str, DecodeSpec]:
    """{"train": spec, "eval": spec} of an image family's config (its schema defaults filled);
    ``draft``: JPEGs decoded with DCT scaling (``data.jpeg_draft``)."""
    family = model["family"]
    if family not in SPECS:
        raise KeyError(f"model family {family!r} declares no decode spec; add it to fedrepro.models.decoding.SPECS")
    return {part: replace(spec, draft=draft) for part, spec in SPECS[family](model).items()}


def encoder_decode_spec(encoder: dict) -> DecodeSpec:
    """The spec of a frozen-encoder feature cache's preprocessing (the ``features`` rule)."""
    return _clip({"encoder": encoder})
