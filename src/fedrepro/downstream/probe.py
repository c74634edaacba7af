"""Linear probe on a frozen image encoder: few-shot classification at several label fractions.

The encoder is frozen and the evaluation transform is deterministic, so every image is encoded once
and the linear layer is trained on the cached features (identical to re-encoding every epoch).
The epoch whose head scores best on the validation split (``selection: best_val``) or the last one is
tested; metrics are those of :func:`fedrepro.metrics.classification_metrics`.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from ..data.images import ManifestImages
from ..data.loader import batches
from ..device import Compute
from ..metrics import classification_metrics
from ..seeding import seed_global, torch_generator


@torch.no_grad()
def encode(family, model, manifest, rows: np.ndarray, features: str, batch_size: int, compute: Compute,
           raw_dir: str) -> torch.Tensor:
    """Frozen-encoder features (fp32, CPU) of ``rows``; the encoder runs in ``compute``'s precision."""
    dataset = ManifestImages(raw_dir, manifest["path"].to_numpy()[rows].tolist(), np.zeros(len(rows)), rows,
                             family.eval_transform())
    out = []
    for batch in batches(dataset, batch_size, shuffle=False):
        with compute.autocast():
            out.append(family.encode_image(model, compute.batch(batch)["x"], features).float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


def train_linear(x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor, num_classes: int,
                 spec: dict, generator: torch.Generator) -> nn.Linear:
    """Adam on cross-entropy; -> the head of the best validation epoch (or the last)."""
    head = nn.Linear(x.shape[1], num_classes)
    optimizer = torch.optim.Adam(head.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    best, best_state = -np.inf, copy.deepcopy(head.state_dict())
    for _ in range(spec["epochs"]):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), spec["batch_size"]):
            idx = order[start:start + spec["batch_size"]]
            loss = nn.functional.cross_entropy(head(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if spec["selection"] == "best_val" and len(x_val):
            with torch.no_grad():
                acc = float((head(x_val).argmax(1) == y_val).float().mean())
            if acc > best:
                best, best_state = acc, copy.deepcopy(head.state_dict())
    if spec["selection"] == "best_val" and len(x_val):
        head.load_state_dict(best_state)
    return head


def linear_probe(family, model, manifest, labels, classes, splits, subsets, spec, job, compute: Compute, log) -> dict:
    from . import fraction_key

    bs, raw = spec["batch_size"], job["paths"]["raw_dir"]
    train_rows = np.unique(np.concatenate(list(subsets.values())))
    cache = {int(r): f for r, f in zip(train_rows, encode(family, model, manifest, train_rows, spec["features"], bs, compute, raw))}
    x_val = encode(family, model, manifest, splits["val"], spec["features"], bs, compute, raw)
    x_test = encode(family, model, manifest, splits["test"], spec["features"], bs, compute, raw)
    y_val, y_test = torch.as_tensor(labels[splits["val"]]), labels[splits["test"]]
    out = {}
    for fraction, rows in subsets.items():
        seed_global(job["seed"], "downstream", job["task"], fraction)
        x = torch.stack([cache[int(r)] for r in rows])
        head = train_linear(x, torch.as_tensor(labels[rows]), x_val, y_val, len(classes), spec,
                            torch_generator(job["seed"], "downstream", job["task"], fraction))
        with torch.no_grad():
            probs = torch.softmax(head(x_test), dim=1).numpy()
        metrics = classification_metrics(y_test, probs)
        metrics["n_train"] = int(len(rows))
        out[fraction_key(fraction)] = metrics
        log.info("%s %s: acc %.4f (n_train %d, n_test %d)", job["task"], fraction_key(fraction), metrics["acc"], len(rows), len(y_test))
    return out
