"""Dual-encoder vision-language pre-training (FedDRA; docs/papers/feddra.md): the ``vlp`` model family.

Image path: ViT encoder E_I (timm) -> alignment module A_I (one extra transformer block, ViT style)
-> projection head g_I -> u. Text path: BERT encoder E_T (transformers) -> alignment module A_T (one
extra transformer block, BERT style) -> g_T -> w. Both alignment modules take [CLS; tokens] and the
heads read their [CLS] output. A timm CNN may stand in for the ViT (the offline demo's pretrained
EfficientNet-Lite0): its tokens are the positions of its last feature map, led by their average as
[CLS] (GLoRIA's own image encoder is a CNN whose feature-map positions are its regions). Heads are MGCA's ``GlobalEmbedding``: Linear -> BN -> ReLU -> Linear
-> BN (no affine), 2048 hidden and 128 output dimensions in the paper's setting.

The family's base loss is the configured backbone objective (:mod:`.vlp_objectives`): ConVIRT
(image-text InfoNCE), GLoRIA (+ word-region contrast, needs local heads) or MGCA (+ token and
prototype alignment, needs local heads, two cross-attention layers and learnable prototypes).
``Output.objective`` holds the InfoNCE pairs, so generic methods that reweight cross-entropy
pairs act on the contrastive term; ``Output.features`` is [û; ŵ] (both normalised embeddings), so
representation-level methods (MOON) contrast the joint image-text representation.

Evaluation (:meth:`VisionLanguageFamily.evaluate`) is in-domain image-text retrieval on every
client's held-out split (paper appendix A.1.2): for each text in a pool of image-text pairs (the
"batch"), rank the pool's images; Recall@1/@5; plus the mean cosine similarity of paired embeddings
(Fig. 4d-f). Per client, the mean over clients (Rec.), the worst client (Wst.) and the spread across
clients (``clients_disparity`` = std, the "Disparity" of appendix Table 9 as we read it).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..metrics import recall_at_k
from ..registry import register_model
from ..seeding import numpy_rng
from . import encoders
from .decoding import vlp_specs
from .families import NORMALISATION, ModelFamily, Output
from .text_tower import build_text_encoder, build_tokenizer, text_weights
from .vlp_objectives import (
    cross_attention,
    gloria_local_loss,
    info_nce,
    prototype_alignment_loss,
    similarity_logits,
    token_alignment_loss,
    token_importance,
)
from .vlp_params import VLP_PARAMS

HF_INIT_STD, HF_LAYER_NORM_EPS = 0.02, 1e-12   # BertConfig / ViTConfig: initializer_range, layer_norm_eps


class AlignmentBlock(nn.Module):
    """One transformer block over [CLS; tokens]. ``norm_first`` = ViT's pre-norm block; otherwise
    BERT's post-norm layer. Returns the tokens and the [CLS] token's attention over the other tokens
    (mean over heads), which MGCA uses as token importance. ``init="huggingface"``: the weights of a freshly
    built Hugging Face layer (:meth:`init_as_huggingface`); ``"pytorch"``: PyTorch's module defaults."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, dropout: float = 0.0, norm_first: bool = True,
                 eps: float = 1e-6, init: str = "pytorch"):
        super().__init__()
        self.norm_first = norm_first
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.dropout = nn.Dropout(dropout)
        if init == "huggingface":
            self.init_as_huggingface()

    @torch.no_grad()
    def init_as_huggingface(self, std: float = HF_INIT_STD) -> None:
        """FedDRA's A_I and A_T are the last layer of a ViTModel / BertModel built from a config
        (BioMed-AI-Lab-U-Michgan/TMLR_FedDRA mgca/models/mgca/SLIA_module.py: ``ViTModel(ViTConfig.from_pretrained(
        'google/vit-base-patch16-224')).encoder.layer[-1]``, ``BertModel(BertConfig.from_pretrained(
        'bert-base-uncased')).encoder.layer[-1]``), which their ``_init_weights`` initialises (transformers 4.18,
        the code's pin): every linear weight (query, key, value, the attention output, the MLP) ~ N(0, 0.02),
        every bias 0, LayerNorm weight 1 and bias 0."""
        for weight in (self.attn.in_proj_weight, self.attn.out_proj.weight, self.mlp[0].weight, self.mlp[2].weight):
            weight.normal_(0.0, std)
        for bias in (self.attn.in_proj_bias, self.attn.out_proj.bias, self.mlp[0].bias, self.mlp[2].bias):
            bias.zero_()
        for norm in (self.norm1, self.norm2):
            norm.weight.fill_(1.0)
            norm.bias.zero_()

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.norm_first:
            h = self.norm1(x)
            a, weights = self.attn(h, h, h, key_padding_mask=pad_mask, need_weights=True, average_attn_weights=True)
            x = x + self.dropout(a)
            x = x + self.dropout(self.mlp(self.norm2(x)))
        else:
            a, weights = self.attn(x, x, x, key_padding_mask=pad_mask, need_weights=True, average_attn_weights=True)
            x = self.norm1(x + self.dropout(a))
            x = self.norm2(x + self.dropout(self.mlp(x)))
        return x, weights[:, 0, 1:]


class ProjectionHead(nn.Module):
    """MGCA's global embedding: Linear -> BN -> ReLU -> Linear -> BN(affine=False)."""

    def __init__(self, dim_in: int, hidden: int, dim_out: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
                                 nn.Linear(hidden, dim_out), nn.BatchNorm1d(dim_out, affine=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def is_vit(encoder: nn.Module) -> bool:
    return hasattr(encoder, "blocks") and hasattr(encoder, "patch_embed")


def vit_name(name: str) -> bool:
    """Whether a timm model name is a ViT (it then takes img_size / patch_size), known without building it."""
    from timm.models._registry import model_entrypoint

    return model_entrypoint(name.split(".")[0]).__module__.endswith((".vision_transformer", ".deit"))


def image_width(encoder: nn.Module) -> int:
    """D of the image tokens: the ViT's width, or the CNN's last feature-map channels."""
    return encoder.embed_dim if is_vit(encoder) else encoder.num_features


def image_heads(encoder: nn.Module) -> int:
    """Attention heads of A_I: the ViT's own; for a CNN the largest of 8, 4, 2, 1 that divides D."""
    if is_vit(encoder):
        return encoder.blocks[0].attn.num_heads
    return next(h for h in (8, 4, 2, 1) if image_width(encoder) % h == 0)


def without_head_conv(encoder: nn.Module, name: str) -> None:
    """A timm EfficientNet whose forward_features stops at its last stage: the 1x1 head convolution and its norm
    become identities, and num_features the last stage's channels."""
    if is_vit(encoder) or not hasattr(encoder, "conv_head"):
        raise ValueError(f"image.cnn_tokens: last_stage needs a timm EfficientNet-style CNN (conv_head); {name!r} is not")
    encoder.conv_head, encoder.bn2 = nn.Identity(), nn.Identity()
    encoder.num_features = encoder.feature_info[-1]["num_chs"]


def encoder_tokens(encoder: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """E_I: [CLS; patch tokens] (B x (1+N) x D): the ViT's, after its final norm; for a CNN the
    positions of its last feature map, led by their mean."""
    out = encoder.forward_features(x)
    if is_vit(encoder):
        return out
    tokens = out.flatten(2).transpose(1, 2)
    return torch.cat([tokens.mean(dim=1, keepdim=True), tokens], dim=1)


def shallow_image_modules(encoder: nn.Module, blocks: int) -> list[nn.Module]:
    """The image side of "the first ``blocks`` blocks": the patch embedding and the first transformer
    blocks of a ViT; the stem and the first stages of a CNN."""
    if is_vit(encoder):
        return [encoder.patch_embed, *encoder.blocks[:blocks]]
    if hasattr(encoder, "conv_stem"):
        return [encoder.conv_stem, encoder.bn1, *encoder.blocks[:blocks]]
    return [encoder.conv1, encoder.bn1, *[getattr(encoder, f"layer{i + 1}") for i in range(min(blocks, 4))]]


class DualEncoder(nn.Module):
    """E_I, E_T (the feature encoders), A_I, A_T (alignment modules), g_I, g_T (heads) and, for the
    GLoRIA/MGCA objectives, local token heads, MGCA's cross-attention and prototypes."""

    ENCODERS = ("image_encoder", "text_encoder")

    def __init__(self, image_encoder: nn.Module, text_encoder: nn.Module, cfg: dict):
        super().__init__()
        self.image_encoder, self.text_encoder = image_encoder, text_encoder
        d_img, d_txt = image_width(image_encoder), text_encoder.config.hidden_size
        align = cfg["alignment"]
        hf = align["init"] == "huggingface"      # the layers the code builds A_I, A_T from (AlignmentBlock)
        self.image_align = AlignmentBlock(d_img, image_heads(image_encoder), align["mlp_ratio"], align["image_dropout"],
                                          norm_first=True, eps=HF_LAYER_NORM_EPS if hf else 1e-6, init=align["init"])
        self.text_align = AlignmentBlock(d_txt, text_encoder.config.num_attention_heads, align["mlp_ratio"],
                                         align["text_dropout"], norm_first=False,
                                         eps=HF_LAYER_NORM_EPS if hf else text_encoder.config.layer_norm_eps,
                                         init=align["init"])
        head = cfg["head"]
        self.image_head = ProjectionHead(d_img, head["hidden"], head["dim"])
        self.text_head = ProjectionHead(d_txt, head["hidden"], head["dim"])
        objective = cfg["objective"]
        if objective in ("gloria", "mgca"):
            self.image_local = nn.Linear(d_img, head["dim"])
            self.text_local = nn.Linear(d_txt, head["dim"])
        if objective == "mgca":
            m = cfg["mgca"]
            if m["attention"] == "multihead":     # MGCA's use_local_atten option (off in its code)
                self.word_to_patch = nn.MultiheadAttention(head["dim"], 1, batch_first=True)
                self.patch_to_word = nn.MultiheadAttention(head["dim"], 1, batch_first=True)
            # MGCA's prototype layer: nn.Linear(dim, K, bias=False), so its weight's initialisation
            self.prototypes = nn.Parameter(torch.empty(m["prototypes"], head["dim"]))
            nn.init.kaiming_uniform_(self.prototypes, a=math.sqrt(5))
            # local training steps this model has taken (averaged like any buffer: every client of a
            # round takes the same number, so it counts one party's steps); prototypes are frozen
            # for the first mgca.freeze_prototypes_steps of them
            self.register_buffer("prototype_steps", torch.zeros((), dtype=torch.float64))

    def encoder_parameters(self):
        """E_I and E_T (trained only in FedDRA's second stage)."""
        for name in self.ENCODERS:
            yield from getattr(self, name).parameters()

    def shallow_parameters(self, blocks: int):
        """Patch/word embeddings and the first ``blocks`` transformer blocks of both encoders (a CNN image
        encoder: its stem and first ``blocks`` stages)."""
        vit, bert = self.image_encoder, self.text_encoder
        modules = [*shallow_image_modules(vit, blocks), bert.embeddings, *bert.encoder.layer[:blocks]]
        for module in modules:
            yield from module.parameters()
        for name in ("cls_token", "pos_embed"):
            if isinstance(getattr(vit, name, None), nn.Parameter):
                yield getattr(vit, name)

    def alignment_parameters(self):
        """Everything but the encoders: alignment modules, heads, local heads, prototypes (stage 1)."""
        encoder_ids = {id(p) for p in self.encoder_parameters()}
        return (p for p in self.parameters() if id(p) not in encoder_ids)


def continuation_ids(tokenizer) -> torch.Tensor:
    """A bool per vocabulary id: whether the word piece continues a word (``##...``)."""
    flags = torch.zeros(len(tokenizer), dtype=torch.bool)
    for piece, index in tokenizer.get_vocab().items():
        flags[index] = piece.startswith("##")
    return flags


def aggregate_words(hidden: torch.Tensor, input_ids: torch.Tensor, continuation: torch.Tensor,
                    sep_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MGCA's ``aggregate_tokens`` (the FedDRA code's BertEncoder): up to and including the first
    [SEP], every word piece that does not start with ``##`` opens a token and ``##`` pieces are
    summed into it ([CLS] and [SEP] are tokens of their own); the rest of the B x T x D output is
    zero vectors. -> (tokens, mask: True for [CLS], the words and [SEP])."""
    b, t, d = hidden.shape
    sep_seen = torch.cumsum((input_ids == sep_id).int(), dim=1)
    text = (sep_seen == 0) | ((sep_seen == 1) & (input_ids == sep_id))     # through the first [SEP]
    opens = text & ~continuation[input_ids]
    group = torch.cumsum(opens.int(), dim=1) - 1
    group = torch.where(text & (group >= 0), group, torch.full_like(group, t))   # everything else: a spare slot
    out = hidden.new_zeros(b, t + 1, d).scatter_add_(1, group[..., None].expand(-1, -1, d), hidden)
    words = opens.sum(dim=1, keepdim=True)
    return out[:, :t], torch.arange(t, device=hidden.device)[None] < words


class PadToSquare:
    """MGCA's ``resize_img`` (HKU-MedAI/MGCA and BioMed-AI-Lab-U-Michgan/TMLR_FedDRA ``mgca/datasets/utils.py``):
    scale the longer side to ``size`` and zero-pad the shorter to a square, the padding split floor / ceil. Under
    the authors' pixels the resize is theirs, ``cv2.resize(..., INTER_AREA)`` at ``int()`` sizes; under the fast ones
    PIL bicubic at rounded sizes (``nearest``: label masks, aligned with their image)."""

    def __init__(self, size: int, nearest: bool = False, pixels: str = "authors"):
        self.size, self.nearest, self.pixels = size, nearest, pixels

    @property
    def decode_spec(self):
        """Its resize, applied once at decode time (fedrepro.data.decode); the padding stays here."""
        from .decoding import pad_resize_spec

        return pad_resize_spec(self.size, self.pixels, self.nearest)

    def __repr__(self) -> str:
        return f"PadToSquare(size={self.size}, nearest={self.nearest}, pixels={self.pixels!r})"

    def __call__(self, image):
        from PIL import Image

        from ..data.decode import INTERPOLATIONS, cv2_resize

        spec = self.decode_spec
        target = spec.target_size(*image.size)
        if spec.library == "cv2":
            resized = cv2_resize(image, target, spec.interpolation)
        else:
            resized = image.resize(target, INTERPOLATIONS[spec.interpolation])
        canvas = Image.new(image.mode, (self.size, self.size))
        canvas.paste(resized, ((self.size - resized.size[0]) // 2, (self.size - resized.size[1]) // 2))
        return canvas


def vlp_weights(cfg: dict) -> list:
    """The pretrained resources of a dual encoder: the timm ViT's hub weights (``image.pretrained:
    true``) and the text tower's and tokenizer's Hugging Face files (:mod:`.text_tower`)."""
    from .weights import timm_spec

    return [*timm_spec(cfg["image"]["backbone"], cfg["image"]["pretrained"], "train.model.image.pretrained"),
            *text_weights(cfg["text"])]


@register_model("vlp", input="image_text", params=VLP_PARAMS, decode=vlp_specs, weights=vlp_weights)
class VisionLanguageFamily(ModelFamily):
    input_kind = "image_text"
    task = "retrieval"          # scored by fedrepro.fl.evaluation.evaluate_retrieval
    extra_columns = ("caption",)

    def __init__(self, cfg, class_names, extras):
        super().__init__(cfg, class_names, extras)
        self.objective = cfg["objective"]
        self.temperature = float(cfg["temperature"])
        # the image-text InfoNCE temperature: GLoRIA's code scales the global cosine by temp3 = 10
        global_t = cfg["gloria"].get("global_temperature") if self.objective == "gloria" else None
        self.ita_temperature = float(global_t) if global_t is not None else self.temperature
        self._tokenizer = None
        self._continuation = None      # which vocabulary ids continue a word (``##...``)

    # ---- construction -----------------------------------------------------------------------
    def build(self) -> DualEncoder:
        image = self.cfg["image"]
        kwargs = {"img_size": image["image_size"]}
        if image.get("patch_size"):
            kwargs["patch_size"] = image["patch_size"]
        if not vit_name(image["backbone"]):
            kwargs.pop("img_size")                   # CNNs take any input size
            if image.get("patch_size"):
                raise ValueError(f"image.patch_size applies to ViTs only, not to {image['backbone']!r}")
        encoder = encoders.create_timm(image["backbone"], num_classes=0, pretrained=image["pretrained"], **kwargs)
        if not is_vit(encoder) and not getattr(encoder, "feature_info", None):
            raise ValueError(f"image backbone {image['backbone']!r} is neither a ViT nor a timm CNN with feature maps")
        if image["cnn_tokens"] == "last_stage":
            without_head_conv(encoder, image["backbone"])
        return DualEncoder(encoder, build_text_encoder(self.cfg["text"]), self.cfg)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = build_tokenizer(self.cfg["text"])
        return self._tokenizer

    def tokenize(self, captions, device) -> dict[str, torch.Tensor]:
        """Word-piece ids and attention mask. The FedDRA code's data pipeline (like MGCA's) pads every
        report to ``max_length``; that padding is seen by MGCA's word-level loss and, without a mask
        (``alignment.text_mask: none``), by A_T. Otherwise reports are padded to the batch's longest
        (same embeddings, less work)."""
        unmasked = self.cfg["alignment"]["text_mask"] == "none"
        padding = "max_length" if self.objective == "mgca" or unmasked else "longest"
        tokens = self.tokenizer(list(captions), padding=padding, truncation=True,
                                max_length=self.cfg["text"]["max_length"], return_tensors="pt")
        return {"input_ids": tokens["input_ids"].to(device), "attention_mask": tokens["attention_mask"].to(device)}

    def _normalise(self):
        from torchvision import transforms as T

        mean, std = NORMALISATION[self.cfg["image"]["normalize"]]
        return T.Normalize(mean, std)

    def eval_geometry(self, nearest: bool = False, crop: bool = True):
        """The PIL-level part of the evaluation transform (pad-resize + centre crop); with
        ``nearest`` for label masks, so a mask stays aligned with its image. ``crop=False``: pad-resized
        to the image size itself (MGCA's segmentation data: the whole image, no crop)."""
        from torchvision import transforms as T

        image, pixels = self.cfg["image"], self.cfg.get("pixels", "authors")
        if not crop:
            return PadToSquare(image["image_size"], nearest, pixels)
        return T.Compose([PadToSquare(image["resize"], nearest, pixels), T.CenterCrop(image["image_size"])])

    def tensor_transform(self):
        """PIL image -> the normalised tensor the encoder reads (the transforms' last steps)."""
        from torchvision import transforms as T

        return T.Compose([T.ToTensor(), self._normalise()])

    def eval_transform(self):
        from torchvision import transforms as T

        return T.Compose([self.eval_geometry(), self.tensor_transform()])

    def train_transform(self):
        from torchvision import transforms as T

        image = self.cfg["image"]
        augment = [T.RandomCrop(image["image_size"])] if image["augment"] == "crop" else [T.CenterCrop(image["image_size"])]
        return T.Compose([PadToSquare(image["resize"], pixels=self.cfg.get("pixels", "authors")), *augment, T.ToTensor(), self._normalise()])

    # ---- the two towers ---------------------------------------------------------------------
    @staticmethod
    def image_tokens(model: DualEncoder, x: torch.Tensor) -> torch.Tensor:
        """E_I: [CLS; patch tokens] (B x (1+N) x D) (:func:`encoder_tokens`)."""
        return encoder_tokens(model.image_encoder, x)

    def text_tokens(self, model: DualEncoder, captions, device) -> tuple[torch.Tensor, torch.Tensor]:
        """E_T's tokens as A_T reads them (B x T x D) and which of them are text (B x T, 1 = [CLS], a word
        or [SEP]): word pieces, or words (``alignment.text_tokens``, :func:`aggregate_words`)."""
        tokens = self.tokenize(captions, device)
        hidden = model.text_encoder(**tokens).last_hidden_state
        if self.cfg["alignment"]["text_tokens"] == "pieces":
            return hidden, tokens["attention_mask"]
        if self._continuation is None:
            self._continuation = continuation_ids(self.tokenizer)
        return aggregate_words(hidden, tokens["input_ids"], self._continuation.to(device), self.tokenizer.sep_token_id)

    @staticmethod
    def embed_image(model: DualEncoder, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        aligned, attention = model.image_align(tokens)
        return {"image_emb": model.image_head(aligned[:, 0]), "image_aligned": aligned, "image_attention": attention}

    def embed_text(self, model: DualEncoder, tokens: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        pad_mask = ~mask.bool() if self.cfg["alignment"]["text_mask"] == "padding" else None
        aligned, attention = model.text_align(tokens, pad_mask=pad_mask)
        return {"text_emb": model.text_head(aligned[:, 0]), "text_aligned": aligned, "text_attention": attention,
                "text_mask": mask.bool()}

    def image_embedding(self, model: DualEncoder, x: torch.Tensor) -> torch.Tensor:
        """u = g_I(A_I(E_I(x))) (not normalised): the image representation SSL baselines work on."""
        return self.embed_image(model, self.image_tokens(model, x))["image_emb"]

    def forward(self, model: DualEncoder, batch: dict, freeze_encoders: bool = False) -> Output:
        """Both towers on a batch of image-caption pairs. ``freeze_encoders``: E_I and E_T run under
        no_grad (FedDRA's first stage trains only what comes after them)."""
        frozen = torch.no_grad() if freeze_encoders else contextlib.nullcontext()
        x = batch["x"]
        with frozen:
            image_tokens = self.image_tokens(model, x)
            text_tokens, mask = self.text_tokens(model, batch["caption"], x.device)
        extra = {**self.embed_image(model, image_tokens), **self.embed_text(model, text_tokens, mask)}
        extra.update(self.local_features(model, extra))
        u, w = extra["image_emb"], extra["text_emb"]
        logits = similarity_logits(u, w, self.ita_temperature)
        targets = torch.arange(len(u), device=u.device)
        return Output(logits=logits, features=torch.cat([F.normalize(u, dim=-1), F.normalize(w, dim=-1)], dim=1),
                      objective=[(logits, targets), (logits.t(), targets)], extra=extra)

    def local_features(self, model: DualEncoder, e: dict) -> dict[str, torch.Tensor]:
        """What GLoRIA/MGCA's local terms need, from the alignment modules' token outputs.

        GLoRIA: region tokens (patches) and word tokens projected by the local heads; the words are
        [CLS] and the report's tokens without [SEP] or padding, as GLoRIA's code counts them.
        MGCA: normalised patch and word embeddings, each token's cross-modal summary (parameter-free
        attention by default), the tokens' importance weights and the prototypes (renormalised in
        place before every training step; detached while frozen).
        """
        if self.objective == "convirt":
            return {}
        if self.objective == "gloria":
            mask = e["text_mask"]
            lengths = mask.sum(dim=1, keepdim=True)
            positions = torch.arange(mask.shape[1], device=mask.device)[None]
            return {"regions": model.image_local(e["image_aligned"][:, 1:]), "words": model.text_local(e["text_aligned"]),
                    "word_mask": positions < lengths - 1}
        m = self.cfg["mgca"]
        t = m["token_temperature"]
        regions = F.normalize(model.image_local(e["image_aligned"][:, 1:]), dim=-1)
        words = F.normalize(model.text_local(e["text_aligned"][:, 1:]), dim=-1)
        word_mask = e["text_mask"][:, 1:]
        if m["attention"] == "multihead":
            word_summary, _ = model.word_to_patch(words, regions, regions)
            patch_summary, _ = model.patch_to_word(regions, words, words, key_padding_mask=~word_mask)
        else:
            word_summary = cross_attention(words, regions, t)
            patch_summary = cross_attention(regions, words, t, key_mask=word_mask)
        out = {"regions": regions, "words": words, "word_mask": word_mask,
               "word_summary": F.normalize(word_summary, dim=-1), "patch_summary": patch_summary,
               "word_weights": token_importance(e["text_attention"][:, :words.shape[1]], word_mask),
               "patch_weights": token_importance(e["image_attention"], torch.ones_like(e["image_attention"], dtype=torch.bool))}
        prototypes = model.prototypes
        if model.training and torch.is_grad_enabled():
            with torch.no_grad():
                prototypes.copy_(F.normalize(prototypes, dim=-1))
            frozen = float(model.prototype_steps) < m["freeze_prototypes_steps"]
            model.prototype_steps += 1
            out["prototypes"] = prototypes.detach() if frozen else prototypes
        else:
            out["prototypes"] = F.normalize(prototypes, dim=-1)
        return out

    # ---- objectives -------------------------------------------------------------------------
    def loss_terms(self, out: Output) -> dict[str, torch.Tensor]:
        """The backbone objective's terms, each already multiplied by its weight: ``ita`` (the
        image-text InfoNCE of every backbone) plus ``local`` (GLoRIA) or ``token`` (L_word + L_patch)
        and ``prototype`` (MGCA)."""
        e = out.extra
        terms = {"ita": info_nce(e["image_emb"], e["text_emb"], self.ita_temperature)}
        if self.objective == "gloria":
            g = self.cfg["gloria"]
            terms["local"] = g["local_weight"] * gloria_local_loss(e["words"], e["word_mask"], e["regions"],
                                                                   g["gamma1"], g["gamma2"], g["gamma3"], g["aggregation"])
        elif self.objective == "mgca":
            m = self.cfg["mgca"]
            patch_mask = torch.ones(e["regions"].shape[:2], dtype=torch.bool, device=e["regions"].device)
            # MGCA's word InfoNCE runs over every position of the padded report ([PAD] words are
            # negatives; their own weight is zero), its patch InfoNCE over every patch
            word_positions = torch.ones_like(e["word_mask"])
            word = token_alignment_loss(e["words"], e["word_summary"], word_positions, e["word_weights"], m["token_temperature"])
            patch = token_alignment_loss(e["regions"], e["patch_summary"], patch_mask, e["patch_weights"], m["token_temperature"])
            terms["token"] = m["token_weight"] * (word + patch)
            terms["prototype"] = m["proto_weight"] * prototype_alignment_loss(
                e["image_emb"], e["text_emb"], e["prototypes"], m["proto_temperature"], m["sinkhorn_eps"],
                m["sinkhorn_iterations"])
        return terms

    def loss(self, out: Output, batch: dict) -> torch.Tensor:
        """The backbone objective (sum of :meth:`loss_terms`)."""
        return sum(self.loss_terms(out).values())

    # ---- downstream access ------------------------------------------------------------------
    def encode_image(self, model: DualEncoder, x: torch.Tensor, features: str = "encoder") -> torch.Tensor:
        """Pooled image features for a linear probe: ``encoder`` = E_I's [CLS] (MGCA's linear
        evaluation), ``aligned`` = A_I's [CLS], ``embedding`` = u."""
        tokens = self.image_tokens(model, x)
        if features == "encoder":
            return tokens[:, 0]
        out = self.embed_image(model, tokens)
        return out["image_aligned"][:, 0] if features == "aligned" else out["image_emb"]

    @staticmethod
    def image_token_map(model: DualEncoder, x: torch.Tensor) -> torch.Tensor:
        """E_I's last-layer tokens as a map (B x D x h x w): a ViT's patch tokens after its final norm
        (what MGCA's SETR decoder reads), a CNN's last feature map."""
        encoder = model.image_encoder
        out = encoder.forward_features(x)
        if not is_vit(encoder):
            return out
        h, w = x.shape[-2] // encoder.patch_embed.patch_size[0], x.shape[-1] // encoder.patch_embed.patch_size[1]
        patches = out[:, encoder.num_prefix_tokens:]
        return patches.transpose(1, 2).reshape(len(x), -1, h, w)

    @staticmethod
    def image_feature_maps(model: DualEncoder, x: torch.Tensor, levels: int) -> list[torch.Tensor]:
        """Token maps (B x D x h x w) of ``levels`` evenly spaced encoder blocks (CNN: stages), shallow to deep."""
        encoder = model.image_encoder
        depth = len(encoder.blocks) if is_vit(encoder) else len(encoder.feature_info)
        indices = sorted({int(round(i)) for i in np.linspace(depth / levels - 1, depth - 1, levels)})
        return encoder.forward_intermediates(x, indices=indices, output_fmt="NCHW", intermediates_only=True)

    # ---- evaluation: in-domain image-text retrieval -------------------------------------------
    @torch.no_grad()
    def embed_dataset(self, model: DualEncoder, dataset, batch_size: int, device, num_workers: int = 0):
        """Normalised (U, W) of every image-caption pair of ``dataset``, in dataset order."""
        from ..data.loader import batches, to_device

        was_training = model.training
        model.eval()
        us, ws = [], []
        for batch in batches(dataset, batch_size, shuffle=False, num_workers=num_workers):
            out = self.forward(model, to_device(batch, device))
            us.append(F.normalize(out.extra["image_emb"].float(), dim=-1).cpu())
            ws.append(F.normalize(out.extra["text_emb"].float(), dim=-1).cpu())
        model.train(was_training)
        return torch.cat(us).numpy(), torch.cat(ws).numpy()

    @property
    def eval_splits(self) -> tuple[tuple[str, str], ...]:
        """(eval-key suffix, client split) pairs that retrieval scores: the reported split first."""
        if self.cfg["retrieval"]["split"] == "val":
            return (("", "val"), (".test", "test"))
        return (("", "test"), (".val", "val"))

    def retrieval_scores(self, u: np.ndarray, w: np.ndarray) -> dict[str, float]:
        """Recall@k over pools of ``retrieval.pool`` pairs (consecutive pairs of a fixed shuffle of the
        split, the same for every method, or of the split's own order) and the mean cosine similarity of
        the pairs."""
        r = self.cfg["retrieval"]
        order = numpy_rng(0, "retrieval", len(u)).permutation(len(u)) if r["pools"] == "shuffled" else np.arange(len(u))
        pools = [order[i:i + r["pool"]] for i in range(0, len(order), r["pool"])]
        if r["drop_last"]:
            pools = [pool for pool in pools if len(pool) == r["pool"]]
        out = {}
        for k in (1, 5):
            hits, total = 0.0, 0
            for pool in pools:
                sim = w[pool] @ u[pool].T                       # rows: text queries, columns: images
                score = recall_at_k(sim, k, r["ties"])
                if r["direction"] == "both":
                    score = 0.5 * (score + recall_at_k(sim.T, k, r["ties"]))
                hits += score * len(pool)
                total += len(pool)
            out[f"recall@{k}"] = hits / total if total else float("nan")
        out["cos_sim"] = float(np.mean(np.sum(u * w, axis=1))) if len(u) else float("nan")
        out["n"] = int(len(u))
        return out

def require_vlp(method) -> None:
    """Methods adapted to image-text pre-training refuse other model families with a clear error."""
    family = method.ctx.train["model"]["family"]
    if family != "vlp":
        raise ValueError(f"{type(method).__name__} is an image-text pre-training method: it needs the vlp model family "
                         f"(train.model.family), not {family!r}")
