"""What checking read-back files costs: the digests of docs/cluster-and-cache.md ("Changed bytes are caught").

1. Image caches: a process checks every image against the CRC-32 its index recorded the first time it reads it.
   Images per second per core through the project's own dataset class and the three training transforms of
   ``input_pipeline.py`` (FACMIC Real, FedIIC ISIC, FedDRA MIMIC-CXR; synthetic JPEGs at real sizes): without the
   check, in a process's first epoch (every image checked) and in its later ones.
2. The alternative, hashing a whole image cache at every job start: the CRC-32 and SHA-256 rates of a file read
   back (through the page cache: a disk or network file system slower than that bounds it instead), and what they
   make of the grid's largest caches (sizes from the per-image bytes of part 1).
3. torch files (``resume.pt``, client states, ``model.pt``, feature caches): ``archive_damage`` (every member's
   CRC-32) beside ``torch.load`` of the same file, at a model's size (default 600 MB, a CLIP ViT-B/16 in fp32).

One process, one torch thread, figures per core:

    python benchmarks/read_back.py                       # 48 images per size, a 600 MB checkpoint
    python benchmarks/read_back.py --images 200 --checkpoint-mb 1800
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from input_pipeline import PIPELINES, SIZES, images_per_second, synthetic_jpegs, training_transform  # noqa: E402

from fedrepro.data.decode import spec_of  # noqa: E402
from fedrepro.data.image_cache import ImageCache, build_image_cache  # noqa: E402
from fedrepro.data.images import ManifestImages  # noqa: E402
from fedrepro.data.manifest import write_manifest  # noqa: E402
from fedrepro.io import archive_damage, torch_save  # noqa: E402

# images of the grid's largest datasets (docs/datasets.md), for part 2's whole-file estimate
LARGEST = {"ISIC": ("ISIC 2019", 25_331), "MIMIC": ("MIMIC-CXR-JPG", 377_110)}


def rate(path: Path, digest) -> float:
    """GB/s of ``digest(block)`` over the file, read in 1 MB blocks."""
    start = time.perf_counter()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest(block)
    return path.stat().st_size / (time.perf_counter() - start) / 1e9


def image_caches(folder: Path, images: int, repeats: int) -> dict[str, float]:
    """Part 1; -> kB per cached image, per size."""
    per_image, made = {}, {}
    for size, paper, setting, method, what in PIPELINES:
        width, height, mode = SIZES[size]
        where = folder / size
        if size not in made:
            where.mkdir()
            made[size] = synthetic_jpegs(where, images, width, height, mode)
            write_manifest(where / "manifest.csv", made[size])
        manifest = made[size]
        transform = training_transform(paper, setting, method)
        spec = spec_of(transform)
        build_image_cache(where / "manifest.csv", where, spec, where / f"{spec.key}.u8")
        common = (where, manifest["path"].tolist(), manifest["label"].to_numpy(), np.arange(len(manifest)), transform)
        def rate_of(cache) -> float:
            return images_per_second(ManifestImages(*common, decode=spec, cache=cache), 1)

        def unchecked() -> ImageCache:
            cache = ImageCache(where / f"{spec.key}.u8", spec=spec)
            cache.crc32 = None
            return cache

        rate_of(unchecked())                                      # page the file in: every variant reads it warm
        seen = ImageCache(where / f"{spec.key}.u8", spec=spec)
        rate_of(seen)                                             # its first epoch: every row now checked once
        trials = {"unchecked": [], "first": [], "later": []}
        for _ in range(repeats):                                  # interleaved, so a busy moment hits all three
            trials["unchecked"].append(rate_of(unchecked()))
            trials["first"].append(rate_of(ImageCache(where / f"{spec.key}.u8", spec=spec)))   # a fresh process's
            trials["later"].append(rate_of(seen))
        plain, first, later = (float(np.median(trials[k])) for k in ("unchecked", "first", "later"))
        rows = [seen.array(i) for i in range(len(manifest))]
        start = time.perf_counter()
        for _ in range(repeats):
            for row in rows:
                zlib.crc32(row)
        crc_us = (time.perf_counter() - start) / (repeats * len(rows)) * 1e6
        kb = seen.offsets[-1] / len(manifest) / 1e3
        per_image.setdefault(size, kb)
        print(f"{size}-size, {what} (cache {spec.key}, {kb:.0f} kB/image):")
        print(f"  unchecked               {plain:8.1f} images/s per core ({1e6 / plain:.0f} us/image)")
        print(f"  checked, first epoch    {first:8.1f} images/s per core; its CRC-32 {crc_us:.0f} us/image = "
              f"{100 * crc_us * plain / 1e6:.1f}% of an unchecked read")
        print(f"  checked, later epochs   {later:8.1f} images/s per core")
    return per_image


def whole_files(folder: Path, per_image: dict[str, float], gigabytes: float) -> None:
    """Part 2."""
    path = folder / "cache.u8"
    rng = np.random.default_rng(0)
    with open(path, "wb") as fh:
        for _ in range(int(gigabytes * 1024)):
            fh.write(rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
    crc = rate(path, zlib.crc32)
    sha = hashlib.sha256()
    sha_rate = rate(path, sha.update)
    print(f"whole file ({gigabytes:g} GB, read back): CRC-32 {crc:.2f} GB/s, SHA-256 {sha_rate:.2f} GB/s per core")
    for size, kb in per_image.items():
        name, count = LARGEST[size]
        total = kb * count / 1e6
        print(f"  {name}, {count:,} images at {kb:.0f} kB: {total:.1f} GB -> {total / crc:.0f} s (CRC-32) or "
              f"{total / sha_rate:.0f} s (SHA-256) at every job start, against none per row read")
    path.unlink()


def torch_files(folder: Path, megabytes: int) -> None:
    """Part 3."""
    path = folder / "model.pt"
    tensors = {f"layer{i}": torch.randn(megabytes * 2**20 // 4 // 64) for i in range(64)}
    torch_save(path, {"config_hash": "x", "model": tensors})
    del tensors
    start = time.perf_counter()
    assert archive_damage(path) is None
    check = time.perf_counter() - start
    start = time.perf_counter()
    torch.load(path, map_location="cpu", weights_only=False)
    load = time.perf_counter() - start
    print(f"torch file of {path.stat().st_size / 2**20:.0f} MB: archive_damage {check:.2f} s "
          f"({path.stat().st_size / check / 1e9:.2f} GB/s), torch.load {load:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=48, help="synthetic images per size")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved trials per variant (their median)")
    parser.add_argument("--whole-gb", type=float, default=1.0, help="size of the file part 2 hashes")
    parser.add_argument("--checkpoint-mb", type=int, default=600, help="size of part 3's torch file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        per_image = image_caches(Path(tmp), args.images, args.repeats)
        whole_files(Path(tmp), per_image, args.whole_gb)
        torch_files(Path(tmp), args.checkpoint_mb)


if __name__ == "__main__":
    main()
