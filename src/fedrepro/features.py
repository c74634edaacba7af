"""The frozen-encoder feature cache: one forward pass per image, reused by every round of every run.

For methods that train only small modules on top of a frozen CLIP image encoder with deterministic
preprocessing (FACMIC, FAA-CLIP, FedCLIP), encoding each image once is exactly what re-encoding it
every batch computes (docs/papers/facmic.md). The cache is keyed by the encoder (name, weights, preprocessing,
prompt, and its precision where it is not fp32: ``encoder.precision: fp16_weights``, the paper protocol's
CLIP as the authors' ``clip.load`` held it) and also holds the text features of every class prompt. Unreadable images never get here:
the prepare step decodes every image once and stops (or drops and reports them).

Building a cache again from the same inputs gives the same bytes: on a CPU the encoder runs on one intra-op
thread whatever the job's cores (:func:`fedrepro.seeding.fixed_threads`; the loader workers decode images in
parallel), in fixed batches of the manifest's order, so a rebuild makes no run on it stale. On reading, its
CRC-32s are checked first (:func:`fedrepro.io.torch_load`): a byte changed since it was written is caught.
"""

from __future__ import annotations

import contextlib
import pickle
import zipfile
from pathlib import Path

import torch

from . import records
from .io import BrokenFile, broken, sha256_file, torch_load, torch_save
from .models.encoders import encode_prompts
from .seeding import fixed_threads


@torch.no_grad()
def encode_dataset(manifest, raw_root: Path, class_names: list[str], encoder: dict, device: torch.device,
                   batch_size: int = 64, progress: bool = True, workers: int = 0, draft: bool = True,
                   precision: str = "fp32", pixels: str = "authors") -> dict:
    """Encode every manifest row once; images are decoded at the preprocessing's own size
    (:mod:`fedrepro.data.decode`, the ``pixels`` pipeline; JPEG DCT scaling if ``draft``) by ``workers`` loader processes
    while the encoder runs. ``precision`` (:mod:`fedrepro.device`) of the image tower's forward pass:
    fp32 by default, since the cache is computed once per dataset and is what every run on it reads.
    An encoder spec with ``precision: fp16_weights`` is the fp16 CLIP of OpenAI's ``clip.load`` instead
    (:func:`fedrepro.models.encoders.set_frozen_precision`): images and prompts are encoded in fp16, as
    the FACMIC and FAA-CLIP code encodes them, and ``precision`` must stay fp32."""
    from dataclasses import replace

    import numpy as np
    from tqdm import tqdm

    from .data.decode import spec_of
    from .data.images import ManifestImages
    from .data.loader import batches
    from .device import Compute, resolve_precision
    from .models.encoders import encoder_transform, image_input, load_open_clip, set_frozen_precision

    frozen = encoder.get("precision", "fp32")
    if frozen != "fp32" and precision != "fp32":
        raise ValueError(f"encoder.precision {frozen} fixes the encoder's numbers; precision must be fp32, not {precision}")
    compute = Compute(device, resolve_precision(precision, device))
    model, clip_preprocess, tokenizer = load_open_clip(encoder["name"], encoder["pretrained"], device=str(device))
    set_frozen_precision(model, encoder)
    transform = encoder_transform(encoder, model, clip_preprocess)

    paths = manifest["path"].tolist()
    images = ManifestImages(raw_root, paths, manifest["label"].to_numpy(), np.arange(len(paths)), transform,
                            decode=replace(spec_of(transform, pixels), draft=draft))
    feats = []
    bar = tqdm(total=len(paths), desc="encoding images", unit="img", disable=not progress)
    # one thread on a CPU: the same bytes with any --cores (on a GPU the host threads compute nothing of it)
    with fixed_threads(1) if device.type == "cpu" else contextlib.nullcontext():
        text = encode_prompts(model, tokenizer, encoder["prompt"], class_names, device)
        for batch in batches(images, batch_size, shuffle=False, num_workers=workers):
            with compute.autocast():
                feats.append(model.encode_image(image_input(model, compute.batch(batch)["x"])).float().cpu())
            bar.update(len(batch["x"]))
    bar.close()
    return {
        "image": torch.cat(feats) if feats else torch.zeros(0, text.shape[1]),
        "text": text,
        "labels": torch.tensor(manifest["label"].to_numpy(), dtype=torch.long),
        "paths": paths,
        "class_names": list(class_names),
        "encoder": dict(encoder),
        "precision": frozen if frozen != "fp32" else compute.precision,
    }


def build_feature_cache(manifest_path: Path, raw_root: Path, class_names: list[str], encoder: dict, out: Path,
                        device: torch.device, workers: int = 0, draft: bool = True, precision: str = "fp32",
                        pixels: str = "authors") -> dict:
    from .data.manifest import read_manifest
    from .models.weights import encoder_weights, require

    fetched = require(encoder_weights(encoder))    # the encoder's weights are there and intact, before any image
    manifest = read_manifest(manifest_path)
    cache = encode_dataset(manifest, raw_root, class_names, encoder, device, workers=workers, draft=draft,
                           precision=precision, pixels=pixels)
    cache["jpeg_draft"] = draft
    cache["pixels"] = pixels
    cache["manifest_sha256"] = sha256_file(manifest_path)
    weights = Path(encoder["pretrained"])
    # provenance of the weights: a local checkpoint's digest, or the tag and its fetched files' digests
    cache["weights"] = ({"sha256": sha256_file(weights)} if weights.is_file()
                        else {"tag": encoder["pretrained"], "files": fetched})
    torch_save(out, cache)
    records.write(out, [out], records.made_from(manifest_path), encoder=encoder, class_names=list(class_names))
    return cache


CACHE_KEYS = ("image", "text", "labels", "paths", "class_names", "encoder", "manifest_sha256")


def feature_cache_manifest(path: str | Path) -> str | None:
    """The SHA-256 of the manifest a feature cache was computed from, read without loading its features (the
    tensors are memory-mapped, not read); None where the file is no readable cache."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True).get("manifest_sha256")
    except Exception:  # noqa: BLE001 - a damaged cache is named by its job; here it only has no answer
        return None


def load_feature_cache(path: str | Path) -> dict:
    """A feature cache as :func:`build_feature_cache` wrote it, after its CRC-32s matched; a truncated, corrupt or
    changed file is set aside and named with the command that rebuilds it (torch alone says only "checkpoint file
    is corrupted", or loads changed bytes without a word)."""
    rebuild = f"snakemake --cores all {path}"
    try:
        cache = torch_load(path, rebuild)
    except BrokenFile:       # damaged: already set aside and named
        raise
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        raise broken(path, f"corrupt ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})",
                     rebuild) from None
    missing = [k for k in CACHE_KEYS if k not in cache] if isinstance(cache, dict) else list(CACHE_KEYS)
    if missing or len(cache["image"]) != len(cache["labels"]):
        raise broken(path, f"not a complete feature cache (missing {missing})" if missing else
                     f"inconsistent ({len(cache['image'])} image features for {len(cache['labels'])} labels)", rebuild)
    return cache
