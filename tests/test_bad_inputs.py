"""Bad input on every dataset's real-layout fixture (tests/real_layouts.py), through the CLI as a user runs it.

For each dataset with files of its own, each kind of bad input a user with real downloads meets first:
an image its label table lists is missing; a label table or a part is missing; an image is corrupt; a
label table lacks a column the preparer reads; an archive is cut off; an archive member is damaged; a
recorded digest does not match. Every case must end in one message (the CLI's error, exit status not
0, never an uncaught exception), naming the file, with nothing marked complete (no ``.complete``, no
manifest), no digest recorded for a broken archive and no file the user placed touched. The good
archive is accepted after a cut-off one was refused; a digest that no longer matches is re-verified
on purpose with ``--reverify``. Derived datasets: a part's manifest missing. Finally the same through
``fedrepro`` in a subprocess, which must print no traceback (nor write one to the ``--log`` file the
Snakemake rules pass).

Where a case does not apply: datasets whose folders are the listing (``FOLDER_LISTED``) have no table
that lists images, so a missing image there is one image fewer, not an error.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from fedrepro.cli import main as cli
from fedrepro.data import download
from fedrepro.registry import dataset
from real_layouts import LAYOUTS, SC9_ROOT

ROOT = Path(__file__).resolve().parents[1]
OWN = sorted(n for n in LAYOUTS if not dataset(n).depends_on)          # datasets with files of their own
DERIVED = sorted(n for n in LAYOUTS if dataset(n).depends_on)
FOLDER_LISTED = {"bt", "bt2", "sc9", "officehome", "modern_office31", "hyperkvasir"}   # labels = folders
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".dcm")
ARCHIVE_SUFFIXES = (".zip", ".gz", ".tgz", ".tar", ".bz2", ".xz")
ICH_TOP = "rsna-intracranial-hemorrhage-detection"

# what each dataset cannot do without: a table, a part archive, or a folder (``<archive>!<member or prefix/>``)
NEEDED = {
    "bt": ["downloads/brain-tumor-classification-mri.zip!Testing/"],
    "bt2": ["downloads/brain-tumor-mri-dataset.zip!Training/"],
    "sc9": [f"downloads/skin-cancer9-classesisic.zip!{SC9_ROOT}/Test/"],
    "isic2019": ["downloads/ISIC_2019_Training_GroundTruth.csv", "downloads/ISIC_2019_Training_Metadata.csv",
                 "downloads/ISIC_2019_Training_Input.zip"],
    "ham10000": ["downloads/HAM10000_metadata.csv", "downloads/HAM10000_images_part_2.zip"],
    "ph2": ["PH2Dataset/PH2_dataset.txt"],
    "derm7pt": ["release_v0/meta/meta.csv"],
    "officehome": ["downloads/OfficeHomeDataset_10072016.zip!OfficeHomeDataset_10072016/Product/"],
    "modern_office31": ["Modern-Office-31/dslr/"],
    "hyperkvasir": ["hyper-kvasir/labeled-images/"],
    "eyepacs": ["metadata.csv"],
    "aptos2019": ["downloads/aptos2019-blindness-detection.zip!train.csv",
                  "downloads/aptos2019-blindness-detection.zip!train_images/"],
    "messidor": ["Base12/Annotation_Base12.xls"],
    "brset": ["labels.csv"],
    "mbrset": ["labels_mbrset.csv"],
    "mimic_cxr": ["downloads/mimic-cxr-2.0.0-split.csv.gz", "downloads/mimic-cxr-reports.zip"],
    "rsna_pneumonia": ["downloads/rsna-pneumonia-detection-challenge.zip!stage_2_train_labels.csv"],
    "covidx": ["downloads/covidx-cxr2-v6.zip!test_COVIDx9A.txt"],
    "rsna_ich": [f"downloads/{ICH_TOP}.zip!{ICH_TOP}/stage_2_train.csv"],
    "rsna_ich_stage1_png": ["downloads/stage_2_train.csv", "downloads/rsna_stage1_png_128.zip!stage_1_test_images/"],
}

# the columns each preparer reads from each of its label tables (covidx: the label field of its lines)
COLUMNS = {
    "isic2019": {"downloads/ISIC_2019_Training_GroundTruth.csv": ["image", "MEL"],
                 "downloads/ISIC_2019_Training_Metadata.csv": ["lesion_id"]},
    "ham10000": {"downloads/HAM10000_metadata.csv": ["image_id", "dx", "dataset"]},
    "ph2": {"PH2Dataset/PH2_dataset.txt": ["Name", "Clinical Diagnosis"]},
    "derm7pt": {"release_v0/meta/meta.csv": ["diagnosis", "derm"]},
    "hyperkvasir": {"hyper-kvasir/labeled-images/image-labels.csv": ["Finding"]},
    "eyepacs": {"metadata.csv": ["image_path", "diagnosis_image_dr_level", "clinical_siteIdentifier"]},
    "aptos2019": {"downloads/aptos2019-blindness-detection.zip!train.csv": ["id_code", "diagnosis"]},
    "messidor": {"Base11/Annotation_Base11.xls": ["Image name", "Retinopathy grade", "Risk of macular edema"]},
    "brset": {"labels.csv": ["image_id", "DR_ICDR", "macular_edema"]},
    "mbrset": {"labels_mbrset.csv": ["file", "final_icdr", "final_edema"]},
    "mimic_cxr": {"downloads/mimic-cxr-2.0.0-metadata.csv.gz": ["ViewPosition", "dicom_id"],
                  "downloads/mimic-cxr-2.0.0-split.csv.gz": ["split"],
                  "downloads/mimic-cxr-2.0.0-chexpert.csv.gz": ["study_id", "Edema"]},
    "rsna_pneumonia": {"downloads/rsna-pneumonia-detection-challenge.zip!stage_2_train_labels.csv": ["patientId", "Target"]},
    "covidx": {"downloads/covidx-cxr2-v6.zip!train_COVIDx9A.txt": [2]},
    "rsna_ich": {f"downloads/{ICH_TOP}.zip!{ICH_TOP}/stage_2_train.csv": ["ID", "Label"]},
    "rsna_ich_stage1_png": {"downloads/stage_2_train.csv": ["Label"]},
}


# --------------------------------------------------------------------------------------------
# the fixture's files: plain files under raw/<dataset>/, or members of a zip in its downloads/

@dataclass(frozen=True)
class Item:
    base: Path                # raw/<dataset>
    where: str                # a path relative to base, or "<zip>!<member or prefix/>"

    @property
    def archive(self) -> Path | None:
        return self.base / self.where.split("!")[0] if "!" in self.where else None

    @property
    def name(self) -> str:    # the member, or the path
        return self.where.split("!")[-1]

    @property
    def label(self) -> str:   # what a message must say: the file's or folder's own name
        return Path(self.name.rstrip("/")).name

    def read(self) -> bytes:
        if self.archive is None:
            return (self.base / self.where).read_bytes()
        with zipfile.ZipFile(self.archive) as zf:
            return zf.read(self.name)

    def write(self, data: bytes) -> None:
        if self.archive is None:
            (self.base / self.where).write_bytes(data)
        else:
            rewrite_zip(self.archive, lambda members: {**members, self.name: data})

    def remove(self) -> None:
        if self.archive is not None:
            rewrite_zip(self.archive, lambda members: {n: d for n, d in members.items() if not n.startswith(self.name)})
        elif (self.base / self.where).is_dir():
            import shutil

            shutil.rmtree(self.base / self.where)
        else:
            (self.base / self.where).unlink()


def rewrite_zip(path: Path, change) -> None:
    with zipfile.ZipFile(path) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist() if not i.is_dir()}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in change(members).items():
            zf.writestr(name, data)
    path.write_bytes(buf.getvalue())


def images(base: Path) -> list[Item]:
    """Every image file of the fixture, placed or inside a zip of downloads/, in a fixed order."""
    items = [Item(base, p.relative_to(base).as_posix()) for p in sorted(base.rglob("*"))
             if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and "downloads" not in p.relative_to(base).parts]
    for archive in sorted((base / "downloads").glob("*.zip")) if (base / "downloads").is_dir() else []:
        with zipfile.ZipFile(archive) as zf:
            items += [Item(base, f"downloads/{archive.name}!{n}") for n in sorted(zf.namelist())
                      if Path(n).suffix.lower() in IMAGE_SUFFIXES]
    return items


def archives(base: Path) -> list[Path]:
    folder = base / "downloads"
    return sorted(p for p in folder.iterdir() if p.name.endswith(ARCHIVE_SUFFIXES)) if folder.is_dir() else []


def snapshot(raw: Path) -> dict[str, tuple[str, int]]:
    return {p.relative_to(raw).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in raw.rglob("*") if p.is_file()}


def assert_untouched(raw: Path, before: dict) -> None:
    after = snapshot(raw)
    changed = sorted(path for path, state in before.items() if after.get(path) != state)
    assert not changed, f"files the user placed were changed or deleted: {changed}"


# --------------------------------------------------------------------------------------------
# running the CLI as a user does

@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No credentials and no network: a source that would be fetched fails as it does offline."""
    import requests

    for key in ("KAGGLE_USERNAME", "KAGGLE_KEY", "PHYSIONET_USERNAME", "PHYSIONET_PASSWORD"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", "/nonexistent")
    monkeypatch.setenv("HOME", "/nonexistent")

    def no_network(*args, **kwargs):
        raise requests.ConnectionError("no network in this test")

    monkeypatch.setattr(requests.Session, "get", no_network)


class Run:
    def __init__(self, raw: Path, caplog):
        self.raw, self.manifests, self.caplog = raw, raw.parent / "manifests", caplog

    def __call__(self, *args) -> None:
        cli([str(a) for a in args])

    def fails(self, *args) -> str:
        """The one message a failing command prints; fails the test on a traceback (any other exception)."""
        self.caplog.clear()
        with pytest.raises(SystemExit) as stop:
            self(*args)
        code = stop.value.code
        assert code not in (0, None)
        text = code if isinstance(code, str) else "\n".join(
            r.getMessage() for r in self.caplog.records if r.levelno >= logging.ERROR)
        assert text.strip(), "failed without a message"
        return text

    def download(self, name, *flags):
        return self("download", name, "--raw-dir", self.raw, *flags)

    def prepare(self, name, corrupt="error"):
        return self("prepare", name, "--raw-dir", self.raw, "--out", self.manifests / f"{name}.csv", "--corrupt", corrupt)

    def complete(self, name) -> bool:
        return (self.raw / name / download.COMPLETE_MARKER).exists()


@pytest.fixture
def run(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    return Run(tmp_path / "raw", caplog)


_GOOD: dict[str, pd.DataFrame] = {}


def good_manifest(name: str) -> pd.DataFrame:
    """The manifest the untouched fixture gives (once per dataset)."""
    if name not in _GOOD:
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "raw"
            LAYOUTS[name](raw)
            cli(["download", name, "--raw-dir", str(raw)])
            cli(["prepare", name, "--raw-dir", str(raw), "--out", str(Path(tmp) / f"{name}.csv")])
            _GOOD[name] = pd.read_csv(Path(tmp) / f"{name}.csv", keep_default_na=False)
    return _GOOD[name]


def used_image(name: str, base: Path) -> Item:
    """An image file of the fixture that the good manifest uses (matched by stem: preparers that convert
    files, DICOM to PNG or a fundus crop, keep the stem)."""
    manifest = good_manifest(name)
    stems = {Path(p).stem for column in ("path", "original_path") if column in manifest for p in manifest[column]}
    return next(item for item in images(base) if Path(item.name).stem in stems)


# --------------------------------------------------------------------------------------------
# the sweep

@pytest.mark.parametrize("name", sorted(set(OWN) - FOLDER_LISTED))
def test_an_image_the_tables_list_is_missing(name, run):
    LAYOUTS[name](run.raw)
    item = used_image(name, run.raw / name)
    item.remove()
    before = snapshot(run.raw)
    text = run.fails("download", name, "--raw-dir", run.raw)
    assert Path(item.name).name in text and name in text and f"fedrepro download {name}" in text
    assert not run.complete(name)
    assert_untouched(run.raw, before)


@pytest.mark.parametrize("name,where", [(n, w) for n in OWN for w in NEEDED[n]])
def test_a_label_table_or_part_is_missing(name, where, run):
    LAYOUTS[name](run.raw)
    item = Item(run.raw / name, where)
    item.remove()
    before = snapshot(run.raw)
    text = run.fails("download", name, "--raw-dir", run.raw)
    assert item.label in text and f"fedrepro download {name}" in text
    assert not run.complete(name)
    assert_untouched(run.raw, before)


def drop_column(data: bytes, column, where: str) -> tuple[bytes, str]:
    """The table without ``column``; -> (bytes, new file name) (an .xls becomes its CSV export)."""
    name = Path(where.split("!")[-1]).name
    if isinstance(column, int):                                   # fields of '<patient> <file> <label> <source>'
        lines = [" ".join(f for i, f in enumerate(line.split()) if i != column) for line in data.decode().splitlines()]
        return ("\n".join(lines) + "\n").encode(), name
    if name.endswith(".txt"):                                     # PH2's '||' table
        lines = data.decode().splitlines()
        header = next(line for line in lines if "||" in line)
        index = [c.strip() for c in header.strip().strip("|").split("||")].index(column)
        out = []
        for line in lines:
            if "||" in line:
                cells = line.strip().strip("|").split("||")
                line = "||" + "||".join(c for i, c in enumerate(cells) if i != index) + "||"
            out.append(line)
        return ("\n".join(out) + "\n").encode(), name
    if name.endswith(".xls"):
        frame = pd.read_excel(io.BytesIO(data), engine="calamine")
        frame.columns = [str(c).strip() for c in frame.columns]
        return frame.drop(columns=[column]).to_csv(index=False).encode(), name.replace(".xls", ".csv")
    compressed = name.endswith(".gz")
    frame = pd.read_csv(io.BytesIO(gzip.decompress(data) if compressed else data), dtype=str, keep_default_na=False)
    out = frame.drop(columns=[column]).to_csv(index=False).encode()
    return (gzip.compress(out) if compressed else out), name


@pytest.mark.parametrize("name,where,column", [(n, w, c) for n, tables in COLUMNS.items() for w, cs in tables.items()
                                               for c in cs])
def test_a_label_table_lacks_a_column_it_needs(name, where, column, run):
    LAYOUTS[name](run.raw)
    item = Item(run.raw / name, where)
    data, new_name = drop_column(item.read(), column, where)
    if new_name != item.label:                                    # MESSIDOR: the .xls replaced by its CSV export
        item.remove()
        item = Item(run.raw / name, str(Path(where).with_name(new_name)))
    item.write(data)
    before = snapshot(run.raw)
    text = run.fails("download", name, "--raw-dir", run.raw)
    assert Path(item.label).name.split(".")[0] in text
    if isinstance(column, str):
        assert repr(column) in text or column in text
    assert not run.complete(name)
    assert_untouched(run.raw, before)


@pytest.mark.parametrize("name", OWN)
def test_a_corrupt_image_is_named_then_left_out_and_listed(name, run):
    """DICOM included: a damaged slice no longer aborts the preparer; ``--corrupt error`` refuses naming it,
    ``--corrupt skip`` leaves it out and lists it."""
    LAYOUTS[name](run.raw)
    item = used_image(name, run.raw / name)
    item.write(b"these bytes are no image at all\n" * 4)
    tail = item.name.removeprefix(f"{ICH_TOP}/")
    run.download(name)
    text = run.fails("prepare", name, "--raw-dir", run.raw, "--out", run.manifests / f"{name}.csv", "--corrupt", "error")
    assert Path(tail).name in text and "data.corrupt_images: skip" in text
    assert not (run.manifests / f"{name}.csv").exists()
    run.prepare(name, corrupt="skip")
    skipped = pd.read_csv(run.manifests / f"{name}.skipped.csv")
    assert [p for p in skipped["path"] if p.endswith(tail)], (tail, skipped["path"].tolist())
    manifest = pd.read_csv(run.manifests / f"{name}.csv", keep_default_na=False)
    assert len(manifest) == len(good_manifest(name)) - 1 and not manifest["path"].isin(skipped["path"]).any()


ARCHIVES = []     # (dataset, archive name) of every archive (or compressed file) a fixture places in downloads/
with tempfile.TemporaryDirectory() as _tmp:
    for _name in OWN:
        LAYOUTS[_name](Path(_tmp) / _name)
        ARCHIVES += [(_name, p.name) for p in archives(Path(_tmp) / _name / _name)]


def recorded(run, name, archive) -> bool:
    return archive in download.recorded_checksums(run.raw / name)


@pytest.mark.parametrize("name,archive", ARCHIVES)
def test_a_cut_off_archive_records_nothing_and_the_good_one_is_accepted_after(name, archive, run):
    LAYOUTS[name](run.raw)
    path = run.raw / name / "downloads" / archive
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    before = snapshot(run.raw)
    text = run.fails("download", name, "--raw-dir", run.raw)
    assert archive in text and "not whole" in text and f"fedrepro download {name}" in text
    assert not recorded(run, name, archive) and not run.complete(name)
    assert_untouched(run.raw, before)
    path.write_bytes(good)                                        # the complete copy put in its place
    run.download(name)
    assert run.complete(name) and download.recorded_checksums(run.raw / name)[archive] == hashlib.sha256(good).hexdigest()


def damage(path: Path) -> str:
    """Flip bytes inside the data of a zip's first non-empty member (its CRC no longer matches), or in the
    middle of a compressed file; -> the member damaged ("" for a compressed file)."""
    data = bytearray(path.read_bytes())
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            info = next(i for i in zf.infolist() if i.file_size > 8)
        name_len, extra_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
            int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
        start = info.header_offset + 30 + name_len + extra_len
        for k in range(start + info.compress_size // 2, start + info.compress_size // 2 + 4):
            data[k] ^= 0xFF
        path.write_bytes(bytes(data))
        return info.filename
    for k in range(len(data) // 2, len(data) // 2 + 4):
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))
    return ""


@pytest.mark.parametrize("name,archive", [(n, a) for n, a in ARCHIVES if a.endswith((".zip", ".gz"))])
def test_a_damaged_archive_member_is_named_with_its_archive(name, archive, run):
    LAYOUTS[name](run.raw)
    path = run.raw / name / "downloads" / archive
    member = damage(path)
    before = snapshot(run.raw)
    text = run.fails("download", name, "--raw-dir", run.raw)
    assert archive in text and member in text and "not whole" in text
    assert not recorded(run, name, archive) and not run.complete(name)
    assert_untouched(run.raw, before)


@pytest.mark.parametrize("name", sorted({n for n, _ in ARCHIVES}))
def test_a_recorded_digest_that_no_longer_matches_says_how_to_reverify(name, run):
    LAYOUTS[name](run.raw)
    archive = next(a for n, a in ARCHIVES if n == name)
    before = snapshot(run.raw)
    (run.raw / name / download.CHECKSUM_FILE).write_text(f"{'0' * 64}  {archive}\n")   # a digest of another copy
    text = run.fails("download", name, "--raw-dir", run.raw)
    assert archive in text and f"fedrepro download {name} --raw-dir {run.raw} --reverify" in text
    assert not run.complete(name)
    assert_untouched(run.raw, before)
    run.download(name, "--reverify")                             # re-verified on purpose: whole, so recorded
    digest = hashlib.sha256((run.raw / name / "downloads" / archive).read_bytes()).hexdigest()
    assert run.complete(name) and download.recorded_checksums(run.raw / name)[archive] == digest


@pytest.mark.parametrize("name", DERIVED)
def test_a_derived_dataset_names_the_part_not_prepared(name, run, monkeypatch):
    expected = LAYOUTS[name](run.raw)
    for key, value in expected.options.items():
        monkeypatch.setitem(dataset(name).options, key, value)
    first, *rest = dataset(name).depends_on
    for part in rest:
        run.download(part)
        run.prepare(part)
    run.download(name)
    text = run.fails("prepare", name, "--raw-dir", run.raw, "--out", run.manifests / f"{name}.csv")
    assert str(run.manifests / f"{first}.csv") in text and f"prepare {first!r} first" in text
    assert not (run.manifests / f"{name}.csv").exists()


# --------------------------------------------------------------------------------------------
# the same through the installed command, as a user and a Snakemake job run it

def fedrepro(*args, log: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or str(ROOT / "src"), "HOME": "/nonexistent",
           "KAGGLE_CONFIG_DIR": "/nonexistent"}
    for key in ("KAGGLE_USERNAME", "KAGGLE_KEY", "PHYSIONET_USERNAME", "PHYSIONET_PASSWORD"):
        env.pop(key, None)
    command = [sys.executable, "-m", "fedrepro.cli", *(["--log", str(log)] if log else []), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def test_the_command_prints_one_message_and_no_traceback(tmp_path):
    # a cut-off Kaggle archive placed by hand
    raw = tmp_path / "a"
    LAYOUTS["bt"](raw)
    archive = raw / "bt/downloads/brain-tumor-classification-mri.zip"
    archive.write_bytes(archive.read_bytes()[:1000])
    done = fedrepro("download", "bt", "--raw-dir", raw)
    assert done.returncode != 0 and "Traceback" not in done.stderr and archive.name in done.stderr
    # a label table without the column the preparer reads, under Snakemake's --log
    raw = tmp_path / "b"
    LAYOUTS["rsna_pneumonia"](raw)
    labels = Item(raw / "rsna_pneumonia", "downloads/rsna-pneumonia-detection-challenge.zip!stage_2_train_labels.csv")
    labels.write(drop_column(labels.read(), "Target", labels.where)[0])
    log = tmp_path / "logs/download.log"
    done = fedrepro("download", "rsna_pneumonia", "--raw-dir", raw, log=log)
    text = log.read_text()
    assert done.returncode != 0 and "Traceback" not in text + done.stderr
    assert "stage_2_train_labels.csv" in text and "'Target'" in text
    # a DICOM the labels list, missing
    raw = tmp_path / "c"
    LAYOUTS["rsna_pneumonia"](raw)
    Item(raw / "rsna_pneumonia", "downloads/rsna-pneumonia-detection-challenge.zip!"
         "stage_2_train_images/00436515-870c-4b36-a041-de91049b9ab4.dcm").remove()
    done = fedrepro("download", "rsna_pneumonia", "--raw-dir", raw)
    assert done.returncode != 0 and "Traceback" not in done.stderr and "Errno" not in done.stderr
    assert "00436515-870c-4b36-a041-de91049b9ab4.dcm" in done.stderr
    # a damaged DICOM: named, then left out and listed
    raw = tmp_path / "d"
    LAYOUTS["rsna_ich"](raw)
    slice_ = Item(raw / "rsna_ich", f"downloads/{ICH_TOP}.zip!{ICH_TOP}/stage_2_train/ID_000039fa0.dcm")
    slice_.write(slice_.read()[:200])
    assert fedrepro("download", "rsna_ich", "--raw-dir", raw).returncode == 0
    out = tmp_path / "manifests/rsna_ich.csv"
    done = fedrepro("prepare", "rsna_ich", "--raw-dir", raw, "--out", out)
    assert done.returncode != 0 and "Traceback" not in done.stderr and "ID_000039fa0.dcm" in done.stderr
    done = fedrepro("prepare", "rsna_ich", "--raw-dir", raw, "--out", out, "--corrupt", "skip")
    assert done.returncode == 0 and "ID_000039fa0.dcm" in out.with_suffix(".skipped.csv").read_text()
