"""Specification of FedDRA's image-text model, its three backbone objectives and its retrieval
evaluation, written from the papers and the authors' code (FedDRA: BioMed-AI-Lab-U-Michgan/TMLR_FedDRA,
on top of MGCA's code; GLoRIA: marshuang80/gloria; MGCA: HKU-MedAI/MGCA), independently of
``fedrepro.models.vlp_objectives``. The modules of the dual encoder (ViT, BERT, the alignment
blocks, the heads) are the architecture both sides share; how they are wired into losses is what
this file states.

Model: u = g_I(A_I(E_I(x))[CLS]), w = g_T(A_T(E_T(t))[CLS]); A_* take [CLS; tokens] and also give
the [CLS] row of their attention (mean over heads), which MGCA uses as token importance.

Text into A_T (FedDRA's ``encoder.py`` ``BertEncoder``, MGCA's ``aggregate_tokens``; ``SLIA_module.py``
calls ``align_text_model`` on the hidden states alone): reports are tokenized padded to max_length;
walking the word pieces up to the first [SEP], a piece that does not start with ``##`` closes the
word collected so far (the sum of its pieces' features) and starts the next one, ``##`` pieces join
the current word, and [SEP] closes the last word and is appended itself; the rest is zero vectors up
to the tokenized length. A_T gets no attention mask (``text_mask: none``; ``padding`` masks the zero
vectors out, and then reports may be padded to the batch's longest only).

ConVIRT (FedDRA's code): L_ITA = CE(Û Ŵᵀ/τ, I) + CE(Ŵ Ûᵀ/τ, I), Û, Ŵ L2-normalised, τ = 0.07.

GLoRIA (its code, ``gloria_loss.py``): global loss = L_ITA at cosine × temp3 = 10 (τ = 0.1). Local
loss: for text i take its word features e (the local head on [CLS] and the words, up to but not
including [SEP]: GLoRIA's ``cap_lens``) and, for every image b, region features v (local head on
the patch tokens): attention = softmax over regions of temp1 · softmax over words (v e); context
c = attention · v; R = cos(e, c) per word; Z[b, i] = log Σ_words exp(temp2 R) (no 1/temp2, as the
code); logits = temp3 Z; loss = CE(rows = images) + CE(rows = texts). Total = global + local.

MGCA (its code, ``mgca_module.py``, use_local_atten off): reports padded to max_length. Normalised
local embeddings of the patches p and of the words t (positions 1: of the text tokens, padding
included). Word summaries: normalise(softmax(t pᵀ / τ_l) p); patch summaries: softmax over the
non-[PAD] words of (p tᵀ / τ_l), times t, not normalised (a ViT). Word weights: the text [CLS]
attention over positions 1:, clipped per report to the 10%/90% quantiles of its non-zero entries
(zero stays zero), divided by their sum; patch weights likewise over all patches. L_word = ½ [Σ_b
Σ_i w_bi CE_i(rows) + Σ_b Σ_j w_bj CE_j(columns)] / B over the sim t v̂ᵀ / τ_l (every position),
L_patch the same for patches; L_local = L_word + L_patch. Prototypes: renormalised in place before
the training forward, frozen (no gradient) for the first ``freeze_prototypes_steps`` steps; scores
= Û Pᵀ and Ŵ Pᵀ; codes by MGCA's Sinkhorn (Q = exp(scores / ε)ᵀ / ΣQ, 3 × [rows to 1/K, columns to
1/B], then columns to 1); L_proto = ½ [−mean Σ q_img log softmax(Ŵ Pᵀ/τ_p) − mean Σ q_txt log
softmax(Û Pᵀ/τ_p)]. Total = L_ITA + λ2 L_local + λ3 L_proto.

Retrieval (FedDRA paper, appendix A.1.2): every client's test pairs, embedded by the evaluated model
in evaluation mode, split into pools of ``pool`` pairs by a fixed shuffle; for each text the pool's
images are ranked by cosine; Recall@k = share of texts whose image is among the k best, a tie with
another image counting against the model; cos_sim = mean cosine of the pairs. The authors' code
(``data_module.py`` ``val_dataloader``, ``SLIA_module.py`` ``validation_step``/``precision_at_k``):
the validation pairs in file order, batches of 32 without the last partial one, the mean of
image-to-text and text-to-image top-k accuracy per batch, ties in index order (``topk``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedrepro.seeding import numpy_rng

from .harness import client_batches, seed_client
from .vlp_harness import eval_batches


@dataclass
class Towers:
    u: torch.Tensor
    w: torch.Tensor
    image_tokens: torch.Tensor      # A_I output, [CLS] first
    text_tokens: torch.Tensor       # A_T output, [CLS] first
    image_attention: torch.Tensor   # [CLS] row of A_I's attention over the patches
    text_attention: torch.Tensor    # [CLS] row of A_T's attention over positions 1:
    mask: torch.Tensor              # text attention mask (True = real token)


def tokenize(family, captions, cfg: dict) -> dict[str, torch.Tensor]:
    unmasked = cfg["alignment"]["text_mask"] == "none"
    padding = "max_length" if cfg["objective"] == "mgca" or unmasked else "longest"
    tokens = family.tokenizer(list(captions), padding=padding, truncation=True, max_length=cfg["text"]["max_length"],
                              return_tensors="pt")
    return {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}


def words_of(tokenizer, features: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One report's word features (the walk described above) and their mask, both of length T."""
    pieces = tokenizer.convert_ids_to_tokens(ids.tolist())
    words, bank = [], []
    for piece, feature in zip(pieces, features):
        if piece == tokenizer.sep_token:
            words += [torch.stack(bank).sum(dim=0), feature]
            break
        if piece.startswith("##"):
            bank.append(feature)
            continue
        if bank:
            words.append(torch.stack(bank).sum(dim=0))
        bank = [feature]
    padded = torch.cat([torch.stack(words), features.new_zeros(len(features) - len(words), features.shape[1])])
    return padded, torch.arange(len(features)) < len(words)


def towers(family, model, batch: dict, freeze_encoders: bool = False) -> Towers:
    cfg = family.cfg
    tokens = tokenize(family, batch["caption"], cfg)
    frozen = torch.no_grad() if freeze_encoders else contextlib.nullcontext()
    with frozen:
        image = model.image_encoder.forward_features(batch["x"])
        text = model.text_encoder(**tokens).last_hidden_state
    mask = tokens["attention_mask"].bool()
    if cfg["alignment"]["text_tokens"] == "words":
        rows = [words_of(family.tokenizer, f, i) for f, i in zip(text, tokens["input_ids"])]
        text, mask = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
    image_tokens, image_attention = model.image_align(image)
    text_tokens, text_attention = model.text_align(text, pad_mask=~mask if cfg["alignment"]["text_mask"] == "padding" else None)
    return Towers(model.image_head(image_tokens[:, 0]), model.text_head(text_tokens[:, 0]), image_tokens, text_tokens,
                  image_attention, text_attention, mask)


def image_embedding(model, x: torch.Tensor) -> torch.Tensor:
    """u of the image tower alone (what the image-side SSL baselines train)."""
    tokens, _ = model.image_align(model.image_encoder.forward_features(x))
    return model.image_head(tokens[:, 0])


def info_nce(u, w, tau):
    scores = F.normalize(u, dim=-1) @ F.normalize(w, dim=-1).t() / tau
    labels = torch.arange(len(u))
    return F.cross_entropy(scores, labels) + F.cross_entropy(scores.t(), labels)


# ---- GLoRIA ------------------------------------------------------------------------------------

def gloria_local(model, t: Towers, g: dict) -> torch.Tensor:
    regions = model.image_local(t.image_tokens[:, 1:])               # B x N x d
    words_all = model.text_local(t.text_tokens)                       # B x T x d
    lengths = (t.mask.sum(dim=1) - 1).tolist()                        # [CLS] + words, without [SEP]
    columns = []
    for i, length in enumerate(lengths):
        e = words_all[i, :length]                                     # L x d
        attn = torch.einsum("bnd,ld->bnl", regions, e).softmax(dim=-1)           # over the words
        attn = (g["gamma1"] * attn.transpose(1, 2)).softmax(dim=-1)              # B x L x N, over regions
        context = attn @ regions                                                  # B x L x d
        relevance = F.cosine_similarity(e[None].expand_as(context), context, dim=-1)
        z = torch.log(torch.exp(g["gamma2"] * relevance).sum(dim=1))
        columns.append(z if g["aggregation"] == "code" else z / g["gamma2"])
    scores = g["gamma3"] * torch.stack(columns, dim=1)                # rows: images, columns: texts
    labels = torch.arange(len(lengths))
    return F.cross_entropy(scores, labels) + F.cross_entropy(scores.t(), labels)


# ---- MGCA ----------------------------------------------------------------------------------------

def clipped_weights(attention: torch.Tensor, only_nonzero: bool) -> torch.Tensor:
    weights = attention.detach().clone()
    for row in weights:
        idx = row.nonzero().squeeze(-1) if only_nonzero else torch.arange(len(row))
        low, high = torch.quantile(row[idx], 0.1), torch.quantile(row[idx], 0.9)
        row[idx] = row[idx].clip(low, high)
    return weights / weights.sum(dim=1, keepdim=True)


def weighted_token_nce(sim: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    b, n, _ = sim.shape
    targets = torch.arange(n).repeat(b)
    rows = F.cross_entropy(sim.reshape(b * n, n), targets, reduction="none")
    cols = F.cross_entropy(sim.transpose(1, 2).reshape(b * n, n), targets, reduction="none")
    return 0.5 * ((rows * weights.reshape(-1)).sum() / b + (cols * weights.reshape(-1)).sum() / b)


def sinkhorn(scores: torch.Tensor, eps: float, iterations: int) -> torch.Tensor:
    q = torch.exp(scores / eps).t()
    q = q / q.sum()
    k, b = q.shape
    r, c = torch.ones(k) / k, torch.ones(b) / b
    for _ in range(iterations):
        q = q * (r / q.sum(dim=1))[:, None]
        q = q * (c / q.sum(dim=0))[None]
    return (q / q.sum(dim=0, keepdim=True)).t()


def mgca_terms(model, t: Towers, m: dict, prototypes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    assert m["attention"] == "softmax"      # MGCA's code: use_local_atten off
    tau = m["token_temperature"]
    patches = F.normalize(model.image_local(t.image_tokens[:, 1:]), dim=-1)
    words = F.normalize(model.text_local(t.text_tokens[:, 1:]), dim=-1)
    pad = ~t.mask[:, 1:]
    word_out = F.normalize(torch.softmax(words @ patches.transpose(1, 2) / tau, dim=-1) @ patches, dim=-1)
    # MGCA's word importance is zero on padding (BERT's masked attention, zero-padded by aggregate_tokens)
    importance = t.text_attention * t.mask[:, 1:]
    loss_word = weighted_token_nce(words @ word_out.transpose(1, 2) / tau, clipped_weights(importance, True))
    scores = (patches @ words.transpose(1, 2)).masked_fill(pad[:, None, :], float("-inf"))
    patch_out = torch.softmax(scores / tau, dim=-1) @ words
    loss_patch = weighted_token_nce(patches @ patch_out.transpose(1, 2) / tau, clipped_weights(t.image_attention, False))
    image_out = F.normalize(t.u, dim=-1) @ prototypes.t()
    report_out = F.normalize(t.w, dim=-1) @ prototypes.t()
    with torch.no_grad():
        image_code = sinkhorn(image_out, m["sinkhorn_eps"], m["sinkhorn_iterations"])
        report_code = sinkhorn(report_out, m["sinkhorn_eps"], m["sinkhorn_iterations"])
    image_prob = torch.softmax(image_out / m["proto_temperature"], dim=1)
    report_prob = torch.softmax(report_out / m["proto_temperature"], dim=1)
    i2t = -(image_code * torch.log(report_prob)).sum(dim=1).mean()
    t2i = -(report_code * torch.log(image_prob)).sum(dim=1).mean()
    proto = 0.5 * (i2t + t2i)
    return loss_word + loss_patch, proto


def check_code_defaults(model_cfg: dict) -> None:
    """The run's objective settings are the authors' code's (the specification above follows them)."""
    assert model_cfg["temperature"] == 0.07                                         # FedDRA's code
    g = model_cfg["gloria"]
    assert (g["gamma1"], g["gamma2"], g["gamma3"], g["local_weight"]) == (4.0, 5.0, 10.0, 1.0)
    assert (g["aggregation"], g["global_temperature"]) == ("code", 0.1)
    m = model_cfg["mgca"]
    assert (m["attention"], m["token_temperature"], m["proto_temperature"]) == ("softmax", 0.1, 0.2)
    assert (m["sinkhorn_eps"], m["sinkhorn_iterations"], m["token_weight"], m["proto_weight"]) == (0.05, 3, 1.0, 1.0)


class Objective:
    """The backbone objective of a run's model block, with MGCA's per-model prototype state."""

    def __init__(self, family):
        self.family, self.cfg = family, family.cfg
        self.name = self.cfg["objective"]

    @property
    def ita_tau(self) -> float:
        if self.name == "gloria" and self.cfg["gloria"]["global_temperature"] is not None:
            return self.cfg["gloria"]["global_temperature"]
        return self.cfg["temperature"]

    def prototypes(self, model) -> torch.Tensor:
        """MGCA's prototype layer at a training step: renormalised in place, detached while frozen;
        the model counts its training steps in its ``prototype_steps`` buffer (averaged with it)."""
        with torch.no_grad():
            model.prototypes.copy_(F.normalize(model.prototypes, dim=-1))
        steps = float(model.prototype_steps)
        model.prototype_steps += 1
        return model.prototypes.detach() if steps < self.cfg["mgca"]["freeze_prototypes_steps"] else model.prototypes

    def loss(self, model, batch: dict, freeze_encoders: bool = False) -> tuple[torch.Tensor, Towers]:
        t = towers(self.family, model, batch, freeze_encoders)
        loss = info_nce(t.u, t.w, self.ita_tau)
        if self.name == "gloria":
            loss = loss + self.cfg["gloria"]["local_weight"] * gloria_local(model, t, self.cfg["gloria"])
        elif self.name == "mgca":
            m = self.cfg["mgca"]
            local, proto = mgca_terms(model, t, m, self.prototypes(model))
            loss = loss + m["token_weight"] * local + m["proto_weight"] * proto
        return loss, t


# ---- local training and retrieval --------------------------------------------------------------

def adamw(run: dict, params, lr_scale: float = 1.0) -> torch.optim.Optimizer:
    """The run's optimizer (FedDRA's code: AdamW, fresh every round) over the trainable ``params``."""
    opt = run["train"]["optimizer"]
    assert opt["name"] == "adamw" and not opt.get("persist")
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=opt["lr"] * lr_scale, betas=tuple(opt["betas"]),
                             eps=opt.get("eps", 1e-8), weight_decay=opt["weight_decay"])


def train_client(run: dict, client, rnd: int, model, step_loss, params=None, lr_scale: float = 1.0,
                 batches=None, after_step=None) -> None:
    """One client's local work: the engine's seeding, its batches for the round, a fresh AdamW, and
    ``step_loss(model, batch)`` minimised step by step (``after_step(model)`` after each update)."""
    seed_client(run, rnd, client)
    model.train()
    opt = adamw(run, model.parameters() if params is None else params, lr_scale)
    for batch in (client_batches(run, client, rnd) if batches is None else batches):
        loss = step_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if after_step is not None:
            after_step(model)


def evaluate_clients(family, model, fed, run: dict, prefix: str = "") -> dict[str, dict[str, float]]:
    """Retrieval of ``model`` on every client's reported pairs (test, or val as the code), keyed like the
    engine's eval keys."""
    split = run["train"]["model"]["retrieval"]["split"]
    return {f"{prefix}{c.name}": retrieval(family, model, getattr(c, split), run) for c in fed.clients}


def check_retrieval(driven, model, fed, run: dict, prefix: str = "", owner: str = "") -> None:
    """The engine's recorded retrieval metrics of every client equal the specification's for ``model``
    (eval keys ``<prefix><owner>@<client>`` when ``owner`` is given)."""
    from .harness import assert_close
    from .vlp_harness import recorded

    for key, scores in evaluate_clients(driven.method.family, model, fed, run, prefix + (f"{owner}@" if owner else "")).items():
        assert_close(recorded(driven, key), scores, f"retrieval on {key}")


def loaded(start, state: dict):
    """A copy of ``start`` holding ``state`` (its floating-point entries)."""
    import copy

    model = copy.deepcopy(start)
    model.load_state_dict({**model.state_dict(), **state})
    return model


def recall(sim: np.ndarray, k: int, ties: str = "against") -> float:
    n = len(sim)
    if ties == "index":     # topk returns tied scores in index order
        better = [(sim[i] > sim[i, i]).sum() + (sim[i, :i] == sim[i, i]).sum() for i in range(n)]
    else:
        better = [(sim[i] >= sim[i, i]).sum() - 1 for i in range(n)]
    return float(np.mean([b < k for b in better]))


@torch.no_grad()
def retrieval(family, model, dataset, run: dict) -> dict[str, float]:
    was = model.training
    model.eval()
    us, ws = [], []
    for batch in eval_batches(dataset, run["train"]["eval_batch_size"]):
        t = towers(family, model, batch)
        us.append(F.normalize(t.u, dim=-1))
        ws.append(F.normalize(t.w, dim=-1))
    model.train(was)
    u, w = torch.cat(us).numpy(), torch.cat(ws).numpy()
    r = run["train"]["model"]["retrieval"]
    if r["pools"] == "shuffled":
        order = numpy_rng(0, "retrieval", len(u)).permutation(len(u))     # the fixed shuffle into pools
    else:
        order = np.arange(len(u))                                          # the loader's order
    pools = [order[i:i + r["pool"]] for i in range(0, len(u), r["pool"])]
    if r["drop_last"]:
        pools = [p for p in pools if len(p) == r["pool"]]
    out = {}
    for k in (1, 5):
        total = 0.0
        for pool in pools:
            sim = w[pool] @ u[pool].T
            t2i = recall(sim, k, r["ties"])
            score = t2i if r["direction"] == "t2i" else 0.5 * (t2i + recall(sim.T, k, r["ties"]))
            total += score * len(pool)
        out[f"recall@{k}"] = total / sum(len(p) for p in pools)
    out["cos_sim"] = float(np.mean(np.sum(u * w, axis=1)))
    return out
