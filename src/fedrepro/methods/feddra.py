"""FedDRA: Federated Distributionally Robust Alignment for medical vision-language pre-training
under data heterogeneity (TMLR; arXiv 2404.03854v3). The paper text we have lost its equations;
they are rebuilt here from the prose and the authors' code (docs/papers/feddra.md).

Model: dual encoders E_I, E_T, alignment modules A_I, A_T (one transformer block each) and heads
g_I, g_T (the ``vlp`` family); u = g_I(A_I(E_I(x))), w = g_T(A_T(E_T(t))).

**Global constraint (§4.1, eq. 1).** With ū, w̄ the embeddings of the same (x, t) by the frozen
global (anchor) model, the local objective is

    L_k = L_VLP(u, w) + λ_c · L_con,     L_con = ‖û − ū̂‖² + ‖ŵ − w̄̂‖²,   x̂ = x / ‖x‖,

where L_VLP is the backbone objective (ConVIRT InfoNCE, or GLoRIA / MGCA with their extra terms)
and λ_c the constraint degree. The four embeddings are L2-normalised before the distance, as the
authors' code does (``constraint_space: normalized``; the heads end in a non-affine BatchNorm, so a
raw ‖u‖² is about the embedding dimension, 128, and ``raw`` makes the constraint ~128x stronger).
The code uses ``F.mse_loss`` (mean over batch and dimensions, ``constraint_distance: mse``,
default); ``sq_l2`` sums over dimensions as the paper writes it.

The anchor, as the code keeps it (``anchor: code``, default): a separately built copy of the
model (its own random alignment blocks and heads; pretrained encoders load the same weights) whose
alignment blocks and heads are overwritten by the aggregate after every stage-1 round, and whose
encoders and heads (everything but the alignment blocks) after every stage-2 round. So in stage 2
the anchor is the model the client received, while in stage 1 its alignment blocks are those of the
previous turn's stage-1 aggregate. ``anchor: received`` = the paper's reading: always the model
the client received.

**Two-stage alignment (§4.2).** Stage 1 trains A_I, A_T and the heads with E_I, E_T frozen
(run under no_grad); stage 2 trains everything; both with L_k. The code runs both stages inside
every communication turn (stage 1: 20 steps, aggregate; stage 2: 50 steps, aggregate) —
``schedule: alternate``, where a round of the engine is one stage; ``staged`` trains stage 1 for the
first ``stage1_rounds`` rounds and stage 2 afterwards. In the code every client starts stage 2 from
its *own* stage-1 model: the stage-1 aggregate only goes into the anchor's ``global_*`` modules
(``stage2_start: own``, default); ``aggregate`` starts stage 2 from the broadcast stage-1 aggregate.

**Decentralised DRO (§4.3, eq. 2).** min_θ max_{λ∈Λ_ρ} Σ_k λ_k R_k(θ), with
Λ_ρ = {λ ∈ Δ_K : (1/(2K)) Σ_k (Kλ_k − 1)² ≤ ρ} (χ² ball around uniform). Clients descend
θ_k ← θ_k − η λ_k ∇R_k; after each communication turn the server does mirror ascent

    λ̃_k ∝ λ_k exp(η_λ R_k),     λ ← Proj_{Λ_ρ}(λ̃),

with R_k the loss of the aggregated model on a fixed subset (10%, evaluation transform) of
client k's training data: as the code's test loss, the mean over batches of L_ITA + L_con against
the anchor (``dro.risk: code``; its alignment blocks then still hold the stage-1 aggregate), or the
contrastive term alone (``dro.risk: contrastive``). How λ acts is ``dro.apply``: ``step_size``
(default; the paper's update — client k's learning rate times Kλ_k, so uniform λ changes
nothing), ``loss_scale`` (the code: the loss is multiplied by λ_k, which Adam's invariance to a
constant loss scale almost cancels) or ``aggregation_weight`` (the server averages with weights λ).
As released, the code never carries λ from one turn to the next (``dro.carry_over: false``): the
weights are a plain attribute of the server module, not saved with its state dict, and every turn
runs in a new process that rebuilds the server, so every turn trains with λ = 1/K and each mirror
step starts from uniform; the λ it computes is printed, never used.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Subset

from ..data.loader import batches
from ..device import full_precision
from ..fl.method import ModelAveraging, _cpu
from ..models.vlp import require_vlp
from ..registry import register_method
from ..seeding import numpy_rng, seed_global
from .feddra_params import FEDDRA_PARAMS

# --------------------------------------------------------------------------------------------
# the global constraint

@full_precision
def global_constraint(u: torch.Tensor, u_bar: torch.Tensor, w: torch.Tensor, w_bar: torch.Tensor,
                      distance: str = "mse", normalize: bool = True) -> torch.Tensor:
    """L_con between the local (u, w) and the frozen global (ū, w̄) embeddings of the same pairs;
    with ``normalize`` all four are L2-normalised first (the authors' code)."""
    if normalize:
        u, u_bar, w, w_bar = (F.normalize(t, dim=-1) for t in (u, u_bar, w, w_bar))
    if distance == "mse":
        return F.mse_loss(u, u_bar) + F.mse_loss(w, w_bar)
    if distance == "sq_l2":
        return ((u - u_bar) ** 2).sum(dim=1).mean() + ((w - w_bar) ** 2).sum(dim=1).mean()
    raise ValueError(f"unknown constraint_distance {distance!r}; allowed: mse, sq_l2")


# --------------------------------------------------------------------------------------------
# the DRO client weights

def chi_square_divergence(lam: np.ndarray) -> float:
    """D(λ ‖ uniform) = (1/(2K)) Σ_k (K λ_k − 1)²."""
    lam = np.asarray(lam, dtype=float)
    k = len(lam)
    return float(np.sum((k * lam - 1.0) ** 2) / (2 * k))


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto the probability simplex (sort-based, Held et al. / Duchi et al. 2008)."""
    v = np.asarray(v, dtype=float)
    s = np.sort(v)[::-1]
    cumulative = np.cumsum(s) - 1.0
    index = np.arange(1, len(v) + 1)
    rho = np.nonzero(s - cumulative / index > 0)[0][-1]
    return np.maximum(v - cumulative[rho] / (rho + 1), 0.0)


def project_chi_square_ball(v: np.ndarray, radius: float, tol: float = 1e-12, max_iter: int = 200) -> np.ndarray:
    """Euclidean projection of ``v`` onto {λ ∈ simplex : (1/(2K)) Σ (Kλ_k − 1)² ≤ radius}.

    The ball is ‖λ − 1/K‖² ≤ 2ρ/K. By the KKT conditions the projection is
    Proj_simplex((v + θ/K) / (1 + θ)) for the smallest θ ≥ 0 that puts it inside the ball; its
    distance to uniform decreases in θ, so θ is found by bisection.
    """
    v = np.asarray(v, dtype=float)
    k = len(v)
    uniform = np.full(k, 1.0 / k)

    def at(theta: float) -> np.ndarray:
        return project_simplex((v + theta * uniform) / (1.0 + theta))

    lam = at(0.0)
    if chi_square_divergence(lam) <= radius:
        return lam
    lo, hi = 0.0, 1.0
    while chi_square_divergence(at(hi)) > radius:
        hi *= 2.0
    for _ in range(max_iter):
        mid = 0.5 * (lo + hi)
        if chi_square_divergence(at(mid)) > radius:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol:
            break
    return at(hi)


def mirror_ascent(lam: np.ndarray, risks: np.ndarray, step: float) -> np.ndarray:
    """One exponentiated-gradient (mirror) ascent step on the simplex: λ_k exp(η R_k) / Z."""
    logits = np.log(np.maximum(np.asarray(lam, dtype=float), 1e-300)) + step * np.asarray(risks, dtype=float)
    logits -= logits.max()
    weights = np.exp(logits)
    return weights / weights.sum()


def dro_update(lam: np.ndarray, risks: np.ndarray, step: float, radius: float) -> np.ndarray:
    """λ ← Proj_{Λ_ρ}(mirror ascent step)."""
    return project_chi_square_ball(mirror_ascent(lam, risks, step), radius)


# --------------------------------------------------------------------------------------------

ENCODERS = ("image_encoder.", "text_encoder.")
ALIGNMENT_BLOCKS = ("image_align.", "text_align.")
HEADS = ("image_head.", "text_head.")


@register_method("feddra", params=FEDDRA_PARAMS)
class FedDRA(ModelAveraging):
    def setup(self) -> None:
        require_vlp(self)
        super().setup()
        k = len(self.fed.clients)
        self.lam = np.full(k, 1.0 / k)
        self.last_risks = np.full(k, np.nan)
        self.stage = 2
        self.from_own_stage1 = False
        # client -> its model at the end of its stage-1 round (stage2_start: own)
        self.stage1_models = self.client_states("stage1_models")
        self.anchor = copy.deepcopy(self.work).requires_grad_(False)
        if self.params["anchor"] == "code":
            # the code's global_* modules: built on their own (independent random alignment blocks and heads)
            seed_global(self.ctx.seed, "anchor-init")
            self.anchor_state = _cpu(self.build_model().state_dict())
        else:
            self.anchor_state = None
        dro = self.params["dro"]
        eval_transform = self.family.eval_transform()
        self.risk_sets = {}
        for client in self.fed.clients:
            n = len(client.train)
            size = min(n, max(1, int(dro["risk_fraction"] * n)))
            rows = np.sort(numpy_rng(self.ctx.seed, "dro-risk", client.index).choice(n, size=size, replace=False))
            self.risk_sets[client.name] = Subset(_with_transform(client.train, eval_transform), rows.tolist())

    # ---- the schedule ---------------------------------------------------------------------
    def stage_of(self, rnd: int) -> int:
        if not self.params["two_stage"]:
            return 2
        if self.params["schedule"] == "alternate":
            return 1 if rnd % 2 == 0 else 2
        return 1 if rnd < self.params["stage1_rounds"] else 2

    def turn_ends(self, rnd: int) -> bool:
        """λ is updated once per communication turn: after its stage-2 round under ``alternate``."""
        return not (self.params["two_stage"] and self.params["schedule"] == "alternate") or rnd % 2 == 1

    def starts_from_own_stage1(self, rnd: int) -> bool:
        """Whether round ``rnd`` is a stage-2 round right after a stage-1 round whose clients start from
        their own stage-1 models (``stage2_start: own``)."""
        return (self.params["stage2_start"] == "own" and self.params["two_stage"] and rnd > 0
                and self.stage_of(rnd) == 2 and self.stage_of(rnd - 1) == 1)

    def broadcast(self, rnd):
        self.stage = self.stage_of(rnd)
        self.from_own_stage1 = self.starts_from_own_stage1(rnd)
        message = super().broadcast(rnd)
        if self.from_own_stage1 and self.anchor_state is not None:
            # the code sends only what the anchor takes from the stage-1 aggregate
            return {k: v for k, v in message.items() if k.startswith(ALIGNMENT_BLOCKS + HEADS)}
        return message

    def load_client_model(self, client, message):
        if not self.from_own_stage1:
            return super().load_client_model(client, message)
        # the encoders' parameters were frozen in stage 1, so every client's equal the aggregate's
        own = {k: v.to(self.device) for k, v in self.stage1_models[client.name].items()}
        self.work.load_state_dict({**self.server.state_dict(), **own})
        return self.work

    def stage1_keys(self, state: dict) -> list[str]:
        """What a client keeps of its stage-1 model: everything but the encoders' parameters (frozen in
        stage 1, so equal to the aggregate's); their buffers (a CNN's BatchNorm statistics) are kept."""
        frozen = {n for n, _ in self.server.named_parameters() if n.startswith(ENCODERS)}
        return [k for k in state if k not in frozen]

    def training_lambda(self) -> np.ndarray:
        """The λ clients train with: the last one the server computed, or uniform when λ does not carry
        over between turns (``dro.carry_over: false``, the released code)."""
        if self.params["dro"]["carry_over"]:
            return self.lam
        return np.full(len(self.lam), 1.0 / len(self.lam))

    def local_config(self, client, rnd):
        train = copy.deepcopy(self.ctx.train)
        steps = self.params["stage1_steps"] if self.stage == 1 else self.params["stage2_steps"]
        if steps:
            train["local"] = {**{k: v for k, v in train["local"].items() if k != "epochs"}, "steps": steps}
        if self.params["dro"]["enabled"] and self.params["dro"]["apply"] == "step_size":
            train["optimizer"]["lr"] *= len(self.lam) * self.training_lambda()[client.index]
        return train

    def trainable_parameters(self, model):
        return model.alignment_parameters() if self.stage == 1 else model.parameters()

    # ---- local training ---------------------------------------------------------------------
    def before_local_training(self, client, rnd):
        if self.anchor_state is None:      # the global model the server sent
            self.anchor.load_state_dict(self.server.state_dict())
        else:
            self.anchor.load_state_dict({k: v.to(self.device) for k, v in self.anchor_state.items()})
        self.anchor.train(self.params["anchor_mode"] == "train")

    def constraint(self, out, ref) -> torch.Tensor:
        return global_constraint(out.extra["image_emb"], ref["image_emb"], out.extra["text_emb"], ref["text_emb"],
                                 self.params["constraint_distance"], self.params["constraint_space"] == "normalized")

    def local_loss(self, model, batch, client, rnd):
        out = self.family.forward(model, batch, freeze_encoders=self.stage == 1)
        loss = self.family.loss(out, batch)
        if self.params["constraint_weight"] > 0:
            with torch.no_grad():
                ref = self.family.forward(self.anchor, batch).extra
            loss = loss + self.params["constraint_weight"] * self.constraint(out, ref)
        if self.params["dro"]["enabled"] and self.params["dro"]["apply"] == "loss_scale":
            loss = loss * float(self.training_lambda()[client.index])
        return loss, out

    def after_local_training(self, client, rnd):
        if self.starts_from_own_stage1(rnd + 1):
            state = self.work.state_dict()
            self.stage1_models[client.name] = _cpu({k: state[k] for k in self.stage1_keys(state)})

    # ---- server ---------------------------------------------------------------------------
    def aggregation_weights(self, updates):
        if self.params["dro"]["enabled"] and self.params["dro"]["apply"] == "aggregation_weight":
            index = {c.name: c.index for c in self.fed.clients}
            lam = self.training_lambda()
            return [float(lam[index[u.client]]) for u in updates]
        return super().aggregation_weights(updates)

    def refresh_anchor(self, rnd: int) -> None:
        """The code's anchor sync: after a stage-1 round its alignment blocks and heads take the
        aggregate, after a stage-2 round everything else does (the alignment blocks too when no
        stage-1 round follows to refresh them: ``two_stage: false`` or the ``staged`` schedule)."""
        if self.anchor_state is None:
            return
        server = self.server.state_dict()
        if self.stage == 1:
            keys = [k for k in server if k.startswith(ALIGNMENT_BLOCKS + HEADS)]
        elif self.stage_of(rnd + 1) == 1:
            keys = [k for k in server if not k.startswith(ALIGNMENT_BLOCKS)]
        else:
            keys = list(server)
        self.anchor_state.update({k: server[k].detach().cpu().clone() for k in keys})

    def aggregate(self, updates, rnd):
        super().aggregate(updates, rnd)
        self.refresh_anchor(rnd)
        dro = self.params["dro"]
        if dro["enabled"] and self.turn_ends(rnd):
            with self.ctx.phases("client risks"):
                risks = np.array([self.client_risk(c) for c in self.fed.clients])
            self.ctx.comm.record(rnd, "up", torch.as_tensor(risks, dtype=torch.float32))   # one scalar per client
            self.lam = dro_update(self.training_lambda(), risks, dro["step_size"], dro["radius"])
            self.last_risks = risks
            self.ctx.log.info("FedDRA round %d: risks %s -> lambda %s", rnd + 1, np.round(risks, 4), np.round(self.lam, 4))

    @torch.no_grad()
    def client_risk(self, client) -> float:
        """R_k: the aggregated model's loss on client k's fixed subset, the mean over its batches (the
        code's test loss: InfoNCE + L_con against the anchor, in evaluation mode; or InfoNCE alone)."""
        model = self.server
        with_constraint = self.params["dro"]["risk"] == "code" and self.anchor_state is not None
        if with_constraint:
            self.anchor.load_state_dict({k: v.to(self.device) for k, v in self.anchor_state.items()})
        was_training = model.training
        model.eval()
        self.anchor.eval()
        losses = []
        limit = self.params["dro"]["risk_max_batches"]
        for i, batch in enumerate(batches(self.risk_sets[client.name], self.ctx.train["batch_size"], shuffle=False)):
            if limit is not None and i == limit:
                break
            batch = self.to_device(batch)
            with self.autocast():
                out = self.family.forward(model, batch)
                loss = self.family.loss_terms(out)["ita"]
                if with_constraint:
                    loss = loss + self.constraint(out, self.family.forward(self.anchor, batch).extra)
            losses.append(float(loss))
        model.train(was_training)
        return float(np.mean(losses)) if losses else 0.0

    # ---- checkpointing ----------------------------------------------------------------------
    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        layout["device_models"] += 1                 # the anchor model
        if self.params["anchor"] == "code":
            layout["host_extra"] += self.state_bytes()
        if self.params["stage2_start"] == "own" and self.params["two_stage"]:
            layout["per_client"]["stage1_models"] = self.state_bytes(self.stage1_keys(self.server.state_dict()))
        return layout

    def state_dict(self) -> dict:
        return {**super().state_dict(), "lambda": self.lam.tolist(), "risks": self.last_risks.tolist(),
                "anchor": self.anchor_state, "stage1_models": self.stage1_models.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.lam = np.asarray(state["lambda"], dtype=float)
        self.last_risks = np.asarray(state["risks"], dtype=float)
        self.anchor_state = state.get("anchor", self.anchor_state)
        self.stage1_models.load_state_dict(state.get("stage1_models", {}))

    def final_model(self) -> dict:
        return {**super().final_model(), "lambda": self.lam.tolist()}


def _with_transform(dataset, transform):
    """A shallow copy of an image dataset that applies ``transform`` (the code scores the DRO risk
    with the evaluation transform); datasets without a transform are returned as they are."""
    if getattr(dataset, "transform", None) is None or transform is None:
        return dataset
    out = copy.copy(dataset)
    out.transform = transform
    return out
