"""Gastrointestinal endoscopy: the labeled images of HyperKvasir (FAA-CLIP's "HK" setting).

Layout facts, and where they come from: the archive ``hyper-kvasir-labeled-images.zip`` of the dataset
page (datasets.simula.no/hyper-kvasir) unpacks to ``labeled-images/{lower,upper}-gi-tract/<category>/
<finding>/*.jpg`` with ``labeled-images/image-labels.csv`` (header ``Video file,Organ,Finding,
Classification``; Organ ``Lower GI`` / ``Upper GI``), as the dataset's paper (Borgli et al. 2020) and
public loaders of the archive describe it; the wrapper folder above ``labeled-images`` varies between
copies and is not relied on. Labels come from the folders; the table's ``Finding`` names need not be
spelled like the folders, so a disagreement between the two is reported as a warning, not an error.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pandas as pd

from ...registry import preparer, register_dataset
from ..manifest import ManifestError, make_manifest
from ..prepare import find_file, find_folder, list_images, read_table, require_columns
from ..spec import DatasetSpec, Source

log = logging.getLogger(__name__)

# finding folders, sorted (ImageFolder order); the tree is <organ>/<category>/<finding>/
HYPERKVASIR_CLASSES = (
    "barretts", "barretts-short-segment", "bbps-0-1", "bbps-2-3", "cecum", "dyed-lifted-polyps",
    "dyed-resection-margins", "esophagitis-a", "esophagitis-b-d", "hemorrhoids", "ileum", "impacted-stool",
    "polyps", "pylorus", "retroflex-rectum", "retroflex-stomach", "ulcerative-colitis-grade-0-1",
    "ulcerative-colitis-grade-1", "ulcerative-colitis-grade-1-2", "ulcerative-colitis-grade-2",
    "ulcerative-colitis-grade-2-3", "ulcerative-colitis-grade-3", "z-line",
)
HYPERKVASIR_LABELS = "image-labels.csv"

register_dataset(DatasetSpec(
    name="hyperkvasir",
    title="HyperKvasir labeled images (Borgli et al. 2020): 10,662 GI endoscopy images, 23 findings",
    classes=HYPERKVASIR_CLASSES,
    sources=(Source("url", "https://datasets.simula.no/downloads/hyper-kvasir/hyper-kvasir-labeled-images.zip",
                    filename="hyper-kvasir-labeled-images.zip",
                    sha256="c603449b1bc0be86948b11d9aea8b2002058a11e6f5499e2a384b9ae9c8dbd3f",
                    note="pinned digest (archive of 3,928,814,344 bytes) as verified and published by an independent "
                         "project that uses this archive; Simula publishes none"),),
    layout="labeled-images/{lower-gi-tract,upper-gi-tract}/<category>/<finding>/*.jpg (categories anatomical-landmarks, "
           "pathological-findings, quality-of-mucosal-views, therapeutic-interventions; 23 finding folders) and "
           f"labeled-images/{HYPERKVASIR_LABELS} (Video file,Organ,Finding,Classification; one row per image)",
    prepare="hyperkvasir",
    access="open",
    homepage="https://datasets.simula.no/hyper-kvasir/",
    citation="Borgli et al., HyperKvasir, a comprehensive multi-class image and video dataset for gastrointestinal "
             "endoscopy, Sci Data 7:283 (2020), doi:10.1038/s41597-020-00622-y",
    licence="CC BY 4.0",
    used_by=("faa_clip",),
    expected_files=("**/labeled-images",),
))


def _finding_key(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


@preparer("hyperkvasir")
def hyperkvasir(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """Label = the finding folder; extra columns ``organ`` (lower-gi-tract / upper-gi-tract) and
    ``category``. ``image-labels.csv`` is the dataset's own label table: where its per-finding counts
    differ from the folder tree's (a partial unpack, a wrong archive, or findings spelled otherwise) the
    differences are logged as a warning; the folders stay the labels."""
    root = find_folder(raw_root / spec.name, "labeled-images", spec)
    rows = []
    for image in list_images(root):
        parts = image.relative_to(root).parts
        if len(parts) != 4:
            raise ManifestError(f"{image}: expected labeled-images/<organ>/<category>/<finding>/<image>")
        organ, category, finding, _ = parts
        rows.append({"path": image.relative_to(raw_root).as_posix(), "class_name": finding, "source": "",
                     "organ": organ, "category": category})
    frame = make_manifest(rows, spec.classes)
    try:
        labels_path = find_file(root, HYPERKVASIR_LABELS, spec, max_depth=0)
    except FileNotFoundError:
        return frame  # placed by hand without the table: the folder tree alone defines the labels
    table = read_table(labels_path, spec, dtype=str, keep_default_na=False)
    require_columns(table, ("Finding",), labels_path, spec)
    listed = table["Finding"].map(_finding_key).value_counts()
    found = frame["class_name"].map(_finding_key).value_counts()
    diff = {k: (int(listed.get(k, 0)), int(found.get(k, 0))) for k in sorted(set(listed.index) | set(found.index))
            if listed.get(k, 0) != found.get(k, 0)}
    if diff:
        log.warning("%s and the folder tree disagree (finding: (in the table, in the folders)): %s; the labels come "
                    "from the folders", labels_path, diff)
    return frame
