"""The authors' pixels: every image pipeline of every paper, under the authors' numerics (``pixels: authors``, the
default), gives the tensors the authors' own transform gives, called as their code calls it, on generated images of
odd sizes and modes; from the original files and from the decode-once cache alike, bit for bit.

The authors' side of each pipeline is written here, independently, from the official code:

- FACMIC (AIPMLab/FACMIC ``utils/prepare_data_dg_clip.py::ImageTextData.__getitem__``): ``preprocess(Image.open(path))``
  with ``preprocess`` = ``clip.load``'s (openai/CLIP ``clip/clip.py::_transform``: Resize(n_px, bicubic), CenterCrop,
  RGB, ToTensor, Normalize): the resize runs in the file's own mode (a palette PNG nearest-neighbour, RGBA with its
  alpha);
- FAA-CLIP (AIPMLab/FAA-CLIP ``utils/prepare_data_dg_clip.py::ImageTextData``): ``convert('RGB')``, Resize([224, 224]),
  ToTensor, ImageNet Normalize on ``Image.open(path)``;
- FedIIC (wnn2000/FedIIC ``dataset/dataset.py::SkinDataset.__getitem__``, ``ichDataset.read_image``: ``Image.open(path)
  .convert("RGB")``; ``dataset/get_dataset.py::get_datasets``): the two training views drawn from the full-resolution
  image, the evaluation Resize(256) + CenterCrop(224); ICH Resize((224, 224)) (+ RandomAffine, flip);
- FedDRA (HKU-MedAI/MGCA and BioMed-AI-Lab-U-Michgan/TMLR_FedDRA ``mgca/datasets/utils.py::get_imgs``,
  ``resize_img``; ``mgca/datasets/transforms.py::DataTransforms``): ``cv2.imread(path, 0)``, the longer side to 256 by
  ``cv2.resize(..., INTER_AREA)`` at ``int()`` sizes, zero padding split floor / ceil, RGB, Center/RandomCrop(224),
  Normalize(0.5);
- FedAdapterProto (berenslab/FedAdapterProto ``lib/eyepacs.py::FundusDataset.__getitem__``: ``cv2.imread`` -> RGB ->
  float32 / 255; ``lib/update.py::LocalUpdate.train_val``): Resize(224) and the augmentations on float tensors.

Random steps are compared under the same torch seed. FedIIC's first view ends with RandAugment from the authors' own
copy of timm's auto_augment (``dataset/randaugment.py``), which is not a package: its steps before RandAugment are
compared (RandAugment draws from Python's and NumPy's streams, so the second view, drawn after it from torch's,
is compared whole).
"""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from fedrepro.config import load_project
from fedrepro.data.decode import spec_of
from fedrepro.data.image_cache import ImageCache, build_image_cache
from fedrepro.data.images import ManifestImages
from fedrepro.data.manifest import write_manifest
from fedrepro.models.encoders import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD
from fedrepro.registry import model_class

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def project():
    return load_project(["config/config.yaml"])


def model_of(project, paper: str, setting: str, method: str, pixels: str = "authors") -> dict:
    model = project.resolver.train_config(paper, setting, method, "paper")["model"]
    assert model["pixels"] == "authors"         # the default numerics
    return {**model, "pixels": pixels}


# ---- generated images ----------------------------------------------------------------------------

def smooth(rng, height: int, width: int, channels: int) -> np.ndarray:
    """Structure at several scales plus noise, so that every resampling difference shows."""
    coarse = rng.integers(0, 256, (height // 7 + 2, width // 7 + 2, channels)).astype(np.uint8)
    image = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC).reshape(height, width, channels)
    noise = rng.integers(-20, 21, image.shape)
    return np.clip(image.astype(int) + noise, 0, 255).astype(np.uint8)


def write_images(folder, kinds) -> list[str]:
    """Image files of odd sizes: ``kinds`` names them (rgb_jpg, grey_jpg, grey_png, rgb_png, palette_png,
    rgba_png, i16_png, square_jpg, tiny_png)."""
    rng = np.random.default_rng(7)
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for kind in kinds:
        name = f"{kind}.{kind.rsplit('_', 1)[1]}"
        if kind == "rgb_jpg":
            Image.fromarray(smooth(rng, 389, 517, 3)).save(folder / name, quality=92)
        elif kind == "grey_jpg":                 # taller than wide, as a chest X-ray
            Image.fromarray(smooth(rng, 457, 301, 1)[..., 0]).save(folder / name, quality=92)
        elif kind == "square_jpg":               # 389 * (256 / 389) is 255.99...: MGCA's int() gives 255
            Image.fromarray(smooth(rng, 389, 389, 1)[..., 0]).save(folder / name, quality=92)
        elif kind == "grey_png":
            Image.fromarray(smooth(rng, 263, 331, 1)[..., 0]).save(folder / name)
        elif kind == "rgb_png":
            Image.fromarray(smooth(rng, 389, 517, 3)).save(folder / name)
        elif kind == "square_png":
            Image.fromarray(smooth(rng, 512, 512, 3)).save(folder / name)
        elif kind == "palette_png":
            Image.fromarray(smooth(rng, 211, 333, 3)).convert("P").save(folder / name)
        elif kind == "rgba_png":
            rgba = np.concatenate([smooth(rng, 333, 211, 3), rng.integers(0, 256, (333, 211, 1), dtype=np.uint8)], 2)
            Image.fromarray(rgba, "RGBA").save(folder / name)
        elif kind == "i16_png":
            Image.fromarray((smooth(rng, 199, 250, 1)[..., 0].astype(np.uint16) * 3)).save(folder / name)
        elif kind == "tiny_png":                 # smaller than the crop: upsampled
            Image.fromarray(smooth(rng, 90, 150, 3)).save(folder / name)
        else:
            raise ValueError(kind)
        made.append(name)
    return made


def ours(raw, work, transform, names, pixels: str = "authors") -> list[list[torch.Tensor]]:
    """Our pipeline's tensors for every file in ``raw``: decoded as the run decodes it for ``pixels`` (full JPEG
    decodes, the authors' numerics), from the original files and, where the spec resizes, from a decode-once cache
    (built in ``work``)."""
    work.mkdir(parents=True, exist_ok=True)
    spec = replace(spec_of(transform, pixels), draft=False)
    rows = np.arange(len(names))
    args = (raw, names, np.zeros(len(names), dtype=int), rows, transform)
    sources = [ManifestImages(*args, decode=spec)]
    if spec.size is not None:
        manifest = pd.DataFrame({"path": names, "label": 0, "class_name": "a", "source": "", "split": ""})
        write_manifest(work / "m.csv", manifest)
        pixels_file = work / f"{spec.key}.u8"
        build_image_cache(work / "m.csv", raw, spec, pixels_file)
        sources.append(ManifestImages(*args, decode=spec, cache=ImageCache(pixels_file, spec=spec)))
    out = []
    for i in range(len(names)):
        per = []
        for source in sources:
            torch.manual_seed(i)
            per.append(source[i]["x"])
        out.append(per)
    return out


def authors(raw, names, call) -> list[torch.Tensor]:
    out = []
    for i, name in enumerate(names):
        torch.manual_seed(i)
        out.append(call(str(raw / name)))
    return out


def assert_same(ours_tensors, authors_tensors, names, what: str) -> None:
    for name, mine, theirs in zip(names, ours_tensors, authors_tensors):
        for source, tensor in zip(("original file", "decode-once cache"), mine):
            assert tensor.shape == theirs.shape and torch.equal(tensor, theirs), \
                f"{what}, {name} ({source}): max |difference| {(tensor - theirs).abs().max() if tensor.shape == theirs.shape else tensor.shape}"


def differs(ours_tensors, authors_tensors) -> bool:
    return any(m[0].shape != t.shape or not torch.equal(m[0], t) for m, t in zip(ours_tensors, authors_tensors))


# ---- FACMIC and FAA-CLIP: CLIP's preprocessing ---------------------------------------------------

def openai_clip_transform(n_px: int):
    """openai/CLIP clip/clip.py::_transform."""
    return T.Compose([T.Resize(n_px, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(n_px),
                      lambda image: image.convert("RGB"), T.ToTensor(), T.Normalize(CLIP_MEAN, CLIP_STD)])


FAA_TRANSFORM = T.Compose([T.Lambda(lambda x: x.convert("RGB")), T.Resize([224, 224]), T.ToTensor(),
                           T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])       # ImageTextData._TRANSFORM / _transform

CLIP_FILES = ("rgb_jpg", "grey_jpg", "palette_png", "rgba_png", "i16_png", "tiny_png")


@pytest.mark.parametrize("paper", ["facmic", "faa_clip"])
def test_clip_preprocessing_is_the_authors(paper, project, tmp_path):
    """The frozen encoder's preprocessing (feature caches, the _images twins) and the CLIP fine-tuning baselines'."""
    from fedrepro.models.encoders import encoder_transform, load_open_clip

    model = model_of(project, paper, next(iter(project.papers[paper]["settings"])), "fedavg")
    encoder = {**model["encoder"], "pretrained": "none"}
    clip, preprocess, _ = load_open_clip(encoder["name"], "none")
    transform = encoder_transform(encoder, clip, preprocess)
    names = write_images(tmp_path / "raw", CLIP_FILES)
    reference = FAA_TRANSFORM if paper == "faa_clip" else openai_clip_transform(224)
    theirs = authors(tmp_path / "raw", names, lambda path: reference(Image.open(path)))
    assert_same(ours(tmp_path / "raw", tmp_path / "authors", transform, names), theirs, names, paper)
    if paper == "facmic":      # converting first (the fast pixels) resizes palette and RGBA images differently
        assert differs(ours(tmp_path / "raw", tmp_path / "fast", transform, names, "fast"), theirs)


# ---- FedIIC ----------------------------------------------------------------------------------------

NORMALIZE = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)


def fediic_views():
    """dataset/get_dataset.py::get_datasets (isic2019): ``trans`` up to RandAugment, ``augmentation_sim``."""
    view1 = T.Compose([T.RandomResizedCrop(224, scale=(0.08, 1.)), T.RandomHorizontalFlip(),
                       T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.0)], p=1.0)])
    view2 = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                       T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(p=0.2),
                       T.ToTensor(), NORMALIZE])
    return view1, view2


def test_fediic_skin_views_are_cut_from_the_full_resolution_image(project, tmp_path):
    family = model_class("proj_classifier")(model_of(project, "fediic", "isic", "fediic"), list("abcdefgh"), {})
    names = write_images(tmp_path / "raw", ("rgb_jpg", "grey_jpg", "tiny_png"))
    raw = tmp_path / "raw"
    view1, view2 = fediic_views()
    train = family.train_transform()                     # MultiView(view 1, view 2)
    ours_view1 = T.Compose([*train.views[0].transforms[:3], T.PILToTensor()])
    theirs1 = authors(raw, names, lambda p: T.PILToTensor()(view1(Image.open(p).convert("RGB"))))
    assert_same(ours(raw, tmp_path / "v1", ours_view1, names), theirs1, names, "FedIIC view 1 before RandAugment")

    def both_views(path):            # SkinDataset: img0 = transform[0](img); img1 = transform[1](img)
        image = Image.open(path).convert("RGB")
        view1(image)                  # draws what the first view draws from torch's stream (RandAugment does not)
        return view2(image)

    theirs2 = authors(raw, names, both_views)
    assert_same([[x[1] for x in xs] for xs in ours(raw, tmp_path / "v2", train, names)], theirs2, names, "FedIIC view 2")
    # the authors' evaluation transform, from a decode-once cache of shorter side 256
    evaluate = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), NORMALIZE])
    theirs = authors(raw, names, lambda p: evaluate(Image.open(p).convert("RGB")))
    assert_same(ours(raw, tmp_path / "eval", family.eval_transform(), names), theirs, names, "FedIIC evaluation")
    # the fast pixels crop from an image pre-resized to twice the crop: other pixels
    assert differs(ours(raw, tmp_path / "fast", ours_view1, names, "fast"), theirs1)


def test_fediic_ich_pipeline_is_the_authors(project, tmp_path):
    family = model_class("proj_classifier")(model_of(project, "fediic", "ich", "fediic"), list("abcde"), {})
    names = write_images(tmp_path / "raw", ("grey_png", "i16_png", "rgb_png"))
    train = T.Compose([T.Resize((224, 224)), T.RandomAffine(degrees=10, translate=(0.02, 0.02)),
                       T.RandomHorizontalFlip(), T.ToTensor(), NORMALIZE])        # trans1 (= trans2)
    evaluate = T.Compose([T.Resize((224, 224)), T.ToTensor(), NORMALIZE])
    raw = tmp_path / "raw"
    theirs = authors(raw, names, lambda p: train(Image.open(p).convert("RGB")))
    assert_same([[x[0] for x in xs] for xs in ours(raw, tmp_path / "t", family.train_transform(), names)], theirs, names,
                "FedIIC ICH view 1")
    theirs = authors(raw, names, lambda p: evaluate(Image.open(p).convert("RGB")))
    assert_same(ours(raw, tmp_path / "e", family.eval_transform(), names), theirs, names, "FedIIC ICH evaluation")


# ---- FedDRA: MGCA's reading, pad-resize and crops ----------------------------------------------------

def mgca_resize_img(img: np.ndarray, scale: int) -> np.ndarray:
    """mgca/datasets/utils.py::resize_img, written from its description: the longer side (the rows on a tie) to
    ``scale`` by cv2.resize INTER_AREA, the other int(side * scale / longer), zero padding floor left / ceil right."""
    rows, cols = img.shape[:2]
    if rows >= cols:
        size = (scale, int(float(cols) * (scale / float(rows))))
    else:
        size = (int(float(rows) * (scale / float(cols))), scale)
    resized = cv2.resize(img, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    pad_rows, pad_cols = scale - resized.shape[0], scale - resized.shape[1]
    return np.pad(resized, [(pad_rows // 2, pad_rows - pad_rows // 2), (pad_cols // 2, pad_cols - pad_cols // 2)],
                  "constant", constant_values=0)


def mgca_get_imgs(path: str, scale: int, transform) -> torch.Tensor:
    """mgca/datasets/utils.py::get_imgs: cv2.imread(path, 0), resize_img, Image.fromarray(x).convert("RGB")."""
    return transform(Image.fromarray(mgca_resize_img(cv2.imread(path, 0), scale)).convert("RGB"))


def data_transforms(is_train: bool, crop_size: int = 224):
    """mgca/datasets/transforms.py::DataTransforms."""
    crop = T.RandomCrop(crop_size) if is_train else T.CenterCrop(crop_size)
    return T.Compose([crop, T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


def test_feddra_pipeline_is_mgca_s(project, tmp_path):
    model = model_of(project, "feddra", "mimic_a1", "feddra_convirt")
    family = model_class("vlp")(model, ["a"], {})
    names = write_images(tmp_path / "raw", ("grey_jpg", "square_jpg", "grey_png"))
    raw = tmp_path / "raw"
    for is_train, transform in ((False, family.eval_transform()), (True, family.train_transform())):
        theirs = authors(raw, names, lambda p: mgca_get_imgs(p, model["image"]["resize"], data_transforms(is_train)))
        assert_same(ours(raw, tmp_path / str(is_train), transform, names), theirs, names, f"FedDRA (train: {is_train})")
    # PIL bicubic at rounded sizes (the fast pixels) is not MGCA's resize
    fast = model_class("vlp")({**model, "pixels": "fast"}, ["a"], {})
    theirs = authors(raw, names, lambda p: mgca_get_imgs(p, model["image"]["resize"], data_transforms(False)))
    assert differs(ours(raw, tmp_path / "fast", fast.eval_transform(), names, "fast"), theirs)


def test_feddra_pad_resize_reproduces_mgca_s_int_sizes():
    """A square 389-px X-ray: 389 * (256 / 389) = 255.99..., which MGCA's int() makes 255 (one padded column)."""
    from fedrepro.models.decoding import pad_resize_spec

    assert pad_resize_spec(256, "authors").target_size(389, 389) == (255, 256)
    assert pad_resize_spec(256, "authors").target_size(2544, 3056) == (int(2544 * (256 / 3056)), 256)
    assert pad_resize_spec(256, "fast").target_size(389, 389) == (256, 256)


# ---- FedAdapterProto: float tensors -------------------------------------------------------------------

def fundus_tensor(path: str) -> torch.Tensor:
    """lib/eyepacs.py::FundusDataset.__getitem__: cv2.imread, BGR -> RGB, _pil2tensor (H x W x C -> C x H x W),
    float32 / 255."""
    image = cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB)
    return torch.from_numpy(np.ascontiguousarray(np.transpose(image, (2, 0, 1))).astype(np.float32)) / 255


def test_fedadapterproto_pipeline_works_on_float_tensors_as_the_authors(project, tmp_path):
    family = model_class("adapter_protonet")(model_of(project, "fedadapterproto", "eyepacs_sites", "fedadapterproto"),
                                             ["healthy", "diseased"], {})
    train = T.Compose([T.Resize(224), T.RandomHorizontalFlip(p=0.5), T.RandomVerticalFlip(p=0.5),
                       T.RandomRotation(degrees=5),
                       T.ColorJitter(brightness=0.05, hue=0.05, saturation=[0.8, 1.2], contrast=0.9),
                       T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])             # lib/update.py::LocalUpdate.train_val
    evaluate = T.Compose([T.Resize(224), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    names = write_images(tmp_path / "raw", ("square_png", "rgb_png", "grey_png"))
    raw = tmp_path / "raw"
    theirs_train = authors(raw, names, lambda p: train(fundus_tensor(p)))
    assert_same(ours(raw, tmp_path / "t", family.train_transform(), names), theirs_train, names, "FedAdapterProto training")
    theirs = authors(raw, names, lambda p: evaluate(fundus_tensor(p)))
    assert_same(ours(raw, tmp_path / "e", family.eval_transform(), names), theirs, names, "FedAdapterProto evaluation")
    fast = model_class("adapter_protonet")({**family.cfg, "pixels": "fast"}, ["healthy", "diseased"], {})
    assert differs(ours(raw, tmp_path / "fast", fast.eval_transform(), names[:1], "fast"), theirs[:1])


# ---- which parts have a decode-once cache ----------------------------------------------------------------

def test_full_resolution_pipelines_read_the_original_files(project):
    """A pipeline that needs the full-resolution image (FedIIC's random crops, FedAdapterProto's tensor resize) has
    no decode-once cache under the authors' pixels (ISIC 2019 at full resolution is ~60 GB as uint8): its run reads
    the original files every epoch, as the authors' code does; its other part keeps its cache. The fast numerics
    cache both, downsized."""
    fast = load_project(["config/config.yaml"], {"numerics": "fast"})
    for paper, setting, method, cached in (("fediic", "isic", "fediic", {"eval"}),
                                           ("fedadapterproto", "eyepacs_sites", "fedadapterproto", set()),
                                           ("feddra", "mimic_a1", "feddra_convirt", {"train", "eval"}),
                                           ("faa_clip", "sc", "faa_clip_images", {"train", "eval"})):
        run = project.resolver.run_config(project.resolver.run_key(paper, setting, method, 0))
        assert set(run["paths"]["images"] or {}) == cached, (paper, run["paths"]["images"])
        fast_run = fast.resolver.run_config(fast.resolver.run_key(paper, setting, method, 0))
        assert set(fast_run["paths"]["images"]) == {"train", "eval"}, paper
