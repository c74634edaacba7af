"""What makes a run replayable (issue 42, docs/parity.md): items loaded under recorded random states, recorded
passes taken instead of drawn ones, a whole initial model in the authors' layout, the authors' swish arithmetic -
and that none of it changes a run that does not ask for it."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch

from fedrepro.data.loader import ItemState, batches, replayed_batches, seed_item
from fedrepro.fl.comm import CommLedger
from fedrepro.fl.engine import run_rounds
from fedrepro.fl.method import MethodContext
from fedrepro.fl.replay import Replay, ReplayError
from fedrepro.models.families import build_family
from fedrepro.registry import method_class
from parity.harness import configured_model, paper_run
from parity.harness import project as grid
from parity.spec_fediic import federation

pytestmark = pytest.mark.usefixtures("one_thread")          # conftest.py


def current_state() -> ItemState:
    return ItemState(random.getstate(), np.random.get_state(), torch.get_rng_state().numpy().tobytes())


class Drawn:
    """A dataset whose items are what the three generators draw (a stand-in for an augmenting transform)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        drawn = [random.gauss(0, 1), float(np.random.standard_normal()), float(torch.rand(1))]
        return {"x": torch.tensor(drawn, dtype=torch.float64), "y": i, "index": i}


def test_an_item_loaded_under_a_recorded_state_draws_what_the_recorded_run_drew():
    random.seed(5), np.random.seed(6), torch.manual_seed(7)
    random.gauss(0, 1), np.random.standard_normal()     # each caches a second gaussian: part of the state
    recorded = current_state()
    first = Drawn()[0]["x"]
    seed_item(1234)                                     # anything in between
    assert not torch.equal(Drawn()[0]["x"], first)
    seed_item(recorded)
    assert torch.equal(Drawn()[0]["x"], first)


def test_a_replayed_pass_takes_the_plan_not_the_order():
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    states = []
    for _ in range(3):
        states.append(current_state())
        random.random(), np.random.random(), torch.rand(1)
    plan = [[(3, states[0]), (1, states[1])], [(2, states[2])]]
    out = list(replayed_batches(Drawn(), plan))
    assert [b["index"].tolist() for b in out] == [[3, 1], [2]]
    seed_item(states[1])
    assert torch.equal(out[0]["x"][1], Drawn()[1]["x"])
    drawn = [b["index"].tolist() for b in batches(Drawn(), 2, shuffle=True, generator=torch.Generator().manual_seed(0))]
    assert sorted(sum(drawn, [])) == [0, 1, 2, 3] and drawn != [[3, 1], [2]]


def test_a_replay_refuses_a_pass_its_record_does_not_hold():
    plan = [[(0, current_state())]]
    replay = Replay(passes={("local", 0, 0): plan, ("local", 0, 1): plan}, source="rec/")
    assert replay.plan("local", 0, 1) is plan
    assert replay.plan("fediic-difficulty", 3) is None          # not recorded: the run draws its own
    with pytest.raises(ReplayError, match=r"rec/ holds no 'local' pass for \[1, 0\]"):
        replay.plan("local", 1, 0)


# ---- the authors' layouts --------------------------------------------------------------------------------------

def test_efficientnet_pytorch_names_of_a_timm_b0():
    import timm

    from fedrepro.models.packaged import convert_efficientnet_pytorch, efficientnet_pytorch_names

    with torch.device("meta"):
        own = timm.create_model("tf_efficientnet_b0", num_classes=1000).state_dict()
    names = efficientnet_pytorch_names(list(own))
    # lukemelas/EfficientNet-PyTorch model.py: 16 blocks numbered through the stages; the first has no expansion
    assert names[:2] == ["_conv_stem.weight", "_bn0.weight"]
    assert "_blocks.0._depthwise_conv.weight" in names and "_blocks.0._expand_conv.weight" not in names
    assert "_blocks.1._expand_conv.weight" in names and "_blocks.15._project_conv.weight" in names
    assert "_blocks.16._bn0.weight" not in names and names[-2:] == ["_fc.weight", "_fc.bias"]
    assert len(set(names)) == len(names) == 360
    back = convert_efficientnet_pytorch(dict(zip(names, own.values())), own)
    assert list(back) == [k for k in own if not k.startswith("classifier.")]


def fediic_family(**overrides):
    from fedrepro.models.projected import ProjectedClassifierFamily

    cfg = dict(backbone="tf_efficientnet_b0", pretrained=False, image_size=32, in_chans=3, drop_rate=0.0,
               normalize="imagenet", augment="skin", views=2, eval_crop="center", randaugment="rand-n2-m10-mstd0.5",
               projector={"hidden": None, "out": 1024, "activation": "none"})
    return ProjectedClassifierFamily({**cfg, **overrides}, [str(c) for c in range(8)], {})


def test_the_fediic_authors_model_maps_onto_the_family_whole():
    """wnn2000/FedIIC networks/networks.py::efficientb0 saves ``model.*`` (efficientnet_pytorch's B0, its
    classifier ``model._fc``) and ``projector.0`` / ``projector.1``: every tensor lands on its counterpart."""
    from fedrepro.models.packaged import efficientnet_pytorch_names

    family = fediic_family()
    model = family.build()
    own = model.state_dict()
    backbone = {k[len("backbone."):]: torch.randn_like(v.float()).to(v.dtype) for k, v in own.items()
                if k.startswith("backbone.")}
    authors = {f"model.{n}": v for n, v in zip(efficientnet_pytorch_names(list(backbone)), backbone.values())}
    authors |= {"model._fc.weight": torch.randn(8, 1280), "model._fc.bias": torch.randn(8)}
    authors |= {k: torch.randn_like(v) for k, v in own.items() if k.startswith("projector.")}
    mapped = family.authors_state(authors, "fediic", own)
    model.load_state_dict(mapped)
    assert torch.equal(model.backbone.blocks[1][0].conv_pw.weight, authors["model._blocks.1._expand_conv.weight"])
    assert torch.equal(model.head.weight, authors["model._fc.weight"])
    assert torch.equal(model.projector[1].bias, authors["projector.1.bias"])
    with pytest.raises(ValueError, match="knows: fediic"):
        family.authors_state(authors, "facmic", own)
    with pytest.raises(ValueError, match="missing"):
        family.authors_state({k: v for k, v in authors.items() if not k.startswith("projector.1")}, "fediic", own)


# ---- the authors' arithmetic ----------------------------------------------------------------------------------

def test_memory_efficient_swish_is_efficientnet_pytorchs_arithmetic():
    """efficientnet_pytorch utils.py::SwishImplementation: forward i * sigmoid(i), backward
    g * (s * (1 + i * (1 - s))); torch's nn.SiLU computes both otherwise, which differs in the last bits."""
    from fedrepro.models.projected import memory_efficient_swish

    x = torch.randn(200_000, dtype=torch.float32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    g = torch.randn(200_000, generator=torch.Generator().manual_seed(1))
    module = torch.nn.Sequential(torch.nn.SiLU())
    assert memory_efficient_swish(module) == 1
    out = module(x)
    out.backward(g)
    with torch.no_grad():
        s = torch.sigmoid(x)
        assert torch.equal(out, x * s)
        assert torch.equal(x.grad, g * (s * (1 + x * (1 - s))))
    native = x.detach().clone().requires_grad_(True)
    torch.nn.functional.silu(native).backward(g)
    assert not torch.equal(native.grad, x.grad)          # what the authors' numerics change


def test_memory_efficient_swish_touches_swish_backbones_only():
    b0 = fediic_family(swish="memory_efficient").build()
    assert not any(isinstance(m, torch.nn.SiLU) for m in b0.modules())
    # stem; block 1: depthwise + squeeze-excite; blocks 2-16: expansion + depthwise + squeeze-excite; head
    assert sum(type(m).__name__ == "SwishMe" for m in b0.modules()) == 1 + 2 + 15 * 3 + 1
    lite0 = fediic_family(backbone="tf_efficientnet_lite0", swish="memory_efficient").build()
    plain = fediic_family(backbone="tf_efficientnet_lite0").build()
    assert [type(m) for m in lite0.modules()] == [type(m) for m in plain.modules()]   # ReLU6: nothing to replace


def test_the_new_options_leave_every_other_run_as_it_was():
    """Only the full grid's FedIIC file asks for the authors' swish (authors_numerics); the demo and evidence
    twins (EfficientNet-Lite0 stand-ins) resolve as before, and no run carries a replay unless told to."""
    from fedrepro.config import load_project

    grid_project = grid()
    paper = grid_project.resolver.run_config(grid_project.resolver.run_key("fediic", "isic", "fediic", 0, "paper"))
    assert paper["train"]["model"]["swish"] == "memory_efficient" and paper["train"]["arithmetic"] == "authors"
    assert "replay" not in paper
    for config in ("config/demo.yaml", "config/evidence.yaml"):
        project = load_project([config])
        for key in project.plan.runs():
            run = project.resolver.run_config(key)
            assert "replay" not in run and "arithmetic" not in run["train"]
            if run["train"]["model"]["family"] == "proj_classifier":
                assert "swish" not in run["train"]["model"], (config, key)
    # pinned on main before this option existed: a change here reruns the demo's FedIIC runs
    demo = load_project(["config/demo.yaml"])
    run = demo.resolver.run_config(next(k for k in demo.plan.runs() if (k.paper, k.method) == ("fediic", "fediic")))
    assert run["config_hash"] == DEMO_FEDIIC_HASH


DEMO_FEDIIC_HASH = "d6bb834e3a02"      # fediic/lt_creff/fediic seed 0 of config/demo.yaml at a939a06


# ---- a replayed run, through the engine (FedIIC's grid, shrunk) ---------------------------------------------

def noisy_views(x: torch.Tensor) -> torch.Tensor:
    """Two views that draw from torch's generator: what an item's random state decides."""
    return torch.stack([x + 0.3 * torch.randn_like(x), x.flip(-1)])


def states_for(n: int, seed: int) -> list[ItemState]:
    out = []
    for i in range(n):
        random.seed(seed * 1000 + i), np.random.seed(seed * 1000 + i), torch.manual_seed(seed * 1000 + i)
        out.append(current_state())
    return out


def replayed_fediic(tmp_path, run_seed: int, state_seed: int, initial: dict, fed):
    """One round of the grid's FedIIC on three tiny clients, replaying ``initial`` (authors' layout) and batches of 3
    in reverse order whose items start from ``state_seed``'s states -> (updates, the model each client received)."""
    cfg = configured_model("fediic", "fediic", "isic", backbone="test_efficientnet", image_size=48, drop_rate=0.0,
                           drop_path_rate=0.0, projector={"hidden": 32, "out": 16})
    run = paper_run("fediic", "fediic", "isic", seed=run_seed, train={"rounds": 1, "batch_size": 4}, model=cfg)
    passes = {}
    for client in fed.clients:
        n = len(client.train)
        states = states_for(n, state_seed + client.index)
        order = list(range(n))[::-1]
        passes[("local", 0, client.index)] = [[(p, states[p]) for p in order[s:s + 3]] for s in range(0, n, 3)]
        passes[("fediic-difficulty", client.index)] = [[(p, states[p]) for p in range(n)]]
    replay = Replay(initial_state=initial, layout="fediic", passes=passes)
    ctx = MethodContext(run, fed, torch.device("cpu"), CommLedger(), logging.getLogger("test"), replay=replay)
    method = method_class("fediic")(ctx)
    received, updates = [], []
    local_update = method.local_update

    def spy(client, message, rnd):
        received.append({k: v.clone() for k, v in message.items() if k in method.shared})
        return local_update(client, message, rnd)
    method.local_update = spy
    run_rounds(method, fed, run, tmp_path / f"resume-{run_seed}-{state_seed}.pt",
               observe=lambda rnd, ups, row, m: updates.extend(ups))
    return updates, received, method


def test_a_replayed_run_is_decided_by_its_record(tmp_path):
    """Started from the given model, on the recorded batches and item states, a replay computes the same update
    whatever its own seed; other recorded states give another update."""
    fed = federation(2)
    for client in fed.clients:
        client.train.transform = noisy_views
    family = build_family(configured_model("fediic", "fediic", "isic", backbone="test_efficientnet", image_size=48,
                                           projector={"hidden": 32, "out": 16}), fed.class_names, {})
    torch.manual_seed(99)
    own = family.build().state_dict()
    # test_efficientnet has no efficientnet_pytorch twin: the layout's backbone is matched by position and shape
    backbone = [v for k, v in own.items() if k.startswith("backbone.")]
    initial = {f"model._part{i}": v for i, v in enumerate(backbone)}
    initial |= {f"model._fc.{k[5:]}": v for k, v in own.items() if k.startswith("head.")}
    initial |= {k: v for k, v in own.items() if k.startswith("projector.")}

    first, received, method = replayed_fediic(tmp_path, 0, 1, initial, fed)
    assert all(torch.equal(received[0][k], own[k]) for k in method.shared)        # the given model, not its own init
    assert [u.stats["steps"] for u in first] == [-(-len(c.train) // 3) for c in fed.clients]   # the recorded batches
    again, _, _ = replayed_fediic(tmp_path, 7, 1, initial, fed)
    other, _, _ = replayed_fediic(tmp_path, 0, 2, initial, fed)
    for a, b, c in zip(first, again, other):
        assert all(torch.equal(a.payload[k], b.payload[k]) for k in a.payload)
        assert a.stats["step_losses"] == b.stats["step_losses"] != c.stats["step_losses"]
        assert set(a.stats["step_terms"]) == {"ce", "intra", "inter"}
