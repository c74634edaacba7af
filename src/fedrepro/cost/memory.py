"""How much host and GPU memory a run needs, estimated from its resolved config before it starts.

The estimate is a sum of named parts, each from the run's config (nothing is trained or loaded):

- the **model**, built on the ``meta`` device (shapes only, nothing allocated; pretrained weights are
  not read: the architecture is the same): total, trainable, communicated (shared) and private bytes, in
  fp32 (weights, gradients and optimizer states stay fp32 under mixed precision);
- what the **method** keeps (:meth:`fedrepro.fl.method.FederatedMethod.memory_layout`, a small hook with
  a generic default): model copies on the device (server, working copy, MOON's global and previous
  models, a BYOL target, PRR's deputy, ...) and per-client state (private parameters, persistent
  optimizer states, previous/personal models, local models for ``client_eval: local``);
- **clients**: per-client state x clients held in memory (``train.client_state: memory``), or one at a
  time (``disk``: :mod:`fedrepro.fl.client_state`); the round's uploads (each participant's shared
  tensors, kept until aggregation);
- **activations**: the bytes autograd saves for the backward pass, measured by running the family's
  forward on the meta device for batches of 2 and 4 (per sample = half the difference; the rest is fixed,
  e.g. CLIP's class prompts), x ``batch_size``, x ``HALF_ACTIVATIONS`` under bf16/fp16, x
  ``ACTIVATION_MARGIN`` for the backward's transient buffers; where the meta forward cannot run, the
  heuristic ``HEURISTIC_ACTIVATION`` bytes per input element (pixel x channel) per sample: the largest
  ratio measured this way on the grid's CNNs (ResNet-50 at 224 px saves ~1,180 bytes per input element,
  EfficientNet-B0 ~640), rounded up;
- **data**: a feature cache is loaded whole (counted twice: the cache and the clients' slices of it);
  decode-once image caches are memory-mapped (page cache the kernel can drop, not counted); each loader
  worker is a forked process with its own Python heap and prefetched batches;
- **runtime**: Python + torch + libraries (``HOST_BASE``), plus CUDA's host libraries and its context
  on the GPU when training on one.

Where the job runs on a GPU, model copies, gradients, optimizer states of the training client, uploads
and activations are GPU memory; per-client state, the checkpoint's copy of the model and the data are
host memory. On the CPU everything is host memory. Per-model figures are cached in
``resources/model_profiles/`` (``paths.model_profile``) so planning the DAG builds each model once; the key holds the
code of the method and the model family (:mod:`fedrepro.code_identity`), so changed code is profiled anew, and a model
that cannot be built is a :class:`ProfileError` naming the family and the error, never cached.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import paths
from ..fl.local import optimizer_factor
from ..io import hash_obj, write_json

GiB, MiB = 2**30, 2**20
HOST_BASE = int(1.5 * GiB)      # measured: 0.82 GB RSS after importing torch, open_clip, timm, transformers; ~1 GB at a tiny run's peak
CUDA_HOST = 2 * GiB              # host RSS CUDA's libraries (cuDNN, cuBLAS) add to a process that uses a GPU
CUDA_CONTEXT = int(0.75 * GiB)   # GPU memory of the CUDA context, cuDNN/cuBLAS workspaces, allocator slack
WORKER_BASE = 300 * MiB          # a forked loader worker: its own heap and copied-on-write pages
ACTIVATION_MARGIN = 1.5          # the backward's gradient buffers and allocator fragmentation on top
HALF_ACTIVATIONS = 0.6           # bf16/fp16: most saved activations are 16-bit, some stay fp32
EVAL_FRACTION = 0.25             # no_grad evaluation: only transient activations, ~a quarter of the saved ones
HEURISTIC_ACTIVATION = 1200      # saved bytes per input element (pixel x channel) per sample, see above
PROFILE_VERSION = 1


class InsufficientMemory(RuntimeError):
    """A run whose estimate exceeds the memory its job has; raised before anything is trained."""


@dataclass
class Estimate:
    run: str
    device: str                                   # "cuda" or "cpu": where the model computes
    host: dict[str, int] = field(default_factory=dict)
    gpu: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    profile: dict = field(default_factory=dict)
    # GPU bytes that one model's training step (what benchmarks/train_step.py measures) does not hold: the
    # method's other model copies, a frozen encoder kept beside the model, the round's uploads (fedrepro.cost)
    beyond_step: int = 0

    @property
    def host_bytes(self) -> int:
        return int(sum(self.host.values()))

    @property
    def gpu_bytes(self) -> int:
        return int(sum(self.gpu.values()))

    def host_mb(self) -> int:
        """MiB to request for the job (Snakemake's mem_mb), rounded up to 100."""
        return int(math.ceil(self.host_bytes / MiB / 100) * 100)

    def gpu_mb(self) -> int:
        return int(math.ceil(self.gpu_bytes / MiB / 100) * 100) if self.gpu else 0

    def lines(self) -> list[str]:
        out = [f"memory estimate of {self.run} (model on {self.device}):"]
        for title, parts, total in (("host", self.host, self.host_bytes), ("GPU", self.gpu, self.gpu_bytes)):
            if not parts:
                continue
            out.append(f"  {title}: {fmt(total)}")
            out += [f"    {name:<44} {fmt(value):>10}" for name, value in sorted(parts.items(), key=lambda kv: -kv[1])
                    if value]
        out += [f"  note: {note}" for note in self.notes]
        return out

    def to_json(self) -> dict:
        return {"device": self.device, "host_bytes": self.host_bytes, "gpu_bytes": self.gpu_bytes,
                "host": self.host, "gpu": self.gpu, "notes": self.notes}


def fmt(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


# ---- the model and the method, on the meta device ---------------------------------------------

def tensor_bytes(state: dict, keys=None) -> int:
    return int(sum(v.numel() * v.element_size() for k, v in state.items()
                   if isinstance(v, torch.Tensor) and (keys is None or k in keys)))


def module_bytes(module: torch.nn.Module | None) -> int:
    return tensor_bytes(module.state_dict()) if module is not None else 0


def meta_model_config(model: dict) -> dict:
    """The model block with every pretrained-weight switch off: the same architecture, no file read."""
    cfg = copy.deepcopy(model)
    if "pretrained" in cfg:
        cfg["pretrained"] = False
    if "encoder" in cfg:
        cfg["encoder"] = {**cfg["encoder"], "pretrained": "none"}
    for tower in ("image", "text"):
        if isinstance(cfg.get(tower), dict) and "pretrained" in cfg[tower]:
            cfg[tower] = {**cfg[tower], "pretrained": False}
    return cfg


def feature_dim(encoder: dict) -> int:
    """The embedding width of an open_clip encoder or a composite CLIP, from its config (no weights)."""
    from ..models import composite
    from ..models.encoders import _open_clip

    config = composite.config(encoder["name"]) or _open_clip().get_model_config(encoder["name"])
    if not config:
        raise ValueError(f"open_clip has no config {encoder['name']!r}")
    return int(config["embed_dim"])


class _Shell:
    """The federation a method is built against on the meta device: clients without data."""

    def __init__(self, class_names: list[str], clients: int, extras: dict):
        from ..fl.federation import ClientData, Federation

        self.fed = Federation([ClientData(f"client{i}", i, [], [], []) for i in range(clients)], None, None,
                              class_names, extras)


class ProfileError(RuntimeError):
    """A run's model or method that cannot be built on the meta device: the message names the model family, the
    method, the error and the line. Never cached: the next planning tries again (a fixed family is profiled anew)."""


def profile_key(run: dict) -> str:
    """What a profile depends on: the model block, the method and its params, the optimizer, ``client_eval``, the
    dataset, torch's version and the code of the method and the model family (:mod:`fedrepro.code_identity`), so a
    family or method whose code changed is profiled again."""
    from ..code_identity import component, fingerprint

    train = run["train"]
    code = {kind: fingerprint(component(kind, name))
            for kind, name in (("method", run["algorithm"]["name"]), ("model family", train["model"]["family"]))}
    return hash_obj({"v": PROFILE_VERSION, "model": train["model"], "algorithm": run["algorithm"],
                     "optimizer": train["optimizer"], "client_eval": train.get("client_eval"),
                     "dataset": run["dataset"], "torch": torch.__version__, "code": code}, 12)


_PROFILES: dict[str, dict] = {}
_FAILED: dict[str, ProfileError] = {}     # this process's failures (each said once, and never written to disk)


def model_profile(run: dict, cache: bool = True) -> dict:
    """Bytes of the run's model and of what its method keeps (see the module docstring); cached on disk. A model or
    method that cannot be built on the meta device raises :class:`ProfileError` and leaves nothing on disk."""
    key = profile_key(run)
    if cache and key in _PROFILES:
        return _PROFILES[key]
    if cache and key in _FAILED:
        raise _FAILED[key]
    path = Path(paths.model_profile(key))
    if cache and path.exists():
        try:
            profile = json.loads(path.read_text())
            if "error" not in profile:         # written by an earlier version, which cached its failures
                _PROFILES[key] = profile
                return profile
        except (OSError, ValueError):
            pass
    logging.disable(logging.WARNING)           # open_clip and timm narrate every build at INFO/WARNING
    try:
        profile = _build_profile(run)
    except Exception as error:    # noqa: BLE001 - any failure to build offline is the family's or method's, named
        failure = ProfileError(profile_failure(run, error))
        if cache:
            _FAILED[key] = failure
        raise failure from None
    finally:
        logging.disable(logging.NOTSET)
    if cache:
        _PROFILES[key] = profile
        try:
            write_json(path, profile)
        except OSError:
            pass
    return profile


def profile_failures(project, keys) -> dict[str, object]:
    """Each distinct failure to profile the runs ``keys`` of a project -> the first run it stops (``fedrepro validate``
    asks for the runs of plug-ins' methods and families, the workflow for every run it sizes)."""
    failures: dict[str, object] = {}
    for key in keys:
        try:
            model_profile(project.resolver.run_config(key))
        except ProfileError as error:
            failures.setdefault(str(error), key)
    return failures


def profile_failure(run: dict, error: BaseException) -> str:
    """Which model family and method could not be built on the meta device, the error and the line that raised it."""
    from ..registry import METHODS, MODELS

    family, method = run["train"]["model"]["family"], run["algorithm"]["name"]
    frames = traceback.extract_tb(error.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    first = str(error).splitlines()[0][:300] if str(error) else ""
    return (f"model family {family!r} ({MODELS.get(family).describe()}) with method {method!r} "
            f"({METHODS.get(method).describe()}) cannot be built on the meta device for the memory estimate: "
            f"{type(error).__name__}: {first}{at}. The estimate builds the family's model and calls the method's "
            f"build_model(), shared_keys() and memory_layout() without setup() (docs/plugins.md)")


def _build_profile(run: dict) -> dict:
    from ..fl.comm import CommLedger
    from ..fl.method import MethodContext
    from ..models.encoders import on_meta
    from ..models.families import build_family
    from ..registry import MODELS, dataset, method_class

    os.environ.setdefault("HF_HUB_OFFLINE", "1")        # an estimate never waits on a hub
    classes = list(dataset(run["dataset"]).classes)
    notes: list[str] = []
    model_cfg = meta_model_config(run["train"]["model"])
    kind = MODELS.get(model_cfg["family"])["input"]
    meta = torch.device("meta")
    with on_meta(), bert_base_when_offline(notes):
        extras = {}
        if kind == "features":
            extras["text_features"] = torch.empty(len(classes), feature_dim(model_cfg["encoder"]))
        family = build_family(model_cfg, classes, extras).to(meta)
        shell = _Shell(classes, 2, extras)
        shell_run = {**run, "train": {**run["train"], "model": model_cfg, "precision": "fp32", "client_state": "memory"}}
        ctx = MethodContext(shell_run, shell.fed, meta, CommLedger(), logging.getLogger("fedrepro.memory"))
        method = method_class(run["algorithm"]["name"])(ctx)
        method.family = family
        method.server = method.build_model().to(meta)
        method.shared = method.shared_keys()
        layout = method.memory_layout()
    state = method.server.state_dict()
    trainable = sum(p.numel() * p.element_size() for p in method.server.parameters() if p.requires_grad)
    frozen = family.frozen_modules()
    key = architecture_key(run["train"]["model"], method.server, len(classes))
    if key not in _ACTIVATIONS:      # the forward pass is the slow part: once per network, whichever method trains it
        _ACTIVATIONS[key] = _activations(family, method.server, kind, classes, extras)
    activation = _ACTIVATIONS[key]
    return {
        "family": model_cfg["family"], "input": kind,
        "params": int(sum(p.numel() for p in method.server.parameters())),
        "trainable_params": int(sum(p.numel() for p in method.server.parameters() if p.requires_grad)),
        "model_bytes": tensor_bytes(state), "trainable_bytes": int(trainable),
        "shared_bytes": tensor_bytes(state, set(method.shared)),
        "frozen": {where: int(sum(module_bytes(m) for m, w in frozen.values() if w == where)) for where in ("host", "device")},
        "layout": layout,
        "activation": activation,
        "convolutional": bool(sum(isinstance(m, torch.nn.Conv2d) for m in method.server.modules()) > 1),
        "notes": notes,
    }


@contextlib.contextmanager
def bert_base_when_offline(notes: list[str]):
    """A Hugging Face text tower whose config is not on this machine (no hub access, nothing cached) is
    counted as BERT-base (hidden 768, 12 heads, intermediate 3072; the ``layers`` option still applies):
    FedDRA's towers (bert-base-cased, Bio_ClinicalBERT) differ from it only in their vocabulary size."""
    try:
        from transformers import AutoConfig, BertConfig
    except ImportError:
        yield
        return
    original = AutoConfig.from_pretrained

    def from_pretrained(name, *args, **kwargs):
        try:
            return original(name, *args, **kwargs)
        except OSError:
            notes.append(f"text tower {name!r}: config not available offline, counted as BERT-base")
            return BertConfig(**kwargs)

    AutoConfig.from_pretrained = from_pretrained
    try:
        yield
    finally:
        AutoConfig.from_pretrained = original


_ACTIVATIONS: dict[str, dict] = {}


def architecture_key(model_cfg: dict, network: torch.nn.Module, classes: int) -> str:
    """What one training forward pass's saved activations depend on: the model block (the family's forward), the
    network's modules in order and every tensor's name, shape and dtype (a method's own heads or projectors change
    them), and the class count. Methods that train the same network (FedAvg, FedProx, FedNova, ...) share it."""
    modules = [type(m).__name__ for m in network.modules()]
    tensors = [(name, tuple(t.shape), str(t.dtype)) for name, t in network.state_dict().items()]
    return hash_obj([model_cfg, modules, tensors, classes])


def _activations(family, model, kind: str, classes: list[str], extras: dict) -> dict:
    """Bytes autograd saves in one training forward pass: {"per_sample", "fixed", "input": C x H x W or D}."""
    from PIL import Image

    if kind == "features":
        shape = (extras["text_features"].shape[1],)
    else:
        x = family.eval_transform()(Image.new("RGB", (64, 64)))
        shape = tuple(x.shape)
    saved = {}
    weights = {id(t) for t in (*model.parameters(), *model.buffers())}
    try:
        for n in (2, 4):              # BatchNorm needs two samples
            batch = {"x": torch.empty(n, *shape, device="meta"), "y": torch.zeros(n, dtype=torch.long),
                     "index": torch.arange(n)}
            if kind == "image_text":
                batch["caption"] = ["a chest x-ray report " * 20] * n
            total = [0]

            def pack(t, total=total):
                if id(t) not in weights and id(t._base) not in weights:   # weights are not activations
                    total[0] += t.numel() * t.element_size()
                return t

            model.train()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                family.forward(model, batch)
            saved[n] = total[0]
        per_sample = max(saved[4] - saved[2], 0) / 2
        return {"per_sample": int(per_sample), "fixed": int(max(saved[2] - 2 * per_sample, 0)), "input": list(shape),
                "measured": True}
    except Exception as error:   # noqa: BLE001 - data-dependent code cannot run on meta: the heuristic
        guess = int(HEURISTIC_ACTIVATION * math.prod(shape))
        return {"per_sample": guess, "fixed": 0, "input": list(shape), "measured": False,
                "why": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}


# ---- the estimate ------------------------------------------------------------------------------

def client_count(split: dict) -> int:
    """Clients of a split spec (a split file's own count wins where it exists: :func:`clients_of_file`)."""
    if split.get("per_source"):
        return len(split.get("sources", [])) * client_count(split["per_source"])
    if "clients" in split:
        return int(split["clients"])
    return max(1, len(split.get("sources", [])))


def clients_of_file(split_file: str | Path) -> int | None:
    try:
        return len(json.loads(Path(split_file).read_text())["clients"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def data_bytes(run: dict) -> tuple[int, str | None]:
    """Resident bytes of the run's data and a note when they are unknown."""
    if run["input"] == "features":
        features = Path(run["paths"]["features"] or "")
        if features.is_file():
            return 2 * features.stat().st_size, None     # the cache and the clients' slices of it
        return 0, f"feature cache {features} not built yet: its size is not counted"
    return 0, None


def estimate(run: dict, clients: int, device: str | torch.device | None = None, workers: int | None = None,
             profile: dict | None = None) -> Estimate:
    """The memory run ``run`` (a resolved run config) needs with ``clients`` clients on ``device``
    (default: where it would compute now; ``cuda`` for the plan of a GPU job)."""
    from ..device import resolve_device, resolve_precision

    train = run["train"]
    tag = f"{run['protocol']}/{run['paper']}/{run['setting']}/{run['method']}/seed{run['seed']}"
    if device is None:
        device = resolve_device(run.get("device", "auto"))
    device = torch.device(device) if not isinstance(device, torch.device) else device
    gpu = device.type == "cuda"
    est = Estimate(tag, device.type)
    try:
        profile = profile or model_profile(run)
    except ProfileError as error:
        profile = {"error": str(error)}
    est.profile = profile
    est.notes += profile.get("notes", [])
    if "error" in profile:          # the job still runs; its planned request is the workflow's fallback
        est.notes.append(f"{profile['error']}: the model's parts are not counted")
        est.host["runtime (Python, torch, libraries)"] = HOST_BASE + (CUDA_HOST if gpu else 0)
        return est

    precision = train.get("precision", "auto")
    precision = resolve_precision(precision, device) if precision != "auto" else ("bf16" if gpu else "fp32")
    model, trainable, shared = profile["model_bytes"], profile["trainable_bytes"], profile["shared_bytes"]
    layout = profile["layout"]
    opt = optimizer_factor(train["optimizer"]) * trainable
    act = profile["activation"]
    scale = HALF_ACTIVATIONS if precision in ("bf16", "fp16", "fp16_weights") else 1.0
    train_act = (act["per_sample"] * train["batch_size"] + act["fixed"]) * scale * ACTIVATION_MARGIN
    eval_act = (act["per_sample"] * train.get("eval_batch_size", 256) + act["fixed"]) * scale * EVAL_FRACTION
    if not act.get("measured", True):
        est.notes.append(f"activations: the forward pass could not run on the meta device ({act.get('why')}); "
                         f"heuristic of {HEURISTIC_ACTIVATION} bytes per input element per sample")

    compute = {
        "models (server, working copy, method copies)": layout["device_models"] * model,
        "frozen encoder": profile["frozen"]["device"],
        "gradients": trainable,
        "optimizer state of the training client": opt,
        "round uploads (participants x shared tensors)": clients * shared,
        "activations": int(max(train_act, eval_act)),
    }
    per_client = {name: int(b) for name, b in layout["per_client"].items() if b}
    mode = train.get("client_state", "auto")
    states = 0
    for name, b in per_client.items():
        on_disk = mode == "disk" or (mode == "auto" and b * clients > _auto_spill())
        states += b if on_disk else b * clients
    host = {
        "runtime (Python, torch, libraries)": HOST_BASE + (CUDA_HOST if gpu else 0),
        "frozen encoder copy on the host": profile["frozen"]["host"],
        "checkpoint copy of the model": model + int(layout.get("host_extra", 0)),
        "per-client state" + (" (one client at a time on disk)" if mode == "disk" else ""): states,
    }
    data, note = data_bytes(run)
    host["data (feature cache)"] = data
    if note:
        est.notes.append(note)
    if run["input"] != "features":
        n = workers if workers is not None else _planned_workers(train)
        sample = 4 * math.prod(act["input"])
        host[f"loader workers ({n})"] = n * (WORKER_BASE + 4 * train["batch_size"] * sample)
        est.notes.append("decode-once image caches are memory-mapped (reclaimable page cache): not counted")
    if gpu:
        est.gpu = {"CUDA context": CUDA_CONTEXT, **compute}
        est.beyond_step = int((layout["device_models"] - 1) * model + profile["frozen"]["device"] + clients * shared)
    else:
        host.update(compute)
    est.host = {k: int(v) for k, v in host.items()}
    est.gpu = {k: int(v) for k, v in est.gpu.items()}
    return est


def planned(project, key, workers: int | None = None, device: str | None = None) -> Estimate:
    """The estimate of run ``key`` of a project as its job is planned: image runs on a GPU (the train
    rule asks for one), feature-level runs on the CPU; clients from the split file where it exists,
    else from the setting's split spec."""
    run = project.resolver.run_config(key)
    split = project.resolver.setting(key.paper, key.setting, key.protocol)["split"]
    clients = clients_of_file(run["paths"]["split"]) or client_count(split)
    device = device or ("cpu" if run["input"] == "features" else "cuda")
    return estimate(run, clients, device, workers if run["input"] != "features" else 0)


def _auto_spill() -> int:
    from ..fl.client_state import AUTO_SPILL_BYTES

    return AUTO_SPILL_BYTES


def _planned_workers(train: dict) -> int:
    workers = train.get("num_workers", "auto")
    if workers == "auto":
        from ..data.loader import available_cpus

        return max(0, available_cpus() - 1)
    return int(workers)


# ---- what the job has, and the refusal -----------------------------------------------------------

def host_limit() -> tuple[int | None, str]:
    """The host memory this job may use: the smallest of SLURM's allocation, the cgroup limit and the
    memory the machine has available now (plus what this process already holds) -> (bytes, source)."""
    limits: list[tuple[int, str]] = []
    per_node = os.environ.get("SLURM_MEM_PER_NODE", "")
    if per_node.isdigit() and int(per_node) > 0:
        limits.append((int(per_node) * MiB, "SLURM_MEM_PER_NODE"))
    per_cpu, cpus = os.environ.get("SLURM_MEM_PER_CPU", ""), os.environ.get("SLURM_CPUS_ON_NODE", "")
    if per_cpu.isdigit() and cpus.isdigit() and int(per_cpu) > 0:
        limits.append((int(per_cpu) * int(cpus) * MiB, "SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE"))
    for cgroup in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = Path(cgroup).read_text().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < 2**60:
            limits.append((int(value), f"cgroup limit ({cgroup})"))
        break
    available = _meminfo("MemAvailable")
    if available:
        limits.append((available + _rss(), "available host memory (MemAvailable + this process)"))
    return min(limits) if limits else (None, "unknown")


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _rss() -> int:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def gpu_limit() -> int | None:
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return None


CHECK_VAR = "FEDREPRO_MEMORY_CHECK"   # "warn": log instead of refusing; "off": no check


def check_fits(est: Estimate, log: logging.Logger | None = None, host: tuple[int | None, str] | None = None,
               gpu: int | None = None) -> None:
    """Refuse (:class:`InsufficientMemory`) a run whose estimate exceeds what the job has."""
    log = log or logging.getLogger("fedrepro.train")
    setting = os.environ.get(CHECK_VAR, "on")
    if setting == "off":
        return
    host_bytes, source = host or host_limit()
    gpu_bytes = gpu if gpu is not None else (gpu_limit() if est.gpu else None)
    problems = []
    if host_bytes is not None and est.host_bytes > host_bytes:
        problems.append(f"host memory: needs ~{fmt(est.host_bytes)}, the job has {fmt(host_bytes)} ({source})")
    if est.gpu and gpu_bytes is not None and est.gpu_bytes > gpu_bytes:
        problems.append(f"GPU memory: needs ~{fmt(est.gpu_bytes)}, the GPU has {fmt(gpu_bytes)}")
    if not problems:
        return
    message = "\n".join([f"{est.run} does not fit its job:", *[f"  {p}" for p in problems], *est.lines(),
                         "what to change:", *[f"  - {a}" for a in advice(est, bool(est.gpu and gpu_bytes
                                                                                   and est.gpu_bytes > gpu_bytes))],
                         f"  - if the estimate is wrong for your machine: {CHECK_VAR}=warn (log only) or off"])
    if setting == "warn":
        log.warning("%s", message)
        return
    raise InsufficientMemory(message)


def advice(est: Estimate, gpu_short: bool) -> list[str]:
    out = []
    parts = est.gpu if gpu_short else est.host
    biggest = max(parts, key=parts.get) if parts else ""
    if not gpu_short:
        out.append(f"request more memory for the job: this estimate asks for mem_mb={est.host_mb()} "
                   f"(workflow/rules/train.smk derives it per run; --set-resources train:mem_mb=... overrides)")
        if "per-client state" in biggest and "disk" not in biggest:
            out.append("keep per-client state on disk between turns: train.client_state: disk")
    if "activations" in biggest or gpu_short:
        out.append("lower train.batch_size (activations grow with it) or use mixed precision "
                   "(train.precision: bf16)")
    if gpu_short:
        out.append(f"run on a GPU with more memory (this run needs ~{fmt(est.gpu_bytes)}; the slurm profile's "
                   f"gpu_mem_mb resource carries it)")
    return out
