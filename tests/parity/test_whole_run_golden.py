"""Whole-run parity against the committed golden records (docs/parity.md), without the authors' code.

A golden record is what ``fedrepro parity <paper> --authors <checkout> --save`` kept of the authors' own,
unmodified training run: the replay inputs (every local batch and method pass, each item with the random states its
augmentation started from), their per-step losses and terms, the server's messages, the validation metric, and their
weights at a fixed sample of positions. The fixture, the stand-in checkpoint and the first global model are rebuilt
here from seeds and must match the recorded digests.

- fast: the rebuilt inputs match; fedrepro's split gives every client the authors' images; and fedrepro's training
  transform, loading each recorded item under its recorded states, produces the authors' two augmented views bit for
  bit (their SHA-256, taken by the recorder from what the authors' ``__getitem__`` returned).
- the parity check itself (about 10 s on one core, so not ``slow``: it is what fails when parity breaks): the
  server's first message (per-class losses of the global model over every client's recorded images, the prototypes)
  and client 0's first local update replayed as the train job makes them, against the authors' (the loss and each
  term at every step, the weights at the record's sampled positions against their drift). The whole two rounds:
  ``fedrepro parity fediic --golden tests/data/parity/fediic`` (minutes).
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import pytest
import torch

from fedrepro import paths
from fedrepro.data.loader import seed_item
from fedrepro.parity import fediic
from fedrepro.train import load_federation, read_replay

from .harness import ROOT

GOLDEN = ROOT / paths.parity_record("fediic")
CONFIG = str(ROOT / "config/config.yaml")


@pytest.fixture(scope="module")
def fediic_inputs(tmp_path_factory):
    work = tmp_path_factory.mktemp("fediic-golden")
    inputs, expected, arrays, initial = fediic.golden_inputs(GOLDEN, work)      # checks the three digests
    run, _ = fediic.fedrepro_run(CONFIG, inputs, {"initial_model": str(initial), "layout": "fediic",
                                                  "record": str(GOLDEN)}, logging.getLogger("test"))
    return inputs, expected, run


def test_the_golden_record_says_where_it_comes_from(fediic_inputs):
    _, expected, _ = fediic_inputs
    provenance = expected["provenance"]
    assert provenance["repository"] == fediic.REPOSITORY and provenance["commit"] == fediic.COMMIT
    assert provenance["torch"] and provenance["command"].startswith("fedrepro parity fediic --authors")
    assert (GOLDEN / "states.npz").stat().st_size + (GOLDEN / "weights.npz").stat().st_size < 4_000_000


def test_fedrepro_splits_the_fixture_into_the_authors_clients(fediic_inputs):
    _, expected, run = fediic_inputs
    assert fediic.partition_check(run, expected["record"]).startswith("identical (10 clients, 56 training")


def test_every_recorded_augmentation_is_the_authors(fediic_inputs):
    """wnn2000/FedIIC dataset/get_dataset.py: view 1 RandomResizedCrop(224, (0.08, 1)) + flip + ColorJitter(0.4, 0.4,
    0.4) in RandomApply(p=1) + their copy of timm's RandAugment rand-n2-m10-mstd0.5; view 2 SimCLR's. fedrepro's
    ``skin`` views (timm's RandAugment), under the states each item started from in the authors' run."""
    _, _, run = fediic_inputs
    fed, _ = load_federation(run)
    replay = read_replay(run["replay"], fed)
    import json

    passes = json.loads((GOLDEN / "passes.json").read_text())["passes"]
    checked, wrong = 0, []
    torch.set_num_threads(1)
    for entry in passes:
        if entry["purpose"] == "local" and entry["keys"][0] > 0:
            continue                                   # round 1's and the difficulty pass's items are enough
        plan = replay.plan(entry["purpose"], *entry["keys"])
        dataset = fed.clients[entry["client"]].train
        for batch, recorded in zip(plan, entry["batches"]):
            for (position, state), (path, _, digest) in zip(batch, recorded):
                seed_item(state)
                views = dataset[position]["x"]
                mine = hashlib.sha256(b"".join(v.numpy().astype(np.float32).tobytes() for v in views)).hexdigest()
                checked += 1
                if mine != digest:
                    wrong.append(path)
    assert checked == 2 * 56 and not wrong, f"{len(wrong)} of {checked} augmentations differ, e.g. {wrong[:3]}"


def test_the_first_round_of_client_0_is_the_authors(tmp_path):
    """The server's first message (the per-class losses of the global model over every client's recorded images,
    the orthogonalised prototypes) and client 0's first local update, replayed as the train job makes them, against
    the authors' (their per-step loss, DALA cross-entropy, intra- and inter-client terms; their weights at the
    record's sampled positions). The whole round: ``fedrepro parity fediic --golden tests/data/parity/fediic``."""
    log = logging.getLogger("test")
    run, expected, _ = fediic.golden_run(GOLDEN, tmp_path, CONFIG, 1, log)
    row = fediic.replay_clients(run, expected, [0], log)
    bad = fediic.TOLERANCES.failures([row], (1, 1))
    assert not bad, "\n".join([*bad, fediic.table([row], list(fediic.TERMS))])
