"""Preparers: a dataset's raw layout -> its canonical manifest (see :mod:`fedrepro.data.manifest`).

A preparer takes the dataset spec and the raw root (``resources/raw``) and returns a DataFrame whose
paths are relative to the raw root. Register one with ``@preparer("name")`` (:mod:`fedrepro.registry`)
next to the dataset that uses it (in :mod:`fedrepro.data.datasets`); helpers for generic layouts live here. A derived dataset (one with
``depends_on``) is built from other datasets' manifests: its preparer also gets ``manifest_dir``
(the folder of ``<dataset>.csv`` manifests, ``resources/manifests``).

Bad input is one message naming the file: a label table that cannot be parsed (:func:`read_table`) or
lacks a column (:func:`require_columns`), an image a table lists that is not there
(:func:`require_listed`) raise :class:`~fedrepro.data.manifest.ManifestError`. The download step runs a
dataset's check (:func:`check_listed`: the preparer itself, or the cheaper function registered as its
``check``) before it marks the dataset complete. A file a preparer cannot convert (a damaged DICOM, an
image the fundus crop cannot read) does not stop it: the row keeps its raw path and the preparer lists
it with the reason (:func:`with_unreadable`), and ``fedrepro prepare`` leaves it out or refuses, as
``data.corrupt_images`` says, like every other unreadable image.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from ..registry import preparer
from .manifest import ManifestError, make_manifest
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


UNREADABLE = "unreadable"   # DataFrame.attrs key: [(path, reason)] of the rows a preparer could not convert


def with_unreadable(frame: pd.DataFrame, failures: Iterable[tuple[str, str]]) -> pd.DataFrame:
    """``frame`` carrying the (manifest path, reason) of each file the preparer could not read or convert."""
    frame.attrs[UNREADABLE] = sorted(failures)
    return frame


def unreadable(frame: pd.DataFrame) -> list[tuple[str, str]]:
    return list(frame.attrs.get(UNREADABLE, []))


def read_table(path: Path, spec: DatasetSpec, reader: Callable | None = None, **kwargs) -> pd.DataFrame:
    """A label table read with ``reader`` (default ``pandas.read_csv``); whatever stops the parser (cut off,
    empty, not text, a damaged .xls or .gz) is one :class:`ManifestError` naming the file."""
    try:
        return (reader or pd.read_csv)(path, **kwargs)
    except (FileNotFoundError, ImportError):
        raise
    except Exception as exc:  # noqa: BLE001 - parsers raise many types (ParserError, CalamineError, zlib.error, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ManifestError(f"{path} cannot be read as a table ({type(exc).__name__}: {first}): a cut-off or damaged "
                            f"copy? Put the file as {spec.name} ships it in its place; {spec.name} should read: "
                            f"{spec.layout}") from None


def require_columns(frame: pd.DataFrame, columns: Iterable[str], path: Path, spec: DatasetSpec) -> None:
    """Every column in ``columns`` is in the table read from ``path``; else one message naming the file."""
    columns = list(columns)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ManifestError(f"{path} lacks the column(s) {missing}; {spec.name} reads {columns} from it "
                            f"(found: {[str(c) for c in frame.columns][:20]}). Is it a table of another release, or "
                            f"edited? Put the file as {spec.name} ships it in its place; {spec.name} should read: "
                            f"{spec.layout}")


def whole_numbers(table: pd.DataFrame, columns: Iterable[str], path: Path, allowed: Iterable[int] | None = None) -> pd.DataFrame:
    """``table[columns]`` as integers (grades, 0/1 targets); an empty, fractional or unknown value is one
    message naming the file and the first rows that have one."""
    columns = list(columns)
    values = table[columns].apply(pd.to_numeric, errors="coerce")
    bad = values.isna().any(axis=1) | (values % 1 != 0).any(axis=1)
    if allowed is not None:
        bad |= ~values.isin(list(allowed)).all(axis=1)
    if bad.any():
        rows = table.index[bad][:3].tolist()
        raise ManifestError(f"{path}: {columns} must be whole numbers" + (f" in {sorted(allowed)}" if allowed is not None else "")
                            + f"; {int(bad.sum())} row(s) are not, e.g. data rows {rows} (counted from 0 below the header): "
                            f"{table.loc[rows, columns].to_dict('records')}")
    return values.astype(int)


def require_listed(spec: DatasetSpec, table: Path | str, paths: Iterable[str | Path], root: Path, hint: str = "") -> None:
    """Every file ``table`` lists (``paths``, absolute or relative to ``root``) is there; else one message
    naming the table, how many are missing and the first few of them."""
    paths = [Path(root) / p for p in paths]
    absent = [p for p in paths if not p.is_file()]
    if absent:
        shown = [str(p.relative_to(root)) if p.is_relative_to(root) else str(p) for p in absent[:5]]
        raise ManifestError(f"{len(absent)} of the {len(paths)} files listed in {table} are missing under {root}, e.g. "
                            f"{shown}: {hint or 'an unpack that stopped part-way, or files moved since?'} Put them in "
                            f"place (from {' / '.join(s.where() for s in spec.sources) or 'the dataset'}); "
                            f"{spec.name} should read: {spec.layout}")


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


def check_listed(spec: DatasetSpec, raw_root: Path) -> None:
    """What the download step runs before it marks ``spec`` complete: the check registered with its preparer
    (``@preparer(name, check=...)``: the part of a preparer that converts files left out), else the preparer
    itself (one that only reads tables and lists folders). Raises naming the file when a label table is
    unreadable or lacks a column, or a part or a listed image is missing."""
    from ..registry import PREPARERS

    entry = PREPARERS.get(spec.prepare)
    (entry.info.get("check") or entry.obj)(spec, Path(raw_root))


def prepare_dataset(spec: DatasetSpec, raw_root: Path, manifest_dir: Path | None = None) -> pd.DataFrame:
    """``manifest_dir`` (default ``<raw_root>/../manifests``) is where a derived dataset finds the
    manifests of the datasets it ``depends_on``."""
    from ..registry import PREPARERS

    prepare = PREPARERS.get(spec.prepare).obj
    if spec.depends_on:
        return prepare(spec, Path(raw_root), manifest_dir=Path(manifest_dir or Path(raw_root).parent / "manifests"))
    return prepare(spec, Path(raw_root))
