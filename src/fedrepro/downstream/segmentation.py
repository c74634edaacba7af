"""Segmentation with a frozen pre-trained ViT encoder and a trained U-Net-style decoder (FedDRA
appendix A.1.2, following GLoRIA/MGCA: RSNA Pneumonia boxes turned into masks; Dice).

Encoder: the token maps (D x h x w, h = w = image_size / patch) of ``levels`` evenly spaced ViT
blocks, shallow to deep (UNETR's choice of skip features for a ViT); for a CNN image encoder, the
feature maps of ``levels`` evenly spaced stages. Decoder: the deepest map is
upsampled x2 per stage and fused (concat + 3x3 conv + BN + ReLU) with the next shallower map
(projected by a 1x1 conv and resized to the stage's resolution), then a 1x1 conv gives the mask
logit, bilinearly resized to the image. Loss: binary cross-entropy + soft Dice. Reported: ``dice`` =
2|P∩G| / (|P|+|G|) over all test pixels (micro; an empty prediction on an empty mask adds nothing),
and ``dice_per_image`` = the mean over test images with a non-empty mask [the paper does not say
which Dice it reports].

With a frozen encoder and a deterministic transform the token maps are computed once per image
(``cache_features``, stored in float16).
"""

from __future__ import annotations

import copy
import json

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


def soft_dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    p = torch.sigmoid(logits).flatten(1)
    t = target.flatten(1)
    return (1 - (2 * (p * t).sum(1) + eps) / (p.sum(1) + t.sum(1) + eps)).mean()


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


class MaskedImages:
    """Image + box mask, both through the family's (deterministic) evaluation geometry."""

    def __init__(self, family, raw_dir: str, paths: list[str], boxes: list[list]):
        from torchvision import transforms as T

        self.raw_dir, self.paths, self.boxes = raw_dir, paths, boxes
        self.image_transform = family.eval_transform()
        self.mask_transform = T.Compose([family.eval_geometry(nearest=True), T.PILToTensor()])

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from pathlib import Path

        image = load_rgb(Path(self.raw_dir) / self.paths[i])
        mask = box_mask(image.size, self.boxes[i])
        return {"x": self.image_transform(image), "mask": (self.mask_transform(mask)[0] > 127).float()}


@torch.no_grad()
def encode_maps(family, model, dataset, levels: int, batch_size: int, compute) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The frozen encoder's token maps (stored in fp16 on the CPU; the encoder runs in ``compute``'s precision)."""
    from ..data.loader import batches

    maps, masks = None, []
    for batch in batches(dataset, batch_size, shuffle=False):
        with compute.autocast():
            out = [m.half().cpu() for m in family.image_feature_maps(model, batch["x"].to(compute.device), levels)]
        maps = [[o] for o in out] if maps is None else [acc + [o] for acc, o in zip(maps, out)]
        masks.append(batch["mask"])
    return [torch.cat(m) for m in maps], torch.cat(masks)


def evaluate_decoder(decoder, maps, masks, device, batch_size: int) -> dict[str, float]:
    decoder.eval()
    inter = total = 0.0
    per_image = []
    with torch.no_grad():
        for start in range(0, len(masks), batch_size):
            feats = [m[start:start + batch_size].float().to(device) for m in maps]
            target = masks[start:start + batch_size]
            pred = (decoder(feats, target.shape[-2:]).squeeze(1).cpu() > 0)
            t = target.bool()
            inter += float((pred & t).sum())
            total += float(pred.sum() + t.sum())
            per_image += [dice_score(p.numpy(), g.numpy()) for p, g in zip(pred, t) if g.any()]
    decoder.train()
    return {"dice": 2 * inter / total if total else 1.0,
            "dice_per_image": float(np.mean(per_image)) if per_image else float("nan")}


def segmentation(family, model, manifest, labels, classes, splits, subsets, spec, job, compute, log) -> dict:
    from . import DownstreamError, fraction_key

    device = compute.device

    column = spec["mask_column"]
    if column not in manifest.columns:
        raise DownstreamError(f"{job['paths']['manifest']} has no column {column!r} (downstream/{job['task']}/mask_column)")
    paths, boxes = manifest["path"].tolist(), [json.loads(b) if b else [] for b in manifest[column].fillna("").tolist()]

    def data(rows):
        return MaskedImages(family, job["paths"]["raw_dir"], [paths[r] for r in rows], [boxes[r] for r in rows])

    bs, levels = spec["batch_size"], spec["levels"]
    val_maps, val_masks = encode_maps(family, model, data(splits["val"]), levels, bs, compute)
    test_maps, test_masks = encode_maps(family, model, data(splits["test"]), levels, bs, compute)
    out = {}
    for fraction, rows in subsets.items():
        seed_global(job["seed"], "downstream", job["task"], fraction)
        maps, masks = encode_maps(family, model, data(rows), levels, bs, compute)
        decoder = UNetDecoder([m.shape[1] for m in maps], spec["channels"]).to(device)
        optimizer = torch.optim.Adam(decoder.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
        generator = torch_generator(job["seed"], "downstream", job["task"], fraction)
        best, best_state = -np.inf, copy.deepcopy(decoder.state_dict())
        for _ in range(spec["epochs"]):
            order = torch.randperm(len(masks), generator=generator)
            for start in range(0, len(masks), bs):
                idx = order[start:start + bs]
                if len(idx) < 2:          # BatchNorm needs two samples
                    continue
                target = masks[idx].to(device)[:, None]
                logits = decoder([m[idx].float().to(device) for m in maps], target.shape[-2:])
                loss = F.binary_cross_entropy_with_logits(logits, target) + soft_dice_loss(logits, target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if spec["selection"] == "best_val" and len(val_masks):
                score = evaluate_decoder(decoder, val_maps, val_masks, device, bs)["dice"]
                if score > best:
                    best, best_state = score, copy.deepcopy(decoder.state_dict())
        if spec["selection"] == "best_val" and len(val_masks):
            decoder.load_state_dict(best_state)
        metrics = evaluate_decoder(decoder, test_maps, test_masks, device, bs)
        metrics["n_train"] = int(len(rows))
        out[fraction_key(fraction)] = metrics
        log.info("%s %s: dice %.4f (n_train %d)", job["task"], fraction_key(fraction), metrics["dice"], len(rows))
    return out
