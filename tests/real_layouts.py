"""Tiny trees in each dataset's real published layout, for tests/test_real_layouts.py.

Every dataset the paper configurations name has a builder here (``LAYOUTS``): it writes, under a raw
root, what a user ends up with after the download step's part that needs them - the archives
as the source serves them, put into ``<raw>/<dataset>/downloads/`` (as a placed archive: the download
step verifies and unpacks it), or, for sources placed by hand, the unpacked files - with the real file
and folder names, nesting, archive top folders, table headers and label encodings, a handful of tiny
images each (DICOM where the real set is DICOM). It returns what the manifest must then hold and how
the test splits it. Where each layout fact comes from is in the dataset's module docstring
(src/fedrepro/data/datasets/); where a fact could not be confirmed, the builders use one of the
variants the dataset accepts.

The MESSIDOR annotation tables are real ``.xls`` files (BIFF, written once with xlwt 1.3.0) in
tests/data/real_layouts/messidor/.
"""

from __future__ import annotations

import gzip
import io
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from PIL import Image

from dicom_files import write_dicom
from http_files import zip_bytes

DATA = Path(__file__).parent / "data" / "real_layouts"


@dataclass
class Expected:
    """What the prepared manifest must hold, and the split the test draws from it."""
    classes: dict[str, int]                      # class_name -> rows
    split: dict                                  # partition spec
    clients: int                                 # clients the split must have
    sources: dict[str, int] | None = None        # source -> rows
    splits: dict[str, int] | None = None         # official split -> rows
    columns: dict[str, dict] = field(default_factory=dict)   # column -> {path suffix: value} spot checks
    depends_on: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)  # registry options the test overrides (sizes a fixture cannot reach)


LAYOUTS: dict[str, Callable[[Path], Expected]] = {}


def layout(name: str):
    def register(builder):
        LAYOUTS[name] = builder
        return builder
    return register


# --------------------------------------------------------------------------------------------
# bytes of tiny files

def image_bytes(fmt: str, shade: int = 0, size: tuple[int, int] = (8, 8), mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    colour = (shade % 256, 60, 120) if mode == "RGB" else shade % 256
    Image.new(mode, size, colour).save(buf, format=fmt)
    return buf.getvalue()


def fundus_bytes(fmt: str, shade: int = 0) -> bytes:
    """A bright disc on black, what circle cropping looks for."""
    yy, xx = np.mgrid[0:24, 0:24]
    disc = (xx - 11.5) ** 2 + (yy - 11.5) ** 2 < 100
    rgb = np.zeros((24, 24, 3), dtype=np.uint8)
    rgb[disc] = (180, 80 + shade % 100, 40)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format=fmt)
    return buf.getvalue()


def csv_bytes(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False).encode()


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def downloads(raw: Path, name: str, filename: str, data: bytes) -> Path:
    """An archive or file as its source serves it, placed where the download step looks first."""
    return write(raw / name / "downloads" / filename, data)


def dicom_bytes(tmp: Path, **kw) -> bytes:
    write_dicom(tmp, **kw)
    data = tmp.read_bytes()
    tmp.unlink()
    return data


def iid(clients: int = 2, **extra) -> dict:
    return {"kind": "iid", "clients": clients, "ratios": {"train": 1.0, "val": 0.0, "test": 0.0}, **extra}


# --------------------------------------------------------------------------------------------
# brain MRI (Kaggle datasets, no top folder)

@layout("bt")
def bt(raw: Path) -> Expected:
    files = {"Training/glioma_tumor/gg (1).jpg": 0, "Training/glioma_tumor/gg (2).jpg": 0,
             "Training/meningioma_tumor/m (1).jpg": 1, "Training/no_tumor/image (1).jpg": 2,
             "Training/pituitary_tumor/p (1).jpg": 3, "Testing/glioma_tumor/image(1).jpg": 0,
             "Testing/meningioma_tumor/image(1).jpg": 1, "Testing/no_tumor/image(1).jpg": 2,
             "Testing/pituitary_tumor/image(1).jpg": 3}
    downloads(raw, "bt", "brain-tumor-classification-mri.zip",
              zip_bytes({path: image_bytes("JPEG", 40 * k + i, mode="L") for i, (path, k) in enumerate(files.items())}))
    return Expected(classes={"glioma_tumor": 3, "meningioma_tumor": 2, "no_tumor": 2, "pituitary_tumor": 2},
                    splits={"train": 5, "test": 4}, split=iid(global_test="official"), clients=2)


@layout("bt2")
def bt2(raw: Path) -> Expected:
    files = ["Training/glioma/Tr-gl_0010.jpg", "Training/meningioma/Tr-me_0010.jpg", "Training/notumor/Tr-no_0010.jpg",
             "Training/notumor/Tr-no_0011.jpg", "Training/pituitary/Tr-pi_0010.jpg", "Testing/glioma/Te-gl_0010.jpg",
             "Testing/notumor/Te-no_0010.jpg"]
    downloads(raw, "bt2", "brain-tumor-mri-dataset.zip",
              zip_bytes({path: image_bytes("JPEG", 30 * i + 15, mode="L") for i, path in enumerate(files)}))  # no BT shade
    return Expected(classes={"glioma_tumor": 2, "meningioma_tumor": 1, "no_tumor": 3, "pituitary_tumor": 1},
                    splits={"train": 5, "test": 2}, split=iid(global_test="official"), clients=2)


@layout("bt_bt2")
def bt_bt2(raw: Path) -> Expected:
    bt(raw), bt2(raw)
    return Expected(classes={"glioma_tumor": 5, "meningioma_tumor": 3, "no_tumor": 5, "pituitary_tumor": 3},
                    sources={"": 9, "bt2": 7}, depends_on=("bt", "bt2"),
                    split=iid(global_test="official", external={"sources": ["bt2"]}), clients=2)


@layout("bt_bt2_disjoint")
def bt_bt2_disjoint(raw: Path) -> Expected:
    bt(raw), bt2(raw)
    # one BT2 image is a copy of a BT image (SARTAJ is in both): the clean variant leaves it out of BT2
    copy = raw / "bt" / "downloads" / "copy.jpg"
    with zipfile.ZipFile(raw / "bt" / "downloads" / "brain-tumor-classification-mri.zip") as z:
        copy.write_bytes(z.read("Training/no_tumor/image (1).jpg"))
    members = {}
    with zipfile.ZipFile(raw / "bt2" / "downloads" / "brain-tumor-mri-dataset.zip") as z:
        members = {name: z.read(name) for name in z.namelist()}
    members["Training/notumor/Tr-no_0011.jpg"] = copy.read_bytes()
    copy.unlink()
    downloads(raw, "bt2", "brain-tumor-mri-dataset.zip", zip_bytes(members))
    return Expected(classes={"glioma_tumor": 5, "meningioma_tumor": 3, "no_tumor": 4, "pituitary_tumor": 3},
                    sources={"": 9, "bt2": 6}, depends_on=("bt", "bt2"),
                    split=iid(global_test="official", external={"sources": ["bt2"]}), clients=2)


# --------------------------------------------------------------------------------------------
# skin

SC9_ROOT = ("skin cancer isic the international skin imaging collaboration/"
            "Skin cancer ISIC The International Skin Imaging Collaboration")
SC9_FILES = [("Train", "actinic keratosis", "ISIC_0025780"), ("Train", "basal cell carcinoma", "ISIC_0000001"),
             ("Train", "dermatofibroma", "ISIC_0000002"), ("Train", "melanoma", "ISIC_0000003"),
             ("Train", "nevus", "ISIC_0000004"), ("Train", "pigmented benign keratosis", "ISIC_0000013"),
             ("Train", "seborrheic keratosis", "ISIC_0000005"), ("Train", "squamous cell carcinoma", "ISIC_0000006"),
             ("Train", "vascular lesion", "ISIC_0000007"), ("Test", "melanoma", "ISIC_0000008"),
             ("Test", "nevus", "ISIC_0000009")]


@layout("sc9")
def sc9(raw: Path) -> Expected:
    downloads(raw, "sc9", "skin-cancer9-classesisic.zip", zip_bytes(
        {f"{SC9_ROOT}/{split}/{folder}/{image}.jpg": image_bytes("JPEG", i) for i, (split, folder, image) in enumerate(SC9_FILES)}))
    return Expected(classes={"AK": 1, "BCC": 1, "DF": 1, "MEL": 2, "NV": 2, "PBK": 1, "SK": 1, "SCC": 1, "VL": 1},
                    splits={"train": 9, "test": 2}, split=iid(global_test="official"), clients=2,
                    columns={"image_id": {"ISIC_0025780.jpg": "ISIC_0025780"}})


# ISIC 2019: image, class, lesion id; ISIC_0024306 / ISIC_0031633 are also HAM10000 images, ISIC_0000013 also an SC one
ISIC_ROWS = ([(f"ISIC_00100{i:02d}", "NV", f"BCN_00000{i:02d}") for i in range(6)]
             + [(f"ISIC_00200{i:02d}", "MEL", f"MSK4_000{i:02d}") for i in range(4)]
             + [("ISIC_0030001", "BCC", "BCN_0000100"), ("ISIC_0030002", "AK", "BCN_0000101"),
                ("ISIC_0030003", "DF", ""), ("ISIC_0030004", "VASC", "BCN_0000102"), ("ISIC_0030005", "SCC", ""),
                ("ISIC_0000013_downsampled", "BKL", ""), ("ISIC_0024306", "NV", "HAM_0000550"),
                ("ISIC_0031633", "VASC", "HAM_0001466")])
ISIC_COLUMNS = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC", "UNK")


@layout("isic2019")
def isic2019(raw: Path) -> Expected:
    members = {f"ISIC_2019_Training_Input/{image}.jpg": image_bytes("JPEG", i) for i, (image, _, _) in enumerate(ISIC_ROWS)}
    members |= {"ISIC_2019_Training_Input/ATTRIBUTION.txt": b"BCN_20000, HAM10000, MSK", "ISIC_2019_Training_Input/LICENSE.txt": b"CC-BY-NC"}
    downloads(raw, "isic2019", "ISIC_2019_Training_Input.zip", zip_bytes(members))
    truth = pd.DataFrame([{"image": image, **{c: float(c == cls) for c in ISIC_COLUMNS}} for image, cls, _ in ISIC_ROWS])
    meta = pd.DataFrame([{"image": image, "age_approx": 55.0, "anatom_site_general": "anterior torso", "lesion_id": lesion,
                          "sex": "female"} for image, _, lesion in ISIC_ROWS])
    downloads(raw, "isic2019", "ISIC_2019_Training_GroundTruth.csv", csv_bytes(truth))
    downloads(raw, "isic2019", "ISIC_2019_Training_Metadata.csv", csv_bytes(meta))
    return Expected(classes={"MEL": 4, "NV": 7, "BCC": 1, "AK": 1, "BKL": 1, "DF": 1, "VASC": 2, "SCC": 1},
                    sources={"BCN": 9, "MSK": 4, "HAM": 2, "": 3},
                    split={"kind": "creff", "alpha": 1.0, "clients": 2, "group_size": 2, "global_test": {"fraction": 0.2},
                           "ratios": {"train": 0.875, "val": 0.125, "test": 0.0}, "seed": 0}, clients=2,
                    columns={"image_id": {"ISIC_0000013_downsampled.jpg": "ISIC_0000013"}})


# HAM10000 (Dataverse): part 1 holds ISIC_0024306, part 2 ISIC_0034320, both flat
HAM_ROWS = [("HAM_0000550", "ISIC_0024306", "nv", "vidir_molemax", 1), ("HAM_0002730", "ISIC_0025780", "akiec", "rosendahl", 1),
            ("HAM_0000118", "ISIC_0027419", "bkl", "vidir_modern", 1), ("HAM_0001466", "ISIC_0031633", "vasc", "vidir_molemax", 2),
            ("HAM_0002761", "ISIC_0029068", "bcc", "rosendahl", 1), ("HAM_0005132", "ISIC_0025837", "df", "vidir_modern", 1),
            ("HAM_0001751", "ISIC_0024698", "mel", "vienna_dias", 1), ("HAM_0007418", "ISIC_0034320", "nv", "vidir_molemax", 2)]


@layout("ham10000")
def ham10000(raw: Path) -> Expected:
    for part in (1, 2):
        downloads(raw, "ham10000", f"HAM10000_images_part_{part}.zip", zip_bytes(
            {f"{image}.jpg": image_bytes("JPEG", i) for i, (_, image, _, _, p) in enumerate(HAM_ROWS) if p == part}))
    meta = pd.DataFrame([{"lesion_id": lesion, "image_id": image, "dx": dx, "dx_type": "histo", "age": 60.0, "sex": "male",
                          "localization": "back", "dataset": source} for lesion, image, dx, source, _ in HAM_ROWS])
    downloads(raw, "ham10000", "HAM10000_metadata.csv", csv_bytes(meta))
    return Expected(classes={"akiec": 1, "bcc": 1, "bkl": 1, "df": 1, "mel": 1, "nv": 2, "vasc": 1},
                    sources={"vidir_molemax": 3, "rosendahl": 2, "vidir_modern": 2, "vienna_dias": 1},
                    split={"kind": "by_source", "sources": ["vidir_molemax", "rosendahl"],
                           "ratios": {"train": 1.0, "val": 0.0, "test": 0.0}}, clients=2)


@layout("skin_real")
def skin_real(raw: Path) -> Expected:
    sc9(raw), ham10000(raw), isic2019(raw)
    # sc9 without SK and SCC (9); HAM all 8 but ISIC_0025780 (also sc9) -> 7; ISIC 2019 without SCC, the sc9 image
    # ISIC_0000013 and the HAM images ISIC_0024306 / ISIC_0031633 -> 14
    return Expected(classes={"AK": 2, "BCC": 3, "DF": 3, "MEL": 7, "NV": 10, "PBK": 2, "VL": 3},
                    sources={"sc9": 9, "ham10000": 7, "isic2019": 14}, depends_on=("sc9", "ham10000", "isic2019"),
                    split={"kind": "by_source", "sources": ["sc9", "isic2019", "ham10000"],
                           "ratios": {"train": 0.8, "val": 0.0, "test": 0.2}, "global_test": "official"}, clients=3)


@layout("skin_real_overlap")
def skin_real_overlap(raw: Path) -> Expected:
    sc9(raw), ham10000(raw), isic2019(raw)
    # as the papers built it: every source keeps the images another source has too (no de-duplication),
    # so HAM10000 keeps ISIC_0025780 (8, an AK also in sc9) and ISIC 2019 keeps ISIC_0000013 and the two HAM
    # images (17 without SCC)
    return Expected(classes={"AK": 3, "BCC": 3, "DF": 3, "MEL": 7, "NV": 11, "PBK": 3, "VL": 4},
                    sources={"sc9": 9, "ham10000": 8, "isic2019": 17}, depends_on=("sc9", "ham10000", "isic2019"),
                    split={"kind": "by_source", "sources": ["sc9", "isic2019", "ham10000"],
                           "ratios": {"train": 0.8, "val": 0.0, "test": 0.2}, "global_test": "official"}, clients=3)


PH2_COMPOSITION = {0: 80, 1: 80, 2: 40}   # clinical diagnosis code -> images (common nevus, atypical nevus, melanoma)


@layout("ph2")
def ph2(raw: Path) -> Expected:
    root = raw / "ph2" / "PH2Dataset"
    codes = [code for code, n in PH2_COMPOSITION.items() for _ in range(n)]
    lines = ["||   Name   || Histological Diagnosis || Clinical Diagnosis || Asymmetry | Pigment Network | Dots/Globules | "
             "Streaks | Regression Areas | Blue-Whitish Veil || Colors ||"]
    for i, code in enumerate(codes):
        name = f"IMD{2 + i * 2:03d}"
        histology = "Melanoma" if code == 2 else ""
        lines.append(f"|| {name} || {histology:>22} || {code:>18} || 0 | T | A | A | A | A || 3  4 ||")
        folder = root / "PH2 Dataset images" / name
        write(folder / f"{name}_Dermoscopic_Image" / f"{name}.bmp", image_bytes("BMP", i, size=(4, 4)))
        write(folder / f"{name}_lesion" / f"{name}_lesion.bmp", image_bytes("BMP", 255, size=(4, 4), mode="L"))
    lines += ["", "Legends:", "Clinical Diagnosis: 0 - Common Nevus; 1 - Atypical Nevus; 2 - Melanoma."]
    write(root / "PH2_dataset.txt", ("\n".join(lines) + "\n").encode())
    return Expected(classes={"common_nevus": 80, "atypical_nevus": 80, "melanoma": 40}, sources={"ph2": 200},
                    split=iid(), clients=2)


DERM7PT_ROWS = [("clark nevus", "Aal/Aal002.jpg"), ("melanoma (less than 0.76 mm)", "Abl/Abl001.jpg"),
                ("basal cell carcinoma", "Bdl/Bdl010.jpg"), ("seborrheic keratosis", "Fgl/Fgl005.jpg"),
                ("vascular lesion", "NEL/Nel025.jpg"), ("melanosis", "NML/Nml012.jpg"), ("dermatofibroma", "NEL/Nel030.jpg")]


@layout("derm7pt")
def derm7pt(raw: Path) -> Expected:
    release = raw / "derm7pt" / "release_v0"
    rows = []
    for i, (diagnosis, derm) in enumerate(DERM7PT_ROWS):
        clinic = derm.replace(".jpg", "c.jpg")
        write(release / "images" / derm, image_bytes("JPEG", i))
        write(release / "images" / clinic, image_bytes("JPEG", i + 100))
        rows.append({"case_num": i + 1, "diagnosis": diagnosis, "seven_point_score": 1, "pigment_network": "typical",
                     "streaks": "absent", "pigmentation": "absent", "regression_structures": "absent",
                     "dots_and_globules": "absent", "blue_whitish_veil": "absent", "vascular_structures": "absent",
                     "level_of_diagnostic_difficulty": "low", "elevation": "flat", "location": "back", "sex": "female",
                     "clinic": clinic, "derm": derm, "management": "excision"})
    write(release / "meta" / "meta.csv", csv_bytes(pd.DataFrame(rows)))
    for part in ("train", "valid", "test"):
        write(release / "meta" / f"{part}_indexes.csv", b"indexes\n0\n")
    return Expected(classes={"NEV": 1, "MEL": 1, "BCC": 1, "SK": 1, "MISC": 3}, sources={"atlas": 7}, split=iid(), clients=2)


@layout("fediic_real")
def fediic_real(raw: Path) -> Expected:
    ph2(raw), derm7pt(raw), ham10000(raw), isic2019(raw)
    # PH2 200 (160 NV, 40 MEL); the atlas without melanosis (6); HAM's vidir_molemax / vidir_modern / rosendahl (7);
    # 3 ISIC 2019 test images outside HAM10000 (seeded pick; classes vary, counted separately)
    return Expected(classes={}, sources={"ph2": 200, "atlas": 6, "vidir_molemax": 3, "vidir_modern": 2, "rosendahl": 2,
                                         "isic2019": 3},
                    depends_on=("ph2", "derm7pt", "ham10000", "isic2019"), options={"test_size": 3},
                    split={"kind": "by_source", "sources": ["ph2", "atlas", "vidir_molemax", "vidir_modern", "rosendahl"],
                           "global_test": "official", "ratios": {"train": 1.0, "val": 0.0, "test": 0.0}}, clients=5)


# --------------------------------------------------------------------------------------------
# office objects

@layout("officehome")
def officehome(raw: Path) -> Expected:
    members = {}
    for d, domain in enumerate(("Art", "Clipart", "Product", "Real World")):
        for k, cls in enumerate(("Alarm_Clock", "TV", "Webcam")):
            members[f"OfficeHomeDataset_10072016/{domain}/{cls}/{k + 1:05d}.jpg"] = image_bytes("JPEG", 10 * d + k)
    members["OfficeHomeDataset_10072016/ImageInfo.csv"] = b"image_name,url\n"
    members["OfficeHomeDataset_10072016/imagelist.txt"] = b""
    downloads(raw, "officehome", "OfficeHomeDataset_10072016.zip", zip_bytes(members))
    return Expected(classes={"Alarm_Clock": 4, "TV": 4, "Webcam": 4},
                    sources={"Art": 3, "Clipart": 3, "Product": 3, "RealWorld": 3},
                    split={"kind": "by_source", "sources": ["Art", "Clipart", "Product"], "global_test": {"sources": ["RealWorld"]},
                           "ratios": {"train": 0.6, "val": 0.0, "test": 0.4}}, clients=3)


@layout("modern_office31")
def modern_office31(raw: Path) -> Expected:
    # Modern Office-31's own folder names are not confirmed: webcam follows Office-31's <domain>/images/<class>/
    root = raw / "modern_office31" / "Modern-Office-31"
    for d, domain in enumerate(("amazon", "dslr", "synthetic", "webcam")):
        for k, cls in enumerate(("back_pack", "mug", "trash_can")):
            folder = root / domain / ("images" if domain == "webcam" else "") / cls
            write(folder / f"frame_{k + 1:04d}.jpg", image_bytes("JPEG", 10 * d + k))
    return Expected(classes={"back_pack": 4, "mug": 4, "trash_can": 4},
                    sources={"amazon": 3, "dslr": 3, "synthetic": 3, "webcam": 3},
                    split={"kind": "by_source", "sources": ["amazon", "dslr", "synthetic"], "global_test": {"sources": ["webcam"]},
                           "ratios": {"train": 0.6, "val": 0.0, "test": 0.4}}, clients=3)


# --------------------------------------------------------------------------------------------
# endoscopy (pinned archive digest: the fixture is the unpacked tree, placed by hand)

HK_TREE = [("lower-gi-tract", "anatomical-landmarks", "cecum", "Lower GI", "cecum", 2),
           ("lower-gi-tract", "pathological-findings", "ulcerative-colitis-grade-2-3", "Lower GI", "ulcerative-colitis-grade-2-3", 1),
           ("upper-gi-tract", "pathological-findings", "barretts-short-segment", "Upper GI", "short-segment-barretts", 1),
           ("upper-gi-tract", "anatomical-landmarks", "z-line", "Upper GI", "z-line", 2)]


@layout("hyperkvasir")
def hyperkvasir(raw: Path) -> Expected:
    root = raw / "hyperkvasir" / "hyper-kvasir" / "labeled-images"
    rows = []
    for organ, category, finding, organ_name, table_finding, n in HK_TREE:
        for k in range(n):
            stem = f"{finding[:4]}{k:04d}-0f1e-4a2b-9c3d-5e6f7a8b9c0d"
            write(root / organ / category / finding / f"{stem}.jpg", image_bytes("JPEG", k))
            rows.append({"Video file": stem, "Organ": organ_name, "Finding": table_finding, "Classification": category})
    write(root / "image-labels.csv", csv_bytes(pd.DataFrame(rows)))
    return Expected(classes={"barretts-short-segment": 1, "cecum": 2, "ulcerative-colitis-grade-2-3": 1, "z-line": 2},
                    split={"kind": "iid", "clients": 2, "global_test": {"fraction": 0.2},
                           "ratios": {"train": 0.7, "val": 0.0, "test": 0.3}}, clients=2,
                    columns={"organ": {"z-li0000-0f1e-4a2b-9c3d-5e6f7a8b9c0d.jpg": "upper-gi-tract"}})


# --------------------------------------------------------------------------------------------
# fundus

EYEPACS_ROWS = [  # image, field, quality, DR grade, site
    ("4c1a2b.jpg", "field 1", "Good", 0, 1001), ("4c1a2c.jpg", "field 1", "Excellent", 2, 1001),
    ("5d2b3c.jpg", "field 1", "Adequate", 0, 2002), ("5d2b3d.jpg", "field 2", "Good", 3, 2002),
    ("6e3c4d.jpg", "field 1", "Insufficient for Full Interpretation", 1, 2002), ("6e3c4e.jpg", "field 1", "Good", 4, 3003),
    ("7f4d5e.jpg", "field 1", "Good", 0, 3003), ("8a5e6f.jpg", "field 1", "Good", 1, None)]


@layout("eyepacs")
def eyepacs(raw: Path) -> Expected:
    base = raw / "eyepacs"
    for i, (image, *_rest) in enumerate(EYEPACS_ROWS):
        write(base / "images-set-1" / image, fundus_bytes("JPEG", i))
    write(base / "metadata.csv", csv_bytes(pd.DataFrame(
        [{"image_path": f"/mnt/eyepacs/images-set-1/{image}", "image_field": field_, "session_image_quality": quality,
          "diagnosis_image_dr_level": grade, "clinical_siteIdentifier": site}
         for image, field_, quality, grade, site in EYEPACS_ROWS])))
    return Expected(classes={"healthy": 3, "diseased": 3}, sources={"1001": 2, "2002": 1, "3003": 2, "": 1},
                    split={"kind": "sites", "clients": 2, "ratios": {"train": 1.0, "val": 0.0, "test": 0.0}}, clients=2)


APTOS_ROWS = [("000c1434d8d7", 2), ("001639a390f0", 0), ("0024cdab0c1e", 1), ("002c21358ce6", 0)]


@layout("aptos2019")
def aptos2019(raw: Path) -> Expected:
    members = {f"train_images/{code}.png": fundus_bytes("PNG", i) for i, (code, _) in enumerate(APTOS_ROWS)}
    members["train.csv"] = csv_bytes(pd.DataFrame(APTOS_ROWS, columns=["id_code", "diagnosis"]))
    members["test_images/0005cfc8afb6.png"] = fundus_bytes("PNG", 9)
    members["test.csv"] = b"id_code\n0005cfc8afb6\n"
    members["sample_submission.csv"] = b"id_code,diagnosis\n0005cfc8afb6,0\n"
    downloads(raw, "aptos2019", "aptos2019-blindness-detection.zip", zip_bytes(members))
    return Expected(classes={"healthy": 2, "diseased": 2}, sources={"aptos2019": 4}, splits={"test": 4},
                    split=iid(), clients=2)


@layout("eyepacs_aptos")
def eyepacs_aptos(raw: Path) -> Expected:
    eyepacs(raw), aptos2019(raw)
    return Expected(classes={"healthy": 5, "diseased": 5}, sources={"1001": 2, "2002": 1, "3003": 2, "": 1, "aptos2019": 4},
                    depends_on=("eyepacs", "aptos2019"),
                    split={"kind": "sites", "clients": 2, "external": {"sources": ["aptos2019"]},
                           "ratios": {"train": 0.8, "val": 0.2, "test": 0.0}}, clients=2)


@layout("messidor")
def messidor(raw: Path) -> Expected:
    counts = {"no_dr": 0, "dr": 0}
    for table in sorted((DATA / "messidor").glob("Annotation_Base*.xls")):
        folder = raw / "messidor" / table.stem.removeprefix("Annotation_")
        write(folder / table.name, table.read_bytes())
        for i, rec in enumerate(pd.read_excel(table, engine="calamine").to_dict("records")):
            write(folder / rec["Image name"], fundus_bytes("TIFF", i))
            counts["dr" if rec["Retinopathy grade"] > 0 else "no_dr"] += 1
    return Expected(classes=counts, sources={"messidor": 24}, split=iid(), clients=2,
                    columns={"caption": {"20051100_40001_0100_PP.tif": "retinal image with no diabetic retinopathy and "
                                                                         "no risk of macular edema"}})


BRSET_HEADER = ("image_id,patient_id,camera,patient_age,comorbidities,diabetes_time_y,insuline,patient_sex,exam_eye,diabetes,"
                "nationality,optic_disc,vessels,macula,DR_SDRG,DR_ICDR,focus,iluminaton,image_field,artifacts,"
                "diabetic_retinopathy,macular_edema,scar,nevus,amd,vascular_occlusion,hypertensive_retinopathy,drusens,"
                "hemorrhage,retinal_detachment,myopic_fundus,increased_cup_disc,other,quality")
BRSET_ROWS = [("img00001", 1, 0, 0), ("img00002", 1, 0, 0), ("img00025", 13, 3, 1), ("img00060", 31, 4, 1), ("img00021", 11, 1, 0)]


@layout("brset")
def brset(raw: Path) -> Expected:
    base = raw / "brset"
    lines = [BRSET_HEADER]
    for i, (image, patient, dr, edema) in enumerate(BRSET_ROWS):
        write(base / "fundus_photos" / f"{image}.jpg", fundus_bytes("JPEG", i))
        lines.append(f'{image},{patient},Canon CR,48,"diabetes1, SAH",12,yes,1,1,yes,Brazil,1,1,1,{dr},{dr},1,1,1,1,'
                     f'{int(dr > 0)},{edema},0,0,0,0,0,0,0,0,0,0,0,Adequate')
    write(base / "labels.csv", ("\n".join(lines) + "\n").encode())
    return Expected(classes={"no_dr": 2, "dr": 3}, sources={"brset": 5}, split=iid(), clients=2,
                    columns={"caption": {"img00060.jpg": "retinal image with proliferative diabetic retinopathy and macular edema"}})


@layout("retina_vlp")
def retina_vlp(raw: Path) -> Expected:
    m, b = messidor(raw), brset(raw)
    return Expected(classes={c: m.classes[c] + b.classes[c] for c in ("no_dr", "dr")}, sources={"messidor": 24, "brset": 5},
                    depends_on=("messidor", "brset"),
                    split={"kind": "by_source", "sources": ["messidor", "brset"], "ratios": {"train": 0.8, "val": 0.1, "test": 0.1}},
                    clients=2)


MBRSET_ROWS = [("1.1.jpg", 1, 0.0, "no"), ("1.2.jpg", 1, 2.0, "yes"), ("2.1.jpg", 2, 4.0, ""), ("3.1.jpg", 3, np.nan, "no"),
               ("3.2.jpg", 3, 0.0, "no"), ("4.1.jpg", 4, 1.0, "no")]


@layout("mbrset")
def mbrset(raw: Path) -> Expected:
    base = raw / "mbrset"
    rows = []
    for i, (file, patient, icdr, edema) in enumerate(MBRSET_ROWS):
        write(base / "images" / file, fundus_bytes("JPEG", i))
        rows.append({"patient": patient, "age": 61, "sex": 1, "dm_time": 10, "insulin": 0, "insulin_time": np.nan,
                     "oraltreatment_dm": 1, "systemic_hypertension": 1, "file": file, "laterality": "right",
                     "final_artifacts": "no", "final_quality": "yes", "final_icdr": icdr, "final_edema": edema or np.nan})
    write(base / "labels_mbrset.csv", csv_bytes(pd.DataFrame(rows)))
    # the row without a grade is left out; the one without an edema label stays (edema -1)
    return Expected(classes={"no_dr": 2, "dr": 3}, split=iid(), clients=2,
                    columns={"edema": {"2.1.jpg": -1, "1.2.jpg": 1, "1.1.jpg": 0}})


# --------------------------------------------------------------------------------------------
# chest X-ray

# MIMIC-CXR's report layout: a centred title line, then every line indented by one space, headings in capitals
MIMIC_TITLE = "                                 FINAL REPORT\n"
MIMIC_STUDIES = [  # subject, study, [(dicom id, view)], split, findings mentioned (CheXpert value), report
    (10000032, 50414267, [("02aa804e-bde0afdd-112c0b34-7bc16630-4e384014", "PA"),
                          ("174413ec-4ec4c1f7-34ea26b7-c5f994f8-79ef1962", "LATERAL")], "train", {"Edema": 1.0},
     MIMIC_TITLE + " EXAMINATION:  CHEST (PA AND LAT)\n \n FINDINGS:  \n \n Mild pulmonary edema. No effusion.\n \n"
                   " IMPRESSION:  \n \n Edema, improved.\n"),
    (10000032, 53189527, [("2a2277a9-b0ded155-c0de8eb9-c124d10e-82c5caab", "AP")], "validate",
     {"Pleural Effusion": 0.0, "Pneumonia": -1.0},
     MIMIC_TITLE + " FINDINGS: Small left pleural effusion is not seen. Possible pneumonia.\n IMPRESSION: Possible "
                   "pneumonia.\n"),
    (10000764, 57375967, [("096052b7-d256dc40-453a102b-fa7d01c6-1b22c6b4", "AP")], "test", {},
     MIMIC_TITLE + " FINDINGS: Lungs are clear, no acute process.\n CONCLUSION: No acute cardiopulmonary process.\n"),
    (11000183, 51967845, [("3a53d6b5-d7a5a9e4-3bb3b87b-0fa3a8ec-dc7d2b4a", "PA")], "train",
     {"Consolidation": 1.0, "Pneumothorax": 1.0},
     MIMIC_TITLE + " IMPRESSION:  Right lower lobe consolidation. Small pneumothorax.\n"),
]
CHEXPERT = ("Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Enlarged Cardiomediastinum", "Fracture", "Lung Lesion",
            "Lung Opacity", "No Finding", "Pleural Effusion", "Pleural Other", "Pneumonia", "Pneumothorax", "Support Devices")


def gz_csv(frame: pd.DataFrame) -> bytes:
    return gzip.compress(csv_bytes(frame))


def mimic_cxr_files(raw: Path, reports_root: str = "files") -> None:
    """The three tables and the reports zip placed as PhysioNet serves them; the image tree placed by
    hand (PhysioNet serves it file by file). ``reports_root``: files or mimic-cxr-reports/files."""
    base = raw / "mimic_cxr"
    meta, split, chexpert, reports = [], [], [], {}
    for subject, study, images, part, findings, report in MIMIC_STUDIES:
        folder = f"p{str(subject)[:2]}/p{subject}"
        for k, (dicom, view) in enumerate(images):
            write(base / "files" / folder / f"s{study}" / f"{dicom}.jpg", image_bytes("JPEG", k, mode="L"))
            meta.append({"dicom_id": dicom, "subject_id": subject, "study_id": study, "PerformedProcedureStepDescription":
                         "CHEST (PA AND LAT)", "ViewPosition": view, "Rows": 3056, "Columns": 2544, "StudyDate": 21800506,
                         "StudyTime": 213014.531, "ProcedureCodeSequence_CodeMeaning": "CHEST (PA AND LAT)",
                         "ViewCodeSequence_CodeMeaning": "postero-anterior", "PatientOrientationCodeSequence_CodeMeaning": "Erect"})
            split.append({"dicom_id": dicom, "study_id": study, "subject_id": subject, "split": part})
        chexpert.append({"subject_id": subject, "study_id": study, **{f: findings.get(f, np.nan) for f in CHEXPERT}})
        reports[f"{reports_root}/{folder}/s{study}.txt"] = report.encode()
    for name, frame in (("metadata", meta), ("split", split), ("chexpert", chexpert)):
        downloads(raw, "mimic_cxr", f"mimic-cxr-2.0.0-{name}.csv.gz", gz_csv(pd.DataFrame(frame)))
    downloads(raw, "mimic_cxr", "mimic-cxr-reports.zip", zip_bytes(reports))


@layout("mimic_cxr")
def mimic_cxr(raw: Path) -> Expected:
    mimic_cxr_files(raw, "mimic-cxr-reports/files")
    # the lateral image is left out; codes: edema = 1, effusion(0)+pneumonia(-1) = 2+16, none = 0, consolidation+pneumothorax = 4+8
    return Expected(classes={"edema": 1, "effusion+pneumonia": 1, "none": 1, "consolidation+pneumothorax": 1},
                    splits={"train": 2, "val": 1, "test": 1},
                    split={"kind": "lda", "alpha": 1.0, "clients": 2, "min_size": 0, "client_split": "official"}, clients=2)


def rsna_pneumonia_archive(tmp: Path) -> tuple[bytes, dict[str, int]]:
    patients = {"0004cfab-14fd-4e49-80ba-63a80b6bddd6": [], "00313ee0-9eaa-42f4-b0ab-c148ed3241cd": [],
                "00322d4d-1c29-4943-afc9-b6754be640eb": [], "003d8fa0-6bf1-40ed-b54c-ac657f8495c5": [],
                "00436515-870c-4b36-a041-de91049b9ab4": [(264.0, 152.0, 213.0, 379.0), (562.0, 152.0, 256.0, 453.0)],
                "00569f44-917d-4c86-a842-81832af98c30": [(323.0, 577.0, 160.0, 104.0)],
                "006cec2e-6ce2-4549-bffa-eadfcd1e9970": [(198.0, 375.0, 114.0, 206.0)]}
    jpeg = image_bytes("JPEG", 100, size=(16, 16), mode="L")
    members, labels, info = {}, [], []
    for patient, boxes in patients.items():
        members[f"stage_2_train_images/{patient}.dcm"] = dicom_bytes(tmp / "p.dcm", jpeg=jpeg, size=(16, 16))
        for box in boxes or [(np.nan,) * 4]:
            labels.append({"patientId": patient, "x": box[0], "y": box[1], "width": box[2], "height": box[3],
                           "Target": int(bool(boxes))})
        info.append({"patientId": patient, "class": "Lung Opacity" if boxes else "Normal"})
    members["stage_2_train_labels.csv"] = csv_bytes(pd.DataFrame(labels))
    members["stage_2_detailed_class_info.csv"] = csv_bytes(pd.DataFrame(info))
    members["stage_2_test_images/0000a175-0e68-4ca4-b1af-167204a7e0bc.dcm"] = dicom_bytes(tmp / "t.dcm", jpeg=jpeg, size=(16, 16))
    members["stage_2_sample_submission.csv"] = b"patientId,PredictionString\n0000a175-0e68-4ca4-b1af-167204a7e0bc,0.5 0 0 100 100\n"
    members["GCP Credits Request Link - RSNA.txt"] = b"https://www.kaggle.com/\n"
    return zip_bytes(members), {"normal": 4, "pneumonia": 3}


@layout("rsna_pneumonia")
def rsna_pneumonia(raw: Path) -> Expected:
    data, classes = rsna_pneumonia_archive(raw)
    downloads(raw, "rsna_pneumonia", "rsna-pneumonia-detection-challenge.zip", data)
    return Expected(classes=classes, split=iid(), clients=2,
                    columns={"boxes": {"00569f44-917d-4c86-a842-81832af98c30.jpg": "[[323.0, 577.0, 160.0, 104.0]]"}})


COVIDX_9A = {  # COVIDx9A lines: patient id, file, label, source
    "train": [("5", "ARDSSevere.png", "pneumonia", "cohen"), ("379", "person1497_virus_2607.jpeg", "pneumonia", "rsna"),
              ("419639-003251", "MIDRC-RICORD-1C-419639-003251-46647-0.png", "COVID-19", "ricord"),
              ("8ae1d3c8-5c14", "8ae1d3c8-5c14-4a02-b451-e40a32a2bfac.png", "normal", "rsna"),
              ("4a1b2c3d", "4a1b2c3d-0000-4000-8000-000000000000.png", "normal", "rsna")],
    "test": [("419639-000082", "MIDRC-RICORD-1C-419639-000082-39881-0.png", "COVID-19", "ricord"),
             ("806", "person1595_virus_2768.jpeg", "pneumonia", "rsna"),
             ("00c2b1e3", "00c2b1e3-d6c8-4b2f-8e5a-3f1d9c7e2a10.png", "normal", "rsna")],
}


@layout("covidx")
def covidx(raw: Path) -> Expected:
    members = {}
    for split, lines in COVIDX_9A.items():
        members[f"{split}_COVIDx9A.txt"] = "".join(f"{p} {f} {c} {s}\n" for p, f, c, s in lines).encode()
        for i, (_, file, _, _) in enumerate(lines):
            members[f"{split}/{file}"] = image_bytes("PNG" if file.endswith("png") else "JPEG", i, mode="L")
    downloads(raw, "covidx", "covidx-cxr2-v6.zip", zip_bytes(members))
    return Expected(classes={"normal": 3, "pneumonia": 3, "covid19": 2}, splits={"train": 5, "test": 3},
                    split=iid(global_test="official"), clients=2)


# --------------------------------------------------------------------------------------------
# head CT

ICH_IMAGES = [  # image, single subtype or None (several / none), 12-bit stored with intercept 0 (needs the correction)
    ("ID_000039fa0", "epidural", False), ("ID_00005679d", "intraparenchymal", True), ("ID_00008ce3c", "intraventricular", False),
    ("ID_0000950d7", "subarachnoid", False), ("ID_0000aee4b", "subdural", True), ("ID_0000ca2f6", "subdural", False),
    ("ID_0000f1657", None, False), ("ID_000178e76", "multiple", False)]
ICH_TYPES = ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural", "any")


def ich_label_rows() -> list[dict]:
    rows = []
    for image, subtype, _ in ICH_IMAGES:
        positive = {"subdural", "epidural"} if subtype == "multiple" else ({subtype} if subtype else set())
        rows += [{"ID": f"{image}_{t}", "Label": int(t in positive or (t == "any" and bool(positive)))} for t in ICH_TYPES]
    return rows + rows[:6]   # stage 2 repeats a few rows


ICH_AIR_BRAIN_HU = (-1000, 40)   # every fixture slice: top half air, bottom half brain


def ich_slice(tmp: Path, twelve_bit: bool) -> bytes:
    """Top half air (-1000 HU), bottom half brain (40 HU): int16 with intercept -1024, or as the 12-bit
    unsigned slices with intercept 0 that need the correction store it (air as 3096 = -1000 + 4096, brain 40;
    read as they are, air would be 3096 HU, white in any window)."""
    air, brain = ICH_AIR_BRAIN_HU
    if twelve_bit:
        pixels = np.where(np.arange(8)[:, None] < 4, air + 4096, brain) * np.ones((8, 8), dtype=np.uint16)
        return dicom_bytes(tmp, pixels=pixels.astype(np.uint16), bits_stored=12, intercept="0", slope="1",
                           center="40", width="80")
    pixels = np.where(np.arange(8)[:, None] < 4, air + 1024, brain + 1024) * np.ones((8, 8), dtype=np.int16)
    return dicom_bytes(tmp, pixels=pixels.astype(np.int16), intercept="-1024", slope="1", center="40", width="80")


@layout("rsna_ich")
def rsna_ich(raw: Path) -> Expected:
    top = "rsna-intracranial-hemorrhage-detection"   # Kaggle's download-all archive keeps this folder
    members = {f"{top}/stage_2_train/{image}.dcm": ich_slice(raw / "s.dcm", twelve) for image, _, twelve in ICH_IMAGES}
    members[f"{top}/stage_2_train.csv"] = csv_bytes(pd.DataFrame(ich_label_rows()))
    members[f"{top}/stage_2_test/ID_000000e27.dcm"] = ich_slice(raw / "s.dcm", False)
    members[f"{top}/stage_2_sample_submission.csv"] = b"ID,Label\nID_000000e27_epidural,0.5\n"
    downloads(raw, "rsna_ich", f"{top}.zip", zip_bytes(members))
    return Expected(classes={"epidural": 1, "intraparenchymal": 1, "intraventricular": 1, "subarachnoid": 1, "subdural": 2},
                    split={"kind": "creff", "alpha": 1.0, "clients": 2, "group_size": 2, "global_test": {"fraction": 0.2},
                           "ratios": {"train": 0.875, "val": 0.125, "test": 0.0}, "seed": 0}, clients=2)


@layout("rsna_ich_stage1_png")
def rsna_ich_stage1_png(raw: Path) -> Expected:
    # the PNG set has the stage-1 training slices; ID_0000ca2f6 stands for a stage-1 test slice (labelled in stage 2 only)
    members = {f"stage_1_train_images/{image}.png": image_bytes("PNG", 40, size=(128, 128), mode="L")
               for image, _, _ in ICH_IMAGES if image != "ID_0000ca2f6"}
    members["stage_1_test_images/ID_0000ca2f6.png"] = image_bytes("PNG", 40, size=(128, 128), mode="L")
    downloads(raw, "rsna_ich_stage1_png", "rsna_stage1_png_128.zip", zip_bytes(members))
    downloads(raw, "rsna_ich_stage1_png", "stage_2_train.csv", csv_bytes(pd.DataFrame(ich_label_rows())))
    return Expected(classes={"epidural": 1, "intraparenchymal": 1, "intraventricular": 1, "subarachnoid": 1, "subdural": 1},
                    split=iid(), clients=2)
