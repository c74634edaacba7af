"""Run manifests: everything needed to tell how a number was produced."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = ("fedrepro", "torch", "torchvision", "open_clip_torch", "timm", "transformers", "numpy", "pandas",
            "scikit-learn", "snakemake", "snakemake-executor-plugin-slurm", "dvc", "pillow")

# environment variables worth recording; anything that could hold a secret is never read here
RECORDED_ENV = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_ARRAY_TASK_ID", "CUDA_VISIBLE_DEVICES",
                "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS")


def git_state(root: str | Path = ".") -> dict:
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20)

    try:
        commit = git("rev-parse", "HEAD")
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        status = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_info(device) -> dict:
    import torch

    info = {"device": str(device), "torch_threads": torch.get_num_threads(), "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    return info


def run_variant(run: dict, *, precision: str, dataset_options: dict, split_file: dict, class_texts: list[str]) -> dict:
    """Which variant of the data and arithmetic a run used, the same record for every paper: its numerics (authors |
    fast), the precision it computed in (resolved on its hardware), that of its frozen CLIP encoder (None without
    one), whether large JPEGs were DCT-scaled, whose pixel pipeline its images went through, the dataset and its
    declaration's options (e.g. de-duplicated sources or not), the split (id, spec and seed), and the class
    texts its prompts said (a CLIP method's classifier; the SHA-256 of their JSON list, and the texts)."""
    from .models.encoders import frozen_encoder_precision

    texts = list(class_texts)
    return {
        "numerics": run.get("numerics"),
        "precision": precision,
        "encoder_precision": frozen_encoder_precision(run["train"]["model"]),
        "jpeg_draft": run.get("jpeg_draft"),
        "pixels": run["train"]["model"].get("pixels"),
        "dataset": {"name": run["dataset"], "options": dict(dataset_options)},
        "split": {"id": run.get("split_id"), "spec": split_file.get("spec"), "seed": split_file.get("seed")},
        "class_texts": {"sha256": hashlib.sha256(json.dumps(texts).encode()).hexdigest(), "texts": texts},
    }


def run_manifest(run: dict, *, device, determinism: dict, input_hashes: dict, timings: dict, resumed_from,
                 test_data: dict | None = None, execution: dict | None = None, variant: dict | None = None,
                 plugins: dict | None = None, code: dict | None = None) -> dict:
    """``test_data``: what test data the run read (selection on the test set, the test set as the
    domain-adaptation target) and whether it was allowed (paper protocol, or ``allow_test_selection``).
    ``execution``: how the job computed, resolved on its hardware (precision, channels_last, loader
    workers, where per-client state was kept, the memory estimate). ``variant``: :func:`run_variant`. ``plugins``:
    what the run uses that plug-ins registered, and their versions (:func:`fedrepro.registry.run_plugins`). ``code``:
    which code made it (:func:`fedrepro.code_identity.run_code`; ``fedrepro stale`` compares it with the installed code)."""
    return {
        "run": {**{k: run[k] for k in ("paper", "setting", "method", "seed", "protocol")},
                "numerics": run.get("numerics"), "config_hash": run["config_hash"]},
        "variant": variant or {},
        "test_data": test_data,
        "seeds": {"run": run["seed"], "split": input_hashes.get("split_seed"),
                  "streams": "derive_seed(run seed, purpose, round, client) for init/shuffle/local/server"},
        "config": run,
        "inputs": {k: v for k, v in input_hashes.items() if k != "split_seed"},
        "git": git_state(),
        "packages": package_versions(),
        "plugins": plugins or {},
        "code": code or {},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "env": {k: os.environ[k] for k in RECORDED_ENV if k in os.environ},
        "hardware": device_info(device),
        "determinism": determinism,
        "execution": execution or {},
        "timings": timings,
        "resumed_from_round": resumed_from,
    }
