"""Pieces shared by the class-imbalance methods (FedIIC and its baselines FedRS, FedLC, FedProc,
CLIMB, CReFF, PRR-Imb): class counts and priors, logit-adjusted cross-entropy, passes of a model over
a client's data, and access to the classifier head / projector of the model.

Client-side passes that read augmented training images (per-class losses, prototypes, gradients)
run under :func:`fixed_randomness`, so they are deterministic in the run seed and leave the global
random streams of local training untouched (resume stays exact). Within such a pass every image gets
its own augmentation, as a DataLoader over the training set gives it (:func:`outputs_over`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...data.loader import batches, replayed_batches
from ...device import Compute, fp32, full_precision
from ...fl.evaluation import dataset_labels
from ...models.families import Output
from ...seeding import kept_rng_state, seed_global


def class_counts(dataset, num_classes: int) -> torch.Tensor:
    """Number of examples of every class in a (client's) dataset, as a float tensor."""
    labels = dataset_labels(dataset) if dataset is not None and len(dataset) else np.zeros(0, dtype=int)
    return torch.as_tensor(np.bincount(labels, minlength=num_classes), dtype=torch.float32)


def class_prior(counts: torch.Tensor) -> torch.Tensor:
    """p(y) = n_y / sum(n)."""
    return counts / counts.sum().clamp_min(1e-12)


@full_precision
def logit_adjusted_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, adjustment: torch.Tensor) -> torch.Tensor:
    """CE(softmax(z + a), y): every class score is shifted by a per-class ``adjustment`` a_c
    (a_c = -inf removes class c from the softmax)."""
    return F.cross_entropy(logits + adjustment.to(logits.device)[None, :], targets)


@contextlib.contextmanager
def fixed_randomness(seed: int, purpose: str, *keys):
    """Run a block with the global RNGs (python, numpy, torch) seeded from (seed, purpose, keys),
    and restore their previous state afterwards."""
    with kept_rng_state():
        seed_global(seed, purpose, *keys)
        yield


@torch.no_grad()
def outputs_over(family, model: nn.Module, dataset, train: dict, compute: Compute, batch_size: int | None = None,
                 *, shuffle: bool = False, train_mode: bool = False, plan: list | None = None
                 ) -> Iterator[tuple[Output, dict]]:
    """(output, batch) for every batch of ``dataset`` (batches of ``batch_size``, default the eval batch
    size; in order, or shuffled), with the model in eval mode (``train_mode``: in train mode, BatchNorm on
    batch statistics and dropout active; the model's buffers are restored afterwards). Of a multi-view
    batch only the first view is used. The forward pass runs in ``compute``'s precision; logits and
    features come out in fp32.

    Every item is loaded under its own seed (its own crop and RandAugment draw), and the seeds and the
    order come from one generator seeded from torch's global generator: call it under
    :func:`fixed_randomness` and the pass is the same for the same keys, with any number of loader
    workers. ``plan``: the batches a recorded run took for this pass (a replay, :mod:`fedrepro.fl.replay`), taken
    instead."""
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
    was_training = model.training
    kept = {name: b.clone() for name, b in model.named_buffers()} if train_mode else None
    model.train(train_mode)
    try:
        passes = batches(dataset, batch_size or train["eval_batch_size"], shuffle=shuffle, generator=generator,
                         num_workers=train.get("num_workers", 0)) if plan is None else \
            replayed_batches(dataset, plan, train.get("num_workers", 0))
        for batch in passes:
            if batch["x"].dim() == 5:
                batch = {**batch, "x": batch["x"][:, 0]}
            batch = compute.batch(batch)
            with compute.autocast():
                out = _forward(family, model, batch)
            yield Output(logits=fp32(out.logits), features=fp32(out.features),
                         objective=[(fp32(s), t) for s, t in out.objective], extra=out.extra), batch
    finally:
        if kept is not None:              # a measurement leaves no BatchNorm statistics behind
            model.load_state_dict(kept, strict=False)
        model.train(was_training)


def _forward(family, model: nn.Module, batch: dict) -> Output:
    """The family's forward pass; in train mode, a batch of one image whose feature map shrinks to 1 x 1
    (a small model on small images) has no batch statistics to normalise with: it passes in eval mode."""
    try:
        return family.forward(model, batch)
    except ValueError as error:
        if not (model.training and len(batch["y"]) == 1 and "more than 1 value per channel" in str(error)):
            raise
        model.eval()
        try:
            return family.forward(model, batch)
        finally:
            model.train()


def head_of(model: nn.Module) -> nn.Linear:
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear):
        raise TypeError(f"{type(model).__name__} has no linear classifier 'head'; use the classifier or "
                        f"proj_classifier model family")
    return head


@contextlib.contextmanager
def classifier_input(model: nn.Module):
    """Within the block, ``read()`` returns what the model's linear ``head`` was last called on in a
    forward pass (the features the classifier reads, after dropout): for losses that the official
    code computes from them rather than from the logits (FedRS's w . h without the bias)."""
    seen: list[torch.Tensor] = []
    handle = head_of(model).register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        yield lambda: seen[-1]
    finally:
        handle.remove()


def projector_of(model: nn.Module) -> nn.Module:
    projector = getattr(model, "projector", None)
    if projector is None:
        raise TypeError(f"{type(model).__name__} has no projector; use the proj_classifier model family")
    return projector


def split_payload(payload: dict, prefix: str) -> tuple[dict, dict]:
    """(model part, the entries whose key starts with ``prefix``) of a client upload."""
    extra = {k: v for k, v in payload.items() if k.startswith(prefix)}
    return {k: v for k, v in payload.items() if k not in extra}, extra
