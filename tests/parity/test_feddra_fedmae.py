"""FedMAE on FedDRA's image-text model (Table 4; here under each backbone objective), one round.

Specification (FedMAE, Yan et al., IEEE TMI 2023; code rui-yan/SSL-FL ``fed_mae``, run with
``--model mae_vit_base_patch16 --mask_ratio 0.6 --norm_pix_loss``; MAE, He et al. 2022): each
client adds to the backbone objective the MAE loss of its images: patch embeddings plus position
embeddings; per image a random permutation (argsort of uniform noise) keeps the first
int(N (1 - 0.6)) patches; the ViT encodes [CLS + its position; kept patches]; MAE-base's decoder
(linear to 512, mask tokens appended and un-shuffled, fixed 2-D sine-cosine position embeddings with
a zero [CLS] row, 8 blocks with 16 heads, LayerNorm, linear to p·p·3 pixels) predicts every patch;
targets are the patches normalised per patch (mean, unbiased variance + 1e-6); the loss is the
squared error averaged over pixels and over the removed patches only. Encoder and decoder are
averaged uniformly like everything else (FedAvg).
"""

import copy
import math

import pytest
import torch
from torch import nn

from fedrepro.methods.fedmae import MAEDecoder

from .harness import assert_close
from .vlp_harness import drive_tiny, float64, float_state, mean_states, vlp_run  # noqa: F401
from .vlp_spec import Objective, check_retrieval, loaded, train_client

pytestmark = pytest.mark.usefixtures("one_thread", "float64")


def sincos(dim, grid):
    """MAE's get_2d_sincos_pos_embed(dim, grid, cls_token=True)."""
    rows = []
    for i in range(grid):
        for j in range(grid):
            row = []
            for pos in (j, i):            # the first half encodes the column, the second the row
                freqs = [1.0 / 10000 ** (k / (dim / 4)) for k in range(dim // 4)]
                row += [math.sin(pos * f) for f in freqs] + [math.cos(pos * f) for f in freqs]
            rows.append(row)
    return torch.tensor([[0.0] * dim] + rows)


def mae_loss(model, x, ratio):
    vit, dec = model.image_encoder, model.mae_decoder
    assert isinstance(vit.norm_pre, nn.Identity)
    b = len(x)
    tokens = vit.patch_embed(x).flatten(1, -2) + vit.pos_embed[:, 1:]      # B x N x D, row-major patches
    n = tokens.shape[1]
    keep = int(n * (1 - ratio))
    shuffle = torch.argsort(torch.rand(b, n), dim=1)
    restore = torch.argsort(shuffle, dim=1)
    kept = torch.gather(tokens, 1, shuffle[:, :keep, None].expand(-1, -1, tokens.shape[-1]))
    mask = torch.ones(b, n)
    mask[:, :keep] = 0
    mask = torch.gather(mask, 1, restore)
    h = torch.cat([(vit.cls_token + vit.pos_embed[:, :1]).expand(b, -1, -1), kept], dim=1)
    for block in vit.blocks:
        h = block(h)
    y = dec.embed(vit.norm(h))
    filled = torch.cat([y[:, 1:], dec.mask_token.repeat(b, n - keep, 1)], dim=1)
    filled = torch.gather(filled, 1, restore[..., None].expand(-1, -1, y.shape[-1]))
    y = torch.cat([y[:, :1], filled], dim=1) + dec.pos
    for block in dec.blocks:
        y = block(y)
    pred = dec.predict(dec.norm(y))[:, 1:]
    p = vit.patch_embed.patch_size[0]
    c, hh, ww = x.shape[1], x.shape[2] // p, x.shape[3] // p
    target = x.reshape(b, c, hh, p, ww, p).permute(0, 2, 4, 3, 5, 1).reshape(b, hh * ww, p * p * c)
    target = (target - target.mean(dim=-1, keepdim=True)) / (target.var(dim=-1, keepdim=True) + 1e-6) ** 0.5
    per_patch = ((pred - target) ** 2).mean(dim=-1)
    return (per_patch * mask).sum() / mask.sum()


def test_fedmae_runs_mae_base_with_fedmaes_mask_ratio():
    run = vlp_run("feddra", "fedmae_convirt")
    params = run["algorithm"]["params"]
    assert params["mask_ratio"] == 0.6 and params["norm_pix_loss"]
    assert (params["decoder_dim"], params["decoder_depth"], params["decoder_heads"]) == (512, 8, 16)
    dec = MAEDecoder(32, 4, 8 * 8 * 3, params["decoder_dim"], params["decoder_depth"], params["decoder_heads"])
    assert (dec.embed.out_features, len(dec.blocks), dec.blocks[0].attn.num_heads) == (512, 8, 16)
    assert_close(dec.pos[0], sincos(512, 2), "fixed decoder position embeddings")
    assert not dec.pos.requires_grad


@pytest.mark.parametrize("objective", ["convirt", "gloria", "mgca"])
def test_fedmae_round_matches_the_specification(objective, tmp_path):
    run = vlp_run("feddra", "fedmae_convirt", objective, train={"rounds": 1, "local": {"steps": 2}, "batch_size": 4})
    params = run["algorithm"]["params"]
    params.update(decoder_dim=32, decoder_depth=2, decoder_heads=4)      # model size only: a small decoder
    fed, start, driven = drive_tiny(run, tmp_path)
    assert_close(start.mae_decoder.pos[0], sincos(32, 2), "fixed decoder position embeddings")
    spec = Objective(driven.method.family)
    states = []
    for client in fed.clients:
        model = copy.deepcopy(start)
        train_client(run, client, 0, model,
                     lambda m, b: spec.loss(m, b)[0] + params["weight"] * mae_loss(m, b["x"], params["mask_ratio"]))
        states.append(float_state(model))
    expected = mean_states(states)
    assert_close(driven.method.server.state_dict(), expected, "server after one round")
    check_retrieval(driven, loaded(start, expected), fed, run)
