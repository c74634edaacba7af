"""PRR-Imb (Chen, Yang, Zhu, Peng and Yuan, "Personalized Retrogress-Resilient Federated Learning
Toward Imbalanced Medical Data", IEEE TMI 2022; code CityU-AIM-Group/PRR-Imbalance), a baseline of
FedIIC's Table 1. FedIIC evaluates its global model, not the personalized ones (supplementary Table 1).

Every client keeps a *personalized* model and a *deputy* model; only the deputy is exchanged.

Deputy-Enhanced Transfer (DET). At the start of local training the client compares the macro-F1 of
the deputy (F_d) and of the personalized model (F_p) on its training data and moves through three
stages (alpha1 = 0.7, alpha2 = 0.9):

    recover   (stage 1: start, or F_d < alpha1 F_p): the deputy learns from the personalized model
    exchange  (stage 2): both learn from each other
    sublimate (stage 3: F_d >= alpha2 F_p after exchange): the personalized model learns from the deputy

"learns from" = its loss plus KL(teacher || student) on the logits (teacher detached). The code
restarts at stage 0 every round (``reset_stage: true``) and, with a single local epoch per round
(FedIIC's setting; the code's ``wk_iters < 2``), skips the stages altogether: both models learn from
each other (mutual learning) in every round. With more local epochs the stage is set once per round
here (the code re-evaluates it after every epoch).

Conjoint Prototype-Aligned (CPA) loss, with the global class counts n (uploaded once by the clients):

    L_CPA = -w_y log( exp(z_y) / (exp(z_y) + sum_{j != y} s_{yj} exp(z_j)) ),
    s_{yj} = (n_j / n_y)^beta if n_y > n_j else 1            (beta = 0.8)
    w_y   = 1 for the first ``init_rounds`` rounds, then (1 + tau) / (cos(p_y, P_y) + tau)   (tau = 3)

where p_y is the client's prototype of class y and P_y the global prototype: the clients' mean, or
(code default) a draw from N(mean, max(std, 1)) over the clients. The code restarts every round
from prototypes of ones (``prototypes: reset``) and learns new ones (mean penultimate feature of the
personalized model per class) only for the round's later local epochs; with one local epoch the
factor therefore compares 1-vectors with the round's global draw, N(1, 1) elementwise (a random
re-weighting of the classes) or exactly 1 for the mean. ``prototypes: carry`` uses the previous
round's learned prototypes instead (the paper's intent).

Progressive Fourier Aggregation (PFA). For every convolution / linear weight (a 4-D kernel is laid out
as a (C*kh) x (kw*N) matrix), the server takes the 2-D FFT of each client's deputy, replaces the
centred low-frequency block covering a fraction L_r of each axis by the clients' mean amplitude and
mean phase, and transforms back; the final classifier is mixed row by row with a 1-D FFT.
L_r = band_start + (r / R)(0.95 - band_start) grows from 0.7. Other parameters are averaged with
equal client weights (the code's ``client_weights = 1 / client_num``); BatchNorm stays with each deputy. Each client continues from its own mixed deputy. The global model
FedIIC evaluates is the size-weighted average (FedAvg) of the uploaded deputies.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..device import backward_step, fp32, full_precision
from ..fl.local import local_batches, make_optimizer
from ..fl.method import ClientUpdate, ModelAveraging, _cpu, weighted_average
from ..metrics import macro_f1
from ..registry import register_method
from ..seeding import torch_generator
from ._common.imbalance import (
    class_counts,
    fixed_randomness,
    head_of,
    outputs_over,
    split_payload,
)
from .prr_imb_params import PRR_IMB_PARAMS

RECOVER, EXCHANGE, SUBLIMATE = 1, 2, 3


# ---- losses and rules --------------------------------------------------------------------

def mitigation_factors(counts: torch.Tensor, beta: float) -> torch.Tensor:
    """s[y, j] = (n_j / n_y)^beta where n_y > n_j, else 1 (rows: target class y)."""
    n = counts.double()
    ratio = (n[None, :] / n[:, None].clamp_min(1e-12)) ** beta
    return torch.where(n[:, None] > n[None, :], ratio, torch.ones_like(ratio)).float()


@full_precision
def cpa_loss(logits: torch.Tensor, targets: torch.Tensor, global_counts: torch.Tensor, beta: float,
             class_weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Mean over the batch of -w_y log(e^{z_y} / (e^{z_y} + sum_{j != y} s_{yj} e^{z_j} + eps) + eps),
    in the code's arithmetic (``loss_func.py::CPA_Loss``): logits shifted by their row maximum, the
    eps in the ratio and in the log (the eps matter where the ratio is tiny)."""
    s = mitigation_factors(global_counts, beta).to(logits.device)[targets]          # B x L, s[y, y] = 1
    shifted = logits - logits.max(dim=1, keepdim=True).values
    e = shifted.exp()
    e_y = e.gather(1, targets[:, None]).squeeze(1)
    den = (s * e).sum(dim=1)                       # e_y + sum_{j != y} s_yj e_j
    nll = -torch.log(e_y / (den + eps) + eps)
    if class_weight is not None:
        nll = nll * class_weight.to(logits.device)[targets]
    return nll.mean()


def prototype_weights(local: torch.Tensor, global_: torch.Tensor, tau: float) -> torch.Tensor:
    """w_c = (1 + tau) / (cos(local_c, global_c) + tau)."""
    cos = F.cosine_similarity(local, global_, dim=1, eps=1e-6)
    return (1.0 + tau) / (cos + tau)


@full_precision
def distillation(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) || softmax(student)), batch mean; the teacher is not trained by it."""
    return F.kl_div(F.log_softmax(student_logits, dim=1), F.softmax(teacher_logits.detach(), dim=1), reduction="batchmean")


def det_stage(previous: int, f1_deputy: float, f1_personal: float, alpha1: float, alpha2: float) -> int:
    """The DET stage of this round from the previous one (0 = none yet) and the two train F1s."""
    if previous == 0 or f1_deputy < alpha1 * f1_personal:
        return RECOVER
    if previous == RECOVER or f1_deputy < alpha2 * f1_personal:
        return EXCHANGE
    return SUBLIMATE


def pfa_band(rnd: int, rounds: int, start: float) -> float:
    return start + (rnd / rounds) * (0.95 - start)


def low_frequency_mix(tensors: list[torch.Tensor], band: float, dims: tuple[int, ...]) -> list[torch.Tensor]:
    """Replace the centred low-frequency block (a fraction ``band`` of each axis in ``dims``) of every
    tensor's spectrum by the mean amplitude and mean phase over the tensors; the rest stays."""
    shape = tensors[0].shape
    half = [math.floor(shape[d] * band / 2) for d in dims]
    if any(h == 0 for h in half):
        return [t.clone() for t in tensors]
    spectra = [torch.fft.fftshift(torch.fft.fftn(t.double(), dim=dims), dim=dims) for t in tensors]
    amplitude, phase = [s.abs() for s in spectra], [s.angle() for s in spectra]
    mean_amp, mean_phase = torch.stack(amplitude).mean(0), torch.stack(phase).mean(0)
    block = [slice(None)] * len(shape)
    for d, h in zip(dims, half):
        centre = shape[d] // 2
        block[d] = slice(centre - h, centre + h)
    block = tuple(block)
    out = []
    for amp, pha, ref in zip(amplitude, phase, tensors):
        amp, pha = amp.clone(), pha.clone()
        amp[block], pha[block] = mean_amp[block], mean_phase[block]
        mixed = torch.fft.ifftn(torch.fft.ifftshift(torch.polar(amp, pha), dim=dims), dim=dims).real
        out.append(mixed.to(ref.dtype))
    return out


def kernel_as_matrix(weight: torch.Tensor) -> torch.Tensor:
    """A conv kernel N x C x kh x kw as the (C*kh) x (kw*N) matrix PFA transforms; 2-D weights as they are."""
    if weight.dim() == 4:
        n, c, kh, kw = weight.shape
        return weight.permute(1, 2, 3, 0).reshape(c * kh, kw * n)
    return weight


def matrix_as_kernel(matrix: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if like.dim() == 4:
        n, c, kh, kw = like.shape
        return matrix.reshape(c, kh, kw, n).permute(3, 0, 1, 2).contiguous()
    return matrix


def parameter_roles(model: nn.Module) -> dict[str, str]:
    """State-dict key -> 'local' (BatchNorm), 'classifier' (the head's weight), 'fourier' (other
    conv / linear weights) or 'average'."""
    head = head_of(model)
    roles = {}
    for prefix, module in model.named_modules():
        entries = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        for name, _ in entries:
            key = f"{prefix}.{name}" if prefix else name
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                roles[key] = "local"
            elif name == "weight" and module is head:
                roles[key] = "classifier"
            elif name == "weight" and isinstance(module, (nn.Conv2d, nn.Linear)):
                roles[key] = "fourier"
            else:
                roles[key] = "average"
    return roles


def progressive_fourier_aggregation(states: list[dict], roles: dict[str, str], band: float) -> list[dict]:
    """Every client's mixed state (see the module docstring)."""
    mixed = [dict(s) for s in states]
    averaged = weighted_average([{k: s[k] for k in s if roles.get(k) == "average"} for s in states], [1.0] * len(states))
    for key in states[0]:
        role = roles.get(key, "average")
        if role == "local":
            continue
        if role == "average":
            for m in mixed:
                m[key] = averaged[key].clone()
            continue
        tensors = [kernel_as_matrix(s[key]) for s in states]
        dims = (-1,) if role == "classifier" else (-2, -1)
        for m, t in zip(mixed, low_frequency_mix(tensors, band, dims)):
            m[key] = matrix_as_kernel(t, states[0][key])
    return mixed


# ---- the method -----------------------------------------------------------------------------

@register_method("prr_imb", params=PRR_IMB_PARAMS)
class PRRImb(ModelAveraging):
    def setup(self) -> None:
        super().setup()
        self.personalized = self.params["evaluate"] == "personalized"
        self.deputy = copy.deepcopy(self.work)
        initial = _cpu(self.server.state_dict())
        self.roles = parameter_roles(self.server)
        self.counts = {c.name: class_counts(c.train, self.fed.num_classes) for c in self.fed.clients}
        self.global_counts = torch.stack(list(self.counts.values())).sum(0)
        self.clients_state = self.client_states("clients")    # client -> personal and deputy models, stage, prototypes
        for c in self.fed.clients:
            self.clients_state[c.name] = {"personal": initial, "deputy": initial, "stage": 0, "prototype": None}
        self.global_prototypes: torch.Tensor | None = None

    # ---- client ------------------------------------------------------------------------
    def local_update(self, client, message, rnd):
        p, train = self.params, self.ctx.train
        st = self.clients_state[client.name]
        personal, deputy = self.work, self.deputy
        personal.load_state_dict(st["personal"])
        deputy.load_state_dict(st["deputy"])
        stage = EXCHANGE if self.single_pass() else self.stage_for(client, st, rnd)   # the code's wk_iters < 2: mutual
        weight = self.class_weights(st, rnd)
        opt_p = make_optimizer(personal.parameters(), train["optimizer"])
        opt_d = make_optimizer(deputy.parameters(), train["optimizer"])
        scaler = self.compute.scaler()
        personal.train()
        deputy.train()
        num = self.fed.num_classes
        proto_sum, proto_count, losses = None, torch.zeros(num, device=self.device), []
        for batch in local_batches(client.train, train, self.ctx.seed, rnd, client.index):
            batch = self.to_device(batch)
            y = batch["y"]
            with self.autocast():
                out_p, out_d = self.family.forward(personal, batch), self.family.forward(deputy, batch)
                loss_p = cpa_loss(out_p.logits, y, self.global_counts, p["beta"], weight)
                loss_d = cpa_loss(out_d.logits, y, self.global_counts, p["beta"], weight)
                if stage in (EXCHANGE, SUBLIMATE):
                    loss_p = loss_p + distillation(out_p.logits, out_d.logits)
                if stage in (RECOVER, EXCHANGE):
                    loss_d = loss_d + distillation(out_d.logits, out_p.logits)
            backward_step(loss_p + loss_d, [opt_p, opt_d], scaler)
            losses.append(loss_p.detach())
            feats = fp32(out_p.features.detach())
            if proto_sum is None:
                proto_sum = torch.zeros(num, feats.shape[1], device=self.device)
            proto_sum.index_add_(0, y, feats)
            proto_count += torch.bincount(y, minlength=num).float()
        means = proto_sum / proto_count.clamp_min(1.0)[:, None] if proto_sum is not None else None
        if means is not None:
            previous = st["prototype"]
            seen = proto_count > 0
            st["prototype"] = torch.where(seen[:, None], means, previous.to(self.device) if previous is not None else means).cpu()
        st["personal"], st["stage"] = _cpu(personal.state_dict()), stage
        self.clients_state[client.name] = st
        payload = {k: v.detach().clone() for k, v in deputy.state_dict().items()}
        if means is not None:
            payload["prr.prototype"], payload["prr.present"] = means, (proto_count > 0).float()
        if rnd == 0:
            payload["prr.class_counts"] = self.counts[client.name]     # the server needs the global counts once
        return ClientUpdate(client.name, payload, len(client.train),
                            {"loss": float(torch.stack(losses).mean()) if losses else float("nan"), "steps": len(losses),
                             "stage": stage})

    def single_pass(self) -> bool:
        """One local epoch per round (or a fixed number of steps): the code's mutual-learning branch."""
        local = self.ctx.train["local"]
        return "steps" in local or local.get("epochs", 1) == 1

    def stage_for(self, client, st, rnd: int) -> int:
        previous = 0 if self.params["reset_stage"] else st["stage"]
        if previous == 0:
            return RECOVER                       # no F1 needed to start
        f1_p = self.train_f1(self.work, client, rnd, "personal")
        f1_d = self.train_f1(self.deputy, client, rnd, "deputy")
        return det_stage(previous, f1_d, f1_p, self.params["alpha1"], self.params["alpha2"])

    @torch.no_grad()
    def train_f1(self, model, client, rnd: int, role: str) -> float:
        """Macro-F1 on the client's training data. The code (local_train.py::DET) runs ``test`` over the
        shuffled, augmented ``train_loader`` once per model every round: each pass its own draws."""
        preds, labels = [], []
        with fixed_randomness(self.ctx.seed, "augment", "prr-f1", rnd, client.index, role):
            for out, batch in outputs_over(self.family, model, client.train, self.ctx.train, self.compute):
                preds.append(out.logits.argmax(1).cpu())
                labels.append(batch["y"].cpu())
        return macro_f1(torch.cat(labels).numpy(), torch.cat(preds).numpy()) if labels else 0.0

    def class_weights(self, st, rnd) -> torch.Tensor | None:
        if rnd < self.params["init_rounds"]:
            return None
        if self.params["prototypes"] == "reset":       # the code's round start: 1-vectors and their global draw
            ones = torch.ones(self.fed.num_classes, head_of(self.server).in_features)
            global_ = self.combine_prototypes(ones.expand(len(self.fed.clients), *ones.shape),
                                              torch.ones(len(self.fed.clients), len(ones), dtype=torch.bool), rnd, "reset")
            return prototype_weights(ones.to(self.device), global_.to(self.device), self.params["tau"])
        if self.global_prototypes is None or st["prototype"] is None:
            return None
        return prototype_weights(st["prototype"].to(self.device), self.global_prototypes.to(self.device), self.params["tau"])

    # ---- server ------------------------------------------------------------------------
    def aggregate(self, updates, rnd):
        prototypes, present = [], []
        for u in updates:
            u.payload, extra = split_payload(u.payload, "prr.")
            if "prr.prototype" in extra:
                prototypes.append(extra["prr.prototype"])
                present.append(extra["prr.present"] > 0)
        weights = self.aggregation_weights(updates)
        states = [u.payload for u in updates]
        self.server.load_state_dict(weighted_average(states, weights))            # the evaluated global model
        band = pfa_band(rnd, self.ctx.train["rounds"], self.params["band_start"])
        for u, state in zip(updates, progressive_fourier_aggregation(states, self.roles, band)):
            st = self.clients_state[u.client]
            st["deputy"] = _cpu(state)
            self.clients_state[u.client] = st
        if prototypes:
            self.global_prototypes = self.combine_prototypes(torch.stack(prototypes), torch.stack(present), rnd)

    def combine_prototypes(self, local: torch.Tensor, present: torch.Tensor, rnd: int, *keys) -> torch.Tensor:
        """Mean over the clients holding each class, or a draw from N(mean, max(std, 1)) (one draw per
        round and ``keys``, the same for every client)."""
        w = present.float()[:, :, None]                                   # K x L x 1
        n = w.sum(0).clamp_min(1.0)
        mean = (local * w).sum(0) / n
        if self.params["global_prototype"] == "mean":
            return mean.cpu()
        var = (((local - mean) ** 2) * w).sum(0) / (n - 1).clamp_min(1.0)
        std = torch.where(n > 1, var.sqrt(), torch.ones_like(var)).clamp_min(1.0)
        noise = torch.randn(mean.shape, generator=torch_generator(self.ctx.seed, "server", "prr-prototypes", rnd, *keys))
        return (mean.cpu() + noise * std.cpu())

    # ---- evaluation and checkpoints ---------------------------------------------------
    def model_for(self, client):
        if client is None or not self.personalized:
            return self.server
        self.work.load_state_dict(self.clients_state[client.name]["personal"])
        return self.work

    def memory_layout(self) -> dict:
        layout = super().memory_layout()
        layout["device_models"] += 1                 # the deputy
        layout["per_client"]["clients"] = 2 * self.state_bytes()          # personal and deputy models
        return layout

    def state_dict(self):
        return {**super().state_dict(), "clients": self.clients_state.state_dict(), "global_prototypes": self.global_prototypes}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.clients_state.load_state_dict(state["clients"])
        self.global_prototypes = state["global_prototypes"]
