"""The decode-once image cache: every image of a dataset, decoded and resized once, in one file.

Training reads each image once per epoch; decoding a 1024 x 768 JPEG costs ~8 ms and a 2500 x 3000
X-ray ~60 ms on one core, far more than the GPU spends on it. The cache stores, for one dataset and
one :class:`~fedrepro.data.decode.DecodeSpec`, exactly what :func:`~fedrepro.data.decode.decode_image`
returns for every manifest row, as uint8 pixels in one flat, memory-mapped array:

    resources/images/<dataset>/<spec key>.u8          raw uint8, every image's pixels back to back
    resources/images/<dataset>/<spec key>.index.npz   per row: offset, height, width, channels, the CRC-32
                                                      of its pixels; the manifest's SHA-256 and the spec

Augmentations still run per epoch on the cached images, so training is unchanged; the cached and
the uncached path give the same tensors (both go through ``decode_image``). A cache built from
another version of the manifest, or for another spec, is refused with the file's name; a truncated or corrupt
one is set aside and named with the command that rebuilds it. Every image is checked against the CRC-32 recorded
for it when the cache was built the first time a process reads it (a loader worker: in its first epoch), so a
byte changed on disk since stops the job instead of training on it. Hashing the whole multi-GB file at every
start would cost as much as reading it; a row is checked when it is first used (benchmarks/README.md).
"""

from __future__ import annotations

import json
import logging
import zipfile
import zlib
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image

from .. import records
from ..io import archive_damage, atomic_path, broken, sha256_file
from .decode import DecodeSpec, decode_image

log = logging.getLogger(__name__)


class StaleImageCache(RuntimeError):
    """The cache file does not belong to this manifest or this decode spec."""


def cache_paths(pixels: str | Path) -> tuple[Path, Path]:
    pixels = Path(pixels)
    return pixels, pixels.with_name(pixels.name.removesuffix(".u8") + ".index.npz")


def _decode_row(raw_root: Path, spec: DecodeSpec, rel: str) -> np.ndarray:
    from .images import CorruptImageError

    try:
        return np.asarray(decode_image(raw_root / rel, spec))
    except FileNotFoundError:
        raise CorruptImageError(raw_root / rel, "file not found") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise CorruptImageError(raw_root / rel, f"{type(exc).__name__}: {exc}") from None


def build_image_cache(manifest_path: str | Path, raw_root: str | Path, spec: DecodeSpec, out: str | Path,
                      workers: int = 1, progress: bool = False) -> dict:
    """Decode every manifest row with ``spec`` (in ``workers`` processes) into ``out`` (+ its index)."""
    from tqdm import tqdm

    from .manifest import read_manifest

    manifest = read_manifest(manifest_path)
    paths = manifest["path"].tolist()
    pixels_path, index_path = cache_paths(out)
    shapes = np.zeros((len(paths), 3), dtype=np.int32)
    offsets = np.zeros(len(paths) + 1, dtype=np.int64)
    crc32 = np.zeros(len(paths), dtype=np.uint32)
    decode = partial(_decode_row, Path(raw_root), spec)
    bar = dict(desc=f"decoding {Path(manifest_path).stem} ({spec.key})", unit="img", total=len(paths), disable=not progress)
    with atomic_path(pixels_path) as tmp:
        with open(tmp, "wb") as fh:
            if workers > 1 and len(paths) >= 64:
                with ProcessPoolExecutor(workers) as pool:
                    _write_all(fh, pool.map(decode, paths, chunksize=32), shapes, offsets, crc32,
                               tqdm(range(len(paths)), **bar))
            else:
                _write_all(fh, map(decode, paths), shapes, offsets, crc32, tqdm(range(len(paths)), **bar))
    meta = {"manifest_sha256": sha256_file(manifest_path), "spec": spec.to_json(), "rows": len(paths)}
    with atomic_path(index_path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, offsets=offsets, shapes=shapes, crc32=crc32, meta=np.array(json.dumps(meta, sort_keys=True)))
    records.write(pixels_path, [pixels_path, index_path], records.made_from(manifest_path), spec=spec.key)
    return meta


def image_cache_manifest(pixels: str | Path) -> str | None:
    """The SHA-256 of the manifest an image cache was built from (its index says); None without a readable index."""
    try:
        with np.load(cache_paths(pixels)[1]) as index:
            return json.loads(str(index["meta"])).get("manifest_sha256")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None


def _write_all(fh, arrays, shapes, offsets, crc32, counter) -> None:
    for i, (array, _) in enumerate(zip(arrays, counter)):
        channels = 1 if array.ndim == 2 else array.shape[2]
        shapes[i] = (array.shape[0], array.shape[1], channels)
        data = np.ascontiguousarray(array, dtype=np.uint8).tobytes()
        fh.write(data)
        crc32[i] = zlib.crc32(data)
        offsets[i + 1] = offsets[i] + len(data)


class ImageCache:
    """Read access to a built cache, by manifest row. The pixel file is memory-mapped lazily in each
    process that reads it (data-loader workers included), so forking never copies it."""

    def __init__(self, pixels: str | Path, manifest_sha256: str | None = None, spec: DecodeSpec | None = None):
        self.pixels_path, self.index_path = cache_paths(pixels)
        for path in (self.pixels_path, self.index_path):
            if not path.exists():
                raise FileNotFoundError(f"image cache {path} not found: build it with "
                                        f"`snakemake --cores all {self.pixels_path}` (or `fedrepro image-cache`)")
        self.rebuild = rebuild = f"snakemake --cores all {self.pixels_path}"
        damage = archive_damage(self.index_path)        # an .npz: its arrays carry CRC-32s too
        if damage:
            raise broken(self.index_path, f"not a readable image-cache index ({damage})", rebuild)
        try:
            with np.load(self.index_path) as index:
                self.offsets, self.shapes = index["offsets"], index["shapes"]
                self.crc32 = index["crc32"] if "crc32" in index.files else None
                self.meta = json.loads(str(index["meta"]))
            self.spec = DecodeSpec.from_json(self.meta["spec"])
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:   # truncated, not a cache
            raise broken(self.index_path, f"not a readable image-cache index ({type(error).__name__}: {error})",
                         rebuild) from None
        if self.crc32 is None:
            log.warning("%s was built by an earlier version, without a CRC-32 per image: its pixels cannot be "
                        "checked as they are read. Rebuild it to have them checked: snakemake --cores all "
                        "--forcerun %s", self.pixels_path, self.pixels_path)
        size = self.pixels_path.stat().st_size
        if len(self.offsets) != len(self.shapes) + 1 or size != int(self.offsets[-1]):
            raise broken(self.pixels_path, f"{size} bytes but its index {self.index_path.name} says "
                                           f"{int(self.offsets[-1])} ({len(self.shapes)} images): truncated or "
                                           f"replaced", rebuild)
        if manifest_sha256 is not None and self.meta["manifest_sha256"] != manifest_sha256:
            raise StaleImageCache(f"{self.pixels_path} was built from another version of the manifest "
                                  f"(SHA-256 {self.meta['manifest_sha256'][:12]}…, the manifest now "
                                  f"{manifest_sha256[:12]}…); rebuild it (snakemake --cores all --force {self.pixels_path})")
        if spec is not None and not self.spec.covers(spec):
            raise StaleImageCache(f"{self.pixels_path} holds images decoded as {self.spec.key}, but this "
                                  f"pipeline needs {spec.key}; build that cache instead")
        self._data = None
        self._checked = np.zeros(len(self.shapes), dtype=bool)    # rows this process has checked

    def __len__(self) -> int:
        return len(self.shapes)

    def __getstate__(self):   # never pickle the mapping itself (spawned workers re-open it)
        return {**self.__dict__, "_data": None}

    def array(self, row: int) -> np.ndarray:
        if self._data is None:
            self._data = np.memmap(self.pixels_path, dtype=np.uint8, mode="r") if self.offsets[-1] else np.zeros(0, np.uint8)
        h, w, c = (int(v) for v in self.shapes[row])
        flat = self._data[self.offsets[row]:self.offsets[row + 1]]
        if self.crc32 is not None and not self._checked[row]:
            if zlib.crc32(flat) != int(self.crc32[row]):
                raise broken(self.pixels_path, f"corrupt: the pixels of manifest row {row} do not match the CRC-32 "
                                               f"recorded when the cache was built (changed on disk since)",
                             self.rebuild)
            self._checked[row] = True
        return np.asarray(flat).reshape((h, w) if c == 1 else (h, w, c))

    def image(self, row: int) -> Image.Image:
        """The decoded image of manifest row ``row`` (mode ``L`` or ``RGB``), as decode_image returns it."""
        array = self.array(row)
        return Image.fromarray(array, "L" if array.ndim == 2 else "RGB")
