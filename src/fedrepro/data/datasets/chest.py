"""Chest X-rays: MIMIC-CXR-JPG with its reports (FedDRA's image-text pre-training data), and the
downstream RSNA Pneumonia (classification; boxes -> segmentation masks) and COVIDx CXR.

Manifests of pre-training data carry a ``caption`` column (the ``vlp`` model family reads it).
MIMIC-CXR's 32-way label is built from five CheXpert findings as the paper describes (a finding's
entry not NaN -> 1, so negative and uncertain mentions also count; NaN -> 0); FedDRA's client split
(``lda``) is drawn over it (docs/papers/feddra.md).

Layout facts, and where they come from:
- MIMIC-CXR-JPG 2.0.0 (PhysioNet): ``files/p10/p10000032/s50414267/<dicom_id>.jpg`` and the tables
  ``mimic-cxr-2.0.0-{metadata,split,chexpert}.csv.gz`` at the project root (metadata: ``dicom_id,
  subject_id, study_id, ..., ViewPosition, ...``; split: ``dicom_id, study_id, subject_id, split`` with
  train / validate / test; chexpert: ``subject_id, study_id`` and 14 findings as 1.0 / 0.0 / -1.0 /
  empty): the project page, and MGCA's ``mgca/preprocess/mimic_cxr.py`` and ``constants.py``
  (HKU-MedAI/MGCA), which FedDRA's code (BioMed-AI-Lab-U-Michgan/TMLR_FedDRA) builds on.
- The free-text reports come from another project, MIMIC-CXR 2.0.0 (``mimic-cxr-reports.zip``, as
  FedDRA's README says), one ``s<study_id>.txt`` per study in the same ``files/p../p<subject>/`` tree
  (MGCA's ``preprocess/utils.py`` reads them from ``<root>/files``). Whether the zip unpacks to
  ``files/...`` or ``mimic-cxr-reports/files/...`` is not settled: both are read.
- The image tree (about 570 GB, 377,110 files) has no archive: PhysioNet serves it file by file, so it
  is placed with ``wget -r`` (the project page's command); the tables and the reports zip download
  by themselves with PhysioNet credentials.
- RSNA Pneumonia (Kaggle competition rsna-pneumonia-detection-challenge): ``stage_2_train_labels.csv``
  (``patientId,x,y,width,height,Target``) and ``stage_2_train_images/<patientId>.dcm``, as MGCA's
  ``constants.py`` / ``preprocess/rsna.py`` read them; a top folder named after the competition is
  accepted (not confirmed either way). The DICOMs are JPEG baseline (transfer syntax
  1.2.840.10008.1.2.4.50), 8-bit MONOCHROME2, 1024 x 1024, Secondary Capture written by OFFIS DCMTK
  3.6.0: the pydicom dump of ``stage_2_train_images/0004cfab-14fd-4e49-80ba-63a80b6bddd6.dcm`` in public
  exploratory notebooks of the competition; their JPEG stream is copied as it is.
- COVIDx: FedDRA's README says "version 6 of COVIDx dataset in Kaggle" (andyczhao/covidx-cxr2) and its
  ``constants.py`` (like MGCA's) reads ``train_COVIDx9A.txt`` / ``test_COVIDx9A.txt`` (lines
  ``<patient id> <filename> <label> <source>``, label normal / pneumonia / COVID-19) with the images in
  ``train/`` and ``test/``. The same two label files are in lindawangg/COVID-Net, ``labels/``. Later
  Kaggle versions ship binary ``train.txt`` / ``test.txt`` (positive / negative), which cannot be
  mapped onto the three classes; the download pins version 6.
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
from ..prepare import (
    find_file,
    missing_folder,
    read_table,
    require_columns,
    require_listed,
    whole_numbers,
    with_unreadable,
)
from ..report_sections import report_sections
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
MIMIC_JPG = "mimic-cxr-jpg/2.0.0"
MIMIC_WGET = (f"the image tree has no archive: wget -r -N -c -np --user <physionet user> --ask-password "
              f"https://physionet.org/files/{MIMIC_JPG}/files/ (about 570 GB), then move the folder "
              f"physionet.org/files/{MIMIC_JPG}/files to resources/raw/mimic_cxr/files")
MIMIC_TABLES = ("mimic-cxr-2.0.0-metadata.csv", "mimic-cxr-2.0.0-split.csv", "mimic-cxr-2.0.0-chexpert.csv")
MIMIC_REPORT_PARENTS = ("", "mimic-cxr-reports")   # mimic-cxr-reports.zip unpacks to files/... or mimic-cxr-reports/files/...


def _mimic_table_source(table: str) -> Source:
    return Source("physionet", f"{MIMIC_JPG}/{table}.gz", filename=f"{table}.gz", extract=False,
                  provides=("|".join(f"{folder}{name}" for folder in ("", "downloads/") for name in (f"{table}.gz", table)),),
                  note="digest: trust-on-first-use")


register_dataset(DatasetSpec(
    name="mimic_cxr",
    title="MIMIC-CXR-JPG 2.0.0 images + MIMIC-CXR 2.0.0 free-text reports (Johnson et al. 2019)",
    classes=MIMIC_CLASSES,
    sources=(
        *(_mimic_table_source(table) for table in MIMIC_TABLES),
        Source("physionet", "mimic-cxr/2.0.0/mimic-cxr-reports.zip", filename="mimic-cxr-reports.zip",
               provides=("files/p1*/p*/s*.txt|mimic-cxr-reports/files/p1*/p*/s*.txt",),
               note="MIMIC-CXR (not -JPG) project, same credentials; digest: trust-on-first-use"),
        Source("request", f"physionet.org/files/{MIMIC_JPG}/files/", provides=("files/p1*/p*/s*/*.jpg",), note=MIMIC_WGET),
    ),
    layout="files/p10/p10000032/s50414267/<dicom_id>.jpg (MIMIC-CXR-JPG), the reports files/p10/p10000032/s50414267.txt "
           "(mimic-cxr-reports.zip unpacks into the same tree, or into mimic-cxr-reports/files/), and "
           "mimic-cxr-2.0.0-{metadata,split,chexpert}.csv.gz (in the dataset folder or its downloads/)",
    prepare="mimic_cxr",
    access="credentialed",
    homepage="https://physionet.org/content/mimic-cxr-jpg/2.0.0/",
    citation="doi:10.13026/8360-t248 (MIMIC-CXR-JPG); doi:10.13026/C2JT1Q (MIMIC-CXR)",
    licence="PhysioNet Credentialed Health Data License 1.5.0 (CITI training + data use agreement)",
    used_by=("feddra",),
    options={"views": ("PA", "AP"), "min_tokens": 3},
))

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


def report_caption(text: str, study: int | None = None) -> str:
    """Impression + " " + findings of a report (as MGCA/FedDRA pre-train on), cleaned: the sections by MIT-LCP's
    rules (:mod:`fedrepro.data.report_sections`, the data's own definition, under both protocols); a study with
    neither (or one MIT-LCP sections by hand, absent from its sectioned table) has none, as MGCA's
    ``preprocess/mimic_cxr.py`` drops it. A missing one of the two reads as a space (MGCA's ``fillna(" ")``)."""
    sections = report_sections(text, None if study is None else f"s{study}")
    if "impression" not in sections and "findings" not in sections:
        return ""
    return clean_caption(sections.get("impression", " ") + " " + sections.get("findings", " "))


def findings_code(row: pd.Series) -> int:
    """The paper's 32-way label: bit i set when FINDINGS[i] is not NaN."""
    return int(sum(1 << i for i, name in enumerate(FINDINGS) if not pd.isna(row.get(name))))


MIMIC_COLUMNS = {"mimic-cxr-2.0.0-metadata.csv": ("dicom_id", "subject_id", "study_id", "ViewPosition"),
                 "mimic-cxr-2.0.0-split.csv": ("dicom_id", "split"),
                 "mimic-cxr-2.0.0-chexpert.csv": ("subject_id", "study_id", *FINDINGS)}


def _table(base: Path, stem: str, spec: DatasetSpec) -> tuple[pd.DataFrame, Path]:
    for folder in (base, base / "downloads"):
        for name in (f"{stem}.gz", stem):
            if (folder / name).exists():
                table = read_table(folder / name, spec)
                require_columns(table, MIMIC_COLUMNS[stem], folder / name, spec)
                return table, folder / name
    raise FileNotFoundError(f"{stem}(.gz) not found in {base} or {base / 'downloads'}: it downloads with "
                            f"`fedrepro download mimic_cxr --raw-dir {base.parent}` (PhysioNet credentials), or place "
                            f"https://physionet.org/files/{MIMIC_JPG}/{stem}.gz there by hand")


def _report(base: Path, folder: str, study: int) -> Path | None:
    for parent in MIMIC_REPORT_PARENTS:
        path = base / parent / folder / f"s{study}.txt"
        if path.is_file():
            return path
    return None


def mimic_frontal_images(spec: DatasetSpec, raw_root: Path) -> tuple[pd.DataFrame, dict[int, Path]]:
    """The frontal (PA/AP) images of the three tables, merged, and the report of each of their studies;
    every report and every image checked to be there (what the download step checks, without reading
    the 227,835 reports). A study without a report file is an error naming the missing reports (an
    unpacked reports zip has one for every study)."""
    base = raw_root / spec.name
    if not (base / "files").is_dir():
        raise missing_folder(base / "files", spec)
    meta, meta_path = _table(base, "mimic-cxr-2.0.0-metadata.csv", spec)
    split, _ = _table(base, "mimic-cxr-2.0.0-split.csv", spec)
    chexpert, _ = _table(base, "mimic-cxr-2.0.0-chexpert.csv", spec)
    meta = meta[meta["ViewPosition"].isin(spec.options["views"])]
    frame = meta[["dicom_id", "subject_id", "study_id", "ViewPosition"]].merge(
        split[["dicom_id", "split"]], on="dicom_id").merge(chexpert, on=["subject_id", "study_id"], how="left")
    frame["folder"] = [f"files/p{str(int(s))[:2]}/p{int(s)}" for s in frame["subject_id"]]
    reports, no_report = {}, []
    for folder, study in frame[["folder", "study_id"]].drop_duplicates().itertuples(index=False):
        report = _report(base, folder, int(study))
        if report is None:
            no_report.append(f"{folder}/s{int(study)}.txt")
        reports[int(study)] = report
    if no_report:
        raise ManifestError(
            f"{len(no_report)} of {len(reports)} studies have no report in {base} (looked in "
            f"files/... and mimic-cxr-reports/files/...), e.g. {no_report[:3]}. The reports are "
            f"mimic-cxr-reports.zip of PhysioNet project mimic-cxr 2.0.0 (https://physionet.org/content/mimic-cxr/2.0.0/): "
            f"`fedrepro download mimic_cxr --raw-dir {raw_root}` fetches and unpacks it with PhysioNet credentials, or "
            f"unpack it into {base}/ by hand")
    frame["path"] = [f"{spec.name}/{folder}/s{int(study)}/{dicom}.jpg"
                     for folder, study, dicom in frame[["folder", "study_id", "dicom_id"]].itertuples(index=False)]
    require_listed(spec, meta_path, frame["path"], raw_root, hint="the image tree (files/, placed with wget -r) is incomplete;")
    return frame, reports


@preparer("mimic_cxr", check=mimic_frontal_images)
def mimic_cxr(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """Frontal (PA/AP) images with a report; caption = impression + findings (:func:`report_caption`; studies
    whose caption has fewer than ``min_tokens`` tokens are dropped); label = the 32-way findings code; split =
    MIMIC-CXR-JPG's official split (validate -> val; MGCA's "valid", validate and test together, is the split
    spec's ``merge_splits: {test: val}``)."""
    frame, reports = mimic_frontal_images(spec, raw_root)
    captions = {study: report_caption(path.read_text(errors="replace"), study) for study, path in reports.items()}
    rows = []
    for rec in frame.to_dict("records"):
        study = int(rec["study_id"])
        if len(captions[study].split()) < spec.options["min_tokens"]:
            continue
        code = findings_code(pd.Series({k: rec.get(k) for k in FINDINGS}))
        rows.append({"path": rec["path"], "class_name": MIMIC_CLASSES[code],
                     "split": {"validate": "val"}.get(rec["split"], rec["split"]), "caption": captions[study],
                     "subject_id": int(rec["subject_id"]), "study_id": study, "view": rec["ViewPosition"]})
    return make_manifest(rows, spec.classes)


# --------------------------------------------------------------------------------------------
# RSNA Pneumonia (classification; boxes -> segmentation masks)

register_dataset(DatasetSpec(
    name="rsna_pneumonia",
    title="RSNA Pneumonia Detection Challenge, stage 2 training set (Shih et al. 2019)",
    classes=("normal", "pneumonia"),
    sources=(Source("kaggle_competition", "rsna-pneumonia-detection-challenge",
                    filename="rsna-pneumonia-detection-challenge.zip", top="rsna-pneumonia-detection-challenge",
                    note="accept the competition rules on kaggle.com first; digest: trust-on-first-use"),),
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


RSNA_COLUMNS = ("patientId", "x", "y", "width", "height", "Target")


def rsna_pneumonia_patients(spec: DatasetSpec, raw_root: Path) -> list[tuple[str, pd.DataFrame, Path]]:
    """(patient, label rows, DICOM) of every patient of ``stage_2_train_labels.csv``, each DICOM checked
    to be there: what the download step checks."""
    base = raw_root / spec.name
    labels_csv = find_file(base, "stage_2_train_labels.csv", spec, max_depth=1, search_downloads=False)
    dicoms = labels_csv.parent / "stage_2_train_images"
    if not dicoms.is_dir():
        raise missing_folder(dicoms, spec)
    table = read_table(labels_csv, spec)
    require_columns(table, RSNA_COLUMNS, labels_csv, spec)
    table["Target"] = whole_numbers(table, ("Target",), labels_csv, allowed=(0, 1))["Target"]
    patients = [(str(patient), group, dicoms / f"{patient}.dcm") for patient, group in table.groupby("patientId", sort=True)]
    require_listed(spec, labels_csv, [path for *_, path in patients], raw_root)
    return patients


@preparer("rsna_pneumonia", check=rsna_pneumonia_patients)
def rsna_pneumonia(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """One row per patient: label = any Target 1, ``boxes`` = JSON [[x, y, w, h], ...] in pixels of the
    1024 x 1024 image. The DICOMs are converted once into ``images/`` (the encapsulated JPEG copied
    byte for byte); one that cannot be read keeps its DICOM path and is listed as unreadable
    (``data.corrupt_images``). The official test images have no labels, so train/val/test are a
    stratified 70/15/15 split of the training patients (fixed seed) [the paper gives no split]."""
    from ..dicom import DicomError, convert_dicom

    base = raw_root / spec.name
    rows, failed = [], []
    for patient, group, source in rsna_pneumonia_patients(spec, raw_root):
        converted = [p for p in (base / "images" / f"{patient}.jpg", base / "images" / f"{patient}.png") if p.exists()]
        try:
            image = converted[0] if converted else convert_dicom(source, base / "images" / patient)
        except DicomError as error:
            image = source
            failed.append((source.relative_to(raw_root).as_posix(), error.reason))
        positive = group[group["Target"] == 1]
        boxes = [[float(r.x), float(r.y), float(r.width), float(r.height)] for r in positive.itertuples()]
        rows.append({"path": image.relative_to(raw_root).as_posix(), "class_name": "pneumonia" if len(positive) else "normal",
                     "boxes": json.dumps(boxes), "patient": patient})
    frame = make_manifest(rows, spec.classes)
    frame["split"] = stratified_split(frame["label"].to_numpy(), spec.options["split_fractions"], numpy_rng(0, "rsna-split"))
    return with_unreadable(frame, failed)


# --------------------------------------------------------------------------------------------
# COVIDx CXR

COVIDX_LABELS = {"normal": "normal", "pneumonia": "pneumonia", "covid-19": "covid19", "covid19": "covid19"}
COVIDX_KAGGLE, COVIDX_VERSION = "andyczhao/covidx-cxr2", "6"
COVIDX_LABEL_FILES = {split: (f"{split}_COVIDx9A.txt", f"{split}.txt") for split in ("train", "val", "test")}
COVIDX_3CLASS_HELP = (f"FedDRA uses the 3-class COVIDx9A labels: version {COVIDX_VERSION} of the Kaggle dataset {COVIDX_KAGGLE} "
                      f"has train_COVIDx9A.txt and test_COVIDx9A.txt (`fedrepro download covidx` fetches that version), and "
                      f"the same two files are in https://github.com/lindawangg/COVID-Net/tree/master/labels")

register_dataset(DatasetSpec(
    name="covidx",
    title="COVIDx CXR (Wang et al. 2020), 3-class release COVIDx9A (normal / non-COVID pneumonia / COVID-19)",
    classes=("normal", "pneumonia", "covid19"),
    sources=(Source("kaggle_dataset", COVIDX_KAGGLE, filename=f"covidx-cxr2-v{COVIDX_VERSION}.zip", version=COVIDX_VERSION,
                    provides=("train", "test", "train_COVIDx9A.txt|train.txt", "test_COVIDx9A.txt|test.txt"),
                    note="the version FedDRA used (its README); later versions have binary labels; "
                         "digest: trust-on-first-use"),),
    layout="train/ and test/ image folders with train_COVIDx9A.txt and test_COVIDx9A.txt (or train.txt, test.txt, "
           "val.txt of other releases): one line per image '<patient id> <filename> <label> <source>', label in "
           "normal / pneumonia / COVID-19",
    prepare="covidx",
    access="account",
    homepage=f"https://www.kaggle.com/datasets/{COVIDX_KAGGLE}",
    citation="doi:10.1038/s41598-020-76550-z",
    used_by=("feddra",),
))


@preparer("covidx")
def covidx(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """COVIDx label files -> manifest with the official train/val/test split. FedDRA (following MGCA)
    uses the 3-class version; the later binary release (positive/negative) cannot be mapped onto it.
    ``<split>_COVIDx9A.txt`` is read where it exists, else ``<split>.txt``."""
    base = raw_root / spec.name
    rows, listings = [], []
    for split, names in COVIDX_LABEL_FILES.items():
        listing = next((base / n for n in names if (base / n).is_file()), None)
        if listing is None:
            if split == "val":
                continue
            raise FileNotFoundError(f"none of {list(names)} in {base}; {COVIDX_3CLASS_HELP}; place them in {base}/")
        listings.append(listing)
        images = base / split if (base / split).is_dir() else base / "train"  # val images live in train/ where there is no val/
        for line_no, line in enumerate(listing.read_text().splitlines(), 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 3:
                raise ManifestError(f"{listing}:{line_no}: expected '<patient> <file> <label> [source]', got {line!r}")
            label = fields[2].lower()
            if label in ("positive", "negative"):
                raise ManifestError(f"{listing}:{line_no}: binary COVIDx label {fields[2]!r} (COVIDx 8B and later); "
                                    f"{COVIDX_3CLASS_HELP}; place them in {base}/")
            if label not in COVIDX_LABELS:
                raise ManifestError(f"{listing}:{line_no}: unknown label {fields[2]!r}; allowed: normal, pneumonia, COVID-19")
            rows.append({"path": (images / fields[1]).relative_to(raw_root).as_posix(), "class_name": COVIDX_LABELS[label],
                         "split": split, "source": fields[3] if len(fields) > 3 else "", "patient": fields[0]})
    require_listed(spec, " and ".join(str(path) for path in listings), [r["path"] for r in rows], raw_root,
                   hint="the label files belong to another release than the images, or an unpack stopped part-way?")
    return make_manifest(rows, spec.classes)
