"""FedAvgM against its formula (Hsu et al. 2019, Sec. 3), driven through fedrepro's engine as a training job drives it.

The run's train block comes from a paper file resolved by fedrepro (``Project``), the federation is a few clients of
fixed random features, and the model family is a linear one this test registers (a model family plug-in of its own).
The server's state before every round is checked against an independent recursion over what the clients sent:

    w_{t+1} = w_t − η v_t,   v_t = β v_{t−1} + (w_t − Σ_k n_k w_t^k / Σ_k n_k),   v_{−1} = 0

to 1e-6; with β = 0, η = 1 FedAvgM is fedrepro's own FedAvg; and a run resumed from its checkpoint ends where an
uninterrupted one does (the momentum buffer is part of the method's state).

Run: ``pytest examples/fedrepro-fedavgm/tests`` with the package installed (``pip install -e examples/fedrepro-fedavgm``),
from a fedrepro checkout (its workflow/schemas; ``FEDREPRO_ROOT`` names another one).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from fedrepro.config import Project
from fedrepro.data.loader import FeatureSet
from fedrepro.fl.comm import CommLedger
from fedrepro.fl.engine import run_rounds
from fedrepro.fl.federation import ClientData, Federation
from fedrepro.fl.method import MethodContext
from fedrepro.models.families import ModelFamily, Output
from fedrepro.registry import method_class, register_model

ROOT = Path(os.environ.get("FEDREPRO_ROOT", Path(__file__).resolve().parents[3]))
FAMILY = "fedavgm_test_linear"
DIM, CLASSES, SIZES = 6, ["a", "b", "c"], (12, 30, 7)


@register_model(FAMILY, input="features", params={"dim": {"type": "integer", "default": DIM}})
class Linear(ModelFamily):
    """Scores = W x + b on a feature vector: a model family with nothing but its parameters."""

    input_kind = "features"

    def build(self) -> nn.Module:
        return nn.Linear(self.cfg["dim"], self.num_classes)

    def forward(self, model: nn.Module, batch: dict) -> Output:
        logits = model(batch["x"])
        return Output(logits=logits, features=batch["x"], objective=[(logits, batch["y"])])


PAPER = {
    "paper": "tiny", "title": "FedAvgM parity",
    "defaults": {"rounds": 4, "batch_size": 5, "local": {"steps": 3}, "optimizer": {"name": "sgd", "lr": 0.3},
                 "model": {"family": FAMILY}, "aggregation": {"weights": "train_size"},
                 "selection": {"rule": "last"}, "precision": "fp32"},
    "settings": {"three": {"dataset": "demo_fashion", "split": {"kind": "iid", "clients": 3}}},
    "methods": {"fedavg": {}, "fedavgm": {"params": {"momentum": 0.8, "server_lr": 0.7}},
                "fedavgm_plain": {"method": "fedavgm", "params": {"momentum": 0.0, "server_lr": 1.0}}},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    folder = tmp_path_factory.mktemp("papers")
    (folder / "tiny.yaml").write_text(yaml.safe_dump(PAPER))
    return Project({"papers": ["tiny"], "paper_dir": str(folder), "seeds": [0]}, root=ROOT)


def run_of(project: Project, method: str, rounds: int | None = None) -> dict:
    """What a training job gets for ``method``: the resolved train block and params (no files: data is in memory)."""
    train = project.resolver.train_config("tiny", "three", method, "clean")
    train.update(num_workers=0, rounds=rounds or train["rounds"])
    train["optimizer"]["fused"] = False
    algorithm = PAPER["methods"][method].get("method", method)
    return {"paper": "tiny", "setting": "three", "method": method, "seed": 0, "protocol": "clean",
            "algorithm": {"name": algorithm, "params": project.resolver.method_params("tiny", method, "clean")},
            "train": train, "config_hash": method}


def federation() -> Federation:
    gen = torch.Generator().manual_seed(7)
    row = iter(range(10**6))

    def part(n: int, shift: float) -> FeatureSet:
        labels = torch.randint(0, len(CLASSES), (n,), generator=gen)
        x = torch.randn(n, DIM, generator=gen) + shift * nn.functional.one_hot(labels, DIM).float()
        return FeatureSet(x, labels, np.array([next(row) for _ in range(n)]))

    clients = [ClientData(f"client{k}", k, part(n, 1.0 + k), part(4, 1.0), part(4, 1.0)) for k, n in enumerate(SIZES)]
    return Federation(clients, part(9, 1.0), None, CLASSES)


def drive(run: dict, fed: Federation, checkpoint: Path, record: list | None = None):
    method = method_class(run["algorithm"]["name"])(MethodContext(run, fed, torch.device("cpu"), CommLedger(),
                                                                   logging.getLogger("test")))
    if record is not None:
        aggregate = method.aggregate

        def recording(updates, rnd):
            record.append({"before": {k: v.detach().clone() for k, v in method.server.state_dict().items()},
                           "payloads": [(u.payload, u.num_examples) for u in updates]})
            aggregate(updates, rnd)
            record[-1]["after"] = {k: v.detach().clone() for k, v in method.server.state_dict().items()}

        method.aggregate = recording
    run_rounds(method, fed, run, checkpoint)
    return method


def test_every_round_follows_the_formula(project, tmp_path):
    run, record = run_of(project, "fedavgm"), []
    drive(run, federation(), tmp_path / "resume.pt", record)
    beta, eta = 0.8, 0.7
    w = {k: v.double() for k, v in record[0]["before"].items()}
    v = {k: torch.zeros_like(t) for k, t in w.items()}
    for rnd, entry in enumerate(record):
        for k in w:
            assert torch.allclose(entry["before"][k].double(), w[k], atol=1e-6), (rnd, k)
        total = sum(n for _, n in entry["payloads"])
        for k in w:
            average = sum(p[k].double() * n for p, n in entry["payloads"]) / total
            v[k] = beta * v[k] + (w[k] - average)
            w[k] = w[k] - eta * v[k]
        for k in w:
            assert torch.allclose(entry["after"][k].double(), w[k], atol=1e-6), (rnd, k)
    assert len(record) == 4
    # the momentum moved the model away from the clients' average (the test would pass for FedAvg otherwise)
    last = record[-1]
    average = sum(p["weight"].double() * n for p, n in last["payloads"]) / sum(n for _, n in last["payloads"])
    assert (last["after"]["weight"].double() - average).abs().max() > 1e-3


def test_without_momentum_it_is_fedavg(project, tmp_path):
    fedavg = drive(run_of(project, "fedavg"), federation(), tmp_path / "a.pt")
    plain = drive(run_of(project, "fedavgm_plain"), federation(), tmp_path / "b.pt")
    for k, value in fedavg.server.state_dict().items():
        assert torch.allclose(value, plain.server.state_dict()[k], atol=1e-6), k


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(project, tmp_path):
    whole = drive(run_of(project, "fedavgm"), federation(), tmp_path / "whole.pt")
    drive(run_of(project, "fedavgm", rounds=2), federation(), tmp_path / "split.pt")     # stops after round 2 ...
    resumed = drive(run_of(project, "fedavgm"), federation(), tmp_path / "split.pt")    # ... and goes on from there
    assert resumed.velocity, "the momentum buffer came back from the checkpoint"
    for k, value in whole.server.state_dict().items():
        assert torch.allclose(value, resumed.server.state_dict()[k], atol=1e-6), k
