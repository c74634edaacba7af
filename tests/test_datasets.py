"""Real datasets of FACMIC / FAA-CLIP: every preparer on a tiny fake raw layout in the real format,
the download machinery against a local HTTP server (resume, checksums, credentials, Dataverse,
web pages instead of archives, path traversal), and the BT preparer on the 17 real demo MRIs."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedrepro.data import download
from fedrepro.data.download import ChecksumMismatch, DownloadError, ManualStepRequired
from fedrepro.data.manifest import ManifestError, validate_manifest, write_manifest
from fedrepro.data.prepare import prepare_dataset
from fedrepro.data.spec import DatasetSpec, Source
from fedrepro.registry import dataset
from http_files import zip_bytes


def jpeg(path: Path, shade: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (shade % 256, 40, 90)).save(path, "JPEG")
    return path


def prepare(name: str, raw: Path, **kw) -> pd.DataFrame:
    return validate_manifest(prepare_dataset(dataset(name), raw, **kw), dataset(name).classes)


# --------------------------------------------------------------------------------------------
# fake raw layouts

SC9_TREE = "skin cancer isic the international skin imaging collaboration/Skin cancer ISIC The International Skin Imaging Collaboration"
# (split, folder, image ids): ISIC_0025780 is also a HAM10000 image, ISIC_0000013 also an ISIC 2019 one
SC9_FILES = [("Train", "actinic keratosis", ["ISIC_0025780", "ISIC_0000001"]), ("Train", "seborrheic keratosis", ["ISIC_0000002"]),
             ("Train", "vascular lesion", ["ISIC_0000003"]), ("Train", "pigmented benign keratosis", ["ISIC_0000013"]),
             ("Test", "melanoma", ["ISIC_0000004"]), ("Test", "squamous cell carcinoma", ["ISIC_0000005"])]


def make_sc9(raw: Path) -> None:
    for split, folder, ids in SC9_FILES:
        for i in ids:
            jpeg(raw / "sc9" / SC9_TREE / split / folder / f"{i}.jpg")


# ISIC 2019: 10 NV + 5 MEL of its own, 1 SCC, 1 BKL that is the SC image ISIC_0000013 (downsampled
# file name), and the two HAM10000 images below
ISIC_OWN = [(f"ISIC_00100{i:02d}", "NV", f"BCN_00000{i:02d}") for i in range(10)] + \
           [(f"ISIC_00200{i:02d}", "MEL", f"MSK4_000{i:02d}") for i in range(5)] + \
           [("ISIC_0030000", "SCC", ""), ("ISIC_0000013_downsampled", "BKL", "")]
HAM_ROWS = [("HAM_0000118", "ISIC_0025030", "bkl", "vidir_modern"), ("HAM_0002730", "ISIC_0025780", "akiec", "rosendahl"),
            ("HAM_0001466", "ISIC_0031633", "vasc", "vidir_molemax"), ("HAM_0001466", "ISIC_0027850", "nv", "vienna_dias")]
ISIC_ROWS = ISIC_OWN + [("ISIC_0025030", "BKL", "HAM_0000118"), ("ISIC_0031633", "VASC", "HAM_0001466")]
ISIC_COLS = ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC", "UNK"]


def make_isic2019(raw: Path) -> None:
    base = raw / "isic2019"
    for k, (image, _, _) in enumerate(ISIC_ROWS):
        jpeg(base / "ISIC_2019_Training_Input" / f"{image}.jpg", k)
    (base / "ISIC_2019_Training_Input" / "LICENSE.txt").write_text("CC-BY-NC")
    truth = pd.DataFrame([{"image": i, **{c: float(c == cls) for c in ISIC_COLS}} for i, cls, _ in ISIC_ROWS])
    meta = pd.DataFrame([{"image": i, "age_approx": 55.0, "anatom_site_general": "anterior torso", "lesion_id": les,
                          "sex": "male"} for i, _, les in ISIC_ROWS])
    (base / "downloads").mkdir(parents=True)
    truth.to_csv(base / "downloads/ISIC_2019_Training_GroundTruth.csv", index=False)
    meta.to_csv(base / "downloads/ISIC_2019_Training_Metadata.csv", index=False)


def make_ham(raw: Path, sep: str = ",", name: str = "HAM10000_metadata.csv", drop: str | None = None) -> None:
    base = raw / "ham10000"
    for k, (_, image, _, _) in enumerate(HAM_ROWS):  # part 1 unpacks into a folder, part 2 at the top level
        jpeg((base / "HAM10000_images_part_1" if k < 2 else base) / f"{image}.jpg", k)
    meta = pd.DataFrame([{"lesion_id": les, "image_id": i, "dx": dx, "dx_type": "histo", "age": 80.0, "sex": "male",
                          "localization": "scalp", "dataset": ds} for les, i, dx, ds in HAM_ROWS])
    (base / "downloads").mkdir(parents=True, exist_ok=True)
    meta.drop(columns=[drop] if drop else []).to_csv(base / "downloads" / name, sep=sep, index=False)


# --------------------------------------------------------------------------------------------
# preparers

def test_sc9_official_split_and_short_names(tmp_path):
    make_sc9(tmp_path)
    m = prepare("sc9", tmp_path)
    assert len(m) == 7
    by_id = m.set_index("image_id")
    assert by_id.loc["ISIC_0000002", "class_name"] == "SK" and by_id.loc["ISIC_0000002", "label"] == 6
    assert by_id.loc["ISIC_0000005", "class_name"] == "SCC" and by_id.loc["ISIC_0000005", "split"] == "test"
    assert by_id.loc["ISIC_0025780", "path"] == f"sc9/{SC9_TREE}/Train/actinic keratosis/ISIC_0025780.jpg"
    assert sorted(m["split"].unique()) == ["test", "train"] and set(m["source"]) == {""}
    jpeg(tmp_path / "sc9" / SC9_TREE / "Train" / "ringworm" / "x.jpg")
    with pytest.raises(ManifestError, match=r"unknown class folders \['ringworm'\]"):
        prepare("sc9", tmp_path)


def test_isic2019_labels_sources_and_ids(tmp_path):
    make_isic2019(tmp_path)
    m = prepare("isic2019", tmp_path).set_index("image_id")
    assert len(m) == len(ISIC_ROWS) and set(m["split"]) == {""}
    assert m.loc["ISIC_0010003", ["class_name", "label", "source", "lesion_id"]].tolist() == ["NV", 1, "BCN", "BCN_0000003"]
    assert m.loc["ISIC_0020001", "source"] == "MSK" and m.loc["ISIC_0030000", ["class_name", "label"]].tolist() == ["SCC", 7]
    # the _downsampled file keeps its path but gets the plain ISIC id
    assert m.loc["ISIC_0000013", "path"] == "isic2019/ISIC_2019_Training_Input/ISIC_0000013_downsampled.jpg"
    assert m.loc["ISIC_0000013", "source"] == "" and m.loc["ISIC_0025030", "source"] == "HAM"


def test_isic2019_rejects_unk_rows_and_missing_images(tmp_path):
    make_isic2019(tmp_path)
    truth = tmp_path / "isic2019/downloads/ISIC_2019_Training_GroundTruth.csv"
    frame = pd.read_csv(truth)
    frame.loc[0, ["NV", "UNK"]] = [0.0, 1.0]
    frame.to_csv(truth, index=False)
    with pytest.raises(ManifestError, match=r"1 rows are not one-hot.*ISIC_0010000"):
        prepare("isic2019", tmp_path)
    make_isic2019(tmp_path / "b")
    (tmp_path / "b/isic2019/ISIC_2019_Training_Input/ISIC_0020004.jpg").unlink()
    with pytest.raises(ManifestError, match=r"1 of the \d+ files listed in .*GroundTruth\.csv are missing.*ISIC_0020004"):
        prepare("isic2019", tmp_path / "b")


@pytest.mark.parametrize("sep,name", [(",", "HAM10000_metadata.csv"), ("\t", "HAM10000_metadata.tab")])
def test_ham10000_sources_and_lesions(tmp_path, sep, name):
    make_ham(tmp_path, sep, name)
    m = prepare("ham10000", tmp_path).set_index("image_id")
    assert m.loc["ISIC_0025780", ["class_name", "label", "source", "lesion_id"]].tolist() == ["akiec", 0, "rosendahl", "HAM_0002730"]
    assert m.loc["ISIC_0027850", "path"] == "ham10000/ISIC_0027850.jpg"
    assert m.loc["ISIC_0025030", "path"] == "ham10000/HAM10000_images_part_1/ISIC_0025030.jpg"
    assert sorted(m["source"].unique()) == ["rosendahl", "vidir_modern", "vidir_molemax", "vienna_dias"]


def test_ham10000_without_subsource_column_is_a_clear_error(tmp_path):
    make_ham(tmp_path, drop="dataset")
    with pytest.raises(ManifestError, match=r"lacks columns \['dataset'\].*older release"):
        prepare("ham10000", tmp_path)


def _skin_manifests(tmp_path) -> tuple[Path, Path]:
    raw, manifests = tmp_path / "raw", tmp_path / "manifests"
    make_sc9(raw), make_isic2019(raw), make_ham(raw)
    for name in ("sc9", "isic2019", "ham10000"):
        write_manifest(manifests / f"{name}.csv", prepare(name, raw))
    return raw, manifests


def test_skin_real_classes_sources_dedupe_and_isic_split(tmp_path):
    raw, manifests = _skin_manifests(tmp_path)
    m = prepare("skin_real", raw, manifest_dir=manifests)
    assert list(dataset("skin_real").classes) == ["AK", "BCC", "DF", "MEL", "NV", "PBK", "VL"]
    # SK and SCC are gone (sc9 SK, sc9 SCC, isic SCC)
    assert not set(m["image_id"]) & {"ISIC_0000002", "ISIC_0000005", "ISIC_0030000"}
    # every ISIC id once: ISIC_0025780 stays with sc9 (not HAM), ISIC_0000013 with sc9 (not ISIC 2019),
    # the HAM images are not repeated by ISIC 2019
    assert not m["image_id"].duplicated().any()
    owner = m.set_index("image_id")["source"]
    assert owner["ISIC_0025780"] == "sc9" and owner["ISIC_0000013"] == "sc9"
    assert owner["ISIC_0025030"] == "ham10000" and owner["ISIC_0031633"] == "ham10000"
    assert m.groupby("source").size().to_dict() == {"sc9": 5, "ham10000": 3, "isic2019": 15}
    # renaming onto the common classes, original class kept
    row = m.set_index("image_id").loc["ISIC_0031633"]
    assert (row["class_name"], row["source_class"], row["label"]) == ("VL", "vasc", 6)
    assert m.set_index("image_id").loc["ISIC_0025030", "class_name"] == "PBK"
    # splits: sc9 official, ham none, isic 8:2 per class (10 NV -> 2 test, 5 MEL -> 1 test)
    isic = m[m["source"] == "isic2019"]
    assert isic[isic["split"] == "test"].groupby("class_name").size().to_dict() == {"MEL": 1, "NV": 2}
    assert set(m.loc[m["source"] == "ham10000", "split"]) == {""}
    assert m.set_index("image_id").loc["ISIC_0000004", "split"] == "test"
    # fixed seed: the same split every time
    again = prepare("skin_real", raw, manifest_dir=manifests)
    assert again["split"].tolist() == m["split"].tolist()


def test_skin_real_overlap_keeps_the_papers_duplicates(tmp_path):
    raw, manifests = _skin_manifests(tmp_path)
    m = prepare("skin_real_overlap", raw, manifest_dir=manifests)
    assert m.groupby("source").size().to_dict() == {"sc9": 5, "ham10000": 4, "isic2019": 18}
    assert m["image_id"].duplicated().sum() == 4  # 0025780 (sc9+ham), 0000013, 0025030, 0031633 (isic)


def test_skin_real_names_the_missing_manifest(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"skin_real is built from .*sc9\.csv: prepare .sc9. first"):
        prepare("skin_real", tmp_path / "raw", manifest_dir=tmp_path / "manifests")


def test_officehome_domains_and_real_world_folder(tmp_path):
    base = tmp_path / "officehome/OfficeHomeDataset_10072016"
    for k, (domain, cls) in enumerate([("Art", "Alarm_Clock"), ("Clipart", "TV"), ("Product", "Webcam"),
                                       ("Real World", "Table"), ("Real World", "Alarm_Clock")]):
        jpeg(base / domain / cls / f"{k:05d}.jpg", k)
    (base / "ImageInfo.csv").write_text("image_name,url\n")
    m = prepare("officehome", tmp_path)
    assert sorted(m["source"].unique()) == ["Art", "Clipart", "Product", "RealWorld"]
    assert m.set_index("class_name").loc["TV", "label"] == 58 and m.set_index("class_name").loc["Webcam", "label"] == 64
    assert m.loc[m["source"] == "RealWorld", "path"].str.contains("/Real World/").all()
    jpeg(base / "Art" / "Spaceship" / "x.jpg")
    with pytest.raises(ManifestError, match="Spaceship"):
        prepare("officehome", tmp_path)


def test_modern_office31_domains(tmp_path):
    base = tmp_path / "modern_office31/Modern-Office-31"
    for k, domain in enumerate(("amazon", "dslr", "synthetic", "webcam")):
        jpeg(base / domain / "back_pack" / f"frame_{k:04d}.jpg", k)
        jpeg(base / domain / "trash_can" / f"frame_{k:04d}.jpg", k)
    m = prepare("modern_office31", tmp_path)
    assert m.groupby("source").size().to_dict() == {"amazon": 2, "dslr": 2, "synthetic": 2, "webcam": 2}
    assert sorted(m["label"].unique()) == [0, 30]
    for f in (base / "webcam").rglob("*.jpg"):
        f.unlink()
    for d in sorted((base / "webcam").rglob("*"), reverse=True):
        d.rmdir()
    (base / "webcam").rmdir()
    with pytest.raises(FileNotFoundError, match="webcam"):
        prepare("modern_office31", tmp_path)


HK_TREE = [("lower-gi-tract", "anatomical-landmarks", "cecum", 2), ("lower-gi-tract", "pathological-findings",
            "ulcerative-colitis-grade-2-3", 1), ("upper-gi-tract", "pathological-findings", "barretts-short-segment", 1),
           ("upper-gi-tract", "anatomical-landmarks", "z-line", 1)]


def make_hyperkvasir(raw: Path) -> Path:
    root = raw / "hyperkvasir/labeled-images"
    rows = []
    for organ, category, finding, n in HK_TREE:
        for k in range(n):
            stem = hashlib.md5(f"{finding}{k}".encode()).hexdigest()
            jpeg(root / organ / category / finding / f"{stem}.jpg", k)
            rows.append({"Video file": stem, "Organ": "Lower GI" if organ.startswith("lower") else "Upper GI",
                         "Finding": finding, "Classification": category})
    pd.DataFrame(rows).to_csv(root / "image-labels.csv", index=False)
    return root


def test_hyperkvasir_findings_from_the_tree(tmp_path, caplog):
    root = make_hyperkvasir(tmp_path)
    m = prepare("hyperkvasir", tmp_path)
    assert len(dataset("hyperkvasir").classes) == 23
    assert m.groupby("class_name").size().to_dict() == {"barretts-short-segment": 1, "cecum": 2,
                                                        "ulcerative-colitis-grade-2-3": 1, "z-line": 1}
    row = m[m["class_name"] == "z-line"].iloc[0]
    assert (row["label"], row["organ"], row["category"]) == (22, "upper-gi-tract", "anatomical-landmarks")
    # the label table disagrees with the tree (an image lost in unpacking, or a finding spelled otherwise):
    # the labels still come from the folders, and the finding is named in a warning
    next((root / "lower-gi-tract/anatomical-landmarks/cecum").glob("*.jpg")).unlink()
    with caplog.at_level(logging.WARNING):
        m = prepare("hyperkvasir", tmp_path)
    assert m.groupby("class_name").size()["cecum"] == 1 and "'cecum': (2, 1)" in caplog.text


def test_bt_preparer_on_the_real_demo_mris(tmp_path):
    download.download_dataset(dataset("demo_bt"), tmp_path)
    m = prepare("demo_bt", tmp_path)
    assert len(m) == 17 and m["label"].nunique() == 4
    assert m.groupby("split")["label"].nunique().to_dict() == {"test": 4, "train": 4}
    assert set(m["class_name"]) == {"glioma_tumor", "meningioma_tumor", "no_tumor", "pituitary_tumor"}
    assert (tmp_path / m["path"].iloc[0]).is_file()


def test_registry_entries_are_complete():
    for name in ("sc9", "isic2019", "ham10000", "skin_real", "officehome", "modern_office31", "hyperkvasir"):
        spec = dataset(name)
        assert spec.layout and spec.used_by and (spec.sources or spec.depends_on), name
        assert spec.expected_files or spec.depends_on, name
        for source in spec.sources:
            assert source.note, (name, source.ref)  # says how the digest is established
    assert dataset("hyperkvasir").sources[0].sha256 == "c603449b1bc0be86948b11d9aea8b2002058a11e6f5499e2a384b9ae9c8dbd3f"
    assert {s.kind for s in dataset("ham10000").sources} == {"dataverse"}


# --------------------------------------------------------------------------------------------
# downloads against a local HTTP server

def fake_spec(*sources: Source, **kw) -> DatasetSpec:
    return DatasetSpec(name="fake", title="fake", classes=("a", "b"), sources=sources, layout="a/*.png and b/*.png",
                       prepare="class_folders", **kw)


ARCHIVE = zip_bytes({f"a/{i}.png": bytes(range(256)) * 40 for i in range(6)} | {"b/x.png": b"x" * 5000})


def test_resumable_download_continues_with_range(server, tmp_path):
    big = zip_bytes({"a/big.bin": np.random.default_rng(0).bytes(3 << 20), "a/0.png": b"x", "b/x.png": b"x"})
    server.files["/data.zip"] = big
    server.cut["/data.zip"] = (5 << 20) // 2  # the connection drops after 2.5 MiB
    spec = fake_spec(Source("url", server.url + "/data.zip", filename="data.zip", sha256=hashlib.sha256(big).hexdigest()))
    with pytest.raises(DownloadError, match=r"run `fedrepro download fake --raw-dir .*` again to resume from .*data\.zip\.part"):
        download.download_dataset(spec, tmp_path)
    part = tmp_path / "fake/downloads/data.zip.part"
    kept = part.stat().st_size  # whole 1 MiB blocks received before the cut
    assert kept == 2 << 20 and part.read_bytes() == big[:kept]
    download.download_dataset(spec, tmp_path)
    assert server.seen[-1]["range"] == f"bytes={kept}-"
    assert (tmp_path / "fake/downloads/data.zip").read_bytes() == big and not part.exists()
    assert (tmp_path / "fake/a/big.bin").stat().st_size == 3 << 20
    assert (tmp_path / "fake/.complete").exists()


def test_pinned_checksum_mismatch_names_the_file(server, tmp_path):
    server.files["/data.zip"] = ARCHIVE
    spec = fake_spec(Source("url", server.url + "/data.zip", filename="data.zip", sha256="0" * 64))
    with pytest.raises(ChecksumMismatch, match=r"checksum mismatch for .*fake/downloads/data\.zip: expected sha256 0{64}"):
        download.download_dataset(spec, tmp_path)
    assert not (tmp_path / "fake/.complete").exists()


def test_trust_on_first_use_records_then_enforces(server, tmp_path):
    server.files["/data.zip"] = ARCHIVE
    spec = fake_spec(Source("url", server.url + "/data.zip", filename="data.zip"))
    download.download_dataset(spec, tmp_path)
    sums = (tmp_path / "fake/SHA256SUMS").read_text()
    assert sums == f"{hashlib.sha256(ARCHIVE).hexdigest()}  data.zip\n"
    # a different archive placed by hand later is refused, naming the file and the record
    (tmp_path / "fake/.complete").unlink()
    (tmp_path / "fake/downloads/data.zip").write_bytes(zip_bytes({"a/1.txt": b"other"}))
    with pytest.raises(ChecksumMismatch, match=r"data\.zip.*recorded on first use in .*SHA256SUMS"):
        download.download_dataset(spec, tmp_path)


def test_a_damaged_download_is_set_aside_not_recorded_and_fetched_again(server, tmp_path):
    """The server sends a zip whose member is damaged: nothing recorded, nothing unpacked, the file kept as
    <name>.broken (not deleted); the next run downloads it again and accepts the good one."""
    from fedrepro.data.download import BrokenArchive

    damaged = bytearray(ARCHIVE)
    damaged[60] ^= 0xFF                                      # inside the first member's data: its CRC fails
    server.files["/data.zip"] = bytes(damaged)
    spec = fake_spec(Source("url", server.url + "/data.zip", filename="data.zip"))
    with pytest.raises(BrokenArchive, match=r"data\.zip\.broken is not whole: member 'a/0\.png' cannot be read.*"
                                            r"download it again"):
        download.download_dataset(spec, tmp_path)
    base = tmp_path / "fake"
    assert (base / "downloads/data.zip.broken").read_bytes() == bytes(damaged) and not (base / "downloads/data.zip").exists()
    assert not (base / "SHA256SUMS").exists() and not (base / "a").exists() and not (base / ".complete").exists()
    server.files["/data.zip"] = ARCHIVE
    download.download_dataset(spec, tmp_path)
    assert (base / ".complete").exists() and hashlib.sha256(ARCHIVE).hexdigest() in (base / "SHA256SUMS").read_text()


def test_web_page_instead_of_archive_is_not_recorded(server, tmp_path):
    server.files["/uc"] = b"<!DOCTYPE html><html><body>Google Drive can't scan this file for viruses</body></html>"
    spec = fake_spec(Source("url", server.url + "/uc", filename="OfficeHome.zip"), homepage="https://example.org/oh")
    with pytest.raises(ManualStepRequired, match=r"sent a web page instead of the archive OfficeHome\.zip") as err:
        download.download_dataset(spec, tmp_path)
    assert "fake/downloads" in str(err.value) and "https://example.org/oh" in str(err.value)
    assert not (tmp_path / "fake/SHA256SUMS").exists() and not (tmp_path / "fake/downloads/OfficeHome.zip").exists()


def kaggle_env(tmp_path) -> dict:
    return {"KAGGLE_CONFIG_DIR": str(tmp_path / "no-kaggle-here")}


def test_missing_kaggle_token_gives_placement_instructions(tmp_path):
    spec = dataset("sc9")
    with pytest.raises(ManualStepRequired) as err:
        download.download_dataset(spec, tmp_path, env=kaggle_env(tmp_path))
    text = str(err.value)
    assert "no Kaggle API token" in text and "kaggle.json" in text
    assert f"put skin-cancer9-classesisic.zip into {tmp_path / 'sc9/downloads'}/" in text
    assert "**/Train" in text  # what a manual placement must contain
    # ... and a placement by hand is then accepted without any token
    make_sc9(tmp_path)
    download.download_dataset(spec, tmp_path, env=kaggle_env(tmp_path))
    assert (tmp_path / "sc9/.complete").exists()


def test_kaggle_secret_never_leaks(server, tmp_path, monkeypatch, caplog):
    secret = "s3cr3t-kaggle-key-0123456789"
    server.denied.add("/api/v1/datasets/download/nodoubttome/skin-cancer9-classesisic")
    monkeypatch.setattr(download.transfer, "KAGGLE_API", server.url + "/api/v1")
    caplog.set_level(logging.DEBUG)
    env = {"KAGGLE_USERNAME": "someone", "KAGGLE_KEY": secret}
    with pytest.raises(ManualStepRequired, match="Kaggle refused the download") as err:
        download.download_dataset(dataset("sc9"), tmp_path, env=env)
    assert server.seen[-1]["auth"].startswith("Basic ")  # the token was used ...
    assert secret not in str(err.value) and secret not in caplog.text  # ... and shown nowhere
    assert secret not in repr(download.kaggle_credentials(env))
    assert not any(secret in p.read_text(errors="ignore") for p in tmp_path.rglob("*") if p.is_file())
    # the standard token file is read too
    (tmp_path / "kg").mkdir()
    (tmp_path / "kg/kaggle.json").write_text(json.dumps({"username": "u", "key": secret}))
    assert download.kaggle_credentials({"KAGGLE_CONFIG_DIR": str(tmp_path / "kg")}).secret == secret


def dataverse_listing(files: dict[str, bytes], tabular: set[str] = frozenset(), md5: dict | None = None) -> dict:
    data = []
    for i, (name, content) in enumerate(files.items()):
        record = {"id": 1000 + i, "filename": name, "contentType": "application/zip",
                  "checksum": {"type": "MD5", "value": (md5 or {}).get(name, hashlib.md5(content).hexdigest())}}
        if name in tabular:  # Dataverse ingests CSV into .tab and keeps the original name
            record |= {"filename": Path(name).stem + ".tab", "originalFileName": name, "tabularData": True}
        data.append({"label": record["filename"], "dataFile": record})
    return {"status": "OK", "data": data}


def serve_dataverse(server, files, **kw) -> str:
    server.json["/api/datasets/:persistentId/versions/:latest-published/files"] = dataverse_listing(files, **kw)
    for i, content in enumerate(files.values()):
        server.files[f"/api/access/datafile/{1000 + i}"] = content
    return f"{server.url}/dataset.xhtml?persistentId=doi:10.7910/DVN/DBW86T"


def test_dataverse_files_by_name_with_published_md5(server, tmp_path):
    part1 = zip_bytes({"ISIC_0024306.jpg": b"jpeg1"})
    part2 = zip_bytes({"ISIC_0034320.jpg": b"jpeg2"})
    meta = (b"lesion_id,image_id,dx,dx_type,age,sex,localization,dataset\n"
            b"HAM_1,ISIC_0024306,nv,histo,50,male,back,rosendahl\nHAM_2,ISIC_0034320,mel,histo,60,female,back,rosendahl\n")
    page = serve_dataverse(server, {"HAM10000_images_part_1.zip": part1, "HAM10000_images_part_2.zip": part2,
                                    "HAM10000_metadata": meta}, tabular={"HAM10000_metadata"})
    # the registered HAM10000 sources, pointed at the local server
    spec = dataclasses.replace(dataset("ham10000"), sources=tuple(
        dataclasses.replace(s, ref=page) for s in dataset("ham10000").sources))
    download.download_dataset(spec, tmp_path)
    base = tmp_path / "ham10000"
    assert (base / "ISIC_0024306.jpg").read_bytes() == b"jpeg1" and (base / "ISIC_0034320.jpg").exists()
    assert (base / "downloads/HAM10000_metadata.csv").read_bytes() == meta
    # the ingested table was fetched in its original format
    assert any(s["path"] == "/api/access/datafile/1002?format=original" for s in server.seen)
    assert "HAM10000_metadata.csv" in (base / "SHA256SUMS").read_text()


def test_dataverse_published_checksum_mismatch(server, tmp_path):
    page = serve_dataverse(server, {"part.zip": ARCHIVE}, md5={"part.zip": "f" * 32})
    spec = fake_spec(Source("dataverse", page, filename="part.zip"))
    with pytest.raises(ChecksumMismatch, match=r"part\.zip: expected md5 f{32} \(published by the Dataverse server\)"):
        download.download_dataset(spec, tmp_path)
    assert not (tmp_path / "fake/downloads/part.zip").exists()  # not kept as a "first use"
    missing = fake_spec(Source("dataverse", page, filename="other.zip"))
    with pytest.raises(DownloadError, match=r"0 files matching 'other\.zip'.*\['part\.zip'\]"):
        download.download_dataset(missing, tmp_path / "m")


def test_manual_source_and_placement_by_hand(tmp_path):
    spec = dataset("modern_office31")
    with pytest.raises(ManualStepRequired, match=r"no stable direct link(.|\n)*from: https://gitlab.com/tringwald/adaptiope"):
        download.download_dataset(spec, tmp_path)
    for domain in ("amazon", "dslr", "synthetic", "webcam"):
        jpeg(tmp_path / "modern_office31/Modern-Office-31" / domain / "mug" / "frame_0001.jpg")
    download.download_dataset(spec, tmp_path)
    assert (tmp_path / "modern_office31/.complete").exists()


@pytest.mark.parametrize("member", ["../evil.txt", "a/../../evil.txt", "/tmp/evil-abs.txt"])
def test_path_traversal_in_archives_is_refused(tmp_path, member):
    archive = tmp_path / "downloads/bad.zip"
    archive.parent.mkdir()
    archive.write_bytes(zip_bytes({"a/ok.txt": b"ok", member: b"pwned"}))
    with pytest.raises(DownloadError, match="would be written outside"):
        download.extract(archive, tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out").exists()
    # through the whole download path too (an archive placed by hand)
    spec = fake_spec(Source("url", "http://127.0.0.1:9/never", filename="bad.zip"))
    (tmp_path / "raw/fake/downloads").mkdir(parents=True)
    (tmp_path / "raw/fake/downloads/bad.zip").write_bytes(archive.read_bytes())
    with pytest.raises(DownloadError, match="would be written outside"):
        download.download_dataset(spec, tmp_path / "raw")
    assert not (tmp_path / "raw/evil.txt").exists() and not (tmp_path / "raw/fake/.complete").exists()


def test_path_traversal_in_tar_archives_is_refused(tmp_path):
    import tarfile

    archive = tmp_path / "bad.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for name in ("a/ok.txt", "../evil.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tf.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(DownloadError, match="would be written outside"):
        download.extract(archive, tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists()


def test_isic_download_end_to_end_then_prepare(server, tmp_path, monkeypatch):
    """The registered ISIC 2019 sources (zip + two CSVs) fetched from a fake mirror, then prepared."""
    make_isic2019(tmp_path / "src")
    src = tmp_path / "src/isic2019"
    images = {f"ISIC_2019_Training_Input/{p.name}": p.read_bytes() for p in (src / "ISIC_2019_Training_Input").iterdir()}
    spec = dataset("isic2019")
    mirrored = []
    for s in spec.sources:
        server.files[f"/2019/{s.filename}"] = zip_bytes(images) if s.extract else (src / "downloads" / s.filename).read_bytes()
        mirrored.append(dataclasses.replace(s, ref=f"{server.url}/2019/{s.filename}"))
    local = dataclasses.replace(spec, sources=tuple(mirrored))
    download.download_dataset(local, tmp_path / "raw")
    m = validate_manifest(prepare_dataset(local, tmp_path / "raw"), spec.classes)
    assert len(m) == len(ISIC_ROWS) and np.array_equal(np.sort(m["label"].unique()), [0, 1, 4, 6, 7])
