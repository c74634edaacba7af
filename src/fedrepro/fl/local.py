"""Local training plumbing shared by every method: one round's mini-batches and the optimizers."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from ..data.loader import batches, replayed_batches
from ..seeding import torch_generator


def local_batches(dataset, train: dict, seed: int, rnd: int, client: int, plan: list | None = None) -> Iterator[dict]:
    """One round of local work: ``local.epochs`` passes, or exactly ``local.steps`` mini-batches drawn
    from an endlessly reshuffled loader (the authors' 'infinite loader' for BT). Each pass has its own
    shuffling stream keyed by (seed, round, client, pass), so a resumed run sees the same batches.
    ``local.sampler: class_balanced`` draws each pass with replacement, weight 1 / class count.
    ``plan``: the batches a recorded run drew this round (a replay, :mod:`fedrepro.fl.replay`), taken instead."""
    local = train["local"]
    size, drop_last = train["batch_size"], local.get("drop_last", False)
    workers = train.get("num_workers", 0)
    sampler = local.get("sampler", "shuffle")
    if plan is not None:
        yield from replayed_batches(dataset, plan, workers)
        return

    def one_pass(p: int) -> Iterator[dict]:
        return batches(dataset, size, shuffle=True, generator=torch_generator(seed, "shuffle", rnd, client, p),
                       drop_last=drop_last, num_workers=workers, sampler=sampler)

    if "steps" in local:
        taken, p = 0, 0
        while taken < local["steps"]:
            empty = True
            for batch in one_pass(p):
                empty = False
                yield batch
                taken += 1
                if taken == local["steps"]:
                    return
            if empty:
                return
            p += 1
    else:
        for p in range(local["epochs"]):
            yield from one_pass(p)


def optimizer_factor(cfg: dict) -> int:
    """Tensors of a parameter's size the optimizer keeps per trainable parameter: Adam's two moments,
    SGD's momentum buffer (or nothing)."""
    if cfg["name"] in ("adam", "adamw"):
        return 2
    return 1 if cfg.get("momentum") else 0


def make_optimizer(params: Iterable, cfg: dict) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    name, lr, wd = cfg["name"], cfg["lr"], cfg.get("weight_decay", 0.0)
    # the fused kernels need every tensor on one CPU or CUDA device; anything else uses the default
    fused = bool(cfg.get("fused")) and bool(params) and len({p.device for p in params}) == 1 \
        and params[0].device.type in ("cpu", "cuda")
    kind = {"fused": True} if fused else {}
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=tuple(cfg.get("betas", (0.9, 0.999))), eps=cfg.get("eps", 1e-8),
                                weight_decay=wd, **kind)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.get("betas", (0.9, 0.999))), eps=cfg.get("eps", 1e-8),
                                 weight_decay=wd, **kind)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.get("momentum", 0.0), weight_decay=wd, **kind)
    raise ValueError(f"unknown optimizer {name!r}; allowed: adam, adamw, sgd")
