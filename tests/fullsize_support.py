"""The full-size smoke test's machinery: every distinct combination the full grid resolves, built at its
real architecture with random weights and driven through the project's own jobs on a tiny synthetic
federation (tests/test_fullsize.py; benchmarks/fullsize_smoke.py writes the table in docs/fullsize.md).

- :func:`combinations` reads config/config.yaml (``fedrepro.config.load_project``) and keeps one run per
  distinct (paper, algorithm and its params, model block, input kind, client evaluation, optimizer and
  sampler): seeds, settings, dataset names, paths, round/step counts, batch sizes and optimiser numbers
  change no code path and no shape and are left out. Each combination keeps its representative run's
  dataset, so its real class count, captions and image pipeline.
- :func:`smoke_run` turns that run into one round of ``local_steps`` local steps on a synthetic
  federation: the pretrained weights off (random init: ``pretrained: none/false``; FedDRA's text tower
  from its shipped architecture with the ``generated`` tokenizer), so nothing is downloaded, and every
  shape real: image files larger than the first resize go through the family's own transforms, the
  model's real widths, heads, class count and token length.
- :func:`run_combination` writes that federation as files (images, manifest, split, and for runs on
  cached features the feature cache built by the ``features`` job's own function), then runs
  :func:`fedrepro.train.train_run`, the ``train`` job (rounds, local training, aggregation, evaluation
  of every client and the global set, selection, checkpoint), inside
  :func:`fedrepro.models.depth.depth_limit` (``depth``: blocks per stack; None = full depth), in a
  forked process, and measures it: seconds, peak RSS, parameters trained and communicated.
- :func:`architectures` picks one combination per distinct architecture (encoder, input size, text
  tower) for the full-depth pass.
"""

from __future__ import annotations

import copy
import importlib
import json
import multiprocessing
import multiprocessing.connection
import os
import shutil
import time
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"train": 4, "val": 2, "test": 2}       # per client
CLIENTS = 2
GLOBAL_TEST, REFERENCE = 4, 4
IMAGE_SIZE = (288, 256)                          # width x height: larger than every first resize but the 336-px one
CAPTION_WORDS = ("left", "right", "pleural", "effusion", "mild", "pulmonary", "edema", "stable", "since", "prior",
                 "exam", "with", "small", "heart", "size", "normal", "no", "acute", "cardiopulmonary", "process")


@dataclass(frozen=True)
class Combination:
    name: str              # <paper>-<method variant>[-<setting>]
    paper: str
    setting: str
    method: str            # the method variant of the paper file
    algorithm: str
    family: str
    architecture: str
    classes: int
    input: str


@lru_cache(maxsize=2)
def project(numerics: str = "fast"):
    """The full grid under ``numerics``: the fast ones by default, whose precision on the CPU is fp32 (the authors'
    fp16 CLIP runs matmuls about 100 times slower on a CPU than fp32; ``numerics="authors"`` on a GPU)."""
    from fedrepro.config import load_project

    return load_project([ROOT / "config/config.yaml"], {"numerics": numerics}, root=ROOT)


def architecture(model: dict) -> str:
    """What is built, at which input size: the encoder(s), not the method's additions."""
    if "encoder" in model:
        from fedrepro.models.decoding import clip_image_size

        enc = model["encoder"]
        return f"CLIP {enc['name']} {enc.get('image_size') or clip_image_size(enc['name'])}px"
    if model["family"] == "vlp":
        image, text = model["image"], model["text"]
        return f"{image['backbone']} {image['image_size']}px + {text['name']} ({text['layers'] or 'all'} layers)"
    return f"{model['backbone']} {model['image_size']}px" + (f" {model['in_chans']}ch" if model.get("in_chans", 3) != 3 else "")


def _identity(run: dict) -> str:
    from fedrepro.io import hash_obj

    train = run["train"]
    return hash_obj([run["paper"], run["algorithm"], train["model"], run["input"], train.get("client_eval"),
                     train["optimizer"]["name"], train["optimizer"].get("persist"), train["local"].get("sampler")])


def combinations() -> list[Combination]:
    """Every distinct combination of the full grid, in a stable order."""
    from fedrepro.registry import dataset

    proj = project()
    seen: dict[str, tuple] = {}
    for key in proj.plan.runs():
        run = proj.resolver.run_config(key)
        seen.setdefault(_identity(run), (key, run))
    names: dict[str, int] = {}
    for key, _ in seen.values():
        names[f"{key.paper}-{key.method}"] = names.get(f"{key.paper}-{key.method}", 0) + 1
    out = []
    for key, run in seen.values():
        name = f"{key.paper}-{key.method}" + (f"-{key.setting}" if names[f"{key.paper}-{key.method}"] > 1 else "")
        model = run["train"]["model"]
        out.append(Combination(name, key.paper, key.setting, key.method, run["algorithm"]["name"], model["family"],
                               architecture(model), len(dataset(run["dataset"]).classes), run["input"]))
    return sorted(out, key=lambda c: c.name)


FAMILY_ORDER = ("clip_full", "vlp", "adapter_protonet", "proj_classifier", "classifier", "clip_lora", "clip_prompt",
                "clip_fam_images", "clip_adapter_images", "clip_fam", "clip_adapter")


def architectures(combos: list[Combination] | None = None) -> list[Combination]:
    """One combination per distinct architecture: the one that trains the most of it (full fine-tuning
    first), preferring FedAvg, the plainest method."""
    best: dict[str, Combination] = {}
    for combo in combos or combinations():
        rank = (FAMILY_ORDER.index(combo.family), combo.algorithm != "fedavg", combo.name)
        current = best.get(combo.architecture)
        if current is None or rank < (FAMILY_ORDER.index(current.family), current.algorithm != "fedavg", current.name):
            best[combo.architecture] = combo
    return sorted(best.values(), key=lambda c: c.architecture)


def random_init(model: dict) -> dict:
    """The same model block with every pretrained weight off (nothing to download)."""
    out = copy.deepcopy(model)
    if "encoder" in out:
        out["encoder"]["pretrained"] = "none"
    if "pretrained" in out:
        out["pretrained"] = False
    if out["family"] == "vlp":
        out["image"]["pretrained"] = False
        out["text"].update(pretrained=False, tokenizer="generated")
    return out


SMOKE_SPLIT = {"kind": "smoke"}       # the spec the synthetic federation's split file records


def smoke_run(combo: Combination, workdir: Path, *, local_steps: int = 1, batch_size: int = 2,
              device: str = "cpu", protocol: str | None = None, numerics: str = "fast") -> dict:
    """The representative run of ``combo`` for one round on the synthetic federation in ``workdir``, under
    ``protocol`` if given, else the first configured, and ``numerics`` (``authors``: the authors' precision, e.g.
    CLIP's fp16 weights, and pixels)."""
    from fedrepro.data.partition import split_id_of
    from fedrepro.io import hash_obj
    from fedrepro.models.weights import weight_specs

    proj = project(numerics)
    key = proj.resolver.run_key(combo.paper, combo.setting, combo.method, proj.seeds[0], protocol)
    run = copy.deepcopy(proj.resolver.run_config(key))
    model = random_init(run["train"]["model"])
    assert weight_specs(model) == [], f"{combo.name}: random init still names pretrained weights"
    run["train"] = {**run["train"], "model": model, "rounds": 1, "eval_every": 1, "num_workers": 0,
                    "batch_size": min(run["train"]["batch_size"], batch_size),
                    "eval_batch_size": 8,
                    "local": {**run["train"]["local"], "steps": local_steps}}
    run["device"], run["threads"] = device, 0
    run["features"] = ({"key": "smoke", "encoder": model["encoder"]} if run["input"] == "features" else None)
    run["paths"] = {**run["paths"], "raw_dir": str(workdir / "raw"), "manifest": str(workdir / "manifest.csv"),
                    "split": str(workdir / "split.json"), "images": None,
                    "features": str(workdir / "features.pt") if run["input"] == "features" else None,
                    "out": str(workdir / "out"), "checkpoints": str(workdir / "ckpt")}
    # the synthetic split (write_federation) is the run's own: a split file names the split it holds, and a run
    # refuses one that is not its split_id (train.check_own_split)
    run["split_id"] = split_id_of(run["dataset"], SMOKE_SPLIT, 0)
    run.pop("config_hash")
    run["config_hash"] = hash_obj(run)
    return run


def write_federation(run: dict, workdir: Path, seed: int = 0) -> None:
    """Images (RGB PNGs of IMAGE_SIZE: per-class colour + noise), a manifest with the dataset's real
    classes (and captions for image-text runs), and a split of CLIENTS clients with train/val/test parts,
    a global test set and an unlabeled reference set; labels cycle so every class appears."""
    import numpy as np
    from PIL import Image

    from fedrepro.data.manifest import make_manifest, write_manifest
    from fedrepro.data.partition import Split
    from fedrepro.io import sha256_file, write_json
    from fedrepro.registry import dataset

    classes = list(dataset(run["dataset"]).classes)
    rng = np.random.default_rng(seed)
    raw = Path(run["paths"]["raw_dir"])
    raw.mkdir(parents=True, exist_ok=True)
    colours = rng.integers(0, 256, size=(len(classes), 3))
    parts = [(f"client{c}", part, n) for c in range(CLIENTS) for part, n in SIZES.items()]
    parts += [("global", "test", GLOBAL_TEST), ("reference", "train", REFERENCE)]
    rows, owners, label = [], [], 0
    for owner, part, n in parts:
        for _ in range(n):
            width, height = IMAGE_SIZE
            pixels = np.clip(colours[label % len(classes)] + rng.normal(0, 40, size=(height, width, 3)), 0, 255)
            name = f"img{len(rows):03d}.png"
            Image.fromarray(pixels.astype(np.uint8)).save(raw / name)
            words = rng.choice(CAPTION_WORDS, size=int(rng.integers(60, 140)))   # reports longer than max_length
            rows.append({"path": name, "class_name": classes[label % len(classes)], "caption": " ".join(words)})
            owners.append((owner, part))
            label += 1
    manifest = make_manifest(rows, classes)
    index = {p: i for i, p in enumerate(manifest["path"])}
    rows_of = {}
    for row, owner in zip(rows, owners):
        rows_of.setdefault(owner, []).append(index[row["path"]])
    split = Split(clients={f"client{c}": {p: np.asarray(rows_of[(f"client{c}", p)]) for p in SIZES} for c in range(CLIENTS)},
                  global_test=np.asarray(rows_of[("global", "test")]), reference=np.asarray(rows_of[("reference", "train")]))
    write_manifest(run["paths"]["manifest"], manifest)
    write_json(run["paths"]["split"], {"dataset": run["dataset"], "spec": SMOKE_SPLIT, "seed": 0,
                                       "manifest_sha256": sha256_file(run["paths"]["manifest"]), **split.to_json()})


def cap_local_steps(steps: int) -> None:
    """Every client takes at most ``steps`` local steps per round, whatever its method's own step counts
    (e.g. FedDRA's stage1_steps): the engine's batch generator is cut short where methods import it."""
    import itertools
    import sys

    from fedrepro.fl import local

    original = local.local_batches

    def capped(*args, **kwargs):
        return itertools.islice(original(*args, **kwargs), steps)

    for name, module in list(sys.modules.items()):
        if name.startswith("fedrepro") and getattr(module, "local_batches", None) is original:
            module.local_batches = capped


def _measure(run: dict, depth: int | None, threads: int) -> dict:
    """In the child process: the feature cache (runs on cached features), then the train job."""
    import torch

    from fedrepro import train
    from fedrepro.models.depth import depth_limit
    from fedrepro.registry import dataset

    torch.set_num_threads(threads)
    cap_local_steps(run["train"]["local"]["steps"])
    captured = {}
    original = train.method_class

    def capturing(name):
        cls = original(name)

        class Captured(cls):          # the job's own method class; only remembers its instance
            def __init__(self, ctx):
                super().__init__(ctx)
                captured["method"] = self
        Captured.__name__ = Captured.__qualname__ = cls.__name__
        return Captured

    started = time.perf_counter()
    with depth_limit(depth):
        if run["input"] == "features":
            from fedrepro.features import build_feature_cache

            build_feature_cache(Path(run["paths"]["manifest"]), Path(run["paths"]["raw_dir"]),
                                list(dataset(run["dataset"]).class_texts), run["features"]["encoder"],
                                Path(run["paths"]["features"]), torch.device(run["device"]))
        train.method_class = capturing
        try:
            summary = train.train_run(run, run["paths"]["out"], run["paths"]["checkpoints"])
        finally:
            train.method_class = original
    seconds = time.perf_counter() - started
    method = captured["method"]
    model = getattr(method, "work", None) or method.server
    trained = sum(p.numel() for p in method.trainable_parameters(model) if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    history = __import__("pandas").read_csv(Path(run["paths"]["out"]) / "history.csv")
    gpu = torch.cuda.max_memory_allocated() / 2**30 if run["device"].startswith("cuda") else float("nan")
    return {
        "peak_gpu_gb": gpu,
        "precision": method.compute.precision,
        "seconds": seconds,
        "peak_rss_gb": train.peak_rss() / 2**30,         # since the job started (train_run resets the count)
        "params_total": int(total),
        "params_trained": int(trained),
        "params_communicated": float(summary["comm"]["params_per_client_round"]),
        "loss": float(history["loss"].iloc[-1]) if "loss" in history else float("nan"),
        "eval_keys": sorted(summary["eval"]),
        "task_metric": next((float(v) for k, v in summary["eval"].get("global", summary["eval"].get("clients_mean", {})).items()
                             if k in ("acc", "recall@1")), float("nan")),
        "checkpoint": (Path(run["paths"]["checkpoints"]) / "model.pt").is_file(),
    }


def _child(run, depth, threads, conn) -> None:
    try:
        conn.send(("ok", _measure(run, depth, threads)))
    except BaseException:   # noqa: BLE001 - everything goes back to the parent, which reports it
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def preload() -> None:
    """Import what every job imports, once, before forking (each child would otherwise pay seconds)."""
    import open_clip  # noqa: F401
    import timm  # noqa: F401
    from transformers import BertModel  # noqa: F401

    from fedrepro import features, train  # noqa: F401
    from fedrepro.registry import METHODS, MODELS

    METHODS.names(), MODELS.names()
    importlib.import_module("torch._dynamo")


@dataclass
class Started:
    """A combination's train job running in a forked process."""

    combo: Combination
    depth: int | None
    process: object
    conn: object
    started: float
    workdir: Path


def start_combination(combo: Combination, workdir: Path, *, depth: int | None = 2, threads: int = 1,
                      device: str = "cpu", **run_options) -> Started:
    """Write the synthetic federation and start the combination's train job in a forked process (its
    memory is measured alone and returned to the system afterwards)."""
    preload()
    workdir.mkdir(parents=True, exist_ok=True)
    run = smoke_run(combo, workdir, device=device, **run_options)
    write_federation(run, workdir)
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(run, depth, threads, child))
    process.start()
    child.close()
    return Started(combo, depth, process, parent, time.time(), workdir)


def finish_combination(job: Started, timeout: float = 1800) -> dict:
    """Wait for a started combination; -> measurements; raises with the child's traceback if it failed."""
    combo = job.combo
    if not job.conn.poll(max(0.0, timeout - (time.time() - job.started))):
        job.process.kill()
        shutil.rmtree(job.workdir, ignore_errors=True)
        raise TimeoutError(f"{combo.name}: no result within {timeout:.0f} s")
    try:
        status, payload = job.conn.recv()
    except EOFError:
        status, payload = "error", f"the process died (exit code {job.process.join() or job.process.exitcode}; out of memory?)"
    job.process.join()
    shutil.rmtree(job.workdir, ignore_errors=True)     # images, checkpoints: up to ~1 GB per combination
    if status != "ok":
        raise AssertionError(f"{combo.name} ({combo.architecture}, depth {job.depth or 'full'}) failed:\n{payload}")
    return {"combination": combo.name, "architecture": combo.architecture, "family": combo.family,
            "algorithm": combo.algorithm, "classes": combo.classes, "input": combo.input,
            "depth": job.depth or "full", **payload}


def run_combination(combo: Combination, workdir: Path, *, timeout: float = 1800, **options) -> dict:
    """:func:`start_combination` then :func:`finish_combination`."""
    return finish_combination(start_combination(combo, workdir, **options), timeout)


class Runner:
    """Runs combinations ``jobs`` at a time, in the order they are asked for (the tests' order), each
    in its own forked process started from this one: ``result(combo)`` keeps ``jobs`` running ahead."""

    def __init__(self, combos: list[Combination], workdir: Path, jobs: int = 1, timeout: float = 1800, **options):
        self.pending, self.workdir, self.jobs, self.timeout, self.options = list(combos), workdir, jobs, timeout, options
        self.running: dict[str, Started] = {}
        self.done: dict[str, dict | BaseException] = {}

    def _fill(self) -> None:
        while len(self.running) < self.jobs and self.pending:
            combo = self.pending.pop(0)
            try:
                self.running[combo.name] = start_combination(combo, self.workdir / combo.name, **self.options)
            except Exception as error:   # noqa: BLE001 - reported by the combination's own test
                self.done[combo.name] = error

    def result(self, combo: Combination) -> dict:
        if combo.name not in self.done and combo.name not in self.running and combo not in self.pending:
            self.pending.insert(0, combo)
        while combo.name not in self.done:
            self._fill()
            ready = multiprocessing.connection.wait([job.conn for job in self.running.values()], timeout=5)
            for name, job in list(self.running.items()):
                if job.conn in ready or time.time() - job.started > self.timeout:
                    del self.running[name]
                    try:
                        self.done[name] = finish_combination(job, self.timeout)
                    except Exception as error:   # noqa: BLE001
                        self.done[name] = error
        outcome = self.done.pop(combo.name)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def machine() -> str:
    """The CPU this ran on, its cores, and the torch build."""
    import platform

    import torch

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}"


def as_json(rows: list[dict]) -> str:
    return json.dumps(rows, indent=1)
