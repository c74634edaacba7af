"""Segmentation with a frozen pre-trained image encoder and a trained decoder (FedDRA appendix A.1.2,
following MGCA: RSNA Pneumonia boxes turned into masks; Dice). Two recipes (``recipe``):

``mgca`` (default; MGCA's code, HKU-MedAI/MGCA: ``mgca_segmenter.py``, ``ssl_segmenter.py``,
``transformer_seg.py``, ``segmentation_dataset.py``, ``segmentation_loss.py``): images (and masks)
resized to ``image_size`` (longer side, zero-padded to a square, no crop); a training image and its
mask rotated by up to ±10° and scaled by up to ±10% together with probability ½ (albumentations'
``ShiftScaleRotate`` without shift); a SETR-style decoder on the encoder's last-layer patch tokens
(``SETRModel``: a linear layer on every token, four [3x3 conv, BatchNorm, ReLU, x2 bilinear upsample]
stages of ``decoder_features`` channels, a 3x3 conv to one logit); loss ``MixedLoss(alpha=10)`` =
10 · focal (γ = 2) − log(soft Dice of the batch); AdamW; training batches drop the last partial
one; the decoder of the epoch with the lowest validation loss is tested, and training stops after
``patience`` epochs without a lower one (``EarlyStopping`` and ``ModelCheckpoint`` on ``val_loss``).

``fedrepro``: images through the family's evaluation geometry (resize + centre crop), no
augmentation; a U-Net-style decoder on the token maps of ``levels`` evenly spaced encoder blocks
(UNETR's choice of skip features for a ViT; for a CNN image encoder, its stages): the deepest map is
upsampled x2 per stage and fused (concat + 3x3 conv + BN + ReLU) with the next shallower one, then a
1x1 conv gives the logit; loss binary cross-entropy + soft Dice; Adam; the epoch whose decoder has
the best ``dice_pooled`` on the validation split (``selection: best_val``) or the last.

Reported by both: ``dice`` = MGCA's ``get_dice``: per image, 2|P∩G| / (|P|+|G|) when its mask has a
box, and when it has none 1 if nothing is predicted, else 0; the mean over a test batch, averaged
over the test batches (``batch_size``, in order; ``shared_epoch_end``). On RSNA most images have
no box, so an empty prediction alone scores their share; the published numbers are on this scale.
``dice_pooled`` = 2|P∩G| / (|P|+|G|) over all test pixels (0 for an empty prediction);
``dice_positive`` = the mean per-image Dice over the test images that have a box.

With a frozen encoder and a deterministic transform, the validation and test maps are computed once
per image (stored in float16); augmented training images are encoded anew every epoch.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.images import load_rgb
from ..seeding import seed_global, torch_generator


def box_mask(size: tuple[int, int], boxes: list) -> "Image.Image":  # noqa: F821
    """A binary mask image (mode L, 255 inside any box) of ``size`` = (width, height)."""
    from PIL import Image, ImageDraw

    mask = Image.new("L", size, 0)
    draw = ImageDraw.Draw(mask)
    for x, y, w, h in boxes:
        draw.rectangle([x, y, x + w - 1, y + h - 1], fill=255)
    return mask


def dice_score(prediction: np.ndarray, target: np.ndarray) -> float:
    """2|P∩G| / (|P| + |G|) of two boolean arrays (1.0 when both are empty)."""
    p, g = prediction.astype(bool), target.astype(bool)
    denom = p.sum() + g.sum()
    return float(2.0 * (p & g).sum() / denom) if denom else 1.0


def image_dice(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """MGCA's per-image Dice of boolean B x H x W masks: 2|P∩G| / (|P|+|G|) for an image with a box;
    for an image without one, 1 if nothing is predicted, else 0."""
    p, g = prediction.flatten(1).float(), target.flatten(1).float()
    positive = g.sum(1) > 0
    overlap = 2 * (p * g).sum(1) / (p.sum(1) + g.sum(1)).clamp_min(1)
    return torch.where(positive, overlap, (p.sum(1) == 0).float())


def soft_dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    p = torch.sigmoid(logits).flatten(1)
    t = target.flatten(1)
    return (1 - (2 * (p * t).sum(1) + eps) / (p.sum(1) + t.sum(1) + eps)).mean()


def focal_loss(logits: torch.Tensor, target: torch.Tensor, gamma: float = 2.0) -> torch.Tensor:
    """Binary focal loss: the pixel's cross-entropy times (1 − p_true)^γ, the mean over pixels."""
    p_wrong = torch.sigmoid(-logits * (2 * target - 1))
    return (p_wrong ** gamma * F.binary_cross_entropy_with_logits(logits, target, reduction="none")).mean()


def mixed_loss(logits: torch.Tensor, target: torch.Tensor, alpha: float = 10.0, gamma: float = 2.0) -> torch.Tensor:
    """MGCA's ``MixedLoss``: α · focal − log(soft Dice), the Dice (smoothed by 1) over the whole batch."""
    p, t = torch.sigmoid(logits).flatten(), target.flatten()
    dice = (2 * (p * t).sum() + 1) / (p.sum() + t.sum() + 1)
    return alpha * focal_loss(logits, target, gamma) - torch.log(dice)


def fedrepro_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, target) + soft_dice_loss(logits, target)


class SETRDecoder(nn.Module):
    """MGCA's SETR head (``transformer_seg.py``): a linear layer on every patch token (``final_dense``;
    with 16-px patches one D-vector per token), the token map, then per entry of ``features`` a 3x3
    conv, BatchNorm, ReLU and a x2 bilinear upsample, and a 3x3 conv to one logit. Four stages take a
    14 x 14 map to 224 x 224; another size is resized to the mask at the end."""

    def __init__(self, dim: int, features: list[int]):
        super().__init__()
        self.token = nn.Linear(dim, dim)
        stages, width = [], dim
        for out in features:
            stages += [nn.Conv2d(width, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(inplace=True),
                       nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)]
            width = out
        self.stages = nn.Sequential(*stages)
        self.head = nn.Conv2d(width, 1, 3, padding=1)

    def forward(self, maps: list[torch.Tensor], size: tuple[int, int]) -> torch.Tensor:
        x = maps[-1]
        x = self.token(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = self.head(self.stages(x))
        return x if tuple(x.shape[-2:]) == tuple(size) else F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class UNetDecoder(nn.Module):
    def __init__(self, dims: list[int], channels: int):
        """``dims``: the channels of each encoder map, shallow to deep (all D for a ViT)."""
        super().__init__()
        levels = len(dims)
        self.lateral = nn.ModuleList(nn.Conv2d(dim, channels, 1) for dim in dims)
        self.up = nn.ModuleList(nn.ConvTranspose2d(channels, channels, 2, stride=2) for _ in range(levels - 1))
        self.fuse = nn.ModuleList(nn.Sequential(nn.Conv2d(2 * channels, channels, 3, padding=1), nn.BatchNorm2d(channels),
                                                nn.ReLU(inplace=True)) for _ in range(levels - 1))
        self.head = nn.Conv2d(channels, 1, 1)

    def forward(self, maps: list[torch.Tensor], size: tuple[int, int]) -> torch.Tensor:
        x = self.lateral[-1](maps[-1])
        for stage in range(len(maps) - 1):
            x = self.up[stage](x)
            skip = self.lateral[-2 - stage](maps[-2 - stage])
            skip = F.interpolate(skip, size=x.shape[-2:], mode="bilinear", align_corners=False)
            x = self.fuse[stage](torch.cat([x, skip], dim=1))
        return F.interpolate(self.head(x), size=size, mode="bilinear", align_corners=False)


def rotate_and_scale(image, mask, max_angle: float = 10.0, max_scale: float = 0.1, p: float = 0.5):
    """With probability ``p``, the same random rotation (±``max_angle``°) and scale (1 ± ``max_scale``)
    about the centre of both PIL images, the empty border black (MGCA: ``ShiftScaleRotate(shift_limit=0,
    scale_limit=0.1, rotate_limit=10, p=0.5, border_mode=BORDER_CONSTANT)``); bilinear for the image,
    nearest for the mask. Draws from torch's generator (seeded per item by the loader)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    if float(torch.rand(())) >= p:
        return image, mask
    angle = float(torch.empty(()).uniform_(-max_angle, max_angle))
    scale = float(torch.empty(()).uniform_(1 - max_scale, 1 + max_scale))
    image = TF.affine(image, angle=angle, translate=[0, 0], scale=scale, shear=[0.0], interpolation=InterpolationMode.BILINEAR)
    mask = TF.affine(mask, angle=angle, translate=[0, 0], scale=scale, shear=[0.0], interpolation=InterpolationMode.NEAREST)
    return image, mask


class MaskedImages:
    """Image + box mask, both through the same geometry: the family's evaluation geometry (resize and
    centre crop, ``crop``) or the resize to the image size alone; ``augment``: :func:`rotate_and_scale`."""

    def __init__(self, family, raw_dir: str, paths: list[str], boxes: list[list], crop: bool = True, augment: bool = False):
        from torchvision import transforms as T

        self.raw_dir, self.paths, self.boxes, self.augment = raw_dir, paths, boxes, augment
        self.image_geometry = family.eval_geometry(crop=crop)
        self.mask_geometry = family.eval_geometry(nearest=True, crop=crop)
        self.to_tensor = family.tensor_transform()
        self.mask_tensor = T.PILToTensor()

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from pathlib import Path

        image = load_rgb(Path(self.raw_dir) / self.paths[i])
        mask = box_mask(image.size, self.boxes[i])
        image, mask = self.image_geometry(image), self.mask_geometry(mask)
        if self.augment:
            image, mask = rotate_and_scale(image, mask)
        return {"x": self.to_tensor(image), "mask": (self.mask_tensor(mask)[0] > 127).float()}


@torch.no_grad()
def encode_maps(encode, dataset, batch_size: int, compute) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``encode(x)``'s maps of every image (stored in fp16 on the CPU; the encoder runs in ``compute``'s
    precision) and the masks."""
    from ..data.loader import batches

    maps, masks = None, []
    for batch in batches(dataset, batch_size, shuffle=False):
        with compute.autocast():
            out = [m.half().cpu() for m in encode(batch["x"].to(compute.device))]
        maps = [[o] for o in out] if maps is None else [acc + [o] for acc, o in zip(maps, out)]
        masks.append(batch["mask"])
    return [torch.cat(m) for m in maps], torch.cat(masks)


@torch.no_grad()
def evaluate_decoder(decoder, maps, masks, device, batch_size: int) -> dict[str, float]:
    """``dice`` (MGCA's: the mean of per-batch means of the per-image Dice), ``dice_pooled`` (over all
    pixels) and ``dice_positive`` (the per-image mean over images with a box)."""
    decoder.eval()
    inter = total = 0.0
    batch_means, positive = [], []
    for start in range(0, len(masks), batch_size):
        feats = [m[start:start + batch_size].float().to(device) for m in maps]
        target = masks[start:start + batch_size].bool()
        pred = (decoder(feats, target.shape[-2:]).squeeze(1).cpu() > 0)
        inter += float((pred & target).sum())
        total += float(pred.sum() + target.sum())
        per_image = image_dice(pred, target)
        batch_means.append(float(per_image.mean()))
        positive += per_image[target.flatten(1).any(1)].tolist()
    decoder.train()
    return {"dice": float(np.mean(batch_means)) if batch_means else float("nan"),
            "dice_pooled": 2 * inter / total if total else 1.0,
            "dice_positive": float(np.mean(positive)) if positive else float("nan")}


@torch.no_grad()
def validation_loss(decoder, maps, masks, device, batch_size: int, loss_fn) -> float:
    """The mean loss over the validation batches without the last partial one (MGCA's validation
    loader drops it; a split smaller than one batch is one batch)."""
    decoder.eval()
    n = len(masks)
    stop = n - n % batch_size if n >= batch_size else n
    losses = []
    for start in range(0, stop, batch_size):
        feats = [m[start:start + batch_size].float().to(device) for m in maps]
        target = masks[start:start + batch_size].to(device)[:, None]
        losses.append(float(loss_fn(decoder(feats, target.shape[-2:]), target)))
    decoder.train()
    return float(np.mean(losses)) if losses else math.inf


class EarlyStopping:
    """Keep the state of the epoch with the lowest validation loss; ``stop`` after ``patience`` epochs
    without a lower one (Lightning's ``EarlyStopping(min_delta=0)`` with ``ModelCheckpoint`` on it)."""

    def __init__(self, module: nn.Module, patience: int | None):
        self.patience, self.best, self.wait = patience, math.inf, 0
        self.state = copy.deepcopy(module.state_dict())

    def update(self, loss: float, module: nn.Module) -> bool:
        """-> whether to stop."""
        if loss < self.best:
            self.best, self.wait, self.state = loss, 0, copy.deepcopy(module.state_dict())
        else:
            self.wait += 1
        return self.patience is not None and self.wait >= self.patience


def segmentation(family, model, manifest, labels, classes, splits, subsets, spec, job, compute, log) -> dict:
    from ..data.loader import batches
    from . import DownstreamError, fraction_key

    device = compute.device
    mgca = spec["recipe"] == "mgca"
    column = spec["mask_column"]
    if column not in manifest.columns:
        raise DownstreamError(f"{job['paths']['manifest']} has no column {column!r} (downstream/{job['task']}/mask_column)")
    paths, boxes = manifest["path"].tolist(), [json.loads(b) if b else [] for b in manifest[column].fillna("").tolist()]

    def data(rows, augment=False):
        return MaskedImages(family, job["paths"]["raw_dir"], [paths[r] for r in rows], [boxes[r] for r in rows],
                            crop=not mgca, augment=augment)

    def encode(x):
        return [family.image_token_map(model, x)] if mgca else family.image_feature_maps(model, x, spec["levels"])

    bs = spec["batch_size"]
    loss_fn = mixed_loss if mgca else fedrepro_loss
    val_maps, val_masks = encode_maps(encode, data(splits["val"]), bs, compute)
    test_maps, test_masks = encode_maps(encode, data(splits["test"]), bs, compute)
    out = {}
    for fraction, rows in subsets.items():
        seed_global(job["seed"], "downstream", job["task"], fraction)
        generator = torch_generator(job["seed"], "downstream", job["task"], fraction)
        if mgca:
            decoder = SETRDecoder(test_maps[-1].shape[1], spec["decoder_features"]).to(device)
            optimizer = torch.optim.AdamW(decoder.parameters(), lr=spec["lr"], betas=(0.9, 0.999),
                                          weight_decay=spec["weight_decay"])
            train_set = data(rows, augment=True)

            def epoch_batches():       # augmented images, encoded anew every epoch
                for batch in batches(train_set, bs, shuffle=True, generator=generator, drop_last=True):
                    with torch.no_grad(), compute.autocast():
                        feats = [m.float() for m in encode(batch["x"].to(device))]
                    yield feats, batch["mask"].to(device)[:, None]
        else:
            maps, masks = encode_maps(encode, data(rows), bs, compute)
            decoder = UNetDecoder([m.shape[1] for m in maps], spec["channels"]).to(device)
            optimizer = torch.optim.Adam(decoder.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])

            def epoch_batches():       # the cached maps
                order = torch.randperm(len(masks), generator=generator)
                for start in range(0, len(masks), bs):
                    idx = order[start:start + bs]
                    if len(idx) >= 2:              # BatchNorm needs two samples
                        yield [m[idx].float().to(device) for m in maps], masks[idx].to(device)[:, None]

        keeper = EarlyStopping(decoder, spec["patience"] if mgca else None)
        for _ in range(spec["epochs"]):
            for feats, target in epoch_batches():
                loss = loss_fn(decoder(feats, target.shape[-2:]), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if not len(val_masks) or (not mgca and spec["selection"] == "last"):
                continue
            if mgca:
                score = validation_loss(decoder, val_maps, val_masks, device, bs, loss_fn)
            else:
                score = -evaluate_decoder(decoder, val_maps, val_masks, device, bs)["dice_pooled"]
            if keeper.update(score, decoder):
                break
        if len(val_masks) and (mgca or spec["selection"] == "best_val"):
            decoder.load_state_dict(keeper.state)
        metrics = evaluate_decoder(decoder, test_maps, test_masks, device, bs)
        metrics["n_train"] = int(len(rows))
        out[fraction_key(fraction)] = metrics
        log.info("%s %s: dice %.4f, pooled %.4f (n_train %d)", job["task"], fraction_key(fraction), metrics["dice"],
                 metrics["dice_pooled"], len(rows))
    return out
