"""Mini-batches for training and evaluation: cached features sliced directly, images loaded by one
pool of worker processes per job, with augmentation that does not depend on which process runs it.

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
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from ..io import BrokenFile
from ..seeding import kept_rng_state

_POOL: "LoaderPool | None" = None


@dataclass(frozen=True)
class ItemState:
    """The random states a recorded run's item transform started from (python's, numpy's and torch's CPU
    generator, as ``random.getstate()``, ``np.random.get_state()`` and ``torch.get_rng_state()`` give them): a
    replay (``run["replay"]``, :mod:`fedrepro.fl.replay`) loads the item under them instead of under a seed, and so
    draws the augmentation the recorded run drew, provided its transform draws the same numbers in the same order."""

    python: tuple
    numpy: tuple
    torch: bytes

    def apply(self) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.default_generator.set_state(torch.frombuffer(bytearray(self.torch), dtype=torch.uint8))


def seed_item(seed: int | ItemState) -> None:
    """Seed the RNGs an item's transform draws from: python, numpy and torch's CPU generator (or set them to a
    recorded :class:`ItemState`).

    Only the CPU generator: transforms run on the CPU, and ``torch.manual_seed`` would also seed every
    accelerator, which before CUDA is initialised (CPU jobs, loader workers) records a formatted stack
    trace on every call - about 1 ms an item, half the loading time of small images."""
    if isinstance(seed, ItemState):
        seed.apply()
        return
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)


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
            yield from from_workers(loader)
        finally:
            self.busy.discard(lane)

    def close(self) -> None:
        for loader, _ in self.lanes:
            iterator = getattr(loader, "_iterator", None)
            if iterator is not None:
                iterator._shutdown_workers()
        self.lanes.clear()


def from_workers(loader) -> Iterator[dict]:
    """The batches of a DataLoader whose workers may find a damaged file (an image cache row whose CRC-32 does not
    match): torch re-raises the worker's :class:`~fedrepro.io.BrokenFile` with the worker's traceback as its text;
    it is raised again with the message alone, which names the file and the command that rebuilds it."""
    try:
        yield from loader
    except BrokenFile as error:
        text, marker = str(error), f"{type(error).__name__}: "
        if "Original Traceback" not in text or marker not in text:
            raise
        raise BrokenFile(text[text.rindex(marker) + len(marker):].strip()) from None


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


# --------------------------------------------------------------------------------------------
# datasets and passes

class FeatureSet:
    """Rows of a cached feature matrix; supports fast batch slicing (see :func:`fl.local.batches`)."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, rows: np.ndarray):
        self.features, self.labels, self.rows = features, labels, torch.as_tensor(rows, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, positions: torch.Tensor) -> dict:
        return {"x": self.features[positions], "y": self.labels[positions], "index": self.rows[positions]}

    def __getitem__(self, i: int) -> dict:
        return {"x": self.features[i], "y": int(self.labels[i]), "index": int(self.rows[i])}


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
    drawn here after the order (see the module docstring), so augmentations are the same whichever
    process - the job's loader pool, a one-off loader with ``num_workers``, or this one - loads them.
    Without a ``generator`` every item is loaded under seed 0: right for deterministic (evaluation)
    transforms only; a pass over augmented images passes one (e.g. ``methods._common.imbalance.outputs_over``),
    or every image would get the same crop and RandAugment draw."""
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
    yield from load_groups(dataset, groups, num_workers)


def replayed_batches(dataset, plan: list[list[tuple[int, ItemState]]], num_workers: int = 0) -> Iterator[dict]:
    """The mini-batches a recorded run drew (``plan``: per batch, its items' positions in ``dataset`` and the random
    states each item's transform started from), loaded as :func:`batches` loads its own."""
    if isinstance(dataset, FeatureSet):
        raise ValueError("a recorded pass replays image items; this dataset holds cached features")
    yield from load_groups(dataset, plan, resolve_workers(num_workers) if isinstance(num_workers, str) else num_workers)


def load_groups(dataset, groups: list[list[tuple[int, int | ItemState]]], num_workers: int) -> Iterator[dict]:
    """Collated batches of ``(position, seed or recorded state)`` groups: from the job's loader pool when it holds
    ``dataset``, a one-off loader with ``num_workers``, or this process."""
    pool = active_pool()
    if pool is not None and pool.knows(dataset):
        yield from pool.iterate(dataset, groups)
    elif num_workers > 0:   # a dataset the pool does not hold (e.g. a view made mid-run): a one-off loader
        from torch.utils.data import DataLoader

        items = SeededItems(dataset)
        yield from from_workers(DataLoader(items, batch_sampler=[[(p, s) for p, s in g] for g in groups],
                                           num_workers=num_workers, collate_fn=collate))
    else:
        for group in groups:
            with kept_rng_state():   # item seeds must not touch the training loop's own random stream
                items = load_items(dataset, group)
            yield collate(items)


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
