"""Retinal fundus datasets of FedAdapterProto (docs/papers/fedadapterproto.md): EyePACS with clinical sites, APTOS 2019,
their combination (EyePACS sites for training and testing, APTOS as an external test set), and the
demo twin of that combination.

Both fundus preparers circle-crop every image once (:func:`circle_crop`, the paper's "tightly
centred circle cropping", berenslab/fundus_circle_cropping) and store a ``crop_size`` x
``crop_size`` PNG next to the raw files (``<dataset>/preprocessed_<size>/...``); the manifest points
at those, and ``original_path`` keeps the raw file. An image that cannot be read or cropped keeps its
raw path and is listed as unreadable with the reason (``data.corrupt_images`` leaves it out or refuses).
Every image a label table lists must be there before anything is cropped.

Also FedDRA's retinal data: MESSIDOR and BRSET (pre-training) and mBRSET (downstream).

Layout facts, and where they come from:
- EyePACS with sites: the metadata columns the authors' ``get_dataset`` reads (berenslab/FedAdapterProto);
  the table itself is not public (by request).
- APTOS 2019: ``train.csv`` (``id_code,diagnosis``) and ``train_images/<id_code>.png``, the competition's
  data page; a top folder named after the competition is accepted (not confirmed either way).
- MESSIDOR (ADCIS): twelve parts Base11-Base14, Base21-Base24, Base31-Base34, each with its ``.tif``
  images and ``Annotation_BaseXX.xls`` (columns ``Image name``, ``Ophthalmologic department``,
  ``Retinopathy grade``, ``Risk of macular edema `` - with a trailing space, as public loaders index
  it); whether a part unpacks into its own ``BaseXX/`` folder or flat is not confirmed: an annotation
  file is read wherever it is, its images beside it. The ``.xls`` files are read with python-calamine
  (pandas' engine for them; xlrd's is deprecated).
- BRSET 1.0.0 (PhysioNet brazilian-ophthalmological): ``fundus_photos/<image_id>.jpg`` and the label
  table with ``image_id`` (``img00001``, no extension), ``patient_id``, ..., ``DR_ICDR`` (0-4),
  ``macular_edema`` (0/1): the header of ``labels.csv`` in luisnakayama/BRSET (the dataset authors'
  repository, which FedDRA's README names); PhysioNet's copy is ``labels.csv`` or, in later file lists,
  ``labels_brset.csv``: both are read.
- mBRSET 1.0 (PhysioNet mbrset): ``images/<file>`` (``file`` like ``985.1.jpg``) and
  ``labels_mbrset.csv`` with ``file, patient, age, sex, ..., final_icdr (0-4), final_edema (yes/no)``,
  some rows without a grade: public loaders of the PhysioNet release read these names.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from ...registry import preparer, register_dataset
from ..manifest import ManifestError, make_manifest
from ..prepare import (
    dependency_manifest,
    find_file,
    missing_folder,
    pixel_digest,
    read_table,
    require_columns,
    require_listed,
    whole_numbers,
    with_unreadable,
)
from ..spec import DatasetSpec, Source

FUNDUS_CLASSES = ("healthy", "diseased")     # DR grade 0 vs grades 1-4
EYEPACS_QUALITIES = ("Adequate", "Good", "Excellent")

register_dataset(DatasetSpec(
    name="eyepacs",
    title="EyePACS retinal fundus photographs with clinical-site metadata (Cuadros & Bresnick 2009)",
    classes=FUNDUS_CLASSES,
    sources=(Source("request", "https://www.eyepacs.com",
                    note="request research access from EyePACS (eyepacs.com, data requests) and ask for the images "
                         "together with the per-image metadata table that has the clinical_siteIdentifier column; "
                         "the public Kaggle DR release has no site information and cannot be used"),),
    layout="metadata.csv (one row per image with the columns image_path, image_field, session_image_quality "
           "(or image_quality), diagnosis_image_dr_level, clinical_siteIdentifier) next to the image folders it "
           "points to (image_path relative to this folder, e.g. images-set-1/<...>.jpg)",
    prepare="eyepacs_sites",
    access="request",
    homepage="https://www.eyepacs.com",
    citation="Cuadros J, Bresnick G. EyePACS: an adaptable telemedicine system for diabetic retinopathy "
             "screening. J Diabetes Sci Technol 3(3), 2009",
    licence="EyePACS data use agreement",
    used_by=("fedadapterproto",),
    expected_files=("metadata.csv",),
    options={"metadata": "metadata.csv", "image_set": "images-set-1", "field": "field 1",
             "qualities": EYEPACS_QUALITIES, "crop_size": 512},
))

register_dataset(DatasetSpec(
    name="aptos2019",
    title="APTOS 2019 Blindness Detection (Kaggle competition), labelled training images, binary DR",
    classes=FUNDUS_CLASSES,
    sources=(Source("kaggle_competition", "aptos2019-blindness-detection",
                    filename="aptos2019-blindness-detection.zip", top="aptos2019-blindness-detection",
                    note="accept the competition rules on kaggle.com first; digest: trust-on-first-use"),),
    layout="train.csv (id_code, diagnosis 0-4) and train_images/<id_code>.png (3,662 labelled images; the "
           "paper counts 3,660); test_images/ has no labels and is not used",
    prepare="aptos2019_binary",
    access="rules",
    homepage="https://www.kaggle.com/competitions/aptos2019-blindness-detection",
    citation="Asia Pacific Tele-Ophthalmology Society, APTOS 2019 Blindness Detection, Kaggle 2019",
    licence="Kaggle competition rules",
    used_by=("fedadapterproto",),
    expected_files=("train.csv", "train_images"),
    options={"crop_size": 512},
))

register_dataset(DatasetSpec(
    name="eyepacs_aptos",
    title="EyePACS sites (source = clinical site) plus APTOS 2019 (source 'aptos2019') as an external test set",
    classes=FUNDUS_CLASSES,
    sources=(),
    layout="no files of its own: built from the eyepacs and aptos2019 manifests",
    prepare="with_external",
    access="request",
    used_by=("fedadapterproto",),
    depends_on=("eyepacs", "aptos2019"),
    options={"base": "eyepacs", "external": "aptos2019", "external_source": "aptos2019"},
))

# --------------------------------------------------------------------------------------------
# circle cropping

def disc_geometry(gray: np.ndarray, threshold: float = 10.0) -> tuple[float, float, float]:
    """-> (centre x, centre y, radius) of the bright fundus disc in a grey image (0..255).

    The disc is often cut off at the top and bottom (or the sides), so the radius comes from the
    longer of the two extents of the bright area, and along the shorter (clipped) axis the centre is
    the middle of the widest lines, which pass through the disc centre whatever the clipping.
    """
    mask = gray > threshold
    h, w = mask.shape
    row_width, col_height = mask.sum(axis=1), mask.sum(axis=0)
    rows = np.flatnonzero(row_width > 0.01 * w)    # ignore isolated bright specks and text
    cols = np.flatnonzero(col_height > 0.01 * h)
    if not len(rows) or not len(cols):
        raise ValueError(f"no fundus disc found: no area brighter than {threshold} (image dark everywhere)")
    extent_x, extent_y = cols[-1] - cols[0] + 1, rows[-1] - rows[0] + 1
    radius = max(extent_x, extent_y) / 2
    if extent_x >= extent_y:
        cx = (cols[0] + cols[-1] + 1) / 2
        cy = np.flatnonzero(row_width >= 0.98 * row_width.max()).mean() + 0.5
    else:
        cy = (rows[0] + rows[-1] + 1) / 2
        cx = np.flatnonzero(col_height >= 0.98 * col_height.max()).mean() + 0.5
    return float(cx), float(cy), float(radius)


def circle_crop(image: np.ndarray, threshold: float = 10.0) -> np.ndarray:
    """The square of side 2r centred on the fundus disc (zero-padded where the disc is clipped), with
    everything outside the circle set to black. Deterministic; ``image`` is H x W (x C) uint8."""
    arr = np.asarray(image)
    gray = arr.mean(axis=2) if arr.ndim == 3 else arr.astype(float)
    cx, cy, radius = disc_geometry(gray, threshold)
    side = max(1, int(round(2 * radius)))
    x0, y0 = int(round(cx - side / 2)), int(round(cy - side / 2))
    out = np.zeros((side, side) + arr.shape[2:], dtype=arr.dtype)
    sx0, sy0 = max(x0, 0), max(y0, 0)
    sx1, sy1 = min(x0 + side, arr.shape[1]), min(y0 + side, arr.shape[0])
    out[sy0 - y0:sy1 - y0, sx0 - x0:sx1 - x0] = arr[sy0:sy1, sx0:sx1]
    yy, xx = np.mgrid[0:side, 0:side]
    centre = side / 2
    outside = (xx + 0.5 - centre) ** 2 + (yy + 0.5 - centre) ** 2 > radius ** 2
    out[outside] = 0
    return out


def crop_and_resize(source: Path, target: Path, size: int) -> str | None:
    """Circle-crop ``source`` and write it as a ``size`` x ``size`` PNG; -> why it could not (None: done)."""
    try:
        with Image.open(source) as im:
            rgb = np.asarray(im.convert("RGB"))
        cropped = circle_crop(rgb)
    except (OSError, ValueError, SyntaxError) as exc:
        return f"{type(exc).__name__}: {exc}"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    Image.fromarray(cropped).resize((size, size), Image.Resampling.BICUBIC).save(tmp, format="PNG")
    tmp.replace(target)
    return None


def preprocess_images(dataset_dir: Path, relative: list[str], size: int, workers: int = 8) -> tuple[list[str], list[tuple[str, str]]]:
    """Circle-crop + resize every image once into ``<dataset_dir>/preprocessed_<size>/`` (kept across
    runs: existing files are reused). -> (the new paths relative to ``dataset_dir``, [(raw path, reason)]
    of the images that cannot be read, which keep their raw path)."""
    folder = f"preprocessed_{size}"

    def one(rel: str) -> tuple[str, str | None]:
        out = Path(folder) / Path(rel).with_suffix(".png")
        if (dataset_dir / out).exists():
            return out.as_posix(), None
        why = crop_and_resize(dataset_dir / rel, dataset_dir / out, size)
        return (rel, why) if why else (out.as_posix(), None)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(one, relative))
    return [path for path, _ in done], [(path, why) for path, why in done if why]


# --------------------------------------------------------------------------------------------
# preparers

def _site_name(value) -> str:
    """The clinical site as text; "" for a row without one."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _relative_image_path(path: str, image_set: str) -> str:
    """``image_path`` as stored in the metadata, made relative to the dataset folder: paths that carry
    a prefix of the authors' machine are cut at the image-set folder."""
    path = str(path).replace("\\", "/")
    cut = path.find(image_set)
    return path[cut:] if cut > 0 else path.lstrip("/")


def eyepacs_images(spec: DatasetSpec, raw_root: Path) -> tuple[pd.DataFrame, list[str]]:
    """The metadata rows the filters keep and their image paths (relative to the dataset folder), each
    image checked to be there: what the download step checks."""
    opts = spec.options
    base = raw_root / spec.name
    meta_path = base / opts["metadata"]
    if not meta_path.is_file():
        raise missing_folder(meta_path, spec)
    meta = read_table(meta_path, spec, low_memory=False)
    quality = next((c for c in ("session_image_quality", "image_quality") if c in meta.columns), None)
    require_columns(meta, ["image_path", "image_field", "diagnosis_image_dr_level", "clinical_siteIdentifier",
                           quality or "session_image_quality"], meta_path, spec)
    keep = (meta["image_path"].astype(str).str.contains(opts["image_set"], regex=False)
            & (meta["image_field"].astype(str).str.strip().str.lower() == opts["field"].lower())
            & meta[quality].astype(str).str.strip().isin(opts["qualities"])
            & meta["diagnosis_image_dr_level"].notna())
    # the authors' table: the same filters as exact comparisons (berenslab/FedAdapterProto lib/utils.py::get_dataset);
    # authors_row = a kept row's position in it, -1 for a row only the forgiving filters keep
    exact = (keep & (meta["image_field"] == opts["field"]) & meta[quality].isin(opts["qualities"])).to_numpy()
    chosen = meta[keep].assign(authors_row=np.where(exact, np.cumsum(exact) - 1, -1)[keep.to_numpy()])
    if chosen.empty:
        raise ManifestError(f"{meta_path}: no image passes the filters ({opts['image_set']!r} in image_path, "
                            f"image_field == {opts['field']!r}, quality in {list(opts['qualities'])})")
    relative = [_relative_image_path(p, opts["image_set"]) for p in chosen["image_path"]]
    require_listed(spec, meta_path, relative, base, hint=f"image_path must be relative to {base};")
    return chosen, relative


@preparer("eyepacs_sites", check=eyepacs_images)
def eyepacs_sites(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """Field-1 images of the ``image_set`` folder with adequate or better quality and a DR grade,
    binary DR label (grade 0 -> healthy, 1-4 -> diseased), ``source`` = clinical site ("" where the
    metadata has none: such rows belong to no site) - the table the authors' get_dataset builds.

    The field and quality filters forgive case and surrounding spaces ("Field 1 " is field 1).
    ``metadata_row`` is each image's position in the authors' own table: the rows their ``get_dataset``
    (berenslab/FedAdapterProto lib/utils.py) keeps with its exact comparisons (``image_field == 'field 1'``,
    ``session_image_quality.isin([...])``), in the metadata file's order, counted from 0, rows without a site
    included; empty for a row only the forgiving filters keep. The authors' faulty indexing (split kind
    ``sites_authors_index``) reads positions of that table, so one row more or less shifts every client: it
    reads only the rows with a ``metadata_row``, in that order (not the manifest's, which is sorted by path)."""
    base = raw_root / spec.name
    chosen, relative = eyepacs_images(spec, raw_root)
    paths, failed = preprocess_images(base, relative, int(spec.options["crop_size"]))
    grades = chosen["diagnosis_image_dr_level"].astype(int).to_numpy()
    sites = chosen["clinical_siteIdentifier"]
    rows = [{"path": f"{spec.name}/{path}", "class_name": FUNDUS_CLASSES[int(grade > 0)], "source": _site_name(site),
             "split": "", "dr_level": int(grade), "original_path": f"{spec.name}/{rel}",
             "metadata_row": int(position) if position >= 0 else None}
            for path, rel, grade, site, position in zip(paths, relative, grades, sites, chosen["authors_row"])]
    return with_unreadable(make_manifest(rows, spec.classes), [(f"{spec.name}/{p}", why) for p, why in failed])


def aptos_images(spec: DatasetSpec, raw_root: Path) -> tuple[Path, pd.DataFrame, list[str]]:
    """(the folder of train.csv, its rows, their image paths relative to it), each image checked to be
    there: what the download step checks."""
    table_path = find_file(raw_root / spec.name, "train.csv", spec, max_depth=1, search_downloads=False)
    table = read_table(table_path, spec)
    require_columns(table, ("id_code", "diagnosis"), table_path, spec)
    relative = [f"train_images/{code}.png" for code in table["id_code"]]
    require_listed(spec, table_path, relative, table_path.parent)
    return table_path.parent, table, relative


@preparer("aptos2019_binary", check=aptos_images)
def aptos2019_binary(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """APTOS 2019 training images (the only labelled part) as an external test set: grade 0 ->
    healthy, 1-4 -> diseased, ``split`` = test, ``source`` = aptos2019."""
    base, table, relative = aptos_images(spec, raw_root)
    paths, failed = preprocess_images(base, relative, int(spec.options["crop_size"]))
    grades = whole_numbers(table, ("diagnosis",), base / "train.csv", allowed=range(5))["diagnosis"]
    prefix = base.relative_to(raw_root).as_posix()
    rows = [{"path": f"{prefix}/{path}", "class_name": FUNDUS_CLASSES[int(grade > 0)], "source": spec.name,
             "split": "test", "dr_level": int(grade), "original_path": f"{prefix}/{rel}"}
            for path, rel, grade in zip(paths, relative, grades)]
    return with_unreadable(make_manifest(rows, spec.classes), [(f"{prefix}/{p}", why) for p, why in failed])


@preparer("with_external")
def with_external(spec: DatasetSpec, raw_root: Path, manifest_dir: Path) -> pd.DataFrame:
    """A derived manifest: the rows of ``base`` plus those of ``external`` (optionally one official split
    of it) under the single source ``external_source``, for split.external; both restricted to the
    derived dataset's classes. ``subsample: {source: {class: fraction}}`` keeps the first
    round(fraction x n) images (in path order) of a class of a base source: sites of unequal size and
    class balance for the demo. ``drop_copies_of_base``: external images that are also in ``base`` (the
    same decoded pixels, :func:`~fedrepro.data.prepare.pixel_digest`) are left out, so the external set is
    disjoint from everything the runs train or select on."""
    opts = spec.options
    parts = {}
    for role in ("base", "external"):
        parts[role] = dependency_manifest(manifest_dir, spec, opts[role])
    external = parts["external"]
    if opts.get("external_split"):
        external = external[external["split"] == opts["external_split"]]
    if opts.get("drop_copies_of_base"):
        base = {pixel_digest(Path(raw_root) / path) for path in parts["base"]["path"]}
        copies = external["path"].map(lambda path: pixel_digest(Path(raw_root) / path) in base)
        logging.getLogger("fedrepro.prepare").info("%s: %d of %d %s images are copies of %s images, left out",
                                                  spec.name, int(copies.sum()), len(external), opts["external"], opts["base"])
        external = external[~copies]
    clash = parts["base"]["source"] == opts["external_source"]
    if clash.any():
        raise ManifestError(f"{spec.name}: {opts['base']} already has a source named {opts['external_source']!r}")
    frame = pd.concat([parts["base"], external.assign(source=opts["external_source"])], ignore_index=True)
    frame = frame[frame["class_name"].isin(spec.classes)].sort_values("path", kind="mergesort")
    for source, fractions in opts.get("subsample", {}).items():
        for class_name, fraction in fractions.items():
            members = frame.index[(frame["source"] == source) & (frame["class_name"] == class_name)]
            frame = frame.drop(members[int(round(fraction * len(members))):])
    return make_manifest(frame.drop(columns=["label"]).to_dict("records"), spec.classes)


# --------------------------------------------------------------------------------------------
# Retina: MESSIDOR (France) + BRSET (Brazil) for pre-training, mBRSET downstream

DR_WORDS = {0: "no diabetic retinopathy", 1: "mild diabetic retinopathy", 2: "moderate diabetic retinopathy",
            3: "severe diabetic retinopathy", 4: "proliferative diabetic retinopathy"}
MESSIDOR_EDEMA = {0: "no risk of macular edema", 1: "low risk of macular edema", 2: "high risk of macular edema"}
BRSET_EDEMA = {0: "no macular edema", 1: "macular edema"}


def retina_caption(dr_words: str, edema_words: str) -> str:
    """FedDRA's caption built from tabular labels: 'retinal image with {DR status} and {edema risk}'."""
    return f"retinal image with {dr_words} and {edema_words}"


def retina_row(path: str, source: str, dr_grade: int, edema_grade: int, edema_words: dict, **extra) -> dict:
    """A manifest row of a retinal pre-training set: label = DR present, caption from the grades."""
    return {"path": path, "class_name": "dr" if dr_grade > 0 else "no_dr", "source": source, "dr_grade": dr_grade,
            "edema": int(edema_grade > 0), "edema_grade": edema_grade,
            "caption": retina_caption(DR_WORDS[dr_grade], edema_words[edema_grade]), **extra}


MESSIDOR_BASES = tuple(f"Base{site}{part}" for site in (1, 2, 3) for part in (1, 2, 3, 4))

register_dataset(DatasetSpec(
    name="messidor",
    title="MESSIDOR (Decencière et al. 2014): 1,200 fundus images from three French departments",
    classes=("no_dr", "dr"),
    sources=(Source("request", "https://www.adcis.net/en/third-party/messidor/",
                    provides=tuple(f"**/Annotation_{b}.xls|**/Annotation_{b}.xlsx|**/Annotation_{b}.csv"
                                   for b in MESSIDOR_BASES),
                    note="register on the ADCIS page (the FedDRA authors downloaded it there in Aug 2024), download the "
                         "12 parts Base11 ... Base34 and unpack each into the dataset folder"),),
    layout="Base11/ ... Base34/ (or one folder), each with its .tif images and Annotation_BaseXX.xls (columns 'Image name', "
           "'Ophthalmologic department', 'Retinopathy grade', 'Risk of macular edema'; a CSV export "
           "Annotation_BaseXX.csv works too)",
    prepare="messidor",
    access="request",
    homepage="https://www.adcis.net/en/third-party/messidor/",
    citation="doi:10.5566/ias.1155",
    used_by=("feddra",),
))


MESSIDOR_COLUMNS = ("Image name", "Retinopathy grade", "Risk of macular edema")


def _read_annotation(path: Path, spec: DatasetSpec) -> pd.DataFrame:
    if path.suffix.lower() == ".csv":
        table = read_table(path, spec)
    else:
        try:
            table = read_table(path, spec, pd.read_excel, engine="calamine")   # pandas' reader for .xls (xlrd's is deprecated)
        except ImportError:
            raise ImportError(f"reading {path} needs python-calamine (a dependency of fedrepro: pip install "
                              f"python-calamine), or save it as {path.with_suffix('.csv').name} next to it") from None
    table.columns = [str(c).strip() for c in table.columns]   # the .xls header reads 'Risk of macular edema '
    return table


def messidor_annotations(base: Path) -> dict[str, Path]:
    """Base name -> its annotation file (a CSV export before the .xls), wherever it is unpacked."""
    found: dict[str, Path] = {}
    for path in sorted(base.glob("**/Annotation_Base*"), key=lambda p: (p.suffix.lower() != ".csv", str(p))):
        if "downloads" not in path.relative_to(base).parts and path.suffix.lower() in (".csv", ".xls", ".xlsx"):
            found.setdefault(path.stem.removeprefix("Annotation_"), path)
    return found


@preparer("messidor")
def messidor(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """Every one of the twelve parts' annotation tables, and every image each lists (beside it)."""
    base = raw_root / spec.name
    annotations = messidor_annotations(base)
    absent = [b for b in MESSIDOR_BASES if b not in annotations]
    if absent:
        raise ManifestError(f"{len(absent)} of the 12 MESSIDOR parts have no annotation table under {base}: {absent} "
                            f"(Annotation_<part>.xls, or a .csv export of it); download those parts from "
                            f"{spec.homepage} and unpack each into {base}/; {spec.name} should read: {spec.layout}")
    rows = []
    for _, path in sorted(annotations.items()):
        table = _read_annotation(path, spec)
        require_columns(table, MESSIDOR_COLUMNS, path, spec)
        grades = whole_numbers(table, MESSIDOR_COLUMNS[1:], path)
        folder = path.parent.relative_to(raw_root).as_posix()
        images = [f"{folder}/{name}" for name in table["Image name"]]
        require_listed(spec, path, images, raw_root, hint="its images belong beside the table;")
        rows += [retina_row(image, "messidor", int(dr), int(edema), MESSIDOR_EDEMA)
                 for image, dr, edema in zip(images, grades[MESSIDOR_COLUMNS[1]], grades[MESSIDOR_COLUMNS[2]])]
    return make_manifest(rows, spec.classes)


register_dataset(DatasetSpec(
    name="brset",
    title="BRSET 1.0.0, Brazilian Multilabel Ophthalmological Dataset (Nakayama et al. 2023): 16,266 fundus photos",
    classes=("no_dr", "dr"),
    sources=(
        Source("request", "physionet.org/files/brazilian-ophthalmological/1.0.0/",
               provides=("fundus_photos", "labels.csv|labels_brset.csv"),
               note="credentialed access (CITI training + data use agreement), files served one by one: "
                    "wget -r -N -c -np --user <physionet user> --ask-password "
                    "https://physionet.org/files/brazilian-ophthalmological/1.0.0/ and move its fundus_photos/ and "
                    "label table to resources/raw/brset/"),
    ),
    layout="fundus_photos/<image_id>.jpg and labels.csv (or labels_brset.csv) with columns image_id, patient_id, "
           "DR_ICDR (0-4), macular_edema (0/1), ...",
    prepare="brset",
    access="credentialed",
    homepage="https://physionet.org/content/brazilian-ophthalmological/1.0.0/",
    citation="doi:10.13026/xcxw-8198",
    used_by=("feddra",),
))


def _first_existing(base: Path, names: tuple[str, ...], spec: DatasetSpec) -> Path:
    for name in names:
        if (base / name).exists():
            return base / name
    raise missing_folder(base / names[0], spec)


@preparer("brset")
def brset(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    base = raw_root / spec.name
    path = _first_existing(base, ("labels.csv", "labels_brset.csv"), spec)
    table = read_table(path, spec)
    require_columns(table, ("image_id", "DR_ICDR", "macular_edema"), path, spec)
    grades = whole_numbers(table, ("DR_ICDR", "macular_edema"), path)
    rows = []
    for rec, dr, edema in zip(table.itertuples(index=False), grades["DR_ICDR"], grades["macular_edema"]):
        image = str(rec.image_id)
        image = image if image.lower().endswith((".jpg", ".jpeg", ".png")) else f"{image}.jpg"
        rows.append(retina_row(f"{spec.name}/fundus_photos/{image}", "brset", int(dr), int(edema),
                               BRSET_EDEMA, patient=str(getattr(rec, "patient_id", ""))))
    require_listed(spec, path, [r["path"] for r in rows], raw_root)
    return make_manifest(rows, spec.classes)


register_dataset(DatasetSpec(
    name="retina_vlp",
    title="MESSIDOR + BRSET image-caption pairs (FedDRA's retinal pre-training: one client per source)",
    classes=("no_dr", "dr"),
    sources=(),
    layout="no files of its own: built from the messidor and brset manifests",
    prepare="retina_vlp",
    access="request",
    used_by=("feddra",),
    depends_on=("messidor", "brset"),
))


@preparer("retina_vlp")
def retina_vlp(spec: DatasetSpec, raw_root: Path, manifest_dir: Path) -> pd.DataFrame:
    """The union of the two retinal manifests; ``source`` (messidor / brset) is the client."""
    parts = [dependency_manifest(manifest_dir, spec, name) for name in spec.depends_on]
    frame = pd.concat(parts, ignore_index=True)
    return make_manifest(frame.drop(columns=["label"]).to_dict("records"), spec.classes)


register_dataset(DatasetSpec(
    name="mbrset",
    title="mBRSET 1.0, mobile Brazilian retinal dataset (portable cameras; Wu et al. 2024): 5,164 images",
    classes=("no_dr", "dr"),
    sources=(
        Source("request", "physionet.org/files/mbrset/1.0/", provides=("images", "labels_mbrset.csv"),
               note="credentialed access (CITI training + data use agreement), files served one by one: "
                    "wget -r -N -c -np --user <physionet user> --ask-password https://physionet.org/files/mbrset/1.0/ "
                    "and move its images/ and labels_mbrset.csv to resources/raw/mbrset/"),
    ),
    layout="images/<file> and labels_mbrset.csv with columns file, patient, final_icdr (0-4), final_edema (yes/no or 1/0)",
    prepare="mbrset",
    access="credentialed",
    homepage="https://physionet.org/content/mbrset/1.0/",
    used_by=("feddra",),
))


def _yes_no(value) -> int:
    """final_edema as 1 / 0, and -1 where the row has none (unlabelled for the edema task)."""
    if pd.isna(value) or not str(value).strip():
        return -1
    text = str(value).strip().lower()
    if text in ("yes", "1", "1.0", "true"):
        return 1
    if text in ("no", "0", "0.0", "false"):
        return 0
    raise ManifestError(f"mBRSET final_edema value {value!r} is neither yes/no nor 1/0")


@preparer("mbrset")
def mbrset(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """label = DR present (final_icdr > 0); ``edema`` = final_edema as 0/1, -1 where the row has none
    (the second downstream task reads it with label_column: edema and leaves -1 rows out; the DR task
    keeps them); rows without a DR grade are left out."""
    base = raw_root / spec.name
    path = _first_existing(base, ("labels_mbrset.csv",), spec)
    table = read_table(path, spec)
    require_columns(table, ("file", "final_icdr", "final_edema"), path, spec)
    table = table[table["final_icdr"].notna()]
    require_listed(spec, path, [f"images/{f}" for f in table["file"]], base)
    rows = [{"path": f"{spec.name}/images/{rec.file}", "class_name": "dr" if int(rec.final_icdr) > 0 else "no_dr",
             "dr_grade": int(rec.final_icdr), "edema": _yes_no(rec.final_edema), "patient": str(getattr(rec, "patient", ""))}
            for rec in table.itertuples(index=False)]
    return make_manifest(rows, spec.classes)
