"""What the simulated federation holds: per-client train/val/test data, the global test set, the
unlabeled reference (domain-adaptation target) set and an optional external evaluation set (e.g.
another dataset), built from a manifest and a split file.

Datasets yield dicts ``{"x": input, "y": label, "index": manifest row}``. Unlabeled sets yield
``y = -1`` so no method can use their labels by accident.

Before a run trains, :func:`check_disjoint` asserts that the index sets it is given are disjoint: every
client's train/val/test, the clients among themselves, the global test set, the reference set and the
external set. Only overlaps the split file declares (``declared_overlaps``, written by a splitter that
reproduces an overlap on purpose) and the one the protocol declares (``paper``, or ``clean`` with
``allow_test_selection`` on a split without reference set: the unlabeled target *is* the global test set)
pass; any other stops the run, naming the parts and the manifest rows they share.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..data.loader import FeatureSet
from ..data.partition import Split, SplitError, task_labels

UNLABELED = -1


@dataclass
class ClientData:
    name: str
    index: int
    train: object
    val: object
    test: object


@dataclass
class Federation:
    clients: list[ClientData]
    global_test: object | None
    reference: object | None            # unlabeled target-domain images (labels hidden)
    class_names: list[str]              # in label order, as a CLIP prompt says them (DatasetSpec.class_texts)
    extras: dict = field(default_factory=dict)   # e.g. frozen text features of the class prompts
    external: object | None = None      # labelled external evaluation set (never trained on)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def federation_datasets(fed: Federation) -> list:
    """Every dataset of a federation (clients' train/val/test, global test, reference, external)."""
    parts = [d for c in fed.clients for d in (c.train, c.val, c.test)] + [fed.global_test, fed.reference, fed.external]
    return [d for d in parts if d is not None]


def target_rows(split: Split, protocol: str, allow_test: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """-> (global test rows, unlabeled reference rows) under a protocol.

    clean: the reference set is the part of the global set split off for it; the rest is tested. With
    ``allow_test`` (``allow_test_selection: true``) a split without reference set uses the global test
    set as the unlabeled target.
    paper: like the authors' code, the whole global set is both the unlabeled target and the test.
    """
    if protocol == "paper":
        everything = np.sort(np.concatenate([split.global_test, split.reference]))
        return everything, everything
    if target_is_test(split, protocol, allow_test):
        return split.global_test, split.global_test
    return split.global_test, split.reference


def target_is_test(split: Split, protocol: str, allow_test: bool = False) -> bool:
    """Whether the unlabeled target of :func:`target_rows` is the global test set itself (declared by the
    protocol: ``paper``, or ``clean`` with the opt-in on a split without reference set)."""
    return protocol == "paper" or (allow_test and not len(split.reference))


class SplitOverlap(SplitError):
    """A run's index sets overlap where its split does not declare it."""


def _group(part: str) -> str:
    """The name a split's ``declared_overlaps`` uses for a part: every client part is ``clients``."""
    return part if part in ("global_test", "reference", "external") else "clients"


def check_disjoint(split: Split, protocol: str, allow_test: bool = False, where: str = "split",
                   examples: int = 5) -> None:
    """Raise :class:`SplitOverlap` unless the index sets a run trains and tests on are disjoint, apart
    from the overlaps the split declares and the protocol's target (see the module docstring)."""
    test_rows, ref_rows = target_rows(split, protocol, allow_test)
    sets = {f"{name}/{part}": np.asarray(rows, dtype=np.int64)
            for name, parts in sorted(split.clients.items(), key=lambda kv: client_order(kv[0]))
            for part, rows in parts.items()}
    sets["global_test"] = np.asarray(test_rows, dtype=np.int64)
    if not target_is_test(split, protocol, allow_test):   # else the target IS the global test set
        sets["reference"] = np.asarray(ref_rows, dtype=np.int64)
    sets["external"] = np.asarray(split.external, dtype=np.int64)
    allowed = {frozenset(d["parts"]) for d in split.declared_overlaps}

    def declared(a: str, b: str) -> bool:
        return frozenset({_group(a), _group(b)}) in allowed

    problems = [f"{name} lists {len(rows) - len(np.unique(rows))} row(s) twice"
                for name, rows in sets.items() if len(rows) != len(np.unique(rows))]
    everything = np.concatenate(list(sets.values())) if sets else np.zeros(0, dtype=np.int64)
    values, counts = np.unique(everything, return_counts=True)
    shared = values[counts > 1]
    if len(shared):
        members = {name: np.intersect1d(rows, shared) for name, rows in sets.items()}
        holding = [name for name in sets if len(members[name])]
        for a, b in combinations(holding, 2):
            common = np.intersect1d(members[a], members[b], assume_unique=True)
            if len(common) and not declared(a, b):
                shown = ", ".join(str(r) for r in common[:examples]) + (", ..." if len(common) > examples else "")
                problems.append(f"{a} and {b} share {len(common)} row(s) (manifest rows {shown})")
    if problems:
        listed = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise SplitOverlap(
            f"{where}: the run's index sets overlap: {listed}. Train, validation and test parts, the clients, the "
            f"global test, reference and external sets must be disjoint unless the split declares the overlap "
            f"(declared_overlaps: {sorted(sorted(p) for p in allowed) or 'none'}). Nothing was trained. A split file "
            f"written by an older version lacks the declarations of splitters that overlap on purpose: rebuild it "
            f"(snakemake --cores all --force {where}).")


def build_feature_federation(split: Split, protocol: str, cache: dict, class_names: list[str],
                             allow_test: bool = False, classes: list[int] | None = None) -> Federation:
    """``class_names``: the dataset's prompts; ``classes``: the dataset labels the task keeps (None: all)."""
    features = cache["image"].float()
    labels = torch.as_tensor(task_labels(cache["labels"], classes), dtype=torch.long)
    text = cache["text"].float()
    if classes is not None:
        text, class_names = text[list(classes)], [class_names[c] for c in classes]

    def subset(rows: np.ndarray, labelled: bool = True) -> FeatureSet:
        rows = np.asarray(rows, dtype=np.int64)
        y = labels[rows] if labelled else torch.full((len(rows),), UNLABELED, dtype=torch.long)
        return FeatureSet(features[rows], y, rows)

    test_rows, ref_rows = target_rows(split, protocol, allow_test)
    clients = [ClientData(name, i, subset(p["train"]), subset(p["val"]), subset(p["test"]))
               for i, (name, p) in enumerate(sorted(split.clients.items(), key=lambda kv: client_order(kv[0])))]
    return Federation(
        clients=clients,
        global_test=subset(test_rows) if len(test_rows) else None,
        reference=subset(ref_rows, labelled=False) if len(ref_rows) else None,
        class_names=class_names,
        extras={"text_features": text},
        external=subset(split.external) if len(split.external) else None,
    )


def build_image_federation(split: Split, protocol: str, manifest, raw_root: str | Path, class_names: list[str],
                           train_transform: Callable, eval_transform: Callable, extra_columns=(),
                           caches: dict | None = None, draft: bool = True, allow_test: bool = False,
                           classes: list[int] | None = None, pixels: str = "authors") -> Federation:
    """Image datasets for every part of the split (labels and ``class_names`` of the task's ``classes``, the
    dataset labels it keeps; None: all). Training (and unlabeled reference) rows go through
    ``train_transform``, the rest through ``eval_transform``; each pipeline's images are decoded at
    its first resize (:func:`fedrepro.data.decode.spec_of` for the ``pixels`` pipeline, JPEG DCT scaling if ``draft``), read
    from ``caches[part]`` (decode-once caches, part = "train" / "eval") when given, else from the
    original files."""
    from ..data.decode import spec_of
    from ..data.images import ManifestImages

    paths = manifest["path"].tolist()
    labels = task_labels(manifest["label"].to_numpy(), classes)
    if classes is not None:
        class_names = [class_names[c] for c in classes]
    columns = {c: manifest[c].tolist() for c in extra_columns}
    caches = caches or {}
    pipelines = {part: (t, replace(spec_of(t, pixels), draft=draft))
                 for part, t in (("train", train_transform), ("eval", eval_transform))}

    def subset(rows, part, labelled=True):
        rows = np.asarray(rows, dtype=np.int64)
        y = labels[rows] if labelled else np.full(len(rows), UNLABELED)
        extra = {c: [values[r] for r in rows] for c, values in columns.items()}
        transform, spec = pipelines[part]
        return ManifestImages(raw_root, [paths[r] for r in rows], y, rows, transform, extra,
                              decode=spec, cache=caches.get(part))

    test_rows, ref_rows = target_rows(split, protocol, allow_test)
    clients = [ClientData(name, i, subset(p["train"], "train"), subset(p["val"], "eval"), subset(p["test"], "eval"))
               for i, (name, p) in enumerate(sorted(split.clients.items(), key=lambda kv: client_order(kv[0])))]
    return Federation(
        clients=clients,
        global_test=subset(test_rows, "eval") if len(test_rows) else None,
        reference=subset(ref_rows, "train", labelled=False) if len(ref_rows) else None,
        class_names=class_names,
        external=subset(split.external, "eval") if len(split.external) else None,
    )


def client_order(name: str) -> tuple:
    # client2 < client10: numeric order, so "sorted client order" means what people expect
    digits = "".join(ch for ch in name if ch.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else -1, name)
