"""The canonical manifest: one CSV per dataset, everything downstream reads only this.

Columns (one row per image):
    path        image path relative to the raw-data root (``resources/raw``), e.g. ``bt/Training/...``
    label       integer class index into the dataset's class list (registry order)
    class_name  the class's name, for humans
    source      site / domain / sub-source the image comes from (``""`` if the dataset has one)
    split       the dataset's official split: ``train``, ``val``, ``test`` or ``""`` (none)
Datasets may add columns (``caption`` for image-text data, ``patient`` for grouping, ...).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..io import broken, write_csv

REQUIRED_COLUMNS = ("path", "label", "class_name", "source", "split")
OFFICIAL_SPLITS = ("train", "val", "test", "")


class ManifestError(ValueError):
    pass


def make_manifest(rows: list[dict], classes: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """Build a manifest from row dicts holding at least path and class_name (label is derived)."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        raise ManifestError("no images found: check the raw layout against the registry's description")
    index = {name: i for i, name in enumerate(classes)}
    unknown = sorted(set(frame["class_name"]) - set(index))
    if unknown:
        raise ManifestError(f"class names not in the dataset's class list: {unknown}; allowed: {list(classes)}")
    frame["label"] = frame["class_name"].map(index).astype(int)
    for column, default in (("source", ""), ("split", "")):
        if column not in frame:
            frame[column] = default
    frame["source"] = frame["source"].fillna("").astype(str)
    frame["split"] = frame["split"].fillna("").astype(str)
    extra = [c for c in frame.columns if c not in REQUIRED_COLUMNS]
    frame = frame[list(REQUIRED_COLUMNS) + extra]
    # a stable order makes manifests (and everything indexed by row number) reproducible
    return frame.sort_values("path", kind="mergesort").reset_index(drop=True)


def validate_manifest(frame: pd.DataFrame, classes: list[str] | tuple[str, ...] | None = None) -> pd.DataFrame:
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ManifestError(f"manifest lacks columns {missing}; required: {list(REQUIRED_COLUMNS)}")
    if frame["path"].duplicated().any():
        dup = frame.loc[frame["path"].duplicated(), "path"].iloc[0]
        raise ManifestError(f"manifest lists {dup!r} more than once")
    bad_split = sorted(set(frame["split"]) - set(OFFICIAL_SPLITS))
    if bad_split:
        raise ManifestError(f"unknown split values {bad_split}; allowed: {list(OFFICIAL_SPLITS)}")
    if classes is not None:
        n = len(classes)
        if frame["label"].min() < 0 or frame["label"].max() >= n:
            raise ManifestError(f"labels outside 0..{n - 1}")
    return frame


def write_manifest(path: str | Path, frame: pd.DataFrame) -> None:
    write_csv(path, validate_manifest(frame))


def read_manifest(path: str | Path) -> pd.DataFrame:
    """A manifest as ``fedrepro prepare`` wrote it; one whose header or rows are cut off (or that is no CSV) is
    set aside and named with the command that rebuilds it."""
    try:
        frame = pd.read_csv(path, dtype={"path": str, "class_name": str, "source": str, "split": str},
                            keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
        raise broken(path, f"not a readable manifest ({type(error).__name__}: {str(error).splitlines()[0]})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise broken(path, f"not a complete manifest: its header lacks {missing} (required: {list(REQUIRED_COLUMNS)})")
    if len(frame) and not pd.api.types.is_integer_dtype(frame["label"]):
        bad = frame.index[pd.to_numeric(frame["label"], errors="coerce").isna()].tolist()
        raise broken(path, f"cut off or corrupt: row(s) {[i + 2 for i in bad[:5]]} have no integer label")
    return validate_manifest(frame)
