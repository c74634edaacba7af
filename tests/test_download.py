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
    return DatasetSpec(name="toy", title="toy", classes=("a",), sources=(source,), layout="train/a/*.png",
                       prepare="class_folders", access="account", expected_files=("train",))


def test_pinned_checksum_mismatch_names_the_file(tmp_path):
    dataset_dir = tmp_path / "toy"
    zipped = archive(dataset_dir / "downloads" / "toy.zip", {"train/a/1.png": b"x"})
    source = Source("kaggle_dataset", "me/toy", filename="toy.zip", sha256="0" * 64)
    with pytest.raises(ChecksumMismatch, match=r"checksum mismatch for .*toy\.zip: expected sha256 0{64}"):
        verify_archive(zipped, source, dataset_dir)
    # the same error stops the whole download, before anything is unpacked
    with pytest.raises(ChecksumMismatch):
        download_dataset(spec_with(source), tmp_path)
    assert not (dataset_dir / "train").exists() and not (dataset_dir / ".complete").exists()


def test_trust_on_first_use_then_verified(tmp_path):
    dataset_dir = tmp_path / "toy"
    zipped = archive(dataset_dir / "downloads" / "toy.zip", {"train/a/1.png": b"x"})
    source = Source("kaggle_dataset", "me/toy", filename="toy.zip")
    digest = verify_archive(zipped, source, dataset_dir)
    assert digest == sha256_file(zipped) and digest in (dataset_dir / "SHA256SUMS").read_text()
    archive(zipped, {"train/a/1.png": b"tampered"})
    with pytest.raises(ChecksumMismatch, match="recorded on first use"):
        verify_archive(zipped, source, dataset_dir)


def test_placed_archive_is_verified_and_unpacked(tmp_path):
    dataset_dir = tmp_path / "toy"
    zipped = archive(dataset_dir / "downloads" / "toy.zip", {"train/a/1.png": b"x"})
    source = Source("kaggle_dataset", "me/toy", filename="toy.zip", sha256=sha256_file(zipped))
    download_dataset(spec_with(source), tmp_path, env={})
    assert (dataset_dir / "train/a/1.png").read_bytes() == b"x" and (dataset_dir / ".complete").exists()


def test_missing_kaggle_token_explains_and_keeps_secrets_out(tmp_path):
    source = Source("kaggle_dataset", "me/toy", filename="toy.zip")
    with pytest.raises(ManualStepRequired) as info:
        download_dataset(spec_with(source), tmp_path, env={"HOME": str(tmp_path)})
    message = str(info.value)
    assert "KAGGLE_USERNAME" in message and str(tmp_path / "toy" / "downloads") in message and "train/a" in message
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


def tar_bytes(members: dict[str, bytes], mode: str = "w") -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_tar_and_compressed_files_are_checked_whole_before_a_digest_is_recorded(tmp_path):
    """A tar cut after a member (no end-of-archive marker), a .tar.gz without its gzip trailer, a cut .csv.gz:
    each refused naming the file, nothing recorded; the whole file is then recorded."""
    import gzip

    from fedrepro.data.download import BrokenArchive, archive_problem, recorded_checksums

    members = {f"train/a/{i}.png": bytes([i]) * 3000 for i in range(3)}
    plain, packed = tar_bytes(members), tar_bytes(members, "w:gz")
    table = gzip.compress(b"id,label\n" + b"x,1\n" * 2000)
    cases = [("data.tar", plain, plain[:3584], "end-of-archive marker", True),     # header 512 + 3072: one member
             ("data.tar.gz", packed, packed[:-6], "EOFError", True),
             ("labels.csv.gz", table, table[: len(table) // 2], "compressed data", False)]
    for filename, whole, cut, why, unpack in cases:
        dataset_dir = tmp_path / filename.replace(".", "_") / "toy"
        source = Source("url", f"http://example.org/{filename}", filename=filename, extract=unpack)
        path = dataset_dir / "downloads" / filename
        path.parent.mkdir(parents=True)
        path.write_bytes(cut)
        assert why in archive_problem(path, unpack, progress=False)
        with pytest.raises(BrokenArchive, match=rf"{filename} is not whole: .*{why}.*Nothing was recorded"):
            verify_archive(path, source, dataset_dir)
        assert recorded_checksums(dataset_dir) == {}
        path.write_bytes(whole)
        assert archive_problem(path, unpack, progress=False) is None
        assert recorded_checksums(dataset_dir) == {} and verify_archive(path, source, dataset_dir) == sha256_file(path)
        assert recorded_checksums(dataset_dir) == {filename: sha256_file(path)}
    # a whole tar unpacks
    dataset_dir = tmp_path / "data_tar" / "toy"
    download_dataset(spec_with(Source("url", "http://example.org/data.tar", filename="data.tar")), dataset_dir.parent)
    assert (dataset_dir / "train/a/2.png").read_bytes() == bytes([2]) * 3000
