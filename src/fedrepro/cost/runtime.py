"""What a run costs in device time, from a measured throughput table (:mod:`fedrepro.cost.throughput`), ours next
to the authors' way, and what each job asks SLURM for.

For one run, from its resolved config:

    seconds(run) = train images x (1 / train rate + extra forwards / eval rate) + eval images / eval rate

- train images = R x the participants' local work per round (``local.steps`` x ``batch_size`` per client, or
  ``local.epochs`` x the client's training images; Centralized trains the pooled data as one participant, K x
  the steps under ``budget: federation``: ``methods/centralized.py``); R = ``rounds``.
- eval images = E x every image not trained on (the clients' val/test parts, the global test and external
  sets), x2 for personalized methods (their client models score the global set too); E = rounds evaluated
  (every ``eval_every``-th and the last).
- extra forwards = the model copies a method keeps on the device beyond the server and the working copy
  (MOON's global and previous models, a BYOL target: ``FederatedMethod.memory_layout``), each a no-grad
  forward per training image.
- image counts from the split file where it exists, else ``benchmarks/dataset_sizes.csv`` (assumptions,
  labelled as such wherever they are used).
- rates per model family (:func:`fedrepro.cost.throughput.family_key`):
  ours: the run's precision (``auto`` = bf16 on a GPU), channels-last where the table has it (CNNs), the
  decode-once cache (train rate = min(step, loader)); a run on cached features trains at its head's rate,
  on a CPU in the workflow (the ``train`` rule asks no GPU for it), plus one pass of the frozen encoder per
  feature cache (fp32, decode-bound at the job's workers), counted once;
  the authors' way: fp32, the frozen encoder on every batch and every evaluation (1 / (1/encoder + 1/head)),
  the original files decoded every epoch by as many processes as the paper's code loads with
  (:data:`AUTHORS_LOADER_PROCESSES`: FACMIC's and FAA-CLIP's one, FedIIC's 4, FedDRA's 16, FedAdapterProto's 64; at
  most the measured node's CPUs) at the table's ``decode_img_s`` each.

A job's SLURM runtime is ``RUNTIME_MARGIN`` x its seconds + ``RUNTIME_OVERHEAD_MIN`` (start-up, weights check,
loading data, a checkpoint per round), rounded up to 5 minutes and at least ``MIN_RUNTIME_MIN``; its GPU memory
is the larger of the memory estimate (:mod:`fedrepro.cost.memory`) and ``GPU_MEMORY_MARGIN`` x the measured peak
of the family's step (scaled to the run's batch with the estimate's activations per sample) plus what the step
does not hold (the method's other model copies, the round's uploads) and the CUDA context. Without a table, or
where it lacks a family, a job asks for :data:`FALLBACK_RUNTIME`: guesses no measurement has confirmed.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from .throughput import Table, ThroughputError, family_key

RUNTIME_MARGIN = 1.5          # the rates are steady-state steps on synthetic batches; real data, stragglers
RUNTIME_OVERHEAD_MIN = 10     # start-up, the weights' SHA-256 check, loading the data, checkpoints
MIN_RUNTIME_MIN = 15
GPU_MEMORY_MARGIN = 1.2       # allocator fragmentation over a long run, evaluation batches
# minutes a job asks for where no throughput table gives its rate: unmeasured guesses
FALLBACK_RUNTIME = {"train_images": 720, "train_features": 15, "features": 120, "image_cache": 240,
                    "downstream": 60, "embed": 60}


# The data-loading processes of each paper's official code (DataLoader's num_workers; 0 = the main process: 1).
AUTHORS_LOADER_PROCESSES = {
    "facmic": 1,             # AIPMLab/FACMIC utils/prepare_data_dg_clip.py::getfeadataloader (num_workers left at 0)
    "faa_clip": 1,           # AIPMLab/FAA-CLIP utils/prepare_data_dg_clip.py::getfeadataloader (the same)
    "fediic": 4,             # wnn2000/FedIIC utils/local_training.py::LocalUpdate.__init__ (num_workers=4)
    "feddra": 16,            # BioMed-AI-Lab-U-Michgan/TMLR_FedDRA mgca/models/mgca/SLIA_module.py (--num_workers 16)
    "fedadapterproto": 64,   # berenslab/FedAdapterProto lib/update.py::LocalUpdate.train_val (num_workers=64)
}


@dataclass(frozen=True)
class AuthorsWay:
    """How the authors' code loads images: ``cores`` loader processes (None = the paper's own code's,
    :data:`AUTHORS_LOADER_PROCESSES`, at most the measured node's CPUs) at ``decode_img_s`` images/s each (None =
    the table's measured ``decode_img_s`` of the family's transform)."""

    cores: int | None = None
    decode_img_s: float | None = None

    def processes(self, paper: str, host_cpus: float) -> int:
        if self.cores:
            return self.cores
        wanted = AUTHORS_LOADER_PROCESSES.get(paper, 1)
        return int(min(wanted, host_cpus)) if not math.isnan(host_cpus) else wanted


# ---- image counts ----------------------------------------------------------------------------------

def _stamp(path: Path) -> tuple[int, int]:
    """What the caches below are keyed by besides the path: a rewritten file is read again."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


def dataset_sizes() -> dict[str, int]:
    """Images per dataset from ``benchmarks/dataset_sizes.csv`` (assumptions; {} where the file is not here)."""
    path = Path(paths.DATASET_SIZES)
    return _dataset_sizes(str(path.resolve()), _stamp(path)) if path.exists() else {}


@functools.lru_cache(maxsize=None)
def _dataset_sizes(path: str, stamp: tuple) -> dict[str, int]:
    with open(path, newline="") as fh:
        return {r["dataset"]: int(r["images"]) for r in csv.DictReader(line for line in fh if not line.startswith("#"))}


@functools.lru_cache(maxsize=None)
def _split_counts(split_file: str, stamp: tuple) -> tuple[tuple[int, ...], int]:
    data = json.loads(Path(split_file).read_text())
    train = tuple(len(c["train"]) for c in data["clients"].values())
    held = sum(len(c.get("val", [])) + len(c.get("test", [])) for c in data["clients"].values())
    return train, held + len(data.get("global_test", [])) + len(data.get("external", []))


@functools.lru_cache(maxsize=None)
def _manifest_rows(manifest: str, stamp: tuple) -> int:
    with open(manifest, newline="") as fh:
        return sum(1 for _ in csv.reader(fh)) - 1


def dataset_images(dataset: str) -> tuple[int | None, str]:
    """Images of a dataset (what a feature or image cache encodes): its manifest's rows, else the assumption."""
    manifest = Path(paths.manifest(dataset))
    if manifest.exists():
        return _manifest_rows(str(manifest.resolve()), _stamp(manifest)), "manifest"
    n = dataset_sizes().get(dataset)
    return n, "dataset_sizes.csv (assumption)" if n else f"unknown (no manifest, no row in {paths.DATASET_SIZES})"


def client_images(project, key, run: dict) -> tuple[list[int], int, str]:
    """(training images per client, images evaluated per evaluation, where the numbers come from)."""
    split_file = Path(run["paths"]["split"])
    if split_file.exists():
        train, held = _split_counts(str(split_file.resolve()), _stamp(split_file))
        return list(train), held, "split file"
    n = dataset_sizes().get(run["dataset"])
    if n is None:
        raise ThroughputError(f"{run['dataset']}: no split file ({split_file}) and no row in {paths.DATASET_SIZES} "
                              f"to count its images (add one, or build the split: snakemake --cores 1 {split_file})")
    from .memory import client_count

    spec = project.resolver.setting(key.paper, key.setting, key.protocol)["split"]
    clients = client_count(spec)
    ratio = (spec.get("ratios") or {}).get("train", 0.8)
    if spec.get("global_test", "none") != "none":
        ratio *= 0.8                 # a global test set is carved first (assumed a fifth of the data)
    train = int(n * ratio)
    return [train // clients] * clients, n - train, "dataset_sizes.csv (assumption)"


# ---- one run -----------------------------------------------------------------------------------------

@dataclass
class Work:
    train_images: int       # images through a training step, all rounds
    eval_images: int        # images scored, all evaluations
    extra_forwards: int     # no-grad forwards of other model copies per training image
    source: str             # where the image counts come from


def run_work(project, key, run: dict, profile: dict | None) -> Work:
    train = run["train"]
    per_client, held, source = client_images(project, key, run)
    algorithm = run["algorithm"]
    pooled = algorithm["name"] == "centralized"          # one participant: the pooled data (methods/centralized.py)
    local = train["local"]
    if "steps" in local:
        scale = len(per_client) if pooled and algorithm["params"].get("budget", "client") == "federation" else 1
        per_round = (1 if pooled else len(per_client)) * local["steps"] * scale * train["batch_size"]
    else:
        per_round = local.get("epochs", 1) * sum(per_client)
    rounds = train["rounds"]
    evaluated = len({r for r in range(1, rounds + 1) if r % train.get("eval_every", 1) == 0} | {rounds})
    from ..registry import method_class

    personalized = train.get("client_eval") == "local" or bool(getattr(method_class(algorithm["name"]), "personalized", False))
    layout = (profile or {}).get("layout") or {}
    extra = max(0, int(layout.get("device_models", 2)) - 2)
    return Work(rounds * per_round, evaluated * held * (2 if personalized else 1), extra, source)


@dataclass
class RunCost:
    key: object
    on_gpu: bool                     # the train rule asks a GPU for it (image runs)
    ours_s: float | None = None      # seconds on the table's device, ours
    authors_s: float | None = None   # the authors' way
    cache: tuple | None = None       # (dataset, features key) of its feature cache
    cache_s: float | None = None     # one pass of the frozen encoder over that dataset
    source: str = ""
    missing: list[str] = field(default_factory=list)   # why a figure could not be given


def _precision(table: Table, key: str, setting: str) -> str:
    wanted = {"auto": "bf16" if table.gpu else "fp32", "fp16_weights": "fp16"}.get(setting, setting)
    if wanted == "fp16" and table.row(key, wanted) is None:
        return "fp32"                # the authors' fp16 fine-tuning, where the table has no fp16 row
    return wanted


def _layout(train: dict) -> bool | None:
    setting = train.get("channels_last", "auto")
    return None if setting == "auto" else bool(setting)


def feature_cache_seconds(table: Table, encoder: str, images: int, workers: int) -> float:
    """One pass of the frozen encoder over ``images`` original files, decoded by ``workers`` processes."""
    key = f"encode:{encoder}"
    encode = table.value(key, "fp32", False, "eval_img_s")
    decode = table.value(key, "fp32", False, "decode_img_s") * max(1, workers)
    return images / min(encode, decode)


def run_cost(project, key, table: Table, authors: AuthorsWay = AuthorsWay(), profile: dict | None = None,
             cache_workers: int = 7) -> RunCost:
    """The cost of run ``key`` on ``table``'s device; a figure the table lacks is named in ``missing``."""
    run = project.resolver.run_config(key)
    train, model = run["train"], run["train"]["model"]
    cost = RunCost(key, run["input"] != "features")
    if profile is None:
        from .memory import ProfileError, model_profile

        try:
            profile = model_profile(run)
        except ProfileError as error:       # the time is still counted; what the method keeps is not
            profile = {"error": str(error)}
    try:
        work = run_work(project, key, run, profile)
    except ThroughputError as error:
        cost.missing.append(str(error))
        return cost
    cost.source = work.source
    fkey = family_key(model)
    precision, layout = _precision(table, fkey, train.get("precision", "auto")), _layout(train)

    def seconds(train_rate: float, eval_rate: float) -> float:
        return work.train_images * (1 / train_rate + work.extra_forwards / eval_rate) + work.eval_images / eval_rate

    try:
        ours_train = table.value(fkey, precision, layout, "train_img_s")
        ours_eval = table.value(fkey, precision, layout, "eval_img_s")
        if run["features"]:
            cost.cache = (run["dataset"], run["features"]["key"])
            images, where = dataset_images(run["dataset"])
            if images is None:
                raise ThroughputError(f"feature cache of {run['dataset']}: images {where}")
            cost.cache_s = feature_cache_seconds(table, model["encoder"]["name"], images, cache_workers)
        else:
            loader = (table.row(fkey, precision, layout) or {}).get("loader_img_s", math.nan)
            if not math.isnan(loader):
                ours_train = min(ours_train, loader)
        cost.ours_s = seconds(ours_train, ours_eval)
    except ThroughputError as error:
        cost.missing.append(str(error))
    try:
        head_train = table.value(fkey, "fp32", False, "train_img_s")
        head_eval = table.value(fkey, "fp32", False, "eval_img_s")
        source = f"encode:{model['encoder']['name']}" if run["features"] else fkey
        decode = authors.decode_img_s or table.value(source, "fp32", False, "decode_img_s")
        host_cpus = (table.row(source, "fp32", False) or {}).get("host_cpus", math.nan)
        loader = decode * authors.processes(key.paper, host_cpus)
        if run["features"]:          # no cache: the frozen encoder on every batch
            encode = table.value(source, "fp32", False, "eval_img_s")
            head_train, head_eval = 1 / (1 / encode + 1 / head_train), 1 / (1 / encode + 1 / head_eval)
        cost.authors_s = seconds(min(head_train, loader), min(head_eval, loader))
    except ThroughputError as error:
        cost.missing.append(str(error))
    return cost


def runtime_minutes(seconds: float) -> int:
    """The SLURM runtime (minutes) of a job measured at ``seconds``: margin, overhead, 5-minute steps."""
    minutes = seconds * RUNTIME_MARGIN / 60 + RUNTIME_OVERHEAD_MIN
    return max(MIN_RUNTIME_MIN, int(math.ceil(minutes / 5) * 5))


# ---- what a job asks SLURM for -----------------------------------------------------------------------

def requested_mb(measured_mb: float) -> int:
    """GPU memory to ask for a measured need: the margin on top, in steps of 100 MiB."""
    return int(math.ceil(measured_mb * GPU_MEMORY_MARGIN / 100) * 100)


def _eval_peak_request(row: dict | None) -> int:
    """A forward-only job's GPU memory: its measured evaluation peak + the CUDA context, with the margin (0: not
    measured)."""
    from .memory import CUDA_CONTEXT, MiB

    peak = (row or {}).get("eval_peak_gpu_mb", math.nan)
    return 0 if math.isnan(peak) else requested_mb(peak + CUDA_CONTEXT / MiB)


@dataclass
class Request:
    runtime: int                 # minutes (the rules multiply it by the attempt)
    gpu_mem_mb: int              # 0 = not requested
    measured: bool               # derived from a measured throughput table
    why: str = ""


def measured_gpu_mb(table: Table, run: dict, est) -> float | None:
    """MiB a run needs on the GPU by the measured peak of its family's step (None: not measured): the peak at
    the table's batch, moved to the run's batch by the estimate's activations per sample, plus what a plain
    step does not hold (``Estimate.beyond_step``) and the CUDA context."""
    from .memory import ACTIVATION_MARGIN, CUDA_CONTEXT, HALF_ACTIVATIONS, MiB

    train = run["train"]
    fkey = family_key(train["model"])
    precision = _precision(table, fkey, train.get("precision", "auto"))
    row = table.row(fkey, precision, _layout(train))
    if row is None or math.isnan(row.get("peak_gpu_mb", math.nan)):
        return None
    per_sample = (est.profile.get("activation") or {}).get("per_sample", 0)
    half = HALF_ACTIVATIONS if precision != "fp32" else 1.0
    batch = row.get("batch", math.nan)
    shift = per_sample * half * ACTIVATION_MARGIN * (train["batch_size"] - batch) if not math.isnan(batch) else 0
    evaluation = row.get("eval_peak_gpu_mb", math.nan)
    peak = max(row["peak_gpu_mb"] * MiB + shift, 0 if math.isnan(evaluation) else evaluation * MiB)
    return (peak + est.beyond_step + CUDA_CONTEXT) / MiB


def train_request(project, key, est, table: Table | None) -> Request:
    """Runtime and GPU memory of run ``key``'s train job (``est``: its memory estimate as planned)."""
    run = project.resolver.run_config(key)
    if run["input"] == "features":
        return Request(FALLBACK_RUNTIME["train_features"], 0, False,
                       "runs on cached features train on a CPU; no GPU table gives a CPU's rate")
    guess = Request(FALLBACK_RUNTIME["train_images"], est.gpu_mb(), False)
    if table is None:
        return guess
    cost = run_cost(project, key, table, profile=est.profile)
    if cost.ours_s is None:
        guess.why = "; ".join(cost.missing)
        return guess
    measured = measured_gpu_mb(table, run, est)
    gpu = est.gpu_mb() if measured is None else max(est.gpu_mb(), requested_mb(measured))
    return Request(runtime_minutes(cost.ours_s), gpu, True, table.path)


def features_request(table: Table | None, dataset: str, encoder: dict, workers: int) -> Request:
    guess = Request(FALLBACK_RUNTIME["features"], 0, False)
    if table is None:
        return guess
    images, where = dataset_images(dataset)
    if images is None:
        guess.why = f"{dataset}: images {where}"
        return guess
    try:
        seconds = feature_cache_seconds(table, encoder["name"], images, workers)
    except ThroughputError as error:
        guess.why = str(error)
        return guess
    gpu = _eval_peak_request(table.row(f"encode:{encoder['name']}", "fp32", False))
    return Request(runtime_minutes(seconds), gpu, True, table.path)


def image_cache_request(table: Table | None, dataset: str, workers: int) -> Request:
    """The decode-once cache job (a CPU job): the table's slowest measured cache-building rate per process
    (taken on the GPU node's CPUs, on 1024 x 768 JPEGs: larger images decode slower)."""
    guess = Request(FALLBACK_RUNTIME["image_cache"], 0, False)
    rates = [r["cache_img_s"] for r in (table.rows.values() if table else []) if not math.isnan(r.get("cache_img_s", math.nan))]
    images, where = dataset_images(dataset)
    if not rates or images is None:
        guess.why = "no cache_img_s in the table" if table and not rates else (f"images {where}" if table else "")
        return guess
    return Request(runtime_minutes(images / (min(rates) * max(1, workers))), 0, True, table.path)


def downstream_request(table: Table | None, job: dict | None) -> Request:
    """A downstream evaluation (``job``: its config): one pass of the pre-trained image tower over the downstream
    images from the table; the heads and decoders it trains are not measured, so never below the guess."""
    guess = Request(FALLBACK_RUNTIME["downstream"], 0, False)
    if table is None or job is None:
        return guess
    train = job["run"]["train"]
    fkey = family_key(train["model"])
    precision = _precision(table, fkey, train.get("precision", "auto"))
    guess.gpu_mem_mb = _eval_peak_request(table.row(fkey, precision, _layout(train)))   # known without the images
    images, where = dataset_images(job["spec"]["dataset"])
    try:
        if images is None:
            raise ThroughputError(f"{job['spec']['dataset']}: images {where}")
        rate = table.value(fkey, precision, _layout(train), "eval_img_s")
    except ThroughputError as error:
        guess.why = str(error)
        return guess
    return Request(max(guess.runtime, runtime_minutes(images / rate)), guess.gpu_mem_mb, True, table.path)
