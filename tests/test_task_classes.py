"""A setting that keeps a subset of its dataset's classes is a task over exactly those classes.

Found through the demo (issue 27): FAA-CLIP's demo twin keeps 5 of Fashion-MNIST's 10 classes, but every model
scored all 10 class prompts; the rotated client's images (a 90-degree turn makes clothes wide) were predicted as
"sneaker" and "bag", two classes the task does not have, so every frozen-text method sat at 1-2% on that client,
far below the 20% of chance."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from fedrepro.data.partition import count_table, make_split, task_classes, task_labels
from fedrepro.io import sha256_file, torch_save, write_json
from fedrepro.registry import dataset

CLASSES = list(dataset("demo_domains").classes)       # t-shirt, trouser, ..., ankle-boot
KEPT = ["trouser", "dress", "bag"]


def manifest(per_class: int = 12) -> pd.DataFrame:
    rows = [{"path": f"{c}/{i}.png", "label": label, "class_name": c, "source": "original", "split": ""}
            for label, c in enumerate(CLASSES) for i in range(per_class)]
    return pd.DataFrame(rows)


SPEC = {"kind": "iid", "clients": 2, "subset": {"classes": KEPT}, "global_test": {"fraction": 0.25},
        "ratios": {"train": 0.6, "val": 0.2, "test": 0.2}}


def test_the_task_classes_are_the_subset_in_label_order():
    assert task_classes(CLASSES, SPEC) == [1, 3, 8]
    assert task_classes(CLASSES, {"kind": "iid"}) == list(range(10))
    assert task_labels(np.array([8, 1, 3, 1]), [1, 3, 8]).tolist() == [2, 0, 1, 0]
    assert task_labels(np.array([8, 1]), None).tolist() == [8, 1]


def test_split_counts_show_only_the_task_classes():
    frame = manifest()
    split = make_split(frame, SPEC, seed=0)
    counts = count_table(split, frame, KEPT, task_classes(CLASSES, SPEC))
    assert [c for c in counts.columns if c in CLASSES] == KEPT
    counted = counts[KEPT].sum(axis=1)          # every counted image is one of the kept classes
    assert (counted == counts["train"].where(counts["client"] != "global_test", counts["test"])).all()


def test_a_run_on_a_class_subset_scores_only_its_classes(tmp_path):
    """Through the training job's loader (fedrepro.train.load_federation), the feature path: the federation's
    labels are 0..K-1, its class prompts and text features are the kept classes' only."""
    from fedrepro.data.partition import split_id_of
    from fedrepro.train import load_federation

    frame = manifest()
    manifest_file = tmp_path / "manifest.csv"
    frame.to_csv(manifest_file, index=False)
    split = make_split(frame, SPEC, seed=0)
    split_file = tmp_path / "split.json"
    write_json(split_file, {"dataset": "demo_domains", "spec": SPEC, "seed": 0,
                            "manifest_sha256": sha256_file(manifest_file), **split.to_json()})
    texts = list(dataset("demo_domains").class_texts)
    text = torch.arange(10, dtype=torch.float32)[:, None].repeat(1, 4)       # row c holds c: which rows are kept shows
    cache_file = tmp_path / "features.pt"
    torch_save(cache_file, {"image": torch.randn(len(frame), 4), "text": text,
                            "labels": torch.tensor(frame["label"].to_numpy().copy()), "paths": frame["path"].tolist(),
                            "class_names": texts, "encoder": {}, "manifest_sha256": sha256_file(manifest_file)})
    run = {"dataset": "demo_domains", "protocol": "clean", "input": "features", "train": {},
           "split_id": split_id_of("demo_domains", SPEC, 0),      # the split file is the run's own (train checks it)
           "features": {"encoder": {}},                           # ... and so is the cache's encoder
           "paths": {"manifest": str(manifest_file), "split": str(split_file), "features": str(cache_file)}}
    fed, _ = load_federation(run)
    assert fed.num_classes == 3
    assert fed.class_names == [texts[1], texts[3], texts[8]]
    assert fed.extras["text_features"][:, 0].tolist() == [1.0, 3.0, 8.0]
    labels = torch.cat([part.labels for c in fed.clients for part in (c.train, c.val, c.test)] + [fed.global_test.labels])
    assert set(labels.tolist()) == {0, 1, 2}
