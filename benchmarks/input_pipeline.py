"""Input pipeline: images per second per core, original files vs the decode-once cache.

Both paths go through the project's own dataset class (``ManifestImages``) with full configs'
training transforms, on synthetic images it writes at real sizes:

- ISIC-like: 1024 x 768 colour JPEGs through
  (a) FACMIC's Real setting, full CLIP fine-tuning (config/papers/facmic.yaml: CLIP ViT-B/16's
      preprocess, Resize 224 bicubic + CenterCrop, as in the authors' code): decode-bound, and
  (b) FedIIC's ISIC setting (config/papers/fediic.yaml: RandomResizedCrop + ColorJitter + RandAugment
      view): augmentation-bound once decoding is gone;
- MIMIC-like: 2500 x 3000 greyscale JPEGs through FedDRA's pipeline (config/papers/feddra.yaml: the
  longer side to 256, zero-padded, random crop 224).

"original" is how training read images before the cache: a full decode of the file every epoch, the
RGB conversion, then the transform. The pipelines are the fast numerics' (README "Numerics": random crops from a
cache at twice the crop size); under the authors' numerics a random-crop pipeline reads the original files
(benchmarks/numerics.py compares the two). "cache" reads the decode-once cache built for that pipeline
(``fedrepro image-cache``; its one-off build rate is printed too). One process, one torch thread:
figures are per core (a job with N loader workers scales them by about N).

    python benchmarks/input_pipeline.py                 # 48 images per size (a few minutes)
    python benchmarks/input_pipeline.py --images 200

The last line reads ``speedup ISIC-size <N>x, MIMIC-size <M>x`` with (a) for ISIC; (b) is printed
above it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedrepro.config import load_project  # noqa: E402
from fedrepro.data.decode import DecodeSpec, spec_of  # noqa: E402
from fedrepro.data.image_cache import ImageCache, build_image_cache  # noqa: E402
from fedrepro.data.images import ManifestImages  # noqa: E402
from fedrepro.data.manifest import write_manifest  # noqa: E402
from fedrepro.models.families import build_family  # noqa: E402

SIZES = {"ISIC": (1024, 768, "RGB"), "MIMIC": (2500, 3000, "L")}
PIPELINES = [   # (size, paper, setting, method, what)
    ("ISIC", "facmic", "real", "fedavg", "FACMIC Real, CLIP ViT-B/16 preprocess"),
    ("ISIC", "fediic", "isic", "fedavg", "FedIIC ISIC, RandAugment training view"),
    ("MIMIC", "feddra", "mimic_a1", "feddra_convirt", "FedDRA MIMIC-CXR, pad-to-square + crop"),
]


def synthetic_jpegs(folder: Path, n: int, width: int, height: int, mode: str, seed: int = 0) -> pd.DataFrame:
    """Photographs-like JPEGs (smooth shapes + sensor noise; pure noise would decode unrealistically slowly)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    rows = []
    for i in range(n):
        cx, cy, r = rng.uniform(0.2, 0.8) * width, rng.uniform(0.2, 0.8) * height, rng.uniform(0.1, 0.4) * min(width, height)
        blob = 200 * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r)) + 30 * np.sin(xx / rng.uniform(20, 80))
        channels = 3 if mode == "RGB" else 1
        pixels = np.stack([blob * rng.uniform(0.6, 1.0) for _ in range(channels)], axis=-1)
        pixels = np.clip(pixels + rng.normal(0, 6, pixels.shape), 0, 255).astype(np.uint8)
        path = folder / f"img{i:04d}.jpg"
        Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode).save(path, quality=92)
        rows.append({"path": path.name, "label": i % 2, "class_name": "ab"[i % 2], "source": "", "split": "train"})
    return pd.DataFrame(rows)


def training_transform(paper: str, setting: str, method: str):
    """The training transform a real run of (paper, setting, method) builds (random-init weights)."""
    project = load_project([ROOT / "config/config.yaml"], {"numerics": "fast"}, root=ROOT)
    model = dict(project.resolver.train_config(paper, setting, method, "clean")["model"])
    if "encoder" in model:
        model["encoder"] = {**model["encoder"], "pretrained": "none"}
    if "pretrained" in model:
        model["pretrained"] = False
    family = build_family(model, ["a", "b"], {})
    return family.train_transform()


def images_per_second(dataset: ManifestImages, repeats: int) -> float:
    torch.manual_seed(0)
    dataset[0]   # warm-up (lazy imports, the memory map)
    start = time.perf_counter()
    for _ in range(repeats):
        for i in range(len(dataset)):
            dataset[i]
    return repeats * len(dataset) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=48, help="synthetic images per size")
    parser.add_argument("--repeats", type=int, default=3, help="epochs over the cached images (the original path runs one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    speedups = {}
    with tempfile.TemporaryDirectory() as tmp:
        made = {}
        for size, paper, setting, method, what in PIPELINES:
            width, height, mode = SIZES[size]
            folder = Path(tmp) / size
            if size not in made:
                folder.mkdir()
                made[size] = synthetic_jpegs(folder, args.images, width, height, mode)
                write_manifest(folder / "manifest.csv", made[size])
            manifest = made[size]
            transform = training_transform(paper, setting, method)
            spec = spec_of(transform, "fast")
            common = (folder, manifest["path"].tolist(), manifest["label"].to_numpy(), np.arange(len(manifest)), transform)

            original = images_per_second(ManifestImages(*common, decode=DecodeSpec()), 1)
            t0 = time.perf_counter()
            build_image_cache(folder / "manifest.csv", folder, spec, folder / f"{spec.key}.u8")
            build = len(manifest) / (time.perf_counter() - t0)
            cache = ImageCache(folder / f"{spec.key}.u8", spec=spec)
            cached = images_per_second(ManifestImages(*common, decode=spec, cache=cache), args.repeats)
            speedups.setdefault(size, cached / original)
            print(f"{size}-size {width}x{height} {mode} JPEG, {what} (decode spec {spec.key}):")
            print(f"  original files  {original:8.1f} images/s per core")
            print(f"  decode-once     {cached:8.1f} images/s per core  ({cached / original:.1f}x)")
            print(f"  (building the cache, once: {build:.1f} images/s per core; "
                  f"{cache.offsets[-1] / len(manifest) / 1e3:.0f} kB per image)")
    print(f"speedup ISIC-size {speedups['ISIC']:.1f}x, MIMIC-size {speedups['MIMIC']:.1f}x")


if __name__ == "__main__":
    main()
