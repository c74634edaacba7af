"""CLIP tuned on images: full fine-tuning, LoRA, and learnable prompt context (PromptFL / CoOp).

These are the model families of the CLIP baselines of FACMIC (Table 2) and FAA-CLIP (Tables II-IX).
All three predict like CLIP, by ``scale * cos(e_I(x), e_T(prompt_c))`` over the class prompts, and
train with the B x B image-text contrastive loss of the authors' code: for a batch of B images,
column j holds the prompt of sample j's class, the target of row j is column j (same-class duplicates
count as negatives), and the loss averages both directions (FACMIC eq. 4; docs/papers/facmic.md). The class prompts
are encoded once per batch and indexed by label, which is the same computation (and the same gradients)
as encoding one prompt per sample.

- ``clip_full``: every weight of both encoders is trained and communicated (FedAvg, FedProx, MOON,
  FedFocal and Centralized of both papers). ``logit_scale: model`` uses CLIP's own learnable temperature
  exp(t), trained with the rest, as the authors' code does; their test code predicts with a fixed
  100 x cosine instead (``eval_logit_scale: 100`` in the paper configs).
- ``clip_lora``: LoRA (Hu et al., ICLR 2022) of rank r on chosen projections of chosen encoders; the
  base weights are frozen, only the low-rank factors are trained and communicated. FAA-CLIP does not say
  which layers carry LoRA ([GAP], docs/papers/faa_clip.md); the default follows CLIP-LoRA (Zanella & Ben Ayed,
  CVPR-W 2024): the q, k and v projections of every attention block of both encoders. With r = 3 on
  CLIP ViT-B/32 that is 12 x 3 x 3 x (768 + 768) + 12 x 3 x 3 x (512 + 512) = 165,888 + 110,592
  = 276,480 parameters (0.18 % of 151.3 M). Adding ``o`` gives 368,640; every linear layer
  (q, k, v, o, fc, proj) gives 829,440. None matches the paper's "0.98 % x Sigma" (~1.48 M).
- ``clip_prompt``: CoOp-style prompt learning (Zhou et al., IJCV 2022) as federated by PromptFL
  (Guo et al., IEEE TMC 2023): the prompt of class c is [SOS] v_1 ... v_M [name_c] [EOS] with M shared
  context vectors v_m in R^{d_text}; both encoders are frozen, only the context is trained and
  communicated (Sigma_prompt = M x d_text = 8,192 for M = 16 on ViT-B/32). Context length and
  initialisation are not given by FAA-CLIP [GAP]: the defaults are CoOp's (M = 16, v ~ N(0, 0.02^2));
  ``init: template`` starts from the words of the fixed prompt instead ("a picture of a"), which
  reproduces the zero-shot prompt exactly at round 0.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from ..device import full_precision
from ..registry import register_model
from .decoding import clip_specs
from .encoders import ENCODER_SCHEMA, frozen_clip, image_input, tokenize
from .families import ModelFamily, Output, clip_batch_objective, clip_scores
from .weights import clip_weights

# --------------------------------------------------------------------------------------------
# LoRA as a weight parametrization: W -> W + (alpha / r) * B A on chosen row blocks of W

class LoRADelta(nn.Module):
    """Low-rank update of the row blocks ``blocks`` of a weight split into ``n_blocks`` equal blocks
    (q, k, v are blocks 0, 1, 2 of an attention's stacked ``in_proj_weight``). B starts at zero, so the
    parametrized model starts exactly at the pretrained one."""

    def __init__(self, weight: torch.Tensor, blocks: list[int], n_blocks: int, rank: int, alpha: float):
        super().__init__()
        out_features, in_features = weight.shape
        if out_features % n_blocks:
            raise ValueError(f"a weight with {out_features} rows cannot be split into {n_blocks} blocks")
        self.blocks, self.n_blocks, self.block = list(blocks), n_blocks, out_features // n_blocks
        self.scale = alpha / rank
        like = {"device": weight.device, "dtype": weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(len(blocks), rank, in_features, **like))
        self.lora_B = nn.Parameter(torch.zeros(len(blocks), self.block, rank, **like))
        for a in self.lora_A:
            nn.init.kaiming_uniform_(a, a=5 ** 0.5)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        updates = dict(zip(self.blocks, torch.bmm(self.lora_B, self.lora_A) * self.scale))
        chunks = weight.split(self.block, dim=0)
        return torch.cat([chunk + updates[i] if i in updates else chunk for i, chunk in enumerate(chunks)], dim=0)


LORA_TARGETS = ("q", "k", "v", "o", "fc", "proj")


def lora_blocks(clip: nn.Module, encoder: str) -> list:
    """The transformer blocks of one encoder (``image`` or ``text``) as (module, attr, blocks, n_blocks)
    getters: open_clip's own towers keep q, k, v stacked in one ``in_proj_weight``; a Hugging Face (BERT)
    text tower keeps them as separate linear layers. A CNN image tower has no attention to adapt."""
    from open_clip.hf_model import HFTextEncoder

    def open_clip_sites(block, targets):
        qkv = [i for i, t in enumerate(("q", "k", "v")) if t in targets]
        places = [(block.attn, "in_proj_weight", qkv, 3)] if qkv else []
        return places + [(module, "weight", [0], 1) for t, module in
                         (("o", block.attn.out_proj), ("fc", block.mlp.c_fc), ("proj", block.mlp.c_proj)) if t in targets]

    def bert_sites(layer, targets):
        named = {"q": layer.attention.self.query, "k": layer.attention.self.key, "v": layer.attention.self.value,
                 "o": layer.attention.output.dense, "fc": layer.intermediate.dense, "proj": layer.output.dense}
        return [(named[t], "weight", [0], 1) for t in LORA_TARGETS if t in targets]

    if encoder == "image":
        tower = getattr(clip.visual, "transformer", None)
        if tower is None:
            raise ValueError(f"LoRA on the image encoder needs transformer blocks, but this CLIP's image tower is "
                             f"{type(clip.visual).__name__} (a CNN): set train.model.encoders: [text]")
        return [(block, open_clip_sites) for block in tower.resblocks]
    text = getattr(clip, "text", None)
    if isinstance(text, HFTextEncoder):
        return [(layer, bert_sites) for layer in text.transformer.encoder.layer]
    tower = clip.transformer if hasattr(clip, "transformer") else text.transformer
    return [(block, open_clip_sites) for block in tower.resblocks]


def add_lora(clip: nn.Module, encoders: list[str], targets: list[str], rank: int, alpha: float) -> int:
    """Freeze ``clip`` and parametrize the chosen projections of every transformer block of the chosen
    encoders. -> trainable parameter count."""
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if unknown:
        raise ValueError(f"unknown LoRA targets {unknown}; allowed: {list(LORA_TARGETS)}")
    clip.requires_grad_(False)
    for name in encoders:
        for block, sites in lora_blocks(clip, name):
            for module, attr, blocks, n_blocks in sites(block, targets):
                parametrize.register_parametrization(
                    module, attr, LoRADelta(getattr(module, attr), blocks, n_blocks, rank, alpha))
    return sum(p.numel() for p in clip.parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------------
# learnable prompt context

class TextTower:
    """What prompt learning needs from a CLIP's text encoder: its token embedding table, and the pass
    from (already embedded) tokens to the text feature. Two implementations: open_clip's own text
    transformer and a Hugging Face text model (a composite CLIP's ``clip.text``)."""

    @staticmethod
    def of(clip: nn.Module) -> "TextTower":
        from open_clip.hf_model import HFTextEncoder

        return HuggingFaceText(clip.text) if isinstance(getattr(clip, "text", None), HFTextEncoder) else OpenClipText(clip)


class OpenClipText(TextTower):
    def __init__(self, clip: nn.Module):
        self.clip = clip

    @property
    def embedding(self) -> nn.Embedding:
        return self.clip.token_embedding

    def encode(self, embedded: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        from open_clip.transformer import text_global_pool

        clip = self.clip
        x = embedded + clip.positional_embedding
        x = clip.ln_final(clip.transformer(x, attn_mask=clip.attn_mask))
        x = text_global_pool(x, tokens, clip.text_pool_type, eos_token_id=getattr(clip, "text_eos_id", None))
        return x @ clip.text_projection if not isinstance(clip.text_projection, nn.Linear) else clip.text_projection(x)


class HuggingFaceText(TextTower):
    def __init__(self, text: nn.Module):
        self.text = text

    @property
    def embedding(self) -> nn.Embedding:
        return self.text.transformer.get_input_embeddings()

    def encode(self, embedded: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """BERT adds its own position and segment embeddings to ``inputs_embeds``; pooled and projected
        as open_clip's HFTextEncoder does for token ids."""
        mask = (tokens != self.text.config.pad_token_id).long()
        out = self.text.transformer(inputs_embeds=embedded, attention_mask=mask)
        return self.text.proj(self.text.pooler(out, mask))


class PromptedClip(nn.Module):
    """A frozen CLIP whose class prompts are [SOS] ctx_1..ctx_M name_c [EOS] with a learnable context."""

    def __init__(self, clip: nn.Module, tokenizer, class_names: list[str], n_ctx: int, init: str, template: str):
        super().__init__()
        self.clip = clip.requires_grad_(False)
        embed = TextTower.of(clip).embedding
        end = int(tokenize(tokenizer, [""])[0][1])          # the end-of-text token ([EOS] / [SEP]) follows the start token
        if init == "template":
            words = template.replace("{}", "").strip()
            ids = tokenize(tokenizer, [words])[0]
            length = int((ids == end).nonzero()[0])     # [1, length) are the words
            ctx = embed.weight[ids[1:length]].detach().clone()
        else:
            ctx = torch.randn(n_ctx, embed.weight.shape[1]) * 0.02
        self.n_ctx = ctx.shape[0]
        self.ctx = nn.Parameter(ctx)
        tokens = tokenize(tokenizer, [" ".join(["X"] * self.n_ctx + [name]) for name in class_names])
        placeholder = tokenize(tokenizer, ["X"])[0][1]
        if (tokens[:, 1:1 + self.n_ctx] != placeholder).any() or not (tokens[:, 2 + self.n_ctx:] == end).any(dim=1).all() \
                or (tokens[:, -1] != 0).any():
            raise ValueError(f"prompts of {self.n_ctx} context tokens + a class name do not fit CLIP's context "
                             f"length {tokens.shape[1]}; use fewer context tokens (n_ctx)")
        self.register_buffer("tokens", tokens, persistent=False)

    @property
    def logit_scale(self) -> torch.Tensor:
        return self.clip.logit_scale

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return self.clip.encode_image(images)

    def encode_text(self, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Text features of every class prompt with the current context (the argument is ignored)."""
        tower = TextTower.of(self.clip)
        embedded = tower.embedding(self.tokens)
        ctx = self.ctx.to(embedded.dtype).unsqueeze(0).expand(len(self.tokens), -1, -1)
        x = torch.cat([embedded[:, :1], ctx, embedded[:, 1 + self.n_ctx:]], dim=1)
        return tower.encode(x, self.tokens)


# --------------------------------------------------------------------------------------------
# the families

class OpenClipFamily(ModelFamily):
    """CLIP on images; prediction = scale * cos(image features, class-prompt features)."""

    input_kind = "images"

    def __init__(self, cfg, class_names, extras):
        super().__init__(cfg, class_names, extras)
        self.pristine, self.preprocess, self.tokenizer = frozen_clip(cfg["encoder"])
        from .encoders import prompt_texts

        self.tokens = tokenize(self.tokenizer, prompt_texts(cfg["encoder"]["prompt"], self.class_names))

    def to(self, device):
        self.tokens = self.tokens.to(device)
        return self

    def frozen_modules(self):
        return {"pretrained CLIP (kept on the host, copied for every build)": (self.pristine, "host")}

    def fresh_clip(self) -> nn.Module:
        """A trainable copy of the pretrained CLIP (the cached one stays frozen and untouched)."""
        return copy.deepcopy(self.pristine).requires_grad_(True).train()

    def scale(self, model: nn.Module, value: str | float | None = None) -> torch.Tensor | float:
        """The logit scale ``value`` names (default: the training one, ``logit_scale``): ``model`` =
        CLIP's own exp(t), a number = that number."""
        value = self.cfg["logit_scale"] if value is None else value
        return model.logit_scale.exp() if value == "model" else float(value)

    def class_text(self, model: nn.Module) -> torch.Tensor:
        return model.encode_text(self.tokens).float()

    def embed(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(image features B x D, class-prompt text features C x D) of the current model, not normalised (an fp16
        model, precision fp16_weights, takes fp16 images and returns fp16 features, cast up here as the authors'
        ``encode_image(image).float()``)."""
        return model.encode_image(image_input(model, batch["x"])).float(), self.class_text(model)

    def forward(self, model: nn.Module, batch: dict) -> Output:
        image, text = self.embed(model, batch)
        return clip_output(image, text, self.scale(model), batch["y"])

    def class_scores(self, model: nn.Module, batch: dict) -> torch.Tensor:
        """``eval_logit_scale`` x cos(image, class prompt) (default: the training scale). The authors' test
        code scores every CLIP baseline with a fixed 100 (``get_similarity``), whatever temperature
        training learned: the paper configs set ``eval_logit_scale: 100``. Accuracy does not depend on
        it; the probabilities (ROC, decision curves, calibration) do."""
        image, text = self.embed(model, batch)
        return clip_scores(image, text, self.scale(model, self.cfg.get("eval_logit_scale")))

    def eval_transform(self):
        from .encoders import encoder_transform

        return encoder_transform(self.cfg["encoder"], self.pristine, self.preprocess)

    def train_transform(self):
        return self.eval_transform()   # both papers' code applies no augmentation


SCALE = {"oneOf": [{"const": "model"}, {"type": "number", "exclusiveMinimum": 0}]}
LOGIT_SCALE = {
    **SCALE,
    "description": "the scale of the cosine scores in the training loss: model = CLIP's own temperature exp(t) "
                   "(trained with the encoders under clip_full, as in the authors' code; frozen otherwise), or a "
                   "fixed number",
    "default": "model",
}
EVAL_LOGIT_SCALE = {
    **SCALE,
    "description": "the scale of the cosine scores whose softmax is the prediction at evaluation: model = CLIP's "
                   "exp(t), or a fixed number; absent = logit_scale. The authors' test code uses a fixed 100 for "
                   "every CLIP baseline (paper configs: 100); accuracy does not depend on it, probabilities "
                   "(ROC, DCA, ECE) do.",
}


CLIP_FULL_PARAMS = {
    "encoder": ENCODER_SCHEMA,
    "logit_scale": LOGIT_SCALE,
    "eval_logit_scale": EVAL_LOGIT_SCALE,
}


@register_model("clip_full", input="images", params=CLIP_FULL_PARAMS, decode=clip_specs, weights=clip_weights)
class ClipFullFamily(OpenClipFamily):
    def build(self) -> nn.Module:
        return self.fresh_clip()


CLIP_LORA_PARAMS = {
    "encoder": ENCODER_SCHEMA,
    "rank": {"type": "integer", "minimum": 1, "default": 3},
    "alpha": {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "LoRA scaling alpha (update = alpha/r * B A); default: alpha = r",
    },
    "encoders": {
        "type": "array",
        "items": {"enum": ["image", "text"]},
        "minItems": 1,
        "uniqueItems": True,
        "default": ["image", "text"],
    },
    "targets": {
        "description": "q, k, v (attention input projections), o (attention output), fc / proj (MLP)",
        "type": "array",
        "items": {"enum": ["q", "k", "v", "o", "fc", "proj"]},
        "minItems": 1,
        "uniqueItems": True,
        "default": ["q", "k", "v"],
    },
    "logit_scale": LOGIT_SCALE,
    "eval_logit_scale": EVAL_LOGIT_SCALE,
}


@register_model("clip_lora", input="images", params=CLIP_LORA_PARAMS, decode=clip_specs, weights=clip_weights)
class ClipLoRAFamily(OpenClipFamily):
    def build(self) -> nn.Module:
        clip = self.fresh_clip()
        add_lora(clip, self.cfg["encoders"], self.cfg["targets"], self.cfg["rank"], self.cfg.get("alpha") or self.cfg["rank"])
        return clip


CLIP_PROMPT_PARAMS = {
    "encoder": ENCODER_SCHEMA,
    "n_ctx": {
        "type": "integer",
        "minimum": 1,
        "default": 16,
        "description": "number of context vectors M (ignored with init: template)",
    },
    "init": {
        "description": "random = N(0, 0.02^2) (CoOp); template = the token embeddings of the encoder's prompt "
                       "words ('a picture of a'), i.e. the zero-shot prompt",
        "enum": ["random", "template"],
        "default": "random",
    },
    "logit_scale": LOGIT_SCALE,
    "eval_logit_scale": EVAL_LOGIT_SCALE,
}


@register_model("clip_prompt", input="images", params=CLIP_PROMPT_PARAMS, decode=clip_specs, weights=clip_weights)
class ClipPromptFamily(OpenClipFamily):
    def build(self) -> nn.Module:
        template = self.cfg["encoder"]["prompt"]
        return PromptedClip(self.fresh_clip(), self.tokenizer, self.class_names, self.cfg["n_ctx"], self.cfg["init"], template)


@full_precision
def clip_output(image: torch.Tensor, text: torch.Tensor, scale, labels: torch.Tensor) -> Output:
    """The scaled cosine logits and the B x B contrastive objective of image and class-prompt features,
    in fp32 (under mixed precision the towers run in 16 bits, the scores and the loss do not)."""
    image_n, text_n = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
    objective = clip_batch_objective(image_n, labels, text_n, scale) if labels.min() >= 0 else []
    return Output(logits=scale * image_n @ text_n.t(), features=image, objective=objective)


def trainable_keys(model: nn.Module) -> list[str]:
    """State-dict names of the parameters that require gradients (what LoRA / PromptFL communicate)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]
