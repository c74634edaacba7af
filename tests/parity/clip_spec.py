"""The specification side shared by the FACMIC / FAA-CLIP parity tests: what the authors' code computes
in every method (``utils/training.py``, ``utils/testing.py``, ``utils/aggregation.py``, ``main.py`` of
both repositories), written from their description - never from fedrepro's method, loss or family code.

- Contrastive loss (FACMIC eq. 4, every method of both papers): for a batch of B images with labels y,
  logits = s * n(I) n(T_y)^T with n(.) the L2 normalisation and T_y the text feature of each sample's
  own class prompt (same-class columns are negatives), loss = 1/2 [CE(logits, arange B) + CE(logits^T,
  arange B)]; s = exp(CLIP's logit_scale) (100 for the frozen CLIP of the FAM/FedCLIP methods).
- Test (``get_similarity``): softmax(100 * n(I) n(T_c)^T) over the class prompts, for every method,
  whatever temperature training used.
- Optimiser: Adam(lr, betas, eps, weight_decay), one per client, created once and kept across rounds.
- Aggregation: sum_i w_i theta_i of every floating-point state entry (BatchNorm running statistics
  included), w = FACMIC: len(drop_last loader) x B = (n_i // B) x B, normalised; FAA-CLIP: 1/3 each.
- The full fine-tuning baselines' numbers (``fp16=True`` below): the CLIP ``clip.load`` gives on a GPU, in pure
  fp16 with fp32 LayerNorm (openai/CLIP ``clip/model.py::convert_weights``, ``LayerNorm``; ``encode_image`` casts
  the images to fp16), every weight and gradient cast to fp32 right before ``optimizer.step()`` and the fp16 ones
  back right after it (``utils/clip_util.py::convert_models_to_fp32``, ``clip.model.convert_weights`` in
  ``utils/training.py::train``), and the average summed in fp32 from fp16 terms, copied into the fp16 weights
  (``utils/aggregation.py::communication``: ``temp = zeros_like(..., float32); temp += w * state; copy_(temp)``).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .harness import TOLERANCE

TEST_SCALE = 100.0     # utils/clip_util.get_similarity


def contrastive_logits(image: torch.Tensor, text: torch.Tensor, scale) -> torch.Tensor:
    """B x B: rows = images, columns = the prompts of the same samples' classes."""
    return scale * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).t()


def symmetric_ce(logits: torch.Tensor) -> torch.Tensor:
    """1/2 [CE(logits, arange B) + CE(logits^T, arange B)]: sample j's positive is column j."""
    target = torch.arange(len(logits))
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


def contrastive_loss(image: torch.Tensor, text: torch.Tensor, scale) -> torch.Tensor:
    return symmetric_ce(contrastive_logits(image, text, scale))


def clip_logits(clip, tokens: torch.Tensor, x: torch.Tensor, y: torch.Tensor, image: torch.Tensor | None = None) -> torch.Tensor:
    """The full fine-tuning baselines' B x B logits: both encoders and the learned temperature exp(t);
    ``image`` = e_I(x) if the caller has it already (MOON uses the same forward pass for its term, as
    the code does).

    The code encodes one prompt per sample; encoding each class prompt once and taking row y_j for
    sample j is the same function with the same gradients (tests/test_clip.py checks it), and
    normalising here and again in :func:`contrastive_logits` is the identity. Both keep the float
    rounding of the implementation: Adam's first step has gain lr / eps = 50 on gradients below eps,
    so rounding-level differences would otherwise show at the 1e-6 of the comparison."""
    image = clip.encode_image(x).float() if image is None else image
    image, text = F.normalize(image, dim=-1), F.normalize(clip.encode_text(tokens).float(), dim=-1)
    return contrastive_logits(image, text[y], clip.logit_scale.exp())


def clip_loss(clip, tokens: torch.Tensor, x: torch.Tensor, y: torch.Tensor, image: torch.Tensor | None = None) -> torch.Tensor:
    """FedAvg's (and every full fine-tuning baseline's) local loss: the contrastive loss of :func:`clip_logits`."""
    return symmetric_ce(clip_logits(clip, tokens, x, y, image))


def predict_probs(image: torch.Tensor, class_text: torch.Tensor, scale=TEST_SCALE) -> torch.Tensor:
    return torch.softmax(scale * F.normalize(image, dim=-1) @ F.normalize(class_text, dim=-1).t(), dim=1)


@torch.no_grad()
def clip_predict_probs(clip, tokens: torch.Tensor, x: torch.Tensor, scale=TEST_SCALE) -> torch.Tensor:
    clip = clip.eval()
    return predict_probs(clip.encode_image(x).float(), clip.encode_text(tokens).float(), scale)


def adam(params, optimizer: dict) -> torch.optim.Adam:
    return torch.optim.Adam([p for p in params if p.requires_grad], lr=optimizer["lr"], betas=tuple(optimizer["betas"]),
                            eps=optimizer["eps"], weight_decay=optimizer["weight_decay"])


def facmic_weights(fed, batch_size: int) -> list[float]:
    """FACMIC main.py: l_i = len(train_test_loader_i) * batch, the loader dropping the last partial batch."""
    return [float(len(c.train) // batch_size * batch_size) for c in fed.clients]


# ---- the authors' fp16 CLIP (written independently of fedrepro.device) ----------------------------

def authors_convert_weights(model: torch.nn.Module) -> None:
    """openai/CLIP ``clip/model.py::convert_weights`` (called by ``clip.load`` on a GPU and, in FACMIC's and
    FAA-CLIP's ``utils/training.py::train``, after every optimizer step of FedAVG, FedProx, MOON, FedFocal):
    .half() on the weight and bias of Conv1d/Conv2d/Linear, the in/q/k/v projections and biases of
    MultiheadAttention, and the ``text_projection`` / ``proj`` attributes."""
    for module in model.modules():
        names = []
        if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear)):
            names = ["weight", "bias"]
        if isinstance(module, torch.nn.MultiheadAttention):
            names = ["in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k", "bias_v"]
        for name in names + ["text_projection", "proj"]:
            tensor = getattr(module, name, None)
            if isinstance(tensor, torch.Tensor):
                tensor.data = tensor.data.half()


class AuthorsLayerNorm(torch.nn.LayerNorm):
    """openai/CLIP ``clip/model.py::LayerNorm``: normalises in fp32 whatever the input's dtype, returns that dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).to(x.dtype)


def authors_fp16_clip(model: torch.nn.Module) -> torch.nn.Module:
    """The model ``clip.load(name, device="cuda")`` returns: OpenAI's LayerNorm in every norm, then
    :func:`authors_convert_weights`."""
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.__class__ = AuthorsLayerNorm
    authors_convert_weights(model)
    return model


def authors_convert_models_to_fp32(model: torch.nn.Module) -> None:
    """AIPMLab/FACMIC (and FAA-CLIP) ``utils/clip_util.py::convert_models_to_fp32``: every parameter and its
    gradient cast to fp32 in place, right before ``optimizer.step()``."""
    for p in model.parameters():
        p.data = p.data.float()
        if p.grad is not None:
            p.grad.data = p.grad.data.float()


def faa_weights(fed) -> list[float]:
    """FAA-CLIP main.py: 1 / (number of training clients) each."""
    return [1.0 / len(fed.clients)] * len(fed.clients)


def average(states: list[dict], weights: list[float], keys=None) -> dict[str, torch.Tensor]:
    """utils/aggregation.communication: the weighted sum of every floating-point entry (in float64 here)."""
    w = torch.tensor(weights, dtype=torch.float64)
    w = w / w.sum()
    keys = [k for k in (keys or states[0]) if states[0][k].is_floating_point()]
    return {k: torch.tensordot(w, torch.stack([s[k].double() for s in states]), dims=1) for k in keys}


def fp16_average(states: list[dict], weights: list[float], keys=None) -> dict[str, torch.Tensor]:
    """utils/aggregation.communication on the fp16 CLIP: per entry ``temp = zeros_like(entry, float32)``, then
    ``temp += w_i * entry_i`` (a Python float times an fp16 tensor: an fp16 product, added in fp32)."""
    total = sum(weights)
    keys = [k for k in (keys or states[0]) if states[0][k].is_floating_point()]
    out = {}
    for k in keys:
        temp = torch.zeros_like(states[0][k], dtype=torch.float32)
        for w, state in zip(weights, states):
            temp += (w / total) * state[k]
        out[k] = temp
    return out


def class_tokens(run: dict, class_names: list[str]) -> torch.Tensor:
    """The tokenised prompt of every class, "a picture of a {class}" (the model's tokenizer: plumbing)."""
    from fedrepro.models.clip_tuning import frozen_clip

    encoder = run["train"]["model"]["encoder"]
    return frozen_clip(encoder)[2]([encoder["prompt"].format(name) for name in class_names])


def code_rounds(run: dict, fed, server: torch.nn.Module, step_loss, *, rounds: int, weights: list[float],
                keys=None, anchor: str = "live", previous: str = "copy", gate: bool = False, targets=None,
                fp16: bool = False):
    """main.py's loop, for ``rounds`` rounds -> (server model, {client: its model after the last
    communication: the averaged entries plus what it keeps to itself}).

    Every client holds a model (a copy of the server) and one Adam, both kept across rounds. In a round
    each client, in order, runs ``step_loss(model, batch, ctx)`` on its batches with an optimiser step
    after each; ``ctx`` carries ``server`` (the code's ``server_model_pre``), ``previous`` (the code's
    ``previous_nets[client]``), ``regularise`` (the code's ``args.step > 0``: false only for the run's
    first client update, when ``gate``) and ``targets`` (the client's target-batch stream, if given).
    Then the server becomes the weighted average of the clients' ``keys`` entries (default: all) and
    every client model receives them.

    ``anchor = "live"``: ``server_model_pre`` *is* the server (FACMIC's ``server_model_pre = server_model``),
    so in round r it holds the round's start G_r; ``"copy"``: a deep copy of the server taken before each
    aggregation (FAA-CLIP), so in round r it is G_{r-1} (G_0 in rounds 0 and 1). ``previous = "live"``:
    ``previous_nets`` *are* the client models being trained (FACMIC's ``previous_nets = models``);
    ``"copy"``: deep copies taken before each aggregation, i.e. each client's model at the end of its
    previous round (the initial model before that; FAA-CLIP, and MOON as published). The server and the
    copies are in eval mode, as in the code (``test()`` leaves them there).

    ``fp16``: the full fine-tuning baselines' numbers (see the module docstring): the server is the authors'
    fp16 CLIP, every batch's images go in as fp16, each step is wrapped in the code's casts, and the average is
    taken as ``communication`` takes it.
    """
    from types import SimpleNamespace

    from .harness import client_batches, seed_client

    server = copy.deepcopy(server).eval()       # the code's server only ever evaluates (ClipModelat.eval(), test())
    if fp16:
        authors_fp16_clip(server)
    models = {c.name: copy.deepcopy(server).train() for c in fed.clients}
    optimizers = {name: adam(m.parameters(), run["train"]["optimizer"]) for name, m in models.items()}
    server_pre = server if anchor == "live" else copy.deepcopy(server)
    previous_nets = models if previous == "live" else {name: copy.deepcopy(m).eval() for name, m in models.items()}
    step = 0
    for rnd in range(rounds):
        for client in fed.clients:
            model, optimizer = models[client.name], optimizers[client.name]
            ctx = SimpleNamespace(server=server_pre, previous=previous_nets[client.name], regularise=step > 0 or not gate,
                                  targets=targets(client, rnd) if targets else None)
            seed_client(run, rnd, client)
            for batch in client_batches(run, client, rnd):
                if fp16:          # encode_image: image.type(self.dtype)
                    batch = {**batch, "x": batch["x"].half()}
                loss = step_loss(model, batch, ctx)
                optimizer.zero_grad()
                loss.backward()
                if fp16:
                    authors_convert_models_to_fp32(model)
                optimizer.step()
                if fp16:
                    authors_convert_weights(model)
            step += 1
        if anchor == "copy":
            server_pre = copy.deepcopy(server)
        if previous == "copy":     # FAA-CLIP tests each client model right after training: eval mode
            previous_nets = {name: copy.deepcopy(m).eval() for name, m in models.items()}
        averaged = (fp16_average if fp16 else average)([m.state_dict() for m in models.values()], weights, keys)
        with torch.no_grad():
            for module in (server, *models.values()):
                state = module.state_dict()
                for key, value in averaged.items():
                    state[key].copy_(value.to(state[key].dtype))
    return server, models


CLASSES = ["glioma", "meningioma", "none", "pituitary"]


def check_full_clip(tmp_path, paper: str, method: str, step_loss, *, protocol: str | None = None, rounds: int = 1,
                    steps: int = 2, clients=None, keys=None, predict_scale=None, precision: str = "fp32",
                    tol: float | None = None, **loop) -> None:
    """Drive ``method`` of ``paper`` (a CLIP baseline trained on images) through the engine on the tiny CLIP
    and four-class images, run :func:`code_rounds` with ``step_loss(tokens)`` from the same start, and
    compare the server after ``rounds`` rounds and the probabilities of every eval set (softmax of
    ``predict_scale(server)`` x cos, default the code's fixed 100). The aggregation weights are the paper's
    code's, over ``keys(model)`` (default: every entry); ``clients(fed)`` replaces the participants
    (Centralized's pooled site); ``loop`` passes ``anchor``, ``previous`` and ``gate``. ``precision:
    fp16_weights``: the engine computes as the authors' numerics' run does and the specification as the authors'
    fp16 CLIP (:func:`code_rounds` with ``fp16``), compared to ``tol`` (default the harness's)."""
    from types import SimpleNamespace

    from .harness import (
        assert_close,
        assert_probs,
        drive,
        eval_sets,
        image_federation,
        initial_server,
        paper_run,
        stacked,
    )

    run = paper_run(paper, method, protocol=protocol, train={"rounds": rounds, "local": {"steps": steps}, "batch_size": 4})
    fed = image_federation(size=64, classes=4, sizes=(6, 8, 10), class_names=CLASSES)
    start = initial_server(run, fed)          # fp32: the harness pins it
    run["train"]["precision"] = precision
    driven = drive(run, fed, tmp_path)

    fp16 = precision == "fp16_weights"
    tokens = class_tokens(run, CLASSES)
    sites = SimpleNamespace(clients=clients(fed)) if clients else fed
    weights = facmic_weights(sites, 4) if paper == "facmic" else faa_weights(sites)
    server, _ = code_rounds(run, sites, start, step_loss(tokens), rounds=rounds, weights=weights,
                            keys=keys(start) if keys else None, fp16=fp16, **loop)
    what = f"{paper} {method} ({driven.method.ctx.run['protocol']}, {precision})"
    tol = TOLERANCE if tol is None else tol
    assert_close(driven.method.server.state_dict(), server.state_dict(), f"{what}: server after {rounds} round(s)", tol)
    scale = predict_scale(server) if predict_scale else TEST_SCALE
    images = {key: stacked(data)[0] for key, data in eval_sets(fed).items()}
    assert_probs(driven, {key: clip_predict_probs(server, tokens, x.half() if fp16 else x, scale)
                          for key, x in images.items()}, what, tol=tol)


FEATURE_SIZES = (10, 13, 18)     # with B = 4: full batches 8, 12, 16 - FACMIC's weights differ from n_i


def check_on_features(tmp_path, paper: str, method: str, step_loss, mask, *, protocol: str | None = None,
                      rounds: int = 1, steps: int = 3, keys=None, scored=None, **loop):
    """Drive ``method`` of ``paper`` (a FAM / adapter method on cached CLIP features) through the engine
    on a small feature federation, run :func:`code_rounds` with ``step_loss(text)`` from the same start
    (``ctx.targets`` = the client's target batches), and compare the server's ``keys(server)`` entries
    (default: all) and the probabilities of every eval set - by default softmax(100 cos(mask(server, x),
    T_c)) with ``mask(model, x)`` the masked features; ``scored(server, models, key, x, text)`` overrides
    it -> (driven, spec server, spec client models)."""
    from .harness import (
        assert_close,
        assert_probs,
        drive,
        eval_sets,
        feature_federation,
        initial_server,
        paper_run,
        target_batches,
    )

    run = paper_run(paper, method, protocol=protocol, train={"rounds": rounds, "local": {"steps": steps}, "batch_size": 4})
    fed = feature_federation(dim=16, classes=3, sizes=FEATURE_SIZES)
    start = initial_server(run, fed)
    driven = drive(run, fed, tmp_path)

    text = fed.extras["text_features"]
    weights = facmic_weights(fed, 4) if paper == "facmic" else faa_weights(fed)
    server, models = code_rounds(run, fed, start, step_loss(text), rounds=rounds, weights=weights,
                                 keys=keys(start) if keys else None,
                                 targets=lambda client, rnd: target_batches(run, fed, client, rnd), **loop)
    expected = server.state_dict()
    what = f"{paper} {method} ({driven.method.ctx.run['protocol']})"
    assert_close(driven.method.server.state_dict(), {k: expected[k] for k in (keys(start) if keys else expected)
                                                     if expected[k].is_floating_point()}, f"{what}: server")

    def default(server_, models_, key, x, text_):
        with torch.no_grad():
            return predict_probs(mask(server_.eval(), x), text_)

    scored = scored or default
    assert_probs(driven, {key: scored(server, models, key, data.features, text) for key, data in eval_sets(fed).items()},
                 what)
    return driven, server, models


def adaptation_step(mask, adaptation, lam: float, target_grad: bool = False, target_pass: bool = True):
    """Both papers' local step (FACMIC ``--method ours``, FAA-CLIP its extension), for ``step_loss(text)``:

        masked = mask(model, x)                          (FAM in training mode, differentiated)
        L = 1/2 [CE(S, arange B) + CE(S^T, arange B)],  S = 100 n(masked) n(T_y)^T
        masked_t = mask(model, x_t)                      (training mode again: BN statistics see the
                                                          target; differentiated only if ``target_grad``)
        L += lam * adaptation(model, masked, masked_t, x_t, y, text)

    with x_t the client's next target batch. lam = 0 is the code with a zero DA weight: the target batch still
    goes through the FAM (FACMIC ``utils/training.py::train``, ``--method ours``: ``i_attn =
    model.fea_attn(i_features)`` feeds the pseudo-labels; FAA-CLIP: the ``no_grad`` pass that feeds D), so its
    BatchNorm statistics see the target, and the loss is the contrastive one (the zero-weighted term adds a
    zero gradient); with ``target_pass=False`` no target batch is drawn at all."""
    def make(text):
        def step(model, batch, ctx):
            x, y = batch["x"], batch["y"]
            masked = mask(model, x)
            loss = contrastive_loss(masked, text[y], 100.0)
            if lam == 0 and not target_pass:
                return loss
            x_t = next(ctx.targets)["x"]
            with torch.set_grad_enabled(target_grad and lam != 0):
                masked_t = mask(model, x_t)
            if lam == 0:
                return loss
            return loss + lam * adaptation(model, masked, masked_t, x_t, y, text)
        return step
    return make
