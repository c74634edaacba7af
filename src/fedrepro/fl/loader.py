"""Feeding images to the model: one pool of loader workers per job, and augmentation that does not
depend on which process runs it.

Every item is loaded with its own seed, drawn in the main process together with the pass's order
(:func:`fedrepro.fl.local.batches`); a worker seeds python's, numpy's and torch's generators with it
before decoding and transforming the item. So a run gives the same batches - augmentations included -
with 0, 1 or 15 loader workers, on a laptop and on a cluster node, and a resumed run gives the same
numbers as an uninterrupted one.

A job trains many clients, each with several datasets; starting worker processes for every pass
costs more than a short pass itself. :class:`LoaderPool` forks its workers once, when the first
pass starts, holding every dataset of the federation, and then only sends them the (dataset, item,
seed) triples of each pass. A second pass that runs while another is unfinished (a domain-adaptation
method draws a target batch inside every training step) gets a second lane of workers.
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np
import torch

_POOL: "LoaderPool | None" = None


def seed_item(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_items(dataset, pairs: Sequence[tuple[int, int]]) -> list[dict]:
    """Items ``[(position, seed), ...]`` of ``dataset``, each transformed under its own seed."""
    items = []
    for position, seed in pairs:
        seed_item(seed)
        items.append(dataset[position])
    return items


class SeededItems:
    """``dataset`` addressed by (position, seed) pairs, for a one-off DataLoader."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> dict:
        seed_item(key[1])
        return self.dataset[key[0]]


def collate(items: list[dict]) -> dict:
    from torch.utils.data import default_collate

    return default_collate(items)


CPUS_VAR = "FEDREPRO_CPUS"   # the Snakemake rules export the job's `threads` here


def available_cpus() -> int:
    """CPUs this job may use: what the process may run on (SLURM and cgroups restrict the affinity
    mask), and at most the job's Snakemake ``threads`` when a rule exported them."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        cpus = os.cpu_count() or 1
    granted = os.environ.get(CPUS_VAR, "")
    return min(cpus, int(granted)) if granted.isdigit() and int(granted) > 0 else cpus


def resolve_workers(setting: int | str) -> int:
    """``auto``: every CPU of the job but the one that runs training; a number: that many."""
    if setting == "auto":
        return max(0, min(available_cpus() - 1, 16))
    return int(setting)


class _Registry:
    """What each worker holds: every dataset of the job, addressed by a small integer."""

    def __init__(self, datasets: dict[int, object]):
        self.datasets = datasets

    def __len__(self) -> int:   # never used for sampling (the feed decides), DataLoader only asks
        return sum(len(d) for d in self.datasets.values())

    def __getitem__(self, key: tuple[int, int, int]) -> dict:
        dataset_id, position, seed = key
        seed_item(seed)
        return self.datasets[dataset_id][position]


class _Feed:
    """A batch sampler whose batches the main process sets before every pass."""

    def __init__(self):
        self.batches: list[list[tuple[int, int, int]]] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class LoaderPool:
    """Persistent loader workers for every dataset of one job (see the module docstring)."""

    def __init__(self, datasets: Sequence, workers: int, pin_memory: bool = False, lanes: int = 2):
        self.ids: dict[int, int] = {}
        self.registry = _Registry({})
        for dataset in datasets:
            self._register(dataset)
        self.workers, self.pin_memory, self.max_lanes = workers, pin_memory, lanes
        self.lanes: list[tuple[object, _Feed]] = []
        self.busy: set[int] = set()

    def knows(self, dataset) -> bool:
        """Whether the pool loads ``dataset``; datasets made before the workers start (a pooled
        "centralized" client, ...) join it, later ones are loaded elsewhere."""
        if self.workers == 0:
            return False
        if id(dataset) not in self.ids and not self.lanes:
            self._register(dataset)
        return id(dataset) in self.ids

    def _register(self, dataset) -> None:
        # the registry holds a reference, so no other object can take this id() while the pool lives
        self.ids[id(dataset)] = len(self.registry.datasets)
        self.registry.datasets[self.ids[id(dataset)]] = dataset

    def _lane(self) -> int | None:
        from torch.utils.data import DataLoader

        for lane in range(len(self.lanes)):
            if lane not in self.busy:
                return lane
        if len(self.lanes) >= self.max_lanes:
            return None
        feed = _Feed()
        loader = DataLoader(self.registry, batch_sampler=feed, num_workers=self.workers, collate_fn=collate,
                            pin_memory=self.pin_memory, persistent_workers=True)
        self.lanes.append((loader, feed))
        return len(self.lanes) - 1

    def iterate(self, dataset, batches: list[list[tuple[int, int]]]) -> Iterator[dict]:
        lane = self._lane()
        if lane is None:   # every lane is mid-pass: load this pass in the main process
            for pairs in batches:
                yield collate(load_items(dataset, pairs))
            return
        loader, feed = self.lanes[lane]
        key = self.ids[id(dataset)]
        feed.batches = [[(key, position, seed) for position, seed in pairs] for pairs in batches]
        self.busy.add(lane)
        try:
            yield from loader
        finally:
            self.busy.discard(lane)

    def close(self) -> None:
        for loader, _ in self.lanes:
            iterator = getattr(loader, "_iterator", None)
            if iterator is not None:
                iterator._shutdown_workers()
        self.lanes.clear()


@contextmanager
def loader_pool(datasets: Sequence, workers: int, pin_memory: bool = False) -> Iterator[LoaderPool]:
    """Make a :class:`LoaderPool` over ``datasets`` the one :func:`fedrepro.fl.local.batches` uses."""
    global _POOL
    previous, _POOL = _POOL, LoaderPool([d for d in datasets if d is not None], workers, pin_memory)
    try:
        yield _POOL
    finally:
        _POOL.close()
        _POOL = previous


def active_pool() -> LoaderPool | None:
    return _POOL
