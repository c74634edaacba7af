"""Reading images listed in a manifest, with clear errors for unreadable files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

from .decode import DecodeSpec, as_rgb, decode_image


class CorruptImageError(OSError):
    def __init__(self, path: Path, reason: str):
        super().__init__(f"cannot read image {path}: {reason}. Replace or remove the file, or set "
                         f"data.corrupt_images: skip to leave such files out (they are listed in a report).")
        self.path = path


def load_rgb(path: Path, spec: DecodeSpec = DecodeSpec()) -> Image.Image:
    """The image at ``path`` decoded with ``spec`` (:func:`fedrepro.data.decode.decode_image`), as RGB;
    an unreadable file raises :class:`CorruptImageError` naming it."""
    try:
        return as_rgb(decode_image(path, spec))
    except FileNotFoundError:
        raise CorruptImageError(path, "file not found") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise CorruptImageError(path, f"{type(exc).__name__}: {exc}") from None


def _check(raw_root: Path, rel: str) -> tuple[str, str] | None:
    try:
        load_rgb(raw_root / rel)
        return None
    except CorruptImageError as exc:
        return rel, str(exc).split(": ", 1)[1].split(". Replace")[0]


def find_corrupt(raw_root: Path, paths: Sequence[str], progress: bool = False, workers: int = 1) -> list[tuple[str, str]]:
    """Decode every image once (in ``workers`` processes); -> [(path, reason)] of those that fail."""
    from functools import partial

    from tqdm import tqdm

    check = partial(_check, Path(raw_root))
    bar = dict(desc="checking images", unit="img", total=len(paths), disable=not progress)
    if workers <= 1 or len(paths) < 1000:
        results = [check(p) for p in tqdm(paths, **bar)]
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            results = list(tqdm(pool.map(check, paths, chunksize=256), **bar))
    return [r for r in results if r is not None]


class ManifestImages:
    """A torch-style dataset over some manifest rows: item -> {"x": image tensor, "y": label, "index": row}.

    Each image is decoded with ``decode`` (the first resize of ``transform``, see
    :mod:`fedrepro.data.decode`), from the decode-once ``cache`` when one is given (indexed by manifest
    row), else from the original file; both give the same pixels, so the same tensors."""

    def __init__(self, raw_root: str | Path, paths: Sequence[str], labels: Sequence[int], rows: Sequence[int],
                 transform: Callable, extra: dict[str, Sequence] | None = None, *, decode: DecodeSpec = DecodeSpec(),
                 cache=None):
        self.raw_root = Path(raw_root)
        self.paths = list(paths)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.transform = transform
        self.extra = extra or {}
        self.decode, self.cache = decode, cache

    def __len__(self) -> int:
        return len(self.paths)

    def image(self, i: int) -> Image.Image:
        if self.cache is not None:
            return as_rgb(self.cache.image(int(self.rows[i])))
        return load_rgb(self.raw_root / self.paths[i], self.decode)

    def __getitem__(self, i: int) -> dict:
        item = {"x": self.transform(self.image(i)), "y": int(self.labels[i]), "index": int(self.rows[i])}
        for key, values in self.extra.items():
            item[key] = values[i]
        return item


def with_transform(dataset, transform):
    """A view of an image dataset with another transform (e.g. the deterministic eval transform for a
    pass over training images that must not be augmented); datasets without one are returned as they are."""
    if not hasattr(dataset, "transform"):
        return dataset
    view = copy.copy(dataset)
    view.transform = transform
    return view
