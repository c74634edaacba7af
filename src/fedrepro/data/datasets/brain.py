"""Brain-tumour MRI datasets (FACMIC, FAA-CLIP).

Layout facts, and where they come from: both Kaggle archives unpack without a top folder into
``Training/<class>/`` and ``Testing/<class>/`` (the datasets' Kaggle pages): Bhuvaji et al.'s class folders
glioma_tumor, meningioma_tumor, no_tumor, pituitary_tumor (files like ``gg (1).jpg``, ``image(1).jpg``),
Nickparvar's glioma, meningioma, notumor, pituitary (files like ``Tr-gl_0010.jpg``, ``Te-no_0010.jpg``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...registry import preparer, register_dataset
from ..manifest import make_manifest
from ..prepare import class_folder_rows, missing_folder
from ..spec import DatasetSpec, Source

BT_CLASSES = ("glioma_tumor", "meningioma_tumor", "no_tumor", "pituitary_tumor")

register_dataset(DatasetSpec(
    name="bt",
    title="Brain Tumor Classification (MRI), Bhuvaji et al. 2020",
    classes=BT_CLASSES,
    sources=(Source("kaggle_dataset", "sartajbhuvaji/brain-tumor-classification-mri",
                    filename="brain-tumor-classification-mri.zip"),),
    layout="Training/<class>/*.jpg (2,870 images) and Testing/<class>/*.jpg (394 images); "
           "class folders glioma_tumor, meningioma_tumor, no_tumor, pituitary_tumor",
    prepare="kaggle_bt",
    access="account",
    homepage="https://www.kaggle.com/datasets/sartajbhuvaji/brain-tumor-classification-mri",
    citation="doi:10.34740/KAGGLE/DSV/1183165",
    used_by=("facmic", "faa_clip"),
    expected_files=("Training", "Testing"),
))

register_dataset(DatasetSpec(
    name="bt2",
    title="Brain Tumor MRI Dataset, Nickparvar 2021 (figshare + SARTAJ + Br35H; 7,023 images)",
    classes=BT_CLASSES,
    sources=(Source("kaggle_dataset", "masoudnickparvar/brain-tumor-mri-dataset",
                    filename="brain-tumor-mri-dataset.zip"),),
    layout="Training/<class>/*.jpg and Testing/<class>/*.jpg with class folders glioma, meningioma, "
           "notumor, pituitary (mapped onto the BT class names)",
    prepare="kaggle_bt2",
    access="account",
    homepage="https://www.kaggle.com/datasets/masoudnickparvar/brain-tumor-mri-dataset",
    citation="doi:10.34740/KAGGLE/DSV/2645886",
    used_by=("facmic",),
    expected_files=("Training", "Testing"),
))



@preparer("kaggle_bt")
def kaggle_bt(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """Kaggle BT: ``Training/<class>/`` and ``Testing/<class>/`` (the official train/test split)."""
    base = raw_root / spec.name
    rows = []
    for folder, split in (("Training", "train"), ("Testing", "test")):
        if not (base / folder).is_dir():
            raise missing_folder(base / folder, spec)
        rows += class_folder_rows(base / folder, raw_root, {c: c for c in spec.classes}, split=split)
    return make_manifest(rows, spec.classes)


BT2_FOLDERS = {"glioma": "glioma_tumor", "meningioma": "meningioma_tumor", "notumor": "no_tumor", "pituitary": "pituitary_tumor"}


@preparer("kaggle_bt2")
def kaggle_bt2(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """Nickparvar's BT: the same two folders, class folders named glioma/meningioma/notumor/pituitary."""
    base = raw_root / spec.name
    rows = []
    for folder, split in (("Training", "train"), ("Testing", "test")):
        if not (base / folder).is_dir():
            raise missing_folder(base / folder, spec)
        rows += class_folder_rows(base / folder, raw_root, BT2_FOLDERS, split=split)
    return make_manifest(rows, spec.classes)


# FACMIC's zero-shot transfer (Table 5): BT with BT2 as an external evaluation set. One run trains on BT
# and scores BT2 every round (eval key ``external``): the derived dataset is BT's manifest plus BT2's
# under the source ``bt2`` (the generic ``with_external`` preparer); the setting sets it aside with
# ``split.external: {sources: [bt2]}`` (never trained on, never a domain-adaptation target).
# BT2 = figshare + SARTAJ + Br35H, and SARTAJ is BT: ``bt_bt2`` keeps BT2 whole, as the paper used it (its
# "zero-shot" set then holds images the model trained on); ``bt_bt2_disjoint`` leaves out BT2's copies of
# BT images (same decoded pixels), for the clean protocol.
_BT_BT2 = dict(
    classes=BT_CLASSES,
    sources=(),
    layout="no files of its own: built from the bt and bt2 manifests",
    prepare="with_external",
    access="account",
    used_by=("facmic",),
    depends_on=("bt", "bt2"),
)
register_dataset(DatasetSpec(
    name="bt_bt2",
    title="BT (Bhuvaji et al.) plus all of BT2 (Nickparvar, 7,023 images, source 'bt2', which contains BT's "
          "SARTAJ images) as an external test set",
    options={"base": "bt", "external": "bt2", "external_source": "bt2"},
    **_BT_BT2,
))
register_dataset(DatasetSpec(
    name="bt_bt2_disjoint",
    title="BT (Bhuvaji et al.) plus BT2 without its copies of BT images (source 'bt2') as an external test set",
    options={"base": "bt", "external": "bt2", "external_source": "bt2", "drop_copies_of_base": True},
    **_BT_BT2,
))
