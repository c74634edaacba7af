"""Decode once: decode specs, the image cache, and loader workers that do not change results."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from fedrepro.data.decode import DecodeSpec, decode_image, spec_of
from fedrepro.data.image_cache import ImageCache, StaleImageCache, build_image_cache
from fedrepro.data.images import ManifestImages
from fedrepro.data.loader import batches, loader_pool
from fedrepro.data.manifest import write_manifest
from fedrepro.seeding import torch_generator

pytestmark = pytest.mark.usefixtures("one_thread")


def _write_images(raw, n=6):
    """JPEG colour images larger than any spec below, greyscale PNGs, one tiny image."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        if i % 3 == 0:
            pixels, name = rng.integers(0, 255, (300, 400, 3), dtype=np.uint8), f"c{i}.jpg"
        elif i % 3 == 1:
            pixels, name = rng.integers(0, 255, (260, 180), dtype=np.uint8), f"g{i}.png"
        else:
            pixels, name = rng.integers(0, 255, (20, 30, 3), dtype=np.uint8), f"t{i}.png"
        Image.fromarray(pixels).save(raw / name, quality=90)
        rows.append({"path": name, "label": i % 2, "class_name": "ab"[i % 2], "source": "", "split": ""})
    return pd.DataFrame(rows)


@pytest.fixture
def images(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    manifest = _write_images(raw)
    write_manifest(tmp_path / "m.csv", manifest)
    return raw, tmp_path / "m.csv", manifest


def test_decode_matches_torchvision_resize_and_keeps_greyscale(images):
    from torchvision import transforms as T

    raw, _, _ = images
    png = Image.open(raw / "g1.png").convert("RGB")
    for spec, resize in ((DecodeSpec(64, "shorter", "bilinear"), T.Resize(64)),
                         (DecodeSpec(50, "square", "bicubic"), T.Resize((50, 50), T.InterpolationMode.BICUBIC))):
        decoded = decode_image(raw / "g1.png", spec)
        assert decoded.mode == "L"                          # one channel through the resize
        assert np.array_equal(np.asarray(decoded.convert("RGB")), np.asarray(resize(png)))
    # a large JPEG is decoded at a reduced DCT scale and still lands on torchvision's output size
    jpeg = decode_image(raw / "c0.jpg", DecodeSpec(64, "shorter", "bilinear"))
    assert jpeg.size == T.Resize(64)(Image.open(raw / "c0.jpg")).size == (85, 64)
    assert decode_image(raw / "c0.jpg", DecodeSpec(100, "longer", "bicubic")).size == (100, 75)


def test_spec_of_reads_the_first_resize_of_a_pipeline():
    from torchvision import transforms as T

    from fedrepro.data.decode import ToRGB
    from fedrepro.models.projected import MultiView
    from fedrepro.models.vlp import PadToSquare

    for pixels in ("authors", "fast"):
        assert spec_of(T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()]), pixels) == \
            DecodeSpec(256, "shorter", "bilinear")
        assert spec_of(T.Compose([T.Resize((96, 96)), T.ToTensor()]), pixels) == DecodeSpec(96, "square", "bilinear")
        assert spec_of(T.Compose([T.ToTensor()]), pixels) == DecodeSpec()
    # MGCA's pad-to-square: cv2 INTER_AREA (the authors') or PIL bicubic (fast)
    pad = T.Compose([T.Compose([PadToSquare(256), T.CenterCrop(224)]), T.ToTensor()])
    assert spec_of(pad) == DecodeSpec(256, "longer", "area", library="cv2")
    pad_fast = T.Compose([T.Compose([PadToSquare(256, pixels="fast"), T.CenterCrop(224)]), T.ToTensor()])
    assert spec_of(pad_fast, "fast") == DecodeSpec(256, "longer", "bicubic")
    # random crops: from the full-resolution image (the authors'), or from twice the crop size (fast)
    views = MultiView(T.Compose([T.RandomResizedCrop(224), T.ToTensor()]), T.Compose([T.RandomResizedCrop(112)]))
    assert spec_of(views, "fast") == DecodeSpec(448, "shorter", "bilinear")   # the larger view's needs
    assert spec_of(views, "authors") == DecodeSpec()
    # CLIP's preprocess converts to RGB after its resize: the authors' resize runs in the file's own mode
    clip = T.Compose([T.Resize(224, T.InterpolationMode.BICUBIC), T.CenterCrop(224), ToRGB(), T.ToTensor()])
    assert spec_of(clip) == DecodeSpec(224, "shorter", "bicubic", convert="after")
    assert spec_of(clip, "fast") == DecodeSpec(224, "shorter", "bicubic")
    for spec in (DecodeSpec(448, "shorter", "bilinear"), DecodeSpec(256, "longer", "area", False, "cv2"),
                 DecodeSpec(224, "shorter", "bicubic", False, convert="after")):
        assert DecodeSpec.from_key(spec.key) == spec


@pytest.mark.parametrize("workers", [1, 2])
def test_cached_and_uncached_images_give_the_same_tensors(images, tmp_path, workers):
    from torchvision import transforms as T

    raw, manifest_path, manifest = images
    deterministic = T.Compose([T.Resize(48), T.CenterCrop(40), T.ToTensor()])
    augmented = T.Compose([T.RandomResizedCrop(32, scale=(0.3, 1.0)), T.RandomHorizontalFlip(), T.ToTensor()])
    for transform in (deterministic, augmented):
        spec = spec_of(transform)
        build_image_cache(manifest_path, raw, spec, tmp_path / f"{spec.key}.u8", workers=workers)
        cache = ImageCache(tmp_path / f"{spec.key}.u8", spec=spec)
        rows = np.arange(len(manifest))
        args = (raw, manifest["path"].tolist(), manifest["label"].to_numpy(), rows, transform)
        cached, files = ManifestImages(*args, decode=spec, cache=cache), ManifestImages(*args, decode=spec)
        for a, b in zip(batches(cached, 4, shuffle=True, generator=torch_generator(0, "shuffle")),
                        batches(files, 4, shuffle=True, generator=torch_generator(0, "shuffle"))):
            assert torch.equal(a["x"], b["x"]) and torch.equal(a["index"], b["index"])


def test_a_stale_or_wrong_cache_is_refused_by_name(images, tmp_path):
    raw, manifest_path, manifest = images
    spec = DecodeSpec(48, "shorter", "bilinear")
    pixels = tmp_path / "cache" / f"{spec.key}.u8"
    meta = build_image_cache(manifest_path, raw, spec, pixels)
    with pytest.raises(StaleImageCache, match=f"{pixels}.*another version of the manifest"):
        ImageCache(pixels, manifest_sha256="0" * 64)
    with pytest.raises(StaleImageCache, match=r"decoded as shorter48-bilinear.*needs shorter96-bilinear"):
        ImageCache(pixels, meta["manifest_sha256"], DecodeSpec(96, "shorter", "bilinear"))
    with pytest.raises(FileNotFoundError, match="image cache .*not found"):
        ImageCache(tmp_path / "cache" / "square9-bilinear.u8")


def test_loader_workers_change_nothing_and_leave_the_training_stream_alone(images):
    from torchvision import transforms as T

    raw, _, manifest = images
    transform = T.Compose([T.RandomResizedCrop(24, scale=(0.2, 1.0)), T.ColorJitter(0.4, 0.4), T.ToTensor()])
    data = ManifestImages(raw, manifest["path"].tolist(), manifest["label"].to_numpy(), np.arange(len(manifest)),
                          transform, decode=spec_of(transform))

    def two_passes():
        return [b["x"] for p in range(2) for b in batches(data, 4, shuffle=True, generator=torch_generator(1, "shuffle", p))]

    torch.manual_seed(7)
    inline = two_passes()
    after_inline = torch.rand(3)          # the global stream is where seeding left it
    torch.manual_seed(7)
    assert torch.equal(torch.rand(3), after_inline)
    with loader_pool([data], workers=2):
        pooled = two_passes()
    assert len(inline) == len(pooled) == 4
    assert all(torch.equal(a, b) for a, b in zip(inline, pooled))


def test_an_item_seed_sets_the_cpu_stream_only(monkeypatch):
    """An item's transform draws from the same CPU stream as under torch.manual_seed, without seeding
    (or queueing a seed for) an accelerator on every item."""
    from fedrepro.data.loader import seed_item

    torch.manual_seed(123)
    expected = torch.rand(4), np.random.RandomState(123).rand(2)

    def no_accelerator(*args, **kwargs):
        raise AssertionError("an item seed reached torch.cuda")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", no_accelerator)
    monkeypatch.setattr(torch.cuda, "manual_seed", no_accelerator)
    seed_item(123)
    assert torch.equal(torch.rand(4), expected[0])
    assert np.array_equal(np.random.rand(2), expected[1])


def _image_models():
    """Every distinct image-model config of the full grid and the demo, with random-init weights
    (the transforms do not depend on the weights)."""
    import copy
    import json

    from fedrepro.config import load_project

    seen = {}
    for files, numerics in ((["config/config.yaml"], "authors"), (["config/config.yaml", "config/demo.yaml"], "authors"),
                            (["config/config.yaml"], "fast")):
        project = load_project(files, {"numerics": numerics})
        for key in project.plan.runs():
            run = project.resolver.run_config(key)
            if run["input"] == "features":
                continue
            model = copy.deepcopy(run["train"]["model"])
            if "encoder" in model:
                model["encoder"]["pretrained"] = "none"
            if "pretrained" in model:
                model["pretrained"] = False
            seen[json.dumps(model, sort_keys=True)] = (model, model["family"])
    return list(seen.values())


def test_declared_decode_specs_are_those_of_the_real_transforms():
    """The DAG names image caches from models/decoding.py without building a model; the job then
    checks the cache against the transforms it really builds. Both must agree for every run."""
    from fedrepro.models.decoding import decode_specs
    from fedrepro.registry import model_class

    models = _image_models()
    assert len(models) >= 5
    for model, impl in models:
        family = model_class(impl)(model, ["a", "b", "c"], {})
        declared = decode_specs(model)
        assert declared["train"] == spec_of(family.train_transform(), model["pixels"]), model
        assert declared["eval"] == spec_of(family.eval_transform(), model["pixels"]), model
    assert {model["pixels"] for model, _ in models} == {"authors", "fast"}
