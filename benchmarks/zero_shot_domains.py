"""Zero-shot accuracy of the demo's composite CLIP on each demo domain, on validation images: which target domain
is within the model's reach? (FAA-CLIP's demo target is chosen on these numbers, never on the demo's test data.)

The images are Fashion-MNIST *test* images 100-199 of each class (1,000 images), which no demo or evidence dataset
contains (demo_domains is built from training images, demo_fashion's test part from test images 0-49 of each
class), each put through the four domain transforms of ``demo_domains``. Prints accuracy per domain, all 10
classes and the 5 classes of FAA-CLIP's demo twin.

    python benchmarks/zero_shot_domains.py          # after the weights rule built the composite (the demo does)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedrepro.data.demo import DOMAINS, FASHION_CLASS_INDEX, fashion_arrays  # noqa: E402
from fedrepro.models.encoders import encode_prompts, encoder_transform, load_open_clip  # noqa: E402
from fedrepro.registry import dataset  # noqa: E402

ENCODER = {"name": "fedrepro-lite0-minilm", "pretrained": "aligned", "preprocess": "clip", "prompt": "a picture of a {}"}
FIRST, COUNT = 100, 100          # test images FIRST .. FIRST + COUNT - 1 of each class
FAA_CLASSES = ("t-shirt", "trouser", "pullover", "dress", "coat")


@torch.no_grad()
def main() -> None:
    import os

    os.chdir(ROOT)                       # the composite's weights resource lives under resources/weights
    model, preprocess, tokenizer = load_open_clip(ENCODER["name"], ENCODER["pretrained"])
    model.eval()
    transform = encoder_transform(ENCODER, model, preprocess)
    classes = list(dataset("demo_domains").class_texts)
    text = encode_prompts(model, tokenizer, ENCODER["prompt"], classes, "cpu")
    text = text / text.norm(dim=-1, keepdim=True)
    images, labels = fashion_arrays("test")
    rows = np.concatenate([np.flatnonzero(labels == c)[FIRST:FIRST + COUNT] for c in range(len(classes))])
    subset = [FASHION_CLASS_INDEX[name] for name in FAA_CLASSES]
    print(f"zero-shot accuracy of {ENCODER['name']} ({ENCODER['pretrained']}) on {len(rows)} validation images "
          f"(Fashion-MNIST test images {FIRST}-{FIRST + COUNT - 1} of each class)")
    print(f"{'domain':10s} {'10 classes':>11s} {'5 classes (FAA-CLIP demo)':>27s}")
    for domain, change in DOMAINS.items():
        batch = torch.stack([transform(change(Image.fromarray(images[i])).convert("RGB")) for i in rows])
        feats = model.encode_image(batch).float()
        scores = (feats / feats.norm(dim=-1, keepdim=True)) @ text.T
        truth = torch.as_tensor(labels[rows])
        all_acc = (scores.argmax(1) == truth).float().mean().item()
        keep = torch.isin(truth, torch.tensor(subset))
        sub_scores = scores[keep][:, subset]
        sub_truth = torch.tensor([subset.index(int(t)) for t in truth[keep]])
        sub_acc = (sub_scores.argmax(1) == sub_truth).float().mean().item()
        print(f"{domain:10s} {100 * all_acc:10.1f}% {100 * sub_acc:26.1f}%")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,           # --help, no options
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
