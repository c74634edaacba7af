"""Drive one configured method through the engine, the way a run does, on a tiny model and fixed data.

A parity test has two sides:

- the project's side: :func:`paper_run` resolves the run config of (paper, setting, method) from the
  real paper file in ``config/papers/`` (so the method's ``params``, optimizer, aggregation weights and
  local work are what a real run gets), shrinks only what makes it slow (the model, rounds, local
  steps, batch size), and :func:`drive` runs it through :func:`fedrepro.fl.engine.run_rounds` - the
  same method class, hooks, local loop, aggregation and evaluation a training job uses;
- the specification's side: an independent re-implementation, in the test file, of what the paper and
  the authors' code do in one round, written from their description (not from the project's code).

Shared plumbing both sides may use, because it is not what a method is: the initial model
(:func:`initial_server`), the mini-batches a client draws (:func:`client_batches`), the seeding of
the global RNG before a client's local work (:func:`seed_client`) and the synthetic data.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from fedrepro.config import deep_merge, input_kind, load_project
from fedrepro.data.loader import FeatureSet
from fedrepro.fl.comm import CommLedger
from fedrepro.fl.engine import RunResult, run_rounds
from fedrepro.fl.federation import ClientData, Federation
from fedrepro.fl.local import local_batches
from fedrepro.fl.method import FederatedMethod, MethodContext
from fedrepro.io import hash_obj
from fedrepro.registry import method_class
from fedrepro.seeding import seed_global

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-6

TINY_CLIP = {"name": "fedrepro-tiny-clip", "pretrained": "none"}


@lru_cache(maxsize=None)
def project():
    """Every paper of the full grid, validated as ``snakemake`` would (config/config.yaml)."""
    return load_project([ROOT / "config/config.yaml"], root=ROOT)


def tiny_model(model: dict) -> dict:
    """The same model family with a small random-init network (the family's code path is unchanged)."""
    out = copy.deepcopy(model)
    if "encoder" in out:
        out["encoder"] = {**out["encoder"], **TINY_CLIP}
        out["encoder"].pop("image_size", None)
    if out["family"] in ("classifier", "protonet", "adapter_protonet"):
        out.update(pretrained=False)
    return out


def paper_run(paper: str, method: str, setting: str | None = None, *, seed: int = 0, train: dict | None = None,
              model: dict | None = None, protocol: str | None = None, params: dict | None = None) -> dict:
    """The resolved run config of a real paper file, with only its size shrunk.

    ``train`` is deep-merged into the train block (rounds, local steps, batch size, ...); ``model``
    replaces the model block (default: :func:`tiny_model` of the configured one). The method's
    ``params`` are what the parity tests check and stay as configured; a mechanism test
    (tests/mechanisms/) that toggles one of them passes ``params``, deep-merged into the resolved
    ones (every key must already exist there: the resolved params carry every schema default).
    ``protocol`` resolves the run under that protocol (a variant's ``protocols`` overrides included)
    unless the setting fixes its own.
    """
    proj = project()
    setting = setting or _first_setting(paper, method)
    run = copy.deepcopy(proj.resolver.run_config(proj.resolver.run_key(paper, setting, method, seed, protocol)))
    if params:
        _check_known(params, run["algorithm"]["params"], f"{paper}/{method} params")
        run["algorithm"]["params"] = deep_merge(run["algorithm"]["params"], params)
    run["train"] = deep_merge(run["train"], train)
    run["train"]["num_workers"] = 0     # loader processes change no result (tests/test_image_cache.py); a job resolves them
    # the specifications step torch's reference (multi-tensor) optimizers; the fused kernels a job uses by
    # default compute the same update up to float rounding (tests/test_engine.py checks that)
    run["train"]["optimizer"]["fused"] = False
    # the specifications compute each loss in one form of the mathematics; a paper's authors' steps (train.arithmetic,
    # e.g. FedIIC's, equal up to rounding) are checked against the authors' own run instead (test_whole_run_golden.py)
    run["train"].pop("arithmetic", None)
    # the specifications compute in fp32; a paper protocol's mixed precision (FACMIC's fp16) is the
    # engine's business, checked in tests/test_precision.py
    run["train"]["precision"] = "fp32"
    run["train"]["model"] = model if model is not None else tiny_model(run["train"]["model"])
    run["input"] = input_kind(run["train"]["model"]["family"])
    run["config_hash"] = hash_obj(run)
    return run


def _check_known(changes: dict, resolved: dict, what: str) -> None:
    for key, value in changes.items():
        if key not in resolved:
            raise KeyError(f"{what}: no parameter {key!r}; known: {sorted(resolved)}")
        if isinstance(value, dict) and isinstance(resolved[key], dict):
            _check_known(value, resolved[key], f"{what}.{key}")


def _first_setting(paper: str, method: str) -> str:
    proj = project()
    for _, name, table in proj.plan.tables():
        for key in proj.plan.table_runs(name, table, "clean") if name == paper else []:
            if key.method == method:
                return key.setting
    for figure in proj.papers[paper].get("figures", {}):
        for key in proj.plan.figure_runs(paper, figure, "clean"):
            if key.method == method:
                return key.setting
    raise KeyError(f"{paper}: no table or figure runs method {method!r}")


@dataclass
class Driven:
    method: FederatedMethod
    result: RunResult

    def probs(self, key: str, rule: str = "last") -> np.ndarray:
        """Class probabilities the engine recorded for eval key ``key`` (e.g. ``global``, ``client0``)."""
        return self.result.predictions[rule][f"{key}/probs"]


def context(run: dict, fed: Federation) -> MethodContext:
    return MethodContext(run, fed, torch.device("cpu"), CommLedger(), logging.getLogger("parity"))


def drive(run: dict, fed: Federation, workdir: Path, observe=None) -> Driven:
    """Run ``run["train"]["rounds"]`` rounds exactly as a training job does (minus file I/O).
    ``observe(method)`` is called before the rounds, e.g. to attach an :class:`UpdateLog`."""
    method = method_class(run["algorithm"]["name"])(context(run, fed))
    if observe is not None:
        observe(method)
    result = run_rounds(method, fed, run, Path(workdir) / "resume.pt")
    return Driven(method, result)


class UpdateLog:
    """Records every client update a method makes while the engine drives it, without changing it:
    ``entries`` = [{"round", "client", "sent": the shared tensors the client received, "payload":
    what it uploaded, "stats", "captured": capture(method) right after the update (or None)}] in the
    engine's order. Attach with ``drive(..., observe=log.attach)``; ``log.method`` is the method."""

    def __init__(self, capture=None):
        self.entries: list[dict] = []
        self.capture = capture
        self.method: FederatedMethod | None = None

    def attach(self, method: FederatedMethod) -> None:
        inner = method.local_update
        self.method = method

        def local_update(client, message, rnd):
            sent = {k: v.detach().clone() for k, v in message.items() if isinstance(v, torch.Tensor)}
            update = inner(client, message, rnd)
            self.entries.append({"round": rnd, "client": client.name, "sent": sent,
                                 "payload": {k: v.detach().clone() for k, v in update.payload.items()},
                                 "stats": dict(update.stats),
                                 "captured": self.capture(method) if self.capture else None})
            return update

        method.local_update = local_update

    def rounds(self, rnd: int) -> list[dict]:
        return [e for e in self.entries if e["round"] == rnd]

    def drift(self, rnd: int, keys=None) -> dict[str, float]:
        """client -> ||w_k - w_g|| in round ``rnd``: the distance between what the client uploaded and
        the global model it received, over the floating-point entries both hold (or ``keys``)."""
        out = {}
        for e in self.entries:
            if e["round"] == rnd:
                common = [k for k in e["payload"] if k in e["sent"] and e["payload"][k].is_floating_point()
                          and (keys is None or k in keys)]
                out[e["client"]] = state_distance(e["payload"], e["sent"], common)
        return out


def task_parameters(method: FederatedMethod, batch: dict) -> list[str]:
    """Names of the parameters of ``method.server`` that the model family's own loss reaches (a
    gradient flows to them) on ``batch``: what the model predicts with, without parts only some
    methods use (e.g. FedIIC's projector in a baseline run)."""
    model = copy.deepcopy(method.server).train()
    model.zero_grad(set_to_none=True)
    out = method.family.forward(model, batch)
    method.family.loss(out, batch).backward()
    return [name for name, p in model.named_parameters() if p.grad is not None]


def state_distance(a: dict, b: dict, keys=None) -> float:
    """||a - b||_2 over the floating-point entries ``keys`` (default: every one of ``a``), in float64."""
    keys = [k for k in (keys if keys is not None else a) if a[k].is_floating_point()]
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in keys) ** 0.5)


def initial_server(run: dict, fed: Federation) -> torch.nn.Module:
    """A copy of the server model a run starts from (built under the run's "init" seed, as the engine does)."""
    method = method_class(run["algorithm"]["name"])(context(run, fed))
    method.setup()
    return copy.deepcopy(method.server)


def seed_client(run: dict, rnd: int, client: ClientData) -> None:
    """What the engine does before a client's local work (dropout, augmentation and timm draw from it)."""
    seed_global(run["seed"], "local", rnd, client.index)


def client_batches(run: dict, client: ClientData, rnd: int, dataset=None) -> list[dict]:
    """The mini-batches the client draws in round ``rnd`` (the project's loader: plumbing, not method)."""
    data = client.train if dataset is None else dataset
    return list(local_batches(data, run["train"], run["seed"], rnd, client.index))


def train_sizes(fed: Federation) -> list[int]:
    return [len(c.train) for c in fed.clients]


def target_batches(run: dict, fed: Federation, client: ClientData, rnd: int) -> Iterator[dict]:
    """The unlabeled target batches the client draws in round ``rnd``, one per local step (plumbing)."""
    from fedrepro.methods._common.target_domain import target_stream

    return target_stream(fed.reference, run["train"], run["seed"], rnd, client.index)


def eval_sets(fed: Federation) -> dict[str, object]:
    """Eval key -> dataset the engine scores every round: each client's test split and the global set."""
    return {**{c.name: c.test for c in fed.clients}, "global": fed.global_test}


def stacked(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of a whole in-memory dataset (cached features or :class:`TensorImages`)."""
    if isinstance(dataset, FeatureSet):
        return dataset.features, dataset.labels
    return dataset.images, torch.as_tensor(dataset.labels)


def assert_probs(driven: "Driven", expected: dict[str, torch.Tensor], what: str, rule: str = "last",
                 tol: float = TOLERANCE) -> None:
    """The engine's evaluated probabilities agree with the specification's on every eval key given."""
    for key, probs in expected.items():
        assert_close(driven.probs(key, rule), probs, f"{what}: probabilities on {key}", tol)


def assert_close(actual, expected, what: str, tol: float = TOLERANCE) -> None:
    """Tensors, arrays or state dicts agree to ``tol`` (max absolute difference)."""
    if isinstance(expected, dict):
        assert set(actual) >= set(expected), f"{what}: missing {sorted(set(expected) - set(actual))[:5]}"
        for key in expected:
            assert_close(actual[key], expected[key], f"{what}[{key}]", tol)
        return
    a = torch.as_tensor(np.asarray(actual) if not isinstance(actual, torch.Tensor) else actual).double()
    e = torch.as_tensor(np.asarray(expected) if not isinstance(expected, torch.Tensor) else expected).double()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    diff = (a - e).abs().max().item() if a.numel() else 0.0
    assert diff <= tol, f"{what}: max |difference| {diff:.3g} > {tol:g}"


# --------------------------------------------------------------------------------------------
# synthetic federations

class TensorImages:
    """Images held in memory: item -> {"x": C x H x W tensor, "y": label, "index": row, **extra}.
    ``labels`` as the loader and the class-balanced sampler expect; ``transform`` is applied per item."""

    def __init__(self, images: torch.Tensor, labels, rows, extra: dict | None = None, transform=None):
        self.images, self.labels = images, np.asarray(labels, dtype=np.int64)
        self.rows, self.extra, self.transform = np.asarray(rows, dtype=np.int64), extra or {}, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict:
        x = self.images[i] if self.transform is None else self.transform(self.images[i])
        return {"x": x, "y": int(self.labels[i]), "index": int(self.rows[i]), **{k: v[i] for k, v in self.extra.items()}}


def _labels(n: int, classes: int, gen: torch.Generator, skew: float) -> torch.Tensor:
    """n labels over ``classes``; skew > 0 gives a long-tailed draw (class c has weight exp(-skew c))."""
    weights = torch.exp(-skew * torch.arange(classes, dtype=torch.float64))
    y = torch.multinomial(weights, n, replacement=True, generator=gen)
    y[:classes] = torch.arange(classes)[: min(n, classes)]       # every class at least once
    return y


def feature_federation(*, dim: int = 16, classes: int = 3, sizes=(12, 16, 20), val: int = 6, test: int = 6,
                       global_test: int = 10, reference: int = 10, seed: int = 0, skew: float = 0.0,
                       nuisance: int = 0) -> Federation:
    """Cached-feature clients (CLIP image features around per-class text features). The last
    ``nuisance`` dimensions of the text features are 0: there the features are noise, no class."""
    gen = torch.Generator().manual_seed(seed)
    text = torch.randn(classes, dim, generator=gen)
    if nuisance:
        text[:, dim - nuisance:] = 0.0
    row = iter(range(10**6))

    def part(n, labelled=True):
        y = _labels(n, classes, gen, skew)
        x = text[y] + 0.7 * torch.randn(n, dim, generator=gen)
        return FeatureSet(x, y if labelled else torch.full((n,), -1), np.array([next(row) for _ in range(n)]))

    clients = [ClientData(f"client{i}", i, part(n), part(val), part(test)) for i, n in enumerate(sizes)]
    return Federation(clients, part(global_test), part(reference, labelled=False) if reference else None,
                      [f"class{c}" for c in range(classes)], {"text_features": text})


def shifted_reference(fed: Federation, n: int, shift: torch.Tensor, *, seed: int = 0, noise: float = 0.7):
    """Replace ``fed.reference`` (cached features) by ``n`` unlabeled target features drawn like the
    clients' (class text feature + ``noise`` x N(0, I)) and moved by ``shift`` (a known domain shift)
    -> their true labels, which the method never sees (its reference has y = -1)."""
    text = fed.extras["text_features"]
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % len(text)
    x = text[y] + noise * torch.randn(n, text.shape[1], generator=gen) + shift
    fed.reference = FeatureSet(x, torch.full((n,), -1), np.arange(10**6, 10**6 + n))
    return y


def image_federation(*, size: int = 32, channels: int = 3, classes: int = 3, sizes=(12, 16, 20), val: int = 6,
                     test: int = 6, global_test: int = 10, reference: int = 0, seed: int = 0, skew: float = 0.0,
                     class_names: list[str] | None = None, extra=None, eval_skew: float | None = None,
                     noise: float = 0.8, separation: float | None = None) -> Federation:
    """In-memory image clients: per-class mean colour patterns plus ``noise`` x N(0, 1) per pixel, already
    normalised tensors. ``extra(y) -> dict of per-item lists`` adds columns (e.g. captions) to every
    dataset. ``eval_skew`` (default: ``skew``) is the label skew of the validation, test and global test
    sets (0 = balanced). ``separation`` rescales the class mean colours so that the closest two are that
    far apart (a known difficulty; default: as drawn)."""
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, channels, 1, 1, generator=gen)
    if separation is not None and classes > 1:
        flat = means.flatten(1)
        closest = torch.pdist(flat).min()
        means = means * (separation / closest)
    row = iter(range(10**6))

    def part(n, labelled=True, train=False):
        y = _labels(n, classes, gen, skew if train or eval_skew is None else eval_skew)
        x = means[y] + noise * torch.randn(n, channels, size, size, generator=gen)
        extra_cols = extra(y) if extra else None
        return TensorImages(x, y.numpy() if labelled else np.full(n, -1), [next(row) for _ in range(n)], extra_cols)

    clients = [ClientData(f"client{i}", i, part(n, train=True), part(val), part(test)) for i, n in enumerate(sizes)]
    names = class_names or [f"class{c}" for c in range(classes)]
    return Federation(clients, part(global_test), part(reference, labelled=False) if reference else None, names)


# --------------------------------------------------------------------------------------------
# more plumbing: small image models, per-client builds, the specification side's optimiser and evaluation

def configured_model(paper: str, method: str, setting: str | None = None, **changes) -> dict:
    """The model block a run of (paper, setting, method) trains, without pretrained weights, with
    ``changes`` (e.g. ``backbone="test_resnet", image_size=32``): the family and its options stay."""
    proj = project()
    setting = setting or _first_setting(paper, method)
    model = copy.deepcopy(proj.resolver.run_config(proj.resolver.run_key(paper, setting, method, 0))["train"]["model"])
    model = tiny_model(model)
    if "pretrained" in model:
        model["pretrained"] = False
    return deep_merge(model, changes)


def family_of(run: dict, fed: Federation):
    from fedrepro.models.families import build_family

    return build_family(run["train"]["model"], fed.class_names, fed.extras)


def built_model(run: dict, fed: Federation, *keys) -> torch.nn.Module:
    """The family's network built under the (seed, "init", *keys) stream; ``keys = (client index,)``
    is a client's own build, for methods whose authors construct one model per client."""
    family = family_of(run, fed)
    seed_global(run["seed"], "init", *keys)
    return family.build()


def optimizer_for(params, cfg: dict) -> torch.optim.Optimizer:
    """torch's optimiser named by a train block's ``optimizer`` (a fresh one, no state)."""
    params = [p for p in params if p.requires_grad]
    if cfg["name"] == "adam":
        return torch.optim.Adam(params, lr=cfg["lr"], betas=tuple(cfg.get("betas", (0.9, 0.999))),
                                eps=cfg.get("eps", 1e-8), weight_decay=cfg.get("weight_decay", 0.0))
    if cfg["name"] == "sgd":
        return torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg.get("momentum", 0.0),
                               weight_decay=cfg.get("weight_decay", 0.0))
    raise ValueError(cfg["name"])


def sgd_steps(model: torch.nn.Module, batches: list[dict], loss_fn, cfg: dict, params=None) -> int:
    """One local pass: for every batch, zero the gradients, loss_fn(model, batch).backward(), step.
    -> the number of steps."""
    opt = optimizer_for(model.parameters() if params is None else params, cfg)
    model.train()
    for batch in batches:
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    return len(batches)


def mean_state(states: list[dict], weights, keys=None) -> dict:
    """sum_i w_i state_i / sum_i w_i per key (float64), for the floating-point entries."""
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    w = w / w.sum()
    keys = [k for k in (keys or states[0]) if states[0][k].is_floating_point()]
    return {k: torch.tensordot(w, torch.stack([s[k].double() for s in states]), dims=1) for k in keys}


def floating(state: dict, keys=None) -> dict:
    """The floating-point entries of a state dict (optionally only ``keys``), detached copies."""
    return {k: v.detach().clone() for k, v in state.items() if v.is_floating_point() and (keys is None or k in keys)}


@torch.no_grad()
def probabilities(scores, dataset) -> torch.Tensor:
    """softmax of ``scores(x)`` (B x C class scores, the model in eval mode) over the whole dataset, in order."""
    x = torch.stack([dataset[i]["x"] for i in range(len(dataset))])
    return torch.softmax(scores(x).float(), dim=1)


def without_class(dataset: TensorImages, label: int) -> TensorImages:
    """The dataset without its items of class ``label`` (a client that lacks a class)."""
    keep = np.flatnonzero(dataset.labels != label)
    extra = {k: [v[i] for i in keep] for k, v in dataset.extra.items()}
    return TensorImages(dataset.images[keep], dataset.labels[keep], dataset.rows[keep], extra, dataset.transform)


def initial_method(run: dict, fed: Federation) -> FederatedMethod:
    """The method as a run sets it up before round 0 (for server-side state a run starts from, e.g.
    CReFF's initial federated features): read its initial state, never drive it."""
    method = method_class(run["algorithm"]["name"])(context(run, fed))
    method.setup()
    return method


def seed_server(run: dict, rnd: int) -> None:
    """What the engine does before the server aggregates round ``rnd`` (fresh server-side inits draw from it)."""
    seed_global(run["seed"], "server", rnd)


def torch_generator_for(run: dict, purpose: str, *keys):
    """The run's keyed torch generator for (purpose, keys) - the stream a method draws a shuffle from."""
    from fedrepro.seeding import torch_generator

    return torch_generator(run["seed"], purpose, *keys)
