"""Decode an image once, at the size its pipeline shrinks it to.

Every image pipeline of the model families starts by resizing the decoded file: CLIP's preprocess
takes the shorter side to 224 (bicubic), FedIIC's evaluation the shorter side to 256, FedDRA's
``PadToSquare`` the longer side to 256, the fundus and ICH pipelines both sides to 224. A
:class:`DecodeSpec` names that first, deterministic resize; :func:`decode_image` applies it right
after reading the file, exactly as the pipeline's own first step would, so that the transform's first resize
then meets an image of exactly its target size, which it returns unchanged.

Under the authors' pixels (``train.model.pixels: authors``, the authors' numerics) the spec is what the authors'
first transform does, called as they call it (the tests check each against the official code):

- the library and interpolation of their resize: PIL's (torchvision's ``Resize`` on a PIL image) or OpenCV's
  ``cv2.resize`` with ``INTER_AREA`` and MGCA's ``int()`` sizes (FedDRA's ``resize_img``, ``library: cv2``);
- the order of the conversion to RGB: before the resize (``convert: before``; torchvision's ImageFolder loader,
  ``Image.open(...).convert("RGB")``), or after it (``convert: after``, CLIP's preprocess on ``Image.open``: the resize
  runs in the file's own mode, e.g. a palette PNG is resized nearest-neighbour, an RGBA one with its alpha);
- a pipeline that starts with a *random* crop (FedIIC's ``RandomResizedCrop(224, scale=(0.08, 1))``) or with a resize
  of float tensors (FedAdapterProto's) has no first resize to do at decode time: it gets the full-resolution image
  (``size`` None), read from the original file every epoch (a cache of it would be the dataset decoded in full).

The fast pixels (``pixels: fast``, the fast numerics) trade exactness for speed: a pipeline that starts with a
random crop pre-resizes the shorter side to ``RANDOM_CROP_FACTOR`` x the crop size (crops are taken from an image
at least twice the output resolution, cached once), every resize is PIL's, and the conversion to RGB comes first.

Independently of the pixels, two cheap wins on large files:

- JPEG's DCT scaling (PIL ``draft``, ``data.jpeg_draft``; on under the fast numerics) decodes a 2500 x 3000 X-ray at
  1/2 to 1/8 of its size directly, never materialising the full-size pixels (3-4x faster). It is a slightly
  different anti-aliasing than a full decode followed by the resize (benchmarks/numerics.py measures it);
- greyscale images stay one channel through the resize (an RGB conversion first triples the work);
  they are converted to RGB afterwards, which gives the same pixels.

The decode-once cache (:mod:`fedrepro.data.image_cache`) stores exactly what :func:`decode_image`
returns, and the uncached path calls the same function, so a pipeline reading the cache and one
reading the original files give the same tensors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image

INTERPOLATIONS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}
CV2_INTERPOLATIONS = ("area", "nearest", "bilinear", "bicubic")     # cv2.INTER_AREA, INTER_NEAREST, ...
SIDES = ("shorter", "longer", "square")
LIBRARIES = ("pil", "cv2")
CONVERTS = ("before", "after")
PIXELS = ("authors", "fast")
RANDOM_CROP_FACTOR = 2
GREY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")


@dataclass(frozen=True)
class DecodeSpec:
    """``size`` None: keep the decoded image as it is. Otherwise ``side`` says which side becomes
    ``size``: ``shorter`` (aspect kept; torchvision ``Resize(size)``), ``longer`` (aspect kept;
    MGCA's pad-to-square resize), ``square`` (``size x size``; torchvision ``Resize((size, size))``).
    ``library``: who resizes, PIL or OpenCV (``cv2.resize``; MGCA's ``int()`` sizes for ``longer``);
    ``convert``: to one channel / RGB before the resize, or after it (the resize in the file's own mode)."""

    size: int | None = None
    side: str = "shorter"
    interpolation: str = "bilinear"
    draft: bool = True            # JPEG DCT scaling before the resize (False: a full decode)
    library: str = "pil"
    convert: str = "before"

    def __post_init__(self):
        if self.side not in SIDES:
            raise ValueError(f"unknown decode side {self.side!r}; allowed: {list(SIDES)}")
        if self.library not in LIBRARIES:
            raise ValueError(f"unknown resize library {self.library!r}; allowed: {list(LIBRARIES)}")
        allowed = INTERPOLATIONS if self.library == "pil" else CV2_INTERPOLATIONS
        if self.interpolation not in allowed:
            raise ValueError(f"unknown {self.library} interpolation {self.interpolation!r}; allowed: {sorted(allowed)}")
        if self.convert not in CONVERTS:
            raise ValueError(f"unknown conversion order {self.convert!r}; allowed: {list(CONVERTS)}")
        if self.convert == "after" and self.library != "pil":
            raise ValueError("a resize in the file's own mode (convert: after) is PIL's")

    @property
    def key(self) -> str:
        """A file-name-safe name, e.g. ``shorter256-bilinear`` (``original`` without a resize; ``-cv2`` when OpenCV
        resizes, ``-native`` when the resize runs in the file's own mode, ``-full`` when JPEGs are decoded in full)."""
        if self.size is None:
            return "original"
        return (f"{self.side}{self.size}-{self.interpolation}" + ("-cv2" if self.library == "cv2" else "")
                + ("-native" if self.convert == "after" else "") + ("" if self.draft else "-full"))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict | None) -> "DecodeSpec":
        return cls(**(data or {}))

    @classmethod
    def from_key(cls, key: str) -> "DecodeSpec":
        if key == "original":
            return cls()
        head, interpolation, *flags = key.split("-")
        side = next((s for s in SIDES if head.startswith(s)), None)
        if side is None or flags != [f for f in ("cv2", "native", "full") if f in flags]:
            raise ValueError(f"not a decode key: {key!r}")
        return cls(int(head[len(side):]), side, interpolation, draft="full" not in flags,
                   library="cv2" if "cv2" in flags else "pil", convert="after" if "native" in flags else "before")

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after the resize, computed as torchvision / MGCA compute it."""
        if self.size is None:
            return width, height
        if self.side == "square":
            return self.size, self.size
        if self.side == "longer" and self.library == "cv2":   # MGCA's resize_img (mgca/datasets/utils.py): int()
            if height >= width:                               # "image is heigher" (a square one too)
                return int(float(width) * (self.size / float(height))), self.size
            return self.size, int(float(height) * (self.size / float(width)))
        if self.side == "longer":
            scale = self.size / max(width, height)
            return max(1, round(width * scale)), max(1, round(height * scale))
        if width <= height:   # torchvision's _compute_resized_output_size for an int size
            return self.size, int(self.size * height / width)
        return int(self.size * width / height), self.size

    def covers(self, other: "DecodeSpec") -> bool:
        """Whether images decoded with this spec are what ``other`` needs (the same spec)."""
        return self == other


def decode_image(path: str | Path, spec: DecodeSpec = DecodeSpec()) -> Image.Image:
    """Read ``path`` and apply ``spec``; -> a PIL image in mode ``L`` (greyscale) or ``RGB``.

    Raises whatever PIL raises for unreadable files (callers wrap it with the file's name)."""
    with Image.open(path) as image:
        mode = "L" if image.mode in GREY_MODES else "RGB"
        native = spec.convert == "after" and spec.size is not None
        target = spec.target_size(*image.size)   # from the file's own size, before any draft
        if spec.draft and spec.size is not None and image.format == "JPEG" \
                and target[0] < image.size[0] and target[1] < image.size[1]:
            image.draft(image.mode if native else mode, target)   # DCT scaling: the smallest 1/2^k scale still >= target
        image.load()
        if native:   # CLIP's preprocess: Resize on the image as Image.open gives it, the RGB conversion after the crop
            resized = image.resize(target, INTERPOLATIONS[spec.interpolation])
            return resized.convert(mode) if resized.mode != mode else resized
        decoded = image.convert(mode) if image.mode != mode else image.copy()
    if spec.size is None:
        return decoded
    if spec.library == "cv2":
        return cv2_resize(decoded, target, spec.interpolation)
    return decoded.resize(target, INTERPOLATIONS[spec.interpolation])


def cv2_resize(image: Image.Image, size: tuple[int, int], interpolation: str) -> Image.Image:
    """``image`` (L or RGB) resized to ``size`` (width, height) by OpenCV, as MGCA's ``resize_img`` calls it
    (``cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)``); OpenCV returns an image of its own size unchanged."""
    import cv2
    import numpy as np

    flag = {"area": cv2.INTER_AREA, "nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR,
            "bicubic": cv2.INTER_CUBIC}[interpolation]
    return Image.fromarray(cv2.resize(np.asarray(image), size, interpolation=flag), image.mode)


def as_rgb(image: Image.Image) -> Image.Image:
    return image if image.mode == "RGB" else image.convert("RGB")


# --------------------------------------------------------------------------------------------
# what a pipeline needs: the spec of its first resize

def spec_of(transform, pixels: str = "authors") -> DecodeSpec:
    """The :class:`DecodeSpec` of a transform pipeline's first step, for the ``pixels`` pipeline (authors | fast).

    A deterministic resize (torchvision ``Resize``, a pipeline's own object with a ``decode_spec``
    attribute, e.g. FedDRA's ``PadToSquare``) is applied at decode time, exactly; under the authors' pixels a
    pipeline that converts to RGB only after its resize (CLIP's preprocess) is resized in the file's own mode. A
    random crop first (``RandomResizedCrop`` / ``RandomCrop``): the full-resolution image under the authors' pixels,
    the shorter side pre-resized to ``RANDOM_CROP_FACTOR`` x its output size under the fast ones. Anything else (no
    transform, a pipeline on tensors): no resize.
    """
    from torchvision import transforms as T

    if pixels not in PIXELS:
        raise ValueError(f"unknown pixel pipeline {pixels!r}; allowed: {list(PIXELS)}")
    first = _first_step(transform, pixels)
    if first is None:
        return DecodeSpec()
    if hasattr(first, "decode_spec"):
        return first.decode_spec
    if isinstance(first, T.Resize):
        if first.max_size is not None:
            return DecodeSpec()
        size = first.size
        interpolation = _interpolation_name(first.interpolation)
        convert = "after" if pixels == "authors" and converts_after_resize(transform) else "before"
        if isinstance(size, int) or len(size) == 1:
            return DecodeSpec(size if isinstance(size, int) else size[0], "shorter", interpolation, convert=convert)
        if size[0] == size[1]:
            return DecodeSpec(size[0], "square", interpolation, convert=convert)
        return DecodeSpec()
    if isinstance(first, (T.RandomResizedCrop, T.RandomCrop)):
        if pixels == "authors":
            return DecodeSpec()
        crop = first.size if isinstance(first.size, int) else max(first.size)
        return DecodeSpec(RANDOM_CROP_FACTOR * crop, "shorter", "bilinear")
    return DecodeSpec()


def spec_of_views(transforms, pixels: str = "authors") -> DecodeSpec:
    """One spec for several views of the same image (FedIIC's two views): the largest of theirs."""
    specs = [spec_of(t, pixels) for t in transforms]
    if any(s.size is None for s in specs):
        return DecodeSpec()
    if len(set(specs)) == 1:
        return specs[0]
    sides = {s.side for s in specs}
    if sides == {"shorter"}:
        return DecodeSpec(max(s.size for s in specs), "shorter", "bilinear")
    return DecodeSpec()


def converts_after_resize(transform) -> bool:
    """Whether a pipeline converts its image to RGB only after its first resize, as CLIP's preprocess does
    (openai/CLIP ``clip/clip.py::_transform``: Resize, CenterCrop, ``_convert_image_to_rgb``; open_clip's
    ``MaybeConvertMode("RGB")``; our :class:`ToRGB`)."""
    from torchvision import transforms as T

    steps = flat_steps(transform)
    resized = False
    for step in steps:
        if isinstance(step, T.Resize):
            resized = True
        elif _is_rgb_conversion(step):
            return resized
    return False


class ToRGB:
    """A pipeline step that converts a PIL image to RGB where the authors' pipeline does (after CLIP's resize)."""

    def __call__(self, image: Image.Image) -> Image.Image:
        return as_rgb(image)

    def __repr__(self) -> str:
        return "ToRGB()"


def _is_rgb_conversion(step) -> bool:
    if isinstance(step, ToRGB):
        return True
    if type(step).__name__ == "MaybeConvertMode":          # open_clip 3's preprocess
        return getattr(step, "mode", None) == "RGB"
    name = getattr(step, "__name__", "")                    # OpenAI's _convert_image_to_rgb, open_clip 2's _convert_to_rgb
    return "convert" in name and "rgb" in name


def flat_steps(transform) -> list:
    """A pipeline's steps in order, nested ``Compose``s flattened."""
    from torchvision import transforms as T

    if isinstance(transform, T.Compose):
        return [s for t in transform.transforms for s in flat_steps(t)]
    return [transform]


def _first_step(transform, pixels: str):
    from torchvision import transforms as T

    while isinstance(transform, T.Compose):
        if not transform.transforms:
            return None
        transform = transform.transforms[0]
    views = getattr(transform, "views", None)
    if views is not None:
        return _ViewsSpec(spec_of_views(views, pixels))
    return transform


class _ViewsSpec:
    def __init__(self, spec: DecodeSpec):
        self.decode_spec = spec


def _interpolation_name(mode) -> str:
    name = getattr(mode, "value", str(mode)).lower()
    for known in INTERPOLATIONS:
        if known in name:
            return known
    raise ValueError(f"interpolation {mode!r} has no decode-time equivalent")
