"""FedAdapterProto's site split and, as an explicitly named option, the authors' faulty indexing of
it (docs/papers/fedadapterproto.md).

Sites are ranked by their number of images (ties by name), unless ``sources`` lists them in order;
rows without a site (source "") belong to none. The first ``clients`` sites become one training
client each (each then split train/val by ``ratios``, 80/20 in the paper) and the next one is held
out as the global test set: with ``clients: 4`` that is "the five most frequent sites, four for
training and the fifth for testing".

``sites``: correct - every client holds exactly the rows of its site, the test set is the fifth site.

``sites_authors_index``: what the official code does (``lib/sampling.py::fundus_noniid``): the
positions of each site's rows are taken in a frame *filtered* to the training sites (re-indexed from
0) and the test positions in a frame filtered to the test site, and both are then used as rows of the
*unfiltered* table - the authors' metadata table in its file order (after the image-set, field,
quality and grade filters as their exact string comparisons, rows without a site included), which the
manifest keeps as the column ``metadata_row``. The splitter sees the pool in that order, and only the rows
of that table (``pool_order``, ``pool_order_only``: a row the forgiving filters of the manifest keep but the
authors' exact ones drop would shift every position after it; a manifest without the column, e.g. the demo
twin, keeps its own order and rows). The clients therefore get the first
``sum(n_train_sites)`` rows of the table regardless of their site, and the "test site" gets rows
``0 .. n_test - 1``, all of which are also training or validation rows of some client: the test set
leaks into training and the site heterogeneity disappears. Offered only to reproduce the published
numbers' protocol. The split file says so: its ``declared_overlaps`` lists the held-out rows' overlap with
the clients (global test, and the reference set if one is carved from them), which the training run's
disjointness check then lets through; every other overlap still stops the run.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...registry import splitter
from ..partition import Partition, SplitError


def ranked_sites(sources: np.ndarray, spec: dict) -> list[str]:
    """Training sites then the held-out site: ``spec['sources']`` in order, or all sites by count."""
    counts = Counter(site for site in sources.tolist() if site != "")
    named = spec.get("sources")
    if named:
        unknown = sorted(set(named) - set(counts))
        if unknown:
            raise SplitError(f"sites: sources {unknown} are not in the pool; available: {sorted(counts)}")
        return list(named)
    return sorted(counts, key=lambda site: (-counts[site], site))


def site_plan(sources: np.ndarray, spec: dict) -> tuple[list[str], str]:
    """-> (the ``clients`` training sites, the held-out test site)."""
    if "clients" not in spec:
        raise SplitError(f"split kind {spec['kind']!r} needs 'clients' (the number of training sites)")
    n = spec["clients"]
    sites = ranked_sites(sources, spec)
    if len(sites) < n + 1:
        raise SplitError(f"split kind {spec['kind']!r} with clients: {n} needs {n + 1} sites (the last one is held "
                         f"out for testing); the pool has {len(sites)}: {sites}")
    return sites[:n], sites[n]


@splitter("sites")
def split_sites(labels, sources, spec, rng) -> Partition:
    train_sites, test_site = site_plan(sources, spec)
    return Partition([np.flatnonzero(sources == site) for site in train_sites], np.flatnonzero(sources == test_site))


@splitter("sites_authors_index")
def split_sites_authors_index(labels, sources, spec, rng) -> Partition:
    """The pool arrives in the authors' table order (``pool_order``); positions index it."""
    train_sites, test_site = site_plan(sources, spec)
    filtered = sources[np.isin(sources, train_sites)]             # the frame filtered to the training sites ...
    clients = [np.flatnonzero(filtered == site) for site in train_sites]   # ... positions in it, re-indexed from 0
    held_out = np.arange(int((sources == test_site).sum()))       # positions in the frame of the test site
    reason = ("sites_authors_index reproduces the authors' indexing (lib/sampling.py::fundus_noniid): the held-out "
              "'test site' is the first rows of the table, which are also rows of the training clients")
    held_parts = ["global_test"] + (["reference"] if float(spec.get("reference_fraction", 0)) > 0 else [])
    overlaps = [{"parts": [part, "clients"], "reason": reason} for part in held_parts]
    return Partition(clients, held_out, overlaps)                 # both used as rows of the unfiltered pool


split_sites_authors_index.pool_order = "metadata_row"
split_sites_authors_index.pool_order_only = True    # the authors' exact filters keep only these rows
