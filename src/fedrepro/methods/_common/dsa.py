"""Differentiable Siamese Augmentation (Zhao and Bilen, "Dataset Condensation with Differentiable
Siamese Augmentation", ICML 2021), as CReFF's code applies it to the real images whose classifier
gradients a client uploads (shangxinyi/CReFF-FL, ``Dataset/param_aug.py``; ``--method DSA``,
``--dsa_strategy color_crop_cutout_flip_scale_rotate``).

Single mode (the code's ``aug_mode = 'S'``): from a seed s, one of the strategy's groups is drawn
(``torch.randint`` after seeding with s); each function of that group then draws its parameters
after seeding with s + 1, s + 2, ... in turn. Siamese: every image of the batch gets the parameters
drawn for the first one. Groups and parameters (``ParamDiffAug``):

- color = brightness x + (b - 0.5) * 1.0, then saturation (x - mean_c) * 2 s + mean_c, then
  contrast (x - mean_chw) * (c + 0.5) + mean_chw (b, s, c ~ U(0, 1));
- crop = translate by integers in [-round(0.125 H), round(0.125 H)] (and W), zero-padded by one pixel;
- cutout = zero a square of half the side at a random centre;
- flip = horizontal flip with probability 0.5;
- scale = affine scaling by sx, sy ~ U(1/1.2, 1.2);
- rotate = affine rotation by U(-15, 15) degrees;

affine maps resample bilinearly with zero padding (``affine_grid`` / ``grid_sample``, corners not
aligned). Random numbers come from CPU generators seeded as the code seeds torch's, so on CPU the
draws are the code's; the global random state is left alone. The code takes its seed from the
clock; :mod:`fedrepro.methods.creff` derives it from the run seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

STRATEGY = "color_crop_cutout_flip_scale_rotate"


@dataclass(frozen=True)
class DSAParams:
    prob_flip: float = 0.5
    ratio_scale: float = 1.2
    ratio_rotate: float = 15.0
    ratio_crop_pad: float = 0.125
    ratio_cutout: float = 0.5
    brightness: float = 1.0
    saturation: float = 2.0
    contrast: float = 0.5


class _Seeds:
    """s, s + 1, s + 2, ...: one CPU generator per draw, as the code reseeds torch before each."""

    def __init__(self, seed: int):
        self.next = int(seed)

    def generator(self) -> torch.Generator:
        gen = torch.Generator().manual_seed(self.next)
        self.next += 1
        return gen


def _siamese(values: torch.Tensor) -> torch.Tensor:
    """Every image takes the first image's draw."""
    return values[:1].expand(values.shape).clone()


def _affine(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    grid = F.affine_grid(theta.to(x.device, x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _uniform(seeds: _Seeds, shape) -> torch.Tensor:
    return _siamese(torch.rand(shape, generator=seeds.generator()))


def rand_scale(x, p: DSAParams, seeds: _Seeds):
    r = p.ratio_scale
    sx = _uniform(seeds, (x.shape[0],)) * (r - 1.0 / r) + 1.0 / r
    sy = _uniform(seeds, (x.shape[0],)) * (r - 1.0 / r) + 1.0 / r
    zero = torch.zeros_like(sx)
    theta = torch.stack([torch.stack([sx, zero, zero], 1), torch.stack([zero, sy, zero], 1)], 1)
    return _affine(x, theta)


def rand_rotate(x, p: DSAParams, seeds: _Seeds):
    angle = (_uniform(seeds, (x.shape[0],)) - 0.5) * 2 * p.ratio_rotate / 180 * float(math.pi)
    zero = torch.zeros_like(angle)
    theta = torch.stack([torch.stack([angle.cos(), (-angle).sin(), zero], 1),
                         torch.stack([angle.sin(), angle.cos(), zero], 1)], 1)
    return _affine(x, theta)


def rand_flip(x, p: DSAParams, seeds: _Seeds):
    draw = _uniform(seeds, (x.shape[0], 1, 1, 1)).to(x.device)
    return torch.where(draw < p.prob_flip, x.flip(3), x)


def rand_brightness(x, p: DSAParams, seeds: _Seeds):
    draw = _uniform(seeds, (x.shape[0], 1, 1, 1)).to(x.device, x.dtype)
    return x + (draw - 0.5) * p.brightness


def rand_saturation(x, p: DSAParams, seeds: _Seeds):
    mean = x.mean(dim=1, keepdim=True)
    draw = _uniform(seeds, (x.shape[0], 1, 1, 1)).to(x.device, x.dtype)
    return (x - mean) * (draw * p.saturation) + mean


def rand_contrast(x, p: DSAParams, seeds: _Seeds):
    mean = x.mean(dim=[1, 2, 3], keepdim=True)
    draw = _uniform(seeds, (x.shape[0], 1, 1, 1)).to(x.device, x.dtype)
    return (x - mean) * (draw + p.contrast) + mean


def _randint(seeds: _Seeds, low: int, high: int, n: int) -> torch.Tensor:
    return _siamese(torch.randint(low, high, size=[n, 1, 1], generator=seeds.generator()))


def rand_crop(x, p: DSAParams, seeds: _Seeds):
    """Translate by whole pixels, reading a one-pixel zero border where the shift leaves the image."""
    b, _, h, w = x.shape
    shift_x, shift_y = int(h * p.ratio_crop_pad + 0.5), int(w * p.ratio_crop_pad + 0.5)
    tx = _randint(seeds, -shift_x, shift_x + 1, b).to(x.device)
    ty = _randint(seeds, -shift_y, shift_y + 1, b).to(x.device)
    gb, gx, gy = torch.meshgrid(torch.arange(b, device=x.device), torch.arange(h, device=x.device),
                                torch.arange(w, device=x.device), indexing="ij")
    gx = torch.clamp(gx + tx + 1, 0, h + 1)
    gy = torch.clamp(gy + ty + 1, 0, w + 1)
    padded = F.pad(x, [1, 1, 1, 1, 0, 0, 0, 0])
    return padded.permute(0, 2, 3, 1).contiguous()[gb, gx, gy].permute(0, 3, 1, 2)


def rand_cutout(x, p: DSAParams, seeds: _Seeds):
    b, _, h, w = x.shape
    size = int(h * p.ratio_cutout + 0.5), int(w * p.ratio_cutout + 0.5)
    ox = _randint(seeds, 0, h + (1 - size[0] % 2), b).to(x.device)
    oy = _randint(seeds, 0, w + (1 - size[1] % 2), b).to(x.device)
    gb, gx, gy = torch.meshgrid(torch.arange(b, device=x.device), torch.arange(size[0], device=x.device),
                                torch.arange(size[1], device=x.device), indexing="ij")
    gx = torch.clamp(gx + ox - size[0] // 2, min=0, max=h - 1)
    gy = torch.clamp(gy + oy - size[1] // 2, min=0, max=w - 1)
    mask = torch.ones(b, h, w, dtype=x.dtype, device=x.device)
    mask[gb, gx, gy] = 0
    return x * mask.unsqueeze(1)


GROUPS = {
    "color": (rand_brightness, rand_saturation, rand_contrast),
    "crop": (rand_crop,),
    "cutout": (rand_cutout,),
    "flip": (rand_flip,),
    "scale": (rand_scale,),
    "rotate": (rand_rotate,),
}


def strategy_groups(strategy: str) -> list[str]:
    """The group names of a strategy ('' / 'none' = no augmentation); unknown names are an error."""
    if strategy in ("", "none", "None"):
        return []
    names = strategy.split("_")
    unknown = sorted(set(names) - set(GROUPS))
    if unknown:
        raise ValueError(f"unknown DSA augmentation(s) {unknown}; allowed: {sorted(GROUPS)} joined by '_', or none")
    return names


def diff_augment(x: torch.Tensor, strategy: str, seed: int, params: DSAParams = DSAParams()) -> torch.Tensor:
    """One Siamese augmentation of the batch ``x`` (B x C x H x W): a group of ``strategy`` (names
    joined by '_') chosen from ``seed``, its functions seeded with seed + 1, seed + 2, ..."""
    names = strategy_groups(strategy)
    if not names:
        return x
    seeds = _Seeds(seed)
    chosen = names[int(torch.randint(0, len(names), size=(1,), generator=seeds.generator()).item())]
    for fn in GROUPS[chosen]:
        x = fn(x, params, seeds)
    return x.contiguous()
