"""What a whole-run parity comparison feeds both sides, made from a seed: a tiny dataset in the real layout the
authors' loader reads, and a stand-in for the pretrained checkpoint their code would download.

Everything here is deterministic across machines and library versions (numpy's PCG64 streams, PNG-free JPEG bytes
checked by their decoded pixels), so the continuous-integration replay can rebuild exactly what the recorded
authors' run saw instead of committing megabytes of images and weights.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

ISIC_CLASSES = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")
ISIC_TRUTH = "ISIC_2019_Training_GroundTruth.csv"
ISIC_META = "ISIC_2019_Training_Metadata.csv"
ISIC_IMAGES = "ISIC_2019_Training_Input"


def fediic_code_parts(n: int) -> tuple[slice, slice, slice]:
    """The train / validation / test cut of the FedIIC code's permutation of ``n`` rows
    (wnn2000/FedIIC ``dataset/dataset.py::SkinDataset``: first 70 %, next 10 %, last 20 %)."""
    return slice(0, int(0.7 * n)), slice(int(0.7 * n), int(0.8 * n)), slice(int(0.8 * n), n)


def fixture_labels(n: int, seed: int) -> np.ndarray:
    """Labels of the ``n`` ground-truth rows such that each part of the FedIIC code's cut (its permutation under
    ``np.random.seed(0)``) holds all 8 classes - the code asserts it - with a long-tailed training part."""
    train, val, test = fediic_code_parts(n)
    rng = np.random.default_rng([seed, 1])
    by_position = np.empty(n, dtype=int)
    for part in (val, test):
        size = part.stop - part.start
        by_position[part] = rng.permutation(np.arange(size) % len(ISIC_CLASSES))
    size = train.stop - train.start
    tail = np.arange(len(ISIC_CLASSES))                             # every class once ...
    weights = 0.5 ** np.arange(len(ISIC_CLASSES))                   # ... the rest long-tailed, class 0 the head
    rest = rng.choice(len(ISIC_CLASSES), size - len(tail), p=weights / weights.sum())
    by_position[train] = rng.permutation(np.concatenate([tail, rest]))
    permutation = np.random.RandomState(0).permutation(n)           # the code's np.random.seed(0); permutation(n)
    labels = np.empty(n, dtype=int)
    labels[permutation] = by_position
    return labels


def fixture_image(label: int, rng: np.random.Generator, size: int) -> np.ndarray:
    """A size x size RGB image: a class-coloured disc on noisy skin tones (uint8)."""
    yy, xx = np.mgrid[:size, :size] / max(size - 1, 1)
    centre = rng.uniform(0.3, 0.7, 2)
    radius = rng.uniform(0.15, 0.35)
    disc = ((yy - centre[0]) ** 2 + (xx - centre[1]) ** 2) < radius ** 2
    skin = np.array([200, 160, 140]) + rng.normal(0, 12, (size, size, 3))
    hue = np.array([(37 * label) % 256, (91 * label + 40) % 256, (53 * label + 90) % 256])
    lesion = hue + rng.normal(0, 20, (size, size, 3))
    return np.clip(np.where(disc[..., None], lesion, skin), 0, 255).astype(np.uint8)


def isic2019_fixture(root: Path, images: int = 80, size: int = 32, seed: int = 0) -> dict:
    """ISIC 2019's layout under ``root`` (the dataset folder): ``ISIC_2019_Training_Input/ISIC_<7 digits>.jpg``,
    the ground-truth CSV (image + one-hot MEL..UNK, as floats) and the metadata CSV. -> {"names", "labels",
    "pixels_sha256": of every image as decoded, in name order}. 80 images is the fewest the FedIIC code accepts
    (its 10 % validation part must hold all 8 classes)."""
    import pandas as pd
    from PIL import Image

    if images < 80:
        raise ValueError(f"isic2019_fixture: {images} images; the FedIIC code needs at least 80 (its 10 % "
                         f"validation part must hold all 8 classes)")
    root = Path(root)
    (root / ISIC_IMAGES).mkdir(parents=True, exist_ok=True)
    labels = fixture_labels(images, seed)
    names = [f"ISIC_{9_000_000 + i:07d}" for i in range(images)]
    digest = hashlib.sha256()
    for i, (name, label) in enumerate(zip(names, labels)):
        pixels = fixture_image(int(label), np.random.default_rng([seed, 2, i]), size)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
        (root / ISIC_IMAGES / f"{name}.jpg").write_bytes(buffer.getvalue())
        with Image.open(io.BytesIO(buffer.getvalue())) as decoded:
            digest.update(np.asarray(decoded.convert("RGB")).tobytes())
    truth = pd.DataFrame({"image": names, **{c: (labels == k).astype(float) for k, c in enumerate(ISIC_CLASSES)},
                          "UNK": 0.0})
    truth.to_csv(root / ISIC_TRUTH, index=False)
    meta = pd.DataFrame({"image": names, "age_approx": 50.0, "anatom_site_general": "anterior torso",
                         "lesion_id": [f"BCN_{i:07d}" for i in range(images)], "sex": "female"})
    meta.to_csv(root / ISIC_META, index=False)
    return {"names": names, "labels": labels.tolist(), "pixels_sha256": digest.hexdigest()}


# ---- a stand-in for efficientnet_pytorch's ImageNet EfficientNet-B0 checkpoint --------------------------------

def standin_efficientnet_b0(seed: int = 0) -> dict:
    """A random EfficientNet-B0 state dict in ``efficientnet_pytorch``'s key layout (``_conv_stem.weight``,
    ``_blocks.<i>.*``, ``_fc.*`` for 1000 classes), what ``EfficientNet.from_pretrained('efficientnet-b0')`` loads
    from torch.hub's cache. Convolutions He-normal over their fan-out and linear layers uniform in +-1/sqrt(fan-in)
    (timm's TF EfficientNet initialisation), BatchNorm at identity, biases 0; each tensor from its own numpy PCG64
    stream keyed by (seed, position), so the same bytes on every machine."""
    import torch

    from ..models.encoders import create_timm
    from ..models.packaged import efficientnet_pytorch_names

    with torch.device("meta"):
        shapes = {k: v.shape for k, v in create_timm("tf_efficientnet_b0", num_classes=1000).state_dict().items()}
    state = {}
    for position, (key, shape) in enumerate(shapes.items()):
        rng = np.random.default_rng([seed, 3, position])
        leaf = key.rsplit(".", 1)[-1]
        if leaf == "num_batches_tracked":
            value = np.zeros((), dtype=np.int64)
        elif leaf in ("running_mean", "bias"):
            value = np.zeros(shape, dtype=np.float32)
        elif leaf == "running_var" or (leaf == "weight" and len(shape) == 1):
            value = np.ones(shape, dtype=np.float32)
        elif len(shape) == 4:       # conv: fan-out = k x k x out / groups (groups = in for a depthwise conv)
            groups = shape[0] if shape[1] == 1 else 1
            fan_out = shape[2] * shape[3] * shape[0] // groups
            value = rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_out))
        else:                       # linear
            bound = 1.0 / np.sqrt(shape[1])
            value = rng.uniform(-bound, bound, shape).astype(np.float32)
        state[key] = torch.from_numpy(np.ascontiguousarray(value))
    return dict(zip(efficientnet_pytorch_names(list(state)), state.values()))


def state_sha256(state: dict) -> str:
    """SHA-256 over a state dict's keys, dtypes, shapes and bytes, in key order."""
    digest = hashlib.sha256()
    for key, value in state.items():
        value = value.detach().cpu().contiguous()
        digest.update(f"{key}:{value.dtype}:{tuple(value.shape)};".encode())
        digest.update(value.numpy().tobytes())
    return digest.hexdigest()
