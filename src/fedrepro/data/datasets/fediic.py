"""Datasets of FedIIC (spec §3.3): RSNA intracranial haemorrhage (ICH), the sources of the unreleased
"Real" multi-source dermoscopy set (PH2, the Interactive Atlas of Dermoscopy via derm7pt) and the
derived sets built from manifests: ``fediic_real`` and the offline long-tailed demo ``demo_digits_lt``.
ISIC 2019 and HAM10000 are declared with the other skin datasets (``isic2019``, ``ham10000``).

RSNA ICH. Kaggle competition ``rsna-intracranial-hemorrhage-detection`` (its rules must be accepted
with the Kaggle account of the API token; about 180 GB zipped). The preparer reads
``stage_2_train.csv`` (rows ``ID_<image>_<subtype>,<0|1>``), keeps the images labelled with exactly
one of the five subtypes (FedIIC, following FedIRM / DynamicBank), windows each DICOM to an 8-bit
PNG and writes it once to ``rsna_ich/png/`` (resumable). Windowing: HU = pixels * slope + intercept,
clipped to [center - width/2, center + width/2] and scaled to 0..255; ``window: brain`` uses the
standard brain window (40, 80) for every image, ``dicom`` the file's own WindowCenter/WindowWidth;
``png_size`` resizes (0 keeps 512 x 512). The exact window and size of the Kaggle notebook the authors
followed are not stated [GAP]: brain window and 256 px are our defaults. DICOM files are read by the
project's own reader (``fedrepro.data.dicom``), no extra dependency.

"Real" (``fediic_real``). The authors never released it; it is rebuilt from the sources the paper
names, with these documented choices:
- five clients = PH2 (``ph2``), the Interactive Atlas of Dermoscopy (``atlas``: the derm7pt release of
  its dermoscopic images) and the three largest HAM10000 sub-sources (``vidir_molemax``,
  ``vidir_modern``, ``rosendahl``; ``vienna_dermatology`` has only 439 images and is left out);
- classes = the seven HAM10000 classes in ISIC naming (MEL, NV, BCC, AK, BKL, DF, VASC); PH2 common
  and atypical nevi -> NV, melanoma -> MEL; derm7pt diagnoses mapped to the same scheme (nevi -> NV,
  melanomas -> MEL, seborrheic keratosis and lentigo -> BKL, ...; melanosis / miscellaneous dropped);
- test = ``test_size`` (3,000) images drawn with a fixed seed from the ISIC 2019 training images of
  these classes that are not HAM10000 images (so no overlap with any client), ``split = test``.
PH2 and derm7pt are obtained by request / registration and placed by hand (the download step says
where and checks the layout).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ..manifest import make_manifest
from ..prepare import dependency_manifest, missing_folder, preparer
from ..registry import DatasetSpec, Source, register

log = logging.getLogger(__name__)

ICH_SUBTYPES = ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural")
BRAIN_WINDOW = (40.0, 80.0)
REAL_CLASSES = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC")
REAL_SOURCES = ("ph2", "atlas", "vidir_molemax", "vidir_modern", "rosendahl")
PH2_CLASSES = ("common_nevus", "atypical_nevus", "melanoma")
DERM7PT_CLASSES = ("BCC", "NEV", "MEL", "MISC", "SK")   # derm7pt's own five-way diagnosis grouping

# derm7pt fine diagnosis -> (derm7pt group, FedIIC Real class or None = not used)
DERM7PT_DIAGNOSES = {
    "basal cell carcinoma": ("BCC", "BCC"),
    "blue nevus": ("NEV", "NV"), "clark nevus": ("NEV", "NV"), "combined nevus": ("NEV", "NV"),
    "congenital nevus": ("NEV", "NV"), "dermal nevus": ("NEV", "NV"), "recurrent nevus": ("NEV", "NV"),
    "reed or spitz nevus": ("NEV", "NV"),
    "melanoma": ("MEL", "MEL"), "melanoma (in situ)": ("MEL", "MEL"), "melanoma (less than 0.76 mm)": ("MEL", "MEL"),
    "melanoma (0.76 to 1.5 mm)": ("MEL", "MEL"), "melanoma (more than 1.5 mm)": ("MEL", "MEL"),
    "melanoma metastasis": ("MEL", "MEL"),
    "seborrheic keratosis": ("SK", "BKL"), "lentigo": ("MISC", "BKL"),
    "dermatofibroma": ("MISC", "DF"), "vascular lesion": ("MISC", "VASC"),
    "melanosis": ("MISC", None), "miscellaneous": ("MISC", None),
}
PH2_TO_REAL = {"common_nevus": "NV", "atypical_nevus": "NV", "melanoma": "MEL"}
HAM_TO_REAL = {"akiec": "AK", "bcc": "BCC", "bkl": "BKL", "df": "DF", "mel": "MEL", "nv": "NV", "vasc": "VASC"}

register(DatasetSpec(
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

register(DatasetSpec(
    name="ph2",
    title="PH2 dermoscopic image database (200 images; Mendonca et al., EMBC 2013)",
    classes=PH2_CLASSES,
    sources=(Source("request", "https://www.fc.up.pt/addi/ph2%20database.html",
                    note="fill in the request form on the PH2 page; the archive unpacks to PH2Dataset/"),),
    layout="PH2Dataset/PH2_dataset.txt and PH2Dataset/PH2 Dataset images/IMD<nnn>/IMD<nnn>_Dermoscopic_Image/IMD<nnn>.bmp",
    prepare="ph2",
    access="request",
    homepage="https://www.fc.up.pt/addi/ph2%20database.html",
    citation="doi:10.1109/EMBC.2013.6610779",
    used_by=("fediic",),
    expected_files=("PH2Dataset/PH2_dataset.txt",),
))

register(DatasetSpec(
    name="derm7pt",
    title="derm7pt: dermoscopic images of the Interactive Atlas of Dermoscopy (Argenziano et al. 2000; Kawahara et al. 2019)",
    classes=DERM7PT_CLASSES,
    sources=(Source("request", "https://derm.cs.sfu.ca",
                    note="register on derm.cs.sfu.ca and download release_v0.zip"),),
    layout="release_v0/meta/meta.csv (columns diagnosis, derm, ...) and release_v0/images/<folder>/<file>",
    prepare="derm7pt",
    access="request",
    homepage="https://derm.cs.sfu.ca",
    citation="doi:10.1109/JBHI.2018.2824327",
    used_by=("fediic",),
    expected_files=("release_v0/meta/meta.csv",),
))

register(DatasetSpec(
    name="fediic_real",
    title="FedIIC 'Real': five dermoscopy sources as clients (PH2, Atlas, three HAM10000 sub-sources), "
          "ISIC 2019 test set without overlap - rebuilt, the authors' split is unreleased",
    classes=REAL_CLASSES,
    sources=(),
    layout="(derived from the manifests of ph2, derm7pt, ham10000 and isic2019)",
    prepare="fediic_real",
    access="request",
    used_by=("fediic",),
    depends_on=("ph2", "derm7pt", "ham10000", "isic2019"),
    options={"ham_sources": ["vidir_molemax", "vidir_modern", "rosendahl"], "test_size": 3000, "seed": 0},
))

register(DatasetSpec(
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


# --------------------------------------------------------------------------------------------
# RSNA ICH

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


# --------------------------------------------------------------------------------------------
# PH2 and derm7pt (Interactive Atlas of Dermoscopy)

def parse_ph2_table(text: str) -> pd.DataFrame:
    """PH2_dataset.txt ('||'-separated table with a 'Name' and a 'Clinical Diagnosis' column:
    0 common nevus, 1 atypical nevus, 2 melanoma) -> [name, class_name]."""
    header, rows = None, []
    for line in text.splitlines():
        if "||" not in line:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("||")]
        if header is None and cells and cells[0].lower() == "name":
            header = [c.lower() for c in cells]
        elif header is not None and cells and cells[0].upper().startswith("IMD"):
            rows.append(cells)
    if header is None or "clinical diagnosis" not in header:
        raise ValueError("PH2_dataset.txt: no header row with 'Name' and 'Clinical Diagnosis' columns")
    col = header.index("clinical diagnosis")
    names = {"0": "common_nevus", "1": "atypical_nevus", "2": "melanoma"}
    out = []
    for cells in rows:
        code = cells[col] if col < len(cells) else ""
        if code not in names:
            raise ValueError(f"PH2_dataset.txt: image {cells[0]} has clinical diagnosis {code!r}; expected 0, 1 or 2")
        out.append({"name": cells[0], "class_name": names[code]})
    return pd.DataFrame(out)


@preparer("ph2")
def prepare_ph2(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    root = raw_root / spec.name / "PH2Dataset"
    table = root / "PH2_dataset.txt"
    if not table.exists():
        raise missing_folder(table, spec)
    rows = []
    for rec in parse_ph2_table(table.read_text(encoding="utf-8", errors="replace")).itertuples(index=False):
        image = root / "PH2 Dataset images" / rec.name / f"{rec.name}_Dermoscopic_Image" / f"{rec.name}.bmp"
        if not image.exists():
            raise FileNotFoundError(f"{image} listed in {table} is missing; {spec.name} should read: {spec.layout}")
        rows.append({"path": image.relative_to(raw_root).as_posix(), "class_name": rec.class_name, "source": "ph2"})
    return make_manifest(rows, spec.classes)


@preparer("derm7pt")
def prepare_derm7pt(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    root = raw_root / spec.name / "release_v0"
    meta_csv = root / "meta" / "meta.csv"
    if not meta_csv.exists():
        raise missing_folder(meta_csv, spec)
    meta = pd.read_csv(meta_csv)
    for column in ("diagnosis", "derm"):
        if column not in meta.columns:
            raise ValueError(f"{meta_csv} has no column {column!r}; columns: {list(meta.columns)}")
    unknown = sorted(set(meta["diagnosis"].str.strip().str.lower()) - set(DERM7PT_DIAGNOSES))
    if unknown:
        raise ValueError(f"{meta_csv}: diagnoses {unknown} are not mapped; known: {sorted(DERM7PT_DIAGNOSES)}")
    rows = []
    for rec in meta.itertuples(index=False):
        diagnosis = str(rec.diagnosis).strip().lower()
        rows.append({"path": (root / "images" / rec.derm).relative_to(raw_root).as_posix(),
                     "class_name": DERM7PT_DIAGNOSES[diagnosis][0], "source": "atlas", "diagnosis": diagnosis})
    return make_manifest(rows, spec.classes)


# --------------------------------------------------------------------------------------------
# derived sets

def image_id(path: str) -> str:
    """ISIC image id of a path: ISIC_0024306.jpg and ISIC_0024306_downsampled.jpg -> ISIC_0024306."""
    return Path(path).stem.replace("_downsampled", "")


@preparer("fediic_real")
def prepare_fediic_real(spec: DatasetSpec, raw_root: Path, manifest_dir: Path) -> pd.DataFrame:
    opts = spec.options
    rows = []
    ph2 = dependency_manifest(manifest_dir, spec, "ph2")
    rows += [{"path": r.path, "class_name": PH2_TO_REAL[r.class_name], "source": "ph2", "split": "train"}
             for r in ph2.itertuples(index=False)]
    atlas = dependency_manifest(manifest_dir, spec, "derm7pt")
    rows += [{"path": r.path, "class_name": DERM7PT_DIAGNOSES[r.diagnosis][1], "source": "atlas", "split": "train"}
             for r in atlas.itertuples(index=False) if DERM7PT_DIAGNOSES[r.diagnosis][1] is not None]
    ham = dependency_manifest(manifest_dir, spec, "ham10000")
    unknown = sorted(set(opts["ham_sources"]) - set(ham["source"]))
    if unknown:
        raise ValueError(f"fediic_real: HAM10000 sub-sources {unknown} not in the ham10000 manifest; "
                         f"available: {sorted(set(ham['source']))}")
    rows += [{"path": r.path, "class_name": HAM_TO_REAL[r.class_name], "source": r.source, "split": "train"}
             for r in ham.itertuples(index=False) if r.source in opts["ham_sources"]]
    isic = dependency_manifest(manifest_dir, spec, "isic2019")
    ham_ids = {image_id(p) for p in ham["path"]}
    pool = isic[isic["class_name"].isin(REAL_CLASSES) & ~isic["path"].map(image_id).isin(ham_ids)]
    if len(pool) < opts["test_size"]:
        raise ValueError(f"fediic_real: only {len(pool)} ISIC 2019 images outside HAM10000 for a test set of {opts['test_size']}")
    picked = pool.iloc[np.sort(np.random.default_rng(opts["seed"]).permutation(len(pool))[: opts["test_size"]])]
    rows += [{"path": r.path, "class_name": r.class_name, "source": "isic2019", "split": "test"}
             for r in picked.itertuples(index=False)]
    return make_manifest(rows, spec.classes)


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
