"""One training job = one method x setting x seed: read inputs, run the rounds, write results.

All file I/O of training happens here; methods and the engine see only datasets and tensors.
Before anything is trained the job checks that its index sets are disjoint as the split declares
(:func:`fedrepro.fl.federation.check_disjoint`) and that it reads no test data its protocol does not allow.

Outputs (each written atomically):
    <out>/metrics.json        selected metrics per eval set, every selection rule the run's protocol allows
                              (no test-set rule under clean without allow_test_selection), what test data
                              the run read (``test_data``), comm and time
    <out>/history.csv         one row per round: loss, time, communication, every eval metric
    <out>/predictions.npz     class probabilities and labels of the selected round and the last one
    <out>/run_manifest.json   provenance: git, packages, config + hash, input hashes, device, seeds
    <ckpt>/model.pt           the final model; <ckpt>/resume.pt exists only while a run is unfinished
"""

from __future__ import annotations

import importlib
import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from . import paths, records
from .code_identity import run_code
from .cost.memory import check_fits, clients_of_file
from .cost.memory import estimate as estimate_memory
from .data.decode import spec_of
from .data.image_cache import ImageCache
from .data.loader import ItemState, loader_pool, resolve_workers
from .data.manifest import read_manifest
from .data.partition import Split, read_split_file, split_id_of, task_classes
from .device import Compute, resolve_device
from .features import load_feature_cache
from .fl.comm import CommLedger
from .fl.engine import run_rounds
from .fl.federation import (
    build_feature_federation,
    build_image_federation,
    check_disjoint,
    federation_datasets,
    target_is_test,
)
from .fl.method import MethodContext
from .fl.replay import Replay, ReplayError
from .fl.selection import (
    TEST_RULES,
    ForbiddenTestUse,
    allowed_rules,
    may_read_test_data,
    opted_in,
    resolve_rule,
    select,
    validation_key,
)
from .io import (
    StaleInput,
    atomic_path,
    canonical_json,
    clear_temporaries,
    content_digest,
    file_digest,
    json_text,
    read_json,
    text_digest,
    torch_save,
    with_content_digest,
    write_csv,
    write_json,
    write_text,
)
from .models.families import build_family
from .models.weights import require as require_weights
from .models.weights import weight_specs
from .provenance import run_manifest, run_variant
from .registry import RunRefused, dataset, method_class, run_plugins, run_problems
from .seeding import configure_determinism
from .timing import Phases, process_age


class InputMismatch(StaleInput):
    pass


def model_rebuild(model: str | Path) -> str:
    """What makes a run's ``model.pt`` again, for a message about a missing or damaged one."""
    return (f"snakemake --cores all {model} (trains the run again), or pull its pushed copy "
            f"(scripts/dvc-results.py pull --stages checkpoints)")


def check_model(model: str | Path, run: dict, checkpoint: dict) -> None:
    """Refuse a trained model that is not run ``run``'s before anything is made from it (the embed and downstream
    jobs): another configuration's (the config hash it was saved with), or not the file this run wrote (the digest
    its run manifest records; FedAvg's model.pt copied into FedIIC's folder draws FedIIC's figure from FedAvg)."""
    if checkpoint.get("config_hash") != run["config_hash"]:
        raise InputMismatch(f"{model} was trained by another configuration (config hash {checkpoint.get('config_hash')}, "
                            f"run {run['paper']}/{run['setting']}/{run['method']} seed {run['seed']} is "
                            f"{run['config_hash']}): copied or moved over it? Rebuild it: {model_rebuild(model)}")
    manifest = Path(run["paths"]["out"]) / "run_manifest.json"
    recorded = (read_json(manifest).get("outputs") or {}).get("model.pt") if manifest.is_file() else None
    if recorded and content_digest(model) != recorded:
        raise InputMismatch(f"{model} is not the model its run wrote ({manifest} records {recorded[:19]}…, the file "
                            f"holds {content_digest(model)[:19]}…): copied or moved over it? Rebuild it: "
                            f"{model_rebuild(model)}")


def load_federation(run: dict, split_file: dict | None = None):
    """The run's federation (and the hashes of its inputs), after checking that its split belongs to its
    manifest and that its index sets are disjoint as the split declares. ``split_file``: the split JSON,
    if already read."""
    paths = run["paths"]
    spec = dataset(run["dataset"])
    split_file = read_split_file(paths["split"]) if split_file is None else split_file
    manifest = read_manifest(paths["manifest"])     # a cut-off manifest is named as such, not as "another version"
    check_own_split(run, split_file)
    records.verify(paths["split"])
    manifest_sha = file_digest(paths["manifest"])
    if split_file["manifest_sha256"] != manifest_sha:
        raise InputMismatch(f"{paths['split']} was made from another version of {paths['manifest']}; rebuild the split: "
                            f"snakemake --cores all --force {paths['split']}")
    split = Split.from_json(split_file)
    allow_test = opted_in(run["train"])
    check_disjoint(split, run["protocol"], allow_test, where=paths["split"])
    hashes = {"manifest_sha256": manifest_sha, "split_sha256": file_digest(paths["split"]), "split_seed": split_file["seed"]}
    class_names = list(spec.class_texts)     # what CLIP prompts say (the authors' class folder names)
    kept = task_classes(spec.classes, split_file.get("spec") or {})
    classes = None if len(kept) == len(spec.classes) else kept     # a subset of classes is the task's class set
    if run["input"] == "features":
        cache = load_feature_cache(paths["features"])
        records.verify(paths["features"])
        if canonical_json(cache.get("encoder")) != canonical_json(run["features"]["encoder"]):
            raise InputMismatch(f"{paths['features']} holds the features of the encoder {cache.get('encoder')}, not this "
                                f"run's {run['features']['encoder']} (copied or moved over it); rebuild it: snakemake "
                                f"--cores all --forcerun {paths['features']}")
        if cache["manifest_sha256"] != manifest_sha:
            raise InputMismatch(f"{paths['features']} was computed from another version of {paths['manifest']}; rebuild "
                                f"it: snakemake --cores all --force {paths['features']}")
        if cache.get("class_names") != class_names:
            raise InputMismatch(f"{paths['features']} holds the text features of the classes {cache.get('class_names')}, "
                                f"but {run['dataset']}'s prompts now say {class_names}; rebuild it: snakemake "
                                f"--cores all --force {paths['features']}")
        hashes["features_sha256"] = file_digest(paths["features"])
        hashes["encoder_weights"] = cache.get("weights")
        return build_feature_federation(split, run["protocol"], cache, class_names, allow_test, classes), hashes
    family = build_family(run["train"]["model"], class_names if classes is None else [class_names[c] for c in classes], {})
    missing = [c for c in family.extra_columns if c not in manifest.columns]
    if missing:
        raise InputMismatch(f"{paths['manifest']} has no column(s) {missing}, which model family "
                            f"{run['train']['model']['family']!r} needs; columns: {list(manifest.columns)}")
    train_transform, eval_transform = family.train_transform(), family.eval_transform()
    pixels = run["train"]["model"].get("pixels", "authors")
    caches = {}
    for part, transform in (("train", train_transform), ("eval", eval_transform)):
        if (paths.get("images") or {}).get(part):
            needed = replace(spec_of(transform, pixels), draft=run["jpeg_draft"])
            records.verify(paths["images"][part])
            caches[part] = ImageCache(paths["images"][part], manifest_sha, needed)
            hashes[f"images_{part}"] = {"file": paths["images"][part], "spec": needed.key}
    fed = build_image_federation(split, run["protocol"], manifest, paths["raw_dir"], class_names,
                                 train_transform, eval_transform, family.extra_columns, caches, run["jpeg_draft"],
                                 allow_test, classes, pixels)
    return fed, hashes


def check_own_split(run: dict, split_file: dict) -> None:
    """Refuse a split file that is not the run's own: what it records of itself (dataset, spec and split seed,
    vouched for by its content digest) names another split than the run's ``split_id`` (seed 1's split copied over
    seed 0's trains seed 0 on seed 1's clients without this)."""
    made = split_id_of(split_file.get("dataset"), split_file.get("spec") or {}, split_file.get("seed"))
    if made != run["split_id"]:
        split = run["paths"]["split"]
        raise InputMismatch(f"{split} holds the split {made} (dataset {split_file.get('dataset')}, split seed "
                            f"{split_file.get('seed')}), not this run's {run['split_id']}: it was copied or moved over "
                            f"it. Rebuild it: snakemake --cores all --forcerun {split}")


def run_outputs(out_dir: Path, model: Path, metrics_text: str) -> dict[str, str]:
    """The digests of what a run wrote, for its run manifest (metrics.json's from the text about to be written
    last): a report refuses a run file that no longer holds them, and a job reading model.pt one that is not this
    run's (:func:`fedrepro.io.content_digest`: CRC-32s of the archives, SHA-256 of the rest)."""
    return {"metrics.json": text_digest(metrics_text),
            **{name: content_digest(out_dir / name) for name in ("history.csv", "predictions.npz")},
            "model.pt": content_digest(model)}


def describe_test_use(run: dict, reads_target: bool, split: Split | None = None) -> dict:
    """What test data a run reads, for metrics.json and the run manifest: whether it may (``allowed``: the
    paper protocol or the clean opt-in ``allow_test_selection``), whether its reported round is selected on
    the test set, and whether its unlabeled domain-adaptation target is the global test set. Refuses (before
    training) a run that would read test data it may not."""
    allowed = may_read_test_data(run["protocol"], opted_in(run["train"]))
    rule = resolve_rule(run["train"]["selection"]["rule"], run["protocol"])
    adapts_on_test = bool(reads_target and split is not None and len(split.global_test) + len(split.reference)
                          and target_is_test(split, run["protocol"], opted_in(run["train"])))
    if not allowed and (rule in TEST_RULES or adapts_on_test):
        raise ForbiddenTestUse(f"{run['paper']}/{run['setting']}/{run['method']} (protocol {run['protocol']}) would read "
                               f"the test set (selection rule {rule!r}, target = test set: {adapts_on_test}); use the "
                               f"paper protocol or set allow_test_selection: true in its train block")
    return {"protocol": run["protocol"], "allow_test_selection": opted_in(run["train"]),
            "selection_on_test": rule in TEST_RULES, "target_is_test": adapts_on_test}


# the top-level sections of metrics.json a table cell may name as ``<section>.<name>`` (``summarise``)
SUMMARY_METRICS = {"comm": ("down_params_per_round", "up_params_per_round", "down_bytes_per_round", "up_bytes_per_round",
                            "params_per_round", "bytes_per_round", "params_per_client_round"),
                   "time": ("train_s_per_round", "eval_s_per_round")}


def summarise(history, run: dict, participants: int) -> dict:
    """metrics.json: the chosen rule's metrics, and those of every rule the run may compute."""
    train = run["train"]
    sel = train["selection"]
    by_rule, info = {}, {}
    for rule in allowed_rules(run["protocol"], opted_in(train)):
        by_rule[rule], info[rule] = select(history, rule, sel["metric"], sel["k"], validation_key(sel))
    chosen = resolve_rule(sel["rule"], run["protocol"])
    rounds = len(history)
    comm_cols = ["down_params", "up_params", "down_bytes", "up_bytes"]
    per_round = {c: float(history[c].mean()) for c in comm_cols} if rounds else {}
    return {
        "run": {**{k: run[k] for k in ("paper", "setting", "method", "seed", "protocol")},
                "numerics": run.get("numerics"), "config_hash": run["config_hash"]},
        "rounds": rounds,
        "selection": info[chosen] | {"rule": info[chosen].get("rule", chosen), "requested": sel["rule"]},
        "eval": by_rule[chosen],
        "by_rule": by_rule,
        "comm": {
            **{f"{c}_per_round": v for c, v in per_round.items()},
            "params_per_round": per_round.get("down_params", 0) + per_round.get("up_params", 0),
            "bytes_per_round": per_round.get("down_bytes", 0) + per_round.get("up_bytes", 0),
            "params_per_client_round": (per_round.get("down_params", 0) + per_round.get("up_params", 0)) / max(1, participants),
        },
        "time": {
            "train_s_per_round": float(history["train_s"].mean()) if rounds else float("nan"),
            "eval_s_per_round": float(history["eval_s"].mean()) if "eval_s" in history else float("nan"),
        },
    }


def save_predictions(path: Path, predictions: dict, chosen: str) -> None:
    arrays = {}
    for rule in (chosen, "last"):
        packed = predictions.get(rule) or predictions.get("last") or {}
        for key, value in packed.items():
            arrays[f"{'selected' if rule == chosen else 'last'}:{key}"] = np.asarray(value)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)


def reset_peak_rss() -> None:
    """Start the peak-memory count at this process's current size. A job forked from a larger process
    (the fork-server, a test) or exec'd from one would otherwise report its parent's peak:
    ``getrusage``'s ru_maxrss survives fork and exec. Linux only; elsewhere a no-op."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def peak_rss() -> int:
    """This process's peak resident memory (bytes) since :func:`reset_peak_rss`, next to the estimate in
    the manifest (``VmHWM``; ru_maxrss where /proc is not there)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def client_state_summary(method) -> dict:
    """Where each per-client store kept its entries: the setting, and how many clients were on disk."""
    stores = getattr(method, "stores", {})
    return {"setting": method.ctx.train.get("client_state", "memory"),
            "stores": {name: {"on_disk": len(store.files), "in_memory": store.resident(), "file_loads": store.loads}
                       for name, store in stores.items() if len(store)}}


def read_replay(spec: dict, fed) -> Replay:
    """The replay a run config's ``replay`` block names (:mod:`fedrepro.fl.replay`, docs/parity.md): the initial
    model file (``initial_model``, a state dict in the authors' ``layout``) and a record folder (``record``:
    ``passes.json``, every pass as batches of [manifest path, row of states.npz, ...] per client, and ``states.npz``, the
    random states of python / numpy / torch's CPU generator each item's transform started from)."""
    replay = Replay(layout=spec.get("layout"), source=str(spec.get("record") or spec.get("initial_model")))
    if spec.get("initial_model"):
        path = Path(spec["initial_model"])
        if not path.is_file():
            raise FileNotFoundError(f"replay.initial_model: {path} not found (a state dict saved by the authors' code; "
                                    f"`fedrepro parity` writes one)")
        replay.initial_state = torch.load(path, map_location="cpu", weights_only=True)
    if spec.get("record"):
        folder = Path(spec["record"])
        for name in ("passes.json", "states.npz"):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"replay.record: {folder / name} not found (a record folder holds passes.json "
                                        f"and states.npz; `fedrepro parity ... --save DIR` writes one)")
        passes = json.loads((folder / "passes.json").read_text())["passes"]
        with np.load(folder / "states.npz") as data:
            states = {k: data[k] for k in data.files}
        for entry in passes:
            client = fed.clients[entry["client"]]
            position = {p: i for i, p in enumerate(getattr(client.train, "paths", []))}
            plan = []
            for batch in entry["batches"]:
                unknown = [item[0] for item in batch if item[0] not in position]
                if unknown:
                    raise ReplayError(f"{folder / 'passes.json'}: {entry['purpose']} {entry['keys']} names images that "
                                      f"are not client {client.name}'s training images, e.g. {unknown[:3]}: the record "
                                      f"belongs to another split")
                plan.append([(position[item[0]], recorded_state(states, item[1])) for item in batch])
            replay.passes[(entry["purpose"], *entry["keys"])] = plan
    return replay


def recorded_state(states: dict, row: int) -> ItemState:
    """Row ``row`` of a record's states.npz as the generators' own state objects."""
    gauss = float(states["py_gauss"][row])
    return ItemState(
        python=(3, tuple(int(v) for v in states["py"][row]), None if np.isnan(gauss) else gauss),
        numpy=("MT19937", states["np_keys"][row].astype(np.uint32), int(states["np_pos"][row]),
               int(states["np_has_gauss"][row]), float(states["np_gauss"][row])),
        torch=states["torch"][row].astype(np.uint8).tobytes())


def train_run(run: dict, out_dir: str | Path, checkpoint_dir: str | Path, log: logging.Logger | None = None,
              checkpoint_every: float = 0.0, *, observe=None) -> dict:
    """Train one run and write its outputs. ``checkpoint_every``: seconds between two writes of ``resume.pt`` (0: after
    every round; :func:`fedrepro.fl.engine.run_rounds`); the ``train`` command's default is a minute. ``observe``:
    called after every round (``fl.engine.run_rounds``)."""
    log = log or logging.getLogger("fedrepro.train")
    out_dir, checkpoint_dir = Path(out_dir), Path(checkpoint_dir)
    started, startup = time.time(), process_age()      # what the process spent before this (interpreter, imports)
    phases = Phases()
    states = Path(paths.client_states(checkpoint_dir))
    # what a killed attempt left half-written (.model.pt.<random>.tmp, ...): this job owns these folders
    for leftover in clear_temporaries(out_dir, checkpoint_dir, *(p for p in states.glob("*") if p.is_dir())):
        log.info("removed %s, left by an attempt that was stopped", leftover)
    reset_peak_rss()
    determinism = configure_determinism(run["deterministic"])
    if run.get("threads"):
        torch.set_num_threads(run["threads"])
    device = resolve_device(run["device"])
    # torch's optimizers import torch._dynamo on first construction (seconds on a CPU): load it before the
    # timed rounds, so that round 1's train_s (FAA-CLIP Table II's time column) measures training only
    with phases("imports"):
        importlib.import_module("torch._dynamo")

    # execution settings are resolved here, on the job's hardware, and recorded in the run manifest:
    # loader workers from the job's CPUs (results do not depend on them), precision from the device
    workers = resolve_workers(run["train"]["num_workers"])
    compute = Compute.for_run(run["train"], device)
    run = {**run, "train": {**run["train"], "num_workers": workers, "precision": compute.precision}}
    with phases("inputs"):
        refused = run_problems(run["algorithm"]["name"], run["algorithm"]["params"], run["train"])
        if refused:         # validated before the workflow starts; a run handed to the job by hand is checked here
            raise RunRefused(f"{run['paper']}/{run['setting']}/{run['method']} (protocol {run['protocol']}): "
                             + "; ".join(refused))
        weights = require_weights(weight_specs(run["train"]["model"]))   # before any data is read
        # a run that cannot fit says so before it starts (fedrepro.cost.memory; FEDREPRO_MEMORY_CHECK=warn|off)
        clients = clients_of_file(run["paths"]["split"]) or 1
        needed = estimate_memory(run, clients, device, workers if run["input"] != "features" else 0)
        for line in needed.lines():
            log.info("%s", line)
        check_fits(needed, log)
        algorithm = method_class(run["algorithm"]["name"])
        code = run_code(run)        # the code this job imported, recorded before a file can change under it
        split_file = read_split_file(run["paths"]["split"])
        test_data = describe_test_use(run, algorithm.reads_target(run["algorithm"]["params"]), Split.from_json(split_file))
        fed, hashes = load_federation(run, split_file)
        hashes["weights"] = weights
        replay = read_replay(run["replay"], fed) if run.get("replay") else None
    ctx = MethodContext(run=run, federation=fed, device=device, comm=CommLedger(), log=log, state_dir=states,
                        phases=phases, replay=replay)
    method = algorithm(ctx)
    resume = checkpoint_dir / "resume.pt"
    with loader_pool(federation_datasets(fed), workers if run["input"] != "features" else 0,
                     pin_memory=device.type == "cuda"):
        result = run_rounds(method, fed, run, resume, log, checkpoint_every, observe=observe)

    with phases("outputs"):
        summary = summarise(result.history, run, len(method.participants())) | {"test_data": test_data}
        chosen = resolve_rule(run["train"]["selection"]["rule"], run["protocol"])
        write_csv(out_dir / "history.csv", result.history)
        save_predictions(out_dir / "predictions.npz", result.predictions, chosen)
        torch_save(checkpoint_dir / "model.pt", {"config_hash": run["config_hash"], "model": method.final_model()})
        execution = {"precision": method.compute.precision, "channels_last": method.compute.channels_last,
                     "num_workers": workers, "client_state": client_state_summary(method),
                     "memory_estimate": needed.to_json(), "peak_rss_bytes": peak_rss()}
        variant = run_variant(run, precision=method.compute.precision, dataset_options=dataset(run["dataset"]).options,
                              split_file=split_file, class_texts=fed.class_names)
    # start-up: before this function (None off Linux); cpu_s: the process's CPU time, start-up included; phases:
    # exclusive wall and CPU seconds of what this function did
    timings = {"wall_s": time.time() - started, "cpu_s": time.process_time(), "train_s": float(result.history["train_s"].sum()),
               "startup_s": startup, "phases": phases.to_json()}
    manifest = run_manifest(run, device=device, determinism=determinism, input_hashes=hashes, execution=execution,
                            timings=timings, resumed_from=result.resumed_from, test_data=test_data, variant=variant,
                            plugins=run_plugins(run), code=code)
    metrics_text = json_text(summary)
    manifest["outputs"] = run_outputs(out_dir, checkpoint_dir / "model.pt", metrics_text)
    write_json(out_dir / "run_manifest.json", with_content_digest(manifest))
    write_text(out_dir / "metrics.json", metrics_text)  # last: its presence means the run is complete
    resume.unlink(missing_ok=True)
    shutil.rmtree(states, ignore_errors=True)
    return summary
