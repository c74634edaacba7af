"""FedIIC's client sampler: CReFF's Dirichlet sampler with its final equal-size re-cut, as the FedIIC
code (``utils/sample_dirichlet.py``, taken from CReFF) runs it (docs/papers/fediic.md).

1. list the pool's positions class by class (CReFF's ``classify_label``: class 0's positions in
   order, then class 1's, ...) and shuffle that list;
2. cut it into groups of at most ``group_size`` (10) workers: every group but the last takes the next
   ``int(group_size / clients * n)`` positions (truncated, as the code's ``int()``), the last group
   the rest;
3. within a group of n workers holding M samples, for every class (0 .. max label, present or not:
   the code draws for every class) draw proportions p ~ Dir(alpha 1_n), set to 0 the proportion of
   every worker that already holds >= M / n samples, renormalise, and cut the class's samples at the
   cumulative proportions; redraw the whole group until every worker holds at least
   int(M / (2n)) samples;
4. concatenate all workers' lists in order and re-cut the concatenation into ``clients`` contiguous
   chunks of equal size (the first len % clients one longer).

The final clients are equal-sized and only approximately follow the Dirichlet draws: the
heterogeneity is that of the draws, the sizes are balanced. The generic per-class Dirichlet of
:mod:`fedrepro.data.partition` (``kind: dirichlet``) is the alternative. When every worker of a group
is full before a class is placed (all proportions zeroed), that class is spread with equal
proportions (the original code would divide by zero here).

Kind ``creff`` runs the sampler on whatever pool the split leaves (for FedIIC's settings: what is left
after a stratified 20 % global test set), with a random stream derived from the split seed: the same
algorithm, but not the authors' clients. Kind ``fediic_code`` reproduces the authors' clients exactly
(``dataset/dataset.py::SkinDataset`` and ``train_FedIIC.py``): the ground-truth CSV in its own row order
(manifest column ``truth_row``), permuted by ``np.random.seed(0)``; the first 70 % of the permutation
is the training set, the next 10 % the validation set and the last 20 % the test set; the sampler
runs on the training set's labels in permutation order with ``np.random.RandomState(seed)``, ``seed`` =
the split's partition seed (the code's ``--seed``, 0 by default; the grid sets ``partition_seed: run``, so
the clients follow the run seed as the code's do); the permutation seed is fixed at 0 in the code whatever
``--seed`` is. The code's
validation set is one global set; here it is cut into ``clients`` contiguous chunks that become the
clients' validation parts, so that their union - what ``selection.validation: pooled`` scores - is
the code's validation set.
"""

from __future__ import annotations

import numpy as np

from ...registry import splitter
from ..partition import Partition, SplitError

MAX_GROUP_DRAWS = 1000


def group_sizes(n_clients: int, group_size: int) -> list[int]:
    """Workers per group: full groups of ``group_size`` and the remainder last."""
    full, rest = divmod(n_clients, group_size)
    return [group_size] * full + ([rest] if rest else [])


def dirichlet_group(labels: np.ndarray, members: np.ndarray, n_workers: int, alpha: float,
                    rng: np.random.Generator) -> list[np.ndarray]:
    """Step 3 for one group: ``members`` (pool positions, in shuffled order) -> one array per worker."""
    total = len(members)
    cap = total / n_workers
    for _ in range(MAX_GROUP_DRAWS):
        workers: list[list[int]] = [[] for _ in range(n_workers)]
        for c in range(int(labels.max()) + 1 if len(labels) else 0):
            idx = members[labels[members] == c]
            p = rng.dirichlet(np.full(n_workers, alpha))
            p = p * np.array([len(w) < cap for w in workers])
            p = p / p.sum() if p.sum() > 0 else np.full(n_workers, 1.0 / n_workers)
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for w, chunk in zip(workers, np.split(idx, cuts)):
                w.extend(chunk.tolist())
        if min(len(w) for w in workers) >= int(0.5 * total / n_workers):
            return [np.asarray(w, dtype=int) for w in workers]
    raise SplitError(f"creff: no Dirichlet draw (alpha={alpha}) gave every one of {n_workers} workers at least "
                     f"half the mean size in {MAX_GROUP_DRAWS} tries; use a larger alpha or fewer clients")


def equal_recut(parts: list[np.ndarray], n_clients: int) -> list[np.ndarray]:
    """Step 4: concatenate and cut into ``n_clients`` contiguous chunks; the first (len % n) are one longer."""
    joined = np.concatenate(parts) if parts else np.zeros(0, dtype=int)
    return [np.asarray(chunk, dtype=int) for chunk in np.array_split(joined, n_clients)]


@splitter("creff")
def split_creff(labels, sources, spec, rng):
    n_clients, alpha = spec["clients"], float(spec["alpha"])
    group_size = int(spec.get("group_size", 10))
    by_class = np.argsort(labels, kind="stable")          # classify_label: positions class by class
    order = by_class[rng.permutation(len(labels))]
    sizes = group_sizes(n_clients, group_size)
    parts: list[np.ndarray] = []
    start, step = 0, int(group_size / n_clients * len(order))    # the code's int(), not round()
    for g, n_workers in enumerate(sizes):
        stop = len(order) if g == len(sizes) - 1 else start + step
        parts += dirichlet_group(labels, order[start:stop], n_workers, alpha, rng)
        start = stop
    return [np.sort(part) for part in equal_recut(parts, n_clients)]


# the authors' data split (dataset/dataset.py::SkinDataset.__init__): np.random.seed(0) whatever --seed,
# then [:0.7 n] train, [0.7 n:0.8 n] validation, [0.8 n:] test
CODE_PERMUTATION_SEED, CODE_TRAIN_END, CODE_VAL_END = 0, 0.7, 0.8


@splitter("fediic_code")
def split_fediic_code(labels, sources, spec, rng):
    """The authors' clients, validation and test sets (see the module docstring); ``rng`` is
    ``numpy.random.RandomState(partition seed)``, the code's ``RandomState(args.seed)``."""
    if spec.get("global_test", "none") != "none" or spec.get("subset") or spec.get("external") \
            or float(spec.get("reference_fraction", 0)) > 0:
        raise SplitError("fediic_code cuts its own test set from the whole dataset: set global_test: none, and no "
                         "subset, external or reference_fraction")
    n = len(labels)
    order = np.random.RandomState(CODE_PERMUTATION_SEED).permutation(n)
    train, val, test = order[:int(CODE_TRAIN_END * n)], order[int(CODE_TRAIN_END * n):int(CODE_VAL_END * n)], \
        order[int(CODE_VAL_END * n):]
    clients = split_creff(labels[train], sources[train], spec, rng)
    validation = np.array_split(val, spec["clients"])
    return Partition([{"train": train[c], "val": v} for c, v in zip(clients, validation)], held_out=test)


split_fediic_code.pool_order = "truth_row"          # the ground-truth CSV's row order
split_fediic_code.pool_order_required = True
split_fediic_code.legacy_rng = True
