"""FedMAE (Yan et al., "Label-efficient self-supervised federated learning for tackling data
heterogeneity in medical imaging", IEEE TMI 2023; code rui-yan/SSL-FL), adapted to image-text
pre-training as FedDRA does (docs/papers/feddra.md): the image encoder also learns masked-autoencoder
reconstruction (He et al., CVPR 2022), added to the backbone's image-text objective; encoder and MAE
decoder are averaged like FedAvg.

MAE as FedMAE runs it (``mae_vit_base_patch16``, ``--mask_ratio 0.6 --norm_pix_loss``): of the N patch
tokens (with position embeddings) a random subset of int((1 − r)·N) is kept, the ViT encodes
[CLS; kept], the MAE-base decoder (linear to 512-d, mask tokens at the removed positions, fixed 2-D
sine-cosine position embeddings, 8 pre-norm transformer blocks with 16 heads, LayerNorm, linear to
pixels) predicts every patch. The loss is the mean squared error on the *removed* patches only,
with per-patch normalised pixel targets (``norm_pix_loss``):

    L_MAE = Σ_i m_i · mean_j (ŷ_ij − y_ij)² / Σ_i m_i,   m_i = 1 for removed patches.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from ..device import full_precision
from ..fl.method import ModelAveraging
from ..models.vlp import require_vlp
from ..registry import register_method


def random_masking(batch: int, n: int, keep: int, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (kept patch indices B x keep, restore order B x N, mask B x N with 1 = removed)."""
    noise = torch.rand(batch, n, device=device)
    shuffle = torch.argsort(noise, dim=1)
    restore = torch.argsort(shuffle, dim=1)
    mask = torch.ones(batch, n, device=device)
    mask[:, :keep] = 0
    return shuffle[:, :keep], restore, torch.gather(mask, 1, restore)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """B x C x H x W -> B x N x (p·p·C), patches in row-major order (the ViT's token order)."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // p, p, w // p, p)
    return torch.einsum("bchpwq->bhwpqc", x).reshape(b, (h // p) * (w // p), p * p * c)


@full_precision
def reconstruction_loss(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                        norm_pix: bool = True) -> torch.Tensor:
    """MSE on the removed patches (``mask`` 1), per-patch-normalised targets if ``norm_pix``."""
    if norm_pix:
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1e-6).sqrt()
    per_patch = ((prediction - target) ** 2).mean(dim=-1)
    return (per_patch * mask).sum() / mask.sum().clamp_min(1.0)


def sincos_position_embedding(dim: int, grid: int, cls_token: bool = True) -> torch.Tensor:
    """MAE's fixed 2-D sine-cosine position embeddings of a grid x grid patch layout (a zero row
    first for [CLS]): half of the channels encode one grid axis, half the other; each half is
    [sin(p·ω_k), cos(p·ω_k)] with ω_k = 10000^(−k / (dim/4))."""
    if dim % 4:
        raise ValueError(f"the decoder width ({dim}) must be a multiple of 4 for 2-D sine-cosine position embeddings")
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    coords = torch.arange(grid, dtype=torch.float64)
    first, second = torch.meshgrid(coords, coords, indexing="xy")   # first varies along a row, second down the rows

    def axis(positions: torch.Tensor) -> torch.Tensor:
        angles = positions.reshape(-1, 1) * omega[None]
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)

    table = torch.cat([axis(first), axis(second)], dim=1)
    if cls_token:
        table = torch.cat([torch.zeros(1, dim, dtype=torch.float64), table])
    return table.float()


class MAEDecoder(nn.Module):
    """MAE's decoder: embed, mask tokens, fixed sine-cosine positions, pre-norm blocks, predict pixels."""

    def __init__(self, encoder_dim: int, num_patches: int, patch_dim: int, dim: int, depth: int, heads: int):
        super().__init__()
        from timm.models.vision_transformer import Block

        grid = int(round(math.sqrt(num_patches)))
        if grid * grid != num_patches:
            raise ValueError(f"FedMAE's decoder expects a square patch grid, got {num_patches} patches")
        self.embed = nn.Linear(encoder_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(sincos_position_embedding(dim, grid)[None], requires_grad=False)
        norm = partial(nn.LayerNorm, eps=1e-6)
        self.blocks = nn.Sequential(*[Block(dim, heads, 4.0, qkv_bias=True, norm_layer=norm) for _ in range(depth)])
        self.norm = norm(dim)
        self.predict = nn.Linear(dim, patch_dim)
        nn.init.normal_(self.mask_token, std=0.02)
        self.apply(_mae_init)

    def forward(self, encoded: torch.Tensor, restore: torch.Tensor) -> torch.Tensor:
        """``encoded``: B x (1 + kept) x D ([CLS] first) -> pixel predictions B x N x patch_dim."""
        x = self.embed(encoded)
        b, n = restore.shape
        mask_tokens = self.mask_token.expand(b, n - (x.shape[1] - 1), -1)
        patches = torch.cat([x[:, 1:], mask_tokens], dim=1)
        patches = torch.gather(patches, 1, restore[..., None].expand(-1, -1, x.shape[-1]))
        x = torch.cat([x[:, :1], patches], dim=1) + self.pos
        return self.predict(self.norm(self.blocks(x)))[:, 1:]


def _mae_init(module: nn.Module) -> None:
    """MAE's initialisation: Xavier-uniform linear layers with zero bias, LayerNorm (1, 0)."""
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def encode_visible(vit: nn.Module, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The timm ViT on [CLS; kept patch tokens]: position embeddings are added (timm's own
    ``_pos_embed``, which also handles dynamic image sizes) before the masked tokens are dropped."""
    h = vit._pos_embed(vit.patch_embed(x))
    prefix = getattr(vit, "num_prefix_tokens", 1)
    kept = torch.gather(h[:, prefix:], 1, keep[..., None].expand(-1, -1, h.shape[-1]))
    h = vit.norm_pre(torch.cat([h[:, :prefix], kept], dim=1))
    for block in vit.blocks:
        h = block(h)
    return vit.norm(h)


FEDMAE_PARAMS = {
    "mask_ratio": {
        "type": "number",
        "exclusiveMinimum": 0,
        "exclusiveMaximum": 1,
        "default": 0.6,
        "description": "FedMAE's --mask_ratio 0.6 (MAE's own default is 0.75)",
    },
    "weight": {
        "type": "number",
        "minimum": 0,
        "default": 1.0,
        "description": "weight of the reconstruction loss",
    },
    "decoder_dim": {
        "type": "integer",
        "minimum": 8,
        "multipleOf": 4,
        "default": 512,
        "description": "MAE-base decoder (mae_vit_base_patch16): 512-d",
    },
    "decoder_depth": {
        "type": "integer",
        "minimum": 1,
        "default": 8,
        "description": "MAE-base decoder: 8 blocks",
    },
    "decoder_heads": {
        "type": "integer",
        "minimum": 1,
        "default": 16,
        "description": "MAE-base decoder: 16 heads",
    },
    "norm_pix_loss": {
        "type": "boolean",
        "default": True,
        "description": "MAE's per-patch normalised pixel targets",
    },
}


@register_method("fedmae", params=FEDMAE_PARAMS)
class FedMAE(ModelAveraging):
    def setup(self) -> None:
        require_vlp(self)
        super().setup()

    def build_model(self) -> nn.Module:
        model = super().build_model()
        vit = model.image_encoder
        if getattr(vit, "num_prefix_tokens", 1) != 1:
            raise ValueError("FedMAE's masking expects a ViT with exactly one prefix ([CLS]) token")
        p = vit.patch_embed.patch_size[0]
        model.mae_decoder = MAEDecoder(vit.embed_dim, vit.patch_embed.num_patches, p * p * 3, self.params["decoder_dim"],
                                       self.params["decoder_depth"], self.params["decoder_heads"])
        return model

    def mae_loss(self, model, x: torch.Tensor) -> torch.Tensor:
        vit = model.image_encoder
        n = vit.patch_embed.num_patches
        keep_count = max(1, int(n * (1 - self.params["mask_ratio"])))     # MAE: len_keep = int(L * (1 - r))
        keep, restore, mask = random_masking(len(x), n, keep_count, x.device)
        prediction = model.mae_decoder(encode_visible(vit, x, keep), restore)
        return reconstruction_loss(prediction, patchify(x, vit.patch_embed.patch_size[0]), mask, self.params["norm_pix_loss"])

    def local_loss(self, model, batch, client, rnd):
        out = self.family.forward(model, batch)
        return self.family.loss(out, batch) + self.params["weight"] * self.mae_loss(model, batch["x"]), out
