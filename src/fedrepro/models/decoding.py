"""How each image model family decodes its images, known without building the model.

The DAG must name a run's decode-once image caches (:mod:`fedrepro.data.image_cache`) before any
job runs, and building a family (it may load a CLIP) is far too slow for that. So each image family
registers (``register_model(..., decode=...)``) a function of its config alone that gives the
:class:`~fedrepro.data.decode.DecodeSpec` of its training and evaluation pipelines: the first resize
its transforms apply. The functions live here. ``tests/test_image_cache.py`` checks, for every image
run of the full grid and the demo, that they equal :func:`fedrepro.data.decode.spec_of` of the
family's real transforms.
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
        if not ours.exists():
            ours = CONFIG_DIR / "composite" / f"{name}.json"
        spec = find_spec("open_clip")
        theirs = Path(spec.submodule_search_locations[0]) / "model_configs" / f"{name}.json" if spec else None
        path = ours if ours.exists() else theirs
        if path is None or not path.exists():
            raise KeyError(f"no open_clip model config {name!r}")
        config = json.loads(path.read_text())
    size = config["vision_cfg"]["image_size"]
    return size[0] if isinstance(size, list) else int(size)


def _clip_encoder(cfg: dict) -> DecodeSpec:
    encoder, authors = cfg["encoder"], cfg.get("pixels", "authors") == "authors"
    size = encoder.get("image_size") or clip_image_size(encoder["name"])
    if encoder["preprocess"] == "resize_imagenet":   # FAA-CLIP: convert("RGB") first, then Resize([224, 224])
        return DecodeSpec(size, "square", "bilinear")
    # open_clip / OpenAI CLIP: Resize(size, bicubic) + CenterCrop on the image as Image.open gives it, RGB after
    return DecodeSpec(size, "shorter", "bicubic", convert="after" if authors else "before")


def _square(size: int) -> DecodeSpec:
    return DecodeSpec(size, "square", "bilinear")


def _random_crop(cfg: dict) -> DecodeSpec:
    """A pipeline that starts with a random crop: the full-resolution image under the authors' pixels (they crop
    from the image as it is), the shorter side at twice the crop under the fast ones."""
    if cfg.get("pixels", "authors") == "authors":
        return DecodeSpec()
    return DecodeSpec(RANDOM_CROP_FACTOR * cfg["image_size"], "shorter", "bilinear")


def _classifier_train(cfg: dict) -> DecodeSpec:
    return _random_crop(cfg) if cfg["augment"] == "standard" else _square(cfg["image_size"])


def classifier_specs(cfg: dict) -> dict[str, DecodeSpec]:
    return {"train": _classifier_train(cfg), "eval": _square(cfg["image_size"])}


def projected_specs(cfg: dict) -> dict[str, DecodeSpec]:
    size = cfg["image_size"]
    evaluate = DecodeSpec(round(size * 256 / 224), "shorter", "bilinear") if cfg["eval_crop"] == "center" else _square(size)
    train = {"skin": _random_crop(cfg), "ich": _square(size)}.get(cfg["augment"]) or _classifier_train(cfg)
    return {"train": train, "eval": evaluate}


def adapter_protonet_specs(cfg: dict) -> dict[str, DecodeSpec]:
    if cfg.get("pixels", "authors") == "authors":   # the authors' pipeline resizes float tensors: the image as it is
        return {"train": DecodeSpec(), "eval": DecodeSpec()}
    size = cfg["image_size"]
    return {"train": _square(size) if cfg["augment"] == "fundus" else _classifier_train(cfg), "eval": _square(size)}


def vlp_specs(cfg: dict) -> dict[str, DecodeSpec]:
    spec = pad_resize_spec(cfg["image"]["resize"], cfg.get("pixels", "authors"))
    return {"train": spec, "eval": spec}


def pad_resize_spec(size: int, pixels: str, nearest: bool = False) -> DecodeSpec:
    """The resize of MGCA's pad-to-square (FedDRA): the authors' ``cv2.resize(..., INTER_AREA)`` at ``int()`` sizes
    (HKU-MedAI/MGCA and BioMed-AI-Lab-U-Michgan/TMLR_FedDRA ``mgca/datasets/utils.py::resize_img``), or PIL bicubic
    at rounded sizes (the fast pixels); ``nearest`` for label masks."""
    if pixels == "authors":
        return DecodeSpec(size, "longer", "nearest" if nearest else "area", library="cv2")
    return DecodeSpec(size, "longer", "nearest" if nearest else "bicubic")


def clip_specs(cfg: dict) -> dict[str, DecodeSpec]:
    spec = _clip_encoder(cfg)
    return {"train": spec, "eval": spec}       # both papers' code trains without augmentation


def decode_specs(model: dict, draft: bool = True) -> dict[str, DecodeSpec]:
    """{"train": spec, "eval": spec} of an image family's config (its schema defaults filled; ``pixels`` says whose
    pipeline); ``draft``: JPEGs decoded with DCT scaling (``data.jpeg_draft``)."""
    from ..registry import MODELS

    entry = MODELS.get(model["family"])
    if entry["decode"] is None:
        raise KeyError(f"model family {model['family']!r} trains on {entry['input']} and registers no decode specs "
                       f"(register_model(..., decode=...))")
    return {part: replace(spec, draft=draft) for part, spec in entry["decode"](model).items()}


def encoder_decode_spec(encoder: dict, pixels: str = "authors") -> DecodeSpec:
    """The spec of a frozen-encoder feature cache's preprocessing (the ``features`` rule)."""
    return _clip_encoder({"encoder": encoder, "pixels": pixels})
