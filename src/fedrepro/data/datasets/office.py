"""Object-recognition domain-shift datasets of FAA-CLIP: OfficeHome (4 domains, 65 classes) and
Modern Office-31 (4 domains, 31 classes). The domain is the manifest's ``source``; there is no
official split (FAA-CLIP splits every client itself).

Layout facts, and where they come from:
- OfficeHome: ``OfficeHomeDataset_10072016.zip`` (the Google Drive file the dataset page links)
  unpacks to ``OfficeHomeDataset_10072016/{Art,Clipart,Product,Real World}/<class>/<nnnnn>.jpg`` with
  ``ImageInfo.csv`` and ``imagelist.txt`` beside the domains; 65 class folders Alarm_Clock ... Webcam
  (dataset page; public loaders such as the DomainBed and Transfer-Learning-Library ones read this tree).
- Modern Office-31: the Adaptiope repository (gitlab.com/tringwald/adaptiope) links the archive; its
  folder names below the domains are not confirmed from public sources: ``<domain>/<class>/`` and
  Office-31's own ``<domain>/images/<class>/`` are both accepted, whatever the root folder is called.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...registry import preparer, register_dataset
from ..manifest import ManifestError, make_manifest
from ..prepare import class_folder_rows, find_folder, missing_folder
from ..spec import DatasetSpec, Source

# class folders as the archive names them, in sorted (ImageFolder) order
OFFICEHOME_CLASSES = (
    "Alarm_Clock", "Backpack", "Batteries", "Bed", "Bike", "Bottle", "Bucket", "Calculator", "Calendar", "Candles",
    "Chair", "Clipboards", "Computer", "Couch", "Curtains", "Desk_Lamp", "Drill", "Eraser", "Exit_Sign", "Fan",
    "File_Cabinet", "Flipflops", "Flowers", "Folder", "Fork", "Glasses", "Hammer", "Helmet", "Kettle", "Keyboard",
    "Knives", "Lamp_Shade", "Laptop", "Marker", "Monitor", "Mop", "Mouse", "Mug", "Notebook", "Oven", "Pan",
    "Paper_Clip", "Pen", "Pencil", "Postit_Notes", "Printer", "Push_Pin", "Radio", "Refrigerator", "Ruler",
    "Scissors", "Screwdriver", "Shelf", "Sink", "Sneakers", "Soda", "Speaker", "Spoon", "TV", "Table", "Telephone",
    "ToothBrush", "Toys", "Trash_Can", "Webcam",
)
# source name -> folder names that hold it ("Real World" in the official archive)
OFFICEHOME_DOMAINS = {"Art": ("Art",), "Clipart": ("Clipart",), "Product": ("Product",),
                      "RealWorld": ("Real World", "RealWorld", "Real_World")}

register_dataset(DatasetSpec(
    name="officehome",
    title="Office-Home (Venkateswara et al. 2017): 15,588 images of 65 objects in 4 domains",
    classes=OFFICEHOME_CLASSES,
    sources=(Source("url", "https://drive.google.com/uc?export=download&id=0B81rNlvomiwed0V1YUxQdC1uOTg",
                    filename="OfficeHomeDataset_10072016.zip",
                    note="the Google Drive file linked from hemanthdv.org/officeHomeDataset.html; Drive may answer "
                         "with a confirmation page (then place the zip by hand); digest: trust-on-first-use"),),
    layout="OfficeHomeDataset_10072016/{Art,Clipart,Product,Real World}/<class>/*.jpg (65 class folders such as "
           "Alarm_Clock ... Webcam; A 2,427 / C 4,365 / P 4,439 / R 4,357 images); sources Art, Clipart, Product, RealWorld",
    prepare="officehome",
    access="open",
    homepage="https://www.hemanthdv.org/officeHomeDataset.html",
    citation="Venkateswara, Eusebio, Chakraborty, Panchanathan, Deep Hashing Network for Unsupervised Domain "
             "Adaptation, CVPR 2017",
    licence="non-commercial research and educational use only (terms on the homepage)",
    used_by=("faa_clip",),
    expected_files=("**/Art", "**/Clipart", "**/Product", "**/Real*World"),
))


def domain_class_rows(root: Path, raw_root: Path, spec: DatasetSpec, domains: dict[str, tuple[str, ...]]) -> list[dict]:
    """Rows for ``root/<domain folder>/<class>/*`` (or ``<domain folder>/images/<class>/*``, Office-31's
    own layout); unknown class folders are an error (a wrong archive)."""
    rows = []
    for source, folders in domains.items():
        folder = next((root / f for f in folders if (root / f).is_dir()), None)
        if folder is None:
            raise missing_folder(root / folders[0], spec)
        if (folder / "images").is_dir() and "images" not in spec.classes:
            folder = folder / "images"
        unknown = sorted(d.name for d in folder.iterdir() if d.is_dir() and d.name not in spec.classes)
        if unknown:
            raise ManifestError(f"{folder}: class folders {unknown} are not {spec.name} classes; allowed: {list(spec.classes)}")
        rows += class_folder_rows(folder, raw_root, {c: c for c in spec.classes}, source=source)
    return rows


@preparer("officehome")
def officehome(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """``<root>/<domain>/<class>/*.jpg``; the folder "Real World" becomes the source ``RealWorld``."""
    root = find_folder(raw_root / spec.name, "Art", spec).parent
    return make_manifest(domain_class_rows(root, raw_root, spec, OFFICEHOME_DOMAINS), spec.classes)


# ---------------------------------------------------------------------------------------------

OFFICE31_CLASSES = (
    "back_pack", "bike", "bike_helmet", "bookcase", "bottle", "calculator", "desk_chair", "desk_lamp",
    "desktop_computer", "file_cabinet", "headphones", "keyboard", "laptop_computer", "letter_tray", "mobile_phone",
    "monitor", "mouse", "mug", "paper_notebook", "pen", "phone", "printer", "projector", "punchers", "ring_binder",
    "ruler", "scissors", "speaker", "stapler", "tape_dispenser", "trash_can",
)
MODERN_OFFICE31_DOMAINS = {d: (d,) for d in ("amazon", "dslr", "synthetic", "webcam")}

register_dataset(DatasetSpec(
    name="modern_office31",
    title="Modern Office-31 (Ringwald & Stiefelhagen 2021): Office-31 with a cleaned Amazon domain plus a synthetic "
          "domain from Adaptiope; 31 classes, 4 domains",
    classes=OFFICE31_CLASSES,
    sources=(Source("manual", "https://gitlab.com/tringwald/adaptiope",
                    note="the dataset page of the Adaptiope paper links the Modern Office-31 archive; download it "
                         "there and unpack it into the dataset folder (no stable direct URL, so no digest is pinned)"),),
    layout="<root>/{amazon,dslr,synthetic,webcam}/<class>/*.jpg (root as in the archive, e.g. Modern-Office-31/; an "
           "images/ level below a domain, as in Office-31's own archive, is accepted; "
           "A 2,817 / D 498 / S 3,100 / W 795 images; the 31 Office-31 class folders back_pack ... trash_can)",
    prepare="modern_office31",
    access="open",
    homepage="https://gitlab.com/tringwald/adaptiope",
    citation="Ringwald & Stiefelhagen, Adaptiope: A Modern Benchmark for Unsupervised Domain Adaptation, WACV 2021; "
             "Saenko et al., ECCV 2010 (Office-31)",
    licence="research use; see the Adaptiope repository",
    used_by=("faa_clip",),
    expected_files=("**/amazon", "**/dslr", "**/synthetic", "**/webcam"),
))


@preparer("modern_office31")
def modern_office31(spec: DatasetSpec, raw_root: Path) -> pd.DataFrame:
    """``<root>/<domain>/<class>/*``; domains amazon, dslr, synthetic, webcam are the sources."""
    root = find_folder(raw_root / spec.name, "amazon", spec).parent
    return make_manifest(domain_class_rows(root, raw_root, spec, MODERN_OFFICE31_DOMAINS), spec.classes)
