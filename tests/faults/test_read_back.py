"""Issue 32, item 6: what a run reads back is checked against a digest recorded when it was written, so a byte
changed on disk since (same size: nothing else notices) is caught and never used. A damaged resume.pt or
per-client state file is set aside and the run starts over (the same numbers as an uninterrupted run); a damaged
feature cache, split, image cache or model.pt is set aside and named with the command that rebuilds it. And a
feature cache built again from the same inputs has the same bytes whatever the job's cores. On the tiny grid's
real inputs."""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import pytest
import torch

from infra_support import with_rounds


class Stop(Exception):
    """Stands for the job being killed."""


def flip(path: str | Path, count: int = 64, member: str | None = None) -> None:
    """Invert ``count`` bytes in the middle of a file's largest archive member (or of the whole file): the size
    stays, as a bad disk block or a bit rot leaves it."""
    path = Path(path)
    data = bytearray(path.read_bytes())
    start, size = 0, len(data)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            info = max(archive.infolist(), key=lambda i: i.file_size) if member is None else archive.getinfo(member)
        header = data[info.header_offset:info.header_offset + 30]
        start = info.header_offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
        size = info.compress_size
    middle = start + max(0, size // 2 - count // 2)
    for i in range(middle, min(middle + count, start + size)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def killed_after(run: dict, out: str, ckpt: str, rounds: int, monkeypatch) -> None:
    """``train_run`` stopped right after round ``rounds`` was checkpointed, as a killed job stops."""
    from fedrepro.fl import engine
    from fedrepro.train import train_run

    save = engine.torch_save

    def save_then_stop(path, obj):
        save(path, obj)
        if obj.get("next_round") == rounds:
            raise Stop

    with monkeypatch.context() as patch:
        patch.setattr(engine, "torch_save", save_then_stop)
        with pytest.raises(Stop):
            train_run(run, out, ckpt)


def persistent(run: dict) -> dict:
    """The run with every client's Adam state in its own file between turns."""
    from fedrepro.io import hash_obj

    out = {**run, "train": {**run["train"], "client_state": "disk",
                            "optimizer": {**run["train"]["optimizer"], "persist": True}}}
    out.pop("config_hash")
    out["config_hash"] = hash_obj(out)
    return out


@pytest.mark.parametrize("damaged", ["resume.pt", "client state"])
def test_a_checkpoint_with_flipped_bytes_is_set_aside_and_the_run_starts_over(tiny, damaged, monkeypatch, caplog):
    """Before: 64 flipped bytes in resume.pt (or in a client's Adam state that it names) resumed without a word
    and ended with other numbers."""
    from fedrepro.train import train_run

    run = persistent(with_rounds(tiny, 4))
    expected = train_run(run, "full/out", "full/ckpt")
    killed_after(run, "out", "ckpt", 2, monkeypatch)
    if damaged == "resume.pt":
        target = Path("ckpt/resume.pt")
    else:                                         # a file resume.pt names (older ones may still be there)
        from fedrepro import paths
        from fedrepro.fl.client_state import INDEX_KEY

        index = torch.load("ckpt/resume.pt", weights_only=False)["method"]["optimizer"][INDEX_KEY]
        target = Path(paths.client_states("ckpt")) / "optimizer" / sorted(index.values())[0]
    flip(target)

    caplog.set_level(logging.WARNING)
    summary = train_run(run, "out", "ckpt")
    assert json.dumps(summary["eval"], sort_keys=True) == json.dumps(expected["eval"], sort_keys=True)
    assert json.loads(Path("out/run_manifest.json").read_text())["resumed_from_round"] is None
    assert Path("ckpt/resume.pt.corrupt").exists()                       # kept for a look
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert str(target) in warned and "CRC-32" in warned and "starts again from round 1" in warned, warned


def test_a_feature_cache_with_flipped_bytes_stops_the_run_by_name(tiny):
    from fedrepro.io import BrokenFile
    from fedrepro.train import train_run

    features = tiny["paths"]["features"]
    flip(features)
    with pytest.raises(BrokenFile) as error:
        train_run(tiny, "out", "ckpt")
    message = str(error.value)
    assert f"{features} is corrupt" in message and "CRC-32" in message, message
    assert f"snakemake --cores all {features}" in message
    assert Path(f"{features}.broken").exists() and not Path(features).exists()      # the next run rebuilds it
    assert not Path("out/metrics.json").exists()


def test_a_split_whose_content_changed_stops_the_run_by_name(tiny):
    """Two rows swapped between a client's train and validation parts: a valid split, not the one that was made."""
    from fedrepro.io import BrokenFile
    from fedrepro.train import train_run

    split = Path(tiny["paths"]["split"])
    data = json.loads(split.read_text())
    parts = next(iter(data["clients"].values()))
    parts["train"][0], parts["val"][0] = parts["val"][0], parts["train"][0]
    split.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    with pytest.raises(BrokenFile) as error:
        train_run(tiny, "out", "ckpt")
    message = str(error.value)
    assert f"{split} is corrupt" in message and "SHA-256" in message and f"snakemake --cores all {split}" in message
    assert Path(f"{split}.broken").exists()


def test_an_image_cache_with_a_flipped_byte_stops_the_read_by_name_in_a_loader_worker_too(tiny):
    from fedrepro.data.decode import DecodeSpec
    from fedrepro.data.image_cache import ImageCache, build_image_cache, cache_paths
    from fedrepro.data.images import ManifestImages
    from fedrepro.data.loader import batches, loader_pool
    from fedrepro.data.manifest import read_manifest
    from fedrepro.io import BrokenFile, sha256_file

    manifest, raw = tiny["paths"]["manifest"], tiny["paths"]["raw_dir"]
    pixels, _ = cache_paths("resources/images/demo_bt/square16-bilinear.u8")
    build_image_cache(manifest, raw, DecodeSpec.from_key("square16-bilinear"), pixels)
    cache = ImageCache(pixels, sha256_file(manifest))
    intact = cache.array(5).copy()
    data = bytearray(pixels.read_bytes())
    data[int(cache.offsets[5]) + 100] ^= 0x01                           # one bit of image 5
    pixels.write_bytes(bytes(data))
    with pytest.raises(BrokenFile) as error:
        ImageCache(pixels, sha256_file(manifest)).array(5)
    message = str(error.value)
    assert f"{pixels} is corrupt: the pixels of manifest row 5 do not match the CRC-32" in message, message
    assert f"snakemake --cores all {pixels}" in message and Path(f"{pixels}.broken").exists()
    assert intact.shape == (16, 16, 3)

    build_image_cache(manifest, raw, DecodeSpec.from_key("square16-bilinear"), pixels)
    data = bytearray(pixels.read_bytes())
    data[-1] ^= 0x01                                                    # the last image, read by a worker
    pixels.write_bytes(bytes(data))
    frame = read_manifest(manifest)
    images = ManifestImages(raw, frame["path"], frame["label"], range(len(frame)), lambda image: torch.zeros(1),
                            cache=ImageCache(pixels, sha256_file(manifest)))
    with loader_pool([images], workers=1), pytest.raises(BrokenFile) as error:
        list(batches(images, 4, shuffle=False))
    message = str(error.value)
    assert message.startswith(f"{pixels} is corrupt: the pixels of manifest row {len(frame) - 1}"), message
    assert "Traceback" not in message


def test_a_model_with_flipped_bytes_is_not_loaded_by_the_jobs_that_read_it(tiny):
    """model.pt, read by the embed and downstream jobs: set aside and named with both ways to get it back."""
    from fedrepro.downstream import load_models
    from fedrepro.io import BrokenFile
    from fedrepro.models.families import build_family
    from fedrepro.registry import dataset
    from fedrepro.train import train_run

    train_run(tiny, "out", "ckpt")
    flip("ckpt/model.pt", count=8)
    job = {"paths": {"checkpoint": "ckpt/model.pt"}, "run": tiny, "seed": tiny["seed"]}
    text = torch.load(tiny["paths"]["features"], weights_only=False)["text"]     # the family's frozen prompts
    family = build_family(tiny["train"]["model"], list(dataset(tiny["dataset"]).class_texts), {"text_features": text})
    with pytest.raises(BrokenFile) as error:
        load_models(job, family, torch.device("cpu"))
    message = str(error.value)
    assert "ckpt/model.pt is corrupt" in message and "snakemake --cores all ckpt/model.pt" in message
    assert "scripts/dvc-results.py pull --stages checkpoints" in message and Path("ckpt/model.pt.broken").exists()


def test_a_feature_cache_built_again_with_other_cores_has_the_same_bytes(tiny):
    """Snakemake gives a job as many torch threads as its cores: before, the text features of ten prompts (a
    10 x 384 -> 256 projection, which the CPU BLAS splits across threads) differed by up to 7e-7 between
    --cores 1 and 2, so every run on a rebuilt cache went stale."""
    from fedrepro.features import build_feature_cache
    from fedrepro.io import sha256_file
    from fedrepro.seeding import seed_global

    encoder = {"name": "fedrepro-lite0-minilm", "pretrained": "none", "preprocess": "clip", "image_size": 32,
               "prompt": "a picture of a {}"}
    classes = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot"]
    threads = torch.get_num_threads()
    digests = []
    try:
        for cores in (2, 1):
            torch.set_num_threads(cores)
            seed_global(0, "init")                          # what `fedrepro features` does for a random-init encoder
            out = Path(f"features-{cores}.pt")
            build_feature_cache(Path(tiny["paths"]["manifest"]), Path(tiny["paths"]["raw_dir"]), classes, encoder,
                                out, torch.device("cpu"))
            digests.append(sha256_file(out))
    finally:
        torch.set_num_threads(threads)
    assert digests[0] == digests[1]
