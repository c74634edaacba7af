"""The interface every federated method implements, and the model-averaging base most of them share.

The engine (:mod:`fedrepro.fl.engine`) drives rounds and knows no method. A method answers four
questions, in the spirit of Flower's ``Strategy``:

- ``broadcast(rnd)``: what does the server send to every client this round?
- ``local_update(client, message, rnd)``: what does a client do with it, and what does it send back?
- ``aggregate(updates, rnd)``: how does the server combine the replies?
- ``predict(dataset, client)``: which model answers for a client (or for the global test set)?

:class:`ModelAveraging` implements the FedAvg family once: a server model, clients that start from
its *shared* part, optimise ``local_loss`` for the configured local work, and a weighted average of
what they send. Most methods only override ``local_loss`` (a regulariser, another loss) and perhaps
``shared_keys`` (what is communicated) or ``aggregation_weights``.
"""

from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import nn

from ..data.loader import batches
from ..device import Compute, backward_step
from ..models.families import ModelFamily, Output, build_family
from ..seeding import seed_global
from ..timing import Phases
from .client_state import ClientStates, check_committed
from .comm import CommLedger
from .evaluation import evaluate
from .federation import ClientData, Federation
from .local import local_batches, make_optimizer, optimizer_factor
from .replay import Plan, Replay


@dataclass
class ClientUpdate:
    client: str
    payload: dict[str, torch.Tensor]          # what the client uploads (counted by the engine)
    num_examples: int                         # size of the local training set (aggregation weight)
    stats: dict[str, float] = field(default_factory=dict)   # local loss etc., for the logs


@dataclass
class MethodContext:
    run: dict                   # the resolved run config (fedrepro.config.resolve.Resolver.run_config)
    federation: Federation
    device: torch.device
    comm: CommLedger
    log: logging.Logger
    state_dir: Path | None = None   # where per-client state may be kept between turns (paths.client_states)
    phases: Phases = field(default_factory=Phases)   # where the job's time goes (a method times its own extra passes)
    replay: Replay | None = None    # a recorded run's initial model and data passes (run["replay"]; fl/replay.py)

    @property
    def seed(self) -> int:
        return self.run["seed"]

    @property
    def train(self) -> dict:
        return self.run["train"]

    @property
    def params(self) -> dict:
        return self.run["algorithm"]["params"]


class FederatedMethod(ABC):
    personalized = False        # True: every client keeps and is evaluated with a model of its own

    def __init__(self, ctx: MethodContext):
        self.ctx = ctx
        self.fed = ctx.federation
        self.device = ctx.device
        self.params = ctx.params
        # precision and memory layout (fedrepro.device); channels_last is settled once the model exists
        self.compute = Compute.for_run(ctx.train, ctx.device)
        self.stores: dict[str, ClientStates] = {}
        self.round = -1

    def client_states(self, name: str) -> ClientStates:
        """A ``client -> state`` mapping kept in memory or one file per client (``train.client_state``,
        :mod:`fedrepro.fl.client_state`); its entries are checkpointed with the method's state."""
        store = ClientStates(name, self.ctx.train.get("client_state", "memory"), self.ctx.state_dir,
                             len(self.fed.clients))
        store.round = self.round
        self.stores[name] = store
        return store

    def start_round(self, rnd: int) -> None:
        """Called by the engine before round ``rnd``'s broadcast."""
        self.round = rnd
        for store in self.stores.values():
            store.round = rnd

    def verify_checkpoint(self, state: dict) -> None:
        """Before ``load_state_dict(state)`` on resume: every per-client state file the checkpoint's ``state`` names
        is there and intact (:func:`fedrepro.fl.client_state.check_committed`), else a ``ClientStateError``."""
        check_committed(self.ctx.state_dir, state)

    def checkpoint_committed(self) -> None:
        """Called by the engine once ``resume.pt`` holds the method's state: client-state files it no
        longer names are deleted."""
        for store in self.stores.values():
            store.committed()

    def recorded_pass(self, purpose: str, *keys: int) -> Plan | None:
        """The batches a replayed run takes for one data pass (``purpose`` and its keys, e.g. ``local``, round,
        client), or None: no replay, or one whose record holds no pass of this purpose (:mod:`fedrepro.fl.replay`)."""
        return self.ctx.replay.plan(purpose, *keys) if self.ctx.replay is not None else None

    def autocast(self):
        """The context every forward pass of this method's training and evaluation runs in."""
        return self.compute.autocast()

    def to_device(self, batch: dict) -> dict:
        """A batch on the method's device, images in the model's memory layout."""
        return self.compute.batch(batch)

    @classmethod
    def check_run(cls, params: dict, train: dict) -> list[str]:
        """What the method cannot run correctly with ``params`` under the resolved train block ``train`` (its optimizer,
        local work, model, precision, ...): one line per problem, naming the key as ``train/<key>/...`` and the fix;
        [] when it can. Asked for every run before any job (``fedrepro validate``, the workflow) and again by the job:
        a method correct only under plain SGD refuses another optimizer here instead of failing in ``setup``."""
        return []

    @classmethod
    def caption_note(cls, params: dict) -> str | None:
        """What a table's caption says about a row or column of this method run with ``params``: a choice its
        readers need to read the numbers (e.g. Centralized's budget per round), or None."""
        return None

    @classmethod
    def reads_target(cls, params: dict) -> bool:
        """Whether training with ``params`` reads the unlabeled target set (``fed.reference``: the
        domain-adaptation methods). The configuration check asks, before any job, because under the
        paper protocol that set is the global test set."""
        return False

    @classmethod
    def eval_prefixes(cls, params: dict) -> list[str]:
        """Prefixes of the extra eval keys ``evaluate`` adds with ``params`` (e.g. ``turn25.`` for the models
        a method keeps from one round), so that the configuration check knows the keys tables may name."""
        return []

    def participants(self) -> list[ClientData]:
        """The clients that train each round (all, in sorted order, unless a method says otherwise)."""
        return self.fed.clients

    @abstractmethod
    def setup(self) -> None:
        """Build models and state. Called once, before round 0 (and before a checkpoint is loaded)."""

    @abstractmethod
    def broadcast(self, rnd: int) -> dict[str, torch.Tensor]: ...

    @abstractmethod
    def local_update(self, client: ClientData, message: dict, rnd: int) -> ClientUpdate: ...

    @abstractmethod
    def aggregate(self, updates: list[ClientUpdate], rnd: int) -> None: ...

    @abstractmethod
    def predict(self, dataset, client: ClientData | None) -> np.ndarray:
        """Class probabilities (N x C) of ``client``'s model, or the global model for ``None``."""

    @abstractmethod
    def state_dict(self) -> dict: ...

    @abstractmethod
    def load_state_dict(self, state: dict) -> None: ...

    def final_model(self) -> dict:
        """What is saved as the run's model checkpoint (default: the whole method state)."""
        return self.state_dict()

    def memory_layout(self) -> dict:
        """What the method keeps besides the model it trains, in bytes, for the memory estimate
        (:mod:`fedrepro.cost.memory`): ``device_models`` = full model copies on the compute device,
        ``per_client`` = store -> bytes each client keeps between its turns, ``host_extra`` = other host
        copies. Called on an instance whose ``server`` was built on the meta device and whose ``shared``
        keys are set; ``setup`` has not run."""
        return {"device_models": 2, "per_client": {}, "host_extra": 0}

    def evaluate(self, fed: Federation) -> tuple[dict, dict]:
        """Per-round evaluation -> (flat metrics ``{"<eval>/<metric>": value}``, predictions ``{"<eval>": (probs, labels)}``).

        By the model family's task (:func:`fedrepro.fl.evaluation.evaluate`): classification, or
        image-text retrieval; a method with another task overrides this and returns its own metric names.
        """
        return evaluate(self, fed)


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Sum_i w_i * state_i per key, with weights normalised to 1; integer tensors (BN step counters)
    are averaged in float and rounded back. A model with fp16 entries (precision fp16_weights) is averaged as the
    FACMIC and FAA-CLIP code does it (AIPMLab/FACMIC ``utils/aggregation.py::communication``): per floating entry
    ``temp = zeros_like(entry, float32); temp += w_i * entry_i`` (the product in the entry's dtype, fp16 for the
    fp16 weights), copied into the entry's dtype."""
    w = torch.tensor(weights, dtype=torch.float64)
    w = w / w.sum()
    authors_fp16 = any(v.dtype == torch.float16 for v in states[0].values())
    out = {}
    for key in states[0]:
        if authors_fp16 and states[0][key].is_floating_point():
            total = torch.zeros_like(states[0][key], dtype=torch.float32)
            for weight, state in zip(w.tolist(), states):
                total += weight * state[key]
            out[key] = total.to(states[0][key].dtype)
            continue
        stacked = torch.stack([s[key].to(torch.float64) for s in states])
        mean = torch.tensordot(w.to(stacked.device), stacked, dims=1)
        ref = states[0][key]
        out[key] = (mean.round() if not ref.is_floating_point() else mean).to(ref.dtype)
    return out


class ModelAveraging(FederatedMethod):
    """FedAvg and everything built like it (McMahan et al., AISTATS'17).

    The server holds ``self.server``; each client trains ``self.work`` (one module reused by all
    clients in turn, so memory does not grow with the number of clients) after loading the server's
    shared parameters and its own private ones (e.g. a local domain classifier or local BatchNorm).

    ``train.client_eval: local`` evaluates every client with the model it holds after its last local
    update (before aggregation) instead of the aggregated one, as papers that report one accuracy per
    client model do; it makes the method personalized for evaluation (eval keys ``<client>@global``).
    """

    def setup(self) -> None:
        train = self.ctx.train
        self.family: ModelFamily = build_family(train["model"], self.fed.class_names,
                                                self.fed.extras).to(self.device)
        seed_global(self.ctx.seed, "init")
        self.server: nn.Module = self.build_model().to(self.device)
        replay = self.ctx.replay
        if replay is not None and replay.initial_state is not None:      # a replay starts where the recorded run did
            own = self.server.state_dict()
            self.server.load_state_dict(self.family.authors_state(replay.initial_state, replay.layout, own))
        self.compute = self.compute.with_model(train.get("channels_last", "auto"), self.server)
        self.compute.prepare(self.server)
        self.compute.round_weights(self.server)       # fp16_weights: the model starts in fp16, as clip.load gives it
        self.work: nn.Module = copy.deepcopy(self.server)
        self.shared: list[str] = self.shared_keys()
        self.private = self.client_states("private")            # client -> its private (non-shared) tensors
        self.optimizer_states = self.client_states("optimizer")  # client -> optimizer state (optimizer.persist)
        self.scalers: dict[str, dict] = {}                       # client -> fp16 gradient scaler state (a few numbers)
        # a client's private parameters start where the server's did, not where the previous client left them
        initial = self.server.state_dict()
        self.initial_private = {k: v.detach().cpu().clone() for k, v in initial.items() if k not in set(self.shared)}
        self.local_models = self.client_states("local_models")  # client -> its model after local training (client_eval: local)
        if self.ctx.train.get("client_eval", "global") == "local":
            self.personalized = True

    # ---- hooks ----------------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        return self.family.build()

    def shared_keys(self) -> list[str]:
        """State-dict keys that are communicated and averaged (default: all of them)."""
        return list(self.server.state_dict().keys())

    def local_loss(self, model: nn.Module, batch: dict, client: ClientData, rnd: int) -> tuple[torch.Tensor, Output]:
        out = self.family.forward(model, batch)
        return self.family.loss(out, batch), out

    def before_local_training(self, client: ClientData, rnd: int) -> None:
        """Called after the client's model is loaded, before its optimiser steps (e.g. snapshot anchors)."""

    def after_local_training(self, client: ClientData, rnd: int) -> None:
        """Called after local training, before the update is packed."""

    def aggregation_weights(self, updates: list[ClientUpdate]) -> list[float]:
        """``train.aggregation.weights``: train_size = n_i, uniform = 1, full_batches = (n_i // B) * B
        (the samples of the client's full batches: FACMIC's code weighs by len(drop_last loader) x batch
        size; a client smaller than one batch, which the loader gives its one partial batch, weighs n_i)."""
        rule = self.ctx.train["aggregation"]["weights"]
        if rule == "uniform":
            return [1.0] * len(updates)
        if rule == "full_batches":
            size = self.ctx.train["batch_size"]
            return [float(u.num_examples // size * size if u.num_examples >= size else u.num_examples) for u in updates]
        return [float(u.num_examples) for u in updates]

    def trainable_parameters(self, model: nn.Module):
        return model.parameters()

    def state_bytes(self, keys=None) -> int:
        """Bytes of the server's state (or of the entries in ``keys``): the memory estimate's unit."""
        return sum(v.numel() * v.element_size() for k, v in self.server.state_dict().items() if keys is None or k in keys)

    def memory_layout(self) -> dict:
        """Server and working copy on the device; per client: its private (non-shared) tensors, its
        optimizer state under ``optimizer.persist``, its local model under ``client_eval: local``."""
        train, state = self.ctx.train, self.server.state_dict()
        private = self.state_bytes(set(state) - set(self.shared))
        trainable = sum(p.numel() * p.element_size() for p in self.server.parameters() if p.requires_grad)
        per_client = {"private": private}
        if train["optimizer"].get("persist"):
            per_client["optimizer"] = optimizer_factor(train["optimizer"]) * trainable
        if train.get("client_eval", "global") == "local":
            per_client["local_models"] = self.state_bytes()
        return {"device_models": 2, "per_client": per_client, "host_extra": private}

    def local_config(self, client: ClientData, rnd: int) -> dict:
        """The train block that governs ``client``'s local work in round ``rnd`` (``local`` steps or
        epochs, ``optimizer``); default: the run's. Methods whose local work varies by round or
        client (training stages, per-client step sizes) return a modified copy."""
        return self.ctx.train

    def separate_client_builds(self) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        """Every client's model built on its own, under the (seed, "init", client) stream -> (client,
        state dict on the CPU), one at a time. For methods whose authors construct one model per client
        instead of copying one initial model: pretrained weights are the same for all, random parts
        (adapters, heads) differ per client. Call it in ``setup`` (it reseeds the global RNGs)."""
        for client in self.fed.clients:
            seed_global(self.ctx.seed, "init", client.index)
            yield client.name, _cpu(self.build_model().state_dict())

    # ---- the protocol ---------------------------------------------------------------------
    def broadcast(self, rnd: int) -> dict[str, torch.Tensor]:
        state = self.server.state_dict()
        return {k: state[k] for k in self.shared}

    def load_client_model(self, client: ClientData, message: dict) -> nn.Module:
        mine = self.private.get(client.name) or self.initial_private
        state = {**message, **{k: v.to(self.device) for k, v in mine.items()}}
        self.work.load_state_dict(state, strict=False)
        return self.work

    def local_update(self, client: ClientData, message: dict, rnd: int) -> ClientUpdate:
        model = self.load_client_model(client, message)
        model.train()
        train = self.local_config(client, rnd)
        persist = train["optimizer"].get("persist")
        optimizer = make_optimizer(self.trainable_parameters(model), train["optimizer"])
        self.compute.keep_fp16_weights(optimizer, model)     # fp16_weights: each step in fp32, the weights back in fp16
        if persist and client.name in self.optimizer_states:
            optimizer.load_state_dict(self.optimizer_states[client.name])
        scaler = self.compute.scaler()      # fp16: the client's loss scale carries over from its last turn
        if scaler is not None and client.name in self.scalers:
            scaler.load_state_dict(self.scalers[client.name])
        self.before_local_training(client, rnd)
        losses, terms = [], {}
        plan = self.recorded_pass("local", rnd, client.index)
        for batch in local_batches(client.train, train, self.ctx.seed, rnd, client.index, plan):
            batch = self.to_device(batch)
            with self.autocast():
                loss, out = self.local_loss(model, batch, client, rnd)
            backward_step(loss, optimizer, scaler)
            losses.append(loss.detach())
            for name, value in out.extra.get("terms", {}).items():
                terms.setdefault(name, []).append(value.detach())
        self.after_local_training(client, rnd)
        state = model.state_dict()
        private_keys = [k for k in state if k not in set(self.shared)]
        if private_keys:
            self.private[client.name] = {k: state[k].detach().cpu().clone() for k in private_keys}
        if persist:
            self.optimizer_states[client.name] = _cpu(optimizer.state_dict())
        if scaler is not None:
            self.scalers[client.name] = scaler.state_dict()
        optimizer.state.clear()   # free the moments now: an optimizer lives in a reference cycle until the next GC
        if self.ctx.train.get("client_eval", "global") == "local":
            self.local_models[client.name] = _cpu(state)
        return ClientUpdate(
            client=client.name,
            payload={k: state[k].detach().clone() for k in self.shared},
            num_examples=len(client.train),
            stats={"loss": float(torch.stack(losses).mean()) if losses else float("nan"), "steps": len(losses),
                   # every step's loss and the terms it is made of (``Output.extra["terms"]``), for comparisons
                   "step_losses": torch.stack(losses).tolist() if losses else [],
                   "step_terms": {name: torch.stack(values).tolist() for name, values in terms.items()}},
        )

    def aggregate(self, updates: list[ClientUpdate], rnd: int) -> None:
        averaged = weighted_average([u.payload for u in updates], self.aggregation_weights(updates))
        self.server.load_state_dict(averaged, strict=False)
        self.compute.round_weights(self.server)       # fp16_weights: the average is copied into fp16 weights

    # ---- evaluation -------------------------------------------------------------------------
    def model_for(self, client: ClientData | None) -> nn.Module:
        if client is None or not self.personalized:
            return self.server
        if client.name in self.local_models:
            self.work.load_state_dict({k: v.to(self.device) for k, v in self.local_models[client.name].items()})
            return self.work
        return self.load_client_model(client, self.broadcast(-1))

    @torch.no_grad()
    def predict(self, dataset, client: ClientData | None) -> np.ndarray:
        model = self.model_for(client)
        was_training = model.training
        model.eval()
        probs = []
        for batch in batches(dataset, self.ctx.train["eval_batch_size"], shuffle=False,
                             num_workers=self.ctx.train.get("num_workers", 0)):
            with self.autocast():
                scores = self.class_scores(model, self.to_device(batch))
            probs.append(torch.softmax(scores.float(), dim=1).cpu())
        model.train(was_training)
        return torch.cat(probs).numpy() if probs else np.zeros((0, self.fed.num_classes), dtype=np.float32)

    def class_scores(self, model: nn.Module, batch: dict) -> torch.Tensor:
        """B x C scores whose softmax is the prediction (default: the family's, see
        :meth:`ModelFamily.class_scores`)."""
        return self.family.class_scores(model, batch)

    # ---- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"server": _cpu(self.server.state_dict()), "private": self.private.state_dict(),
                "optimizer": self.optimizer_states.state_dict(), "scalers": dict(self.scalers),
                "local_models": self.local_models.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.server.load_state_dict(state["server"])
        self.private.load_state_dict(state["private"])
        self.optimizer_states.load_state_dict(state["optimizer"])
        self.scalers = dict(state["scalers"])
        self.local_models.load_state_dict(state["local_models"])

    def final_model(self) -> dict:
        return {"server": _cpu(self.server.state_dict())}


def _cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj
