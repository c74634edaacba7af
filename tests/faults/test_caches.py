"""Issue 25, case 5: broken caches, splits, manifests and checkpoints name the file and the command that rebuilds it
(and are set aside, so the next Snakemake run rebuilds them) instead of raw library errors; a corrupt resume.pt is
set aside and the run starts again; a full disk says where and how much. On the tiny grid's real inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def truncate(path: str | Path, keep: float = 0.5) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: int(len(data) * keep)])


def assert_set_aside_and_named(error, path: str | Path) -> None:
    """The message names the file and the command that makes it again; the file is kept under another name, so
    Snakemake sees it missing and rebuilds it on its next run."""
    message = str(error.value)
    assert str(path) in message and f"snakemake --cores all {path}" in message, message
    assert not Path(path).exists() and Path(f"{path}.broken").exists()


def test_a_truncated_image_cache_or_index_names_the_file(tiny):
    from fedrepro.data.decode import DecodeSpec
    from fedrepro.data.image_cache import ImageCache, build_image_cache, cache_paths
    from fedrepro.io import BrokenFile, sha256_file

    manifest, raw = tiny["paths"]["manifest"], tiny["paths"]["raw_dir"]
    pixels, index = cache_paths("resources/images/demo_bt/square16-bilinear.u8")
    build_image_cache(manifest, raw, DecodeSpec.from_key("square16-bilinear"), pixels)
    assert ImageCache(pixels, sha256_file(manifest)).array(3).shape == (16, 16, 3)
    truncate(pixels)
    with pytest.raises(BrokenFile, match=r"bytes but its index .* says \d+ \(17 images\): truncated") as error:
        ImageCache(pixels, sha256_file(manifest))
    assert_set_aside_and_named(error, pixels)

    build_image_cache(manifest, raw, DecodeSpec.from_key("square16-bilinear"), pixels)
    truncate(index)
    with pytest.raises(BrokenFile, match=r"not a readable image-cache index") as error:
        ImageCache(pixels, sha256_file(manifest))
    assert str(pixels) in str(error.value) and Path(f"{index}.broken").exists() and not index.exists()


@pytest.mark.parametrize("which", ["features", "split", "manifest"])
def test_a_truncated_feature_cache_split_or_manifest_stops_the_job_by_name(tiny, which):
    from fedrepro.io import BrokenFile
    from fedrepro.train import train_run

    broken = tiny["paths"][which]
    truncate(broken)
    with pytest.raises(BrokenFile) as error:
        train_run(tiny, "out", "ckpt")
    assert_set_aside_and_named(error, broken)
    assert not Path("out/metrics.json").exists()


def test_a_corrupt_resume_checkpoint_is_set_aside_and_the_run_starts_again(tiny, caplog):
    from fedrepro.train import train_run

    expected = train_run(tiny, "clean/out", "clean/ckpt")
    Path("ckpt").mkdir()
    Path("ckpt/resume.pt").write_bytes(b"PK\x03\x04 cut off by a full disk")
    summary = train_run(tiny, "out", "ckpt")
    same = json.dumps(summary["eval"], sort_keys=True) == json.dumps(expected["eval"], sort_keys=True)
    assert same                                                             # from round 1: the same numbers
    assert json.loads(Path("out/run_manifest.json").read_text())["resumed_from_round"] is None
    assert Path("ckpt/resume.pt.corrupt").read_bytes().startswith(b"PK")   # kept for a look
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "resume.pt" in r.getMessage()]
    assert warned and "set aside as ckpt/resume.pt.corrupt" in warned[0] and "starts again" in warned[0]


def test_a_full_disk_names_the_folder_and_the_space_needed(tiny, monkeypatch):
    """resume.pt goes to a file that answers every write with ENOSPC (/dev/full), as a full disk does."""
    import tempfile

    from fedrepro.io import DiskFull
    from fedrepro.train import train_run

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    mkstemp = tempfile.mkstemp

    def full_disk(prefix="", suffix="", dir=None):
        fd, name = mkstemp(prefix=prefix, suffix=suffix, dir=dir)
        if prefix.startswith(".resume.pt."):
            os.unlink(name)
            os.symlink("/dev/full", name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", full_disk)
    with pytest.raises(DiskFull, match=r"no space left on ckpt \(writing resume.pt\), needs ~\d+ MB"):
        train_run(tiny, "out", "ckpt")
    assert not list(Path("ckpt").glob(".resume.pt.*"))                    # no temporary left behind


def test_a_disk_that_fills_while_torch_writes_names_the_folder_not_torch(tiny, monkeypatch):
    """A real disk accepts the first bytes of resume.pt and then refuses (ENOSPC) in the middle of a tensor: torch
    ends with its own "[enforce fail at inline_container.cc] unexpected pos ..." on close, naming no file. The
    job still says where and how much."""
    import errno
    import io

    from fedrepro import io as fio
    from fedrepro.io import DiskFull
    from fedrepro.train import train_run

    class FillingDisk(io.FileIO):
        room = 10_000                                           # bytes left on the file system: past the headers

        def write(self, data):
            if len(data) > self.room:
                written = super().write(memoryview(data)[:self.room]) if self.room else 0
                self.room -= written
                if not written:
                    raise OSError(errno.ENOSPC, "No space left on device")
                return written
            self.room -= len(data)
            return super().write(data)

    def filling_open(file, mode="r", *args, **kwargs):
        if "w" in mode and Path(file).name.startswith(".resume.pt."):
            return io.BufferedWriter(FillingDisk(file, "w"))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(fio, "open", filling_open, raising=False)
    with pytest.raises(DiskFull, match=r"no space left on ckpt \(writing resume.pt\), needs ~\d+ MB"):
        train_run(tiny, "out", "ckpt")
    assert not list(Path("ckpt").glob(".resume.pt.*"))
