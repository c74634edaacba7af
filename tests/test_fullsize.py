"""Full-size smoke test over the real grid (docs/fullsize.md).

Every distinct combination config/config.yaml resolves (tests/fullsize_support.py: paper, algorithm and
its params, model block, input kind, client evaluation, optimiser, sampler) is built at its real
architecture with random weights - real widths, heads, class counts, input shapes and token lengths -
and runs one round of one local step on a two-client synthetic federation through the ``train`` job,
evaluation and checkpoint included. The list comes from the configs: a new method, model or setting is
covered without editing this file.

- ``fullsize`` (runs with the suite): every combination with the encoders cut to 2 blocks per stack
  (``fedrepro.models.depth.depth_limit``), which still catches every shape, wiring and device mistake.
  ``FEDREPRO_FULLSIZE_JOBS=2`` runs two combinations at once (up to ~4 GB each), e.g. on a 2-core CI runner.
- ``fullsize_depth`` (opt-in, ``FEDREPRO_FULLSIZE_DEPTH=1``; ~1-2 min and up to ~7 GB per architecture on
  a CPU): one combination per distinct architecture at full depth. ``FEDREPRO_FULLSIZE_DEVICE=cuda``
  runs on a GPU, where ``FEDREPRO_FULLSIZE_DEPTH=all`` runs every combination at full depth.

Each test prints its seconds, peak RSS and parameters trained and communicated;
``python benchmarks/fullsize_smoke.py`` writes the same as the table of docs/fullsize.md.
"""

from __future__ import annotations

import math
import os

import pytest

import fullsize_support as F

COMBINATIONS = F.combinations()
DEPTH_ENV = os.environ.get("FEDREPRO_FULLSIZE_DEPTH", "")
DEVICE = os.environ.get("FEDREPRO_FULLSIZE_DEVICE", "cpu")
JOBS = int(os.environ.get("FEDREPRO_FULLSIZE_JOBS", "1"))     # combinations run at once (a process each)

pytestmark = pytest.mark.usefixtures("one_thread")


def check_and_report(row: dict, combo: F.Combination) -> None:
    print(f"\n{combo.name} [{combo.architecture}, depth {row['depth']}, {DEVICE}]: {row['seconds']:.1f} s, "
          f"peak RSS {row['peak_rss_gb']:.2f} GB, parameters {row['params_total'] / 1e6:.2f} M, "
          f"trained {row['params_trained'] / 1e6:.3f} M, communicated per client and round "
          f"{row['params_communicated'] / 1e6:.3f} M" + (f", peak GPU {row['peak_gpu_gb']:.2f} GB" if DEVICE != "cpu" else ""))
    assert row["checkpoint"], "no model.pt"
    assert math.isfinite(row["loss"]), f"training loss {row['loss']}"
    assert row["params_trained"] > 0
    keys = set(row["eval_keys"])
    # the global model's scores, or (no global model: Decentralized) each client model's on every client
    assert "clients_mean" in keys and ("global" in keys or "client0@client1" in keys), sorted(keys)


@pytest.fixture(scope="session")
def runner(request, tmp_path_factory):
    """Runs the selected combinations FEDREPRO_FULLSIZE_JOBS at a time, ahead of the tests that read them."""
    selected = [item.callspec.params["combo"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_every_combination_trains_a_round_and_evaluates_at_real_width"]
    return F.Runner(selected, tmp_path_factory.mktemp("fullsize"), jobs=JOBS,
                    depth=None if DEPTH_ENV == "all" else 2, device=DEVICE)


@pytest.mark.fullsize
@pytest.mark.parametrize("combo", COMBINATIONS, ids=lambda c: c.name)
def test_every_combination_trains_a_round_and_evaluates_at_real_width(combo, runner):
    check_and_report(runner.result(combo), combo)


@pytest.mark.fullsize_depth
@pytest.mark.skipif(not DEPTH_ENV, reason="full depth is opt-in: FEDREPRO_FULLSIZE_DEPTH=1 (minutes and GBs per architecture)")
@pytest.mark.parametrize("combo", F.architectures(COMBINATIONS), ids=lambda c: c.architecture.replace(" ", "_"))
def test_every_architecture_at_full_depth(combo, tmp_path):
    check_and_report(F.run_combination(combo, tmp_path, depth=None, device=DEVICE, timeout=3600), combo)


# --------------------------------------------------------------------------------------------
# the list and the hook the smoke test relies on

def test_the_list_covers_every_paper_family_architecture_and_method_of_the_grid():
    grid = F.project()
    wanted = set()
    for key in grid.plan.runs():
        run = grid.resolver.run_config(key)
        wanted.add((key.paper, run["train"]["model"]["family"], F.architecture(run["train"]["model"]),
                    run["algorithm"]["name"]))
    covered = {(c.paper, c.family, c.architecture, c.algorithm) for c in COMBINATIONS}
    assert covered == wanted
    assert len({c.name for c in COMBINATIONS}) == len(COMBINATIONS)
    # model variants of one method are kept apart (FedDRA's three objectives, FAA-CLIP's FAM variants)
    assert {"feddra-fedavg_convirt", "feddra-fedavg_gloria", "feddra-fedavg_mgca", "faa_clip-faa_fea1"} <= {c.name for c in COMBINATIONS}
    assert {c.architecture for c in F.architectures(COMBINATIONS)} == {c.architecture for c in COMBINATIONS}


def test_random_init_needs_no_weights_for_any_combination(tmp_path):
    from fedrepro.models.weights import weight_specs

    for combo in COMBINATIONS:
        run = F.smoke_run(combo, tmp_path)
        assert weight_specs(run["train"]["model"]) == [], combo.name


def test_depth_limit_keeps_width_stages_and_heads_and_cuts_blocks():
    import torch

    from fedrepro.models.depth import depth_limit
    from fedrepro.models.encoders import create_timm, load_open_clip
    from fedrepro.models.text_tower import build_text_encoder

    with depth_limit(2):
        clip, _, _ = load_open_clip("ViT-B-32", "none")
        resnet = create_timm("resnet50", num_classes=0)
        effnet = create_timm("efficientnet_b0", num_classes=0)
        vit = create_timm("deit_base_patch16_224", num_classes=0)
        bert = build_text_encoder({"name": "bert-base-cased", "tokenizer": "generated", "pretrained": False,
                                   "layers": 6, "config": {}})
    assert len(clip.visual.transformer.resblocks) == 2 and len(clip.transformer.resblocks) == 2
    assert clip.visual.transformer.width == 768 and clip.token_embedding.weight.shape == (49408, 512)
    assert [len(getattr(resnet, f"layer{i}")) for i in range(1, 5)] == [2, 2, 2, 2]
    assert len(effnet.blocks) == 7 and all(len(stage) <= 2 for stage in effnet.blocks)
    assert len(vit.blocks) == 2 and vit.embed_dim == 768
    assert len(bert.encoder.layer) == 2 and bert.config.hidden_size == 768
    with torch.no_grad():   # still the real output widths
        x = torch.zeros(1, 3, 224, 224)
        assert clip.encode_image(x).shape == (1, 512)
        assert resnet(x).shape == (1, 2048) and effnet(x).shape == (1, 1280) and vit(x).shape == (1, 768)
    plain, _, _ = load_open_clip("ViT-B-32", "none")   # outside the context nothing is cut
    assert len(plain.visual.transformer.resblocks) == 12
