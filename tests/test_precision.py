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

from fedrepro.config import load_project
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


# ---- fp16_weights: the FACMIC / FAA-CLIP authors' fp16 fine-tuning of CLIP -----------------------

class ClipParts(torch.nn.Module):
    """One of each kind of parameter a CLIP has: linear, attention, LayerNorm, embedding, the ``proj`` and
    ``text_projection`` matrices, the logit scale."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(10, 16)
        self.attn = torch.nn.MultiheadAttention(16, 2)
        self.norm = torch.nn.LayerNorm(16)
        self.mlp = torch.nn.Linear(16, 16)
        self.proj = torch.nn.Parameter(torch.randn(16, 8, generator=gen))
        self.text_projection = torch.nn.Parameter(torch.randn(16, 8, generator=gen))
        with torch.no_grad():         # weights of CLIP's scale (biases included), LayerNorm around 1
            for p in self.parameters():
                p.normal_(0.0, 1.0, generator=gen)
            self.norm.weight.normal_(1.0, 0.5, generator=gen)
        self.logit_scale = torch.nn.Parameter(torch.tensor(4.6052))


def test_fp16_weights_steps_as_the_authors_loop_and_damps_small_updates():
    """Adam (the papers' lr 5e-5, betas (0.9, 0.98), eps 1e-6, wd 0.02) on the same gradients: the authors'
    loop (fp16 weights and fp16 gradients, convert_models_to_fp32, step, convert_weights: AIPMLab/FACMIC
    ``utils/training.py::train``) and ours (``Compute.round_weights``: fp16 storage, ``Compute.keep_fp16_weights``:
    the same casts around every step) hold the same values after every step, also across a saved and reloaded
    optimizer state (its fp32 moments stay fp32). Updates below half an fp16 step are lost: most fp16 weights
    never move, where fp32 training moves every one of them; LayerNorm, embeddings and the logit scale stay
    fp32 and do move."""
    from fedrepro.device import fp16_weight_parameters
    from fedrepro.fl.local import make_optimizer
    from parity.clip_spec import authors_convert_models_to_fp32, authors_convert_weights

    cfg = {"name": "adam", "lr": 5e-5, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.02, "fused": True}
    start = ClipParts()
    reference = copy.deepcopy(start)
    authors_convert_weights(reference)
    reference_opt = torch.optim.Adam(reference.parameters(), lr=5e-5, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.02)
    ours = copy.deepcopy(start)
    compute = Compute(CPU, "fp16_weights")
    compute.round_weights(ours)
    ours_opt = make_optimizer(ours.parameters(), cfg)
    compute.keep_fp16_weights(ours_opt, ours)
    fp32 = copy.deepcopy(start)
    fp32_opt = make_optimizer(fp32.parameters(), cfg)
    halves = {name for name, p in reference.named_parameters() if p.dtype == torch.float16}
    assert halves == {name for name, p in ours.named_parameters() if any(p is q for q in fp16_weight_parameters(ours))}
    assert halves == {name for name, p in ours.named_parameters() if p.dtype == torch.float16}   # stored in fp16
    assert halves >= {"mlp.weight", "attn.in_proj_weight", "attn.out_proj.weight", "proj", "text_projection"}
    assert not halves & {"norm.weight", "embed.weight", "logit_scale"}

    gen = torch.Generator().manual_seed(1)
    for step in range(5):
        if step == 3:            # a client's next turn: its saved optimizer state loaded into a new optimizer
            saved = copy.deepcopy(ours_opt.state_dict())
            ours_opt = make_optimizer(ours.parameters(), cfg)
            compute.keep_fp16_weights(ours_opt, ours)
            ours_opt.load_state_dict(saved)
            assert all(v["exp_avg"].dtype == torch.float32 for v in ours_opt.state.values())
        grads = {name: torch.randn(p.shape, generator=gen) * 1e-2 for name, p in start.named_parameters()}
        for name, p in reference.named_parameters():
            p.grad = grads[name].to(p.dtype)                  # an fp16 weight's gradient is fp16
        authors_convert_models_to_fp32(reference)
        reference_opt.step()
        authors_convert_weights(reference)
        for model, opt in ((ours, ours_opt), (fp32, fp32_opt)):
            for name, p in model.named_parameters():
                p.grad = grads[name].to(p.dtype)
            opt.step()
        for name, p in ours.named_parameters():
            expected = dict(reference.named_parameters())[name]
            assert p.dtype == expected.dtype and torch.equal(p, expected), name

    for name, p in ours.named_parameters():
        before = dict(start.named_parameters())[name]
        if name in halves:
            moved32 = (dict(fp32.named_parameters())[name] != before.half().float()).float().mean()
            moved16 = (p.float() != before.half().float()).float().mean()
            assert moved32 > 0.95 and moved16 < 0.5, (name, float(moved16), float(moved32))
        else:
            assert (p != before).float().mean() > 0.95, name


def test_fp16_weights_through_the_engine_rounds_every_client_update(tmp_path):
    """FAA-CLIP's FedAVG on the tiny CLIP: what every client uploads and the server's average are fp16 in their
    fp16 weights, LayerNorm stays fp32, and the run differs from fp32 training (bit-for-bit parity with the
    authors' loop: tests/parity/test_clip_fp16.py)."""
    from fedrepro.device import fp16_weight_parameters
    from parity.harness import UpdateLog, drive, image_federation, paper_run

    run = paper_run("faa_clip", "fedavg", protocol="paper", train={"rounds": 1, "local": {"steps": 2}, "batch_size": 4})
    fed = image_federation(size=64, classes=3, sizes=(4, 4, 4))
    driven32 = drive(run, fed, tmp_path / "fp32")
    run["train"]["precision"] = "fp16_weights"          # the harness pins fp32
    log = UpdateLog()
    driven = drive(run, fed, tmp_path / "fp16w", observe=log.attach)
    server = driven.method.server
    names = {id(p): n for n, p in server.named_parameters()}
    halves = [names[id(p)] for p in fp16_weight_parameters(server)]
    assert halves and "logit_scale" not in halves
    norms = [n for n in names.values() if n not in halves and ".ln" in n]
    for entry in log.entries:
        for name in halves:
            assert entry["payload"][name].dtype == torch.float16, (entry["client"], name)
    state = server.state_dict()
    assert all(state[n].dtype == torch.float16 for n in halves)
    assert norms and all(state[n].dtype == torch.float32 for n in norms)
    assert any(not torch.equal(state[n].float(), driven32.method.server.state_dict()[n]) for n in halves)


def test_the_authors_numerics_compute_at_the_authors_precision_under_both_protocols():
    """The authors' numerics (the default): fp16_weights for the full fine-tuning baselines of FACMIC and FAA-CLIP
    (the rows whose code loop calls convert_models_to_fp32 / clip.model.convert_weights: AIPMLab/FACMIC and
    AIPMLab/FAA-CLIP ``utils/training.py::train``, methods fedavg, fedprox, moon, fedfocal; Centralized is
    FACMIC's fedavg loop on pooled data), fp32 for everything else (no AMP in any of the five papers' code),
    the same under clean and paper; the fast numerics: auto (bf16 on a capable GPU) everywhere."""
    from parity.harness import ROOT

    fp16_rows = {"facmic": {"centralized", "fedavg", "fedprox", "moon", "fedfocal"},
                 "faa_clip": {"fedavg", "fedprox", "moon"}}
    for numerics in ("authors", "fast"):
        proj = load_project([ROOT / "config/config.yaml"], {"numerics": numerics}, root=ROOT)
        for paper, grid in proj.papers.items():
            setting = next(iter(grid["settings"]))
            for method in grid["methods"]:
                authors = "fp16_weights" if method in fp16_rows.get(paper, ()) else "fp32"
                expected = authors if numerics == "authors" else "auto"
                for protocol in ("clean", "paper"):
                    assert proj.resolver.train_config(paper, setting, method, protocol)["precision"] == expected, \
                        (numerics, paper, method, protocol)


def test_the_authors_numerics_encode_with_the_authors_fp16_frozen_clip():
    """FACMIC's and FAA-CLIP's frozen CLIP is ``clip.load``'s on a GPU, fp16 (AIPMLab/FACMIC and AIPMLab/FAA-CLIP
    ``nets/models.py::ClipModelat``; openai/CLIP ``clip/model.py::convert_weights``), and their FAM and FedCLIP
    loops (``utils/training.py::train``) never convert it to fp32. Under the authors' numerics (both protocols)
    every family that keeps CLIP frozen outside the trained model (cached features, and the image-path twins)
    encodes with it, and clean and paper runs share the feature caches (``-full-fp16w``); the fast numerics encode in
    fp32 from DCT-scaled JPEGs, with the keys the caches had before numerics were a choice. The families that
    train CLIP have no such setting (their ``train.precision`` is the authors')."""
    from fedrepro.models.encoders import frozen_encoder_precision
    from parity.harness import ROOT

    frozen = {"clip_fam", "clip_adapter", "clip_fam_images", "clip_adapter_images"}
    caches = {}
    for numerics, expected in (("authors", "fp16_weights"), ("fast", "fp32")):
        proj = load_project([ROOT / "config/config.yaml"], {"protocols": ["clean", "paper"], "numerics": numerics,
                                                             "papers": ["facmic", "faa_clip"]}, root=ROOT)
        for paper in ("facmic", "faa_clip"):
            setting = next(iter(proj.papers[paper]["settings"]))
            for method in proj.papers[paper]["methods"]:
                for protocol in ("clean", "paper"):
                    model = proj.resolver.train_config(paper, setting, method, protocol)["model"]
                    want = expected if model["family"] in frozen else None
                    assert frozen_encoder_precision(model) == want, (numerics, paper, method, protocol)
        for key in proj.plan.runs():
            run = proj.resolver.run_config(key)
            if run["features"]:
                caches.setdefault((numerics, key.protocol), set()).add(run["paths"]["features"])
                half = run["features"]["encoder"].get("precision") == "fp16_weights"
                assert half == (numerics == "authors") == ("-full-fp16w-" in run["features"]["key"]), key
                assert proj.plan.features()[(run["dataset"], run["features"]["key"])]["encoder"] == run["features"]["encoder"]
        twin = proj.resolver.run_config(proj.resolver.run_key("faa_clip", "sc", "faa_clip_images", 0, "paper"))
        assert twin["train"]["model"]["encoder"].get("precision", "fp32") == expected and twin["features"] is None
    names = {kind: {path.rsplit("/", 1)[1] for path in paths} for kind, paths in caches.items()}   # the datasets may differ
    assert names[("authors", "clean")] == names[("authors", "paper")]
    assert not caches[("authors", "clean")] & caches[("fast", "clean")]
    # the fast numerics' caches are those clean runs had before numerics were a choice
    assert {"resources/features/bt/ViT-B-16-openai-clip-96f10f.pt",
            "resources/features/officehome/ViT-B-32-openai-resize_imagenet-224px-a37dfa.pt"} <= caches[("fast", "clean")]
