"""A small folder dataset to try a plug-in on: circles, squares and triangles, drawn at random.

    python -m fedrepro_fedavgm.shapes data/shapes            # data/shapes/images/*.png + data/shapes/labels.csv

Each image is a shape of random size, position and colour on a noisy background; half of them come from site
``bright`` (light backgrounds), half from site ``dark``, which the labels CSV records in its ``source`` column (a
``by_source`` split would make one client per site). The layout is what fedrepro reads as a folder dataset (``datasets:``
of a configuration): a folder of images and a CSV of ``path,class_name,source``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle")
SITES = ("bright", "dark")


def draw(shape: str, size: int, rng: np.random.Generator, site: str) -> Image.Image:
    low, high = (150, 255) if site == "bright" else (0, 100)
    background = rng.integers(low, high, size=(size, size, 3), dtype=np.uint8)
    image = Image.fromarray(background)
    pen = ImageDraw.Draw(image)
    radius = rng.uniform(0.2, 0.4) * size
    cx, cy = rng.uniform(radius, size - radius, size=2)
    colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
    if shape == "circle":
        pen.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
    elif shape == "square":
        pen.rectangle([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
    else:
        pen.polygon([(cx, cy - radius), (cx - radius, cy + radius), (cx + radius, cy + radius)], fill=colour)
    return image


def make_shapes(folder: str | Path, per_class: int = 60, size: int = 32, seed: int = 0) -> Path:
    """Write ``per_class`` images of each class to ``folder/images`` and their labels to ``folder/labels.csv``."""
    folder = Path(folder)
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    for shape in CLASSES:
        for i in range(per_class):
            site = SITES[i % len(SITES)]
            name = f"{shape}_{i:03d}.png"
            draw(shape, size, rng, site).save(images / name)
            rows.append({"path": name, "class_name": shape, "source": site})
    with open(folder / "labels.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["path", "class_name", "source"])
        writer.writeheader()
        writer.writerows(rows)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--per-class", type=int, default=60)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = make_shapes(args.folder, args.per_class, args.size, args.seed)
    print(f"{len(CLASSES) * args.per_class} images in {out / 'images'}, labels in {out / 'labels.csv'}")


if __name__ == "__main__":
    main()
