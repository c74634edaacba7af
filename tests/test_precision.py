"""Mixed precision and memory layout (fedrepro.device): resolution, fp32 scores under autocast, bf16
through the engine and the training job's manifest, fp16's gradient scaler across rounds and resume.

fp32 is checked bit for bit elsewhere: every parity test (tests/parity) drives its method through the
same loop with ``precision: fp32`` against an independent specification.
"""

from __future__ import annotations

import copy
import json
import logging
import math

import pytest
import torch

from fedrepro.device import (
    Compute,
    full_precision,
    is_convolutional,
    resolve_channels_last,
    resolve_precision,
)
from fedrepro.fl.comm import CommLedger
from fedrepro.fl.engine import run_rounds
from fedrepro.fl.method import MethodContext, ModelAveraging
from fedrepro.models.families import clip_scores
from fedrepro.registry import method_class

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")


def cnn() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3))


def vit_like() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 4, stride=4), torch.nn.Flatten(2), torch.nn.Linear(4, 4))


def test_auto_is_fp32_and_no_channels_last_on_the_cpu():
    assert resolve_precision("auto", CPU) == "fp32"
    assert Compute.for_run({"precision": "auto"}, CPU).precision == "fp32"
    assert Compute.for_run({}, CPU).precision == "fp32"
    assert [resolve_precision(p, CPU) for p in ("fp32", "bf16", "fp16")] == ["fp32", "bf16", "fp16"]
    with pytest.raises(ValueError, match="train.precision"):
        resolve_precision("fp8", CPU)
    assert is_convolutional(cnn()) and not is_convolutional(vit_like())
    assert not resolve_channels_last("auto", cnn(), CPU)
    # auto decides by the device type: on for CNNs on a GPU, never for a ViT (one patch convolution)
    assert resolve_channels_last("auto", cnn(), torch.device("cuda"))
    assert not resolve_channels_last("auto", vit_like(), torch.device("cuda"))
    assert resolve_channels_last(True, vit_like(), CPU) and not resolve_channels_last(False, cnn(), torch.device("cuda"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_is_bf16_on_a_gpu_that_supports_it():
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    assert resolve_precision("auto", torch.device("cuda")) == expected


def test_fp32_helpers_are_identities():
    compute = Compute(CPU, "fp32")
    a, b = torch.randn(5, 8), torch.randn(3, 8)
    batch = {"x": torch.randn(2, 3, 8, 8), "y": torch.tensor([0, 1]), "caption": ["a", "b"]}
    with compute.autocast():
        assert not torch.is_autocast_enabled("cpu")
        assert torch.equal(clip_scores(a, b, 10.0), 10.0 * torch.nn.functional.normalize(a, dim=-1)
                           @ torch.nn.functional.normalize(b, dim=-1).t())
    moved = compute.batch(batch)
    assert moved["x"] is batch["x"] and moved["caption"] is batch["caption"]       # nothing copied on the CPU
    assert compute.scaler() is None and Compute(CPU, "bf16").scaler() is None
    assert isinstance(Compute(CPU, "fp16").scaler(), torch.amp.GradScaler)


def test_scores_are_computed_in_fp32_under_autocast():
    a, b = torch.randn(6, 16), torch.randn(4, 16)
    with Compute(CPU, "bf16").autocast():
        plain = a.bfloat16() @ b.bfloat16().t()
        scores = clip_scores(a.bfloat16(), b.bfloat16(), 100.0)
    assert plain.dtype == torch.bfloat16                     # autocast is active: a bare matmul is bf16
    assert scores.dtype == torch.float32
    expected = clip_scores(a.bfloat16().float(), b.bfloat16().float(), 100.0)
    assert torch.equal(scores, expected)                     # the same arithmetic as fp32 on the rounded inputs

    @full_precision
    def passthrough(x):
        return x

    x = torch.randn(3)
    assert passthrough(x) is x                               # fp32 outside autocast: the call itself


def test_channels_last_layout_of_model_and_batch():
    compute = Compute(CPU, "fp32", channels_last=True)
    model = compute.prepare(cnn())
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    x = compute.batch({"x": torch.randn(2, 3, 8, 8)})["x"]
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(model(x), cnn_copy(model)(x.contiguous()), atol=1e-5)


def cnn_copy(model):
    out = copy.deepcopy(model)
    return out.to(memory_format=torch.contiguous_format)


# ---- through the engine ------------------------------------------------------------------------

def fediic_run(method: str, rounds: int, **train):
    """A FedIIC-grid run shrunk to timm's test_efficientnet (a CNN) at 48 px, with its federation."""
    from parity.harness import configured_model, paper_run
    from parity.spec_fediic import SIZE, federation

    cfg = configured_model("fediic", method, "isic", backbone="test_efficientnet", image_size=SIZE,
                           projector={"hidden": 32, "out": 16})
    run = paper_run("fediic", method, "isic", train={"rounds": rounds, "batch_size": 4, **train}, model=cfg)
    run["train"]["precision"] = train.get("precision", "fp32")   # the harness pins fp32 for its specifications
    return run, federation(run["train"]["model"]["views"])


def drive(run, fed, checkpoint, state_dir=None):
    ctx = MethodContext(run, fed, CPU, CommLedger(), logging.getLogger("test"), state_dir=state_dir)
    method = method_class(run["algorithm"]["name"])(ctx)
    return method, run_rounds(method, fed, run, checkpoint)


def test_bf16_autocast_runs_the_local_loop_and_evaluation(tmp_path, monkeypatch):
    seen = {"train": set(), "eval": set()}
    local_loss, class_scores = ModelAveraging.local_loss, ModelAveraging.class_scores

    def spy_loss(self, model, batch, client, rnd):
        seen["train"].add((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        loss, out = local_loss(self, model, batch, client, rnd)
        seen["train"].add(("logits", out.logits.dtype))
        return loss, out

    def spy_scores(self, model, batch):
        seen["eval"].add((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return class_scores(self, model, batch)

    monkeypatch.setattr(ModelAveraging, "local_loss", spy_loss)
    monkeypatch.setattr(ModelAveraging, "class_scores", spy_scores)
    run, fed = fediic_run("moon", rounds=1, precision="bf16")
    method, result = drive(run, fed, tmp_path / "resume.pt")
    assert method.compute.precision == "bf16"
    assert seen["train"] == {(True, torch.bfloat16), ("logits", torch.bfloat16)}
    assert seen["eval"] == {(True, torch.bfloat16)}
    assert torch.isfinite(torch.tensor(result.history["loss"].to_numpy())).all()
    assert all(p.dtype == torch.float32 for p in method.server.parameters())     # master weights stay fp32

    seen["train"].clear()
    run32, fed32 = fediic_run("moon", rounds=1, precision="fp32")
    drive(run32, fed32, tmp_path / "fp32.pt")
    assert seen["train"] == {(False, torch.get_autocast_dtype("cpu")), ("logits", torch.float32)}


def test_fp16_scaler_state_persists_per_client_and_through_resume(tmp_path, monkeypatch):
    """FedCLIP's adapter on synthetic features (fast): fp16 autocast, Adam states kept across rounds."""
    from test_engine import run_config, synthetic_federation

    run, fed = run_config(rounds=3, precision="fp16"), synthetic_federation()
    full, _ = drive(run, fed, tmp_path / "full.pt")
    # a scaler halves its scale at every overflowing (skipped) step and counts the good steps since the
    # last one: each client's count exceeds one round's steps, so its scaler carried over between rounds
    per_round = {c.name: -(-len(c.train) // 8) for c in fed.clients}
    for name, state in full.scalers.items():
        skipped = round(math.log2(65536.0 / state["scale"]))
        assert skipped >= 1                                  # fp16 overflowed at 65536 here: backoff exercised
        assert per_round[name] < state["_growth_tracker"] <= 3 * per_round[name] - skipped, (name, state)

    cls = method_class("fedclip")
    original = cls.aggregate

    def killed_in_round_3(self, updates, rnd):
        if rnd == 2:
            raise KeyboardInterrupt("simulated kill")
        return original(self, updates, rnd)

    monkeypatch.setattr(cls, "aggregate", killed_in_round_3)
    with pytest.raises(KeyboardInterrupt):
        drive(run, fed, tmp_path / "killed.pt")
    saved = torch.load(tmp_path / "killed.pt", weights_only=False)
    assert saved["next_round"] == 2 and set(saved["method"]["scalers"]) == {c.name for c in fed.clients}
    monkeypatch.setattr(cls, "aggregate", original)
    resumed, result = drive(run, fed, tmp_path / "killed.pt")
    assert result.resumed_from == 2
    assert resumed.scalers == full.scalers
    for key, value in full.server.state_dict().items():
        assert torch.equal(resumed.server.state_dict()[key], value), key
    for client in full.optimizer_states:
        a, b = full.optimizer_states[client]["state"], resumed.optimizer_states[client]["state"]
        assert all(torch.equal(a[i]["exp_avg"], b[i]["exp_avg"]) for i in a)


def test_training_job_records_precision_in_the_manifest(tmp_path):
    """The real job (fedrepro.train) on the tiny grid's inputs, bf16 on the CPU."""
    from fedrepro.io import hash_obj
    from fedrepro.train import train_run
    from infra_support import build_tiny_inputs, with_rounds

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        base = with_rounds(build_tiny_inputs(tmp_path), 2)
        for precision in ("bf16", "auto"):
            run = copy.deepcopy(base)
            run["train"]["precision"] = precision
            run.pop("config_hash")
            run["config_hash"] = hash_obj(run)
            train_run(run, f"{precision}/out", f"{precision}/ckpt")
            manifest = json.loads((tmp_path / precision / "out/run_manifest.json").read_text())
            resolved = "bf16" if precision == "bf16" else "fp32"       # auto on the CPU
            assert manifest["execution"]["precision"] == resolved
            assert manifest["config"]["train"]["precision"] == resolved
            assert manifest["execution"]["channels_last"] is False
            assert manifest["execution"]["num_workers"] == manifest["config"]["train"]["num_workers"]
            assert not (tmp_path / precision / "ckpt/clients").exists()     # per-client files go with resume.pt
