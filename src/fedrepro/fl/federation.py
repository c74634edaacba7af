"""What the simulated federation holds: per-client train/val/test data, the global test set, the
unlabeled reference (domain-adaptation target) set and an optional external evaluation set (e.g.
another dataset), built from a manifest and a split file.

Datasets yield dicts ``{"x": input, "y": label, "index": manifest row}``. Unlabeled sets yield
``y = -1`` so no method can use their labels by accident.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..data.loader import FeatureSet
from ..data.partition import Split

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
    class_names: list[str]
    extras: dict = field(default_factory=dict)   # e.g. frozen text features of the class prompts
    external: object | None = None      # labelled external evaluation set (never trained on)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def federation_datasets(fed: Federation) -> list:
    """Every dataset of a federation (clients' train/val/test, global test, reference, external)."""
    parts = [d for c in fed.clients for d in (c.train, c.val, c.test)] + [fed.global_test, fed.reference, fed.external]
    return [d for d in parts if d is not None]


def target_rows(split: Split, protocol: str) -> tuple[np.ndarray, np.ndarray]:
    """-> (global test rows, unlabeled reference rows) under a protocol.

    clean: the reference set is the part of the global set split off for it; the rest is tested.
    paper: like the authors' code, the whole global set is both the unlabeled target and the test.
    """
    if protocol == "paper":
        everything = np.sort(np.concatenate([split.global_test, split.reference]))
        return everything, everything
    return split.global_test, split.reference


def build_feature_federation(split: Split, protocol: str, cache: dict, class_names: list[str]) -> Federation:
    features = cache["image"].float()
    labels = torch.as_tensor(cache["labels"], dtype=torch.long)

    def subset(rows: np.ndarray, labelled: bool = True) -> FeatureSet:
        rows = np.asarray(rows, dtype=np.int64)
        y = labels[rows] if labelled else torch.full((len(rows),), UNLABELED, dtype=torch.long)
        return FeatureSet(features[rows], y, rows)

    test_rows, ref_rows = target_rows(split, protocol)
    clients = [ClientData(name, i, subset(p["train"]), subset(p["val"]), subset(p["test"]))
               for i, (name, p) in enumerate(sorted(split.clients.items(), key=lambda kv: client_order(kv[0])))]
    return Federation(
        clients=clients,
        global_test=subset(test_rows) if len(test_rows) else None,
        reference=subset(ref_rows, labelled=False) if len(ref_rows) else None,
        class_names=class_names,
        extras={"text_features": cache["text"].float()},
        external=subset(split.external) if len(split.external) else None,
    )


def build_image_federation(split: Split, protocol: str, manifest, raw_root: str | Path, class_names: list[str],
                           train_transform: Callable, eval_transform: Callable, extra_columns=(),
                           caches: dict | None = None, draft: bool = True) -> Federation:
    """Image datasets for every part of the split. Training (and unlabeled reference) rows go through
    ``train_transform``, the rest through ``eval_transform``; each pipeline's images are decoded at
    its first resize (:func:`fedrepro.data.decode.spec_of`, JPEG DCT scaling if ``draft``), read
    from ``caches[part]`` (decode-once caches, part = "train" / "eval") when given, else from the
    original files."""
    from ..data.decode import spec_of
    from ..data.images import ManifestImages

    paths = manifest["path"].tolist()
    labels = manifest["label"].to_numpy()
    columns = {c: manifest[c].tolist() for c in extra_columns}
    caches = caches or {}
    pipelines = {part: (t, replace(spec_of(t), draft=draft)) for part, t in (("train", train_transform), ("eval", eval_transform))}

    def subset(rows, part, labelled=True):
        rows = np.asarray(rows, dtype=np.int64)
        y = labels[rows] if labelled else np.full(len(rows), UNLABELED)
        extra = {c: [values[r] for r in rows] for c, values in columns.items()}
        transform, spec = pipelines[part]
        return ManifestImages(raw_root, [paths[r] for r in rows], y, rows, transform, extra,
                              decode=spec, cache=caches.get(part))

    test_rows, ref_rows = target_rows(split, protocol)
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
