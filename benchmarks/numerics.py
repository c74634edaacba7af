"""What the fast numerics change in what a model sees, per paper, on the CPU: the authors' pixels vs the fast ones.

The fast numerics (README "Numerics") change three things: bf16 autocast on a GPU (not measurable on a CPU:
benchmarks/train_step.py times it where there is a GPU), JPEG DCT scaling, and the pixel pipeline (random crops
from a decode-once cache at twice the crop size, PIL resizes, the RGB conversion first, PIL instead of float-tensor
ops for FedAdapterProto). This script measures the last two where they act: every image pipeline of every paper,
the same images through the authors' pixels (full JPEG decodes) and through the fast ones, random steps under the
same seed, and reports per pipeline

- mean and largest |difference| of the model's input, in grey levels (0-255, the normalisation undone), and the
  share of input values that differ;
- images per second per core through the project's dataset class, each way as a run reads them every epoch (a
  decode-once cache where the pipeline has one, the original files otherwise: the authors' random crops read them
  every epoch), and how fast the cache is built once (JPEG DCT scaling acts there).

Two data sources:

- ``evidence``: the evidence run's own data (config/evidence.yaml: Fashion-MNIST stand-ins, small PNGs), built
  offline into a scratch folder, through each paper's evidence pipelines. PNGs are never DCT-scaled: what differs
  there is the pixel pipeline alone.
- ``real-size``: the full grid's pipelines (config/config.yaml) on synthetic images at the real datasets' sizes
  (ISIC-like 1024 x 768 colour JPEGs, MIMIC-like 2500 x 3000 greyscale JPEGs, 512 x 512 fundus PNGs), once with
  everything fast and once with the authors' pixels but DCT-scaled JPEGs (``draft only``), which isolates JPEG
  decoding.

    python benchmarks/numerics.py                  # both, 48 images per pipeline (a few minutes on 2 cores)
    python benchmarks/numerics.py --only evidence --images 100
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from input_pipeline import synthetic_jpegs  # noqa: E402

from fedrepro.config import load_project  # noqa: E402
from fedrepro.data.decode import flat_steps, spec_of  # noqa: E402
from fedrepro.data.image_cache import ImageCache, build_image_cache  # noqa: E402
from fedrepro.data.images import ManifestImages  # noqa: E402
from fedrepro.data.loader import seed_item  # noqa: E402
from fedrepro.data.manifest import read_manifest, write_manifest  # noqa: E402

REAL_SIZE = [   # (images, paper, setting, method, what)
    ("ISIC", "facmic", "real", "fedavg", "FACMIC: CLIP ViT-B/16 preprocess"),
    ("ISIC", "faa_clip", "sc", "fedavg", "FAA-CLIP: Resize 224 x 224"),
    ("ISIC", "fediic", "isic", "fediic", "FedIIC: training views"),
    ("ISIC", "fediic", "isic", "fedavg", "FedIIC: evaluation"),
    ("MIMIC", "feddra", "mimic_a1", "feddra_convirt", "FedDRA: pad-to-square + crop"),
    ("FUNDUS", "fedadapterproto", "eyepacs_sites", "fedadapterproto", "FedAdapterProto: fundus"),
]
SIZES = {"ISIC": (1024, 768, "RGB"), "MIMIC": (2500, 3000, "L")}


def family_for(model: dict):
    """The model family of a run's model block, with random-init weights (the transforms do not depend on them)."""
    from fedrepro.models.families import build_family

    model = dict(model)
    if "encoder" in model:
        model["encoder"] = {**model["encoder"], "pretrained": "none"}
    if "pretrained" in model:
        model["pretrained"] = False
    return build_family(model, ["a", "b"], {})


def transforms_of(model: dict) -> dict:
    """part -> the transform a run of this model block builds (a frozen encoder's preprocessing for a family on
    cached features: what its feature cache is computed with)."""
    from fedrepro.config import input_kind
    from fedrepro.models.encoders import encoder_transform, load_open_clip

    if input_kind(model["family"]) == "features":
        encoder = {**model["encoder"], "pretrained": "none"}
        clip, preprocess, _ = load_open_clip(encoder["name"], "none")
        return {"features": encoder_transform(encoder, clip, preprocess)}
    family = family_for(model)
    return {"train": family.train_transform(), "eval": family.eval_transform()}


def unnormalised(transform, x: torch.Tensor) -> torch.Tensor:
    """The transform's output in [0, 1] (its last Normalize undone), to report differences in grey levels."""
    from torchvision import transforms as T

    views = getattr(transform, "views", None)
    steps = flat_steps(views[0] if views is not None else transform)
    norm = next((s for s in reversed(steps) if isinstance(s, T.Normalize)), None)
    if norm is None:
        return x
    shape = (-1, 1, 1)
    return x * torch.tensor(norm.std).view(shape) + torch.tensor(norm.mean).view(shape)


def dataset(folder: Path, manifest: pd.DataFrame, transform, pixels: str, draft: bool, work: Path):
    """The images as a run of these numerics reads them: a decode-once cache where the spec resizes, else the files
    -> (dataset, images per second of building the cache once, None without one)."""
    spec = replace(spec_of(transform, pixels), draft=draft)
    rows = np.arange(len(manifest))
    args = (folder, manifest["path"].tolist(), manifest["label"].to_numpy(), rows, transform)
    if spec.size is None:
        return ManifestImages(*args, decode=spec), None
    work.mkdir(parents=True, exist_ok=True)
    write_manifest(work / "m.csv", manifest)
    pixels_file = work / f"{spec.key}.u8"
    start = time.perf_counter()
    build_image_cache(work / "m.csv", folder, spec, pixels_file)
    built = len(manifest) / (time.perf_counter() - start)
    return ManifestImages(*args, decode=spec, cache=ImageCache(pixels_file, spec=spec)), built


def passes(data: ManifestImages) -> tuple[list[torch.Tensor], float]:
    """Every item under its own seed (the same random draws each way) -> (inputs, images per second)."""
    data[0]
    out, start = [], time.perf_counter()
    for i in range(len(data)):
        seed_item(i)
        out.append(data[i]["x"])
    return out, len(data) / (time.perf_counter() - start)


def compare(folder, manifest, authors_transform, fast_transform, work, fast_pixels="fast", fast_draft=True) -> dict:
    specs = f"{spec_of(authors_transform, 'authors').key} / {spec_of(fast_transform, fast_pixels).key}"
    authors_data, authors_build = dataset(folder, manifest, authors_transform, "authors", False, work / "authors")
    fast_data, fast_build = dataset(folder, manifest, fast_transform, fast_pixels, fast_draft,
                                    work / f"{fast_pixels}-{fast_draft}")
    authors_x, authors_rate = passes(authors_data)
    fast_x, fast_rate = passes(fast_data)
    diffs, shapes = [], 0
    for a, f in zip(authors_x, fast_x):
        if a.shape != f.shape:
            shapes += 1
            continue
        diffs.append(255 * (unnormalised(authors_transform, a) - unnormalised(fast_transform, f)).abs().flatten())
    d = torch.cat(diffs) if diffs else torch.zeros(1)
    return {"decode (authors / fast)": specs, "mean |Δ|": float(d.mean()), "max |Δ|": float(d.max()), "differ %": 100 * float((d > 1e-3).float().mean()),
            "other shape": shapes, "authors img/s": authors_rate, "fast img/s": fast_rate,
            "authors cache build img/s": "no cache" if authors_build is None else f"{authors_build:.0f}",
            "fast cache build img/s": "no cache" if fast_build is None else f"{fast_build:.0f}"}


def evidence_rows(images: int, scratch: Path) -> list[dict]:
    """Every paper's evidence pipelines on the evidence data (built offline into ``scratch``)."""
    from fedrepro.cli import main as cli

    authors = load_project([ROOT / "config/evidence.yaml"], root=ROOT)
    fast = load_project([ROOT / "config/evidence.yaml"], {"numerics": "fast"}, root=ROOT)
    raw, manifests = scratch / "raw", scratch / "manifests"
    with contextlib.redirect_stdout(sys.stderr):
        for name in authors.plan.datasets():
            cli(["download", name, "--raw-dir", str(raw)])
            cli(["prepare", name, "--raw-dir", str(raw), "--out", str(manifests / f"{name}.csv")])
    models, pipelines = set(), {}      # (paper, dataset, part, both transforms) -> [families]
    for key in authors.plan.runs():
        run = authors.resolver.run_config(key)
        model = run["train"]["model"]
        if (key.paper, run["dataset"], repr(model)) in models:
            continue
        models.add((key.paper, run["dataset"], repr(model)))
        fast_key = fast.resolver.run_key(key.paper, key.setting, key.method, key.seed, key.protocol)
        fast_transforms = transforms_of(fast.resolver.run_config(fast_key)["train"]["model"])
        for part, transform in transforms_of(model).items():
            signature = (key.paper, run["dataset"], part, repr(transform), repr(fast_transforms[part]))
            entry = pipelines.setdefault(signature, {"families": [], "transforms": (transform, fast_transforms[part])})
            entry["families"].append(model["family"])
    rows = []
    for (paper, name, part, _, _), entry in pipelines.items():
        manifest = read_manifest(manifests / f"{name}.csv")
        manifest = manifest.sample(min(images, len(manifest)), random_state=0).reset_index(drop=True)
        # manifest paths start with the dataset's folder
        stats = compare(raw, manifest, *entry["transforms"], scratch / "work" / f"{len(rows)}")
        rows.append({"data": "evidence", "paper": paper, "pipeline": f"{', '.join(dict.fromkeys(entry['families']))} ({part})",
                     "images": f"{name} ({len(manifest)})", **stats})
    return rows


def real_size_rows(images: int, scratch: Path) -> list[dict]:
    from PIL import Image

    authors = load_project([ROOT / "config/config.yaml"], root=ROOT)
    fast = load_project([ROOT / "config/config.yaml"], {"numerics": "fast"}, root=ROOT)
    made, rows = {}, []
    for size, paper, setting, method, what in REAL_SIZE:
        folder = scratch / size
        if size not in made:
            folder.mkdir(parents=True)
            if size == "FUNDUS":      # the fundus preparers store 512 x 512 PNGs
                rng = np.random.default_rng(0)
                frame = synthetic_jpegs(folder, images, 512, 512, "RGB")
                for name in frame["path"]:
                    array = np.asarray(Image.open(folder / name))
                    Image.fromarray(np.clip(array + rng.normal(0, 3, array.shape), 0, 255).astype(np.uint8)).save(
                        folder / name.replace(".jpg", ".png"))
                frame["path"] = frame["path"].str.replace(".jpg", ".png")
                made[size] = frame
            else:
                width, height, mode = SIZES[size]
                made[size] = synthetic_jpegs(folder, images, width, height, mode)
        model = authors.resolver.train_config(paper, setting, method, "clean")["model"]
        fast_model = fast.resolver.train_config(paper, setting, method, "clean")["model"]
        authors_t, fast_t = transforms_of(model), transforms_of(fast_model)
        for part in authors_t:
            if what.endswith("evaluation") and part != "eval" or what.endswith("views") and part != "train":
                continue
            work = scratch / "work" / f"real{len(rows)}"
            rows.append({"data": "real-size", "paper": paper, "pipeline": f"{what} ({part}): fast",
                         "images": f"{size} ({len(made[size])})",
                         **compare(folder, made[size], authors_t[part], fast_t[part], work)})
            if size != "FUNDUS":      # JPEG decoding alone: the authors' pixels, DCT-scaled
                rows.append({"data": "real-size", "paper": paper, "pipeline": f"{what} ({part}): draft only",
                             "images": f"{size} ({len(made[size])})",
                             **compare(folder, made[size], authors_t[part], authors_t[part], work, "authors", True)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=48, help="images per pipeline")
    parser.add_argument("--only", choices=("evidence", "real-size"), help="one of the two data sources")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "evidence"):
            rows += evidence_rows(args.images, Path(tmp) / "evidence")
        if args.only in (None, "real-size"):
            rows += real_size_rows(args.images, Path(tmp) / "real")
    table = pd.DataFrame(rows)
    print(table.to_markdown(index=False, floatfmt=".2f"))


if __name__ == "__main__":
    main()
