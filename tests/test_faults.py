"""Faults and bad input: unreadable images are named (or skipped and listed when the config allows it),
and a job that dies part-way never leaves outputs that look complete."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image

from infra_support import with_rounds

BT_CLASSES = ("glioma_tumor", "meningioma_tumor", "no_tumor", "pituitary_tumor")


def write_image(path: Path, shade: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (24, 24), (shade, 255 - shade, 128)).save(path)


def bad_images(root: Path) -> dict[str, str]:
    """Three kinds of unreadable file, in the Kaggle BT layout -> {relative path: what is wrong}."""
    truncated = root / "demo_bt/Training/glioma_tumor/truncated.jpg"
    write_image(truncated, 10)
    truncated.write_bytes(truncated.read_bytes()[:60])
    empty = root / "demo_bt/Testing/no_tumor/empty.png"
    empty.parent.mkdir(parents=True, exist_ok=True)
    empty.write_bytes(b"")
    text = root / "demo_bt/Training/pituitary_tumor/notes.jpg"
    text.write_text("not an image\n")
    return {str(p.relative_to(root)): kind for p, kind in ((truncated, "truncated"), (empty, "empty"), (text, "text"))}


@pytest.fixture
def raw_with_corrupt(tmp_path):
    """A raw demo_bt folder: 8 good images (one per class and split) and 3 unreadable ones."""
    raw = tmp_path / "raw"
    for i, cls in enumerate(BT_CLASSES):
        write_image(raw / f"demo_bt/Training/{cls}/ok_{i}.jpg", 40 * i)
        write_image(raw / f"demo_bt/Testing/{cls}/ok_{i}.jpg", 40 * i + 20)
    return raw, bad_images(raw)


def prepare(raw: Path, out: Path, mode: str) -> None:
    from fedrepro.cli import main

    main(["prepare", "demo_bt", "--raw-dir", str(raw), "--out", str(out), "--corrupt", mode])


def test_prepare_stops_on_unreadable_images_and_names_each(raw_with_corrupt, tmp_path):
    raw, bad = raw_with_corrupt
    out = tmp_path / "manifests/demo_bt.csv"
    with pytest.raises(SystemExit) as stop:
        prepare(raw, out, "error")
    message = str(stop.value.code)
    assert message.startswith("3 unreadable image(s) in demo_bt")
    for rel in bad:
        assert rel in message
    assert "data.corrupt_images: skip" in message        # says how to go on
    assert not out.exists() and not out.with_suffix(".skipped.csv").exists()   # nothing half-made


def test_prepare_skips_unreadable_images_and_lists_them(raw_with_corrupt, tmp_path):
    raw, bad = raw_with_corrupt
    out = tmp_path / "manifests/demo_bt.csv"
    prepare(raw, out, "skip")
    manifest = pd.read_csv(out, keep_default_na=False)
    assert len(manifest) == 8
    assert not set(manifest["path"]) & set(bad)
    assert sorted(manifest["class_name"].unique()) == sorted(BT_CLASSES)
    report = pd.read_csv(tmp_path / "manifests/demo_bt.skipped.csv")
    assert sorted(report["path"]) == sorted(bad)
    assert report["reason"].str.len().gt(0).all()


def test_prepare_with_no_unreadable_image_writes_an_empty_report(raw_with_corrupt, tmp_path):
    raw, bad = raw_with_corrupt
    for rel in bad:
        (raw / rel).unlink()
    out = tmp_path / "manifests/demo_bt.csv"
    prepare(raw, out, "error")
    assert len(pd.read_csv(out)) == 8
    assert pd.read_csv(out.with_suffix(".skipped.csv")).empty


def test_unreadable_image_at_load_time_names_the_file(raw_with_corrupt):
    from fedrepro.data.images import CorruptImageError, ManifestImages, load_rgb

    raw, bad = raw_with_corrupt
    for rel in bad:
        with pytest.raises(CorruptImageError) as error:
            load_rgb(raw / rel)
        assert str(raw / rel) in str(error.value)
        assert error.value.path == raw / rel
    missing = raw / "demo_bt/Training/glioma_tumor/gone.jpg"
    with pytest.raises(CorruptImageError, match="file not found"):
        load_rgb(missing)
    dataset = ManifestImages(raw, [next(iter(bad))], [0], [0], transform=lambda im: im)
    with pytest.raises(CorruptImageError, match="truncated.jpg"):
        dataset[0]


def test_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    from fedrepro.io import atomic_path, write_text

    target = tmp_path / "out/metrics.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text('{"partial": ')
            raise RuntimeError("killed mid-write")
    assert not target.exists()
    write_text(target, "complete\n")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert target.read_text() == "complete\n"
    assert [p.name for p in target.parent.iterdir()] == ["metrics.json"]


# --------------------------------------------------------------------------------------------
# jobs that die part-way, on the tiny grid's real inputs

def test_crash_after_the_last_round_leaves_no_metrics_and_the_rerun_completes(tiny_inputs, monkeypatch):
    import fedrepro.train as train

    workdir, run_cfg = tiny_inputs
    monkeypatch.chdir(workdir)
    run_cfg = with_rounds(run_cfg, 3)
    real_manifest = train.run_manifest

    def dies(*args, **kwargs):
        raise RuntimeError("node lost while writing outputs")

    monkeypatch.setattr(train, "run_manifest", dies)
    with pytest.raises(RuntimeError, match="node lost"):
        train.train_run(run_cfg, "late/out", "late/ckpt")
    assert not Path("late/out/metrics.json").exists()   # its presence is what marks a run complete
    assert torch.load("late/ckpt/resume.pt", weights_only=False)["next_round"] == 3

    monkeypatch.setattr(train, "run_manifest", real_manifest)
    summary = train.train_run(run_cfg, "late/out", "late/ckpt")
    metrics = json.loads(Path("late/out/metrics.json").read_text())
    assert metrics["rounds"] == summary["rounds"] == 3
    assert metrics["run"]["config_hash"] == run_cfg["config_hash"]
    assert json.loads(Path("late/out/run_manifest.json").read_text())["resumed_from_round"] == 3  # no round redone
    assert not Path("late/ckpt/resume.pt").exists()


def test_crash_inside_a_round_keeps_the_previous_checkpoint(tiny_inputs, monkeypatch):
    from fedrepro.fl.method import ModelAveraging
    from fedrepro.train import train_run

    workdir, run_cfg = tiny_inputs
    monkeypatch.chdir(workdir)
    real_aggregate = ModelAveraging.aggregate

    def aggregate(self, updates, rnd):
        if rnd == 2:
            raise MemoryError("out of memory in round 3")
        return real_aggregate(self, updates, rnd)

    monkeypatch.setattr(ModelAveraging, "aggregate", aggregate)
    with pytest.raises(MemoryError):
        train_run(with_rounds(run_cfg, 4), "mid/out", "mid/ckpt")
    assert not Path("mid/out/metrics.json").exists()
    state = torch.load("mid/ckpt/resume.pt", weights_only=False)
    assert state["next_round"] == 2 and len(state["history"]) == 2
    assert not [p for p in Path("mid/ckpt").iterdir() if p.name != "resume.pt"]   # no temporary left


def test_feature_cache_stops_at_an_unreadable_image_and_writes_nothing(tiny_inputs, tmp_path):
    from fedrepro.data.images import CorruptImageError
    from fedrepro.features import build_feature_cache

    workdir, run_cfg = tiny_inputs
    raw = workdir / run_cfg["paths"]["raw_dir"]
    manifest = pd.read_csv(workdir / run_cfg["paths"]["manifest"], keep_default_na=False).head(3)
    broken = raw / "demo_bt/Training/broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    manifest.loc[1, "path"] = "demo_bt/Training/broken.jpg"
    manifest.to_csv(tmp_path / "m.csv", index=False)
    out = tmp_path / "features.pt"
    with pytest.raises(CorruptImageError, match="broken.jpg"):
        build_feature_cache(tmp_path / "m.csv", raw, list(BT_CLASSES), run_cfg["features"]["encoder"], out,
                            torch.device("cpu"))
    assert not out.exists()
