"""Encoders by name, from a local checkpoint, and the frozen-feature cache."""

import pandas as pd
import torch
from PIL import Image

from fedrepro.data import prepare
from fedrepro.data.decode import spec_of
from fedrepro.data.images import load_rgb
from fedrepro.features import encode_dataset
from fedrepro.models.encoders import create_timm, feature_transform, load_open_clip
from fedrepro.registry import dataset

TINY = {"name": "fedrepro-tiny-clip", "pretrained": "none", "preprocess": "clip", "prompt": "a picture of a {}"}


def test_open_clip_from_a_local_checkpoint_is_the_same_model(tmp_path):
    torch.manual_seed(0)
    model, _, _ = load_open_clip("fedrepro-tiny-clip", "none")
    path = tmp_path / "open_clip_pytorch_model.bin"
    torch.save(model.state_dict(), path)
    again, _, _ = load_open_clip("fedrepro-tiny-clip", str(path))
    for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k


def test_timm_from_a_local_checkpoint_keeps_the_body_and_a_fresh_head(tmp_path):
    torch.manual_seed(0)
    source = create_timm("test_resnet", num_classes=7)
    path = tmp_path / "resnet.pth"
    torch.save(source.state_dict(), path)
    model = create_timm("test_resnet", num_classes=3, pretrained=str(path))
    body = [k for k in source.state_dict() if not k.startswith("fc.")]
    assert all(torch.equal(model.state_dict()[k], source.state_dict()[k]) for k in body)
    assert model.get_classifier().out_features == 3


def test_cache_equals_encoding_every_image(demo_raw):
    spec = dataset("demo_bt")
    manifest = prepare.prepare_dataset(spec, demo_raw)
    torch.manual_seed(0)
    cache = encode_dataset(manifest, demo_raw, list(spec.classes), TINY, torch.device("cpu"), batch_size=5, progress=False)
    assert cache["image"].shape == (17, 64) and cache["text"].shape == (4, 64)
    assert torch.equal(cache["labels"], torch.as_tensor(manifest["label"].to_numpy()))
    torch.manual_seed(0)  # the same random-init encoder, used the way the authors' code does: per batch
    model, preprocess, _ = load_open_clip("fedrepro-tiny-clip", "none")
    transform = feature_transform("clip", 64, preprocess)
    decode = spec_of(transform)
    with torch.no_grad():
        direct = model.encode_image(torch.stack([transform(load_rgb(demo_raw / p, decode)) for p in manifest["path"][:3]]))
    assert torch.allclose(cache["image"][:3], direct, atol=1e-5)
    # without JPEG DCT scaling the cache holds exactly the authors' pixels: full decode, then their preprocess
    torch.manual_seed(0)
    exact = encode_dataset(manifest, demo_raw, list(spec.classes), TINY, torch.device("cpu"), progress=False, draft=False)
    with torch.no_grad():
        authors = model.encode_image(torch.stack([transform(Image.open(demo_raw / p).convert("RGB")) for p in manifest["path"][:3]]))
    assert torch.allclose(exact["image"][:3], authors, atol=1e-5)
    assert not torch.allclose(exact["image"], cache["image"], atol=1e-5)   # the MRIs are large JPEGs: drafting shows


def test_bt_preparer_on_the_real_mri_files(demo_raw):
    manifest = prepare.prepare_dataset(dataset("demo_bt"), demo_raw)
    assert len(manifest) == 17
    assert set(manifest["class_name"]) == set(dataset("bt").classes)
    assert manifest.groupby("split").size().to_dict() == {"test": 4, "train": 13}
    assert isinstance(manifest, pd.DataFrame) and manifest["path"].str.startswith("demo_bt/Training/").sum() == 13


def test_paper_protocol_encodes_with_the_authors_fp16_clip(demo_raw):
    """The FACMIC and FAA-CLIP code encodes with CLIP as ``clip.load(name, device="cuda", jit=False)`` gives it
    (AIPMLab/FACMIC and AIPMLab/FAA-CLIP ``nets/models.py::ClipModelat.__init__``; openai/CLIP ``clip/clip.py::load``
    -> ``build_model`` -> ``clip/model.py::convert_weights``: fp16 weights on a GPU) and never converts the
    frozen model back (``utils/training.py::train``, methods ``ours`` and ``fedclip``: ``encode_image(image).float()``,
    ``get_text_features_list(...).float()``; only the fine-tuning loops call ``convert_models_to_fp32``). With
    ``encoder.precision: fp16_weights`` the cache holds what that model computes, ``encode_image`` casting the
    images to fp16 (``image.type(self.dtype)``), for the images and the prompts alike; the family that runs
    the encoder on every batch computes the same features."""
    from fedrepro.config import model_schema, validate
    from fedrepro.registry import model_class
    from fedrepro.seeding import seed_global
    from parity.clip_spec import authors_fp16_clip

    spec = dataset("demo_bt")
    manifest = prepare.prepare_dataset(spec, demo_raw)
    half = {**TINY, "precision": "fp16_weights"}
    n = len(manifest)
    seed_global(0, "init")                   # as `fedrepro features` and the per-batch family's encoder
    cache = encode_dataset(manifest, demo_raw, list(spec.classes), half, torch.device("cpu"), batch_size=n, progress=False)
    seed_global(0, "init")
    fp32 = encode_dataset(manifest, demo_raw, list(spec.classes), TINY, torch.device("cpu"), batch_size=n, progress=False)
    seed_global(0, "init")
    authors, preprocess, tokenizer = load_open_clip("fedrepro-tiny-clip", "none")
    authors_fp16_clip(authors)
    transform = feature_transform("clip", 64, preprocess)
    x = torch.stack([transform(load_rgb(demo_raw / p, spec_of(transform))) for p in manifest["path"]])
    with torch.no_grad():
        image = authors.encode_image(x.half()).float()
        text = authors.encode_text(tokenizer([f"a picture of a {c}" for c in spec.classes])).float()
    assert cache["precision"] == "fp16_weights" and fp32["precision"] == "fp32"
    assert torch.equal(cache["image"], image) and torch.equal(cache["text"], text)
    assert not torch.allclose(cache["image"], fp32["image"], atol=1e-4)          # fp16 arithmetic shows
    assert torch.allclose(cache["image"], fp32["image"], rtol=0, atol=0.05 * fp32["image"].abs().max())

    cfg = validate({"family": "clip_fam_images", "encoder": half}, model_schema("clip_fam_images"), "model")
    family = model_class("clip_fam_images")(cfg, list(spec.classes), {})
    assert torch.equal(family.image_features({"x": x}), cache["image"])
    assert torch.equal(family.text, cache["text"])


def test_the_fp16_clip_normalises_in_fp32_as_a_gpu_requires(demo_raw, monkeypatch):
    """On a GPU, layer_norm refuses fp16 activations with fp32 weights (seen on an H200: "expected scalar type Half
    but found Float", every paper-protocol feature cache); OpenAI's LayerNorm (openai/CLIP ``clip/model.py::LayerNorm``)
    normalises in fp32 and the CPU kernel would hide the difference. Here layer_norm is held to the GPU's rule."""
    import torch.nn.functional as F

    real = F.layer_norm

    def strict(x, shape, weight=None, bias=None, eps=1e-5):
        assert weight is None or x.dtype == weight.dtype, f"layer_norm of {x.dtype} activations with {weight.dtype} weights"
        return real(x, shape, weight, bias, eps)

    monkeypatch.setattr(F, "layer_norm", strict)
    spec = dataset("demo_bt")
    manifest = prepare.prepare_dataset(spec, demo_raw).head(4)
    cache = encode_dataset(manifest, demo_raw, list(spec.classes), {**TINY, "precision": "fp16_weights"},
                           torch.device("cpu"), batch_size=4, progress=False)
    assert cache["image"].shape[0] == 4 and torch.isfinite(cache["image"]).all() and torch.isfinite(cache["text"]).all()
