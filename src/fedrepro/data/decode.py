"""Decode an image once, at the size its pipeline shrinks it to.

Every image pipeline of the model families starts by resizing the decoded file: CLIP's preprocess
takes the shorter side to 224 (bicubic), FedIIC's evaluation the shorter side to 256, FedDRA's
``PadToSquare`` the longer side to 256, the fundus and ICH pipelines both sides to 224. A
:class:`DecodeSpec` names that first, deterministic resize; :func:`decode_image` applies it right
after reading the file, with two cheap wins on large files:

- JPEG's DCT scaling (PIL ``draft``) decodes a 2500 x 3000 X-ray at 1/2 to 1/8 of its size directly,
  never materialising the full-size pixels (3-4x faster). It is a slightly different anti-aliasing
  than a full decode followed by the resize (measured on the demo's brain MRIs: 0.3-1.6 grey levels
  mean absolute difference after a resize to 224); ``data.jpeg_draft: false`` decodes in full and
  gives the authors' pipelines' pixels exactly;
- greyscale images stay one channel through the resize (an RGB conversion first triples the work);
  they are converted to RGB afterwards, which gives the same pixels.

The decode-once cache (:mod:`fedrepro.data.image_cache`) stores exactly what :func:`decode_image`
returns, and the uncached path calls the same function, so a pipeline reading the cache and one
reading the original files give the same tensors; the transform's own first resize then meets an
image of exactly its target size, which PIL returns unchanged.

A pipeline that starts with a *random* crop (``RandomResizedCrop`` on the original, FedIIC's ISIC
views) has no deterministic first resize; :func:`spec_of` then pre-resizes the shorter side to
``RANDOM_CROP_FACTOR`` x the crop size, so crops are taken from an image at least twice the output
resolution instead of the original (the usual "resize, then crop" practice; documented in
docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image

INTERPOLATIONS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}
SIDES = ("shorter", "longer", "square")
RANDOM_CROP_FACTOR = 2
GREY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")


@dataclass(frozen=True)
class DecodeSpec:
    """``size`` None: keep the decoded image as it is. Otherwise ``side`` says which side becomes
    ``size``: ``shorter`` (aspect kept; torchvision ``Resize(size)``), ``longer`` (aspect kept;
    MGCA's pad-to-square resize), ``square`` (``size x size``; torchvision ``Resize((size, size))``)."""

    size: int | None = None
    side: str = "shorter"
    interpolation: str = "bilinear"
    draft: bool = True            # JPEG DCT scaling before the resize (False: a full decode)

    def __post_init__(self):
        if self.side not in SIDES:
            raise ValueError(f"unknown decode side {self.side!r}; allowed: {list(SIDES)}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"unknown interpolation {self.interpolation!r}; allowed: {sorted(INTERPOLATIONS)}")

    @property
    def key(self) -> str:
        """A file-name-safe name, e.g. ``shorter256-bilinear`` (``original`` without a resize;
        ``-full`` when JPEGs are decoded in full)."""
        if self.size is None:
            return "original"
        return f"{self.side}{self.size}-{self.interpolation}" + ("" if self.draft else "-full")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict | None) -> "DecodeSpec":
        return cls(**(data or {}))

    @classmethod
    def from_key(cls, key: str) -> "DecodeSpec":
        if key == "original":
            return cls()
        head, interpolation, *full = key.split("-")
        side = next((s for s in SIDES if head.startswith(s)), None)
        if side is None or full not in ([], ["full"]):
            raise ValueError(f"not a decode key: {key!r}")
        return cls(int(head[len(side):]), side, interpolation, draft=not full)

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after the resize, computed as torchvision / MGCA compute it."""
        if self.size is None:
            return width, height
        if self.side == "square":
            return self.size, self.size
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
        target = spec.target_size(*image.size)   # from the file's own size, before any draft
        if spec.draft and spec.size is not None and image.format == "JPEG" \
                and target[0] < image.size[0] and target[1] < image.size[1]:
            image.draft(mode, target)   # DCT scaling: decodes at the smallest 1/2^k scale still >= target
        image.load()
        decoded = image.convert(mode) if image.mode != mode else image.copy()
    return decoded if spec.size is None else decoded.resize(target, INTERPOLATIONS[spec.interpolation])


def as_rgb(image: Image.Image) -> Image.Image:
    return image if image.mode == "RGB" else image.convert("RGB")


# --------------------------------------------------------------------------------------------
# what a pipeline needs: the spec of its first resize

def spec_of(transform) -> DecodeSpec:
    """The :class:`DecodeSpec` of a transform pipeline's first step.

    A deterministic resize (torchvision ``Resize``, a pipeline's own object with a ``decode_spec``
    attribute, e.g. FedDRA's ``PadToSquare``) is applied at decode time, exactly. A random crop first
    (``RandomResizedCrop`` / ``RandomCrop``) pre-resizes the shorter side to ``RANDOM_CROP_FACTOR`` x its
    output size. Anything else (no transform, a tensor-only pipeline): no resize.
    """
    from torchvision import transforms as T

    first = _first_step(transform)
    if first is None:
        return DecodeSpec()
    if hasattr(first, "decode_spec"):
        return first.decode_spec
    if isinstance(first, T.Resize):
        if first.max_size is not None:
            return DecodeSpec()
        size = first.size
        interpolation = _interpolation_name(first.interpolation)
        if isinstance(size, int) or len(size) == 1:
            return DecodeSpec(size if isinstance(size, int) else size[0], "shorter", interpolation)
        if size[0] == size[1]:
            return DecodeSpec(size[0], "square", interpolation)
        return DecodeSpec()
    if isinstance(first, (T.RandomResizedCrop, T.RandomCrop)):
        crop = first.size if isinstance(first.size, int) else max(first.size)
        return DecodeSpec(RANDOM_CROP_FACTOR * crop, "shorter", "bilinear")
    return DecodeSpec()


def spec_of_views(transforms) -> DecodeSpec:
    """One spec for several views of the same image (FedIIC's two views): the largest of theirs."""
    specs = [spec_of(t) for t in transforms]
    if any(s.size is None for s in specs):
        return DecodeSpec()
    if len(set(specs)) == 1:
        return specs[0]
    sides = {s.side for s in specs}
    if sides == {"shorter"}:
        return DecodeSpec(max(s.size for s in specs), "shorter", "bilinear")
    return DecodeSpec()


def _first_step(transform):
    from torchvision import transforms as T

    while isinstance(transform, T.Compose):
        if not transform.transforms:
            return None
        transform = transform.transforms[0]
    views = getattr(transform, "views", None)
    if views is not None:
        return _ViewsSpec(spec_of_views(views))
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
