"""The frozen-encoder feature cache: one forward pass per image, reused by every round of every run.

For methods that train only small modules on top of a frozen CLIP image encoder with deterministic
preprocessing (FACMIC, FAA-CLIP, FedCLIP), encoding each image once is exactly what re-encoding it
every batch computes (docs/papers/facmic.md). The cache is keyed by the encoder (name, weights, preprocessing,
prompt) and also holds the text features of every class prompt. Unreadable images never get here:
the prepare step decodes every image once and stops (or drops and reports them).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .data.images import load_rgb
from .io import sha256_file, torch_save


def prompt_texts(template: str, class_names: list[str]) -> list[str]:
    return [template.format(name) for name in class_names]


@torch.no_grad()
def encode_prompts(model, tokenizer, template: str, class_names: list[str], device) -> torch.Tensor:
    """Frozen text features of every class prompt (C x D, float32, on the CPU)."""
    return model.encode_text(tokenizer(prompt_texts(template, class_names)).to(device)).float().cpu()


@torch.no_grad()
def encode_dataset(manifest, raw_root: Path, class_names: list[str], encoder: dict, device: torch.device,
                   batch_size: int = 64, progress: bool = True) -> dict:
    from tqdm import tqdm

    from .models.encoders import encoder_transform, load_open_clip

    model, clip_preprocess, tokenizer = load_open_clip(encoder["name"], encoder["pretrained"], device=str(device))
    transform = encoder_transform(encoder, model, clip_preprocess)

    text = encode_prompts(model, tokenizer, encoder["prompt"], class_names, device)
    paths = manifest["path"].tolist()
    feats = []
    for start in tqdm(range(0, len(paths), batch_size), desc="encoding images", unit="batch", disable=not progress):
        images = torch.stack([transform(load_rgb(Path(raw_root) / p)) for p in paths[start:start + batch_size]])
        feats.append(model.encode_image(images.to(device)).float().cpu())
    return {
        "image": torch.cat(feats) if feats else torch.zeros(0, text.shape[1]),
        "text": text,
        "labels": torch.as_tensor(manifest["label"].to_numpy(), dtype=torch.long),
        "paths": paths,
        "class_names": list(class_names),
        "encoder": dict(encoder),
    }


def build_feature_cache(manifest_path: Path, raw_root: Path, class_names: list[str], encoder: dict, out: Path,
                        device: torch.device) -> dict:
    from .data.manifest import read_manifest

    manifest = read_manifest(manifest_path)
    cache = encode_dataset(manifest, raw_root, class_names, encoder, device)
    cache["manifest_sha256"] = sha256_file(manifest_path)
    weights = Path(encoder["pretrained"])
    # provenance of the weights: the file's digest for a local checkpoint, else the open_clip tag
    cache["weights"] = {"sha256": sha256_file(weights)} if weights.is_file() else {"tag": encoder["pretrained"]}
    torch_save(out, cache)
    return cache
