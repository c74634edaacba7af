"""Differentiable Siamese Augmentation as CReFF's code applies it (fedrepro.methods._common.dsa): the group
chosen from the seed, each function's parameters drawn after reseeding with seed + 1, + 2, ... (as
the code reseeds torch), every image of the batch transformed alike, hand-computed outputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedrepro.methods._common.dsa import STRATEGY, DSAParams, diff_augment

GROUP_OF_SEED = {"cutout": 0, "crop": 1, "color": 2, "scale": 3, "rotate": 5, "flip": 7}   # torch.randint(0, 6) after manual_seed


def draw(seed: int, fn, *args, **kwargs):
    """What the code draws: torch's global generator seeded with ``seed``."""
    torch.manual_seed(seed)
    return fn(*args, **kwargs)


def images(b=3, c=3, h=8, w=8):
    return torch.arange(b * c * h * w, dtype=torch.float32).reshape(b, c, h, w) / 100.0


def test_the_group_comes_from_the_seed():
    names = STRATEGY.split("_")
    for group, seed in GROUP_OF_SEED.items():
        assert names[int(draw(seed, torch.randint, 0, len(names), (1,)))] == group


def test_color_by_hand():
    x, s = images(), GROUP_OF_SEED["color"]
    b = draw(s + 1, torch.rand, 3, 1, 1, 1)[0]
    sat = draw(s + 2, torch.rand, 3, 1, 1, 1)[0]
    con = draw(s + 3, torch.rand, 3, 1, 1, 1)[0]
    y = x + (b - 0.5) * 1.0
    y = (y - y.mean(dim=1, keepdim=True)) * (sat * 2.0) + y.mean(dim=1, keepdim=True)
    y = (y - y.mean(dim=[1, 2, 3], keepdim=True)) * (con + 0.5) + y.mean(dim=[1, 2, 3], keepdim=True)
    assert torch.allclose(diff_augment(x, STRATEGY, s), y, atol=1e-6)


def test_crop_translates_with_a_zero_border():
    x, s = images(h=16, w=16), GROUP_OF_SEED["crop"]
    shift = int(16 * 0.125 + 0.5)
    tx = int(draw(s + 1, torch.randint, -shift, shift + 1, [3, 1, 1])[0])
    ty = int(draw(s + 2, torch.randint, -shift, shift + 1, [3, 1, 1])[0])
    out = diff_augment(x, STRATEGY, s)
    expected = torch.zeros_like(x)
    for i in range(16):
        for j in range(16):
            if 0 <= i + tx < 16 and 0 <= j + ty < 16:
                expected[:, :, i, j] = x[:, :, i + tx, j + ty]
    assert (tx, ty) != (0, 0) and torch.equal(out, expected)


def test_cutout_zeroes_a_half_size_square():
    x, s = images(h=8, w=8) + 1.0, GROUP_OF_SEED["cutout"]
    ox = int(draw(s + 1, torch.randint, 0, 8 + 1, [3, 1, 1])[0])
    oy = int(draw(s + 2, torch.randint, 0, 8 + 1, [3, 1, 1])[0])
    out = diff_augment(x, STRATEGY, s)
    rows = [min(max(r, 0), 7) for r in range(ox - 2, ox + 2)]
    cols = [min(max(c, 0), 7) for c in range(oy - 2, oy + 2)]
    mask = torch.ones(8, 8)
    mask[torch.tensor(rows)[:, None], torch.tensor(cols)[None, :]] = 0
    assert torch.equal(out, x * mask)


def test_flip_scale_rotate_by_hand():
    x = images()
    flip = draw(GROUP_OF_SEED["flip"] + 1, torch.rand, 3, 1, 1, 1)[0]
    assert torch.equal(diff_augment(x, STRATEGY, GROUP_OF_SEED["flip"]), x.flip(3) if flip < 0.5 else x)
    s = GROUP_OF_SEED["scale"]
    sx = draw(s + 1, torch.rand, 3)[0] * (1.2 - 1 / 1.2) + 1 / 1.2
    sy = draw(s + 2, torch.rand, 3)[0] * (1.2 - 1 / 1.2) + 1 / 1.2
    theta = torch.tensor([[float(sx), 0.0, 0.0], [0.0, float(sy), 0.0]]).expand(3, 2, 3)
    expected = F.grid_sample(x, F.affine_grid(theta, list(x.shape), align_corners=False), align_corners=False)
    assert torch.allclose(diff_augment(x, STRATEGY, s), expected, atol=1e-6)
    s = GROUP_OF_SEED["rotate"]
    a = float((draw(s + 1, torch.rand, 3)[0] - 0.5) * 2 * 15 / 180 * math.pi)
    theta = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]]).expand(3, 2, 3)
    expected = F.grid_sample(x, F.affine_grid(theta, list(x.shape), align_corners=False), align_corners=False)
    assert torch.allclose(diff_augment(x, STRATEGY, s), expected, atol=1e-6)


@pytest.mark.parametrize("group", sorted(GROUP_OF_SEED))
def test_siamese_every_image_alike_and_global_rng_untouched(group):
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    state = torch.get_rng_state()
    out = diff_augment(x, STRATEGY, GROUP_OF_SEED[group])
    assert torch.equal(torch.get_rng_state(), state)
    swapped = diff_augment(x[[2, 0, 1, 3]], STRATEGY, GROUP_OF_SEED[group])
    assert torch.allclose(swapped, out[[2, 0, 1, 3]], atol=1e-6)        # the transform ignores the position
    assert torch.allclose(diff_augment(x[:1], STRATEGY, GROUP_OF_SEED[group]), out[:1], atol=1e-6)   # a batch of one


def test_none_and_unknown():
    x = images()
    assert diff_augment(x, "none", 3) is x
    with pytest.raises(ValueError, match="unknown DSA"):
        diff_augment(x, "color_blur", 3)
    assert DSAParams().ratio_cutout == 0.5 and DSAParams().saturation == 2.0
