"""Folder datasets: a researcher's own images in a folder, with a labels CSV that says what each one is.

Declared in the configuration (``datasets:``, docs/plugins.md) or by a plug-in (``register_dataset(folder_spec(...))``)
and used like any dataset: a setting names it with any registered splitter. The labels CSV has one row per image:

    path        the image's path relative to the images folder (``scans/0001.png``)
    class_name  its class, one of the declared ``classes`` (a column called ``label`` is read the same way when
                there is no ``class_name``; a manifest written for fedrepro has both, and ``class_name`` is used)
    source      optional: the site or domain it comes from (``by_source`` splits read it)
    split       optional: an official split, ``train``, ``val``, ``test`` or empty
    ...         any other column (e.g. ``caption``) is kept in the manifest

The configuration check reads the CSV and opens every image it lists before any job runs: an unknown class, a
missing or unreadable image, a repeated path or a path outside the folder stops it, naming the file, the line and
the fix. (What a check found is remembered for the CSV's content and the images' sizes and times, so planning
does not open every image again.) The ``download`` step links the folder into ``resources/raw/<name>/images`` and
copies the CSV beside it; the ``folder_labels`` preparer turns them into the dataset's manifest.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import shutil
from pathlib import Path

import pandas as pd

from .. import paths
from ..io import hash_obj, write_json
from ..registry import DATASETS, DATASETS_ENV, declares_datasets, preparer, register_dataset
from .manifest import OFFICIAL_SPLITS, ManifestError, make_manifest
from .spec import DatasetSpec, Source

PREPARER = "folder_labels"
LABEL_COLUMNS = ("class_name", "label")
SHOWN = 5           # problems listed per message


class FolderError(ManifestError):
    """A folder dataset whose files cannot make a manifest; the message names the file, the line and the fix."""


def folder_spec(name: str, images: str | os.PathLike, labels: str | os.PathLike, classes, *, title: str = "",
                class_text: dict | None = None) -> DatasetSpec:
    """The declaration of a folder dataset: ``images`` (a folder) and ``labels`` (a CSV) are resolved against the
    working directory; ``classes`` in label order; ``class_text``: what a CLIP prompt says for a class where it
    is not its name."""
    images, labels = str(Path(images).expanduser().resolve()), str(Path(labels).expanduser().resolve())
    return DatasetSpec(
        name=name,
        title=title or f"{name}: the images of {images}, labelled by {labels}",
        classes=tuple(classes),
        sources=(Source("folder", images, note=f"labels: {labels}", provides=("images", "labels.csv")),),
        layout="images/ (a link to your folder) and labels.csv (path, class_name[, source, split, ...])",
        prepare=PREPARER,
        access="local",
        used_by=("your configuration",),
        options={"images": images, "labels": labels},
        class_text=dict(class_text or {}),
    )


def is_folder(spec: DatasetSpec) -> bool:
    return spec.prepare == PREPARER


# ---- declared in the configuration (``datasets:``) ----------------------------------------------

def declare(datasets: dict, where: str = "config: datasets") -> list[DatasetSpec]:
    """Register the configuration's folder datasets (name -> {images, labels, classes, title, class_text})."""
    specs = []
    for name, entry in (datasets or {}).items():
        spec = folder_spec(name, entry["images"], entry["labels"], entry["classes"], title=entry.get("title", ""),
                           class_text=entry.get("class_text"))
        old = DATASETS.get(name) if name in DATASETS else None
        if old is not None and old.origin != "config":
            raise FolderError(f"{where}/{name}: {old.describe()} already declares a dataset of this name; give yours "
                              f"another name (nothing is replaced)")
        DATASETS.discard(name, "config")        # the configuration's own earlier declaration (a process reloading it)
        register_dataset(spec, origin="config")
        specs.append(spec)
    return specs


def environment(specs: list[DatasetSpec]) -> str:
    """The declarations as ``FEDREPRO_DATASETS`` carries them to jobs (absolute paths; empty: none)."""
    return json.dumps({s.name: {"images": s.options["images"], "labels": s.options["labels"], "classes": list(s.classes),
                                "title": s.title, "class_text": s.class_text} for s in specs}, sort_keys=True) if specs else ""


@declares_datasets
def declare_from_environment(text: str) -> None:
    """What ``FEDREPRO_DATASETS`` (set by the workflow for its jobs) declares."""
    declare(json.loads(text), where=f"{DATASETS_ENV} (the configuration's datasets, as the workflow passes them on)")


# ---- the check, before any job ------------------------------------------------------------------

def read_labels(spec: DatasetSpec, where: str) -> pd.DataFrame:
    """The labels CSV, checked: columns, classes, splits, paths (relative, inside the folder, listed once)."""
    labels = Path(spec.options["labels"])
    at = f"{where}: labels {labels}"
    if not labels.is_file():
        raise FolderError(f"{at}: file not found; write a CSV with one row per image (path, class_name[, source, "
                          f"split]) or correct the path")
    try:
        frame = pd.read_csv(labels, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
        raise FolderError(f"{at}: not a readable CSV ({type(error).__name__}: {str(error).splitlines()[0]})") from None
    column = next((c for c in LABEL_COLUMNS if c in frame.columns), None)
    if "path" not in frame.columns or column is None:
        raise FolderError(f"{at}: needs the columns 'path' and 'class_name' (or 'label'); it has {list(frame.columns)}")
    frame = frame.rename(columns={column: "class_name"}).drop(columns=[c for c in LABEL_COLUMNS if c != column
                                                                      and c in frame.columns])
    line = frame.index + 2                      # the CSV's own line numbers (the header is line 1)
    problems = []
    unknown = ~frame["class_name"].isin(spec.classes)
    for i in frame.index[unknown][:SHOWN]:
        name = frame.at[i, "class_name"]
        close = difflib.get_close_matches(name, list(spec.classes), n=1)
        problems.append(f"line {line[i]}: class {name!r} is not one of the classes {list(spec.classes)}"
                        + (f" (did you mean {close[0]!r}?)" if close else ""))
    if "split" in frame.columns:
        for i in frame.index[~frame["split"].isin(OFFICIAL_SPLITS)][:SHOWN]:
            problems.append(f"line {line[i]}: split {frame.at[i, 'split']!r} is not one of {list(OFFICIAL_SPLITS)}")
    for i in frame.index[frame["path"].duplicated()][:SHOWN]:
        problems.append(f"line {line[i]}: {frame.at[i, 'path']!r} is listed twice")
    for i in frame.index[[not _inside(p) for p in frame["path"]]][:SHOWN]:
        problems.append(f"line {line[i]}: {frame.at[i, 'path']!r} is not a path inside the images folder")
    if frame.empty:
        problems.append("it lists no image")
    if problems:
        more = f" (first {SHOWN} of each kind)" if len(problems) >= SHOWN else ""
        raise FolderError(f"{at}{more}:\n  " + "\n  ".join(problems))
    return frame


def _inside(path: str) -> bool:
    parts = Path(path).parts
    return bool(path) and not Path(path).is_absolute() and ".." not in parts


def check_folder(spec: DatasetSpec, where: str) -> None:
    """Every image the labels CSV lists is there and opens as an image (a header check, Pillow's ``verify``);
    what was found is remembered for these files (paths.folder_check) and not opened again."""
    images = Path(spec.options["images"])
    if not images.is_dir():
        raise FolderError(f"{where}: images {images}: folder not found; correct the path")
    frame = read_labels(spec, where)
    files = [images / p for p in frame["path"]]
    missing = [f for f in files if not f.is_file()]
    if missing:
        shown = "\n  ".join(str(f) for f in missing[:SHOWN])
        raise FolderError(f"{where}: {len(missing)} image(s) listed in {spec.options['labels']} are not in {images}:\n  "
                          f"{shown}\nAdd them, or remove their rows")
    stats = [(str(p), f.stat().st_size, f.stat().st_mtime_ns) for p, f in zip(frame["path"], files)]
    labels_sha = hashlib.sha256(Path(spec.options["labels"]).read_bytes()).hexdigest()
    fingerprint = hash_obj([labels_sha, str(images), stats], 16)
    record = Path(paths.folder_check(spec.name))
    if record.is_file() and json.loads(record.read_text() or "{}").get("fingerprint") == fingerprint:
        return
    unreadable = [(f, reason) for f in files if (reason := _unreadable(f))]
    if unreadable:
        shown = "\n  ".join(f"{f}: {reason}" for f, reason in unreadable[:SHOWN])
        raise FolderError(f"{where}: {len(unreadable)} image(s) listed in {spec.options['labels']} cannot be read:\n  "
                          f"{shown}\nReplace them, or remove their rows")
    write_json(record, {"fingerprint": fingerprint, "images": len(files)})


def _unreadable(path: Path) -> str | None:
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.verify()
        return None
    except Exception as error:  # noqa: BLE001 - Pillow raises many kinds for a file that is no image
        return f"{type(error).__name__}: {error}"


# ---- download (link) and prepare --------------------------------------------------------------

def link_folder(spec: DatasetSpec, dataset_dir: Path) -> None:
    """``resources/raw/<name>/images`` -> the user's folder (a link: nothing is copied), ``labels.csv`` copied
    (a new copy whenever the rule runs again: the workflow reruns it when the CSV changes)."""
    check_folder(spec, f"dataset {spec.name!r}")
    dataset_dir.mkdir(parents=True, exist_ok=True)
    link = dataset_dir / "images"
    if link.is_symlink() or link.exists():
        if link.is_symlink() and os.readlink(link) == spec.options["images"]:
            pass
        elif link.is_symlink():
            link.unlink()
        else:
            raise FolderError(f"{link} exists and is not a link to {spec.options['images']}; move it away")
    if not link.is_symlink():
        link.symlink_to(spec.options["images"], target_is_directory=True)
    tmp = dataset_dir / ".labels.csv.tmp"
    shutil.copyfile(spec.options["labels"], tmp)
    tmp.replace(dataset_dir / "labels.csv")


@preparer(PREPARER)
def prepare_folder(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """``labels.csv`` + ``images/`` -> the manifest (paths under ``<name>/images/``, every extra column kept)."""
    base = Path(raw_root) / spec.name
    copied = dataclasses.replace(spec, options={**spec.options, "labels": str(base / "labels.csv")})
    frame = read_labels(copied, f"dataset {spec.name!r}")
    frame["path"] = [f"{spec.name}/images/{Path(p).as_posix()}" for p in frame["path"]]
    return make_manifest(frame.to_dict("records"), spec.classes)
