"""Head CT: RSNA intracranial haemorrhage (ICH), FedIIC's ICH setting.

Kaggle competition ``rsna-intracranial-hemorrhage-detection`` (its rules must be accepted with the
Kaggle account of the API token; about 180 GB zipped). The preparer reads ``stage_2_train.csv`` (rows
``ID_<image>_<subtype>,<0|1>``), keeps the images labelled with exactly one of the five subtypes
(FedIIC, following FedIRM / DynamicBank), windows each DICOM to an 8-bit PNG and writes it once to
``rsna_ich/png/`` (resumable). Windowing: HU = pixels * slope + intercept, clipped to
[center - width/2, center + width/2] and scaled to 0..255; ``window: brain`` uses the standard brain
window (40, 80) for every image, ``dicom`` the file's own WindowCenter/WindowWidth; ``png_size``
resizes (0 keeps 512 x 512). DICOM files are read with pydicom (:mod:`fedrepro.data.dicom`); a slice
that cannot be read is listed as unreadable and left out or refused as ``data.corrupt_images`` says.

Slices stored with 12 bits, unsigned, and a rescale intercept above -100 (BitsStored 12,
PixelRepresentation 0, RescaleIntercept > -100) have values that only make sense shifted: before
windowing they are corrected as the widely copied ``correct_dcm`` of the Kaggle notebooks
reppic/gradient-sigmoid-windowing and akensert/rsna-inceptionv3-keras-tf1-14-0 does (stored + 1000,
values of 4096 and above wrapped down by 4096, intercept -1000); without it those slices are windowed
wrongly (:func:`correct_12bit`).

Layout facts, and where they come from:
- ``stage_2_train.csv`` (columns ``ID,Label``; ``ID`` = ``ID_<image>_<subtype>``, subtypes epidural,
  intraparenchymal, intraventricular, subarachnoid, subdural, any; a few rows are duplicated) and
  ``stage_2_train/ID_<image>.dcm``: the competition's data page, the RSNA AI-Challenge-Data wiki
  ("RSNA Intracranial Hemorrhage Detection") and public kernels that read them.
- The archive from Kaggle's "download all" keeps a top folder ``rsna-intracranial-hemorrhage-detection/``
  (public kernels read ``/kaggle/input/rsna-intracranial-hemorrhage-detection/rsna-intracranial-hemorrhage-detection/stage_2_train/``).
  Not confirmed for the API's zip itself: both ways are accepted (``Source.top`` is stripped when
  unpacking and accepted when placed by hand).

The authors' images (``rsna_ich_stage1_png``, the ICH setting's dataset under the ``paper``
protocol): FedIIC's README points to the Kaggle notebook guiferviz/prepare-dataset-resizing-and-saving-as-png
and its ``ichDataset`` (wnn2000/FedIIC, ``dataset/dataset.py``) reads ``stage_1_train_images/<id>.png``.
That notebook (read from a public copy) windows each slice with the file's own WindowCenter/Width,
scales the windowed slice min-max to 0..255 and resizes it bicubically to 128 x 128; its published
output is the Kaggle dataset guiferviz/rsna_stage1_png_128 (``stage_1_train_images/``,
``stage_1_test_images/``), which that dataset takes as it is. Its labels: ``ichDataset`` reads them from
``<root>/data.csv`` (columns ``id``, ``class``: one single-subtype class per slice, split 7:1:2 with
``np.random.seed(0)``), a file the FedIIC repository does not release. Its public source is the
competition's label table: ``stage_1_train.csv`` where placed, else ``stage_2_train.csv`` (which labels
every stage-1 training slice and every stage-1 test slice), reduced to the slices labelled with exactly
one subtype, as FedIIC's single-label task (and FedIRM / DynamicBank before it) needs. With
``stage_2_train.csv`` every labelled slice must have its PNG in ``stage_1_train_images/`` or
``stage_1_test_images/`` (the test slices are left out), so a missing PNG is named, not taken for a
test slice. Whether the PNG dataset ships a label table of its own is not confirmed; either is accepted.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ...registry import preparer, register_dataset
from ..manifest import ManifestError, make_manifest
from ..prepare import (
    find_file,
    find_folder,
    missing_folder,
    read_table,
    require_columns,
    require_listed,
    with_unreadable,
)
from ..spec import DatasetSpec, Source

log = logging.getLogger(__name__)

ICH_SUBTYPES = ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural")
BRAIN_WINDOW = (40.0, 80.0)
ICH_COMPETITION = "rsna-intracranial-hemorrhage-detection"

register_dataset(DatasetSpec(
    name="rsna_ich",
    title="RSNA Intracranial Hemorrhage Detection (stage 2 train), single-subtype slices windowed to PNG",
    classes=ICH_SUBTYPES,
    sources=(Source("kaggle_competition", ICH_COMPETITION, filename=f"{ICH_COMPETITION}.zip", top=ICH_COMPETITION,
                    provides=("stage_2_train.csv", "stage_2_train"),
                    note="accept the competition rules on kaggle.com first; about 180 GB zipped, 450 GB unpacked; "
                         "digest: trust-on-first-use"),),
    layout="stage_2_train.csv and stage_2_train/ID_<image>.dcm (the competition archive, unpacked; its top folder "
           f"{ICH_COMPETITION}/ may stay); the preparer writes png/ID_<image>.png",
    prepare="rsna_ich",
    access="rules",
    homepage=f"https://www.kaggle.com/competitions/{ICH_COMPETITION}",
    citation="Flanders et al., Radiology: Artificial Intelligence 2(3):e190211, 2020",
    licence="competition rules (non-commercial research)",
    used_by=("fediic",),
    expected_files=("stage_2_train.csv", "stage_2_train"),
    options={"window": "brain", "png_size": 256},
))

register_dataset(DatasetSpec(
    name="rsna_ich_stage1_png",
    title="RSNA ICH as FedIIC's authors used it: stage-1 training slices as 128 px PNGs (Kaggle guiferviz/rsna_stage1_png_128)",
    classes=ICH_SUBTYPES,
    sources=(
        Source("kaggle_dataset", "guiferviz/rsna_stage1_png_128", filename="rsna_stage1_png_128.zip",
               provides=("**/stage_1_train_images",),
               note="the output of the notebook FedIIC's README names (guiferviz/prepare-dataset-resizing-and-saving-as-png); "
                    "digest: trust-on-first-use"),
        Source("kaggle_competition", f"{ICH_COMPETITION}/stage_2_train.csv", filename="stage_2_train.csv", extract=False,
               provides=("**/stage_1_train.csv|**/stage_2_train.csv",),
               note="the label table only (accept the competition rules first); stage_1_train.csv, where you have it, "
                    "is read instead; digest: trust-on-first-use"),
    ),
    layout="stage_1_train_images/ID_<image>.png and stage_1_test_images/ID_<image>.png (128 x 128, possibly below a "
           "wrapper folder) and stage_1_train.csv or stage_2_train.csv (ID,Label) in the dataset folder or downloads/",
    prepare="rsna_ich_stage1_png",
    access="rules",
    homepage="https://www.kaggle.com/datasets/guiferviz/rsna_stage1_png_128",
    citation="Flanders et al., Radiology: Artificial Intelligence 2(3):e190211, 2020",
    licence="competition rules (non-commercial research)",
    used_by=("fediic",),
))


def single_type_labels(frame: pd.DataFrame, path: Path, spec: DatasetSpec) -> pd.DataFrame:
    """stage_2_train.csv (ID = ID_<image>_<type>, Label) -> [image, subtype] for images positive for
    'any' and exactly one of the five subtypes; a table without those columns, types or 0/1 labels is an
    error naming ``path``."""
    require_columns(frame, ("ID", "Label"), path, spec)
    frame = frame.drop_duplicates("ID")
    parts = frame["ID"].astype(str).str.rsplit("_", n=1, expand=True)
    labels = pd.to_numeric(frame["Label"], errors="coerce")
    if parts.shape[1] < 2 or labels.isna().any():
        bad = frame[labels.isna()]["ID"].head(3).tolist() if labels.isna().any() else frame["ID"].head(3).tolist()
        raise ManifestError(f"{path}: rows must read ID_<image>_<type>,<0|1>; e.g. {bad} do not")
    wide = pd.DataFrame({"image": parts[0], "type": parts[1], "label": labels.astype(int)}) \
        .pivot_table(index="image", columns="type", values="label", aggfunc="max")
    missing = [t for t in (*ICH_SUBTYPES, "any") if t not in wide.columns]
    if missing:
        raise ManifestError(f"{path} has no rows for the types {missing} (ID_<image>_<type>); is it the competition's "
                            f"label table?")
    subtypes = wide[list(ICH_SUBTYPES)].fillna(0)
    keep = (wide["any"].fillna(0) == 1) & (subtypes.sum(axis=1) == 1)
    chosen = subtypes[keep].idxmax(axis=1)
    return pd.DataFrame({"image": chosen.index, "subtype": chosen.to_numpy()}).sort_values("image").reset_index(drop=True)


def read_label_table(path: Path, spec: DatasetSpec) -> pd.DataFrame:
    """A competition label table, also when Kaggle's single-file download sent it zipped."""
    import zipfile

    return read_table(path, spec, compression="zip" if zipfile.is_zipfile(path) else "infer")


def correct_12bit(pixels: np.ndarray, intercept: float, bits_stored: int | None, signed: bool) -> tuple[np.ndarray, float]:
    """(pixels, intercept) of a slice whose 12-bit unsigned values carry a rescale intercept above -100,
    shifted as the Kaggle notebooks' ``correct_dcm`` does: +1000, values >= 4096 wrapped down by
    4096, intercept -1000. Other slices are returned unchanged."""
    if bits_stored != 12 or signed or not intercept > -100:
        return pixels, intercept
    shifted = pixels.astype(np.int32) + 1000
    shifted[shifted >= 4096] -= 4096
    return shifted, -1000.0


def window_ct(pixels: np.ndarray, slope: float, intercept: float, center: float, width: float) -> np.ndarray:
    """Stored pixel values -> Hounsfield units -> window [center -+ width/2] -> uint8 0..255."""
    hu = pixels.astype(np.float64) * slope + intercept
    low, high = center - width / 2.0, center + width / 2.0
    return np.round((np.clip(hu, low, high) - low) / (high - low) * 255.0).astype(np.uint8)


def read_dicom(path: Path) -> tuple[np.ndarray, dict]:
    """(stored pixel array, {slope, intercept, center, width}) of a CT slice (any transfer syntax pydicom
    decodes), the 12-bit correction applied (:func:`correct_12bit`); the file's own window falls back to
    the brain window when it has none. An unreadable slice raises :class:`~fedrepro.data.dicom.DicomError`."""
    from ..dicom import read_dicom as read_file

    image = read_file(path, keep_jpeg=False)
    pixels, intercept = correct_12bit(image.pixels, image.intercept, image.bits_stored, image.signed)
    center, width = image.window or BRAIN_WINDOW
    return pixels, {"slope": image.slope, "intercept": intercept, "center": center, "width": width}


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


def rsna_ich_slices(spec: DatasetSpec, raw_root: Path) -> list[tuple[str, str, Path]]:
    """(image, subtype, DICOM) of every single-subtype slice of ``stage_2_train.csv`` (the archive's top
    folder may be kept), each DICOM checked to be there: what the download step checks."""
    base = raw_root / spec.name
    table = find_file(base, "stage_2_train.csv", spec, max_depth=1, search_downloads=False)
    dicoms = table.parent / "stage_2_train"
    if not dicoms.is_dir():
        raise missing_folder(dicoms, spec)
    labels = single_type_labels(read_label_table(table, spec), table, spec)
    slices = [(image, subtype, dicoms / f"{image}.dcm") for image, subtype in labels.itertuples(index=False)]
    require_listed(spec, table, [path for *_, path in slices], raw_root)
    return slices


@preparer("rsna_ich", check=rsna_ich_slices)
def prepare_rsna_ich(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """The competition's stage-2 training slices, each windowed to ``png/<image>.png`` once; a slice that
    cannot be read keeps its DICOM path and is listed as unreadable (``data.corrupt_images``)."""
    from tqdm import tqdm

    from ..dicom import DicomError

    base = raw_root / spec.name
    window = spec.options.get("window", "brain")
    if window not in ("brain", "dicom"):
        raise ManifestError(f"rsna_ich option window = {window!r}; allowed: brain, dicom")
    slices = rsna_ich_slices(spec, raw_root)
    rows, failed = [], []
    for image, subtype, dicom in tqdm(slices, desc="DICOM -> PNG", unit="img"):
        png = base / "png" / f"{image}.png"
        if not png.exists():
            try:
                dicom_to_png(dicom, png, window, int(spec.options.get("png_size", 256)))
            except DicomError as error:
                png = dicom
                failed.append((dicom.relative_to(raw_root).as_posix(), error.reason))
        rows.append({"path": png.relative_to(raw_root).as_posix(), "class_name": subtype})
    return with_unreadable(make_manifest(rows, spec.classes), failed)


def rsna_ich_png_slices(spec: DatasetSpec, raw_root: Path) -> list[tuple[Path, str]]:
    """(PNG, subtype) of every single-subtype slice of the label table that has a stage-1 training PNG.
    With ``stage_1_train.csv`` every labelled slice must have one; with the competition's
    ``stage_2_train.csv`` (stage 1's training slices plus its test slices) every labelled slice must be in
    ``stage_1_train_images`` or ``stage_1_test_images``, so a missing PNG is told from a test slice."""
    base = raw_root / spec.name
    images = find_folder(base, "stage_1_train_images", spec)
    table = find_file(base, ("stage_1_train.csv", "stage_2_train.csv"), spec)
    labels = single_type_labels(read_label_table(table, spec), table, spec)
    pngs = {p.stem: p for p in images.iterdir() if p.suffix.lower() == ".png"}
    if table.name == "stage_1_train.csv":
        require_listed(spec, table, [images / f"{i}.png" for i in labels["image"]], raw_root)
    else:
        tests = images.parent / "stage_1_test_images"
        if not tests.is_dir():
            raise missing_folder(tests, spec)
        test_pngs = {p.stem for p in tests.iterdir() if p.suffix.lower() == ".png"}
        require_listed(spec, table, [images / f"{i}.png" for i in labels["image"] if i not in test_pngs], raw_root,
                       hint=f"labelled slices that are neither in {images.name}/ nor in {tests.name}/;")
    present = [(pngs[image], subtype) for image, subtype in labels.itertuples(index=False) if image in pngs]
    if not present:
        raise ManifestError(f"none of the {len(labels)} single-subtype slices of {table} has a PNG in {images}")
    return present


@preparer("rsna_ich_stage1_png")
def prepare_rsna_ich_stage1_png(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """The authors' PNGs as they are; label = the single subtype of each slice in the label table
    (slices with none or several subtypes are left out, as for ``rsna_ich``)."""
    rows = [{"path": png.relative_to(raw_root).as_posix(), "class_name": subtype}
            for png, subtype in rsna_ich_png_slices(spec, raw_root)]
    return make_manifest(rows, spec.classes)
