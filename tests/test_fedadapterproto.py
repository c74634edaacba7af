"""FedAdapterProto (docs/papers/fedadapterproto.md): losses and updates against hand-computed values, the model's parts,
FedNova / FedProto, the site split (correct and the authors' leaking indexing), the fundus data
preparers, the class-balanced sampler, and one end-to-end run of the demo config with its figure."""

from __future__ import annotations

import copy
import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from conftest import build_image_caches, draw_figure
from fedrepro import paths
from fedrepro.config import load_project
from fedrepro.data.datasets.fundus import circle_crop
from fedrepro.data.download import ManualStepRequired, download_dataset
from fedrepro.data.loader import class_balanced_order
from fedrepro.data.partition import SplitError, make_split
from fedrepro.data.prepare import prepare_dataset
from fedrepro.embed import high_activation_box
from fedrepro.fl.comm import CommLedger
from fedrepro.fl.federation import ClientData, Federation
from fedrepro.fl.method import ClientUpdate, MethodContext
from fedrepro.methods.fedadapterproto import (
    adapter_penalty,
    client_weights,
    cluster_cost,
    separation_cost,
    wrong_class_l1,
)
from fedrepro.methods.fednova import fednova_update, normalising_factor
from fedrepro.methods.fedproto import aggregate_prototypes, prototype_regulariser
from fedrepro.models.protoadapter import (
    BottleneckAdapter,
    PrototypeHead,
    class_identity,
    distance_to_similarity,
    last_layer_init,
    prototype_distances,
)
from fedrepro.registry import dataset, method_class, model_class

ROOT = Path(__file__).resolve().parents[1]
ARTEFACTS = ROOT / "results" / "test-artefacts"     # files a human may want to look at after a CI run


# --------------------------------------------------------------------------------------------
# the model's parts

def test_adapter_is_residual_bottleneck():
    adapter = BottleneckAdapter(channels=2, reduction=2)          # 2 -> 1 -> 2
    with torch.no_grad():
        adapter.down.weight.copy_(torch.tensor([1.0, -1.0]).view(1, 2, 1, 1))
        adapter.down.bias.zero_()
        adapter.up.weight.copy_(torch.tensor([2.0, 3.0]).view(2, 1, 1, 1))
        adapter.up.bias.copy_(torch.tensor([0.5, 0.0]))
    h = torch.tensor([[3.0, 1.0], [1.0, 4.0]]).view(1, 2, 1, 2)     # channel 0 = (3, 1), channel 1 = (1, 4)
    # position 0: relu(3 - 1) = 2 -> + (2*2 + .5, 3*2) ; position 1: relu(1 - 4) = 0 -> + (0.5, 0)
    expected = torch.tensor([[3 + 4.5, 1 + 0.5], [1 + 6.0, 4 + 0.0]]).view(1, 2, 1, 2)
    assert torch.allclose(adapter(h), expected)
    identity = BottleneckAdapter(channels=32, reduction=16, init="identity")
    x = torch.randn(2, 32, 3, 3)
    assert torch.equal(identity(x), x)


def test_prototype_distances_and_similarity_by_hand():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]]).view(1, 2, 1, 2)     # positions (1, 0) and (0, 2)
    protos = torch.tensor([[1.0, 1.0], [0.0, 0.0]]).view(2, 2, 1, 1)
    d = prototype_distances(z, protos)
    # p0 = (1, 1): (0 + 1, 1 + 1) = (1, 2);  p1 = (0, 0): (1, 4)
    assert torch.allclose(d, torch.tensor([[1.0, 2.0], [1.0, 4.0]]).view(1, 2, 1, 2))
    min_d = d.flatten(2).min(dim=2).values
    assert torch.allclose(distance_to_similarity(min_d, "linear"), torch.tensor([[-1.0, -1.0]]))
    assert torch.allclose(distance_to_similarity(torch.tensor([0.0]), "log"), torch.log(torch.tensor([1 / 1e-4])))
    # a 2x1 prototype against a 2x2 map: one patch per column
    z2 = torch.arange(4.0).view(1, 1, 2, 2)                           # [[0, 1], [2, 3]]
    p2 = torch.tensor([0.0, 2.0]).view(1, 1, 2, 1)
    assert torch.allclose(prototype_distances(z2, p2), torch.tensor([[[[0.0, 2.0]]]]))


def test_class_identity_and_last_layer_init():
    identity = class_identity(num_classes=2, per_class=2)
    assert identity.tolist() == [[1, 0], [1, 0], [0, 1], [0, 1]]
    assert last_layer_init(identity).tolist() == [[1.0, 1.0, -0.5, -0.5], [-0.5, -0.5, 1.0, 1.0]]
    torch.manual_seed(0)
    head = PrototypeHead(8, num_classes=2, per_class=2, dim=4)
    assert torch.equal(head.last_layer.weight, last_layer_init(identity))
    assert head.last_layer.bias.abs().min() > 0      # torch's default init: the code never zeroes the bias


# --------------------------------------------------------------------------------------------
# the local loss terms

IDENTITY = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])   # prototypes 0,1 -> class 0; 2,3 -> class 1
MIN_D = torch.tensor([[0.5, 2.0, 3.0, 1.0],
                      [4.0, 0.25, 6.0, 8.0]])
LABELS = torch.tensor([0, 1])


def test_cluster_and_separation_costs():
    # sample 0 (class 0): own {0.5, 2} -> 0.5, other {3, 1} -> 1;  sample 1 (class 1): own {6, 8} -> 6, other {4, .25} -> .25
    assert cluster_cost(MIN_D, LABELS, IDENTITY).item() == pytest.approx((0.5 + 6) / 2)
    assert separation_cost(MIN_D, LABELS, IDENTITY).item() == pytest.approx((1 + 0.25) / 2)
    # the code's max-distance trick: the same below max_dist; max_dist where every candidate exceeds it
    assert cluster_cost(MIN_D, LABELS, IDENTITY, max_dist=16.0).item() == pytest.approx((0.5 + 6) / 2)
    assert cluster_cost(MIN_D, LABELS, IDENTITY, max_dist=5.0).item() == pytest.approx((0.5 + 5) / 2)
    assert separation_cost(MIN_D, LABELS, IDENTITY, max_dist=0.5).item() == pytest.approx((0.5 + 0.25) / 2)


def test_wrong_class_l1_counts_only_wrong_connections():
    weight = torch.tensor([[1.0, -2.0, 3.0, -4.0],      # class 0: prototypes 2, 3 are wrong: |3| + |-4|
                           [5.0, 6.0, -7.0, 8.0]])     # class 1: prototypes 0, 1 are wrong: |5| + |6|
    assert wrong_class_l1(weight, IDENTITY).item() == pytest.approx(3 + 4 + 5 + 6)


def test_adapter_penalty_code_vs_paper():
    params = [torch.tensor([3.0, 4.0]), torch.tensor([[1.0, 2.0], [2.0, 4.0]])]
    assert adapter_penalty(params, squared=False).item() == pytest.approx(5.0 + 5.0)     # ||.||_2 per tensor (code)
    assert adapter_penalty(params, squared=True).item() == pytest.approx(25.0 + 25.0)    # ||alpha||^2 (paper)


def test_client_weights():
    assert client_weights("steps_x_size", [10, 30], [1, 2]) == [10.0, 60.0]
    assert client_weights("uniform", [10, 30], [1, 2]) == [1.0, 1.0]
    assert client_weights("steps", [10, 30], [1, 2]) == [1.0, 2.0]
    with pytest.raises(ValueError, match="allowed"):
        client_weights("fednova", [1], [1])


# --------------------------------------------------------------------------------------------
# FedNova and FedProto maths

def test_fednova_normalised_averaging_by_hand():
    g = {"w": torch.tensor([0.0, 0.0]), "bn": torch.tensor([0.0])}
    clients = [{"w": torch.tensor([1.0, 2.0]), "bn": torch.tensor([1.0])},
               {"w": torch.tensor([3.0, 0.0]), "bn": torch.tensor([3.0])}]
    # p = (1/2, 1/2), a = (1, 3): d = (-1, -1), tau_eff = 2 -> w = (2, 2); buffers: plain mean 2
    out = fednova_update(g, clients, [1.0, 1.0], [1.0, 3.0], {"w"})
    assert torch.allclose(out["w"], torch.tensor([2.0, 2.0])) and torch.allclose(out["bn"], torch.tensor([2.0]))
    # equal local work: FedNova is FedAvg, (2, 1) here
    assert torch.allclose(fednova_update(g, clients, [1.0, 1.0], [2.0, 2.0], {"w"})["w"], torch.tensor([2.0, 1.0]))


def test_fednova_momentum_factor():
    # rho = 0.5, two steps: the first gradient counts 1 + rho, the second 1
    assert normalising_factor(2, 0.5) == pytest.approx(2.5)
    assert normalising_factor(7) == 7.0


def test_fedproto_aggregation_and_regulariser():
    local = [torch.tensor([[1.0, 1.0], [0.0, 0.0]]), torch.tensor([[3.0, 5.0], [2.0, 4.0]])]
    counts = [torch.tensor([1.0, 0.0]), torch.tensor([3.0, 2.0])]
    mean, present = aggregate_prototypes(local, counts, "mean")
    assert torch.allclose(mean, torch.tensor([[2.0, 3.0], [2.0, 4.0]])) and present.tolist() == [True, True]
    weighted, _ = aggregate_prototypes(local, counts, "weighted")
    assert torch.allclose(weighted, torch.tensor([[2.5, 4.0], [2.0, 4.0]]))       # (1*(1,1) + 3*(3,5)) / 4
    features = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    protos = torch.tensor([[0.0, 1.0], [5.0, 5.0]])
    # sample 0 vs class 0 prototype: squared diffs (1, 4); sample 1's class 1 has no prototype -> 0
    present = torch.tensor([True, False])
    labels = torch.tensor([0, 1])
    assert prototype_regulariser(features, labels, protos, present, "mse").item() == pytest.approx((2.5 + 0) / 2)
    assert prototype_regulariser(features, labels, protos, present, "squared_l2").item() == pytest.approx((5 + 0) / 2)


# --------------------------------------------------------------------------------------------
# methods on a tiny in-memory federation

class TensorImages:
    """An image dataset held in memory (same item format as ManifestImages)."""

    def __init__(self, x: torch.Tensor, y, offset: int = 0):
        self.x, self.labels, self.rows = x, np.asarray(y), np.arange(offset, offset + len(y))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": int(self.labels[i]), "index": int(self.rows[i])}


@pytest.fixture(scope="module")
def demo_project():
    return load_project([ROOT / "config/demo.yaml"], {"papers": ["fedadapterproto"]}, root=ROOT)


def tiny_method(project, method: str, **train):
    gen = torch.Generator().manual_seed(0)
    clients = []
    for i, n in enumerate((12, 6)):
        x = torch.randn(n, 3, 24, 24, generator=gen)
        clients.append(ClientData(f"client{i}", i, TensorImages(x, [k % 2 for k in range(n)], 100 * i),
                                  TensorImages(x[:2], [0, 1]), TensorImages(x[:0], [])))
    fed = Federation(clients, TensorImages(torch.randn(4, 3, 24, 24, generator=gen), [0, 1, 0, 1], 900), None,
                     ["sneaker", "bag"])
    run = copy.deepcopy(project.resolver.run_config(project.resolver.run_key("fedadapterproto", "sites", method, 0)))
    # the demo's method and params on a tiny random ResNet (the demo itself starts from EfficientNet-Lite0)
    run["train"]["model"].update(backbone="test_resnet", pretrained=False, image_size=24, prototype_dim=16)
    run["train"].update(batch_size=20, local={"epochs": 1, "sampler": "class_balanced"})
    run["train"].update(train)
    m = method_class(run["algorithm"]["name"])(MethodContext(run, fed, torch.device("cpu"), CommLedger(), logging.getLogger("test")))
    m.setup()
    return m, fed


def test_fedadapterproto_communicates_only_adapters_and_prototype_layer(demo_project):
    m, _ = tiny_method(demo_project, "fedadapterproto")
    assert m.shared and all(k.startswith(("adapters.", "head.")) for k in m.shared)
    assert {"head.prototypes", "head.last_layer.weight"} <= set(m.shared)
    assert not any(k.startswith("backbone.") for k in m.shared)
    assert all(k.startswith("backbone.") for k in m.initial_private)


def test_fedadapterproto_aggregation_weights(demo_project):
    m, _ = tiny_method(demo_project, "fedadapterproto")     # adapters: steps x size, prototype layer: uniform
    state = m.server.state_dict()
    payload = lambda a, h: {k: torch.full_like(state[k], a if k.startswith("adapters.") else h) for k in m.shared}  # noqa: E731
    updates = [ClientUpdate("client0", payload(1.0, 0.0), 12, {"steps": 1}),
               ClientUpdate("client1", payload(3.0, 4.0), 6, {"steps": 2})]
    m.aggregate(updates, 0)
    new = m.server.state_dict()
    # n_i = the client's whole share, train + validation (12 + 2 and 6 + 2), as the code's site sizes
    expected = (14 * 1 * 1 + 8 * 2 * 3) / (14 * 1 + 8 * 2)
    assert torch.allclose(new["adapters.0.down.weight"], torch.full_like(new["adapters.0.down.weight"], expected))
    assert torch.allclose(new["head.prototypes"], torch.full_like(new["head.prototypes"], 2.0))


def test_client_start_local_vs_global_and_proximal_anchor(demo_project):
    for start in ("local", "global"):
        m, fed = tiny_method(demo_project, "fedadapterproto")
        m.params = {**m.params, "client_start": start}
        c = fed.clients[0]
        update = m.local_update(c, m.broadcast(0), 0)
        m.aggregate([update, m.local_update(fed.clients[1], m.broadcast(0), 0)], 0)
        message = m.broadcast(1)
        loaded = m.load_client_model(c, message).state_dict()["head.prototypes"]
        own = update.payload["head.prototypes"]
        expected = own if start == "local" else message["head.prototypes"]
        assert torch.allclose(loaded, expected), start
        assert not torch.allclose(own, message["head.prototypes"])
    # the proximal anchor is the global model of the round in both modes
    m.local_update(c, message, 1)
    assert torch.equal(m.anchor["head.prototypes"], message["head.prototypes"])


def test_push_changes_a_copy_for_the_figures_not_the_evaluated_model(demo_project):
    m, fed = tiny_method(demo_project, "fedadapterproto", rounds=1)
    c = fed.clients[0]
    m.local_update(c, m.broadcast(0), 0)                  # the last round: push a copy after local training
    record = m.push_record[c.name]
    trained = m.final_local[c.name]
    evaluated = m.load_client_model(c, m.broadcast(-1)).state_dict()
    assert all(torch.equal(evaluated[k], trained[k]) for k in trained)     # evaluated = unpushed
    net = m.family.build()
    net.load_state_dict(m.pushed[c.name])
    net.eval()
    assert not torch.allclose(net.head.prototypes, evaluated["head.prototypes"])
    assert all(torch.equal(m.pushed[c.name][k], trained[k]) for k in trained if k != "head.prototypes")
    with torch.no_grad():
        out = net(torch.stack([c.train[i]["x"] for i in range(len(c.train))]))
    identity = net.head.class_identity
    for j, row in enumerate(record["index"].tolist()):
        b = row - c.train.rows[0]
        assert int(c.train.labels[b]) == int(identity[j].argmax())          # a patch of its own class
        assert out["distance_maps"][b, j].min().item() == pytest.approx(0.0, abs=1e-5)
    saved = m.final_model()
    assert set(saved["clients"]) == {"client0", "client1"} and set(saved["pushed"]) == {"client0"}
    assert torch.equal(saved["clients"]["client0"]["head.prototypes"], trained["head.prototypes"])
    assert torch.equal(saved["pushed"]["client0"]["head.prototypes"], net.head.prototypes)


def test_every_client_starts_from_its_own_build(demo_project):
    """The code constructs one model per client: adapters and prototype layer start from different
    random draws (the pretrained backbone is the same); each is the family's build under (seed, "init", client)."""
    from fedrepro.seeding import seed_global

    m, fed = tiny_method(demo_project, "fedadapterproto")
    starts = [{k: v.clone() for k, v in m.load_client_model(c, m.broadcast(0)).state_dict().items()} for c in fed.clients]
    assert not torch.allclose(starts[0]["head.prototypes"], starts[1]["head.prototypes"])
    assert not torch.allclose(starts[0]["adapters.0.down.weight"], starts[1]["adapters.0.down.weight"])
    for c, start in zip(fed.clients, starts):
        seed_global(0, "init", c.index)
        built = m.family.build().state_dict()
        assert all(torch.equal(start[k], built[k]) for k in built), c.name
    text, _ = tiny_method(demo_project, "fedadapterproto_text")      # paper text: every round starts from theta_g
    message = text.broadcast(0)
    for c in fed.clients:
        loaded = text.load_client_model(c, message).state_dict()
        assert torch.equal(loaded["head.prototypes"], message["head.prototypes"])


def test_client_eval_local_evaluates_local_models(demo_project):
    m, fed = tiny_method(demo_project, "fedavg")         # client_eval: local in the config
    assert m.personalized
    updates = [m.local_update(c, m.broadcast(0), 0) for c in fed.clients]
    m.aggregate(updates, 0)
    local0 = m.model_for(fed.clients[0]).state_dict()["head.weight"].clone()
    local1 = m.model_for(fed.clients[1]).state_dict()["head.weight"].clone()
    assert torch.allclose(local0, updates[0].payload["head.weight"])
    assert not torch.allclose(local0, local1)
    assert not torch.allclose(local0, m.server.state_dict()["head.weight"])


def test_fedproto_exchanges_prototypes_only(demo_project):
    m, fed = tiny_method(demo_project, "fedproto")
    assert m.shared == [] and m.broadcast(0) == {}
    updates = [m.local_update(c, m.broadcast(0), 0) for c in fed.clients]
    assert set(updates[0].payload) == {"prototypes", "counts"}
    assert updates[0].payload["counts"].tolist() == [6.0, 6.0]
    m.aggregate(updates, 0)
    assert m.global_protos.shape == (2, updates[0].payload["prototypes"].shape[1]) and m.present.all()
    probs = m.predict(fed.global_test, None)                   # no global model: mean of the clients' models
    assert probs.shape == (4, 2) and np.allclose(probs.sum(axis=1), 1)
    c0 = fed.clients[0]
    assert np.allclose(probs, (m.predict(fed.global_test, c0) + m.predict(fed.global_test, fed.clients[1])) / 2)
    m.params = {**m.params, "predict": "nearest_prototype"}
    with torch.no_grad():
        features = m.family.forward(m.model_for(c0).eval(), {"x": fed.global_test.x, "y": torch.tensor([0, 1, 0, 1])}).features
    nearest = ((features[:, None, :] - m.global_protos[None]) ** 2).mean(dim=-1).argmin(dim=1)
    assert m.predict(fed.global_test, c0).argmax(axis=1).tolist() == nearest.tolist()


# --------------------------------------------------------------------------------------------
# data: sampler, site split, fundus preparers

def test_pooled_per_client_accuracy_is_the_authors_test_loop():
    """berenslab/FedAdapterProto lib/update.py::test_inference_new_het_lt scores every client's model on
    the same test set with counters (correct, samples) that it never resets, so its "client k" is the
    accuracy of clients 0..k pooled: ``upto_client<k>@global``. Each client's own stays ``client<k>@global``."""
    from fedrepro.data.loader import FeatureSet
    from fedrepro.fl.evaluation import evaluate_classification

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 40)
    test = FeatureSet(torch.zeros(40, 1), torch.as_tensor(labels), np.arange(40))
    correct = {f"client{k}": rng.random(40) < p for k, p in enumerate((0.9, 0.5, 0.6, 0.8))}

    class Personal:
        personalized = True

        def predict(self, dataset, client):
            right = correct[client.name] if client is not None else np.ones(40, dtype=bool)
            guess = np.where(right, labels, 1 - labels)
            return np.eye(2, dtype=np.float32)[guess] * 0.8 + 0.1

    clients = [ClientData(name, k, None, None, None) for k, name in enumerate(correct)]
    metrics, _ = evaluate_classification(Personal(), Federation(clients, test, None, ["0", "1"]), with_val=False)
    total_correct = total_samples = 0                    # the authors' counters, never reset
    for name, right in correct.items():
        total_correct, total_samples = total_correct + int(right.sum()), total_samples + len(right)
        assert metrics[f"upto_{name}@global/acc"] == pytest.approx(total_correct / total_samples)
        assert metrics[f"{name}@global/acc"] == pytest.approx(right.mean())
    # FedAvg's published 78.82 / 66.59 / 65.08 / 67.57 are such running means: per client 78.8 / 54.4 / 62.1 / 75.0
    published = np.array([78.82, 66.59, 65.08, 67.57])
    per_client = published * np.arange(1, 5) - np.concatenate([[0.0], published[:-1] * np.arange(1, 4)])
    assert per_client.round(1).tolist() == [78.8, 54.4, 62.1, 75.0]


def test_paper_protocol_table1_reads_the_pooled_accuracy_of_the_authors_runs():
    """Under ``paper``: the pooled columns, the authors' indexing and their 50 rounds (scripts/run.sh); under
    ``clean``: each client's own model on the correct site split, 50 rounds too (the rounds are no bug)."""
    from parity.harness import project

    grid = project()
    evals = {p: [c["eval"] for c in grid.resolver.resolved_cells("fedadapterproto", "table1", p) if c["method"] == "fedavg"]
             for p in ("clean", "paper")}
    assert evals == {"clean": [f"client{k}@global" for k in range(4)], "paper": [f"upto_client{k}@global" for k in range(4)]}
    for protocol, kind in (("clean", "sites"), ("paper", "sites_authors_index")):
        run = grid.resolver.run_config(grid.resolver.run_key("fedadapterproto", "eyepacs_sites", "fedadapterproto", 0, protocol))
        assert run["train"]["rounds"] == 50 and f"-{kind}-" in run["split_id"]
    index_bug = {c["setting"]: c["protocol"] for c in grid.resolver.resolved_cells("fedadapterproto", "index_bug", "paper")}
    assert index_bug == {"eyepacs_sites": "clean", "eyepacs_sites_authors_index": "paper"}


def test_class_balanced_sampler():
    labels = np.array([0] * 90 + [1] * 10)
    gen = torch.Generator().manual_seed(0)
    drawn = torch.cat([class_balanced_order(labels, gen) for _ in range(20)])
    assert len(drawn) == 2000
    share = float((torch.as_tensor(labels)[drawn] == 1).float().mean())
    assert 0.45 < share < 0.55                         # uniform would give 0.10
    assert len(torch.unique(drawn[:100])) < 100        # with replacement


def site_manifest() -> pd.DataFrame:
    sizes = {"A": 9, "B": 8, "C": 7, "D": 6, "E": 5, "F": 2}
    sources = np.array([s for s, n in sizes.items() for _ in range(n)])
    order = np.random.default_rng(1).permutation(len(sources))        # sites interleaved, as in EyePACS
    return pd.DataFrame({"path": [f"img{i:03d}.png" for i in range(len(sources))], "label": np.arange(len(sources)) % 2,
                         "class_name": "x", "source": sources[order], "split": ""})


def test_site_split_holds_out_the_fifth_site():
    manifest = site_manifest()
    spec = {"kind": "sites", "clients": 4, "ratios": {"train": 0.8, "val": 0.2, "test": 0.0}}
    split = make_split(manifest, spec, seed=0)
    src = manifest["source"].to_numpy()
    for i, site in enumerate("ABCD"):
        rows = np.concatenate(list(split.clients[f"client{i}"].values()))
        assert sorted(rows) == sorted(np.flatnonzero(src == site))
    assert sorted(split.global_test) == sorted(np.flatnonzero(src == "E"))
    assert len(np.unique(split.assigned())) == len(split.assigned())   # disjoint


def test_authors_indexing_leaks_test_rows_into_training():
    manifest = site_manifest()
    spec = {"kind": "sites_authors_index", "clients": 4, "ratios": {"train": 0.8, "val": 0.2, "test": 0.0}}
    split = make_split(manifest, spec, seed=0)
    src = manifest["source"].to_numpy()
    client_rows = np.concatenate([np.concatenate(list(p.values())) for p in split.clients.values()])
    assert set(split.global_test) <= set(client_rows)                 # every test image is also a training/val image
    assert sorted(split.global_test) == list(range(5))                 # rows 0..n_E-1 of the table, not site E
    assert set(src[split.global_test]) != {"E"}
    assert any(len(set(src[np.concatenate(list(p.values()))])) > 1 for p in split.clients.values())   # sites mixed


def test_the_authors_indexing_declares_its_leak_and_runs_check_it():
    """The split file says which overlap is intended (held-out rows = clients' rows); the check every run
    makes before training lets exactly that through, under the setting's paper protocol and under clean."""
    from fedrepro.data.partition import Split
    from fedrepro.fl.federation import SplitOverlap, check_disjoint

    manifest = site_manifest()
    spec = {"kind": "sites_authors_index", "clients": 4, "ratios": {"train": 0.8, "val": 0.2, "test": 0.0}}
    split = Split.from_json(make_split(manifest, spec, seed=0).to_json())      # as the run reads the split file
    assert [d["parts"] for d in split.declared_overlaps] == [["global_test", "clients"]]
    check_disjoint(split, "paper")
    check_disjoint(split, "clean")
    undeclared = Split.from_json({**split.to_json(), "declared_overlaps": []})   # e.g. a split file of an older version
    with pytest.raises(SplitOverlap, match=r"client0/train and global_test share 2 row\(s\) \(manifest rows 1, 4\); client0/val and global_test"):
        check_disjoint(undeclared, "paper")
    correct = make_split(manifest, {**spec, "kind": "sites"}, seed=0)
    assert correct.declared_overlaps == []
    check_disjoint(correct, "clean")
    setting = load_project(["config/config.yaml"]).papers["fedadapterproto"]["settings"]["eyepacs_sites_authors_index"]
    assert setting["protocol"] == "paper" and setting["split"]["kind"] == "sites_authors_index"


def authors_fundus_split(meta: pd.DataFrame, num_users: int) -> tuple[list[list[str]], list[str]]:
    """lib/utils.py::get_dataset + lib/sampling.py::fundus_noniid of the official code, on a metadata
    table: -> (image_path of every client's rows, image_path of the test rows)."""
    data = meta[meta["image_path"].str.contains("images-set-1")]
    data = data[data["image_field"] == "field 1"]
    data = data[data["session_image_quality"].isin(["Adequate", "Good", "Excellent"])]
    data = data.dropna(subset=["diagnosis_image_dr_level"]).reset_index(drop=True)

    def positions(phase):
        col = "clinical_siteIdentifier"
        counts = data[col].value_counts()
        sites = counts.head(n=num_users).index if phase == "train" else counts.iloc[num_users:num_users + 1].index
        df = data[data[col].isin(sites)].reset_index(drop=True)
        groups = df.groupby(col).apply(lambda x: x.index.tolist()).to_dict()
        return [groups[site] for site in sites]

    rows = lambda idx: data["image_path"].iloc[idx].tolist()  # noqa: E731  (the unfiltered table)
    return [rows(p) for p in positions("train")], rows(positions("test")[0])


def prepared_eyepacs_aptos(tmp_path: Path, meta: pd.DataFrame, aptos_codes: list[str]) -> pd.DataFrame:
    """The eyepacs_aptos manifest the real preparers build from an EyePACS metadata table (a disc image per row)
    and a few APTOS images, at 8 px."""
    from fedrepro.data.manifest import read_manifest, write_manifest

    base = tmp_path / "raw" / "eyepacs"
    for path in meta["image_path"]:
        write_disc(base / path)
    meta.to_csv(base / "metadata.csv", index=False)
    aptos = tmp_path / "raw" / "aptos2019"
    (aptos / "train_images").mkdir(parents=True)
    pd.DataFrame({"id_code": aptos_codes, "diagnosis": [2 * (i % 2) for i in range(len(aptos_codes))]}).to_csv(
        aptos / "train.csv", index=False)
    for code in aptos_codes:
        write_disc(aptos / "train_images" / f"{code}.png")
    manifests = tmp_path / "manifests"
    for name in ("eyepacs", "aptos2019", "eyepacs_aptos"):
        spec = dataset(name)
        if "crop_size" in spec.options:
            spec = replace(spec, options={**spec.options, "crop_size": 8})
        write_manifest(manifests / f"{name}.csv", prepare_dataset(spec, tmp_path / "raw", manifests))
    return read_manifest(manifests / "eyepacs_aptos.csv")


def test_authors_indexing_reads_the_metadata_order_through_the_real_preparers(tmp_path):
    """The same images leak as in the official code: positions index the authors' table (metadata
    file order, rows without a site included), not the manifest (sorted by path)."""
    gen = np.random.default_rng(3)
    sizes = {"11": 9, "7": 8, "30": 7, "4": 6, "25": 5, "9": 2}
    sites = np.array([s for s, n in sizes.items() for _ in range(n)] + [None] * 3)
    sites = sites[gen.permutation(len(sites))]
    names = gen.permutation(len(sites))                       # file order != path order
    meta = pd.DataFrame({"image_path": [f"images-set-1/img{n:03d}.jpg" for n in names], "image_field": "field 1",
                         "session_image_quality": "Good", "diagnosis_image_dr_level": gen.integers(0, 5, len(sites)),
                         "clinical_siteIdentifier": sites})
    meta.loc[[2, 17], "session_image_quality"] = "Insufficient for Full Interpretation"     # filtered out
    manifest = prepared_eyepacs_aptos(tmp_path, meta, ["x1", "x2"])
    assert manifest["path"].is_monotonic_increasing and (manifest["source"] == "").sum() == 3

    spec = {"kind": "sites_authors_index", "clients": 4, "external": {"sources": ["aptos2019"]},
            "ratios": {"train": 0.8, "val": 0.2, "test": 0.0}}
    split = make_split(manifest, spec, seed=0)
    image = lambda rows: sorted(manifest["original_path"].to_numpy()[rows].tolist())  # noqa: E731
    clients, test = authors_fundus_split(meta, num_users=4)
    for i, expected in enumerate(clients):
        assert image(np.concatenate(list(split.clients[f"client{i}"].values()))) == sorted(f"eyepacs/{p}" for p in expected)
    assert image(split.global_test) == sorted(f"eyepacs/{p}" for p in test)
    assert sorted(split.external) == sorted(np.flatnonzero(manifest["source"] == "aptos2019"))
    correct = make_split(manifest, {**spec, "kind": "sites"}, seed=0)        # the site split ignores rows without a site
    src = manifest["source"].to_numpy()
    assert set(src[correct.global_test]) == {"25"}
    assert [set(src[np.concatenate(list(p.values()))]) for p in correct.clients.values()] == [{"11"}, {"7"}, {"30"}, {"4"}]


def test_site_split_errors_name_the_problem():
    manifest = site_manifest()
    with pytest.raises(SplitError, match="needs 7 sites"):
        make_split(manifest, {"kind": "sites", "clients": 6}, seed=0)
    with pytest.raises(SplitError, match="'clients'"):
        make_split(manifest, {"kind": "sites"}, seed=0)
    with pytest.raises(SplitError, match="external: sources \\['Z'\\]"):
        make_split(manifest, {"kind": "sites", "clients": 2, "external": {"sources": ["Z"]}}, seed=0)
    split = make_split(manifest, {"kind": "sites", "clients": 2, "external": {"sources": ["A"]}}, seed=0)
    assert sorted(split.external) == sorted(np.flatnonzero(manifest["source"] == "A"))
    assert sorted(split.global_test) == sorted(np.flatnonzero(manifest["source"] == "D"))   # A left the ranking


def disc_image(h: int, w: int, cx: float, cy: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.zeros((h, w, 3), dtype=np.uint8)
    image[(xx + 0.5 - cx) ** 2 + (yy + 0.5 - cy) ** 2 <= r ** 2] = (200, 90, 40)
    return image


def test_circle_crop_centres_the_disc():
    out = circle_crop(disc_image(120, 200, cx=80, cy=60, r=40))
    assert out.shape == (80, 80, 3)
    ys, xs = np.nonzero(out[..., 0])
    assert abs(xs.mean() - 39.5) < 0.5 and abs(ys.mean() - 39.5) < 0.5
    assert out[0, 0].sum() == 0 and tuple(out[40, 40]) == (200, 90, 40)
    # a disc cut off at the top and bottom (the usual EyePACS frame): the full circle's square, black bands
    out = circle_crop(disc_image(100, 240, cx=120, cy=40, r=70))
    assert out.shape == (140, 140, 3)
    assert tuple(out[70, 70]) == (200, 90, 40)                       # the disc centre lands in the middle
    assert out[:, 70, 0].nonzero()[0].min() == 70 - 40               # 40 px visible above the centre
    with pytest.raises(ValueError, match="no fundus disc"):
        circle_crop(np.zeros((10, 10, 3), dtype=np.uint8))


def write_disc(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(disc_image(30, 40, 20, 15, 12)).save(path)


def test_eyepacs_download_explains_the_request(tmp_path):
    with pytest.raises(ManualStepRequired, match="clinical_siteIdentifier") as info:
        download_dataset(dataset("eyepacs"), tmp_path)
    assert "metadata.csv" in str(info.value)


def test_eyepacs_preparer_filters_and_crops(tmp_path):
    base = tmp_path / "eyepacs"
    rows = [  # image_path, field, quality, grade, site
        ("/data/eyepacs/images-set-1/a.jpg", "field 1", "Good", 0, 12),
        ("images-set-1/b.jpg", "Field 1", "Excellent", 3, 7),
        ("images-set-1/c.jpg", "field 1", "Adequate", 1, 12),
        ("images-set-1/d.jpg", "field 2", "Good", 0, 12),         # wrong field
        ("images-set-1/e.jpg", "field 1", "Insufficient for Full Interpretation", 0, 7),
        ("images-set-2/f.jpg", "field 1", "Good", 0, 7),          # another image set
    ]
    for path, *_ in rows:
        write_disc(base / path[path.find("images-set"):])
    pd.DataFrame(rows, columns=["image_path", "image_field", "session_image_quality", "diagnosis_image_dr_level",
                                "clinical_siteIdentifier"]).to_csv(base / "metadata.csv", index=False)
    spec = replace(dataset("eyepacs"), options={**dataset("eyepacs").options, "crop_size": 16})
    manifest = prepare_dataset(spec, tmp_path)
    assert [Path(p).stem for p in manifest["path"]] == ["a", "b", "c"]
    assert manifest["class_name"].tolist() == ["healthy", "diseased", "diseased"]
    assert manifest["source"].tolist() == ["12", "7", "12"]
    with Image.open(tmp_path / manifest["path"][0]) as im:
        assert im.size == (16, 16) and manifest["path"][0].startswith("eyepacs/preprocessed_16/")


def test_aptos_preparer_is_binary_external(tmp_path):
    base = tmp_path / "aptos2019"
    pd.DataFrame({"id_code": ["x1", "x2", "x3"], "diagnosis": [0, 2, 4]}).to_csv(base.mkdir() or base / "train.csv", index=False)
    for code in ("x1", "x2", "x3"):
        write_disc(base / "train_images" / f"{code}.png")
    spec = replace(dataset("aptos2019"), options={"crop_size": 8})
    manifest = prepare_dataset(spec, tmp_path)
    assert manifest["label"].tolist() == [0, 1, 1]
    assert set(manifest["split"]) == {"test"} and set(manifest["source"]) == {"aptos2019"}


def test_prototype_box_is_the_top_activation_region():
    act = np.zeros((6, 6))
    act[1:3, 3:5] = [[5.0, 6.0], [7.0, 8.0]]
    act[5, 0] = 4.0                                      # below the 90th percentile (4.5): outside the box
    assert high_activation_box(act, 90) == (1, 2, 3, 4)
    assert high_activation_box(act, 50) == (0, 5, 0, 5)


# --------------------------------------------------------------------------------------------
# end to end: the demo config through the Python API

def test_demo_run_end_to_end(tmp_path, monkeypatch):
    from fedrepro import cli
    from fedrepro.train import train_run

    monkeypatch.chdir(tmp_path)
    project = load_project([ROOT / "config/demo.yaml"], {"papers": ["fedadapterproto"]}, root=ROOT)
    for name in ("demo_scanners", "demo_fashion", "demo_sites"):
        cli.main(["download", name])
        cli.main(["prepare", name, "--out", f"resources/manifests/{name}.csv"])
    key = project.resolver.run_key("fedadapterproto", "sites", "fedadapterproto", 0)
    run = project.resolver.run_config(key)
    split = project.plan.splits()[run["split_id"]]
    cli.main(["split", "--dataset", "demo_sites", "--manifest", "resources/manifests/demo_sites.csv",
              "--spec", json.dumps(split["spec"]), "--seed", str(split["seed"]), "--out", run["paths"]["split"]])
    counts = pd.read_csv(Path(run["paths"]["split"]).with_suffix(".counts.csv")).set_index("client")
    # the sources in the order the setting names them: three clients, then the held-out site; then the external set
    sizes = pd.read_csv("resources/manifests/demo_sites.csv").groupby("source").size()
    wanted = [int(sizes[s]) for s in split["spec"]["sources"]] + [int(sizes["fashion_test"])]
    assert counts.loc[["client0", "client1", "client2", "global_test", "external"], "total"].tolist() == wanted
    assert wanted[:4] == [240, 200, 180, 280]            # site_a, the largest, is held out in the demo

    build_image_caches(run)
    run["train"].update(rounds=1, eval_every=1, local={**run["train"]["local"], "steps": 2})    # shorter than the demo
    summary = train_run(run, paths.run_dir(key), paths.checkpoint_dir(key))
    metrics = json.loads(Path(paths.run_file(key)).read_text())
    assert metrics == json.loads(json.dumps(summary))
    for c in range(3):
        for where, n in (("global", wanted[3]), ("external", wanted[4])):
            result = metrics["eval"][f"client{c}@{where}"]
            assert result["n"] == n and 0.0 <= result["acc"] <= 1.0
    model = sum(p.numel() for p in model_class(run["train"]["model"]["family"])(run["train"]["model"], ["a", "b"], {}).build().parameters())
    assert 0 < metrics["comm"]["params_per_client_round"] < 0.2 * 2 * model   # adapters + prototype layer only
    assert Path(paths.model_file(key)).is_file()
    assert not Path(paths.checkpoint_dir(key), "resume.pt").exists()

    draw_figure(project, "fedadapterproto", "fig4", tmp_path / "fig4.png")
    assert (tmp_path / "fig4.png").stat().st_size > 10_000 and (tmp_path / "fig4.pdf").is_file()
    # issue 43: at stride 32 the 32-px demo had a one-cell map (every "patch" the whole image); the demo's
    # output_stride 16 gives a map a prototype can be seen firing on, and its similarity keeps its own scale (-d <= 0)
    with np.load(paths.embedding(key, "fig4")) as figure:
        assert tuple(figure["map_shape"]) == (2, 2) and str(figure["activation"]) == "linear"
        assert str(figure["upsampling"]) == "nearest"                 # 4 cells: shown as cells, not interpolated
        assert (figure["similarity"] <= 0).all()
        boxes = figure["box"]
        assert ((boxes[..., 1] - boxes[..., 0] + 1) == 16).all()     # the box is its best cell, not the whole image
    ARTEFACTS.mkdir(parents=True, exist_ok=True)          # for a human to look at after a CI run
    shutil.copy(tmp_path / "fig4.png", ARTEFACTS / "fedadapterproto-fig4.png")
