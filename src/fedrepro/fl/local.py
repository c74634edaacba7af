"""Local-training plumbing shared by every method: batches, optimizers, devices."""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import torch

from ..seeding import kept_rng_state, torch_generator
from .federation import FeatureSet
from .loader import SeededItems, active_pool, collate, load_items, resolve_workers


SAMPLERS = ("shuffle", "class_balanced")


def class_balanced_order(labels, generator: torch.Generator | None = None) -> torch.Tensor:
    """``len(labels)`` indices drawn with replacement, each with probability proportional to
    1 / (size of its class), so every class is drawn equally often in expectation (the
    ``ImbalancedDatasetSampler`` recipe of torchsampler)."""
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    if len(labels) and labels.min() < 0:
        raise ValueError("class_balanced sampling needs labelled data (found label -1)")
    counts = torch.bincount(labels)
    weights = 1.0 / counts[labels].double()
    return torch.multinomial(weights, len(labels), replacement=True, generator=generator)


def pass_order(dataset, *, shuffle: bool, generator: torch.Generator | None, sampler: str) -> torch.Tensor:
    """The order of one pass: a permutation (``shuffle``), the dataset order, or a class-balanced draw."""
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; allowed: {list(SAMPLERS)}")
    if sampler == "class_balanced":
        return class_balanced_order(dataset.labels, generator)
    n = len(dataset)
    return torch.randperm(n, generator=generator) if shuffle else torch.arange(n)


def batches(dataset, batch_size: int, *, shuffle: bool, generator: torch.Generator | None = None,
            drop_last: bool = False, num_workers: int = 0, sampler: str = "shuffle") -> Iterator[dict]:
    """Mini-batches of dicts. ``sampler``: ``shuffle`` = a permutation per pass (if ``shuffle``);
    ``class_balanced`` = one pass of :func:`class_balanced_order` (sampling with replacement).

    Cached features are sliced directly. Images are loaded item by item, each under its own seed
    drawn here after the order (:mod:`fedrepro.fl.loader`), so augmentations are the same whichever
    process - the job's loader pool, a one-off loader with ``num_workers``, or this one - loads them."""
    n = len(dataset)
    if n == 0:
        return
    num_workers = resolve_workers(num_workers) if isinstance(num_workers, str) else num_workers
    order = pass_order(dataset, shuffle=shuffle, generator=generator, sampler=sampler)
    stop = n - n % batch_size if drop_last and n >= batch_size else n
    if isinstance(dataset, FeatureSet):
        for start in range(0, stop, batch_size):
            yield dataset.batch(order[start:start + batch_size])
        return
    seeds = torch.randint(0, 2**62, (n,), generator=generator).tolist() if generator is not None else [0] * n
    groups = [[(int(order[j]), seeds[j]) for j in range(start, min(start + batch_size, stop))]
              for start in range(0, stop, batch_size)]
    pool = active_pool()
    if pool is not None and pool.knows(dataset):
        yield from pool.iterate(dataset, groups)
    elif num_workers > 0:   # a dataset the pool does not hold (e.g. a view made mid-run): a one-off loader
        from torch.utils.data import DataLoader

        items = SeededItems(dataset)
        yield from DataLoader(items, batch_sampler=[[(p, s) for p, s in g] for g in groups], num_workers=num_workers,
                              collate_fn=collate)
    else:
        for group in groups:
            with kept_rng_state():   # item seeds must not touch the training loop's own random stream
                items = load_items(dataset, group)
            yield collate(items)


def local_batches(dataset, train: dict, seed: int, rnd: int, client: int) -> Iterator[dict]:
    """One round of local work: ``local.epochs`` passes, or exactly ``local.steps`` mini-batches drawn
    from an endlessly reshuffled loader (the authors' 'infinite loader' for BT). Each pass has its own
    shuffling stream keyed by (seed, round, client, pass), so a resumed run sees the same batches.
    ``local.sampler: class_balanced`` draws each pass with replacement, weight 1 / class count."""
    local = train["local"]
    size, drop_last = train["batch_size"], local.get("drop_last", False)
    workers = train.get("num_workers", 0)
    sampler = local.get("sampler", "shuffle")

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


def make_optimizer(params: Iterable, cfg: dict) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    name, lr, wd = cfg["name"], cfg["lr"], cfg.get("weight_decay", 0.0)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=tuple(cfg.get("betas", (0.9, 0.999))), eps=cfg.get("eps", 1e-8), weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.get("betas", (0.9, 0.999))), eps=cfg.get("eps", 1e-8), weight_decay=wd)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.get("momentum", 0.0), weight_decay=wd)
    raise ValueError(f"unknown optimizer {name!r}; allowed: adam, adamw, sgd")


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda was requested but no CUDA device is visible to this job")
    return torch.device(name)
