"""Dermoscopy datasets: the Kaggle 9-class ISIC subset ("SC" of FACMIC), the ISIC 2019 training
set, HAM10000, and the multi-source "Real" set of FACMIC (= "SC" of FAA-CLIP) built from all three.

Every manifest here carries an ``image_id`` column (the ISIC image id, ``ISIC_0024306``, with the
``_downsampled`` suffix of some ISIC 2019 files removed), so the same picture can be recognised
across datasets: HAM10000 and most of the Kaggle SC images are also part of ISIC 2019.

Layout facts, and where they come from:
- Kaggle SC (nodoubttome/skin-cancer9-classesisic): ``Skin cancer ISIC The International Skin Imaging
  Collaboration/{Train,Test}/<class folder>/ISIC_<id>.jpg``, in some copies below one more wrapper folder
  (the Kaggle page; both accepted).
- ISIC 2019: ``ISIC_2019_Training_Input.zip`` (folder ``ISIC_2019_Training_Input/``), and the two CSVs
  ``ISIC_2019_Training_GroundTruth.csv`` (``image,MEL,NV,BCC,AK,BKL,DF,VASC,SCC,UNK``, one-hot 0.0/1.0) and
  ``ISIC_2019_Training_Metadata.csv`` (``image,age_approx,anatom_site_general,lesion_id,sex``): the challenge
  page, FLamby's ``fed_isic2019`` and FedIIC's ``SkinDataset`` (wnn2000/FedIIC, ``dataset/dataset.py``).
- HAM10000 (Harvard Dataverse doi:10.7910/DVN/DBW86T): ``HAM10000_images_part_1.zip`` / ``_part_2.zip``
  (ISIC_0024306 ... ISIC_0034320) and the metadata, listed as the ingested ``HAM10000_metadata.tab``
  (``lesion_id,image_id,dx,dx_type,age,sex,localization,dataset``): the Dataverse file listing. Whether the
  zips unpack flat or into a folder is not relied on.
- PH2: ``PH2Dataset/PH2_dataset.txt`` (a ``||`` table: Name, Histological Diagnosis, Clinical Diagnosis
  0/1/2, the dermoscopic criteria, Colors) and ``PH2Dataset/PH2 Dataset images/IMD<nnn>/IMD<nnn>_Dermoscopic_Image/
  IMD<nnn>.bmp`` (with ``_lesion`` and ``_roi`` folders): the database's readme and public loaders; mirrors
  may drop the ``PH2Dataset`` folder (the folder holding the table is used). 200 images: 80 common nevi,
  80 atypical nevi, 40 melanomas (Mendonca et al. 2013).
- derm7pt: ``release_v0/meta/meta.csv`` (columns ``case_num, diagnosis, ..., clinic, derm, ...``; ``derm`` the
  dermoscopic image's path below ``release_v0/images/``) and ``meta/{train,valid,test}_indexes.csv``: the
  README of jeremykawahara/derm7pt.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from ...registry import preparer, register_dataset
from ...seeding import numpy_rng
from ..manifest import ManifestError, make_manifest
from ..prepare import (
    class_folder_rows,
    dependency_manifest,
    find_file,
    find_folder,
    list_images,
    missing_folder,
    read_table,
    require_columns,
    require_listed,
)
from ..spec import DatasetSpec, Source

# ---------------------------------------------------------------------------------------------
# Kaggle "Skin Cancer ISIC" (9 classes)

SC9_FOLDERS = {
    "actinic keratosis": "AK",
    "basal cell carcinoma": "BCC",
    "dermatofibroma": "DF",
    "melanoma": "MEL",
    "nevus": "NV",
    "pigmented benign keratosis": "PBK",
    "seborrheic keratosis": "SK",
    "squamous cell carcinoma": "SCC",
    "vascular lesion": "VL",
}
SC9_ROOT = "Skin cancer ISIC The International Skin Imaging Collaboration"
# the words of a CLIP prompt: the class folder names. FACMIC's and FAA-CLIP's ImageTextData
# (utils/prepare_data_dg_clip.py) prompt with "a picture of a" + ImageFolder's class (= folder) name
SC9_TEXT = {short: folder for folder, short in SC9_FOLDERS.items()}

register_dataset(DatasetSpec(
    name="sc9",
    title="Skin Cancer ISIC, 9 classes (Kaggle, nodoubttome): 2,357 ISIC Archive images, official Train/Test split",
    classes=tuple(SC9_FOLDERS.values()),  # the folders' alphabetical order, as ImageFolder labels them
    class_text=SC9_TEXT,                  # prompts say the folder names, as the FACMIC / FAA-CLIP loaders did
    sources=(Source("kaggle_dataset", "nodoubttome/skin-cancer9-classesisic", filename="skin-cancer9-classesisic.zip",
                    note="digest: trust-on-first-use (Kaggle re-zips datasets, so no stable digest exists)"),),
    layout=f"'{SC9_ROOT}/Train/<class folder>/*.jpg' (2,239 images) and '.../Test/<class folder>/*.jpg' (118), "
           "possibly inside one more wrapper folder; class folders 'actinic keratosis', 'basal cell carcinoma', "
           "'dermatofibroma', 'melanoma', 'nevus', 'pigmented benign keratosis', 'seborrheic keratosis', "
           "'squamous cell carcinoma', 'vascular lesion' (classes AK, BCC, DF, MEL, NV, PBK, SK, SCC, VL)",
    prepare="sc9_folders",
    access="account",
    homepage="https://www.kaggle.com/datasets/nodoubttome/skin-cancer9-classesisic",
    licence="images of the ISIC Archive, each under its ISIC licence (CC-0 or CC BY-NC); see the Kaggle page",
    used_by=("facmic", "faa_clip"),
    expected_files=("**/Train", "**/Test"),
))


def isic_image_id(name: str) -> str:
    """``ISIC_0000004_downsampled`` (or a path to it) -> ``ISIC_0000004``."""
    return re.sub(r"_downsampled$", "", Path(name).stem)


@preparer("sc9_folders")
def sc9_folders(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """``Train/<class folder>/`` and ``Test/<class folder>/``: the official split; folder names -> short names."""
    base = raw_root / spec.name
    rows = []
    for folder, split in (("Train", "train"), ("Test", "test")):
        root = find_folder(base, folder, spec)
        unknown = sorted(d.name for d in root.iterdir() if d.is_dir() and d.name not in SC9_FOLDERS)
        if unknown:
            raise ManifestError(f"{root}: unknown class folders {unknown}; allowed: {sorted(SC9_FOLDERS)}")
        rows += class_folder_rows(root, raw_root, SC9_FOLDERS, split=split)
    for row in rows:
        row["image_id"] = isic_image_id(row["path"])
    return make_manifest(rows, spec.classes)


# ---------------------------------------------------------------------------------------------
# ISIC 2019 training set

ISIC2019_CLASSES = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")  # ground-truth column order (UNK is empty)
ISIC2019_S3 = "https://isic-challenge-data.s3.amazonaws.com/2019/"  # linked from challenge.isic-archive.com/data/#2019
ISIC2019_TRUTH = "ISIC_2019_Training_GroundTruth.csv"
ISIC2019_META = "ISIC_2019_Training_Metadata.csv"

register_dataset(DatasetSpec(
    name="isic2019",
    title="ISIC 2019 Challenge training set: 25,331 dermoscopic images (BCN_20000, HAM10000, MSK), 8 classes",
    classes=ISIC2019_CLASSES,
    sources=(
        Source("url", ISIC2019_S3 + "ISIC_2019_Training_Input.zip", filename="ISIC_2019_Training_Input.zip",
               provides=("ISIC_2019_Training_Input",), note="digest: trust-on-first-use (the challenge publishes none)"),
        Source("url", ISIC2019_S3 + ISIC2019_TRUTH, filename=ISIC2019_TRUTH, extract=False,
               note="digest: trust-on-first-use"),
        Source("url", ISIC2019_S3 + ISIC2019_META, filename=ISIC2019_META, extract=False,
               note="digest: trust-on-first-use"),
    ),
    layout="ISIC_2019_Training_Input/ISIC_*.jpg (25,331 images; some named ISIC_*_downsampled.jpg) and the two CSVs "
           f"(in downloads/ or the dataset folder): {ISIC2019_TRUTH} (image,MEL,NV,BCC,AK,BKL,DF,VASC,SCC,UNK; "
           f"one-hot 0.0/1.0) and {ISIC2019_META} (image,age_approx,anatom_site_general,lesion_id,sex)",
    prepare="isic2019",
    access="open",
    homepage="https://challenge.isic-archive.com/data/#2019",
    citation="Tschandl et al., Sci Data 5:180161 (2018); Codella et al., arXiv:1710.05006; "
             "Combalia et al., arXiv:1908.02288 (BCN_20000)",
    licence="CC BY-NC 4.0 (attribution: BCN_20000 (c) Hospital Clinic de Barcelona; HAM10000 (c) ViDIR Group, "
            "Medical University of Vienna; MSK (c) Anonymous)",
    used_by=("facmic", "faa_clip", "fediic"),
    expected_files=("ISIC_2019_Training_Input", f"**/{ISIC2019_TRUTH}", f"**/{ISIC2019_META}"),
))


def _collection(lesion_id: str) -> str:
    """The sub-collection of an ISIC 2019 image from its lesion id (``BCN_0000001`` -> ``BCN``)."""
    found = re.match(r"[A-Za-z]+", lesion_id or "")
    return found.group(0) if found else ""


@preparer("isic2019")
def isic2019(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """Label = the one-hot column of the ground truth; ``source`` = the sub-collection (BCN, HAM, MSK;
    empty where the metadata has no lesion id); ``lesion_id`` kept; ``truth_row`` = the image's row in the
    ground-truth CSV (FedIIC's code splits the CSV in that order: split kind ``fediic_code``); no official
    split."""
    base = raw_root / spec.name
    images = find_folder(base, "ISIC_2019_Training_Input", spec)
    truth_path = find_file(base, ISIC2019_TRUTH, spec)
    truth = read_table(truth_path, spec, dtype={"image": str})
    require_columns(truth, ("image", *spec.classes), truth_path, spec)
    onehot = truth[list(spec.classes)].apply(pd.to_numeric, errors="coerce").fillna(-1).to_numpy(dtype=float)
    bad = ~np.isclose(onehot.sum(axis=1), 1.0)
    if bad.any():
        raise ManifestError(f"{truth_path}: {int(bad.sum())} rows are not one-hot over {list(spec.classes)} "
                            f"(UNK or several labels), e.g. {truth['image'][bad].head(3).tolist()}")
    meta_path = find_file(base, ISIC2019_META, spec)
    meta = read_table(meta_path, spec, dtype={"image": str, "lesion_id": str}, keep_default_na=False)
    require_columns(meta, ("image", "lesion_id"), meta_path, spec)
    lesion = dict(zip(meta["image"], meta["lesion_id"]))
    require_listed(spec, truth_path, [images / f"{image}.jpg" for image in truth["image"]], raw_root)
    rows = [{
        "path": (images / f"{image}.jpg").relative_to(raw_root).as_posix(),
        "class_name": spec.classes[label],
        "source": _collection(lesion.get(image, "")),
        "image_id": isic_image_id(image),
        "lesion_id": lesion.get(image, ""),
        "truth_row": row,
    } for row, (image, label) in enumerate(zip(truth["image"], onehot.argmax(axis=1)))]
    return make_manifest(rows, spec.classes)


# ---------------------------------------------------------------------------------------------
# HAM10000 (Harvard Dataverse)

HAM_CLASSES = ("akiec", "bcc", "bkl", "df", "mel", "nv", "vasc")
HAM_DATAVERSE = "https://dataverse.harvard.edu/dataset.xhtml?persistentId=doi:10.7910/DVN/DBW86T"
HAM_METADATA = ("HAM10000_metadata.csv", "HAM10000_metadata", "HAM10000_metadata.tab")

register_dataset(DatasetSpec(
    name="ham10000",
    title="HAM10000: 10,015 dermatoscopic images of 7,470 lesions from 4 sub-sources (Tschandl et al. 2018)",
    classes=HAM_CLASSES,
    sources=(
        Source("dataverse", HAM_DATAVERSE, filename="HAM10000_images_part_1.zip", provides=("**/ISIC_0024306.jpg",),
               note="digest: the server's published MD5, then trust-on-first-use SHA-256"),
        Source("dataverse", HAM_DATAVERSE, filename="HAM10000_images_part_2.zip", provides=("**/ISIC_0034320.jpg",),
               note="digest: the server's published MD5, then trust-on-first-use SHA-256"),
        Source("dataverse", HAM_DATAVERSE, filename="HAM10000_metadata.csv", extract=False, provides=("**/HAM10000_metadata*",),
               note="listed as the ingested HAM10000_metadata.tab; its original (CSV) is downloaded; "
                    "digest: trust-on-first-use"),
    ),
    layout="ISIC_0024306.jpg ... ISIC_0034320.jpg from HAM10000_images_part_1.zip and _part_2.zip (at the top level "
           "or in HAM10000_images_part_{1,2}/) and the metadata HAM10000_metadata.csv (also read: HAM10000_metadata, "
           "or the tab-separated HAM10000_metadata.tab) in downloads/ or the dataset folder, with columns "
           "lesion_id,image_id,dx,dx_type,age,sex,localization,dataset",
    prepare="ham10000",
    access="open",
    homepage="https://doi.org/10.7910/DVN/DBW86T",
    citation="Tschandl, Rosendahl, Kittler, Sci Data 5:180161 (2018), doi:10.1038/sdata.2018.161",
    licence="CC BY-NC 4.0 (Dataverse terms of the dataset)",
    used_by=("facmic", "faa_clip", "fediic"),
    expected_files=("**/ISIC_0024306.jpg", "**/ISIC_0034320.jpg", "**/HAM10000_metadata*"),
))


def read_ham_metadata(path: Path, spec: DatasetSpec) -> pd.DataFrame:
    with open(path, encoding="utf-8", errors="replace") as fh:
        header = fh.readline()
    sep = "\t" if path.suffix == ".tab" or ("\t" in header and "," not in header) else ","
    return read_table(path, spec, sep=sep, dtype=str, keep_default_na=False)


@preparer("ham10000")
def ham10000(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """Label = ``dx``; ``source`` = the metadata's ``dataset`` column (the sub-source: vidir_modern,
    vidir_molemax, rosendahl and a Vienna set), which FedIIC uses as sites; ``lesion_id`` kept (several
    images show the same lesion: group by it to avoid leaks between splits)."""
    base = raw_root / spec.name
    meta_path = find_file(base, HAM_METADATA, spec)
    meta = read_ham_metadata(meta_path, spec)
    missing = [c for c in ("lesion_id", "image_id", "dx", "dataset") if c not in meta.columns]
    if missing:
        hint = (" (an older release without the sub-source column, e.g. the Kaggle copy; use the Dataverse metadata)"
                if missing == ["dataset"] else "")
        raise ManifestError(f"{meta_path} lacks columns {missing}{hint}; "
                            f"expected lesion_id,image_id,dx,dx_type,age,sex,localization,dataset")
    images = {p.stem: p for p in list_images(base)}
    require_listed(spec, meta_path, [images.get(i, f"{i}.jpg") for i in meta["image_id"]], base,
                   hint="HAM10000_images_part_1.zip and _part_2.zip unpack anywhere in the dataset folder;")
    rows = [{
        "path": images[rec.image_id].relative_to(raw_root).as_posix(),
        "class_name": rec.dx,
        "source": rec.dataset,
        "image_id": rec.image_id,
        "lesion_id": rec.lesion_id,
    } for rec in meta.itertuples(index=False)]
    return make_manifest(rows, spec.classes)


# ---------------------------------------------------------------------------------------------
# FACMIC "Real" = FAA-CLIP "SC": three sources on their 7 common classes

REAL_SKIN_CLASSES = ("AK", "BCC", "DF", "MEL", "NV", "PBK", "VL")
REAL_SKIN_PARTS = ("sc9", "ham10000", "isic2019")   # also the priority order when dropping duplicates
TO_REAL_SKIN = {
    "sc9": {c: c for c in REAL_SKIN_CLASSES},                       # SK and SCC are left out
    "ham10000": {"akiec": "AK", "bcc": "BCC", "bkl": "PBK", "df": "DF", "mel": "MEL", "nv": "NV", "vasc": "VL"},
    "isic2019": {"AK": "AK", "BCC": "BCC", "BKL": "PBK", "DF": "DF", "MEL": "MEL", "NV": "NV", "VASC": "VL"},  # no SCC
}
REAL_SKIN_LAYOUT = ("no files of its own: built from the manifests of sc9, isic2019 and ham10000 "
                    "(resources/manifests/<name>.csv)")
_REAL_SKIN_COMMON = dict(
    classes=REAL_SKIN_CLASSES,
    class_text={c: SC9_TEXT[c] for c in REAL_SKIN_CLASSES},   # the Kaggle SC folder names (every client's folders)
    sources=(),
    layout=REAL_SKIN_LAYOUT,
    prepare="skin_real",
    access="account",
    citation="FACMIC 'Real' and FAA-CLIP 'SC' (Table I: C1 SC 1,971 / C2 ISIC2019 19,766 / C3 HAM10000 8,512 / "
             "global test 6,233 images)",
    licence="those of sc9, isic2019 and ham10000 (CC BY-NC 4.0 for the latter two)",
    used_by=("facmic", "faa_clip"),
    depends_on=REAL_SKIN_PARTS,
)

register_dataset(DatasetSpec(
    name="skin_real",
    title="Multi-source skin set (FACMIC 'Real', FAA-CLIP 'SC'): sc9 / isic2019 / ham10000 as sources, "
          "7 common classes, every image once",
    options={"isic_test_fraction": 0.2, "split_seed": 0, "dedupe": True},
    **_REAL_SKIN_COMMON,
))

register_dataset(DatasetSpec(
    name="skin_real_overlap",
    title="Multi-source skin set as the papers built it: like skin_real, but ISIC 2019 keeps the HAM10000 and "
          "Kaggle SC images it contains (the same picture can be in two clients)",
    options={"isic_test_fraction": 0.2, "split_seed": 0, "dedupe": False},
    **_REAL_SKIN_COMMON,
))


def stratified_test_split(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """``"test"`` for int(fraction * n_c) randomly chosen members of every class c (rounded down), ``"train"``
    for the rest. Rounded down because that is the only per-class cut that gives the papers' ISIC 2019 client
    (FACMIC Real / FAA-CLIP SC: 19,766 training images): on the public release's 24,703 images of the 7 classes
    (AK 867, BCC 3,323, DF 239, MEL 4,522, NV 12,875, BKL 2,624, VASC 253) rounding down leaves 19,766 for
    training and 4,937 for testing; rounding to nearest leaves 19,762, a cut of the whole set 19,762 or 19,763."""
    split = np.full(len(labels), "train", dtype=object)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        split[members[: int(fraction * len(members))]] = "test"
    return split


@preparer("skin_real")
def skin_real(spec: DatasetSpec, raw_root: Path, manifest_dir: Path) -> pd.DataFrame:
    """The three manifests restricted to the 7 common classes and renamed onto them (BKL/bkl -> PBK,
    VASC/vasc -> VL, akiec -> AK); ``source`` = the dataset each image comes from.

    Splits: the Kaggle SC part keeps its official Train/Test split; the ISIC 2019 part is split
    ``1 - isic_test_fraction : isic_test_fraction`` (8:2) per class with ``split_seed`` (FACMIC:
    "ISIC2019 is split 8:2 into train/test"; the papers give no seed); HAM10000 has no official split
    (``""``), the partition spec decides.

    Duplicates (``dedupe``): HAM10000 is part of ISIC 2019, and most Kaggle SC images are ISIC Archive
    images that are also in HAM10000 or ISIC 2019. With ``dedupe`` every ISIC image id is kept once,
    in the first of sc9, ham10000, isic2019 that has it (so the small SC client stays whole, HAM10000
    loses the few SC images, and ISIC 2019 loses all HAM10000 and SC images); without it the sources
    overlap as in the papers (FACMIC's ISIC 2019 client has 19,766 = 80% of all 7-class ISIC 2019
    images, so the authors did not remove the HAM10000 part).
    """
    opts = spec.options
    frames = []
    taken: set[str] = set()
    for part in REAL_SKIN_PARTS:
        frame = dependency_manifest(manifest_dir, spec, part)
        if "image_id" not in frame:
            raise ManifestError(f"the {part} manifest has no image_id column; re-prepare {part} with this version of fedrepro")
        frame = frame[frame["class_name"].isin(TO_REAL_SKIN[part])].copy()
        if opts.get("dedupe", True):
            frame = frame[~frame["image_id"].isin(taken)]
            taken |= set(frame["image_id"])
        frame["source_class"] = frame["class_name"]
        frame["class_name"] = frame["class_name"].map(TO_REAL_SKIN[part])
        frame["source"] = part
        if part == "isic2019":
            rng = numpy_rng(int(opts.get("split_seed", 0)), "split", spec.name, part)
            frame["split"] = stratified_test_split(frame["class_name"].to_numpy(), float(opts["isic_test_fraction"]), rng)
        elif part == "ham10000":
            frame["split"] = ""
        frames.append(frame)
    merged = pd.concat(frames, ignore_index=True)
    merged["lesion_id"] = merged["lesion_id"].fillna("") if "lesion_id" in merged else ""
    columns = ["path", "class_name", "source", "split", "image_id", "source_class", "lesion_id"]
    return make_manifest(merged[columns].to_dict("records"), spec.classes)


# --------------------------------------------------------------------------------------------
# FedIIC's "Real" (unreleased, rebuilt from the sources it names: see fediic_real below)

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

register_dataset(DatasetSpec(
    name="ph2",
    title="PH2 dermoscopic image database (200 images; Mendonca et al., EMBC 2013)",
    classes=PH2_CLASSES,
    sources=(Source("request", "https://www.fc.up.pt/addi/ph2%20database.html",
                    provides=("**/PH2_dataset.txt", "**/PH2 Dataset images/IMD*/IMD*_Dermoscopic_Image/IMD*.bmp"),
                    note="the official page's request form (reported dead; its archive PH2Dataset.rar unpacks to "
                         "PH2Dataset/); known mirrors: Zenodo record 17498821 (PH2.zip) and Kaggle copies of PH2Dataset; "
                         "no digest is published, so whatever the mirror, the preparer checks the label table against "
                         "the published composition (200 images: 80 common nevi, 80 atypical nevi, 40 melanomas) and "
                         "every listed image"),),
    layout="PH2Dataset/PH2_dataset.txt and PH2Dataset/PH2 Dataset images/IMD<nnn>/IMD<nnn>_Dermoscopic_Image/IMD<nnn>.bmp "
           "(the PH2Dataset/ folder may be named otherwise or be absent: the folder holding PH2_dataset.txt is used)",
    prepare="ph2",
    access="request",
    homepage="https://www.fc.up.pt/addi/ph2%20database.html",
    citation="doi:10.1109/EMBC.2013.6610779",
    used_by=("fediic",),
    options={"composition": {"common_nevus": 80, "atypical_nevus": 80, "melanoma": 40}},
))

register_dataset(DatasetSpec(
    name="derm7pt",
    title="derm7pt: dermoscopic images of the Interactive Atlas of Dermoscopy (Argenziano et al. 2000; Kawahara et al. 2019)",
    classes=DERM7PT_CLASSES,
    sources=(Source("request", "https://derm.cs.sfu.ca", provides=("release_v0/meta/meta.csv", "release_v0/images"),
                    note="register on derm.cs.sfu.ca and download release_v0.zip (it unpacks to release_v0/)"),),
    layout="release_v0/meta/meta.csv (columns diagnosis, derm, ...) and release_v0/images/<folder>/<file>",
    prepare="derm7pt",
    access="request",
    homepage="https://derm.cs.sfu.ca",
    citation="doi:10.1109/JBHI.2018.2824327",
    used_by=("fediic",),
))

register_dataset(DatasetSpec(
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



# --------------------------------------------------------------------------------------------
# PH2 and derm7pt (Interactive Atlas of Dermoscopy)

def parse_ph2_table(text: str, path: Path | str = "PH2_dataset.txt") -> pd.DataFrame:
    """PH2_dataset.txt ('||'-separated table with a 'Name' and a 'Clinical Diagnosis' column:
    0 common nevus, 1 atypical nevus, 2 melanoma) -> [name, class_name]; what is wrong with it is one
    :class:`ManifestError` naming ``path``."""
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
        raise ManifestError(f"{path}: no header row with 'Name' (first) and 'Clinical Diagnosis' columns "
                            f"(found {header}); is it the database's own PH2_dataset.txt?")
    col = header.index("clinical diagnosis")
    names = {"0": "common_nevus", "1": "atypical_nevus", "2": "melanoma"}
    out = []
    for cells in rows:
        code = cells[col] if col < len(cells) else ""
        if code not in names:
            raise ManifestError(f"{path}: image {cells[0]} has clinical diagnosis {code!r}; expected 0, 1 or 2")
        out.append({"name": cells[0], "class_name": names[code]})
    return pd.DataFrame(out, columns=["name", "class_name"])


@preparer("ph2")
def prepare_ph2(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """The folder that holds PH2_dataset.txt is the root (mirrors differ in the folders above it). No
    mirror publishes a digest, so the label table is checked against the published composition
    (``composition``) before anything is read from it."""
    table = find_file(raw_root / spec.name, "PH2_dataset.txt", spec, max_depth=2, search_downloads=False)
    root = table.parent
    labels = parse_ph2_table(table.read_text(encoding="utf-8", errors="replace"), table)
    counts = labels["class_name"].value_counts().to_dict()
    if counts != spec.options["composition"]:
        raise ManifestError(f"{table} lists {counts}; the PH2 database has {spec.options['composition']} (Mendonca et al. "
                            f"2013): this copy is incomplete or altered, get it from another mirror")
    images = [root / "PH2 Dataset images" / name / f"{name}_Dermoscopic_Image" / f"{name}.bmp" for name in labels["name"]]
    require_listed(spec, table, images, raw_root)
    rows = [{"path": image.relative_to(raw_root).as_posix(), "class_name": class_name, "source": "ph2"}
            for image, class_name in zip(images, labels["class_name"])]
    return make_manifest(rows, spec.classes)


@preparer("derm7pt")
def prepare_derm7pt(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    root = raw_root / spec.name / "release_v0"
    meta_csv = root / "meta" / "meta.csv"
    if not meta_csv.exists():
        raise missing_folder(meta_csv, spec)
    meta = read_table(meta_csv, spec)
    require_columns(meta, ("diagnosis", "derm"), meta_csv, spec)
    unknown = sorted(set(meta["diagnosis"].astype(str).str.strip().str.lower()) - set(DERM7PT_DIAGNOSES))
    if unknown:
        raise ManifestError(f"{meta_csv}: diagnoses {unknown} are not mapped; known: {sorted(DERM7PT_DIAGNOSES)}")
    require_listed(spec, meta_csv, [root / "images" / str(derm) for derm in meta["derm"]], raw_root)
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
        raise ManifestError(f"fediic_real: HAM10000 sub-sources {unknown} not in the ham10000 manifest; "
                         f"available: {sorted(set(ham['source']))}")
    rows += [{"path": r.path, "class_name": HAM_TO_REAL[r.class_name], "source": r.source, "split": "train"}
             for r in ham.itertuples(index=False) if r.source in opts["ham_sources"]]
    isic = dependency_manifest(manifest_dir, spec, "isic2019")
    ham_ids = {image_id(p) for p in ham["path"]}
    pool = isic[isic["class_name"].isin(REAL_CLASSES) & ~isic["path"].map(image_id).isin(ham_ids)]
    if len(pool) < opts["test_size"]:
        raise ManifestError(f"fediic_real: only {len(pool)} ISIC 2019 images outside HAM10000 for a test set of "
                            f"{opts['test_size']}: is the isic2019 manifest complete?")
    picked = pool.iloc[np.sort(np.random.default_rng(opts["seed"]).permutation(len(pool))[: opts["test_size"]])]
    rows += [{"path": r.path, "class_name": r.class_name, "source": "isic2019", "split": "test"}
             for r in picked.itertuples(index=False)]
    return make_manifest(rows, spec.classes)


