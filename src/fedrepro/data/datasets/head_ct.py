"""Head CT: RSNA intracranial haemorrhage (ICH), FedIIC's ICH setting.

Kaggle competition ``rsna-intracranial-hemorrhage-detection`` (its rules must be accepted with the
Kaggle account of the API token; about 180 GB zipped). The preparer reads ``stage_2_train.csv`` (rows
``ID_<image>_<subtype>,<0|1>``), keeps the images labelled with exactly one of the five subtypes
(FedIIC, following FedIRM / DynamicBank), windows each DICOM to an 8-bit PNG and writes it once to
``rsna_ich/png/`` (resumable). Windowing: HU = pixels * slope + intercept, clipped to
[center - width/2, center + width/2] and scaled to 0..255; ``window: brain`` uses the standard brain
window (40, 80) for every image, ``dicom`` the file's own WindowCenter/WindowWidth; ``png_size``
resizes (0 keeps 512 x 512). The exact window and size of the Kaggle notebook the authors followed are
not stated: brain window and 256 px are our defaults (docs/papers/fediic.md). DICOM files are read by
the project's own reader (``fedrepro.data.dicom``), no extra dependency.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ...registry import preparer, register_dataset
from ..manifest import make_manifest
from ..prepare import missing_folder
from ..spec import DatasetSpec, Source

log = logging.getLogger(__name__)

ICH_SUBTYPES = ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural")
BRAIN_WINDOW = (40.0, 80.0)

register_dataset(DatasetSpec(
    name="rsna_ich",
    title="RSNA Intracranial Hemorrhage Detection (stage 2 train), single-subtype slices windowed to PNG",
    classes=ICH_SUBTYPES,
    sources=(Source("kaggle_competition", "rsna-intracranial-hemorrhage-detection",
                    filename="rsna-intracranial-hemorrhage-detection.zip",
                    note="accept the competition rules on kaggle.com first"),),
    layout="stage_2_train.csv and stage_2_train/ID_<image>.dcm (the competition archive, unpacked); "
           "the preparer writes png/ID_<image>.png",
    prepare="rsna_ich",
    access="rules",
    homepage="https://www.kaggle.com/competitions/rsna-intracranial-hemorrhage-detection",
    citation="Flanders et al., Radiology: Artificial Intelligence 2(3):e190211, 2020",
    licence="competition rules (non-commercial research)",
    used_by=("fediic",),
    expected_files=("stage_2_train.csv", "stage_2_train"),
    options={"window": "brain", "png_size": 256},
))



def single_type_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """stage_2_train.csv (ID = ID_<image>_<type>, Label) -> [image, subtype] for images positive for
    'any' and exactly one of the five subtypes."""
    if not {"ID", "Label"} <= set(frame.columns):
        raise ValueError(f"stage_2_train.csv must have columns ID, Label; found {list(frame.columns)}")
    frame = frame.drop_duplicates("ID")
    parts = frame["ID"].str.rsplit("_", n=1, expand=True)
    wide = pd.DataFrame({"image": parts[0], "type": parts[1], "label": frame["Label"].astype(int)}) \
        .pivot(index="image", columns="type", values="label")
    missing = [t for t in (*ICH_SUBTYPES, "any") if t not in wide.columns]
    if missing:
        raise ValueError(f"stage_2_train.csv has no rows for the types {missing}")
    subtypes = wide[list(ICH_SUBTYPES)].fillna(0)
    keep = (wide["any"].fillna(0) == 1) & (subtypes.sum(axis=1) == 1)
    chosen = subtypes[keep].idxmax(axis=1)
    return pd.DataFrame({"image": chosen.index, "subtype": chosen.to_numpy()}).sort_values("image").reset_index(drop=True)


def window_ct(pixels: np.ndarray, slope: float, intercept: float, center: float, width: float) -> np.ndarray:
    """Stored pixel values -> Hounsfield units -> window [center -+ width/2] -> uint8 0..255."""
    hu = pixels.astype(np.float64) * slope + intercept
    low, high = center - width / 2.0, center + width / 2.0
    return np.round((np.clip(hu, low, high) - low) / (high - low) * 255.0).astype(np.uint8)


def read_dicom(path: Path) -> tuple[np.ndarray, dict]:
    """(stored pixel array, {slope, intercept, center, width}) of an uncompressed DICOM slice; the
    file's own window falls back to the brain window when it has none."""
    from ..dicom import DicomError
    from ..dicom import read_dicom as read_part10

    image = read_part10(path)
    if image.pixels is None:
        raise DicomError(f"{path}: compressed pixel data; RSNA ICH slices are expected uncompressed")
    center, width = image.window or BRAIN_WINDOW
    return image.pixels, {"slope": image.slope, "intercept": image.intercept, "center": center, "width": width}


def dicom_to_png(source: Path, target: Path, window: str, size: int) -> None:
    from PIL import Image

    from ...io import atomic_path

    pixels, meta = read_dicom(source)
    center, width = BRAIN_WINDOW if window == "brain" else (meta["center"], meta["width"])
    image = Image.fromarray(window_ct(pixels, meta["slope"], meta["intercept"], center, width))
    if size:
        image = image.resize((size, size), Image.BILINEAR)
    with atomic_path(target) as tmp:
        image.save(tmp, format="PNG")


@preparer("rsna_ich")
def prepare_rsna_ich(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    from tqdm import tqdm

    base = raw_root / spec.name
    table, dicoms = base / "stage_2_train.csv", base / "stage_2_train"
    for needed in (table, dicoms):
        if not needed.exists():
            raise missing_folder(needed, spec)
    window = spec.options.get("window", "brain")
    if window not in ("brain", "dicom"):
        raise ValueError(f"rsna_ich option window = {window!r}; allowed: brain, dicom")
    labels = single_type_labels(pd.read_csv(table))
    rows = []
    for image, subtype in tqdm(labels.itertuples(index=False), total=len(labels), desc="DICOM -> PNG", unit="img"):
        png = base / "png" / f"{image}.png"
        if not png.exists():
            dicom_to_png(dicoms / f"{image}.dcm", png, window, int(spec.options.get("png_size", 256)))
        rows.append({"path": png.relative_to(raw_root).as_posix(), "class_name": subtype})
    return make_manifest(rows, spec.classes)


