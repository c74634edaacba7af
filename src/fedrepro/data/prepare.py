"""Preparers: a dataset's raw layout -> its canonical manifest (see :mod:`fedrepro.data.manifest`).

A preparer takes the dataset spec and the raw root (``resources/raw``) and returns a DataFrame whose
paths are relative to the raw root. Register one with ``@preparer("name")`` (:mod:`fedrepro.registry`)
next to the dataset that uses it (in :mod:`fedrepro.data.datasets`); helpers for generic layouts live here. A derived dataset (one with
``depends_on``) is built from other datasets' manifests: its preparer also gets ``manifest_dir``
(the folder of ``<dataset>.csv`` manifests, ``resources/manifests``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd

from ..registry import preparer
from .manifest import make_manifest
from .spec import DatasetSpec

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff"}


def list_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))


def class_folder_rows(root: Path, raw_root: Path, class_dirs: dict[str, str], split: str = "", source: str = "") -> list[dict]:
    """Rows for ``root/<folder>/**/image`` where ``class_dirs`` maps folder name -> class name."""
    rows = []
    for folder, class_name in class_dirs.items():
        for image in list_images(root / folder):
            rows.append({"path": image.relative_to(raw_root).as_posix(), "class_name": class_name,
                         "split": split, "source": source})
    return rows


def pixel_digest(path: Path) -> str:
    """SHA-256 of an image's size and decoded RGB pixels: the same picture whatever its file name,
    container, metadata or colour mode (a re-compressed copy is another picture)."""
    from PIL import Image

    with Image.open(path) as image:
        rgb = image.convert("RGB")
    return hashlib.sha256(repr(rgb.size).encode() + rgb.tobytes()).hexdigest()


def missing_folder(folder: Path, spec: DatasetSpec) -> FileNotFoundError:
    return FileNotFoundError(f"{folder} not found; {spec.name} should read: {spec.layout}")


def find_folder(base: Path, name: str, spec: DatasetSpec, max_depth: int = 3) -> Path:
    """The shallowest folder called ``name`` at most ``max_depth`` levels below ``base`` (archives of
    the same data differ in how many wrapper folders they add); ``downloads/`` is not searched."""
    level = [base]
    for _ in range(max_depth + 1):
        for folder in sorted(level):
            if (folder / name).is_dir():
                return folder / name
        level = [d for folder in level for d in folder.iterdir() if d.is_dir() and d.name != "downloads"]
        if not level:
            break
    raise missing_folder(base / name, spec)


def find_file(base: Path, names: str | tuple[str, ...], spec: DatasetSpec, max_depth: int = 3,
              search_downloads: bool = True) -> Path:
    """The first of ``names`` found in ``base``, ``base/downloads`` (files that are not unpacked stay
    there; unless ``search_downloads`` is false) or at most ``max_depth`` folder levels below ``base``."""
    names = (names,) if isinstance(names, str) else names
    level = [base, base / "downloads"] if search_downloads else [base]
    for _ in range(max_depth + 1):
        for name in names:
            for folder in sorted(level):
                if (folder / name).is_file():
                    return folder / name
        level = [d for folder in level if folder.is_dir() for d in folder.iterdir()
                 if d.is_dir() and d.name != "downloads"]
        if not level:
            break
    raise FileNotFoundError(f"none of {list(names)} found under {base}; {spec.name} should read: {spec.layout}")


@preparer("class_folders")
def class_folders(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """``[<split>/]<class>/*``: an optional official split level above the class folders."""
    base = raw_root / spec.name
    rows = []
    split_dirs = [d for d in ("train", "val", "test") if (base / d).is_dir()]
    for split in split_dirs or [""]:
        rows += class_folder_rows(base / split if split else base, raw_root, {c: c for c in spec.classes}, split=split)
    return make_manifest(rows, spec.classes)


@preparer("domain_folders")
def domain_folders(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """``<domain>/<class>/*``: the domain becomes the ``source`` column (OfficeHome-style layout)."""
    base = raw_root / spec.name
    domains = spec.options.get("domains") or sorted(d.name for d in base.iterdir() if d.is_dir() and d.name != "downloads")
    rows = []
    for domain in domains:
        if not (base / domain).is_dir():
            raise missing_folder(base / domain, spec)
        rows += class_folder_rows(base / domain, raw_root, {c: c for c in spec.classes}, source=domain)
    return make_manifest(rows, spec.classes)


def dependency_manifest(manifest_dir: Path, spec: DatasetSpec, name: str) -> pd.DataFrame:
    """The manifest of ``name``, one of the datasets a derived dataset ``spec`` is built from."""
    from .manifest import read_manifest

    path = Path(manifest_dir) / f"{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{spec.name} is built from {path}: prepare {name!r} first "
                                f"(the Snakemake prepare rule does this through depends_on)")
    return read_manifest(path)


def prepare_dataset(spec: DatasetSpec, raw_root: Path, manifest_dir: Path | None = None) -> pd.DataFrame:
    """``manifest_dir`` (default ``<raw_root>/../manifests``) is where a derived dataset finds the
    manifests of the datasets it ``depends_on``."""
    from ..registry import PREPARERS

    prepare = PREPARERS.get(spec.prepare).obj
    if spec.depends_on:
        return prepare(spec, Path(raw_root), manifest_dir=Path(manifest_dir or Path(raw_root).parent / "manifests"))
    return prepare(spec, Path(raw_root))
