"""Pre-training objectives of medical vision-language models, as small pure functions, written
from each method's paper and official code (where they differ the code is the default; see
docs/papers/feddra.md).

FedDRA runs three backbone objectives; every one contains the image-text contrastive (InfoNCE) term
that FedDRA's DRO weights and retrieval measure:

- **ConVIRT** (Zhang et al., MLHC 2022): the global image-text InfoNCE loss in both directions,

      L_ITA = CE(U Wᵀ / τ, I) + CE(W Uᵀ / τ, I),      U, W = L2-normalised image / text embeddings,

  summed over the two directions as in the FedDRA code (τ = 0.07 fixed).
- **GLoRIA** (Huang et al., ICCV 2021; code marshuang80/gloria): the same global loss at GLoRIA's
  temperature (cosine × τ3 = 10, i.e. τ = 0.1) plus a *word-region* (local) contrastive loss. For a
  report with word features e_i (GLoRIA's code keeps [CLS] and the words, not [SEP] or padding) and
  an image with region features v_j: s_ij = e_iᵀ v_j, normalised over the words
  (s̄_ij = softmax_i s_ij), attention a_ij = softmax_j(γ1 s̄_ij), the word's visual context
  c_i = Σ_j a_ij v_j, its relevance R_i = cos(c_i, e_i), and the report-image score
  Z = log Σ_i exp(γ2 R_i) (the code; the paper writes (1/γ2) log Σ_i exp(γ2 R_i)). The local loss is
  the InfoNCE of γ3 Z over the batch, both directions summed (γ1 = 4, γ2 = 5, γ3 = 10).
- **MGCA** (Wang et al., NeurIPS 2022; code HKU-MedAI/MGCA): *cross-modal token alignment*: with
  L2-normalised word and patch embeddings, each word's visual summary is a parameter-free attention
  over the image's patches, v̂_i = normalise(Σ_j softmax_j(t_iᵀ p_j / τ) p_j) (each patch's textual
  summary likewise over the report's words, padding masked, left unnormalised for a ViT), and an
  InfoNCE among the tokens of the same sample pulls t_i to v̂_i (both directions averaged), weighted
  by the token's importance: the [CLS] attention of the last block, clipped to its 10th-90th
  percentile and renormalised (zero for [PAD]). Reports are padded to the maximum length and the
  word InfoNCE runs over all positions, [PAD] included as negatives, as MGCA's code does.
  L_token = L_word + L_patch. *Cross-modal prototype alignment*: the
  normalised image and text embeddings are scored against K prototypes (unit rows, renormalised
  before every training step, frozen at first), Sinkhorn-Knopp turns each modality's scores into
  soft cluster codes, and each modality predicts the other's codes:
  L = -½ mean(Σ q_img log p_txt + Σ q_txt log p_img), p = softmax(scores / τ_p).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import full_precision

# masked entries get a large finite negative score rather than -inf: a fully masked row then stays
# finite (uniform) instead of producing NaN gradients
MASKED = -1.0e4


@full_precision
def similarity_logits(u: torch.Tensor, w: torch.Tensor, temperature: float) -> torch.Tensor:
    """cos(u_i, w_j) / τ for every image i (rows) and text j (columns)."""
    return F.normalize(u, dim=-1) @ F.normalize(w, dim=-1).t() / temperature


@full_precision
def info_nce(u: torch.Tensor, w: torch.Tensor, temperature: float) -> torch.Tensor:
    """ConVIRT/CLIP image-text InfoNCE, the two directions summed: CE(UWᵀ/τ, I) + CE(WUᵀ/τ, I)."""
    logits = similarity_logits(u, w, temperature)
    targets = torch.arange(len(u), device=u.device)
    return F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets)


# --------------------------------------------------------------------------------------------
# GLoRIA: word-region contrast

@full_precision
def gloria_scores(words: torch.Tensor, word_mask: torch.Tensor, regions: torch.Tensor,
                  gamma1: float = 4.0, gamma2: float = 5.0, aggregation: str = "code") -> torch.Tensor:
    """Z[k, l]: how well report k's words are explained by image l's regions (B_text x B_image).

    ``words`` B x T x d (with ``word_mask`` B x T, True = a word that counts), ``regions`` B x N x d.
    ``aggregation``: ``code`` = log Σ_i exp(γ2 R_i) (GLoRIA's code), ``paper`` = the same / γ2.
    """
    if aggregation not in ("code", "paper"):
        raise ValueError(f"unknown GLoRIA aggregation {aggregation!r}; allowed: code, paper")
    mask = word_mask.bool()
    s = torch.einsum("ktd,lnd->kltn", words, regions)                     # word-region dot products
    s = s.masked_fill(~mask[:, None, :, None], MASKED)
    s_bar = torch.softmax(s, dim=2)                                       # normalised over the report's words
    attention = torch.softmax(gamma1 * s_bar, dim=3)                      # over the image's regions
    context = torch.einsum("kltn,lnd->kltd", attention, regions)
    relevance = F.cosine_similarity(context, words[:, None], dim=-1)      # B x B x T
    relevance = relevance.masked_fill(~mask[:, None, :], MASKED)
    z = torch.logsumexp(gamma2 * relevance, dim=2)
    return z if aggregation == "code" else z / gamma2


@full_precision
def gloria_local_loss(words: torch.Tensor, word_mask: torch.Tensor, regions: torch.Tensor,
                      gamma1: float = 4.0, gamma2: float = 5.0, gamma3: float = 10.0,
                      aggregation: str = "code") -> torch.Tensor:
    """GLoRIA's local loss: InfoNCE over γ3·Z, text->image plus image->text."""
    z = gamma3 * gloria_scores(words, word_mask, regions, gamma1, gamma2, aggregation)
    targets = torch.arange(len(z), device=z.device)
    return F.cross_entropy(z, targets) + F.cross_entropy(z.t(), targets)


# --------------------------------------------------------------------------------------------
# MGCA: token alignment and prototype alignment

@full_precision
def cross_attention(queries: torch.Tensor, keys: torch.Tensor, temperature: float,
                    key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """MGCA's parameter-free cross-modal attention: softmax_j(q_i·k_j / τ) over the keys (``key_mask``
    True = a key that may be attended), then the weighted sum of the keys (B x Tq x d)."""
    scores = queries @ keys.transpose(1, 2) / temperature
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask.bool()[:, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ keys


@torch.no_grad()
def token_importance(attention: torch.Tensor, mask: torch.Tensor, low: float = 0.1, high: float = 0.9) -> torch.Tensor:
    """MGCA's token weights: each sample's [CLS] attention over its tokens (B x T), clipped to the
    ``low``-``high`` quantiles of its real tokens (``mask``), zero elsewhere, renormalised to sum 1."""
    mask = mask.bool()
    out = torch.zeros_like(attention)
    for b in range(len(attention)):
        values = attention[b][mask[b]]
        if len(values):
            out[b][mask[b]] = values.clip(torch.quantile(values, low), torch.quantile(values, high))
    return out / out.sum(dim=1, keepdim=True).clamp_min(1e-12)


@full_precision
def token_alignment_loss(tokens: torch.Tensor, summaries: torch.Tensor, mask: torch.Tensor,
                         weights: torch.Tensor, temperature: float) -> torch.Tensor:
    """MGCA's cross-modal token alignment for one modality (L_word or L_patch).

    ``tokens`` B x T x d (a report's words or an image's patches), ``summaries`` B x T x d (each
    token's cross-modal summary), both as the caller wants them compared (MGCA: normalised tokens;
    word summaries normalised, patch summaries not); ``mask`` B x T (True = real token),
    ``weights`` B x T (token importance, zero on padding, summing to 1). Within each sample, token
    i's positive is its own summary and the other real tokens' summaries are negatives (and vice
    versa): ½ (Σ_i w_i CE_row_i + Σ_i w_i CE_col_i), averaged over the batch.
    """
    mask = mask.bool()
    logits = tokens @ summaries.transpose(1, 2) / temperature
    invalid = ~(mask[:, :, None] & mask[:, None, :])
    logits = logits.masked_fill(invalid, MASKED)
    eye = torch.eye(tokens.shape[1], dtype=torch.bool, device=tokens.device)[None]
    log_p_rows = torch.log_softmax(logits, dim=2).masked_select(eye.expand_as(logits)).view(tokens.shape[:2])
    log_p_cols = torch.log_softmax(logits, dim=1).masked_select(eye.expand_as(logits)).view(tokens.shape[:2])
    per_token = -0.5 * (log_p_rows + log_p_cols)
    return (weights * per_token.masked_fill(~mask, 0.0)).sum(dim=1).mean()


@torch.no_grad()
def sinkhorn(scores: torch.Tensor, eps: float = 0.05, iterations: int = 3) -> torch.Tensor:
    """Sinkhorn-Knopp soft assignment (SwAV): B samples x K prototypes -> codes whose rows sum to 1
    and whose columns each hold B/K of the mass (equipartition)."""
    q = torch.exp((scores - scores.max()) / eps).t()   # K x B (shifted for stability; cancels out)
    q = q / q.sum()
    k, b = q.shape
    for _ in range(iterations):
        q = q / q.sum(dim=1, keepdim=True) / k
        q = q / q.sum(dim=0, keepdim=True) / b
    return (q * b).t()


@full_precision
def prototype_alignment_loss(u: torch.Tensor, w: torch.Tensor, prototypes: torch.Tensor, temperature: float = 0.2,
                             eps: float = 0.05, iterations: int = 3) -> torch.Tensor:
    """MGCA's cross-modal prototype alignment: each modality predicts the other's Sinkhorn codes.
    ``prototypes`` (K x d) are used as given: MGCA renormalises its prototype layer in place before
    the step, so the gradient is that of a plain linear layer."""
    image_scores = F.normalize(u, dim=-1) @ prototypes.t()
    text_scores = F.normalize(w, dim=-1) @ prototypes.t()
    q_image, q_text = sinkhorn(image_scores, eps, iterations), sinkhorn(text_scores, eps, iterations)
    log_p_image = torch.log_softmax(image_scores / temperature, dim=1)
    log_p_text = torch.log_softmax(text_scores / temperature, dim=1)
    return -0.5 * ((q_text * log_p_image).sum(dim=1).mean() + (q_image * log_p_text).sum(dim=1).mean())
