"""Download verification and credential handling of the core downloader (no network needed)."""

import json
import zipfile

import pytest

from fedrepro.data.download import (
    ChecksumMismatch,
    DownloadError,
    ManualStepRequired,
    download_dataset,
    extract,
    kaggle_credentials,
    verify_archive,
)
from fedrepro.data.spec import DatasetSpec, Source
from fedrepro.io import sha256_file


def archive(path, files: dict[str, bytes]):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def spec_with(source: Source) -> DatasetSpec:
    return DatasetSpec(name="toy", title="toy", classes=("a",), sources=(source,), layout="Training/a/*.png",
                       prepare="class_folders", access="account", expected_files=("Training",))


def test_pinned_checksum_mismatch_names_the_file(tmp_path):
    dataset_dir = tmp_path / "toy"
    zipped = archive(dataset_dir / "downloads" / "toy.zip", {"Training/a/1.png": b"x"})
    source = Source("kaggle_dataset", "me/toy", filename="toy.zip", sha256="0" * 64)
    with pytest.raises(ChecksumMismatch, match=r"checksum mismatch for .*toy\.zip: expected sha256 0{64}"):
        verify_archive(zipped, source, dataset_dir)
    # the same error stops the whole download, before anything is unpacked
    with pytest.raises(ChecksumMismatch):
        download_dataset(spec_with(source), tmp_path)
    assert not (dataset_dir / "Training").exists() and not (dataset_dir / ".complete").exists()


def test_trust_on_first_use_then_verified(tmp_path):
    dataset_dir = tmp_path / "toy"
    zipped = archive(dataset_dir / "downloads" / "toy.zip", {"Training/a/1.png": b"x"})
    source = Source("kaggle_dataset", "me/toy", filename="toy.zip")
    digest = verify_archive(zipped, source, dataset_dir)
    assert digest == sha256_file(zipped) and digest in (dataset_dir / "SHA256SUMS").read_text()
    archive(zipped, {"Training/a/1.png": b"tampered"})
    with pytest.raises(ChecksumMismatch, match="recorded on first use"):
        verify_archive(zipped, source, dataset_dir)


def test_placed_archive_is_verified_and_unpacked(tmp_path):
    dataset_dir = tmp_path / "toy"
    zipped = archive(dataset_dir / "downloads" / "toy.zip", {"Training/a/1.png": b"x"})
    source = Source("kaggle_dataset", "me/toy", filename="toy.zip", sha256=sha256_file(zipped))
    download_dataset(spec_with(source), tmp_path, env={})
    assert (dataset_dir / "Training/a/1.png").read_bytes() == b"x" and (dataset_dir / ".complete").exists()


def test_missing_kaggle_token_explains_and_keeps_secrets_out(tmp_path):
    source = Source("kaggle_dataset", "me/toy", filename="toy.zip")
    with pytest.raises(ManualStepRequired) as info:
        download_dataset(spec_with(source), tmp_path, env={"HOME": str(tmp_path)})
    message = str(info.value)
    assert "KAGGLE_USERNAME" in message and str(tmp_path / "toy" / "downloads") in message and "Training/a" in message
    # a token that exists is read, but never printed
    creds = kaggle_credentials({"KAGGLE_USERNAME": "ann", "KAGGLE_KEY": "s3cr3t-key"})
    assert creds.secret == "s3cr3t-key" and "s3cr3t-key" not in repr(creds)
    (tmp_path / ".kaggle").mkdir()
    (tmp_path / ".kaggle" / "kaggle.json").write_text(json.dumps({"username": "bob", "key": "other-secret"}))
    assert kaggle_credentials({}, home=tmp_path).username == "bob"


def test_archive_member_outside_the_folder_is_refused(tmp_path):
    bad = archive(tmp_path / "bad.zip", {"../escape.txt": b"x"})
    with pytest.raises(DownloadError, match="outside"):
        extract(bad, tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()
