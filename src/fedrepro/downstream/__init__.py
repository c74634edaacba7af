"""Downstream evaluation of pre-trained checkpoints (FedDRA §5.1.1, appendix A.1.2 / A.2.2).

A job = one pre-training run (its ``model.pt``) x one task of the paper's ``downstream`` section:

- ``linear_probe``: "fine-tune our pre-trained model with an additional linear layer on 1%, 10% of
  the training dataset" — following MGCA's linear evaluation, the image encoder is frozen and only
  the linear layer is trained (RSNA / COVIDx classification, mBRSET DR and edema few-shot).
- ``segmentation``: "a U-Net framework with our pre-trained image encoder as the frozen encoder,
  fine-tuning the decoder on 1%, 10% of the training data", scored by Dice (RSNA boxes -> masks).

Each has two recipes (``recipe``): ``mgca`` (default), MGCA's code, which FedDRA follows for its
downstream tasks, and ``fedrepro`` (:mod:`.probe`, :mod:`.segmentation`).

Splits: the downstream dataset's own train/val/test split (val and test carved with a fixed seed when
the manifest has none), or ``resplit``: MGCA's preprocessing (``preprocess/rsna.py``,
``preprocess/covidx.py``): scikit-learn's ``train_test_split(random_state=0)`` on the rows of the
named manifest splits, in manifest order, cuts ``held_out`` rows (a fraction or a count), and a second
one gives ``val_share`` of them to validation and the rest to test (all to validation when 1; the
test split is then the manifest's). ``stratified`` carves and draws the training fractions class by
class (ours) or not (MGCA's ``sample(frac=...)``). The training fractions are nested (the 1% subset
is part of the 10% one) and drawn per training seed. For a personalized pre-training
(Decentralized), every client model is evaluated and the result is their mean, as the paper reports.

Output (same layout as a run's metrics.json, so tables read it with ``task:``):
``{"run", "task", "selection", "eval": {"1%": {"acc": ..}, "10%": {..}}, "per_model": [...], "inputs"}``, where
``inputs`` holds the SHA-256 of the downstream dataset's manifest (a table refuses a result made from another
version of it: fedrepro.report.consistency).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from ..io import read_json, sha256_file, torch_load, with_content_digest, write_json
from ..seeding import configure_determinism, numpy_rng, seed_global
from ..train import check_model, model_rebuild


class DownstreamError(ValueError):
    pass


# what each kind of task reports per training fraction (``eval`` of its result: fraction_key -> metrics)
TASK_METRICS = {"linear_probe": ("acc", "bacc", "f1", "auc", "ece", "n", "n_train"),
                "segmentation": ("dice", "dice_per_image", "n_train")}


def fraction_key(fraction: float) -> str:
    """0.01 -> '1%', 0.1 -> '10%', 1.0 -> '100%' (the eval keys tables name)."""
    return f"{fraction * 100:g}%"


def carve(labels: np.ndarray, rows: np.ndarray, fraction: float, rng: np.random.Generator,
          stratified: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Split ``rows`` into (rest, carved) with ``fraction`` of every class (or of all rows) carved out."""
    groups = [rows[labels[rows] == c] for c in np.unique(labels[rows])] if stratified else [rows]
    carved = [rng.permutation(members)[:int(round(fraction * len(members)))] for members in groups]
    carved = np.sort(np.concatenate(carved)) if carved else np.zeros(0, dtype=int)
    return np.setdiff1d(rows, carved), carved


def mgca_resplit(rows: np.ndarray, held_out: float, val_share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MGCA's preprocessing split of ``rows`` (in manifest order) -> (train, val, test), each sorted:
    ``train_test_split(rows, test_size=held_out, random_state=0)``, then the held-out rows
    ``train_test_split(.., test_size=val_share, random_state=0)`` -> (test, val); all to val when
    ``val_share`` is 1."""
    from sklearn.model_selection import train_test_split

    held_out = int(held_out) if held_out >= 1 else held_out
    train, held = train_test_split(rows, test_size=held_out, random_state=0)
    if val_share >= 1:
        test, val = held[:0], held
    else:
        test, val = train_test_split(held, test_size=val_share, random_state=0)
    return np.sort(train), np.sort(val), np.sort(test)


def task_splits(manifest, labels: np.ndarray, spec: dict) -> dict[str, np.ndarray]:
    """train/val/test rows of the downstream dataset: its official split, carving what is missing, or
    re-split as MGCA's preprocessing does (``resplit``)."""
    official = manifest["split"].to_numpy().astype(str)
    valid = np.flatnonzero(labels >= 0)
    train = valid[(official[valid] == "train") | (official[valid] == "")]
    val, test = valid[official[valid] == "val"], valid[official[valid] == "test"]
    resplit = spec.get("resplit")
    if resplit:
        names = set(resplit["from"]) | ({""} if "train" in resplit["from"] else set())    # "" = train
        pooled = valid[np.isin(official[valid], sorted(names))]
        try:
            train, val, held_test = mgca_resplit(pooled, resplit["held_out"], resplit["val_share"])
        except ValueError as error:
            raise DownstreamError(f"downstream task on {spec['dataset']}: resplit {resplit} cannot split the "
                                  f"{len(pooled)} rows of {resplit['from']}: {error}") from error
        test = held_test if resplit["val_share"] < 1 else np.setdiff1d(test, pooled)
    rng = numpy_rng(0, "downstream-split")
    if not len(test):
        train, test = carve(labels, train, spec["test_fraction"], rng, spec["stratified"])
    if not len(val) and spec["val_fraction"] > 0:
        train, val = carve(labels, train, spec["val_fraction"], rng, spec["stratified"])
    if not len(train) or not len(test):
        raise DownstreamError(f"downstream dataset {spec['dataset']}: empty train or test split")
    return {"train": train, "val": val, "test": test}


def fraction_subsets(labels: np.ndarray, train: np.ndarray, fractions: list[float], min_per_class: int,
                     rng: np.random.Generator, stratified: bool = True) -> dict[float, np.ndarray]:
    """Nested subsets of ``train``: stratified = per class one permutation, the first
    max(min_per_class, round(f * n_c)) members for fraction f; otherwise one permutation of all rows,
    the first max(1, round(f * n))."""
    if not stratified:
        order = rng.permutation(train)
        return {f: np.sort(order[:max(1, int(round(f * len(order))))]) for f in fractions}
    orders = {c: rng.permutation(train[labels[train] == c]) for c in np.unique(labels[train])}
    out = {}
    for f in fractions:
        chosen = [order[:min(len(order), max(min_per_class, int(round(f * len(order)))))] for order in orders.values()]
        out[f] = np.sort(np.concatenate(chosen))
    return out


def load_models(job: dict, family, device) -> list[torch.nn.Module]:
    """The checkpoint's model(s): the server model, or every client model of a personalized run."""
    model = job["paths"]["checkpoint"]
    checkpoint = torch_load(model, model_rebuild(model))       # CRC-32s checked: a damaged file is set aside, named
    check_model(model, job["run"], checkpoint)
    saved = checkpoint["model"]
    states = list(saved["clients"].values()) if saved.get("clients") else [saved["server"]]
    models = []
    seed_global(job["seed"], "init")
    template = family.build()
    keys = set(template.state_dict())
    for state in states:
        missing = sorted(keys - set(state))
        if missing:
            raise DownstreamError(f"{job['paths']['checkpoint']} lacks {missing[:5]} of the {job['run']['train']['model']['family']} model")
        model = family.build() if models else template
        model.load_state_dict({k: v for k, v in state.items() if k in keys})
        models.append(model.to(device).eval().requires_grad_(False))
    return models


def run_downstream(job: dict, out: str | Path, log: logging.Logger | None = None) -> dict:
    from ..data.manifest import read_manifest
    from ..device import Compute, resolve_device
    from ..models.families import build_family
    from ..models.weights import require, weight_specs
    from ..registry import dataset
    from . import probe, segmentation

    log = log or logging.getLogger("fedrepro.downstream")
    started = time.time()
    configure_determinism(job["deterministic"])
    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    device = resolve_device(job["device"])
    run, spec = job["run"], job["spec"]
    require(weight_specs(run["train"]["model"]))       # the pretrained files the model is built from, before any data
    compute = Compute.for_run(run["train"], device)     # the encoders' forward passes: the run's precision
    family = build_family(run["train"]["model"], list(dataset(run["dataset"]).classes), {}).to(device)
    needs = {("segmentation", "mgca"): ("image_token_map", "eval_geometry", "tensor_transform"),
             ("segmentation", "fedrepro"): ("image_feature_maps", "eval_geometry", "tensor_transform"),
             ("linear_probe", "mgca"): ("train_transform",)}.get((spec["kind"], spec["recipe"]), ())
    for name in ("encode_image", "eval_transform") + needs:
        if not hasattr(family, name):
            raise DownstreamError(f"model family {run['train']['model']['family']!r} has no {name}(): it cannot run a {spec['kind']} task")
    manifest = read_manifest(job["paths"]["manifest"])
    inputs = {"manifest_sha256": sha256_file(job["paths"]["manifest"])}    # tables compare it with the file here now
    column = spec["label_column"]
    if column not in manifest.columns:
        raise DownstreamError(f"{job['paths']['manifest']} has no column {column!r} (downstream/{job['task']}/label_column); "
                              f"columns: {list(manifest.columns)}")
    labels = manifest[column].to_numpy().astype(int)
    classes = list(dataset(spec["dataset"]).classes) if column == "label" else [str(v) for v in np.unique(labels[labels >= 0])]
    splits = task_splits(manifest, labels, spec)
    subsets = fraction_subsets(labels, splits["train"], spec["fractions"], spec["min_per_class"],
                               numpy_rng(job["seed"], "downstream", job["task"]), spec["stratified"])
    models = load_models(job, family, device)
    kind = {"linear_probe": probe.linear_probe, "segmentation": segmentation.segmentation}[spec["kind"]]
    per_model = []
    for i, model in enumerate(models):
        log.info("%s: model %d/%d", job["task"], i + 1, len(models))
        per_model.append(kind(family, model, manifest, labels, classes, splits, subsets, spec, job, compute, log))
    evals = {}
    for key in per_model[0]:
        evals[key] = {m: float(np.mean([r[key][m] for r in per_model])) for m in per_model[0][key]}
    metrics = read_json(job["paths"]["metrics"])
    result = {
        "run": metrics["run"],
        "task": job["task"],
        "kind": spec["kind"],
        "dataset": spec["dataset"],
        # the pre-trained model is the run's final one (model.pt); the head's epoch is chosen by head_selection
        "selection": {"rule": "last", "pretraining": metrics["selection"], "head_selection": spec["selection"]},
        "eval": evals,
        "per_model": per_model,
        "sizes": {"train": {fraction_key(f): int(len(rows)) for f, rows in subsets.items()},
                  "val": int(len(splits["val"])), "test": int(len(splits["test"]))},
        "config_hash": job["config_hash"],
        "inputs": inputs,
        "precision": compute.precision,
        "time_s": time.time() - started,
    }
    write_json(out, with_content_digest(result))     # a table refuses a result edited since (report.chain)
    return result
