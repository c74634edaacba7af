"""Chest X-rays: MIMIC-CXR-JPG with its reports (FedDRA's image-text pre-training data), and the
downstream RSNA Pneumonia (classification; boxes -> segmentation masks) and COVIDx CXR.

Manifests of pre-training data carry a ``caption`` column (the ``vlp`` model family reads it).
MIMIC-CXR's 32-way label is built from five CheXpert findings as the paper describes (a finding's
entry not NaN -> 1, so negative and uncertain mentions also count; NaN -> 0); FedDRA's client split
(``lda``) is drawn over it (docs/papers/feddra.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ...registry import preparer, register_dataset
from ...seeding import numpy_rng
from ..manifest import ManifestError, make_manifest
from ..prepare import missing_folder
from ..spec import DatasetSpec, Source

# --------------------------------------------------------------------------------------------
# MIMIC-CXR-JPG + reports

FINDINGS = ("Edema", "Pleural Effusion", "Consolidation", "Pneumothorax", "Pneumonia")
FINDING_NAMES = ("edema", "effusion", "consolidation", "pneumothorax", "pneumonia")


def finding_class_name(code: int) -> str:
    """Class id (bit i = FINDINGS[i] mentioned) -> e.g. 'edema+pneumonia'; 0 -> 'none'."""
    names = [FINDING_NAMES[i] for i in range(len(FINDINGS)) if code >> i & 1]
    return "+".join(names) if names else "none"


MIMIC_CLASSES = tuple(finding_class_name(code) for code in range(2 ** len(FINDINGS)))
MIMIC_WGET = ("wget -r -N -c -np --user <physionet user> --ask-password "
              "https://physionet.org/files/mimic-cxr-jpg/2.0.0/files/  (about 570 GB), then move the "
              "physionet.org/files/mimic-cxr-jpg/2.0.0/files folder to resources/raw/mimic_cxr/files")

register_dataset(DatasetSpec(
    name="mimic_cxr",
    title="MIMIC-CXR-JPG 2.0.0 images + MIMIC-CXR 2.0.0 free-text reports (Johnson et al. 2019)",
    classes=MIMIC_CLASSES,
    sources=(
        Source("request", "physionet.org/files/mimic-cxr-jpg/2.0.0/files/", note=MIMIC_WGET),
        Source("physionet", "mimic-cxr-jpg/2.0.0/mimic-cxr-2.0.0-metadata.csv.gz", filename="mimic-cxr-2.0.0-metadata.csv.gz", extract=False),
        Source("physionet", "mimic-cxr-jpg/2.0.0/mimic-cxr-2.0.0-split.csv.gz", filename="mimic-cxr-2.0.0-split.csv.gz", extract=False),
        Source("physionet", "mimic-cxr-jpg/2.0.0/mimic-cxr-2.0.0-chexpert.csv.gz", filename="mimic-cxr-2.0.0-chexpert.csv.gz", extract=False),
        Source("physionet", "mimic-cxr/2.0.0/mimic-cxr-reports.zip", filename="mimic-cxr-reports.zip"),
    ),
    layout="files/p10/p10000032/s50414267/<dicom_id>.jpg (MIMIC-CXR-JPG), files/p10/p10000032/s50414267.txt "
           "(the reports zip unpacks into the same tree), and mimic-cxr-2.0.0-{metadata,split,chexpert}.csv.gz "
           "(in the dataset folder or its downloads/)",
    prepare="mimic_cxr",
    access="credentialed",
    homepage="https://physionet.org/content/mimic-cxr-jpg/2.0.0/",
    citation="doi:10.13026/8360-t248 (MIMIC-CXR-JPG); doi:10.13026/C2JT1Q (MIMIC-CXR)",
    licence="PhysioNet Credentialed Health Data License 1.5.0 (CITI training + data use agreement)",
    used_by=("feddra",),
    expected_files=("files",),
    options={"views": ("PA", "AP"), "min_tokens": 3},
))

SECTION = re.compile(r"^\s*([A-Z][A-Z /&()-]{2,40}):", re.MULTILINE)


def report_sections(text: str) -> dict[str, str]:
    """Split a MIMIC-CXR report into its upper-case ``HEADING:`` sections (lower-cased keys)."""
    sections = {}
    matches = list(SECTION.finditer(text))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        sections[m.group(1).strip().lower()] = text[m.end():end].strip()
    return sections


def clean_caption(text: str) -> str:
    """MGCA's report cleaning as the FedDRA code runs it (``pretrain_dataset.py``): newlines become spaces,
    the text is cut at numbered-list marks ("1.") and at every "."; a sentence is its lower-cased ``\\w+``
    tokens without their non-ASCII characters; sentences of one token are dropped; the rest are joined
    with spaces (``get_caption``)."""
    sentences = []
    for point in re.split(r"[0-9]+\.", text.replace("\n", " ")):
        for sentence in point.split("."):
            tokens = re.findall(r"\w+", sentence.replace("\ufffd\ufffd", " ").lower())
            if len(tokens) <= 1:
                continue
            tokens = [t for t in (t.encode("ascii", "ignore").decode("ascii") for t in tokens) if t]
            if tokens:
                sentences.append(" ".join(tokens))
    return " ".join(sentences)


def report_caption(text: str) -> str:
    """Impression + " " + findings of a report (as MGCA/FedDRA pre-train on), cleaned."""
    sections = report_sections(text)
    return clean_caption(sections.get("impression", "") + " " + sections.get("findings", ""))


def findings_code(row: pd.Series) -> int:
    """The paper's 32-way label: bit i set when FINDINGS[i] is not NaN."""
    return int(sum(1 << i for i, name in enumerate(FINDINGS) if not pd.isna(row.get(name))))


def _table(base: Path, stem: str) -> pd.DataFrame:
    for folder in (base, base / "downloads"):
        for name in (f"{stem}.gz", stem):
            if (folder / name).exists():
                return pd.read_csv(folder / name)
    raise FileNotFoundError(f"{stem}(.gz) not found in {base} or {base / 'downloads'}; download it from PhysioNet "
                            f"(see `fedrepro download`) or place it there by hand")


@preparer("mimic_cxr")
def mimic_cxr(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """Frontal (PA/AP) images with a report; caption = impression + findings (studies whose caption
    has fewer than ``min_tokens`` tokens are dropped); label = the 32-way findings code; split =
    MIMIC-CXR-JPG's official split (validate -> val)."""
    base = raw_root / spec.name
    if not (base / "files").is_dir():
        raise missing_folder(base / "files", spec)
    meta = _table(base, "mimic-cxr-2.0.0-metadata.csv")
    split = _table(base, "mimic-cxr-2.0.0-split.csv")
    chexpert = _table(base, "mimic-cxr-2.0.0-chexpert.csv")
    meta = meta[meta["ViewPosition"].isin(spec.options["views"])]
    frame = meta[["dicom_id", "subject_id", "study_id", "ViewPosition"]].merge(
        split[["dicom_id", "split"]], on="dicom_id").merge(chexpert, on=["subject_id", "study_id"], how="left")
    captions: dict[int, str] = {}
    rows = []
    for rec in frame.to_dict("records"):
        subject, study = str(int(rec["subject_id"])), int(rec["study_id"])
        folder = f"files/p{subject[:2]}/p{subject}"
        if study not in captions:
            report = base / folder / f"s{study}.txt"
            captions[study] = report_caption(report.read_text(errors="replace")) if report.exists() else ""
        caption = captions[study]
        if len(caption.split()) < spec.options["min_tokens"]:
            continue
        code = findings_code(pd.Series({k: rec.get(k) for k in FINDINGS}))
        rows.append({"path": f"{spec.name}/{folder}/s{study}/{rec['dicom_id']}.jpg", "class_name": MIMIC_CLASSES[code],
                     "split": {"validate": "val"}.get(rec["split"], rec["split"]), "caption": caption,
                     "subject_id": int(rec["subject_id"]), "study_id": study, "view": rec["ViewPosition"]})
    return make_manifest(rows, spec.classes)


# --------------------------------------------------------------------------------------------
# RSNA Pneumonia (classification; boxes -> segmentation masks)

register_dataset(DatasetSpec(
    name="rsna_pneumonia",
    title="RSNA Pneumonia Detection Challenge, stage 2 training set (Shih et al. 2019)",
    classes=("normal", "pneumonia"),
    sources=(Source("kaggle_competition", "rsna-pneumonia-detection-challenge",
                    filename="rsna-pneumonia-detection-challenge.zip"),),
    layout="stage_2_train_images/<patientId>.dcm and stage_2_train_labels.csv "
           "(patientId,x,y,width,height,Target: one row per box, Target 0 rows have no box)",
    prepare="rsna_pneumonia",
    access="rules",
    homepage="https://www.kaggle.com/competitions/rsna-pneumonia-detection-challenge",
    citation="doi:10.1148/ryai.2019180041",
    used_by=("feddra",),
    expected_files=("stage_2_train_images", "stage_2_train_labels.csv"),
    options={"split_fractions": {"train": 0.7, "val": 0.15, "test": 0.15}},
))


def stratified_split(labels: np.ndarray, fractions: dict[str, float], rng: np.random.Generator) -> np.ndarray:
    """A train/val/test assignment per row, stratified by label."""
    out = np.empty(len(labels), dtype=object)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        n_val = int(round(fractions.get("val", 0.0) * len(members)))
        n_test = int(round(fractions.get("test", 0.0) * len(members)))
        out[members[:n_test]] = "test"
        out[members[n_test:n_test + n_val]] = "val"
        out[members[n_test + n_val:]] = "train"
    return out


@preparer("rsna_pneumonia")
def rsna_pneumonia(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """One row per patient: label = any Target 1, ``boxes`` = JSON [[x, y, w, h], ...] in pixels of the
    1024 x 1024 image. The DICOMs are converted once into ``images/`` (the encapsulated JPEG copied
    byte for byte). The official test images have no labels, so train/val/test are a stratified
    70/15/15 split of the training patients (fixed seed) [the paper gives no split]."""
    from ..dicom import convert_dicom

    base = raw_root / spec.name
    labels_csv, dicoms = base / "stage_2_train_labels.csv", base / "stage_2_train_images"
    for required in (labels_csv, dicoms):
        if not required.exists():
            raise missing_folder(required, spec)
    table = pd.read_csv(labels_csv)
    rows = []
    for patient, group in table.groupby("patientId", sort=True):
        source = dicoms / f"{patient}.dcm"
        converted = [p for p in (base / "images" / f"{patient}.jpg", base / "images" / f"{patient}.png") if p.exists()]
        image = converted[0] if converted else convert_dicom(source, base / "images" / patient)
        positive = group[group["Target"] == 1]
        boxes = [[float(r.x), float(r.y), float(r.width), float(r.height)] for r in positive.itertuples()]
        rows.append({"path": image.relative_to(raw_root).as_posix(), "class_name": "pneumonia" if len(positive) else "normal",
                     "boxes": json.dumps(boxes), "patient": patient})
    frame = make_manifest(rows, spec.classes)
    frame["split"] = stratified_split(frame["label"].to_numpy(), spec.options["split_fractions"], numpy_rng(0, "rsna-split"))
    return frame


# --------------------------------------------------------------------------------------------
# COVIDx CXR

COVIDX_LABELS = {"normal": "normal", "pneumonia": "pneumonia", "covid-19": "covid19", "covid19": "covid19"}

register_dataset(DatasetSpec(
    name="covidx",
    title="COVIDx CXR (Wang et al. 2020), 3-class release (normal / non-COVID pneumonia / COVID-19)",
    classes=("normal", "pneumonia", "covid19"),
    sources=(Source("kaggle_dataset", "andyczhao/covidx-cxr2", filename="covidx-cxr2.zip"),),
    layout="train/, test/ (and val/) image folders with train.txt, test.txt (val.txt): one line per image "
           "'<patient id> <filename> <label> <source>', label in normal / pneumonia / COVID-19",
    prepare="covidx",
    access="account",
    homepage="https://www.kaggle.com/datasets/andyczhao/covidx-cxr2",
    citation="doi:10.1038/s41598-020-76550-z",
    used_by=("feddra",),
    expected_files=("train", "test"),
))


@preparer("covidx")
def covidx(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """COVIDx label files -> manifest with the official train/val/test split. FedDRA (following MGCA)
    uses the 3-class version; the later binary release (positive/negative) cannot be mapped onto it."""
    base = raw_root / spec.name
    rows = []
    for split in ("train", "val", "test"):
        listing = base / f"{split}.txt"
        if not listing.exists():
            if split == "val":
                continue
            raise missing_folder(listing, spec)
        for line_no, line in enumerate(listing.read_text().splitlines(), 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 3:
                raise ManifestError(f"{listing}:{line_no}: expected '<patient> <file> <label> [source]', got {line!r}")
            label = fields[2].lower()
            if label in ("positive", "negative"):
                raise ManifestError(f"{listing}:{line_no}: binary COVIDx label {fields[2]!r}; FedDRA uses the 3-class "
                                    f"release (labels normal / pneumonia / COVID-19): place its label files instead")
            if label not in COVIDX_LABELS:
                raise ManifestError(f"{listing}:{line_no}: unknown label {fields[2]!r}; allowed: normal, pneumonia, COVID-19")
            rows.append({"path": f"{spec.name}/{split}/{fields[1]}", "class_name": COVIDX_LABELS[label], "split": split,
                         "source": fields[3] if len(fields) > 3 else "", "patient": fields[0]})
    return make_manifest(rows, spec.classes)


