"""FedIIC's whole-run parity: the authors' unmodified ``train_FedIIC.py`` (wnn2000/FedIIC) and fedrepro's ``paper``
run of FedIIC on ISIC, fed the same data and the same first model, compared round by round (docs/parity.md).

1. A fixture in ISIC 2019's real layout (:func:`fedrepro.parity.fixtures.isic2019_fixture`: 80 images, the fewest
   the code accepts) and a stand-in for the ImageNet EfficientNet-B0 checkpoint their code downloads (random, from a
   seed, in efficientnet_pytorch's layout, put where torch.hub looks).
2. The authors' run, under the recorder (``authors/fediic_recorder.py``): their code, their random streams; it lists
   the only things it changes (device, input paths, and with ``stochastic: off`` the dropout and drop-connect rates).
3. fedrepro's ``paper`` run of (fediic, isic, fediic, seed 0) as the configuration resolves it, with these changes
   only: the number of rounds (and the batch size if asked), the fixture's manifest and split, no pretrained
   download (the replay's initial model sets every weight), stochastic layers off when they are off on the authors'
   side, and a ``replay`` block: the authors' initial model (layout ``fediic``) and their recorded data passes.
4. Per round and client: the losses and each term (DALA cross-entropy, intra- and inter-client contrastive) at
   every step, the per-class losses and prototypes the server sent, the weights against their drift; per round the
   validation BACC, the selected round and the aggregated weights.

The golden record (``--save``; ``tests/data/parity/fediic/``) keeps what CI needs to replay fedrepro against the
authors' run without their code: the replay inputs, the authors' per-step and per-round numbers, and the weights at
a fixed sample of positions; the fixture, the stand-in and the initial model are rebuilt from seeds and checked
against their recorded digests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .compare import ClientRow, ParityError, RoundRow, Tolerances, WeightGap, max_relative, table
from .fixtures import isic2019_fixture, standin_efficientnet_b0, state_sha256

REPOSITORY = "wnn2000/FedIIC"
COMMIT = "0c4de6ece3a657f89ffe95191522a1e4c0a4e0a9"
RECORDER = Path(__file__).parent / "authors" / "fediic_recorder.py"
STANDIN_NAME = "efficientnet-b0-355c32eb.pth"     # efficientnet_pytorch utils.py url_map['efficientnet-b0']'s file
DATASET = "isic2019"
KEY = ("fediic", "isic", "fediic", 0)              # (paper, setting, method, seed) of the compared run
TERMS = {"ce": "loss_train", "intra": "loss_cl_intra", "inter": "loss_cl_inter"}   # ours -> the authors' log tags
SKETCH = 8192                                      # weights kept per model in a golden record
TOLERANCES = Tolerances()


@dataclass
class Inputs:
    """What both runs are fed, and the settings of the comparison."""

    work: Path
    rounds: int = 2
    batch_size: int | None = None         # None: the paper configuration's (32)
    threads: int = 2
    stochastic: bool = False
    images: int = 80
    image_size: int = 32
    seed: int = 0                         # of the fixture and the stand-in checkpoint
    facts: dict = field(default_factory=dict)

    @property
    def raw(self) -> Path:
        return self.work / "raw"

    @property
    def torch_home(self) -> Path:
        return self.work / "torch"


def make_inputs(inputs: Inputs) -> None:
    """The fixture and the stand-in checkpoint, with their digests in ``inputs.facts``."""
    fixture = isic2019_fixture(inputs.raw / DATASET, inputs.images, inputs.image_size, inputs.seed)
    standin = standin_efficientnet_b0(inputs.seed)
    target = inputs.torch_home / "hub" / "checkpoints" / STANDIN_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(standin, target)
    inputs.facts.update(pixels_sha256=fixture["pixels_sha256"], standin_sha256=state_sha256(standin))


# ---- the authors' side ---------------------------------------------------------------------------------------------

def check_checkout(checkout: Path) -> None:
    if not (Path(checkout) / "train_FedIIC.py").is_file():
        raise ParityError(f"--authors {checkout}: no train_FedIIC.py there; clone {REPOSITORY} and check out "
                          f"{COMMIT[:7]} (docs/parity.md)")


def run_authors(checkout: Path, python: str, inputs: Inputs, batch_size: int, log: logging.Logger,
                reuse: bool = False) -> Path:
    """The authors' training script under the recorder -> the record folder. ``reuse``: keep a record that the same
    settings made (``<record>/made.json``) instead of running their code again."""
    checkout = Path(checkout)
    check_checkout(checkout)
    record, cwd = inputs.work / "authors", inputs.work / "authors-run"
    made = {"commit": git_commit(checkout), "batch_size": batch_size, "rounds": inputs.rounds, "threads": inputs.threads,
            "stochastic": inputs.stochastic, "recorder_sha256": hashlib.sha256(RECORDER.read_bytes()).hexdigest(),
            **{k: v for k, v in inputs.facts.items() if k.endswith("sha256")}}
    if reuse and (record / "made.json").is_file() and json.loads((record / "made.json").read_text()) == made:
        log.info("the authors' run recorded in %s with the same settings is reused", record)
        inputs.facts["authors_commit"] = made["commit"]
        return record
    shutil.rmtree(record, ignore_errors=True)
    cwd.mkdir(parents=True, exist_ok=True)
    command = [python, str(RECORDER), "--authors", str(checkout.resolve()), "--data", str((inputs.raw / DATASET).resolve()),
               "--out", str(record.resolve()), "--stochastic", "on" if inputs.stochastic else "off",
               "--threads", str(inputs.threads), "--", "--rounds", str(inputs.rounds), "--batch_size", str(batch_size),
               "--seed", "0"]
    env = {**os.environ, "TORCH_HOME": str(inputs.torch_home.resolve())}
    log.info("the authors' run: %s", " ".join(command))
    logfile = inputs.work / "authors.log"
    with open(logfile, "w") as out:
        done = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = "\n".join(logfile.read_text().splitlines()[-15:])
        raise ParityError(f"the authors' run failed (exit {done.returncode}); its log: {logfile}\n{tail}\n"
                           f"Its Python ({python}) needs torch, torchvision, efficientnet_pytorch==0.7.1, "
                           f"pretrainedmodels, six, tensorboardX, pandas and scikit-learn (docs/parity.md).")
    inputs.facts["authors_commit"] = made["commit"]
    (record / "made.json").write_text(json.dumps(made))
    return record


def git_commit(checkout: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


def image_path(name: str) -> str:
    """An ISIC image name as a manifest path (relative to the raw folder)."""
    return f"{DATASET}/ISIC_2019_Training_Input/{name}.jpg"


def write_replay(record: dict, states: dict, out: Path) -> None:
    """The authors' recorded passes in a replay's format (``passes.json`` + ``states.npz``; fedrepro.train)."""
    out.mkdir(parents=True, exist_ok=True)
    passes = [{"purpose": "fediic-difficulty", "keys": [client], "client": client,
               "batches": [[[image_path(n), row, views] for n, row, views in batch] for batch in batches]}
              for client, batches in enumerate(record["difficulty"])]
    passes += [{"purpose": "local", "keys": [e["round"], e["client"]], "client": e["client"],
                "batches": [[[image_path(n), row, views] for n, row, views in batch] for batch in e["batches"]]}
               for e in record["local"]]
    (out / "passes.json").write_text(json.dumps({"passes": passes}))
    np.savez(out / "states.npz", **{k: v for k, v in states.items() if k != "head_init_torch_state"})


# ---- what the authors' run did, in one object (from a live record or a golden one) -----------------------------

@dataclass
class Expected:
    """The authors' run as the comparison reads it."""

    record: dict                          # the recorder's record.json (or the golden expected.json's copy)
    weights: Callable                     # (round | "initial", client | None) -> state dict in fedrepro's keys
    lr: float
    view: Callable = staticmethod(lambda state: state)   # what of our state is compared (a golden record: a sample)

    prototypes: Callable = None           # round -> the prototypes the server sent (before normalisation)

    def local(self, rnd: int, client: int) -> dict:
        return next(e for e in self.record["local"] if e["round"] == rnd and e["client"] == client)

    def steps(self, client: int, tag: str) -> list[float]:
        return [v for t, v, _ in self.record["scalars"] if t == f"client{client}/{tag}"]


def step_values(expected: Expected, rnd: int, client: int, tag: str) -> list[float]:
    """The authors' logged per-step values of one client in one round (their log runs across rounds)."""
    before = sum(expected.local(r, client)["steps"] for r in range(rnd))
    return expected.steps(client, tag)[before:before + expected.local(rnd, client)["steps"]]


def compare_client(expected: Expected, rnd: int, update, client: int, start: dict) -> ClientRow:
    """One client's update in one round against the authors'."""
    mine, stats = expected.local(rnd, client), update.stats
    terms = {t: max_relative(stats["step_terms"].get(t, []), step_values(expected, rnd, client, tag))
             for t, tag in TERMS.items()}
    gap = WeightGap.between(expected.view(update.payload), expected.weights(rnd, client), start, expected.lr)
    return ClientRow(client, stats["steps"], (mine["loss"], stats["loss"]), terms,
                     max_relative(stats["step_losses"], step_values(expected, rnd, client, "loss")), gap)


def server_inputs(expected: Expected, rnd: int, received: dict) -> dict[str, float]:
    """What the server sent besides the model, against the authors': the per-class losses (relative) and the
    prototypes (unit rows, as each client of the code normalises them: largest difference of an element)."""
    sent = F.normalize(torch.as_tensor(np.asarray(expected.prototypes(rnd), dtype=np.float32)), dim=1)
    return {"class loss": max_relative(received["class_loss"].cpu(), expected.local(rnd, 0)["class_loss"]),
            "prototypes": float((received["prototypes"].cpu() - sent).abs().max())}


def validation_gap(method, authors_round: dict, images: list[str]) -> float:
    """The largest difference of a class probability the global model gives a validation image, ours against the
    authors' (softmax of the logits their evaluation computed): a finer check than the BACC, which a model that
    predicts one class for every image leaves at 1 / classes on both sides."""
    probs, paths = [], []
    for client in method.fed.clients:
        probs.append(method.predict(client.val, None))
        paths += list(client.val.paths)
    ours = dict(zip(paths, np.concatenate(probs)))
    theirs = torch.softmax(torch.as_tensor(authors_round["logits"]), dim=1).numpy()
    return float(max(np.abs(ours[image_path(name)] - p).max() for name, p in zip(images, theirs)))


def compare_round(expected: Expected, rnd: int, updates, row: dict, method) -> RoundRow:
    """One round of the replayed run against the authors'."""
    start = expected.weights(rnd - 1 if rnd else "initial", None)
    clients = [compare_client(expected, rnd, update, client.index, start)
               for update, client in zip(updates, method.participants())]
    checks = server_inputs(expected, rnd, updates[0].stats["received"])
    authors_round = next(r for r in expected.record["rounds"] if r["round"] == rnd)
    checks["validation probabilities"] = validation_gap(method, authors_round, expected.record["validation_images"])
    gap = WeightGap.between(expected.view(method.server.state_dict()), expected.weights(rnd, None), start, expected.lr)
    return RoundRow(rnd + 1, clients, (authors_round["bacc"], row["val_pooled/bacc"]), "validation BACC", gap, checks)


# ---- fedrepro's side -----------------------------------------------------------------------------------------------

def fedrepro_run(config: str, inputs: Inputs, replay: dict, log: logging.Logger) -> tuple[dict, dict]:
    """The resolved ``paper`` run of FedIIC on ISIC with the comparison's changes -> (run config, what changed)."""
    from .. import paths
    from ..config import load_project
    from ..data.manifest import read_manifest, write_manifest
    from ..data.partition import make_split
    from ..data.prepare import prepare_dataset
    from ..io import hash_obj, sha256_file, with_content_digest, write_json
    from ..registry import dataset

    project = load_project([config])
    key = project.resolver.run_key(*KEY, protocol="paper")
    run = project.resolver.run_config(key)
    work = inputs.work / "fedrepro"
    manifest_path = work / paths.manifest(DATASET)
    write_manifest(manifest_path, prepare_dataset(dataset(DATASET), inputs.raw))
    spec = project.resolver.split_spec(*KEY[:2], KEY[3], "paper")
    seed = project.resolver.split_seed(*KEY[:2], KEY[3], "paper")
    split = make_split(read_manifest(manifest_path), spec, seed, list(dataset(DATASET).class_texts))
    split_path = work / paths.split(run["split_id"])
    write_json(split_path, with_content_digest({"dataset": DATASET, "spec": spec, "seed": seed,
                                                "manifest_sha256": sha256_file(manifest_path), **split.to_json()}))
    train, model = run["train"], run["train"]["model"]
    changes = {"train.rounds": (train["rounds"], inputs.rounds)}
    train["rounds"] = inputs.rounds
    if inputs.batch_size is not None and inputs.batch_size != train["batch_size"]:
        changes["train.batch_size"] = (train["batch_size"], inputs.batch_size)
        train["batch_size"] = inputs.batch_size
    # torch's default Adam, which the authors construct; fused (fedrepro's speed choice) agrees up to rounding
    changes["optimizer.fused"] = (train["optimizer"].get("fused"), False)
    train["optimizer"]["fused"] = False
    changes["model.pretrained"] = (model["pretrained"], False)
    model["pretrained"] = False
    if not inputs.stochastic:
        for name in ("drop_rate", "drop_path_rate"):
            changes[f"model.{name}"] = (model[name], 0.0)
            model[name] = 0.0
    train["num_workers"] = 0
    run.update(device="cpu", threads=inputs.threads, replay=replay)
    run["paths"] = {**run["paths"], "raw_dir": str(inputs.raw), "manifest": str(manifest_path), "split": str(split_path),
                    "images": {}, "out": str(work / "run"), "checkpoints": str(work / "checkpoints")}
    run["config_hash"] = hash_obj({k: v for k, v in run.items() if k != "config_hash"})
    return run, changes


def replay_fedrepro(run: dict, expected: Expected, log: logging.Logger) -> tuple[list[RoundRow], dict]:
    """Train the replayed run, comparing each round as it ends -> (rows, metrics.json)."""
    from ..train import train_run

    rows: list[RoundRow] = []

    def observe(rnd, updates, row, method):
        rows.append(compare_round(expected, rnd, updates, row, method))

    shutil.rmtree(run["paths"]["out"], ignore_errors=True)
    shutil.rmtree(run["paths"]["checkpoints"], ignore_errors=True)
    summary = train_run(run, run["paths"]["out"], run["paths"]["checkpoints"], log, observe=observe)
    return rows, summary


def replay_clients(run: dict, expected: Expected, clients: list[int], log: logging.Logger) -> RoundRow:
    """The first round's server message (the per-class losses over every client's data, the prototypes) and the
    local updates of ``clients`` only, replayed as the train job would make them (a quick check: the whole round is
    ``replay_fedrepro``) -> a round row without metric and aggregate."""
    from ..fl.comm import CommLedger
    from ..fl.method import MethodContext
    from ..registry import method_class
    from ..seeding import configure_determinism, seed_global
    from ..train import load_federation, read_replay

    configure_determinism(run["deterministic"])
    torch.set_num_threads(run["threads"])
    fed, _ = load_federation(run)
    ctx = MethodContext(run=run, federation=fed, device=torch.device("cpu"), comm=CommLedger(), log=log,
                        replay=read_replay(run["replay"], fed))
    method = method_class(run["algorithm"]["name"])(ctx)
    method.setup()
    method.start_round(0)
    message = method.broadcast(0)
    start = expected.weights("initial", None)
    rows, received = [], None
    for index in clients:
        seed_global(run["seed"], "local", 0, index)
        update = method.local_update(fed.clients[index], message, 0)
        received = update.stats["received"]
        rows.append(compare_client(expected, 0, update, index, start))
    return RoundRow(1, rows, (math.nan, math.nan), "validation BACC", None, server_inputs(expected, 0, received))


def authors_weights(record_dir: Path, family, own: dict):
    """(round | "initial", client | None) -> the authors' saved weights under fedrepro's keys."""
    def load(rnd, client):
        name = "initial" if rnd == "initial" else f"round{rnd}_{'global' if client is None else f'client{client}'}"
        state = torch.load(record_dir / "weights" / f"{name}.pt", map_location="cpu", weights_only=True)
        mapped = family.authors_state(state, "fediic", own)
        # in fedrepro's key order and dtypes, as loading it into the model would make it (the code's FedAvg turns
        # the BatchNorm step counters into floats)
        return {k: mapped[k].to(own[k].dtype) for k in own}
    return load


# ---- the whole comparison ------------------------------------------------------------------------------------------

def client_paths(run: dict) -> list[list[str]]:
    """Every client's training images (manifest paths, in the split's order) and the validation images, pooled."""
    from ..data.manifest import read_manifest
    from ..data.partition import Split, read_split_file

    split = Split.from_json(read_split_file(run["paths"]["split"]))
    manifest_paths = read_manifest(run["paths"]["manifest"])["path"].to_numpy()
    names = sorted(split.clients, key=lambda n: int("".join(filter(str.isdigit, n)) or 0))
    train = [[str(manifest_paths[r]) for r in split.clients[n]["train"]] for n in names]
    val = sorted(str(manifest_paths[r]) for n in names for r in split.clients[n]["val"])
    return train + [val]


def partition_check(run: dict, record: dict) -> str:
    """Whether fedrepro's split gives every client the authors' images and the pooled validation set is theirs."""
    *train, val = client_paths(run)
    theirs = [[image_path(n) for n in part] for part in record["client_images"]]
    same_clients = [sorted(a) == sorted(b) for a, b in zip(train, theirs)]
    same_val = val == sorted(image_path(n) for n in record["validation_images"])
    if all(same_clients) and len(train) == len(theirs) and same_val:
        return f"identical ({len(train)} clients, {sum(map(len, train))} training and {len(val)} validation images)"
    differ = [i for i, same in enumerate(same_clients) if not same]
    return f"DIFFERENT (clients {differ}; validation set {'same' if same_val else 'different'})"


def selection_check(summary: dict, record: dict) -> tuple[int, int]:
    """(the authors' best round, fedrepro's): the code saves best_model.pth at each strictly better validation BACC."""
    baccs = [r["bacc"] for r in record["rounds"]]
    return int(np.argmax(baccs)) + 1, int(summary["selection"]["round"])


def report(inputs: Inputs, changes: dict, rows: list[RoundRow], partition: str,
           selection: tuple[int, int]) -> tuple[str, bool]:
    lines = [f"FedIIC whole-run parity: {REPOSITORY} at {str(inputs.facts.get('authors_commit') or '?')[:7]} "
             f"(unmodified) vs fedrepro's paper run, {inputs.rounds} round(s), fixture of {inputs.images} images, "
             f"stochastic layers {'on' if inputs.stochastic else 'off'}, {inputs.threads} thread(s)",
             "fedrepro's run as the configuration resolves it, except: " +
             ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()),
             f"partition: {partition}",
             table(rows, list(TERMS)),
             f"selection (best validation BACC): authors round {selection[0]}, fedrepro round {selection[1]}"]
    if inputs.stochastic:      # each side draws its own dropout and drop-connect masks: a look, not a verdict
        return "\n".join([*lines, "stochastic layers on: no verdict (each side draws its own masks)"]), True
    verdict, passed = TOLERANCES.verdict(rows, selection)
    return "\n".join([*lines, verdict]), passed


def compare(checkout: Path, python: str, inputs: Inputs, config: str, save: Path | None,
            log: logging.Logger, reuse: bool = False) -> tuple[str, bool]:
    """The whole comparison (module docstring) -> (its report, passed); ``save``: write the golden record there;
    ``reuse``: the authors' run already recorded in the working folder with the same settings is not run again."""
    from ..config import load_project
    from ..models.families import build_family
    from ..registry import dataset

    check_checkout(checkout)
    make_inputs(inputs)
    project = load_project([config])
    paper_batch = project.resolver.run_config(project.resolver.run_key(*KEY, protocol="paper"))["train"]["batch_size"]
    record_dir = run_authors(checkout, python, inputs, inputs.batch_size or paper_batch, log, reuse)
    record = json.loads((record_dir / "record.json").read_text())
    for entry in record["local"]:
        entry["steps"] = len(entry["batches"])
    with np.load(record_dir / "states.npz") as data:
        states = {k: data[k] for k in data.files}
    write_replay(record, states, inputs.work / "replay")
    replay = {"initial_model": str(record_dir / "weights" / "initial.pt"), "layout": "fediic",
              "record": str(inputs.work / "replay")}
    run, changes = fedrepro_run(config, inputs, replay, log)
    family = build_family(run["train"]["model"], list(dataset(DATASET).class_texts), {})
    own = family.build().state_dict()
    expected = Expected(record, authors_weights(record_dir, family, own), run["train"]["optimizer"]["lr"],
                        prototypes=lambda rnd: expected.local(rnd, 0)["prototypes"])
    rows, summary = replay_fedrepro(run, expected, log)
    text, passed = report(inputs, changes, rows, partition_check(run, record), selection_check(summary, record))
    if save is not None:
        write_golden(Path(save), inputs, run, changes, record, states, expected, own, text)
    return text, passed


# ---- the golden record: what CI replays without the authors' code -------------------------------------------------

def sketch(state: dict, positions: np.ndarray) -> dict[str, torch.Tensor]:
    """A state's floating-point entries, concatenated in key order, at ``positions`` (the golden record keeps this
    sample of every model instead of 28 MB each)."""
    flat = torch.cat([v.detach().cpu().double().ravel() for v in state.values() if v.is_floating_point()])
    return {"sample": flat[torch.as_tensor(positions)]}


def write_golden(out: Path, inputs: Inputs, run: dict, changes: dict, record: dict, states: dict,
                 expected: Expected, own: dict, text: str) -> None:
    """The golden record (module docstring): replay inputs, the authors' numbers, sampled weights, provenance."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("passes.json", "states.npz"):
        shutil.copyfile(inputs.work / "replay" / name, out / name)
    total = sum(v.numel() for v in own.values() if v.is_floating_point())
    positions = np.sort(np.random.default_rng(inputs.seed).choice(total, SKETCH, replace=False))
    arrays = {"positions": positions, "head_init_torch_state": states["head_init_torch_state"],
              "initial": sketch(expected.weights("initial", None), positions)["sample"].float().numpy()}
    for rnd in range(inputs.rounds):
        arrays[f"round{rnd}_global"] = sketch(expected.weights(rnd, None), positions)["sample"].float().numpy()
        arrays[f"round{rnd}_prototypes"] = np.asarray(expected.local(rnd, 0)["prototypes"], dtype=np.float32)
        for client in range(len(record["clients"])):
            arrays[f"round{rnd}_client{client}"] = sketch(expected.weights(rnd, client), positions)["sample"].float().numpy()
    np.savez_compressed(out / "weights.npz", **arrays)
    import platform

    lean = {**record, "local": [{k: v for k, v in e.items() if k not in ("prototypes", "batches")}
                                for e in record["local"]], "difficulty": None}
    initial = torch.load(inputs.work / "authors" / "weights" / "initial.pt", map_location="cpu", weights_only=True)
    provenance = {
        "repository": REPOSITORY, "commit": inputs.facts.get("authors_commit"), "torch": torch.__version__,
        "python": platform.python_version(), "machine": platform.machine(),
        "command": f"fedrepro parity fediic --authors <checkout> --rounds {inputs.rounds} --threads {inputs.threads} "
                   f"--save {out}" + (" --stochastic on" if inputs.stochastic else "")
                   + (f" --batch-size {inputs.batch_size}" if inputs.batch_size else ""),
        "inputs": {"images": inputs.images, "image_size": inputs.image_size, "seed": inputs.seed,
                   "rounds": inputs.rounds, "threads": inputs.threads, "stochastic": inputs.stochastic,
                   "batch_size": run["train"]["batch_size"]},
        "digests": {**{k: v for k, v in inputs.facts.items() if k.endswith("sha256")},
                    "initial_model_sha256": state_sha256(initial)},
        "changes": {k: list(v) for k, v in changes.items()},
    }
    (out / "expected.json").write_text(json.dumps({"provenance": provenance, "record": lean, "report": text.splitlines()},
                                                  indent=1))


class GoldenMismatch(ParityError):
    """What a golden record was made from cannot be rebuilt here as it was (another library version or machine)."""


def initial_model(standin: dict, head_torch_state: np.ndarray, classes: int = 8) -> dict:
    """The authors' first global model rebuilt (wnn2000/FedIIC ``networks/networks.py::efficientb0``): the stand-in
    loaded into efficientnet_pytorch's B0 as ``model.*``, then its classifier ``model._fc`` (in place of the
    1000-class one) and the projector drawn by ``nn.Linear``'s own initialisation from torch's generator as it stood
    once the backbone was built (recorded)."""
    from torch import nn

    from ..seeding import kept_rng_state

    with kept_rng_state():
        torch.set_rng_state(torch.as_tensor(head_torch_state, dtype=torch.uint8))
        fc, first, second = nn.Linear(1280, classes), nn.Linear(1280, 1280), nn.Linear(1280, 1024)
    head = {f"model._fc.{k}": v for k, v in fc.state_dict().items()}
    # load_state_dict copies the stand-in's one-element num_batches_tracked into the model's 0-dim buffer
    state = {f"model.{k}": v.reshape(()) if k.endswith("num_batches_tracked") else v
             for k, v in standin.items() if not k.startswith("_fc.")}
    state |= head                                  # the submodule replaced in place: its keys stay last of model.*
    state |= {f"projector.0.{k}": v for k, v in first.state_dict().items()}
    state |= {f"projector.1.{k}": v for k, v in second.state_dict().items()}
    return state


def load_golden(golden: Path) -> tuple[dict, dict]:
    """-> (expected.json, weights.npz arrays) of a golden record folder."""
    golden = Path(golden)
    for name in ("expected.json", "weights.npz", "passes.json", "states.npz"):
        if not (golden / name).is_file():
            raise FileNotFoundError(f"{golden / name} not found: a golden record holds expected.json, weights.npz, "
                                    f"passes.json and states.npz (`fedrepro parity fediic --authors CHECKOUT --save "
                                    f"{golden}` writes them)")
    with np.load(golden / "weights.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return json.loads((golden / "expected.json").read_text()), arrays


def golden_inputs(golden: Path, work: Path, rounds: int | None = None) -> tuple[Inputs, dict, dict, Path]:
    """Rebuild what a golden record's authors' run was fed, checking each digest -> (inputs, expected.json, weights
    arrays, the initial model file)."""
    expected, arrays = load_golden(golden)
    settings, digests = expected["provenance"]["inputs"], expected["provenance"]["digests"]
    inputs = Inputs(Path(work), rounds=rounds or settings["rounds"], batch_size=settings["batch_size"],
                    threads=settings["threads"], stochastic=settings["stochastic"], images=settings["images"],
                    image_size=settings["image_size"], seed=settings["seed"])
    make_inputs(inputs)
    standin = torch.load(inputs.torch_home / "hub" / "checkpoints" / STANDIN_NAME, map_location="cpu", weights_only=True)
    initial = initial_model(standin, arrays["head_init_torch_state"])
    rebuilt = {"pixels_sha256": inputs.facts["pixels_sha256"], "standin_sha256": inputs.facts["standin_sha256"],
               "initial_model_sha256": state_sha256(initial)}
    wrong = {k: v for k, v in rebuilt.items() if digests.get(k) != v}
    if wrong:
        raise GoldenMismatch(f"{golden}: rebuilt here, {sorted(wrong)} differ from the record's (made with torch "
                             f"{expected['provenance']['torch']}; this is torch {torch.__version__}): record it again "
                             f"with `{expected['provenance']['command']}` (docs/parity.md)")
    path = inputs.work / "initial.pt"
    torch.save(initial, path)
    return inputs, expected, arrays, path


def golden_run(golden: Path, work: Path, config: str, rounds: int | None,
               log: logging.Logger) -> tuple[dict, Expected, dict]:
    """fedrepro's replayed run of a golden record and the authors' side of it -> (run, expected, expected.json)."""
    inputs, golden_json, arrays, initial = golden_inputs(golden, work, rounds)
    replay = {"initial_model": str(initial), "layout": "fediic", "record": str(Path(golden))}
    run, _ = fedrepro_run(config, inputs, replay, log)
    positions = arrays["positions"]

    def weights(rnd, client):
        name = "initial" if rnd == "initial" else f"round{rnd}_{'global' if client is None else f'client{client}'}"
        return {"sample": torch.from_numpy(arrays[name]).double()}

    expected = Expected(golden_json["record"], weights, run["train"]["optimizer"]["lr"],
                        view=lambda state: sketch(state, positions),
                        prototypes=lambda rnd: arrays[f"round{rnd}_prototypes"])
    return run, expected, golden_json


def replay_golden(golden: Path, work: Path, config: str, rounds: int | None = None,
                  log: logging.Logger | None = None) -> tuple[list[RoundRow], dict, dict]:
    """fedrepro replayed against a golden record, without the authors' code -> (rows, metrics.json, expected.json)."""
    log = log or logging.getLogger("fedrepro.parity")
    run, expected, golden_json = golden_run(golden, work, config, rounds, log)
    rows, summary = replay_fedrepro(run, expected, log)
    return rows, summary, golden_json


def golden_report(rows: list[RoundRow], summary: dict, expected: dict) -> tuple[str, bool]:
    """The replay against a golden record, as text -> (text, passed)."""
    provenance = expected["provenance"]
    record = expected["record"]
    rounds = len(rows)
    selection = (int(np.argmax([r["bacc"] for r in record["rounds"][:rounds]])) + 1, int(summary["selection"]["round"]))
    verdict, passed = TOLERANCES.verdict(rows, selection)
    text = "\n".join([f"FedIIC replayed against the golden record of {provenance['repository']} at "
                      f"{str(provenance['commit'])[:7]} (torch {provenance['torch']}), {rounds} round(s); weights "
                      f"compared at {SKETCH} sampled positions", table(rows, list(TERMS)),
                      f"selection: authors round {selection[0]}, fedrepro round {selection[1]}", verdict])
    return text, passed
