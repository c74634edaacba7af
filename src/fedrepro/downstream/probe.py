"""Linear probe on a frozen image encoder: few-shot classification at several label fractions.

Two recipes (``recipe``):

``mgca`` (default; MGCA's linear evaluation, HKU-MedAI/MGCA ``mgca_finetuner.py`` and
``ssl_finetuner.py`` ``SSLFineTuner``, which FedDRA follows): training images through the family's
training transform (MGCA's ``DataTransforms``: a random 224 crop of the image resized to 256), so
they are encoded anew every epoch; batches without the last partial one; AdamW (weight decay 1e-6 in
MGCA); the head of the epoch with the lowest validation loss is tested, and training stops after
``patience`` epochs without a lower one (``EarlyStopping`` and ``ModelCheckpoint`` on ``val_loss``,
whose validation loader drops its last partial batch too).

``fedrepro``: the evaluation transform for every image, so every image is encoded once and the linear
layer is trained on the cached features; Adam; the epoch whose head scores the best validation
accuracy (``selection: best_val``) or the last one is tested.

Metrics are those of :func:`fedrepro.metrics.classification_metrics`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ..data.images import ManifestImages
from ..data.loader import batches
from ..device import Compute
from ..metrics import classification_metrics
from ..seeding import seed_global, torch_generator
from .segmentation import EarlyStopping


def images(family, manifest, rows: np.ndarray, labels: np.ndarray, raw_dir: str, transform) -> ManifestImages:
    return ManifestImages(raw_dir, manifest["path"].to_numpy()[rows].tolist(), labels, rows, transform)


@torch.no_grad()
def encode(family, model, manifest, rows: np.ndarray, features: str, batch_size: int, compute: Compute,
           raw_dir: str) -> torch.Tensor:
    """Frozen-encoder features (fp32, CPU) of ``rows`` through the evaluation transform; the encoder runs
    in ``compute``'s precision."""
    dataset = images(family, manifest, rows, np.zeros(len(rows)), raw_dir, family.eval_transform())
    out = []
    for batch in batches(dataset, batch_size, shuffle=False):
        with compute.autocast():
            out.append(family.encode_image(model, compute.batch(batch)["x"], features).float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


def validation_loss(head: nn.Linear, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    """Cross-entropy over the validation batches without the last partial one (a split smaller than one
    batch is one batch), the mean of the batch means."""
    stop = len(x) - len(x) % batch_size if len(x) >= batch_size else len(x)
    with torch.no_grad():
        losses = [float(nn.functional.cross_entropy(head(x[s:s + batch_size]), y[s:s + batch_size]))
                  for s in range(0, stop, batch_size)]
    return float(np.mean(losses)) if losses else math.inf


def train_linear(epoch_batches, dim: int, x_val: torch.Tensor, y_val: torch.Tensor, num_classes: int, spec: dict) -> nn.Linear:
    """The head trained on ``epoch_batches()`` (an iterator of (features, labels) per epoch) -> the head
    the recipe selects (see the module docstring)."""
    mgca = spec["recipe"] == "mgca"
    head = nn.Linear(dim, num_classes)
    if mgca:
        optimizer = torch.optim.AdamW(head.parameters(), lr=spec["lr"], betas=(0.9, 0.999), weight_decay=spec["weight_decay"])
    else:
        optimizer = torch.optim.Adam(head.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    keeper = EarlyStopping(head, spec["patience"] if mgca else None)
    selects = len(x_val) and (mgca or spec["selection"] == "best_val")
    for _ in range(spec["epochs"]):
        for x, y in epoch_batches():
            loss = nn.functional.cross_entropy(head(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if not selects:
            continue
        if mgca:
            score = validation_loss(head, x_val, y_val, spec["batch_size"])
        else:
            with torch.no_grad():
                score = -float((head(x_val).argmax(1) == y_val).float().mean())
        if keeper.update(score, head):
            break
    if selects:
        head.load_state_dict(keeper.state)
    return head


def linear_probe(family, model, manifest, labels, classes, splits, subsets, spec, job, compute: Compute, log) -> dict:
    from . import fraction_key

    bs, raw, features = spec["batch_size"], job["paths"]["raw_dir"], spec["features"]
    mgca = spec["recipe"] == "mgca"
    if not mgca:
        train_rows = np.unique(np.concatenate(list(subsets.values())))
        cache = {int(r): f for r, f in zip(train_rows, encode(family, model, manifest, train_rows, features, bs, compute, raw))}
    x_val = encode(family, model, manifest, splits["val"], features, bs, compute, raw)
    x_test = encode(family, model, manifest, splits["test"], features, bs, compute, raw)
    y_val, y_test = torch.as_tensor(labels[splits["val"]]), labels[splits["test"]]
    dim = x_test.shape[1]
    out = {}
    for fraction, rows in subsets.items():
        seed_global(job["seed"], "downstream", job["task"], fraction)
        generator = torch_generator(job["seed"], "downstream", job["task"], fraction)
        if mgca:
            train_set = images(family, manifest, rows, labels[rows], raw, family.train_transform())

            def epoch_batches():        # randomly cropped images, encoded anew every epoch
                for batch in batches(train_set, bs, shuffle=True, generator=generator, drop_last=True):
                    with torch.no_grad(), compute.autocast():
                        x = family.encode_image(model, compute.batch(batch)["x"], features).float().cpu()
                    yield x, torch.as_tensor(batch["y"]).long()
        else:
            x_train, y_train = torch.stack([cache[int(r)] for r in rows]), torch.as_tensor(labels[rows])

            def epoch_batches():        # the cached features
                order = torch.randperm(len(x_train), generator=generator)
                for start in range(0, len(x_train), bs):
                    idx = order[start:start + bs]
                    yield x_train[idx], y_train[idx]

        head = train_linear(epoch_batches, dim, x_val, y_val, len(classes), spec)
        with torch.no_grad():
            probs = torch.softmax(head(x_test), dim=1).numpy()
        metrics = classification_metrics(y_test, probs)
        metrics["n_train"] = int(len(rows))
        out[fraction_key(fraction)] = metrics
        log.info("%s %s: acc %.4f (n_train %d, n_test %d)", job["task"], fraction_key(fraction), metrics["acc"], len(rows), len(y_test))
    return out
