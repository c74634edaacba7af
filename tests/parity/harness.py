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

from fedrepro.config import RunKey, deep_merge, load_project
from fedrepro.fl.comm import CommLedger
from fedrepro.fl.engine import RunResult, run_rounds
from fedrepro.fl.federation import ClientData, FeatureSet, Federation
from fedrepro.fl.local import local_batches
from fedrepro.fl.method import FederatedMethod, MethodContext
from fedrepro.io import hash_obj
from fedrepro.methods import load_class
from fedrepro.seeding import seed_global

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-6

TINY_CLIP = {"name": "fedrepro-tiny-clip", "pretrained": "none"}


@lru_cache(maxsize=None)
def project(protocol: str | None = None):
    """Every paper of the full grid, validated as ``snakemake`` would (config/config.yaml); with
    ``protocol`` the top-level protocol is that one (as ``--config protocol=paper``)."""
    return load_project([ROOT / "config/config.yaml"], overrides={"protocol": protocol} if protocol else None, root=ROOT)


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
              model: dict | None = None, protocol: str | None = None) -> dict:
    """The resolved run config of a real paper file, with only its size shrunk.

    ``train`` is deep-merged into the train block (rounds, local steps, batch size, ...); ``model``
    replaces the model block (default: :func:`tiny_model` of the configured one). The method's
    ``params`` are never touched: they are what the parity test checks. ``protocol`` resolves the run
    under that protocol (a variant's ``protocols`` overrides included) unless the setting fixes its own.
    """
    proj = project(protocol)
    setting = setting or _first_setting(paper, method)
    run = copy.deepcopy(proj.run_config(RunKey(paper, setting, method, seed)))
    if protocol is not None:
        run["protocol"] = protocol
    run["train"] = deep_merge(run["train"], train)
    run["train"]["model"] = model if model is not None else tiny_model(run["train"]["model"])
    run["impl"]["model"] = proj.catalog.implementation("model", run["train"]["model"]["family"])
    run["input"] = proj.catalog.input_kind(run["train"]["model"]["family"])
    run["config_hash"] = hash_obj(run)
    return run


def _first_setting(paper: str, method: str) -> str:
    proj = project()
    for table in proj.papers[paper].get("tables", {}):
        for setting, m in proj.table_cells(paper, table):
            if m == method:
                return setting
    for figure in proj.papers[paper].get("figures", {}):
        for key in proj.figure_runs(paper, figure):
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


def drive(run: dict, fed: Federation, workdir: Path) -> Driven:
    """Run ``run["train"]["rounds"]`` rounds exactly as a training job does (minus file I/O)."""
    method = load_class(run["impl"]["method"])(context(run, fed))
    result = run_rounds(method, fed, run, Path(workdir) / "resume.pt")
    return Driven(method, result)


def initial_server(run: dict, fed: Federation) -> torch.nn.Module:
    """A copy of the server model a run starts from (built under the run's "init" seed, as the engine does)."""
    method = load_class(run["impl"]["method"])(context(run, fed))
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
    from fedrepro.methods.target_domain import target_stream

    return target_stream(fed.reference, run["train"], run["seed"], rnd, client.index)


def eval_sets(fed: Federation) -> dict[str, object]:
    """Eval key -> dataset the engine scores every round: each client's test split and the global set."""
    return {**{c.name: c.test for c in fed.clients}, "global": fed.global_test}


def stacked(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of a whole in-memory dataset (cached features or :class:`TensorImages`)."""
    if isinstance(dataset, FeatureSet):
        return dataset.features, dataset.labels
    return dataset.images, torch.as_tensor(dataset.labels)


def assert_probs(driven: "Driven", expected: dict[str, torch.Tensor], what: str, rule: str = "last") -> None:
    """The engine's evaluated probabilities agree with the specification's on every eval key given."""
    for key, probs in expected.items():
        assert_close(driven.probs(key, rule), probs, f"{what}: probabilities on {key}")


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
                       global_test: int = 10, reference: int = 10, seed: int = 0, skew: float = 0.0) -> Federation:
    """Cached-feature clients (CLIP image features around per-class text features)."""
    gen = torch.Generator().manual_seed(seed)
    text = torch.randn(classes, dim, generator=gen)
    row = iter(range(10**6))

    def part(n, labelled=True):
        y = _labels(n, classes, gen, skew)
        x = text[y] + 0.7 * torch.randn(n, dim, generator=gen)
        return FeatureSet(x, y if labelled else torch.full((n,), -1), np.array([next(row) for _ in range(n)]))

    clients = [ClientData(f"client{i}", i, part(n), part(val), part(test)) for i, n in enumerate(sizes)]
    return Federation(clients, part(global_test), part(reference, labelled=False) if reference else None,
                      [f"class{c}" for c in range(classes)], {"text_features": text})


def image_federation(*, size: int = 32, channels: int = 3, classes: int = 3, sizes=(12, 16, 20), val: int = 6,
                     test: int = 6, global_test: int = 10, reference: int = 0, seed: int = 0, skew: float = 0.0,
                     class_names: list[str] | None = None, extra=None) -> Federation:
    """In-memory image clients: per-class mean colour patterns plus noise, already normalised tensors.
    ``extra(y) -> dict of per-item lists`` adds columns (e.g. captions) to every dataset."""
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, channels, 1, 1, generator=gen)
    row = iter(range(10**6))

    def part(n, labelled=True):
        y = _labels(n, classes, gen, skew)
        x = means[y] + 0.8 * torch.randn(n, channels, size, size, generator=gen)
        extra_cols = extra(y) if extra else None
        return TensorImages(x, y.numpy() if labelled else np.full(n, -1), [next(row) for _ in range(n)], extra_cols)

    clients = [ClientData(f"client{i}", i, part(n), part(val), part(test)) for i, n in enumerate(sizes)]
    names = class_names or [f"class{c}" for c in range(classes)]
    return Federation(clients, part(global_test), part(reference, labelled=False) if reference else None, names)
