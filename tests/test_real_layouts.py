"""Real datasets all the way: every dataset the paper configurations name goes through download ->
prepare -> split (the CLI, in-process) on a tiny tree in its real published layout
(tests/real_layouts.py); the three datasets that stopped a user holding the real data (MIMIC-CXR with
its reports, COVIDx, RSNA ICH); no dataset complete while a file it needs is missing; nothing unpacked
twice; the disk-space check; resumable Kaggle and PhysioNet downloads; ``download --check``; and a
manual-step message for every source that needs a hand, naming files, origin, place and next command."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

import real_layouts
from fedrepro.cli import main as cli
from fedrepro.data import download
from fedrepro.data.download import DownloadError, ManualStepRequired, NotEnoughSpace
from fedrepro.data.manifest import ManifestError, read_manifest
from fedrepro.data.prepare import prepare_dataset
from fedrepro.registry import DATASETS, dataset
from http_files import zip_bytes
from real_layouts import LAYOUTS

ROOT = Path(__file__).resolve().parents[1]
NO_CREDENTIALS = {"HOME": "/nonexistent", "KAGGLE_CONFIG_DIR": "/nonexistent"}


def configured_datasets() -> set[str]:
    """Every dataset a paper configuration names (settings, downstream tasks, protocol overrides) and
    every dataset those are built from."""
    names = set()
    for path in (ROOT / "config" / "papers").glob("*.yaml"):
        paper = yaml.safe_load(path.read_text())
        for setting in paper["settings"].values():
            names.add(setting["dataset"])
            names.update(o["dataset"] for o in setting.get("protocols", {}).values() if "dataset" in o)
        names.update(task["dataset"] for task in (paper.get("downstream") or {}).values())
    todo = list(names)
    while todo:
        for dep in dataset(todo.pop()).depends_on:
            if dep not in names:
                names.add(dep)
                todo.append(dep)
    return names


def test_every_configured_dataset_has_a_real_layout_fixture():
    assert configured_datasets() <= set(LAYOUTS), sorted(configured_datasets() - set(LAYOUTS))
    assert len(configured_datasets()) >= 20


def run_cli(*args) -> None:
    cli([str(a) for a in args])


def download_and_prepare(name: str, raw: Path, manifests: Path) -> Path:
    run_cli("download", name, "--raw-dir", raw)
    out = manifests / f"{name}.csv"
    run_cli("prepare", name, "--raw-dir", raw, "--out", out)
    return out


@pytest.fixture()
def quiet_env(monkeypatch):
    for key in ("KAGGLE_USERNAME", "KAGGLE_KEY", "PHYSIONET_USERNAME", "PHYSIONET_PASSWORD"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", "/nonexistent")
    monkeypatch.setenv("HOME", "/nonexistent")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_download_prepare_split_on_the_real_layout(name, tmp_path, monkeypatch, quiet_env, capsys):
    raw, manifests = tmp_path / "raw", tmp_path / "manifests"
    expected = LAYOUTS[name](raw)
    for key, value in expected.options.items():
        monkeypatch.setitem(dataset(name).options, key, value)
    for part in (*expected.depends_on, name):
        out = download_and_prepare(part, raw, manifests)
        assert (raw / part / download.COMPLETE_MARKER).exists()
    manifest = read_manifest(out)
    spec = dataset(name)
    # labels are the registry's class order, every row's file exists
    assert (manifest["label"] == manifest["class_name"].map({c: i for i, c in enumerate(spec.classes)})).all()
    assert all((raw / p).is_file() for p in manifest["path"])
    if expected.classes:
        assert manifest["class_name"].value_counts().to_dict() == expected.classes
    if expected.sources is not None:
        assert manifest["source"].value_counts().to_dict() == expected.sources
    if expected.splits is not None:
        assert manifest["split"].value_counts().to_dict() == expected.splits
    for column, checks in expected.columns.items():
        for suffix, value in checks.items():
            row = manifest[manifest["path"].str.endswith("/" + suffix)]
            assert len(row) == 1 and row[column].iloc[0] == value, (column, suffix, row[column].tolist())
    # the placed tree passes --check, which changes nothing
    before = sorted((str(p), p.stat().st_mtime_ns) for p in (raw / name).rglob("*"))
    run_cli("download", name, "--raw-dir", raw, "--check")
    assert sorted((str(p), p.stat().st_mtime_ns) for p in (raw / name).rglob("*")) == before
    split_file = tmp_path / "splits" / f"{name}.json"
    run_cli("split", "--dataset", name, "--manifest", out, "--spec", json.dumps(expected.split), "--seed", 0, "--out", split_file)
    split = json.loads(split_file.read_text())
    assert len(split["clients"]) == expected.clients
    covered = [i for parts in split["clients"].values() for rows in parts.values() for i in rows]
    covered += split["global_test"] + split["reference"] + split["external"]
    assert len(covered) == len(set(covered)) and set(covered) <= set(range(len(manifest)))


# --------------------------------------------------------------------------------------------
# MIMIC-CXR-JPG + reports

def physionet(server, monkeypatch, raw: Path, reports_root: str = "files") -> None:
    """Serve what the MIMIC fixture placed in downloads/ as PhysioNet serves it; keep only the image tree."""
    monkeypatch.setattr(download.transfer, "PHYSIONET_FILES", server.url + "/files")
    real_layouts.mimic_cxr_files(raw, reports_root)
    for source in dataset("mimic_cxr").sources:
        if source.filename:
            placed = raw / "mimic_cxr" / "downloads" / source.filename
            server.files[f"/files/{source.ref}"] = placed.read_bytes()
            placed.unlink()


def test_mimic_tables_and_reports_download_by_themselves(server, monkeypatch, tmp_path):
    """With PhysioNet credentials and the image tree placed, the three tables and the reports zip are
    fetched (the zip unpacked), and the dataset is complete."""
    raw = tmp_path / "raw"
    physionet(server, monkeypatch, raw)
    env = {"PHYSIONET_USERNAME": "someone", "PHYSIONET_PASSWORD": "secret"}
    download.download_dataset(dataset("mimic_cxr"), raw, env=env)
    base = raw / "mimic_cxr"
    fetched = sorted(s["path"] for s in server.seen)
    assert fetched == sorted(f"/files/{s.ref}" for s in dataset("mimic_cxr").sources if s.filename)
    assert all(s["auth"].startswith("Basic ") for s in server.seen)
    assert (base / "files/p10/p10000032/s50414267.txt").is_file() and (base / ".complete").exists()
    manifest = prepare_dataset(dataset("mimic_cxr"), raw)
    assert len(manifest) == 4 and manifest["caption"].str.len().min() > 0


def test_mimic_image_tree_placed_by_hand_does_not_complete_the_other_sources(tmp_path):
    """Placing files/ used to mark every source done and write .complete; now each missing source is
    named, with where it comes from and the next command, and nothing is marked complete."""
    raw = tmp_path / "raw"
    real_layouts.mimic_cxr_files(raw)
    for placed in (raw / "mimic_cxr" / "downloads").iterdir():
        placed.unlink()
    with pytest.raises(ManualStepRequired) as err:
        download.download_dataset(dataset("mimic_cxr"), raw, env=NO_CREDENTIALS)
    text = str(err.value)
    assert "4 of 5 source(s) need a step only you can do (the other 1 are in place)" in text
    for table in ("metadata", "split", "chexpert"):
        assert f"https://physionet.org/files/mimic-cxr-jpg/2.0.0/mimic-cxr-2.0.0-{table}.csv.gz" in text
    assert "PhysioNet project mimic-cxr version 2.0.0 (https://physionet.org/files/mimic-cxr/2.0.0/mimic-cxr-reports.zip)" in text
    assert f"fedrepro download mimic_cxr --raw-dir {raw}" in text
    assert not (raw / "mimic_cxr" / ".complete").exists()
    # a marker written by an earlier version over missing files is dropped, not trusted
    (raw / "mimic_cxr" / ".complete").write_text("verified\n")
    with pytest.raises(ManualStepRequired):
        download.download_dataset(dataset("mimic_cxr"), raw, env=NO_CREDENTIALS)
    assert not (raw / "mimic_cxr" / ".complete").exists()


def test_mimic_studies_without_reports_are_named(tmp_path):
    raw = tmp_path / "raw"
    real_layouts.mimic_cxr_files(raw)
    (raw / "mimic_cxr" / "downloads" / "mimic-cxr-reports.zip").unlink()
    with pytest.raises(ManifestError) as err:
        prepare_dataset(dataset("mimic_cxr"), raw)
    text = str(err.value)
    assert "4 of 4 studies have no report" in text and "files/p10/p10000032/s50414267.txt" in text
    assert "mimic-cxr-reports.zip" in text and "https://physionet.org/content/mimic-cxr/2.0.0/" in text


@pytest.mark.parametrize("reports_root", ["files", "mimic-cxr-reports/files"])
def test_mimic_reports_zip_may_unpack_either_way(tmp_path, reports_root):
    raw = tmp_path / "raw"
    real_layouts.mimic_cxr_files(raw, reports_root)
    download.download_dataset(dataset("mimic_cxr"), raw, env=NO_CREDENTIALS)
    manifest = prepare_dataset(dataset("mimic_cxr"), raw)
    assert manifest.set_index("study_id").loc[50414267, "caption"].startswith("edema improved")


# --------------------------------------------------------------------------------------------
# COVIDx

def test_covidx_download_pins_kaggle_version_6(server, monkeypatch, tmp_path):
    raw = tmp_path / "raw"
    real_layouts.covidx(raw)
    archive = raw / "covidx" / "downloads" / "covidx-cxr2-v6.zip"
    server.files["/api/v1/datasets/download/andyczhao/covidx-cxr2"] = archive.read_bytes()
    archive.unlink()
    monkeypatch.setattr(download.transfer, "KAGGLE_API", server.url + "/api/v1")
    download.download_dataset(dataset("covidx"), raw, env={"KAGGLE_USERNAME": "u", "KAGGLE_KEY": "k"})
    assert server.seen[0]["path"] == "/api/v1/datasets/download/andyczhao/covidx-cxr2?datasetVersionNumber=6"
    assert prepare_dataset(dataset("covidx"), raw)["class_name"].nunique() == 3


def test_covidx_binary_labels_say_where_the_3_class_files_are(tmp_path):
    raw = tmp_path / "raw"
    real_layouts.covidx(raw)
    download.download_dataset(dataset("covidx"), raw, env=NO_CREDENTIALS)
    base = raw / "covidx"
    for split in ("train", "test"):   # a later release: binary labels in <split>.txt
        lines = (base / f"{split}_COVIDx9A.txt").read_text().replace("COVID-19", "positive").replace("normal", "negative")
        (base / f"{split}.txt").write_text(lines.replace("pneumonia", "negative"))
        (base / f"{split}_COVIDx9A.txt").unlink()
    with pytest.raises(ManifestError) as err:
        prepare_dataset(dataset("covidx"), raw)
    text = str(err.value)
    assert "train_COVIDx9A.txt and test_COVIDx9A.txt" in text and "version 6 of the Kaggle dataset andyczhao/covidx-cxr2" in text
    assert "https://github.com/lindawangg/COVID-Net/tree/master/labels" in text and str(base) in text


# --------------------------------------------------------------------------------------------
# RSNA ICH: top folder, never unpacked twice, 12-bit slices

def test_ich_archive_with_its_top_folder_completes_and_is_never_unpacked_twice(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    real_layouts.rsna_ich(raw)
    base = raw / "rsna_ich"
    download.download_dataset(dataset("rsna_ich"), raw, env=NO_CREDENTIALS)
    assert (base / "stage_2_train.csv").is_file() and (base / ".complete").exists()
    assert not (base / "rsna-intracranial-hemorrhage-detection").exists()      # the top folder is stripped
    hashed = []
    monkeypatch.setattr(download.archives, "sha256_file", lambda path, *a: hashed.append(path) or "0" * 64)
    written = []
    real_extract = download.extract
    monkeypatch.setattr(download.archives, "extract", lambda *a, **k: written.append(real_extract(*a, **k)) or written[-1])
    # a rerun (the marker gone): nothing hashed, nothing unpacked
    (base / ".complete").unlink()
    download.download_dataset(dataset("rsna_ich"), raw, env=NO_CREDENTIALS)
    assert hashed == [] and written == [] and (base / ".complete").exists()


def test_ich_placed_by_hand_with_the_top_folder_and_moved_files_are_not_unpacked_again(tmp_path):
    """An archive unpacked by an earlier version (top folder kept, no unpacked mark), its files then
    moved up by hand: the rerun writes nothing (every member is in place with its size)."""
    raw = tmp_path / "raw"
    real_layouts.rsna_ich(raw)
    base = raw / "rsna_ich"
    download.extract(base / "downloads" / "rsna-intracranial-hemorrhage-detection.zip", base)   # the top folder kept
    (base / "rsna-intracranial-hemorrhage-detection").rename(base / "moved")
    for item in (base / "moved").iterdir():
        item.rename(base / item.name)
    stamps = {p: p.stat().st_mtime_ns for p in base.rglob("*.dcm")}
    download.download_dataset(dataset("rsna_ich"), raw, env=NO_CREDENTIALS)
    assert {p: p.stat().st_mtime_ns for p in base.rglob("*.dcm")} == stamps and (base / ".complete").exists()
    # left in its top folder (unpacked by hand, no archive kept), it is accepted as it is
    raw2 = tmp_path / "raw2"
    real_layouts.rsna_ich(raw2)
    archive = raw2 / "rsna_ich" / "downloads" / "rsna-intracranial-hemorrhage-detection.zip"
    download.extract(archive, raw2 / "rsna_ich")
    archive.unlink()
    download.download_dataset(dataset("rsna_ich"), raw2, env=NO_CREDENTIALS)
    assert len(prepare_dataset(dataset("rsna_ich"), raw2)) == 6


TOP_FOLDER_SETS = [(name, s) for name in ("rsna_ich", "rsna_pneumonia", "aptos2019") for s in dataset(name).sources if s.top]


@pytest.mark.parametrize("name,source", TOP_FOLDER_SETS, ids=[n for n, _ in TOP_FOLDER_SETS])
def test_a_tree_unpacked_by_hand_with_its_top_folder_is_never_unpacked_again(tmp_path, monkeypatch, name, source):
    """Unzipped by hand keeping the archive's top folder, the archive still in downloads/ and no .unpacked
    marker: recognised by its contents, nothing written (no second copy of 450 GB); with files missing and
    the disk short of space, the message says what is already there; with space, only what is missing is
    written, into the same tree."""
    raw = tmp_path / "raw"
    LAYOUTS[name](raw)
    base = raw / name
    archive = base / "downloads" / source.filename
    with zipfile.ZipFile(archive) as zf:                      # the fixtures' archives: re-zipped below the top folder
        members = {n: zf.read(n) for n in zf.namelist()}
    archive.write_bytes(zip_bytes({n if n.startswith(source.top + "/") else f"{source.top}/{n}": d for n, d in members.items()}))
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(base)                                    # as a user's unzip does it
    tree = base / source.top
    stamps = {p: p.stat().st_mtime_ns for p in tree.rglob("*") if p.is_file()}
    download.download_dataset(dataset(name), raw, env=NO_CREDENTIALS)
    assert (base / ".complete").exists() and download.unpacked_marker(archive).exists()
    assert {p: p.stat().st_mtime_ns for p in tree.rglob("*") if p.is_file()} == stamps
    assert sorted(p.name for p in base.iterdir() if p.is_dir()) == sorted(["downloads", source.top])   # nothing beside it
    # half of its files gone, and no space: the message says what is there, and writes nothing
    (base / ".complete").unlink()
    download.unpacked_marker(archive).unlink()
    gone = sorted(p for p in tree.rglob("*") if p.is_file())[::2]
    for p in gone:
        p.unlink()
    monkeypatch.setattr(download.base, "free_bytes", lambda path: 10)
    with pytest.raises(NotEnoughSpace) as err:
        download.download_dataset(dataset(name), raw, env=NO_CREDENTIALS)
    kept = len(stamps) - len(gone)
    assert f"{len(gone):,} of {len(stamps):,} files still to write" in str(err.value)
    assert f"{kept:,} of its files" in str(err.value) and f"already in place under {tree.resolve()} and are kept" in str(err.value)
    monkeypatch.undo()
    download.download_dataset(dataset(name), raw, env=NO_CREDENTIALS)
    assert all(p.is_file() for p in gone) and (base / ".complete").exists()
    assert sorted(p.name for p in base.iterdir() if p.is_dir()) == sorted(["downloads", source.top])
    assert len(prepare_dataset(dataset(name), raw)) > 0                  # and the preparer reads it where it is


def test_ich_12bit_slices_are_corrected_before_windowing(tmp_path):
    """Every fixture slice is air above brain; the 12-bit unsigned ones (intercept 0) store air as 3096,
    which read as it is would be 3096 HU (white); corrected it is -1000 HU (black), like the others."""
    raw = tmp_path / "raw"
    real_layouts.rsna_ich(raw)
    download.download_dataset(dataset("rsna_ich"), raw, env=NO_CREDENTIALS)
    manifest = prepare_dataset(dataset("rsna_ich"), raw)
    for path in manifest["path"]:
        png = np.asarray(Image.open(raw / path))
        assert png.shape == (256, 256) and png[0, 0] == 0 and png[-1, 0] == 128, path   # air 0, brain 40 HU -> 127.5


def kaggle_notebook_hu(pixels, bits_stored, pixel_representation, intercept, slope=1.0):
    """Hounsfield units as ``window_image`` of the Kaggle notebooks reppic/gradient-sigmoid-windowing and
    akensert/rsna-inceptionv3-keras-tf1-14-0 computes them: ``correct_dcm`` first when BitsStored == 12,
    PixelRepresentation == 0 and int(RescaleIntercept) > -100 (stored + 1000, values from 4096 on
    wrapped down by 4096, intercept -1000), then pixels * slope + intercept."""
    x = pixels.astype(np.int64)
    if bits_stored == 12 and pixel_representation == 0 and int(intercept) > -100:
        x = x + 1000
        x[x >= 4096] -= 4096
        intercept = -1000
    return x * slope + intercept


@pytest.mark.parametrize("bits_stored,signed,intercept", [(12, False, 0.0), (12, False, -99.5), (12, False, -1024.0),
                                                          (12, True, 0.0), (16, False, 0.0), (None, False, 0.0)])
def test_12bit_correction_matches_the_kaggle_notebooks(bits_stored, signed, intercept):
    from fedrepro.data.datasets.head_ct import correct_12bit

    pixels = np.array([[0, 40, 1000, 3095], [3096, 3136, 4000, 4095]], dtype=np.uint16)
    ours, ours_intercept = correct_12bit(pixels, intercept, bits_stored, signed)
    expected = kaggle_notebook_hu(pixels, bits_stored, int(signed), intercept)
    assert np.array_equal(ours.astype(np.int64) + ours_intercept, expected)


# --------------------------------------------------------------------------------------------
# HyperKvasir: the folders are the labels; image-labels.csv only checks them

def test_hyperkvasir_warns_where_its_label_table_and_folders_disagree_and_keeps_the_folders(tmp_path, caplog):
    import logging

    raw = tmp_path / "raw"
    real_layouts.hyperkvasir(raw)
    download.download_dataset(dataset("hyperkvasir"), raw, env=NO_CREDENTIALS)
    root = raw / "hyperkvasir" / "hyper-kvasir" / "labeled-images"
    next((root / "lower-gi-tract" / "anatomical-landmarks" / "cecum").glob("*.jpg")).unlink()    # a partial unpack
    caplog.set_level(logging.WARNING, logger="fedrepro.data.datasets.endoscopy")
    caplog.clear()                                             # the download step's check warned already
    manifest = prepare_dataset(dataset("hyperkvasir"), raw)
    [record] = caplog.records
    message = record.getMessage()
    assert f"{root / 'image-labels.csv'} and the folder tree disagree" in message
    assert "'cecum': (2, 1)" in message and "the labels come from the folders" in message
    assert "'z-line'" not in message                           # findings that agree are not listed
    assert manifest["class_name"].value_counts().to_dict() == {"barretts-short-segment": 1, "cecum": 1,
                                                                 "ulcerative-colitis-grade-2-3": 1, "z-line": 2}


# --------------------------------------------------------------------------------------------
# large downloads: free space, resume for Kaggle and PhysioNet

def test_unpacking_refuses_what_the_disk_cannot_hold(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    real_layouts.rsna_ich(raw)
    monkeypatch.setattr(download.base, "free_bytes", lambda path: 1000)
    with pytest.raises(NotEnoughSpace) as err:
        download.download_dataset(dataset("rsna_ich"), raw, env=NO_CREDENTIALS)
    needed = sum(len(real_layouts.ich_slice(tmp_path / "s.dcm", t)) for *_, t in real_layouts.ICH_IMAGES)
    text = str(err.value)
    assert "unpacking rsna-intracranial-hemorrhage-detection.zip" in text and "1,000 bytes) free" in text
    assert int(text.split(" needs ")[1].split("(")[1].split(" bytes")[0].replace(",", "")) > needed
    assert not (raw / "rsna_ich" / "stage_2_train").exists() and not (raw / "rsna_ich" / ".complete").exists()


@pytest.mark.parametrize("kind", ["kaggle", "physionet"])
def test_kaggle_and_physionet_downloads_resume(server, monkeypatch, tmp_path, kind):
    """Kaggle's API redirects to its storage, PhysioNet serves the file itself: an interrupted download
    continues from its .part file with a Range request (If-Range: the same file), and starts over when
    the file changed on the server."""
    big = np.random.default_rng(0).bytes(3 << 20)
    if kind == "kaggle":
        monkeypatch.setattr(download.transfer, "KAGGLE_API", server.url + "/api/v1")
        server.redirects["/api/v1/datasets/download/andyczhao/covidx-cxr2"] = "/storage/covidx.zip"
        served, spec, env = "/storage/covidx.zip", dataset("covidx"), {"KAGGLE_USERNAME": "u", "KAGGLE_KEY": "k"}
    else:
        monkeypatch.setattr(download.transfer, "PHYSIONET_FILES", server.url + "/files")
        served, spec = "/files/mimic-cxr/2.0.0/mimic-cxr-reports.zip", dataset("mimic_cxr")
        env = {"PHYSIONET_USERNAME": "u", "PHYSIONET_PASSWORD": "p"}
    source = next(s for s in spec.sources if s.extract and s.filename)
    archive = zip_bytes({"big.bin": big})
    server.files[served], server.etags[served], server.cut[served] = archive, '"v1"', (5 << 20) // 2
    target = tmp_path / spec.name / "downloads" / source.filename
    with pytest.raises(DownloadError, match="again to resume"):
        download.fetch_source(spec, source, tmp_path / spec.name, env)
    part = target.with_name(target.name + ".part")
    kept = part.stat().st_size
    assert 0 < kept < len(archive)
    download.fetch_source(spec, source, tmp_path / spec.name, env)
    assert server.seen[-1]["range"] == f"bytes={kept}-" and server.seen[-1]["if_range"] == '"v1"'
    assert target.read_bytes() == archive and not part.exists()
    # interrupted again, then the server's file changes: the next run starts over
    target.unlink()
    (tmp_path / spec.name / "SHA256SUMS").unlink(missing_ok=True)
    server.cut[served] = 1 << 20
    with pytest.raises(DownloadError):
        download.fetch_source(spec, source, tmp_path / spec.name, env)
    changed = zip_bytes({"big.bin": big[::-1]})
    server.files[served], server.etags[served] = changed, '"v2"'
    download.fetch_source(spec, source, tmp_path / spec.name, env)
    assert target.read_bytes() == changed


# --------------------------------------------------------------------------------------------
# --check, and a manual-step message for every source that needs a hand

def test_download_check_reports_without_changing_anything(tmp_path, capsys):
    raw = tmp_path / "raw"
    real_layouts.mimic_cxr_files(raw)
    (raw / "mimic_cxr" / "downloads" / "mimic-cxr-reports.zip").unlink()
    before = sorted((str(p), p.stat().st_mtime_ns) for p in raw.rglob("*"))
    with pytest.raises(SystemExit):
        run_cli("download", "mimic_cxr", "--raw-dir", raw, "--check")
    out = capsys.readouterr().out
    assert "mimic-cxr-reports.zip: MISSING" in out and "mimic-cxr-2.0.0-metadata.csv.gz: archive whole, no digest" in out
    assert sorted((str(p), p.stat().st_mtime_ns) for p in raw.rglob("*")) == before   # nothing recorded, nothing unpacked


def test_download_check_names_an_image_its_tables_list_but_that_is_missing(tmp_path, capsys):
    """MESSIDOR's twelve parts are all there, but one image an annotation table lists is not: --check says which,
    changing nothing, and the download refuses to mark the dataset complete."""
    raw = tmp_path / "raw"
    real_layouts.messidor(raw)
    image = sorted((raw / "messidor" / "Base23").glob("*.tif"))[0]
    image.unlink()
    before = sorted((str(p), p.stat().st_mtime_ns) for p in raw.rglob("*"))
    with pytest.raises(SystemExit):
        run_cli("download", "messidor", "--raw-dir", raw, "--check")
    out = capsys.readouterr().out
    assert "1 of the 2 files listed in" in out and "Annotation_Base23.xls" in out and image.name in out
    assert sorted((str(p), p.stat().st_mtime_ns) for p in raw.rglob("*")) == before
    with pytest.raises(DownloadError, match=rf"messidor: 1 of the 2 files listed in .*Annotation_Base23\.xls.*{image.name}"
                                            rf"(.|\n)*Nothing is marked complete"):
        download.download_dataset(dataset("messidor"), raw, env=NO_CREDENTIALS)
    assert not (raw / "messidor" / ".complete").exists()


def manual_sources() -> list[tuple[str, int]]:
    """(dataset, source index) of every source a user has to act on without credentials."""
    return [(name, i) for name in sorted(DATASETS.names()) for i, s in enumerate(dataset(name).sources)
            if s.kind in ("request", "manual", "kaggle_dataset", "kaggle_competition", "physionet")]


@pytest.mark.parametrize("name,index", manual_sources())
def test_every_manual_step_names_files_origin_place_and_next_command(tmp_path, name, index):
    spec = dataset(name)
    source = spec.sources[index]
    with pytest.raises(ManualStepRequired) as err:
        download.fetch_source(spec, source, tmp_path / name, NO_CREDENTIALS)
    text = str(err.value)
    files = download.source_files(spec, source)
    assert files and all(alternative in text for pattern in files for alternative in pattern.split("|"))
    assert source.where() in text                                         # URL / Kaggle slug+version / PhysioNet project+version
    if source.kind.startswith("kaggle"):
        assert "kaggle.com" in text and (not source.version or f"version {source.version}" in text)
    if source.kind == "physionet" or "physionet.org" in source.ref:
        project, version = source.where().split("PhysioNet project ")[1].split(" (")[0].split(" version ")
        assert f"/{project}/{version}/" in text
    assert str(tmp_path / name) in text                                     # where to place them
    if source.filename:
        assert f"put {source.filename} into {tmp_path / name / 'downloads'}/" in text
    assert f"then run: fedrepro download {name} --raw-dir {tmp_path}" in text


def test_a_dataset_with_files_missing_is_never_complete(tmp_path):
    """Unpacked, but a file the dataset needs is not in the archive: an error naming it, no marker."""
    raw = tmp_path / "raw"
    real_layouts.covidx(raw)
    archive = raw / "covidx" / "downloads" / "covidx-cxr2-v6.zip"
    with zipfile.ZipFile(archive) as zf:
        members = {n: zf.read(n) for n in zf.namelist() if not n.startswith("test_")}
    archive.write_bytes(zip_bytes(members))
    with pytest.raises(DownloadError, match=r"test_COVIDx9A\.txt\|test\.txt"):
        download.download_dataset(dataset("covidx"), raw, env=NO_CREDENTIALS)
    assert not (raw / "covidx" / ".complete").exists()


# --------------------------------------------------------------------------------------------
# FedIIC's ICH under the paper protocol reads the authors' images

def test_ich_setting_reads_the_authors_images_under_the_paper_protocol(tmp_path):
    from fedrepro.config import ConfigError, Project, load_project

    project = load_project(overrides={"papers": ["fediic"], "protocols": ["clean", "paper"]}, root=ROOT)
    runs = {key.protocol: project.resolver.run_config(key) for key in project.plan.runs() if key.setting == "ich" and key.method == "fedavg"}
    assert runs["clean"]["dataset"] == "rsna_ich" and runs["paper"]["dataset"] == "rsna_ich_stage1_png"
    assert runs["paper"]["paths"]["manifest"].endswith("rsna_ich_stage1_png.csv")
    assert runs["clean"]["split_id"].startswith("rsna_ich-creff") and runs["paper"]["split_id"].startswith("rsna_ich_stage1_png-creff")
    assert {s["dataset"] for s in project.plan.splits().values()} >= {"rsna_ich", "rsna_ich_stage1_png"}
    assert "rsna_ich_stage1_png" in project.plan.datasets()
    # the clean protocol alone never needs the authors' images
    assert "rsna_ich_stage1_png" not in load_project(overrides={"papers": ["fediic"], "protocols": ["clean"]}, root=ROOT).plan.datasets()
    # an override must keep the classes
    paper = yaml.safe_load((ROOT / "config/papers/fediic.yaml").read_text())
    paper["settings"]["ich"]["protocols"] = {"paper": {"dataset": "isic2019"}}
    (tmp_path / "fediic.yaml").write_text(yaml.safe_dump(paper))
    with pytest.raises(ConfigError, match=r"settings/ich/protocols/paper/dataset: 'isic2019' has other classes"):
        Project({"papers": ["fediic"], "paper_dir": str(tmp_path)}, root=ROOT)
